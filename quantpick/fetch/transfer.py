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

import hashlib
import http.client
import os
import shutil
import stat
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from quantpick.errors import DownloadError, VerificationError
from quantpick.fetch.atomic import (
    NO_SPACE_ERRNOS,
    DiskSpaceError,
    LocalFileError,
    fsync_dir,
    os_error,
)
from quantpick.fetch.download_dir import SPACE_MARGIN, free_bytes, make_dir
from quantpick.fetch.file_lock import DEFAULT_LOCK_TIMEOUT, acquire_file_lock
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
from quantpick.fetch.progress import DownloadResult, NullProgress, ProgressSink
from quantpick.fetch.segmented import FallBack, SegmentedJob, fetch_segmented
from quantpick.fetch.segmented import available as segmented_available
from quantpick.fetch.segments import RangeSet, SegmentPolicy
from quantpick.fetch.write_behind import Flusher, HashPipe
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

# re-exported: callers import them from here
__all__ = ["CHUNK", "DiskSpaceError", "LocalFileError", "part_paths"]


# ---------------------------------------------------------------------------------------------
# The file at its final name: hashed, moved aside on a mismatch; the .part opened unbuffered


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


# Bytes between background fdatasyncs. benchmarks/download.py, 1 GiB on loopback, cost of
# durability (median of 5, durable minus not): +2.32 s with no background flush, +1.22 s every
# 256 MiB, +1.01 s every 64 MiB; at 100 MB/s, +0.10 s per 512 MiB.
FLUSH_EVERY = 64 * 1024 * 1024


@dataclass
class _State:
    offset: int
    hasher: HashPipe
    fetched: int = 0
    # Bytes of an earlier run that this one kept (the .part it started from); 0 once it had to
    # start again from byte 0. Right even when the .part was complete and no request was made.
    resumed_from: int = 0
    flusher: Flusher | None = None
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


@dataclass(eq=False)
class FileTransfer:
    """One file's download, run under its lock: use or resume what is on disk, fetch the rest
    (one stream, or segments over several connections), verify, rename."""

    remote: RemoteFile
    dest: Path
    _: KW_ONLY
    headers_for: HeadersFor
    sha256: str | None
    size: int | None
    expected_from: str
    source_label: str
    policy: RetryPolicy
    progress: ProgressSink
    disk_usage: Callable[[str], Any]
    durable: bool
    segments: SegmentPolicy
    owner: str | None = None  # another tool's folder holds dest: never resume into or move it
    part: Path = field(init=False)
    sidecar: Path = field(init=False)
    content: Content = field(init=False)
    started: float = field(init=False, default_factory=time.monotonic)
    resumed_from: int = field(init=False, default=0)  # bytes of an earlier run this one keeps
    connections: int = field(init=False, default=0)  # most connections used at once

    def __post_init__(self) -> None:
        self.part, self.sidecar = part_paths(self.dest)
        self.content = Content(self.remote.url, self.size, self.sha256, self.remote.revision)

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
        dest, sha, size = self.dest, self.sha256, self.size
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
            hasher=HashPipe(hasher),
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
                state.flusher = Flusher(handle.fileno())
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
        part, dest, sha, size = self.part, self.dest, self.sha256, self.size
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
