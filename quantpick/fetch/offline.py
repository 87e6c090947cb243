"""Files already in place, used without a hub: verified against their pinned sha256, the SHA256SUMS
a previous run left beside them, or the Hugging Face cache's blob names (offline,
HF_HUB_OFFLINE, an outage); the listing of what a run put in place."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.errors import VerificationError
from quantpick.fetch.progress import NullProgress, ProgressSink
from quantpick.hub.verify import (
    CHECKSUMS_MAX_BYTES,
    parse_sha256sums,
    read_sha256sums,
)

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.fetch.stores import HashCache
    from quantpick.model.manifest import Manifest
from quantpick.fetch.download import hash_with_progress
from quantpick.fetch.fetch_plan import FetchReport, wanted_files


def verified_local_files(
    manifest: Manifest,
    quant: str,
    vision: bool,
    dest: Path,
    cache: HashCache | None = None,
    *,
    strict: bool = True,
    progress: ProgressSink | None = None,
) -> list[dict[str, Any]] | None:
    """The quant's files in `dest`, each hashed (through the sha256 cache: a file unchanged
    since it was last hashed is not hashed again) against the sha256 that pins it: the
    manifest's, and dest/SHA256SUMS (an earlier download writes it) where it lists the file;
    the two must agree. None when a file is missing or nothing pins its hash.

    `strict` (no hub to fetch from): a file that does not match, or a SHA256SUMS that disagrees
    with the manifest, is a VerificationError (exit 4): a bad file is never used. Not strict
    (before asking a hub): None instead, and the download fetches what is wrong.
    """
    from quantpick.fetch.stores import HashCache
    from quantpick.local_files import read_small_text

    progress = progress or NullProgress()
    cache = cache if cache is not None else HashCache(None)
    dest = Path(os.path.abspath(dest))  # like fetch_model: no printed path starts with "-"
    sums_path = dest / "SHA256SUMS"
    sums: dict[str, str] = {}
    try:
        text: str | None = read_small_text(sums_path, CHECKSUMS_MAX_BYTES)
    except (OSError, ValueError):  # missing, a FIFO or a device, over the cap, not UTF-8
        text = None
    if text is not None:
        try:
            sums = parse_sha256sums(text, str(sums_path))
        except VerificationError:
            if strict:
                raise
            return None

    try:
        return _verify_listed(manifest, quant, vision, dest, sums, cache, strict, progress)
    finally:
        cache.save()  # a mismatch found here is not hashed again by the download that follows


def _verify_listed(
    manifest: Manifest,
    quant: str,
    vision: bool,
    dest: Path,
    sums: dict[str, str],
    cache: HashCache,
    strict: bool,
    progress: ProgressSink,
) -> list[dict[str, Any]] | None:
    from quantpick.fetch.stores import FileChanged

    sums_path = dest / "SHA256SUMS"

    def refuse(message: str, hint: str | None = None) -> None:
        if strict:
            raise VerificationError(message, hint=hint)

    out = []
    for mf in wanted_files(manifest, quant, vision):
        path = dest / mf.name
        listed, pinned = sums.get(mf.name), (mf.sha256 or "").lower() or None
        if listed is not None and pinned is not None and listed != pinned:
            refuse(f"{sums_path} lists {listed} for {mf.name}, the manifest {pinned}")
            return None
        expected = pinned or listed
        if expected is None or not path.is_file():
            return None
        who = " and ".join(
            w for w, v in ((f"manifest {manifest.id}", pinned), (str(sums_path), listed)) if v
        )
        try:
            hashed = hash_with_progress(path, cache, progress, f"{mf.name} (in place)")
        except FileChanged as exc:
            refuse(f"{exc}: not used", hint="run the command again once nothing writes to it")
            return None
        if hashed.sha256 != expected:
            refuse(
                f"{path}: sha256 {hashed.sha256} does not match {expected} from {who}",
                hint="run the command again with the hub reachable to fetch it afresh",
            )
            return None
        out.append(
            {
                "name": mf.name,
                "path": str(path),
                "size": hashed.identity.size,
                "sha256": expected,
                "verified": True,
                "bytes_fetched": 0,
                "resumed_from": 0,
                "reused": True,
                "source": f"local {dest} (sha256 pinned by {who})",
            }
        )
    return sorted(out, key=lambda entry: str(entry["name"]))


def known_local_copy(manifest: Manifest, quant: str, dest: Path, settings: Settings) -> Path | None:
    """The first file of `quant` in `dest` when every file of it there is already known, from
    the sha256 cache (nothing is hashed here), to have the sha256 that pins it (the manifest's,
    or dest/SHA256SUMS): planning may read that file's header instead of asking a hub."""
    from quantpick.fetch.stores import HashCache, hash_cache_path
    from quantpick.local_files import read_small_text

    files = manifest.quant_files(quant)
    if not files:
        return None
    dest = Path(os.path.abspath(dest))
    try:
        sums = read_sha256sums(read_small_text(dest / "SHA256SUMS", CHECKSUMS_MAX_BYTES)).entries
    except (OSError, ValueError):
        sums = {}
    cache = HashCache(hash_cache_path(settings.cache_dir))
    for mf in files:
        pinned, listed = (mf.sha256 or "").lower() or None, sums.get(mf.name)
        if pinned is not None and listed is not None and pinned != listed:
            return None
        expected = pinned or listed
        if expected is None or cache.lookup(dest / mf.name) != expected:
            return None
    return dest / files[0].name


def files_in_place(
    manifest: Manifest,
    quant: str,
    vision: bool,
    *,
    settings: Settings,
    dest_dir: Path | None,
    progress: ProgressSink | None = None,
) -> list[dict[str, Any]] | None:
    """Before asking any hub: the quant's files already where a download would put them (the
    --dir or models dir, else with --hf-cache the Hugging Face cache snapshot), each verified
    against a sha256 that pins it without a hub (the manifest's; in a directory also the
    SHA256SUMS an earlier download left). A verified copy needs no hub. None when a file is
    missing, unpinned or different: the download then fetches it (and replaces what is wrong).
    """
    from quantpick.fetch.stores import HashCache, hash_cache_path

    progress = progress or NullProgress()
    cache = HashCache(hash_cache_path(settings.cache_dir))
    found: list[dict[str, Any]] | None
    if settings.hf_cache and dest_dir is None:
        if not all(mf.sha256 for mf in wanted_files(manifest, quant, vision)):
            return None  # the blob names are the hub's word; ask the hub
        try:
            found = verified_hf_cache_files(manifest, quant, vision, settings, cache)
        except VerificationError:
            return None
        where = "the Hugging Face cache"
    else:
        dest = dest_dir if dest_dir is not None else settings.models_dir / manifest.id
        found = verified_local_files(
            manifest, quant, vision, dest, cache, strict=False, progress=progress
        )
        where = str(Path(os.path.abspath(dest)))
    if found is not None:
        names = ", ".join(str(f["name"]) for f in found)
        progress.message(f"{names}: already in {where}, sha256 verified; no hub contacted")
    return found


def verified_hf_cache_files(
    manifest: Manifest, quant: str, vision: bool, settings: Settings, cache: HashCache
) -> list[dict[str, Any]] | None:
    """With --hf-cache and no hub: the quant's files in the Hugging Face cache snapshot of the
    manifest's Hugging Face repo (its pinned commit, else what refs/<revision> names), verified
    against the manifest's sha256, else the name of the blob each snapshot entry points to (the
    hub's LFS sha256, checked when it was written). None when a file is not there."""
    from quantpick.fetch.hf_cache import COMMIT_RE, SHA256_RE, read_ref
    from quantpick.fetch.stores import hf_cache_for_writing, hf_repo_folder

    source = next((s for s in manifest.sources if s.kind == "hf" and s.repo), None)
    if source is None or source.repo is None:
        return None
    storage = hf_cache_for_writing(settings.store_paths) / hf_repo_folder(source.repo)
    revision = source.revision or "main"
    commit = revision
    if not COMMIT_RE.match(revision):
        found = read_ref(storage / "refs" / revision)
        if found is None or not COMMIT_RE.match(found):
            return None
        commit = found
    out = []
    for mf in wanted_files(manifest, quant, vision):
        pointer = storage / "snapshots" / commit / mf.name
        if not pointer.is_file():
            return None
        blob_name = Path(os.path.realpath(pointer)).name
        expected = (mf.sha256 or "").lower() or (blob_name if SHA256_RE.match(blob_name) else "")
        if not expected:
            return None
        st = pointer.stat()
        if mf.size_exact and st.st_size != mf.size_bytes:
            raise VerificationError(f"{pointer}: {st.st_size} bytes, not {mf.size_bytes}")
        from quantpick.fetch.stores import FileChanged, sha256_of

        try:
            digest = sha256_of(pointer, cache).sha256
        except FileChanged as exc:
            raise VerificationError(f"{exc}: not used") from None
        if digest != expected:
            raise VerificationError(
                f"{pointer}: sha256 {digest} does not match {expected}",
                hint="run the command again with the hub reachable to fetch it afresh",
            )
        out.append(
            {
                "name": mf.name,
                "path": str(pointer),
                "size": st.st_size,
                "sha256": digest,
                "verified": True,
                "bytes_fetched": 0,
                "resumed_from": 0,
                "reused": True,
                "source": f"hf cache {storage}",
            }
        )
    cache.save()
    return out


def report_files(report: FetchReport) -> list[dict[str, Any]]:
    """One JSON entry per file of a finished fetch: the result, plus the store copy it reused
    (`reuse`, or null) and the copies that failed verification (`reuse_rejected`)."""
    out = []
    for result in report.results:
        used = report.reused.get(result.name)
        entry = result.as_dict()
        entry["reuse"] = used.as_dict() if used is not None else None
        entry["reuse_rejected"] = [r.as_dict() for r in report.rejected.get(result.name, ())]
        out.append(entry)
    return out
