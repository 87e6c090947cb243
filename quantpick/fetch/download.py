"""Downloading one quant of a model: which files, from which source, agreeing hashes, then the
transfer engine (quantpick.fetch.transfer) for each file and a SHA256SUMS beside them.

The hub libraries give metadata, auth and endpoints (quantpick.fetch.sources); bytes come from
the transfer engine.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.errors import DownloadError, UsageError, VerificationError
from quantpick.fetch.atomic import os_error, write_atomic
from quantpick.fetch.http import BodyTooLarge, RetryPolicy
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

    @property
    def bytes_to_fetch(self) -> int:
        if self.state == "present" or self.size is None:
            return 0
        if self.state == "oversized":
            return self.size
        return max(0, self.size - self.local_bytes)


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
    bytes_to_fetch: int
    free_bytes: int
    enough_space: bool
    checksums_text: str | None = field(default=None, repr=False)
    notes: tuple[str, ...] = ()  # what the plan left out and why (refused names, big SHA256SUMS)


@dataclass(frozen=True)
class FetchReport:
    plan: FetchPlan
    results: tuple[DownloadResult, ...]
    skipped_sources: tuple[str, ...] = ()  # "label: why" for sources that failed before


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
) -> FetchPlan:
    """Resolve every file on one source and cross-check every hash, before any large transfer."""
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
        path = dest_dir / mf.name
        problem = _local_path_problem(path)
        if problem is not None:
            raise UsageError(
                f"cannot store {shown(mf.name)} in {dest_dir}: {problem}",
                hint="choose a shorter --dir",
            )
        part, _ = part_paths(path)
        try:
            if path.exists():
                local = path.stat().st_size
                if size is None or local == size:
                    state = "present"
                elif local < size:
                    state = "partial"  # a truncated final file is resumed like a .part
                else:
                    state = "oversized"
            elif part.exists():
                state, local = "partial", part.stat().st_size
            else:
                state, local = "absent", 0
        except OSError as exc:
            raise os_error("cannot look at", path, exc) from None
        planned.append(
            PlannedFile(mf.name, mf.role, remote.url, path, size, sha, vouchers, state, local)
        )
    refused = repo.refused_note()
    if refused is not None:
        progress.message(refused)
        notes.append(refused)
    to_fetch = sum(p.bytes_to_fetch for p in planned)
    # Unknown sizes (plain mirror, no manifest size) count as the manifest's approximate size.
    to_fetch += sum(mf.size_bytes for mf, p in zip(files, planned, strict=True) if p.size is None)
    free = free_bytes(dest_dir, disk_usage)
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
        notes=tuple(notes),
    )


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
    """
    progress = progress or NullProgress()
    files = wanted_files(manifest, quant, vision)
    dest = Path(dest_dir) if dest_dir is not None else settings.models_dir / manifest.id
    # Absolute (not resolved: a symlinked models dir keeps the name the user gave): every path
    # printed from here on, `--quiet`'s included, is unambiguous and never starts with "-".
    dest = Path(os.path.abspath(dest))
    if not dry_run:
        make_dir(dest)  # a read-only or unwritable --dir fails here, before any network call
    skipped: list[str] = []
    candidates = candidate_sources(manifest, source)
    for index, src in enumerate(candidates):
        last = index == len(candidates) - 1
        repo: RepoSource | None = None
        try:
            repo = open_source_fn(src, settings=settings, policy=policy)
            plan = plan_fetch(
                manifest,
                files,
                repo,
                dest,
                quant=quant,
                allow_unverified=allow_unverified,
                disk_usage=disk_usage,
                progress=progress,
            )
            if dry_run:
                return FetchReport(plan, (), tuple(skipped))
            if not plan.enough_space:
                raise DiskSpaceError(
                    f"not enough free space in {dest}: {plan.free_bytes} bytes free, "
                    f"{plan.bytes_to_fetch} to fetch plus a {SPACE_MARGIN} byte margin",
                    hint="free some space or choose another directory with --dir",
                )
            progress.message(f"Using {plan.source} -> {dest}")
            progress.total_started(len(plan.files), plan.bytes_to_fetch)
            results = []
            for planned in plan.files:
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
                    )
                )
            _record_checksums(dest, plan, results, lock_timeout=lock_timeout)
            return FetchReport(plan, tuple(results), tuple(skipped))
        except DownloadError as exc:
            if last:
                if skipped:
                    exc.message += f" (also failed: {'; '.join(skipped)})"
                raise
            label = repo.label if repo is not None else src.kind
            skipped.append(f"{label}: {exc.message}")
            progress.message(f"{label} failed: {exc.message}; trying the next source")
    raise AssertionError("unreachable: candidate_sources never returns an empty list")


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
        entries: dict[str, str] = {}
        try:
            if path.exists():
                entries.update(parse_sha256sums(path.read_text(), str(path)))
        except (OSError, UnicodeDecodeError, VerificationError):
            return  # not ours to rewrite
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
    manifest: Manifest, quant: str, vision: bool, dest: Path
) -> list[dict[str, Any]] | None:
    """The quant's files in `dest`, hashed against dest/SHA256SUMS (written by an earlier download)
    and the manifest's own hashes; None when a file or its checksum is missing. A mismatch is a
    VerificationError (exit 4): a bad file is never used."""
    from quantpick.errors import VerificationError
    from quantpick.fetch.verify import parse_sha256sums, verify_files

    dest = Path(os.path.abspath(dest))  # like fetch_model: no printed path starts with "-"
    sums_path = dest / "SHA256SUMS"
    if not sums_path.is_file():
        return None
    sums = parse_sha256sums(sums_path.read_text())
    expected: dict[str, str] = {}
    for mf in wanted_files(manifest, quant, vision):
        if mf.name not in sums or not (dest / mf.name).is_file():
            return None
        if mf.sha256 and mf.sha256.lower() != sums[mf.name].lower():
            raise VerificationError(
                f"{sums_path} lists {sums[mf.name]} for {mf.name}, the manifest {mf.sha256}"
            )
        expected[mf.name] = sums[mf.name]
    result = verify_files(dest, expected)
    bad = [c for c in result.files if c.status != "ok"]
    if bad:
        raise VerificationError(
            f"{dest / bad[0].name}: sha256 {bad[0].actual} does not match {bad[0].expected} "
            f"from {sums_path}",
            hint="run the command again with the hub reachable to fetch it afresh",
        )
    return [
        {
            "name": c.name,
            "path": str(dest / c.name),
            "size": c.size,
            "sha256": c.actual,
            "verified": True,
            "bytes_fetched": 0,
            "resumed_from": 0,
            "reused": True,
            "source": f"local {sums_path}",
        }
        for c in result.files
    ]
