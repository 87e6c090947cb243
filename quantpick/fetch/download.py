"""Downloading one quant of a model: which files, from which source, agreeing hashes, then the
transfer engine (quantpick.fetch.transfer) for each file and a SHA256SUMS beside them.

The hub libraries give metadata, auth and endpoints (quantpick.hub); bytes come from
the transfer engine.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.errors import DownloadError, QuantpickError, UsageError, VerificationError
from quantpick.fetch.atomic import os_error, write_atomic
from quantpick.fetch.download_dir import SPACE_MARGIN, make_dir
from quantpick.fetch.fetch_plan import (
    FetchPlan,
    FetchReport,
    PlannedFile,
    RejectedCandidate,
    ReuseCandidate,
    candidate_sources,
    foreign_file_error,
    mismatch_text,
    plan_fetch,
    wanted_files,
)
from quantpick.fetch.file_lock import DEFAULT_LOCK_TIMEOUT, acquire_file_lock
from quantpick.fetch.progress import DownloadResult, NullProgress, ProgressSink
from quantpick.fetch.segments import policy_for
from quantpick.fetch.transfer import DiskSpaceError, download_file, part_paths
from quantpick.hub.base import RemoteFile, RepoSource
from quantpick.hub.http import RetryPolicy, UnreachableError, default_policy
from quantpick.hub.sources import open_source
from quantpick.hub.verify import (
    CHECKSUMS_MAX_BYTES,
    format_sha256sums,
    parse_sha256sums,
    read_sha256sums,
)

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.fetch.stores import HashCache, HashedFile
    from quantpick.model.manifest import Manifest

# ---------------------------------------------------------------------------------------------
# A manifest quant: plan, cross-check, fetch


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
                hashed = hash_with_progress(choice.path, cache, progress, label)
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
                        choice.store,
                        choice.path,
                        mismatch_text(digest, planned.sha256, cached=False),
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
            digest = hash_with_progress(path, cache, progress, f"{planned.name} (in place)").sha256
        except FileChanged as exc:
            progress.message(f"{exc}: not used as it is")
        if digest == planned.sha256:
            return True
    if planned.owner is not None and plan.hf_cache is None:
        got = f"sha256 {digest}" if digest else f"{size} bytes"
        raise foreign_file_error(path, planned.name, planned.owner, got)
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


def hash_with_progress(
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
