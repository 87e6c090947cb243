"""Downloading one quant of a model: which files, from which source, agreeing hashes, then the
transfer engine (quantpick.fetch.transfer) for each file and a SHA256SUMS beside them.

The hub libraries give metadata, auth and endpoints (quantpick.fetch.sources); bytes come from
the transfer engine.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.errors import DownloadError, QuantpickError, UsageError, VerificationError
from quantpick.fetch.atomic import os_error, write_atomic
from quantpick.fetch.http import BodyTooLarge, RetryPolicy, UnreachableError, default_policy
from quantpick.fetch.partfile import part_bytes
from quantpick.fetch.segments import policy_for
from quantpick.fetch.sources import RemoteFile, RepoSource, open_source
from quantpick.fetch.transfer import (
    DEFAULT_LOCK_TIMEOUT,
    SPACE_MARGIN,
    DiskSpaceError,
    DownloadResult,
    NullProgress,
    ProgressSink,
    acquire_file_lock,
    download_file,
    existing_parent,
    free_bytes,
    make_dir,
    part_paths,
)
from quantpick.fetch.verify import (
    CHECKSUMS_MAX_BYTES,
    format_sha256sums,
    parse_sha256sums,
    read_sha256sums,
)
from quantpick.safe_names import safe_relative_name, shown

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.fetch.hf_cache import HFCacheTarget
    from quantpick.fetch.stores import HashCache, HashedFile, StoreRoot
    from quantpick.model.manifest import Manifest, ModelFile, Source

# Suffixes the transfer engine puts beside a file; the longest decides the path length checked.
_LONGEST_SIDE_FILE = ".bad-0123456789ab"


# ---------------------------------------------------------------------------------------------
# A manifest quant: plan, cross-check, fetch


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
            raise _foreign_file_error(path, mf.name, owner, f"{local} bytes, not {size}")
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


def _foreign_file_error(path: Path, name: str, owner: str, what: str) -> VerificationError:
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
            rejected.append(RejectedCandidate(c.store, c.path, _mismatch(known, sha, cached=True)))
            continue
        action = predict_link(c, dest)
        found.append(
            ReuseCandidate(c.store, c.path, c.match, known == sha, action, LINK_WHY[action])
        )
    return tuple(found), tuple(rejected)


def _mismatch(actual: str, expected: str, *, cached: bool) -> str:
    when = "hashed in an earlier run" if cached else "hashed now"
    return f"sha256 {actual} ({when}) is not the pinned {expected}: not used, left untouched"


def fetch_model(
    manifest: Manifest,
    quant: str,
    *,
    settings: Settings,
    vision: bool = False,
    dest_dir: Path | None = None,
    source: str = "auto",
    allow_unverified: bool = False,
    dry_run: bool = False,
    progress: ProgressSink | None = None,
    policy: RetryPolicy | None = None,
    disk_usage: Callable[[str], Any] = shutil.disk_usage,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    open_source_fn: Callable[..., RepoSource] = open_source,
) -> FetchReport:
    """Download one quant (all shards) and, with vision, the projector; verified.

    Sources are tried in manifest order (or only the requested kind); a DownloadError on one
    moves to the next. A VerificationError (hashes disagree, bad bytes) stops at once: it is a
    reason to distrust, not a network hiccup.

    Before any transfer, a file already in another tool's store (settings.reuse_stores) is
    hashed, and when it matches the pinned sha256 it is linked in instead of downloaded. With
    settings.hf_cache the files are written into the Hugging Face cache layout.
    """
    from quantpick.config import STORE_NAMES
    from quantpick.fetch.stores import HashCache, hash_cache_path, store_roots

    progress = progress or NullProgress()
    files = wanted_files(manifest, quant, vision)
    if settings.hf_cache:
        if dest_dir is not None:
            raise UsageError(
                "--hf-cache writes into the Hugging Face cache; it cannot be combined with --dir"
            )
        if source not in ("auto", "hf"):
            raise UsageError(
                f"--hf-cache needs the Hugging Face source, not --source {source}",
                hint="the cache layout names snapshots by Hugging Face commit",
            )
        source = "hf"
    dest = Path(dest_dir) if dest_dir is not None else settings.models_dir / manifest.id
    # Absolute (not resolved: a symlinked models dir keeps the name the user gave): every path
    # printed from here on, `--quiet`'s included, is unambiguous and never starts with "-".
    dest = Path(os.path.abspath(dest))
    if not dry_run and not settings.hf_cache:
        make_dir(dest)  # a read-only or unwritable --dir fails here, before any network call
    roots = (
        store_roots(settings.reuse_stores, overrides=settings.store_paths)
        if settings.reuse_stores
        else ()
    )
    # Every store's folder, used for reuse or not: a --dir inside one holds another tool's files.
    owner_roots = store_roots(STORE_NAMES, overrides=settings.store_paths)
    cache = HashCache(hash_cache_path(settings.cache_dir))
    # Hub calls (listing, SHA256SUMS) say when an answer is slow and when they retry.
    hub_policy = replace(policy or default_policy(), notify=progress.message)
    skipped: list[str] = []
    unreachable: list[UnreachableError | None] = []
    candidates = candidate_sources(manifest, source)
    for index, src in enumerate(candidates):
        last = index == len(candidates) - 1
        repo: RepoSource | None = None
        try:
            repo = open_source_fn(src, settings=settings, policy=hub_policy)
            target = None
            if settings.hf_cache:
                from quantpick.fetch.hf_cache import hf_cache_target
                from quantpick.fetch.stores import hf_cache_for_writing

                hub_dir = hf_cache_for_writing(settings.store_paths)
                target = hf_cache_target(hub_dir, src.repo, repo.revision, src.revision)
                dest = target.snapshot_dir
            plan = plan_fetch(
                manifest,
                files,
                repo,
                dest,
                quant=quant,
                allow_unverified=allow_unverified,
                disk_usage=disk_usage,
                progress=progress,
                reuse_roots=roots,
                hash_cache=cache,
                hf_target=target,
                owner_roots=owner_roots,
            )
            plan = replace(
                plan, reuse_stores=settings.reuse_stores, reuse_origin=settings.reuse_origin
            )
            if dry_run:
                return FetchReport(plan, (), tuple(skipped))
            # Before hashing any store copy: enough room if every copy matches.
            if plan.free_bytes < plan.bytes_to_fetch_if_verified + SPACE_MARGIN:
                raise DiskSpaceError(
                    f"not enough free space in {dest}: {plan.free_bytes} bytes free, "
                    f"{plan.bytes_to_fetch_if_verified} to fetch plus a {SPACE_MARGIN} byte margin",
                    hint="free some space or choose another directory with --dir",
                )
            progress.message(f"Using {plan.source} -> {dest}")
            done, reused, rejected = _use_local_copies(plan, cache, progress)
            cache.save()
            left = [p for p in plan.files if p.name not in done]
            # What is left once the store copies are verified, used or rejected.
            approx = {mf.name: mf.size_bytes for mf in files}
            to_fetch = sum(
                p.bytes_to_fetch_without_reuse if p.size is not None else approx.get(p.name, 0)
                for p in left
            )
            plan = replace(
                plan,
                bytes_to_fetch=to_fetch,
                enough_space=plan.free_bytes >= to_fetch + SPACE_MARGIN,
            )
            if left and not plan.enough_space:
                raise DiskSpaceError(
                    f"not enough free space in {dest}: {plan.free_bytes} bytes free, "
                    f"{plan.bytes_to_fetch} to fetch plus a {SPACE_MARGIN} byte margin",
                    hint="free some space or choose another directory with --dir",
                )
            if left:
                progress.total_started(len(left), plan.bytes_to_fetch)
            results = []
            for planned in plan.files:
                if planned.name in done:
                    results.append(done[planned.name])
                    continue
                remote = RemoteFile(
                    planned.name,
                    planned.size,
                    planned.sha256,
                    planned.url,
                    repo.kind,
                    repo.revision,
                )
                results.append(
                    download_file(
                        remote,
                        planned.path,
                        headers_for=repo.request_headers,
                        expected_sha256=planned.sha256,
                        expected_size=planned.size,
                        expected_from=" and ".join(planned.sha256_from) or "nowhere",
                        source_label=plan.source,
                        policy=policy,
                        progress=progress,
                        disk_usage=disk_usage,
                        lock_timeout=lock_timeout,
                        owner=planned.owner,
                        segments=policy_for(settings.connections),
                    )
                )
            results = _after_transfer(plan, results, done, cache)
            if target is None:
                _record_checksums(dest, plan, results, lock_timeout=lock_timeout)
            return FetchReport(plan, tuple(results), tuple(skipped), reused, rejected)
        except DownloadError as exc:
            unreachable.append(exc if isinstance(exc, UnreachableError) else None)
            if last:
                hosts = [e.host for e in unreachable if e is not None]
                if len(hosts) == len(unreachable) and len(hosts) > 1:
                    # No network: one short line, not one paragraph per source.
                    raise DownloadError(
                        f"no source reachable ({', '.join(dict.fromkeys(hosts))}): the names do "
                        "not resolve (no network?)",
                        hint=exc.hint,
                    ) from None
                if skipped:
                    exc.message += f" (also failed: {'; '.join(skipped)})"
                raise
            label = repo.label if repo is not None else src.kind
            skipped.append(f"{label}: {exc.message}")
            progress.message(f"{label} failed: {exc.message}; trying the next source")
    raise AssertionError("unreachable: candidate_sources never returns an empty list")


def _after_transfer(
    plan: FetchPlan,
    results: list[DownloadResult],
    done: dict[str, DownloadResult],
    cache: HashCache,
) -> list[DownloadResult]:
    """Remember the sha256 of what was just downloaded (the engine hashed it while writing), so
    the next run verifies it from the cache; with --hf-cache, point each snapshot entry at its
    new blob (after verification: a blob name only ever holds verified bytes)."""
    out = []
    for planned, result in zip(plan.files, results, strict=True):
        if planned.name not in done and result.verified:
            cache.record(result.path, result.sha256)
            if plan.hf_cache is not None:
                from quantpick.fetch.hf_cache import link_snapshot

                pointer = link_snapshot(plan.hf_cache, planned.name, result.sha256)
                result = replace(result, path=pointer)
        out.append(result)
    cache.save()
    return out


def _use_local_copies(
    plan: FetchPlan, cache: HashCache, progress: ProgressSink
) -> tuple[
    dict[str, DownloadResult], dict[str, ReuseCandidate], dict[str, tuple[RejectedCandidate, ...]]
]:
    """Before any transfer: files already in place, and copies in other tools' stores.

    A file in place is verified through the sha256 cache (hashed once, then known while it is
    unchanged), so a rerun does not rehash 20 GB. A store copy is hashed (with progress) and
    used only when it equals the pinned sha256: linked into the destination (hardlink, else
    symlink) or, when no link can be made, used where it is. A copy that does not match is
    never used and never touched. Returns (results by name, copies used, copies rejected).
    """
    from quantpick.fetch.stores import FileChanged, link_into

    done: dict[str, DownloadResult] = {}
    reused: dict[str, ReuseCandidate] = {}
    rejected: dict[str, tuple[RejectedCandidate, ...]] = {}
    in_place_dirs: set[Path] = set()
    for planned in plan.files:
        if planned.sha256 is None:
            continue  # --allow-unverified: the engine handles it as before
        bad: list[RejectedCandidate] = list(planned.reuse_rejected)
        if planned.state == "present":
            if _verify_in_place(planned, plan, cache, progress):
                final = planned.path
                if plan.hf_cache is not None:  # the blob is there (`hf download`): name it
                    from quantpick.fetch.hf_cache import link_snapshot

                    final = link_snapshot(plan.hf_cache, planned.name, planned.sha256)
                done[planned.name] = _result(planned, final, plan.source)
                continue
            if planned.path.exists():
                continue  # a plain file of quantpick's: the engine resumes or replaces it
        for choice in planned.reuse_candidates:
            label = f"{planned.name} in {choice.store}"
            try:
                hashed = _hash_with_progress(choice.path, cache, progress, label)
            except OSError as exc:  # e.g. the Linux Ollama service's files, unreadable to us
                bad.append(RejectedCandidate(choice.store, choice.path, f"unreadable: {exc}"))
                progress.message(f"{choice.path}: cannot read it ({exc.strerror}); skipped")
                continue
            except FileChanged as exc:
                bad.append(RejectedCandidate(choice.store, choice.path, f"{exc}: not used"))
                progress.message(f"{exc}: not used")
                continue
            digest = hashed.sha256
            if digest != planned.sha256:
                bad.append(
                    RejectedCandidate(
                        choice.store, choice.path, _mismatch(digest, planned.sha256, cached=False)
                    )
                )
                progress.message(
                    f"{choice.path}: not {planned.name} (sha256 {digest[:12]}…): "
                    "not used, left untouched"
                )
                continue
            try:
                # The inode that was hashed, or nothing: the path is checked again here.
                linked = link_into(choice.path, planned.path, hashed.identity)
            except FileChanged as exc:
                bad.append(RejectedCandidate(choice.store, choice.path, f"{exc}: not used"))
                progress.message(f"{exc}: not used")
                continue
            action, why = linked.action, linked.why
            final = planned.path
            if action == "in-place":
                # llama.cpp finds shards 2..N beside shard 1 by name, and a Hugging Face cache
                # snapshot must point into its own blobs: either way the copy cannot stay put.
                if plan.hf_cache is not None or Path(choice.path).name != Path(planned.name).name:
                    progress.message(f"{label}: {why}; downloading instead")
                    continue
                final = Path(choice.path)
                in_place_dirs.add(final.parent)
            else:
                assert linked.identity is not None
                cache.put(planned.path, linked.identity, digest)  # a hardlink moved its ctime
                part, sidecar = part_paths(planned.path)
                if part.exists():  # quantpick's own partial download of the same bytes
                    part.unlink()
                    sidecar.unlink(missing_ok=True)
            if plan.hf_cache is not None:
                from quantpick.fetch.hf_cache import link_snapshot

                final = link_snapshot(plan.hf_cache, planned.name, planned.sha256)
            used = replace(choice, verified=True, action=action, why=why)
            reused[planned.name] = used
            done[planned.name] = _result(planned, final, f"{choice.store}:{choice.path}")
            if action == "in-place":
                where = "used in place"
            elif plan.hf_cache is not None:
                where = f"{action}ed as blob {planned.path}, snapshot entry {final}"
            else:
                where = f"{action}ed into {final.parent}"
            progress.message(
                f"Reusing {planned.name} from {choice.store} ({choice.path}): sha256 verified, "
                f"{where}, nothing downloaded"
            )
            break
        if bad:
            rejected[planned.name] = tuple(bad)
    if len(in_place_dirs) > 1:
        shards = [p.name for p in plan.files if p.role == "model"]
        if len(shards) > 1:
            raise QuantpickError(
                "the reused shards of a split GGUF are in different directories and could not be "
                "linked together; llama.cpp needs them side by side",
                hint="pass --no-reuse or --dir on a filesystem that allows links",
            )
    return done, reused, rejected


def _verify_in_place(
    planned: PlannedFile, plan: FetchPlan, cache: HashCache, progress: ProgressSink
) -> bool:
    """True when the file already at its destination is the pinned one (through the cache).

    When it is not: a blob in the Hugging Face cache is reported and left alone (exit 4); a link
    into another tool's store loses quantpick's name (the other tool's bytes are never resumed
    into or truncated by the engine); a plain file is left for the engine (it resumes a shorter
    file, and moves a wrong one aside).
    """
    from quantpick.fetch.stores import FileChanged, is_link

    path = planned.path
    size = path.stat().st_size
    digest = None
    if planned.size is None or size == planned.size:
        try:
            digest = _hash_with_progress(path, cache, progress, f"{planned.name} (in place)").sha256
        except FileChanged as exc:
            progress.message(f"{exc}: not used as it is")
        if digest == planned.sha256:
            return True
    if planned.owner is not None and plan.hf_cache is None:
        got = f"sha256 {digest}" if digest else f"{size} bytes"
        raise _foreign_file_error(path, planned.name, planned.owner, got)
    if plan.hf_cache is not None:
        got = f"sha256 {digest}" if digest else f"{size} bytes"
        raise VerificationError(
            f"{path} (the Hugging Face cache blob of {planned.name}) has {got}, not "
            f"{planned.sha256} ({planned.size} bytes)",
            hint="quantpick does not touch it; remove it (`hf cache rm`, or rm) and rerun",
        )
    if is_link(path):
        path.unlink()
        progress.message(
            f"{planned.name}: the linked copy in {path.parent} no longer matches; removed "
            "quantpick's link (the file it pointed to is untouched)"
        )
    return False


def _result(planned: PlannedFile, path: Path, source: str) -> DownloadResult:
    return DownloadResult(
        planned.name,
        path,
        planned.size if planned.size is not None else path.stat().st_size,
        str(planned.sha256),
        True,
        0,
        0,
        source,
        True,
    )


def _hash_with_progress(
    path: Path, cache: HashCache, progress: ProgressSink, label: str
) -> HashedFile:
    """sha256 of `path` through the cache (stores.sha256_of: one descriptor, FileChanged when
    it changes while read); progress through the sink's optional hash_* methods
    (quantpick.cli.download's sinks have them), else one message before a long hash."""
    from quantpick.fetch.stores import sha256_of

    started = getattr(progress, "hash_started", None)
    advance = getattr(progress, "hash_advance", None)
    finished = getattr(progress, "hash_finished", None)
    began = False

    def on_start(size: int) -> None:
        nonlocal began
        began = True
        if started is not None:
            started(label, size)
        else:
            progress.message(f"Verifying {label} ({size} bytes)")

    try:
        return sha256_of(
            path,
            cache,
            on_start=on_start,
            on_bytes=(lambda n: advance(label, n)) if advance is not None else None,
        )
    finally:
        if began and finished is not None:
            finished(label)


def _record_checksums(
    dest: Path,
    plan: FetchPlan,
    results: list[DownloadResult],
    *,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    durable: bool = True,
) -> None:
    """Keep a SHA256SUMS in the directory so `quantpick verify DIR` works later, offline.

    It merges what was there, the repository's own file, and the hashes just verified, under the
    file's own lock (two downloads into one directory must not lose each other's lines), and is
    written atomically and durably. A full disk leaves no temporary file and says so in one line.
    """
    path = dest / "SHA256SUMS"
    lock = acquire_file_lock(path, stall_timeout=lock_timeout)
    try:
        from quantpick.local_files import read_small_text

        entries: dict[str, str] = {}
        try:
            text = read_small_text(path, CHECKSUMS_MAX_BYTES, follow=False)
            entries.update(parse_sha256sums(text, str(path)))
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError, VerificationError):
            # not ours to rewrite (a FIFO, a link to another file, a huge or hostile file:
            # never read whole, never copied into a file others may read)
            return
        if plan.checksums_text:
            entries.update(read_sha256sums(plan.checksums_text).entries)
        entries.update({r.name: r.sha256 for r in results if r.verified})
        try:
            write_atomic(path, format_sha256sums(entries).encode(), durable=durable)
        except OSError as exc:
            raise os_error(
                "cannot write the checksums file",
                path,
                exc,
                hint="the model files are complete and verified; free some space and run the "
                "command again to record their hashes for `quantpick verify`",
            ) from None
    finally:
        lock.release()


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
            hashed = _hash_with_progress(path, cache, progress, f"{mf.name} (in place)")
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
