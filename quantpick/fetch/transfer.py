"""The transfer engine: one file, resumable and verified, over quantpick.hub.http.

Guarantees:
* `<name>.part` + `<name>.part.json` (url, size, sha256, commit, and how the .part is laid out).
  A restart resumes only when the sidecar matches. The sidecar carries a checksum of itself and
  is replaced atomically, so a torn or edited one means "start again", never "trust it".
* Single stream (small files, `--connections 1`, servers that ignore Range): the resume offset
  is the .part size (never a number written earlier), and the .part is written unbuffered, so a
  SIGKILL loses no byte that reached the kernel.
* Segmented (quantpick.fetch.segmented): several connections write pieces into a .part of the
  final size, and the sidecar lists the byte ranges written, recorded only after an fdatasync
  of the data; on resume each range is checked against the file (within its size, no hole).
* sha256 computed while downloading, over the bytes in order; after a resume the prefix on disk
  is hashed first.
* Only a file whose size and sha256 match reaches its final name (os.replace). A mismatch moves
  the bytes to `<name>.bad-<sha12>` and raises VerificationError (exit 4).
* Retries with exponential backoff + jitter on connection errors, stalls (idle timeout), 5xx and
  429 (Retry-After honoured). No total time cap: a slow but moving transfer is never killed.
* One process per file, across users and machines sharing the directory: the lock is
  `<name>.lock` beside the data (flock through `filelock`). A second process waits as long as the
  first makes progress (its .part changes), and gives up only when the first is stuck.
* Before writing into, truncating or renaming the .part, the path is checked to still be the
  file this process holds open (st_dev/st_ino), so a stray writer can never damage a file at its
  final name.
* Durable: the data is fsync'ed before the final rename and the directory after it; the sidecar
  is written atomically and durably too (quantpick.fetch.atomic).
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
import queue
import shutil
import stat
import threading
import time
from collections.abc import Callable
from contextlib import suppress
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
)
from quantpick.fetch.partfile import (
    CHUNK,
    Content,
    PartLayout,
    check_still_ours,
    claim_part,
    open_part,
    os_step,
    part_paths,
    part_problem,
    read_sidecar,
    write_sidecar,
    written_ranges,
)
from quantpick.fetch.segmented import FallBack, SegmentedJob, fetch_segmented
from quantpick.fetch.segmented import available as segmented_available
from quantpick.fetch.segments import RangeSet, SegmentPolicy
from quantpick.hub.base import RemoteFile
from quantpick.hub.http import (
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
from quantpick.hub.verify import hash_open_file

SPACE_MARGIN = 128 * 1024 * 1024  # keep this much free beyond the bytes still to fetch
# How long a second process waits while the lock holder makes no visible progress (its .part
# neither grows nor changes, no final file appears) before it gives up. A live holder can be quiet
# for a while without being stuck: a 300 s Retry-After (RetryPolicy.max_retry_after) plus its
# backoff, or hashing a 20 GB file on a 150 MB/s disk (~130 s). 600 s covers both.
DEFAULT_LOCK_TIMEOUT = 600.0
LOCK_POLL_SECONDS = 1.0  # how often a waiter retries the lock and looks at the holder's progress
# re-exported: callers import them from here
__all__ = ["CHUNK", "DiskSpaceError", "LocalFileError", "part_paths"]


class ProgressSink(Protocol):
    def message(self, text: str) -> None: ...
    def total_started(self, n_files: int, total_bytes: int) -> None: ...
    def file_started(self, name: str, total: int | None, done: int) -> None: ...
    def advance(self, name: str, n_bytes: int) -> None: ...
    def file_finished(self, name: str, result: DownloadResult) -> None: ...

    # Optional (looked up with getattr): `connections(name, n)`, the connection count of a
    # segmented transfer when it changes (quantpick.cli.download's terminal bars show it).


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
    resumed_from: int  # bytes of an earlier run kept (0: started from scratch)
    source: str  # label of the source used, e.g. "hf:org/name@1a2b3c4d5e6f"
    reused: bool  # the final file was already present and verified
    connections: int = 0  # most connections used at once (0: nothing transferred)
    seconds: float = 0.0  # wall time of the transfer, verification and fsync included

    @property
    def rate(self) -> float | None:
        """Bytes per second of this run's transfer (None when nothing was transferred)."""
        if not self.bytes_fetched or self.seconds <= 0:
            return None
        return self.bytes_fetched / self.seconds

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (`--json` of download and get)."""
        rate = self.rate
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
            "connections": self.connections,
            "seconds": round(self.seconds, 3),
            "rate_bytes_per_s": round(rate) if rate is not None else None,
        }


# ---------------------------------------------------------------------------------------------
# Locks, directories, free space


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


def make_dir(directory: Path) -> None:
    """Create `directory` (and parents), or say precisely why it cannot be."""
    with os_step("cannot create the download directory", directory):
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
    with os_step("cannot read the free space of", probe):
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
    with os_step("cannot move a mismatching file aside", path):
        os.replace(path, bad)
    return bad


def _open_part(path: Path) -> Any:
    """Unbuffered: every chunk goes straight to the kernel, so a SIGKILL loses nothing. Never
    through a link (partfile.open_part)."""
    return open(open_part(path, os.O_RDWR), "r+b", buffering=0)  # noqa: SIM115 - caller closes


# ---------------------------------------------------------------------------------------------
# The single stream's helpers


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


# ---------------------------------------------------------------------------------------------
# One file


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
    segments: SegmentPolicy | None = None,
    owner: str | None = None,
) -> DownloadResult:
    """Fetch `remote` to `dest`, resuming a matching .part, verifying before the final rename.

    expected_sha256/size default to the RemoteFile's. With no sha256 at all the file is still
    written (the caller decided to allow it) and the result says verified=False. `lock_timeout`:
    seconds to wait on another process that holds this file's lock and makes no progress.
    `durable=False` skips the fsyncs (benchmarks/download.py measures their cost). `segments`:
    how a large file is split over connections (default SegmentPolicy(); SINGLE_STREAM for one).
    `owner` names the other tool whose folder holds `dest` (quantpick.fetch.stores.owning_store):
    a file already at that name is then only verified, never resumed into or moved aside.
    """
    sha = (expected_sha256 or remote.sha256 or "").lower() or None
    transfer = FileTransfer(
        remote,
        dest,
        headers_for=headers_for,
        sha256=sha,
        size=expected_size if expected_size is not None else remote.size,
        expected_from=expected_from,
        source_label=source_label or remote.source_kind,
        policy=policy or default_policy(),
        progress=progress or NullProgress(),
        disk_usage=disk_usage,
        durable=durable,
        segments=segments or SegmentPolicy(),
        owner=owner,
    )
    make_dir(dest.parent)
    lock = acquire_file_lock(dest, stall_timeout=lock_timeout, progress=transfer.progress)
    try:
        return transfer.run()
    finally:
        lock.release()


class FileTransfer:
    """One file's download, run under its lock: use or resume what is on disk, fetch the rest
    (one stream, or segments over several connections), verify, rename."""

    def __init__(
        self,
        remote: RemoteFile,
        dest: Path,
        *,
        headers_for: HeadersFor,
        sha256: str | None,
        size: int | None,
        expected_from: str,
        source_label: str,
        policy: RetryPolicy,
        progress: ProgressSink,
        disk_usage: Callable[[str], Any],
        durable: bool,
        segments: SegmentPolicy,
        owner: str | None = None,
    ) -> None:
        self.remote = remote
        self.dest = dest
        self.headers_for = headers_for
        self.sha = sha256
        self.size = size
        self.expected_from = expected_from
        self.source_label = source_label
        self.policy = policy
        self.progress = progress
        self.disk_usage = disk_usage
        self.durable = durable
        self.segments = segments
        self.owner = owner  # another tool's folder holds dest: never resume into or move it
        self.part, self.sidecar = part_paths(dest)
        self.content = Content(remote.url, size, sha256, remote.revision)
        self.started = time.monotonic()
        self.resumed_from = 0  # bytes of an earlier run this one keeps
        self.connections = 0  # most connections used at once

    def run(self) -> DownloadResult:
        self.started = time.monotonic()
        # A symlink, hard link, FIFO or another user's file at the .part's (or the sidecar's)
        # name is removed, never written through (partfile.claim_part says so in one line).
        claim_part(self.part, self.progress.message)
        claim_part(self.sidecar, self.progress.message)
        if os.path.lexists(self.sidecar) and not os.path.lexists(self.part):
            # Left by a run killed between its final rename and this cleanup: it describes nothing.
            with os_step("cannot remove a stale sidecar", self.sidecar):
                self.sidecar.unlink(missing_ok=True)
        present = self._final_file()
        if present is not None:
            return present
        done, layout = self._resume_point()
        self.resumed_from = done.total
        self._check_space(done.total)
        if self.segments.segmented_for(self.size) and segmented_available():
            return self._segmented(done, layout)
        return self._stream(self._stream_part(done, layout))

    # -- what is on disk already -------------------------------------------------------------

    def _final_file(self) -> DownloadResult | None:
        """A file at the final name: reused when verified, resumed when shorter, else aside."""
        dest, sha, size = self.dest, self.sha, self.size
        if not dest.exists():
            return None
        with os_step("cannot read", dest):
            present = dest.stat().st_size
            own = part_problem(os.lstat(dest)) is None  # a link is never renamed to .part
        if sha is not None and size is not None and present < size and self.owner is None and own:
            # Truncated final file: it is a prefix as good as a .part; the hash check decides.
            self.progress.message(f"{dest.name}: {present} of {size} bytes present, resuming")
            write_sidecar(self.sidecar, self.content, PartLayout.STREAM, durable=self.durable)
            with os_step("cannot rename", dest):
                os.replace(dest, self.part)
            return None
        self.progress.message(f"{dest.name}: already present, verifying")
        with os_step("cannot read", dest):
            digest = _hash_named_file(dest)
        if digest is not None and (
            sha is None or (digest == sha and (size is None or present == size))
        ):
            return DownloadResult(
                self.remote.name, dest, present, digest, sha is not None, 0, 0,
                self.source_label, True,
            )  # fmt: skip
        if self.owner is not None:
            got = f"sha256 {digest}" if digest is not None else "changed while hashed"
            raise VerificationError(
                f"{dest} is in the folder of {self.owner} and is not {self.remote.name} "
                f"({present} bytes, {got}); quantpick never renames, moves or deletes "
                "another tool's files",
                hint="remove or fix it with the tool that owns it (the Hugging Face "
                "cache: `hf cache rm`), or choose a --dir outside its folder",
            )
        if digest is None:
            raise DownloadError(
                f"{dest} changed while it was being verified; nothing was touched",
                hint="another program writes into this directory: let it finish, then run again",
            )
        bad = _move_aside(dest, digest)
        self.progress.message(
            f"{dest.name}: present but its sha256 is {digest}, not {sha}: moved to "
            f"{bad.name}, fetching again"
        )
        return None

    def _resume_point(self) -> tuple[RangeSet, PartLayout | None]:
        """What a matching .part holds, checked against the disk (layout None: no usable .part)."""
        part = self.part
        if part.exists() and not os.access(part, os.W_OK):
            # Another user's .part that this one may not write: start a fresh one of its own.
            self.progress.message(f"{part.name} is not writable by this user; starting it again")
            with os_step("cannot replace another user's partial download", part):
                part.unlink()
        if not part.exists():
            return RangeSet(), None
        found = read_sidecar(self.sidecar)
        if found is None or not self.content.same_as(found.content):
            return RangeSet(), None
        if found.layout is PartLayout.STREAM:
            with os_step("cannot read the partial download", part):
                offset = part.stat().st_size
            if self.size is not None and offset > self.size:
                return RangeSet(), None
            return RangeSet([(0, offset)]), PartLayout.STREAM
        if self.size is None:
            return RangeSet(), None
        return written_ranges(part, self.size, found.done), PartLayout.SEGMENTS

    def _check_space(self, kept: int) -> None:
        if self.size is None:
            return
        need = self.size - kept + SPACE_MARGIN
        free = free_bytes(self.dest.parent, self.disk_usage)
        if free < need:
            raise DiskSpaceError(
                f"not enough free space in {self.dest.parent} for {self.dest.name}: "
                f"{free} bytes free, {need} needed (including a {SPACE_MARGIN} byte margin)",
                hint="free some space or choose another directory with --dir",
            )

    # -- segmented ---------------------------------------------------------------------------

    def _segmented(self, done: RangeSet, layout: PartLayout | None) -> DownloadResult:
        assert self.size is not None  # segmented_for() said so
        # The sidecar first: were this run killed between the two steps, the sidecar would
        # describe a .part shorter than the file, whose listed ranges are then cut to its size.
        write_sidecar(self.sidecar, self.content, PartLayout.SEGMENTS, done, durable=self.durable)
        with os_step("cannot open the partial download", self.part):
            fd = open_part(self.part, os.O_RDWR | os.O_CREAT)
        try:
            with os_step("cannot size the partial download", self.part):
                if layout is None:
                    os.ftruncate(fd, 0)  # a stray .part without a matching sidecar
                if os.fstat(fd).st_size != self.size:
                    check_still_ours(fd, self.part, "giving it its final size")
                    os.ftruncate(fd, self.size)  # sparse: unwritten ranges stay holes
            self.progress.file_started(self.dest.name, self.size, done.total)
            job = SegmentedJob(
                name=self.dest.name,
                url=self.remote.url,
                size=self.size,
                part=self.part,
                sidecar=self.sidecar,
                content=self.content,
                headers_for=self.headers_for,
                policy=self.policy,
                segments=self.segments,
                progress=self.progress,
                durable=self.durable,
            )
            outcome = fetch_segmented(job, fd, done)
            self.connections = outcome.connections
            if not isinstance(outcome, FallBack):
                return self._finish(fd, outcome.digest, self.size, outcome.fetched)
            self.progress.message(
                f"{self.dest.name}: {outcome.reason}; going on as one stream from byte "
                f"{outcome.offset}"
            )
            # The bars counted what is dropped now (written past the contiguous prefix).
            self.progress.advance(self.dest.name, outcome.offset - outcome.written)
            with os_step("cannot truncate the partial download", self.part):
                check_still_ours(fd, self.part, "truncating it")
                os.ftruncate(fd, outcome.offset)
            write_sidecar(self.sidecar, self.content, PartLayout.STREAM, durable=self.durable)
        finally:
            os.close(fd)
        self.resumed_from = min(self.resumed_from, outcome.offset)
        return self._stream(
            outcome.offset, hasher=outcome.hasher, fetched=outcome.fetched, announced=True
        )

    # -- one stream --------------------------------------------------------------------------

    def _stream_part(self, done: RangeSet, layout: PartLayout | None) -> int:
        """Make the .part a STREAM one; returns where the stream resumes."""
        offset = done.prefix_end()
        if layout is PartLayout.STREAM:
            return offset
        if layout is PartLayout.SEGMENTS:
            # Pieces past the contiguous prefix are dropped: a stream only appends.
            with os_step("cannot truncate the partial download", self.part):
                fd = open_part(self.part, os.O_RDWR)
                try:
                    check_still_ours(fd, self.part, "truncating it")
                    os.ftruncate(fd, offset)
                finally:
                    os.close(fd)
            write_sidecar(self.sidecar, self.content, PartLayout.STREAM, durable=self.durable)
            return offset
        write_sidecar(self.sidecar, self.content, PartLayout.STREAM, durable=self.durable)
        with os_step("cannot create the partial download", self.part):
            fd = open_part(self.part, os.O_RDWR | os.O_CREAT)
            try:  # a stray .part of this user's without a matching sidecar: emptied after the
                os.ftruncate(fd, 0)  # check (O_TRUNC would act before it)
            finally:
                os.close(fd)
        return 0

    def _stream(
        self, offset: int, *, hasher: Any = None, fetched: int = 0, announced: bool = False
    ) -> DownloadResult:
        if hasher is None:
            hasher = hashlib.sha256()
            if offset:
                self._hash_prefix(hasher, offset)
        state = _State(
            offset=offset,
            hasher=_HashPipe(hasher),
            fetched=fetched,
            resumed_from=min(offset, self.resumed_from),
        )
        self.connections = max(self.connections, 1)
        try:
            if not announced:
                self.progress.file_started(self.dest.name, self.size, state.offset)
            with os_step("cannot open the partial download", self.part):
                handle = _open_part(self.part)
            if self.durable:
                state.flusher = _Flusher(handle.fileno())
                state.next_flush = state.offset + FLUSH_EVERY
            try:
                self._fetch_into(handle, state)
                return self._finish(
                    handle.fileno(),
                    state.hasher.hexdigest(),
                    state.offset,
                    state.fetched,
                    resumed_from=state.resumed_from,
                )
            finally:
                if state.flusher is not None:
                    state.flusher.close()
                handle.close()
        finally:
            state.hasher.close()

    def _hash_prefix(self, hasher: Any, offset: int) -> None:
        self.progress.message(
            f"{self.dest.name}: resuming at byte {offset}, checking the part on disk"
        )
        with os_step("cannot read the partial download", self.part):
            with open(open_part(self.part, os.O_RDONLY), "rb", buffering=0) as handle:
                buffer = bytearray(CHUNK)
                left = offset
                while left:
                    n = handle.readinto(memoryview(buffer)[: min(CHUNK, left)])
                    if not n:
                        break
                    hasher.update(memoryview(buffer)[:n])
                    left -= n

    def _restart_from_zero(self, handle: Any, state: _State) -> None:
        check_still_ours(handle.fileno(), self.part, "truncating it")
        handle.seek(0)
        handle.truncate(0)
        state.offset = 0
        state.resumed_from = 0
        state.hasher.reset()

    def _fetch_into(self, handle: Any, state: _State) -> None:
        """Requests until the .part holds the whole file (or the size is unknown and EOF came)."""
        failures = 0
        last_error = ""
        size, name = self.size, self.dest.name
        handle.seek(state.offset)
        while size is None or state.offset < size:
            before = state.offset
            try:
                check_still_ours(handle.fileno(), self.part, "writing more into it")
                if self._transfer_once(handle, state):
                    return
                continue
            except RestartTransfer as exc:
                last_error = str(exc)
                self.progress.message(f"{name}: {exc}; restarting from byte 0")
                self._restart_from_zero(handle, state)
                failures += 1
                retry_after = None
            except TransientError as exc:
                last_error = str(exc)
                failures = 1 if state.offset > before else failures + 1
                retry_after = exc.retry_after
            if failures >= self.policy.attempts:
                raise DownloadError(
                    f"{name}: {last_error} (gave up after {failures} attempts)",
                    hint=f"run the command again to resume; {state.offset} bytes are kept in "
                    f"{self.part.name}",
                )
            delay = self.policy.backoff(failures)
            if retry_after is not None:
                delay = max(delay, min(retry_after, self.policy.max_retry_after))
            self.progress.message(f"{name}: {last_error}; retrying in {delay:.1f} s")
            self.policy.sleep(delay)

    def _transfer_once(self, handle: Any, state: _State) -> bool:
        """One request; appends to the part. True when the file is complete (size known or EOF)."""
        size, label = self.size, self.dest.name
        extra = {"Accept-Encoding": "identity"}
        if state.offset:
            extra["Range"] = f"bytes={state.offset}-"
        conn, response, final = open_url(
            self.remote.url, self.headers_for, extra_headers=extra, policy=self.policy
        )
        try:
            status = response.status
            if status == 429 or status >= 500:
                raise TransientError(
                    f"HTTP {status} from {url_label(final)}",
                    retry_after_seconds(response.getheader("Retry-After")),
                )
            if status == 416:
                raise RestartTransfer(
                    f"the server refused the range bytes={state.offset}- (HTTP 416)"
                )
            if status not in (200, 206):
                raise status_error(status, final, self.remote.name, response)
            content_range = response.getheader("Content-Range")
            if state.offset:
                if status == 206 or content_range:
                    # 206, or ModelScope's 200 + Content-Range: must be exactly the rest.
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
                    self.progress.message(
                        f"{label}: the server ignored Range; restarting from byte 0"
                    )
                    self._restart_from_zero(handle, state)
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
            self._read_body(handle, state, response, size, final)
            if size is None:
                return True  # no size known anywhere: EOF is the end
            if state.offset < size:
                raise TransientError(f"connection closed after {state.offset} of {size} bytes")
            return True
        finally:
            conn.close()

    def _read_body(
        self,
        handle: Any,
        state: _State,
        response: http.client.HTTPResponse,
        size: int | None,
        final: str,
    ) -> None:
        part, label = self.part, self.dest.name
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
                return
            if size is not None and state.offset + n > size:
                n = size - state.offset  # never write past the expected end
            try:
                check_still_ours(handle.fileno(), part, "writing more into it")
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
            self.progress.advance(label, n)
            if size is not None and state.offset >= size:
                return

    # -- the end -----------------------------------------------------------------------------

    def _finish(
        self, fd: int, digest: str, got_size: int, fetched: int, *, resumed_from: int | None = None
    ) -> DownloadResult:
        """Verify, make durable, rename to the final name (or move the bytes aside)."""
        part, dest, sha, size = self.part, self.dest, self.sha, self.size
        on_disk = os.fstat(fd).st_size
        if on_disk != got_size:  # the hash covers the stream; make sure the file is that stream
            raise DownloadError(f"{part} holds {on_disk} bytes, {got_size} were written")
        if (sha is not None and digest != sha) or (size is not None and got_size != size):
            check_still_ours(fd, part, "moving it aside")
            self.sidecar.unlink(missing_ok=True)
            bad = _move_aside(part, digest)
            raise VerificationError(
                f"{self.remote.name}: downloaded sha256 {digest} ({got_size} bytes) does not "
                f"match {sha} ({size} bytes) expected from {self.expected_from}",
                hint=f"the bytes were kept as {bad} and not used; the source or the expected "
                "hash is wrong: report it, or try another --source",
            )
        with os_step("cannot finish", dest):
            if self.durable:
                os.fsync(fd)  # the bytes are on disk before the name says so
            check_still_ours(fd, part, "renaming it to its final name")
            os.replace(part, dest)
            _check_renamed(fd, dest)
            if self.durable:
                fsync_dir(dest.parent)  # and the new name is on disk too
        with suppress(OSError):  # a sidecar left here is removed by the next run
            self.sidecar.unlink(missing_ok=True)
        result = DownloadResult(
            self.remote.name,
            dest,
            got_size,
            digest,
            sha is not None,
            fetched,
            self.resumed_from if resumed_from is None else resumed_from,
            self.source_label,
            False,
            connections=self.connections if fetched else 0,
            seconds=time.monotonic() - self.started,
        )
        self.progress.file_finished(dest.name, result)
        return result


def _check_renamed(fd: int, dest: Path) -> None:
    """After the final rename, `dest` must name the file this process wrote (lstat: a link is
    not it). Another user swapping the .part between the check and the rename would otherwise
    put their entry (a symlink they can repoint) at the final name; it is removed instead."""
    info = os.lstat(dest)
    ours = os.fstat(fd)
    if (info.st_dev, info.st_ino) == (ours.st_dev, ours.st_ino):
        return
    if stat.S_ISLNK(info.st_mode):
        dest.unlink()  # the link itself, at the name this run was writing: its target untouched
    raise DownloadError(
        f"{dest}: the partial download was renamed or replaced by another process just before "
        "its final rename; what was renamed was not this download, it was not kept",
        hint="another program writes into this directory: let it finish, then run again",
    )


def _write_all(handle: Any, data: memoryview) -> None:
    """Write every byte: a raw write may take fewer than asked (a disk filling up, a signal)."""
    while data:
        written = handle.write(data)
        if written is None:  # pragma: no cover - only non-blocking files answer None
            continue
        data = data[written:]
