"""The transfer engine: one file, resumable and verified, over quantpick.fetch.http.

Guarantees:
* `<name>.part` + `<name>.part.json` (url, size, sha256, commit). A restart resumes with `Range`
  only when the sidecar matches; the offset is the .part size (never a number written earlier), and
  the .part is written unbuffered, so a SIGKILL loses no byte that reached the kernel.
* sha256 computed while downloading; after a resume the prefix on disk is hashed first.
* Only a file whose size and sha256 match reaches its final name (os.replace). A mismatch moves
  the bytes to `<name>.bad-<sha12>` and raises VerificationError (exit 4).
* Retries with exponential backoff + jitter on connection errors, stalls (idle timeout), 5xx and
  429 (Retry-After honoured). No total time cap: a slow but moving transfer is never killed.
* One process per file, across users and machines sharing the directory: the lock is
  `<name>.lock` beside the data (flock through `filelock`). A second process waits as long as the
  first makes progress (its .part grows), and gives up only when the first is stuck.
* Before truncating or renaming the .part, the path is checked to still be the file this process
  holds open (st_dev/st_ino), so a stray writer can never damage a file at its final name.
* Durable: the data is fsync'ed before the final rename and the directory after it; the sidecar
  is written atomically and durably too (quantpick.fetch.atomic).
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import queue
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from quantpick.errors import DownloadError, VerificationError
from quantpick.fetch.atomic import (
    NO_SPACE_ERRNOS,
    DiskSpaceError,
    LocalFileError,
    fsync_dir,
    os_error,
    write_atomic,
)
from quantpick.fetch.http import (
    HeadersFor,
    RestartTransfer,
    RetryPolicy,
    TransientError,
    default_policy,
    open_url,
    parse_content_range,
    retry_after_seconds,
    status_error,
    url_label,
)
from quantpick.fetch.sources import RemoteFile
from quantpick.fetch.verify import hash_open_file

CHUNK = 1024 * 1024  # 1 MiB reads: the fastest read size measured for http.client + hashlib
SPACE_MARGIN = 128 * 1024 * 1024  # keep this much free beyond the bytes still to fetch
# How long a second process waits while the lock holder makes no visible progress (its .part
# neither grows nor changes, no final file appears) before it gives up. A live holder can be quiet
# for a while without being stuck: a 300 s Retry-After (RetryPolicy.max_retry_after) plus its
# backoff, or hashing a 20 GB file on a 150 MB/s disk (~130 s). 600 s covers both.
DEFAULT_LOCK_TIMEOUT = 600.0
LOCK_POLL_SECONDS = 1.0  # how often a waiter retries the lock and looks at the holder's progress
SIDECAR_VERSION = 1

__all__ = ["DiskSpaceError", "LocalFileError"]  # re-exported: callers import them from here


class ProgressSink(Protocol):
    def message(self, text: str) -> None: ...
    def total_started(self, n_files: int, total_bytes: int) -> None: ...
    def file_started(self, name: str, total: int | None, done: int) -> None: ...
    def advance(self, name: str, n_bytes: int) -> None: ...
    def file_finished(self, name: str, result: DownloadResult) -> None: ...


class NullProgress:
    def message(self, text: str) -> None:
        pass

    def total_started(self, n_files: int, total_bytes: int) -> None:
        pass

    def file_started(self, name: str, total: int | None, done: int) -> None:
        pass

    def advance(self, name: str, n_bytes: int) -> None:
        pass

    def file_finished(self, name: str, result: DownloadResult) -> None:
        pass


@dataclass(frozen=True)
class DownloadResult:
    name: str
    path: Path
    size: int
    sha256: str
    verified: bool  # the sha256 matched a known hash (False only with --allow-unverified)
    bytes_fetched: int  # bytes transferred by this run (0 when the file was already there)
    resumed_from: int  # offset of the first request (0: started from scratch)
    source: str  # label of the source used, e.g. "hf:org/name@1a2b3c4d5e6f"
    reused: bool  # the final file was already present and verified

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (`--json` of download and get)."""
        return {
            "name": self.name,
            "path": str(self.path),
            "size": self.size,
            "sha256": self.sha256,
            "verified": self.verified,
            "bytes_fetched": self.bytes_fetched,
            "resumed_from": self.resumed_from,
            "reused": self.reused,
            "source": self.source,
        }


# ---------------------------------------------------------------------------------------------
# One file


def part_paths(dest: Path) -> tuple[Path, Path]:
    return dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.json")


def _sidecar(url: str, size: int | None, sha256: str | None, commit: str | None) -> dict[str, Any]:
    return {
        "version": SIDECAR_VERSION,
        "url": url,
        "size": size,
        "sha256": sha256,
        "commit": commit,
    }


def _sidecar_matches(path: Path, wanted: dict[str, Any]) -> bool:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(found, dict) or found.get("version") != SIDECAR_VERSION:
        return False
    if wanted["sha256"]:
        # Bytes identified by their hash: a resume may switch source (hub -> mirror) safely.
        return found.get("sha256") == wanted["sha256"] and found.get("size") == wanted["size"]
    return all(found.get(k) == wanted[k] for k in ("url", "size", "commit"))


def _write_json_atomic(path: Path, document: dict[str, Any], durable: bool = True) -> None:
    with _os_step("cannot write the download sidecar", path):
        write_atomic(path, json.dumps(document).encode(), durable=durable)


def lock_path(dest: Path) -> Path:
    """The lock of a target file: beside it (hidden), so every process that writes the file sees
    it, whatever its user or QUANTPICK_HOME. It stays after use, empty, as filelock's UnixFileLock
    leaves it ("the file stays in place on release so waiters share the same inode"): unlinking
    a flock file that others may be waiting on lets a waiter lock a dead inode."""
    return dest.with_name(f".{dest.name}.lock")


def shared_mode(directory: Path) -> int:
    """The mode for a lock file in `directory`: rw-r--r--, plus group/other write when the
    directory grants them. Whoever may create files there (two users sharing a models volume
    through a group, or a world-writable one) can then open the lock and wait on it; nobody else
    gains anything. Applied with fchmod after creation (filelock's explicit `mode`), so the
    creator's umask (typically 022) does not narrow it."""
    mode = 0o644
    try:
        dir_mode = os.stat(directory).st_mode
    except OSError:
        return mode
    if dir_mode & stat.S_IWGRP:
        mode |= stat.S_IWGRP
    if dir_mode & stat.S_IWOTH:
        mode |= stat.S_IWOTH
    return mode


@contextmanager
def _os_step(what: str, path: Path | str, hint: str | None = None) -> Iterator[None]:
    """Turn an OSError inside the block into one line: `<what>: <path>: <reason>`."""
    try:
        yield
    except OSError as exc:
        raise os_error(what, path, exc, hint=hint) from None


def make_dir(directory: Path) -> None:
    """Create `directory` (and parents), or say precisely why it cannot be."""
    with _os_step("cannot create the download directory", directory):
        directory.mkdir(parents=True, exist_ok=True)
    if not os.access(directory, os.W_OK | os.X_OK):
        read_only = _read_only(directory)
        raise LocalFileError(
            f"cannot write in the download directory: {directory}: "
            + ("Read-only file system" if read_only else "Permission denied"),
            hint="choose a directory you can write to (--dir)",
            path=str(directory),
            os_errno=errno.EROFS if read_only else errno.EACCES,
        )


def _read_only(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def _progress_mark(dest: Path, part: Path) -> tuple[Any, ...]:
    """What a waiter watches to tell a working lock holder from a stuck one."""
    marks: list[Any] = []
    for path in (part, dest):
        try:
            st = path.stat()
            marks.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            marks.append(None)
    return tuple(marks)


def acquire_file_lock(
    dest: Path,
    *,
    stall_timeout: float = DEFAULT_LOCK_TIMEOUT,
    progress: ProgressSink | None = None,
    poll: float = LOCK_POLL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """Hold `<dest>.lock`; wait while another holder makes progress on dest's .part.

    Returns the acquired filelock.FileLock (release it). Raises DownloadError when the holder
    shows no progress for `stall_timeout` seconds, LocalFileError when the lock cannot be opened.
    """
    from filelock import FileLock, Timeout

    progress = progress or NullProgress()
    path = lock_path(dest)
    part, _ = part_paths(dest)
    lock = FileLock(str(path), mode=shared_mode(dest.parent))
    mark = _progress_mark(dest, part)
    quiet_since = clock()
    announced = False
    while True:
        try:
            lock.acquire(timeout=poll)
            return lock
        except Timeout:  # a TimeoutError, hence an OSError: caught first
            pass
        except OSError as exc:
            raise os_error(
                "cannot open the lock file",
                path,
                exc,
                hint="it must be writable by every user who downloads into this directory",
            ) from None
        now = _progress_mark(dest, part)
        if now != mark:
            mark, quiet_since = now, clock()
        elif clock() - quiet_since >= stall_timeout:
            raise DownloadError(
                f"another quantpick process is downloading {dest} and has made no progress for "
                f"{stall_timeout:g} s (it holds {path})",
                hint="if that process is stuck, stop it and run the command again; if it is "
                "working (hashing a large file, waiting out a hub's Retry-After), run again later",
            )
        if not announced:
            progress.message(
                f"{dest.name}: another quantpick process is downloading it; waiting while it "
                "makes progress"
            )
            announced = True


def existing_parent(where: Path) -> Path:
    """`where`, or its nearest ancestor that exists (what a not-yet-created directory is on)."""
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def free_bytes(where: Path, disk_usage: Callable[[str], Any]) -> int:
    probe = existing_parent(where)
    with _os_step("cannot read the free space of", probe):
        return int(disk_usage(str(probe)).free)


def _hash_named_file(path: Path) -> str | None:
    """sha256 of the file `path` names, through one descriptor; None when the path no longer
    names that same, unchanged file once it is read (renamed over or written meanwhile), so a
    result never vouches for bytes other than the ones at that name."""
    from quantpick.fetch.stores import FileIdentity
    from quantpick.local_files import open_regular

    fd = open_regular(path)
    try:
        before = FileIdentity.of(os.fstat(fd))
        digest = hash_open_file(fd)
        after = FileIdentity.of(os.fstat(fd))
    finally:
        os.close(fd)
    try:
        named = FileIdentity.of(os.stat(path))
    except FileNotFoundError:
        return None
    return digest if before == after == named else None


def _move_aside(path: Path, digest: str) -> Path:
    bad = path.with_name(f"{path.name.removesuffix('.part')}.bad-{digest[:12]}")
    with _os_step("cannot move a mismatching file aside", path):
        os.replace(path, bad)
    return bad


def _open_part(path: Path) -> Any:
    """Unbuffered: every chunk goes straight to the kernel, so a SIGKILL loses nothing."""
    return open(path, "r+b", buffering=0)  # noqa: SIM115 - the caller's with-block closes it


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _check_still_ours(handle: Any, part: Path, doing: str) -> None:
    """Refuse to go on when `part` is no longer the file this process has open: another process
    renamed it (to its final name, or aside) or replaced it. Writing, truncating or renaming
    through a stale handle is how a verified file at its final name gets damaged. Checked before
    every chunk written (a stat: ~2 us per MiB), every truncation and the final rename."""
    ours = _identity(os.fstat(handle.fileno()))
    try:
        theirs: tuple[int, int] | None = _identity(os.stat(part))
    except FileNotFoundError:
        theirs = None
    if theirs != ours:
        raise DownloadError(
            f"{part} was renamed or replaced by another process while this one was writing it; "
            f"stopped before {doing}, nothing was touched",
            hint="another program writes into this directory: let it finish, then run again",
        )


class _HashPipe:
    """sha256 on a second thread, overlapping the socket reads and file writes.

    hashlib releases the GIL on large updates, so on 2+ cores hashing costs no wall time (the
    notes measured hashing in line at ~0.6 s of CPU per GiB, over half of a loopback transfer).
    Buffers circulate: buffer() -> readinto -> write -> feed() -> hashed -> back to the pool.
    """

    def __init__(self, hasher: Any, n_buffers: int = 4) -> None:
        self._hasher = hasher
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(n_buffers):
            self._free.put(bytearray(CHUNK))
        self._work: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True, name="quantpick-sha256")
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._work.get()
            try:
                if item is None:
                    return
                buffer, n = item
                self._hasher.update(memoryview(buffer)[:n])
                self._free.put(buffer)
            finally:
                self._work.task_done()

    def buffer(self) -> bytearray:
        return self._free.get()

    def give_back(self, buffer: bytearray) -> None:
        self._free.put(buffer)

    def feed(self, buffer: bytearray, n: int) -> None:
        self._work.put((buffer, n))

    def reset(self) -> None:
        """Start over from byte 0 (after everything queued so far is done)."""
        self._work.join()
        self._hasher = hashlib.sha256()

    def hexdigest(self) -> str:
        self._work.join()
        return str(self._hasher.hexdigest())

    def close(self) -> None:
        if self._thread.is_alive():
            self._work.put(None)
            self._thread.join()


class _Flusher:
    """Writeback while the download goes on: every FLUSH_EVERY bytes written, fdatasync runs on a
    thread (it releases the GIL), so the fsync before the final rename waits for the tail only,
    not for the whole file. Without it the kernel starts writing back only past its dirty
    threshold (10 % of RAM by default), and on a fast link the whole file waits at the end."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._sync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="quantpick-flush")
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                self._sync(self._fd)
            except OSError:
                pass  # the final fsync, on the main thread, reports any error

    def poke(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()


# Bytes between background fdatasyncs. benchmarks/download.py, 1 GiB on loopback, cost of
# durability (median of 5, durable minus not): +2.32 s with no background flush, +1.22 s every
# 256 MiB, +1.01 s every 64 MiB; at 100 MB/s, +0.10 s per 512 MiB.
FLUSH_EVERY = 64 * 1024 * 1024


@dataclass
class _State:
    offset: int
    hasher: _HashPipe
    fetched: int = 0
    # Bytes of an earlier run that this one kept (the .part it started from); 0 once it had to
    # start again from byte 0. Right even when the .part was complete and no request was made.
    resumed_from: int = 0
    flusher: _Flusher | None = None
    next_flush: int = FLUSH_EVERY


def download_file(
    remote: RemoteFile,
    dest: Path,
    *,
    headers_for: HeadersFor,
    expected_sha256: str | None = None,
    expected_size: int | None = None,
    expected_from: str = "the source",
    source_label: str = "",
    policy: RetryPolicy | None = None,
    progress: ProgressSink | None = None,
    disk_usage: Callable[[str], Any] = shutil.disk_usage,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    durable: bool = True,
    owner: str | None = None,
) -> DownloadResult:
    """Fetch `remote` to `dest`, resuming a matching .part, verifying before the final rename.

    expected_sha256/size default to the RemoteFile's. With no sha256 at all the file is still
    written (the caller decided to allow it) and the result says verified=False. `lock_timeout`:
    seconds to wait on another process that holds this file's lock and makes no progress.
    `durable=False` skips the fsyncs (benchmarks/download.py measures their cost). `owner`
    names the other tool whose folder holds `dest` (quantpick.fetch.stores.owning_store): a
    file already at that name is then only verified, never resumed into or moved aside.
    """
    policy = policy or default_policy()
    progress = progress or NullProgress()
    sha = (expected_sha256 or remote.sha256 or "").lower() or None
    size = expected_size if expected_size is not None else remote.size
    make_dir(dest.parent)
    lock = acquire_file_lock(dest, stall_timeout=lock_timeout, progress=progress)
    try:
        return _download_locked(
            remote,
            dest,
            headers_for,
            sha,
            size,
            expected_from,
            source_label or remote.source_kind,
            policy,
            progress,
            disk_usage,
            durable,
            owner,
        )
    finally:
        lock.release()


def _download_locked(
    remote: RemoteFile,
    dest: Path,
    headers_for: HeadersFor,
    sha: str | None,
    size: int | None,
    expected_from: str,
    source_label: str,
    policy: RetryPolicy,
    progress: ProgressSink,
    disk_usage: Callable[[str], Any],
    durable: bool,
    owner: str | None = None,
) -> DownloadResult:
    part, sidecar = part_paths(dest)
    wanted = _sidecar(remote.url, size, sha, remote.revision)
    if sidecar.exists() and not part.exists():
        # Left by a run killed between its final rename and this cleanup: it describes nothing.
        with _os_step("cannot remove a stale sidecar", sidecar):
            sidecar.unlink(missing_ok=True)

    if dest.exists():
        with _os_step("cannot read", dest):
            present = dest.stat().st_size
        if sha is not None and size is not None and present < size and owner is None:
            # Truncated final file: it is a prefix as good as a .part; the hash check decides.
            progress.message(f"{dest.name}: {present} of {size} bytes present, resuming")
            _write_json_atomic(sidecar, wanted, durable)
            with _os_step("cannot rename", dest):
                os.replace(dest, part)
        else:
            progress.message(f"{dest.name}: already present, verifying")
            with _os_step("cannot read", dest):
                digest = _hash_named_file(dest)
            if digest is not None and (
                sha is None or (digest == sha and (size is None or present == size))
            ):
                return DownloadResult(
                    remote.name, dest, present, digest, sha is not None, 0, 0, source_label, True
                )
            if owner is not None:
                got = f"sha256 {digest}" if digest is not None else "changed while hashed"
                raise VerificationError(
                    f"{dest} is in the folder of {owner} and is not {remote.name} "
                    f"({present} bytes, {got}); quantpick never renames, moves or deletes "
                    "another tool's files",
                    hint="remove or fix it with the tool that owns it (the Hugging Face "
                    "cache: `hf cache rm`), or choose a --dir outside its folder",
                )
            if digest is None:
                raise DownloadError(
                    f"{dest} changed while it was being verified; nothing was touched",
                    hint="another program writes into this directory: let it finish, then "
                    "run again",
                )
            bad = _move_aside(dest, digest)
            progress.message(
                f"{dest.name}: present but its sha256 is {digest}, not {sha}: moved to "
                f"{bad.name}, fetching again"
            )

    if part.exists() and not os.access(part, os.W_OK):
        # Another user's .part that this one may not write: start a fresh one of its own.
        progress.message(f"{part.name} is not writable by this user; starting it again")
        with _os_step("cannot replace another user's partial download", part):
            part.unlink()
    if part.exists() and _sidecar_matches(sidecar, wanted):
        offset = part.stat().st_size
        if size is not None and offset > size:
            offset = 0
    else:
        offset = 0
    if offset == 0:
        _write_json_atomic(sidecar, wanted, durable)
        with _os_step("cannot create the partial download", part):
            with open(part, "wb"):
                pass

    if size is not None:
        need = size - offset + SPACE_MARGIN
        free = free_bytes(dest.parent, disk_usage)
        if free < need:
            raise DiskSpaceError(
                f"not enough free space in {dest.parent} for {dest.name}: "
                f"{free} bytes free, {need} needed (including a {SPACE_MARGIN} byte margin)",
                hint="free some space or choose another directory with --dir",
            )

    hasher = hashlib.sha256()
    if offset:
        progress.message(f"{dest.name}: resuming at byte {offset}, checking the part on disk")
        with _os_step("cannot read the partial download", part):
            with open(part, "rb", buffering=0) as handle:
                buffer = bytearray(CHUNK)
                left = offset
                while left:
                    n = handle.readinto(memoryview(buffer)[: min(CHUNK, left)])
                    if not n:
                        break
                    hasher.update(memoryview(buffer)[:n])
                    left -= n
    state = _State(offset=offset, hasher=_HashPipe(hasher), resumed_from=offset)
    try:
        return _transfer_and_finish(
            remote,
            dest,
            part,
            sidecar,
            state,
            headers_for,
            sha,
            size,
            expected_from,
            source_label,
            policy,
            progress,
            durable,
        )
    finally:
        state.hasher.close()


def _restart_from_zero(handle: Any, part: Path, state: _State) -> None:
    _check_still_ours(handle, part, "truncating it")
    handle.seek(0)
    handle.truncate(0)
    state.offset = 0
    state.resumed_from = 0
    state.hasher.reset()


def _transfer_and_finish(
    remote: RemoteFile,
    dest: Path,
    part: Path,
    sidecar: Path,
    state: _State,
    headers_for: HeadersFor,
    sha: str | None,
    size: int | None,
    expected_from: str,
    source_label: str,
    policy: RetryPolicy,
    progress: ProgressSink,
    durable: bool,
) -> DownloadResult:
    progress.file_started(dest.name, size, state.offset)
    with _os_step("cannot open the partial download", part):
        handle = _open_part(part)
    if durable:
        state.flusher = _Flusher(handle.fileno())
        state.next_flush = state.offset + FLUSH_EVERY
    try:
        return _fetch_into(
            remote,
            dest,
            part,
            sidecar,
            handle,
            state,
            headers_for,
            sha,
            size,
            expected_from,
            source_label,
            policy,
            progress,
            durable,
        )
    finally:
        if state.flusher is not None:
            state.flusher.close()
        handle.close()


def _fetch_into(
    remote: RemoteFile,
    dest: Path,
    part: Path,
    sidecar: Path,
    handle: Any,
    state: _State,
    headers_for: HeadersFor,
    sha: str | None,
    size: int | None,
    expected_from: str,
    source_label: str,
    policy: RetryPolicy,
    progress: ProgressSink,
    durable: bool,
) -> DownloadResult:
    failures = 0
    last_error = ""
    handle.seek(state.offset)
    while size is None or state.offset < size:
        before = state.offset
        try:
            _check_still_ours(handle, part, "writing more into it")
            finished = _transfer_once(
                remote, handle, part, state, size, headers_for, policy, progress, dest.name
            )
            if finished:
                break
            continue
        except RestartTransfer as exc:
            last_error = str(exc)
            progress.message(f"{dest.name}: {exc}; restarting from byte 0")
            _restart_from_zero(handle, part, state)
            failures += 1
            retry_after = None
        except TransientError as exc:
            last_error = str(exc)
            failures = 1 if state.offset > before else failures + 1
            retry_after = exc.retry_after
        if failures >= policy.attempts:
            raise DownloadError(
                f"{dest.name}: {last_error} (gave up after {failures} attempts)",
                hint=f"run the command again to resume; {state.offset} bytes are kept in "
                f"{part.name}",
            )
        delay = policy.backoff(failures)
        if retry_after is not None:
            delay = max(delay, min(retry_after, policy.max_retry_after))
        progress.message(f"{dest.name}: {last_error}; retrying in {delay:.1f} s")
        policy.sleep(delay)

    digest = state.hasher.hexdigest()
    got_size = state.offset
    on_disk = os.fstat(handle.fileno()).st_size
    if on_disk != got_size:  # the hash covers the stream; make sure the file is that stream
        raise DownloadError(f"{part} holds {on_disk} bytes, {got_size} were written")
    if (sha is not None and digest != sha) or (size is not None and got_size != size):
        _check_still_ours(handle, part, "moving it aside")
        sidecar.unlink(missing_ok=True)
        bad = _move_aside(part, digest)
        raise VerificationError(
            f"{remote.name}: downloaded sha256 {digest} ({got_size} bytes) does not match "
            f"{sha} ({size} bytes) expected from {expected_from}",
            hint=f"the bytes were kept as {bad} and not used; the source or the expected hash "
            "is wrong: report it, or try another --source",
        )
    with _os_step("cannot finish", dest):
        if durable:
            os.fsync(handle.fileno())  # the bytes are on disk before the name says so
        _check_still_ours(handle, part, "renaming it to its final name")
        os.replace(part, dest)
        if durable:
            fsync_dir(dest.parent)  # and the new name is on disk too
    with suppress(OSError):  # a sidecar left here is removed by the next run
        sidecar.unlink(missing_ok=True)
    result = DownloadResult(
        remote.name,
        dest,
        got_size,
        digest,
        sha is not None,
        state.fetched,
        state.resumed_from,
        source_label,
        False,
    )
    progress.file_finished(dest.name, result)
    return result


def _write_all(handle: Any, data: memoryview) -> None:
    """Write every byte: a raw write may take fewer than asked (a disk filling up, a signal)."""
    while data:
        written = handle.write(data)
        if written is None:  # pragma: no cover - only non-blocking files answer None
            continue
        data = data[written:]


def _transfer_once(
    remote: RemoteFile,
    handle: Any,
    part: Path,
    state: _State,
    size: int | None,
    headers_for: HeadersFor,
    policy: RetryPolicy,
    progress: ProgressSink,
    label: str,
) -> bool:
    """One request; appends to the part. True when the file is complete (size known or EOF)."""
    extra = {"Accept-Encoding": "identity"}
    if state.offset:
        extra["Range"] = f"bytes={state.offset}-"
    conn, response, final = open_url(remote.url, headers_for, extra_headers=extra, policy=policy)
    try:
        status = response.status
        if status == 429 or status >= 500:
            raise TransientError(
                f"HTTP {status} from {url_label(final)}",
                retry_after_seconds(response.getheader("Retry-After")),
            )
        if status == 416:
            raise RestartTransfer(f"the server refused the range bytes={state.offset}- (HTTP 416)")
        if status not in (200, 206):
            raise status_error(status, final, remote.name, response)
        content_range = response.getheader("Content-Range")
        if state.offset:
            if status == 206 or content_range:
                # 206, or ModelScope's 200 + Content-Range: must be exactly the rest of the file.
                parsed = parse_content_range(content_range)
                if (
                    parsed is None
                    or parsed[0] != state.offset
                    or (size is not None and (parsed[2] != size or parsed[1] != size - 1))
                ):
                    raise RestartTransfer(
                        f"the server answered bytes={state.offset}- with HTTP {status} "
                        f"Content-Range {content_range!r}"
                    )
            else:
                # A plain 200: the server ignored Range and sends the whole file. Use it.
                progress.message(f"{label}: the server ignored Range; restarting from byte 0")
                _restart_from_zero(handle, part, state)
        elif status == 206:
            raise TransientError(f"unrequested partial answer from {url_label(final)}")
        length = response.length  # Content-Length, None when chunked / absent
        if size is not None and length is not None and length != size - state.offset:
            raise TransientError(
                f"Content-Length {length} from {url_label(final)}, "
                f"{size - state.offset} bytes expected"
            )
        if size is None and length is not None:
            size = state.offset + length
        while True:
            buffer = state.hasher.buffer()
            view = memoryview(buffer)
            try:
                n = response.readinto(buffer)
            except (OSError, http.client.HTTPException) as exc:
                state.hasher.give_back(buffer)
                raise TransientError(
                    f"{type(exc).__name__} after {state.offset} bytes ({url_label(final)})"
                ) from None
            if not n:
                state.hasher.give_back(buffer)
                break
            if size is not None and state.offset + n > size:
                n = size - state.offset  # never write past the expected end
            try:
                _check_still_ours(handle, part, "writing more into it")
            except DownloadError:
                state.hasher.give_back(buffer)
                raise
            try:
                _write_all(handle, view[:n])
            except OSError as exc:
                state.hasher.give_back(buffer)
                kept = os.fstat(handle.fileno()).st_size  # what the disk really holds
                if exc.errno in NO_SPACE_ERRNOS:
                    raise DiskSpaceError(
                        f"cannot write {part}: {exc.strerror} ({kept} bytes kept)",
                        hint="free some space and run the command again to resume",
                    ) from None
                raise os_error(
                    "cannot write the partial download",
                    part,
                    exc,
                    hint=f"{kept} bytes are kept; run the command again to resume",
                ) from None
            state.hasher.feed(buffer, n)
            state.offset += n
            state.fetched += n
            if state.flusher is not None and state.offset >= state.next_flush:
                state.flusher.poke()
                state.next_flush = state.offset + FLUSH_EVERY
            progress.advance(label, n)
            if size is not None and state.offset >= size:
                break
        if size is None:
            return True  # no size known anywhere: EOF is the end
        if state.offset < size:
            raise TransientError(f"connection closed after {state.offset} of {size} bytes")
        return True
    finally:
        conn.close()
