"""Writing downloads into the Hugging Face cache layout (`--hf-cache`), so `hf`, huggingface_hub
and `llama-server -hf` find the files quantpick fetched.

What huggingface_hub 2.4 writes (`file_download.py`, `_hf_hub_download_to_cache_dir`), and what
this module writes the same way:

    <cache>/CACHEDIR.TAG                                   (`_create_cachedir_tag`, same text)
    <cache>/.locks/models--org--repo/<etag>.lock           (held while the blob is written)
    <cache>/models--org--repo/blobs/<etag>                 (etag of an LFS file = its sha256)
    <cache>/models--org--repo/snapshots/<commit>/<file>    -> relative symlink to ../../blobs/<etag>
                                                              (`_create_symlink`: os.path.relpath)
    <cache>/models--org--repo/refs/<revision>              (the commit, no newline; written only
                                                              when the revision asked for is not
                                                              the commit itself, atomically)

A blob name only ever holds the complete, verified bytes: huggingface_hub downloads into
`blobs/<etag>.<uuid8>.incomplete` and renames. quantpick's transfer engine does the same through
`blobs/<sha256>.part` (+ `.part.json`), which, unlike huggingface_hub's per-process
`.incomplete` file (deleted on failure, never resumed), survives an interruption and is resumed by
the next run. llama.cpp's `-hf` trusts an existing blob without any check (notes §5), which is
why the rename after verification matters.

Only a Hugging Face source pinned to a commit can be written this way: the snapshot is named by
the commit.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from quantpick.errors import UsageError, VerificationError
from quantpick.fetch.stores import hf_repo_folder
from quantpick.local_files import read_small_text
from quantpick.safe_names import safe_relative_name

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# A ref holds one 40-hex commit, no newline (huggingface_hub `_cache_commit_hash_for_specific_
# revision`); 1 KiB is far more than any ref a hub tool writes.
REF_MAX_BYTES = 1024
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

# huggingface_hub/_local_folder.py CACHEDIR_TAG_CONTENT (2.4), byte for byte.
CACHEDIR_TAG_CONTENT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by huggingface_hub.\n"
    "# For information about cache directory tags, see:\n"
    "#\thttps://bford.info/cachedir/\n"
)


@dataclass(frozen=True)
class HFCacheTarget:
    cache_dir: Path  # the hub cache (HF_HUB_CACHE, ...)
    repo: str  # "org/name"
    commit: str  # 40 hex
    revision: str  # what the manifest asked for: a branch ("main"), a tag, or the commit

    @property
    def storage(self) -> Path:
        return self.cache_dir / hf_repo_folder(self.repo)

    @property
    def snapshot_dir(self) -> Path:
        return self.storage / "snapshots" / self.commit

    def blob_path(self, sha256: str) -> Path:
        if not SHA256_RE.match(sha256):
            raise VerificationError(f"{sha256!r} is not a sha256: no blob name")
        return self.storage / "blobs" / sha256

    def pointer_path(self, name: str) -> Path:
        safe_relative_name(name)
        return self.snapshot_dir.joinpath(*name.split("/"))

    def lock_path(self, sha256: str) -> Path:
        return self.cache_dir / ".locks" / hf_repo_folder(self.repo) / f"{sha256}.lock"


def hf_cache_target(
    cache_dir: Path, repo: str | None, commit: str | None, revision: str | None
) -> HFCacheTarget:
    """The target for one Hugging Face repo at a known commit, or a UsageError saying why not."""
    if not repo:
        raise UsageError("--hf-cache needs a Hugging Face source with a repo")
    if not commit or not COMMIT_RE.match(commit):
        raise UsageError(
            f"--hf-cache: the Hugging Face source {repo} did not resolve to a commit "
            f"(got {commit!r}); the cache layout names snapshots by commit",
            hint="run without --hf-cache to download into quantpick's directory",
        )
    return HFCacheTarget(cache_dir, repo, commit, revision or "main")


def _write_cachedir_tag(cache_dir: Path) -> None:
    from quantpick.outputs import create_new

    try:  # only where nothing is (a planted link, dangling or not, is never written through)
        create_new(cache_dir / "CACHEDIR.TAG", CACHEDIR_TAG_CONTENT.encode())
    except OSError:
        pass  # huggingface_hub ignores this failure too


def read_ref(ref: Path) -> str | None:
    """The commit a refs/<revision> file names (None when it is missing, not a regular file, or
    larger than REF_MAX_BYTES: huggingface_hub's cache is another program's)."""
    try:
        return read_small_text(ref, REF_MAX_BYTES).strip()
    except (OSError, ValueError):
        return None


def _write_ref(target: HFCacheTarget) -> None:
    """refs/<revision> = commit, as `_cache_commit_hash_for_specific_revision` writes it."""
    if target.revision == target.commit:
        return
    ref = target.storage / "refs" / target.revision
    safe_relative_name(target.revision)
    ref.parent.mkdir(parents=True, exist_ok=True)
    if read_ref(ref) == target.commit:
        return
    from quantpick.outputs import write_atomic

    write_atomic(ref, target.commit.encode(), durable=False)  # never through a link


def link_snapshot(target: HFCacheTarget, name: str, sha256: str) -> Path:
    """Point snapshots/<commit>/<name> at blobs/<sha256> (which must hold the verified bytes),
    write the ref and the cache tag. Returns the snapshot path (what `-m` should name).

    An existing snapshot entry is kept when it already is that file; anything else there (a
    file with other bytes) is never overwritten: it is reported instead.
    """
    blob = target.blob_path(sha256)
    pointer = target.pointer_path(name)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    _write_cachedir_tag(target.cache_dir)
    if os.path.lexists(pointer):
        same = os.path.exists(pointer) and os.path.samefile(pointer, blob)
        if not same:
            raise VerificationError(
                f"{pointer} exists and is not the verified file {blob}",
                hint="quantpick does not overwrite it; remove it (`hf cache rm` or rm) and rerun",
            )
    else:
        relative = os.path.relpath(blob, pointer.parent)
        try:
            os.symlink(relative, pointer)
        except OSError:
            # No symlinks here (huggingface_hub then moves or copies the blob): a hardlink is a
            # second name for the same bytes, which its cache scanner reads as a plain file.
            os.link(blob, pointer)
    _write_ref(target)
    return pointer
