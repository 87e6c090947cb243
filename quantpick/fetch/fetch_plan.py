"""Planning a fetch before any byte moves: which files, from which source, the sha256 each must
have (manifest, hub listing and SHA256SUMS agreeing), where they go, what is already there and
what other tools' stores could give (the reuse candidates)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.errors import UsageError, VerificationError
from quantpick.fetch.atomic import os_error
from quantpick.fetch.download_dir import SPACE_MARGIN, existing_parent, free_bytes
from quantpick.fetch.partfile import part_bytes
from quantpick.fetch.progress import DownloadResult, NullProgress, ProgressSink
from quantpick.fetch.transfer import part_paths
from quantpick.hub.base import RepoSource
from quantpick.hub.http import BodyTooLarge
from quantpick.hub.verify import (
    CHECKSUMS_MAX_BYTES,
    parse_sha256sums,
)
from quantpick.safe_names import safe_relative_name, shown

if TYPE_CHECKING:
    from quantpick.fetch.hf_cache import HFCacheTarget
    from quantpick.fetch.stores import HashCache, StoreRoot
    from quantpick.model.manifest import Manifest, ModelFile, Source


# Suffixes the transfer engine puts beside a file; the longest decides the path length checked.
_LONGEST_SIDE_FILE = ".bad-0123456789ab"


@dataclass(frozen=True)
class PlannedFile:
    name: str
    role: str  # "model" | "mmproj"
    url: str
    path: Path
    size: int | None
    sha256: str | None
    sha256_from: tuple[str, ...]  # which authorities vouched for sha256 (all agree)
    # "present": the final file, of the expected size (verified before use); "partial": a .part
    # or a final file shorter than expected, resumed; "oversized": a final file longer than
    # expected, moved aside and fetched again; "absent"
    state: str
    local_bytes: int  # bytes already on disk (final file or .part)
    # Copies in other tools' stores (quantpick.fetch.stores), best first, none known to be bad
    # (a candidate whose cached sha256 differs is in reuse_rejected instead).
    reuse_candidates: tuple[ReuseCandidate, ...] = ()
    reuse_rejected: tuple[RejectedCandidate, ...] = ()
    # "lmstudio (/path/to/its/models)" when `path` is inside another tool's folder (--dir there):
    # a file at that name is never renamed, moved, truncated or deleted, only verified and used.
    owner: str | None = None

    @property
    def bytes_to_fetch(self) -> int:
        """What a run fetches, honestly: 0 for a store copy only when its sha256 is already
        known to match (an unverified one is counted: it may not match)."""
        if self.reuse is not None and self.reuse.verified:
            return 0
        return self.bytes_to_fetch_without_reuse

    @property
    def bytes_to_verify(self) -> int:
        """Bytes of an unverified store copy a run hashes first; when it matches, nothing of
        bytes_to_fetch is fetched."""
        if self.reuse is None or self.reuse.verified or not self.bytes_to_fetch_without_reuse:
            return 0
        return self.size if self.size is not None else 0

    @property
    def bytes_to_fetch_without_reuse(self) -> int:
        """What the transfer engine fetches once no store copy could be used."""
        if self.state == "present" or self.size is None:
            return 0
        if self.state == "oversized":
            return self.size
        return max(0, self.size - self.local_bytes)

    @property
    def reuse(self) -> ReuseCandidate | None:
        """The copy a run would use first (verified before use)."""
        return self.reuse_candidates[0] if self.reuse_candidates else None


@dataclass(frozen=True)
class ReuseCandidate:
    """A copy of a planned file in another tool's store, and what a run does with it."""

    store: str  # "hf" | "llama" | "lmstudio" | "ollama"
    path: Path  # as the store has it
    match: str  # how it was found: "sha256" (named by its hash) | "repo+name" | "name"
    verified: bool  # its sha256 equals the pinned one (hashed now, or cached from an earlier run)
    action: str  # "hardlink" | "symlink" | "in-place" (predicted in a dry run, done after a run)
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "path": str(self.path),
            "match": self.match,
            "verified": self.verified,
            "action": self.action,
            "why": self.why,
        }


@dataclass(frozen=True)
class RejectedCandidate:
    store: str
    path: Path
    reason: str  # e.g. its sha256 differs from the pinned one; it is left untouched

    def as_dict(self) -> dict[str, Any]:
        return {"store": self.store, "path": str(self.path), "reason": self.reason}


@dataclass(frozen=True)
class FetchPlan:
    manifest_id: str
    quant: str
    dest_dir: Path
    source: str  # label of the source this plan uses
    source_kind: str
    revision: str | None
    checksums_file: str | None  # the repository's SHA256SUMS name, when it had one
    files: tuple[PlannedFile, ...]
    bytes_to_fetch: int  # counting every store copy not yet verified as to fetch
    free_bytes: int
    enough_space: bool  # for bytes_to_fetch
    checksums_text: str | None = field(default=None, repr=False)
    # Bytes of store copies to hash before any transfer; what is left to fetch when they all
    # match (what the space check before the transfers needs).
    bytes_to_verify: int = 0
    bytes_to_fetch_if_verified: int = 0
    # Where copies were looked for (quantpick.fetch.stores), and which setting chose the stores.
    reuse_roots: tuple[StoreRoot, ...] = ()  # the enabled stores' directories that exist
    reuse_stores: tuple[str, ...] = ()  # the enabled stores
    reuse_origin: str = ""
    hf_cache: HFCacheTarget | None = None  # --hf-cache: files go into the Hugging Face cache
    notes: tuple[str, ...] = ()  # what the plan left out and why (refused names, big SHA256SUMS)


@dataclass(frozen=True)
class FetchReport:
    plan: FetchPlan
    results: tuple[DownloadResult, ...]
    skipped_sources: tuple[str, ...] = ()  # "label: why" for sources that failed before
    # name -> the copy used instead of a download (with the action actually taken)
    reused: dict[str, ReuseCandidate] = field(default_factory=dict)
    # name -> candidates hashed during the run that did not match (left untouched)
    rejected: dict[str, tuple[RejectedCandidate, ...]] = field(default_factory=dict)


def wanted_files(manifest: Manifest, quant: str, vision: bool) -> list[ModelFile]:
    files = list(manifest.quant_files(quant))
    if not files:
        raise UsageError(
            f"{manifest.id} has no quant {quant!r}",
            hint=f"available: {', '.join(manifest.quants)}",
        )
    if vision:
        projector = manifest.projector
        if projector is None:
            raise UsageError(f"{manifest.id} has no vision projector (mmproj)")
        files.append(projector)
    for f in files:
        safe_relative_name(f.name)
    return files


def candidate_sources(manifest: Manifest, kind: str) -> list[Source]:
    if kind == "auto":
        found = list(manifest.sources)
    else:
        found = [s for s in manifest.sources if s.kind == kind]
    if not found:
        have = ", ".join(sorted({s.kind for s in manifest.sources})) or "none"
        raise UsageError(f"{manifest.id} has no {kind} source", hint=f"its sources: {have}")
    return found


def _agree(
    name: str, claims: Iterable[tuple[str, str | None]]
) -> tuple[str | None, tuple[str, ...]]:
    """The single sha256 every authority that has one agrees on, and who vouched for it."""
    known = [(who, value.lower()) for who, value in claims if value]
    values = {value for _, value in known}
    if len(values) > 1:
        detail = "; ".join(f"{who} says {value}" for who, value in known)
        raise VerificationError(
            f"{name}: the known sha256 values disagree ({detail})",
            hint="nothing was downloaded; the repository or the manifest changed: report it",
        )
    return (known[0][1] if known else None), tuple(who for who, _ in known)


def _checksums_from(
    manifest: Manifest, repo: RepoSource, progress: ProgressSink, notes: list[str]
) -> tuple[dict[str, str], str | None]:
    """The repository's checksums file, parsed strictly (a hostile line refuses the download);
    ({}, None) when it has none or it is larger than CHECKSUMS_MAX_BYTES (then with a note)."""
    if not manifest.checksums_file:
        return {}, None
    label = f"{manifest.checksums_file} ({repo.label})"
    try:
        text = repo.fetch_text(manifest.checksums_file, CHECKSUMS_MAX_BYTES)
    except BodyTooLarge:
        note = (
            f"{repo.label}: {manifest.checksums_file} is larger than {CHECKSUMS_MAX_BYTES} bytes; "
            "ignored, the hub listing and the manifest vouch for the hashes"
        )
        progress.message(note)
        notes.append(note)
        return {}, None
    if text is None:
        progress.message(
            f"{repo.label} has no {manifest.checksums_file}; using the hub and manifest hashes"
        )
        return {}, None
    return parse_sha256sums(text, label), text


def _local_path_problem(path: Path) -> str | None:
    """Why `path` (and its .part/.lock/.bad- siblings) cannot exist on the destination's file
    system: a component or the whole path longer than that file system allows (pathconf)."""
    probe = existing_parent(path.parent)
    try:
        name_max = os.pathconf(probe, "PC_NAME_MAX")
        path_max = os.pathconf(probe, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows) or no answer
        return None
    if name_max and name_max > 0:
        *folders, last = path.parts
        names = [*folders, last + _LONGEST_SIDE_FILE]
        if any(len(os.fsencode(name)) > name_max for name in names):
            return f"a name is longer than the {name_max} bytes its file system allows (NAME_MAX)"
    longest = os.fsencode(str(path) + _LONGEST_SIDE_FILE)
    if path_max and path_max > 0 and len(longest) >= path_max:
        return f"the path is longer than the {path_max} bytes the system allows (PATH_MAX)"
    return None


def plan_fetch(
    manifest: Manifest,
    files: list[ModelFile],
    repo: RepoSource,
    dest_dir: Path,
    *,
    quant: str,
    allow_unverified: bool = False,
    disk_usage: Callable[[str], Any] = shutil.disk_usage,
    progress: ProgressSink | None = None,
    reuse_roots: tuple[StoreRoot, ...] = (),
    hash_cache: HashCache | None = None,
    hf_target: HFCacheTarget | None = None,
    owner_roots: tuple[StoreRoot, ...] = (),
) -> FetchPlan:
    """Resolve every file on one source and cross-check every hash, before any large transfer.

    With `reuse_roots`, each file is also looked for in other tools' stores (stat only: the
    hashing happens in fetch_model, before any transfer). With `hf_target`, files are planned
    as Hugging Face cache blobs (`blobs/<sha256>`) instead of `dest_dir/<name>`. A destination
    inside one of `owner_roots` (every store's folder, enabled or not) belongs to that tool: a
    file already at its name is verified and used, or reported, never renamed or replaced.
    """
    from quantpick.fetch.stores import is_link, owning_store

    progress = progress or NullProgress()
    notes: list[str] = []
    sums, checksums_text = _checksums_from(manifest, repo, progress, notes)
    planned = []
    for mf in files:
        remote = repo.resolve(mf.name)
        sha, vouchers = _agree(
            mf.name,
            [
                (f"{manifest.checksums_file} ({repo.label})", sums.get(mf.name)),
                (f"{repo.label} listing", remote.sha256),
                (f"manifest {manifest.id}", mf.sha256),
            ],
        )
        if remote.size is not None and mf.size_exact and remote.size != mf.size_bytes:
            raise VerificationError(
                f"{mf.name}: {repo.label} lists {remote.size} bytes, the manifest {mf.size_bytes}",
                hint="nothing was downloaded; the repository or the manifest changed",
            )
        if sha is None and not allow_unverified:
            raise VerificationError(
                f"{mf.name}: no sha256 known from {repo.label}, its checksums file or the manifest",
                hint="pass --allow-unverified to download it without a hash check",
            )
        size = (
            remote.size if remote.size is not None else (mf.size_bytes if mf.size_exact else None)
        )
        if hf_target is not None:
            if sha is None:
                raise UsageError(
                    f"--hf-cache: {mf.name} has no known sha256, and Hugging Face cache blobs "
                    "are named by it",
                    hint="run without --hf-cache (and with --allow-unverified) instead",
                )
            path = hf_target.blob_path(sha)
        else:
            path = dest_dir / mf.name
        problem = _local_path_problem(path)
        if problem is not None:
            raise UsageError(
                f"cannot store {shown(mf.name)} in {path.parent}: {problem}",
                hint="choose a shorter --dir",
            )
        part, _ = part_paths(path)
        try:
            if path.exists():
                local = path.stat().st_size
                # A link into another tool's store is never resumed into (its bytes are not
                # ours): it is checked as present and dropped when it no longer matches.
                if size is None or local == size or is_link(path):
                    state = "present"
                elif local < size:
                    state = "partial"  # a truncated final file is resumed like a .part
                else:
                    state = "oversized"
            elif part.exists():
                state, local = "partial", part_bytes(path)  # a segmented .part has holes
            else:
                state, local = "absent", 0
        except OSError as exc:
            raise os_error("cannot look at", path, exc) from None
        root = owning_store(path, owner_roots)
        owner = f"{root.store} ({root.path})" if root is not None else None
        if owner is not None and state in ("partial", "oversized") and path.exists():
            raise foreign_file_error(path, mf.name, owner, f"{local} bytes, not {size}")
        found: tuple[ReuseCandidate, ...] = ()
        rejected: tuple[RejectedCandidate, ...] = ()
        if reuse_roots and sha is not None and (state != "present" or is_link(path)):
            found, rejected = _reuse_candidates(
                manifest, mf.name, sha, size, path, reuse_roots, hash_cache
            )
        planned.append(
            PlannedFile(
                mf.name,
                mf.role,
                remote.url,
                path,
                size,
                sha,
                vouchers,
                state,
                local,
                found,
                rejected,
                owner,
            )
        )
    refused = repo.refused_note()
    if refused is not None:
        progress.message(refused)
        notes.append(refused)
    # Unknown sizes (plain mirror, no manifest size) count as the manifest's approximate size.
    approx = {mf.name: mf.size_bytes for mf in files}
    to_fetch = sum(_fetch_estimate(p, approx) for p in planned)
    if_verified = sum(_fetch_estimate(p, approx) for p in planned if p.reuse is None)
    free = free_bytes(hf_target.storage if hf_target is not None else dest_dir, disk_usage)
    return FetchPlan(
        manifest_id=manifest.id,
        quant=quant,
        dest_dir=dest_dir,
        source=repo.label,
        source_kind=repo.kind,
        revision=repo.revision,
        checksums_file=manifest.checksums_file if checksums_text is not None else None,
        files=tuple(planned),
        bytes_to_fetch=to_fetch,
        free_bytes=free,
        enough_space=free >= to_fetch + SPACE_MARGIN,
        checksums_text=checksums_text,
        bytes_to_verify=sum(p.bytes_to_verify for p in planned),
        bytes_to_fetch_if_verified=if_verified,
        reuse_roots=reuse_roots,
        hf_cache=hf_target,
        notes=tuple(notes),
    )


def foreign_file_error(path: Path, name: str, owner: str, what: str) -> VerificationError:
    return VerificationError(
        f"{path} is in the folder of {owner} and is not {name} ({what}); quantpick never "
        "renames, moves or deletes another tool's files",
        hint="remove or fix it with the tool that owns it (the Hugging Face cache: "
        "`hf cache rm`), or choose a --dir outside its folder",
    )


def _fetch_estimate(planned: PlannedFile, approx: dict[str, int]) -> int:
    """planned.bytes_to_fetch, with the manifest's approximate size where the size is unknown."""
    if planned.size is None and not (planned.reuse is not None and planned.reuse.verified):
        return approx.get(planned.name, 0)
    return planned.bytes_to_fetch


def manifest_repos(manifest: Manifest) -> tuple[str, ...]:
    """The "org/name" repositories a manifest's files come from (store layouts carry them)."""
    return tuple(dict.fromkeys(s.repo for s in manifest.sources if s.repo))


def _reuse_candidates(
    manifest: Manifest,
    name: str,
    sha: str,
    size: int | None,
    dest: Path,
    roots: tuple[StoreRoot, ...],
    cache: HashCache | None,
) -> tuple[tuple[ReuseCandidate, ...], tuple[RejectedCandidate, ...]]:
    """Copies of one file in the stores: usable ones (verified when the sha256 cache already
    knows them) and ones the cache knows to differ (never used, never touched)."""
    from quantpick.fetch.stores import LINK_WHY, find_candidates, predict_link

    found: list[ReuseCandidate] = []
    rejected: list[RejectedCandidate] = []
    for c in find_candidates(
        roots, name=name, sha256=sha, size=size, repos=manifest_repos(manifest), exclude=[dest]
    ):
        known = cache.lookup(c.path) if cache is not None else None
        if known is not None and known != sha:
            rejected.append(
                RejectedCandidate(c.store, c.path, mismatch_text(known, sha, cached=True))
            )
            continue
        action = predict_link(c, dest)
        found.append(
            ReuseCandidate(c.store, c.path, c.match, known == sha, action, LINK_WHY[action])
        )
    return tuple(found), tuple(rejected)


def mismatch_text(actual: str, expected: str, *, cached: bool) -> str:
    when = "hashed in an earlier run" if cached else "hashed now"
    return f"sha256 {actual} ({when}) is not the pinned {expected}: not used, left untouched"
