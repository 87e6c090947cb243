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
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import queue
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from quantpick.errors import DownloadError, ExitCode, QuantpickError, VerificationError
from quantpick.fetch.http import (
    HeadersFor,
    RestartTransfer,
    RetryPolicy,
    TransientError,
    open_url,
    parse_content_range,
    retry_after_seconds,
    status_error,
    url_label,
)
from quantpick.fetch.sources import RemoteFile
from quantpick.fetch.verify import hash_file

CHUNK = 1024 * 1024  # 1 MiB reads: the fastest read size measured for http.client + hashlib
SPACE_MARGIN = 128 * 1024 * 1024  # keep this much free beyond the bytes still to fetch
DEFAULT_LOCK_TIMEOUT = 10.0  # seconds a second run waits for the first one's lock
SIDECAR_VERSION = 1


class DiskSpaceError(QuantpickError):
    """Not enough free space, before or during a transfer (exit 1: retrying will not help)."""

    exit_code = ExitCode.ERROR


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


def _write_json_atomic(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document))
    os.replace(tmp, path)


def _lock_path(dest: Path, lock_dir: Path | None) -> Path:
    if lock_dir is None:
        return dest.with_name(dest.name + ".lock")
    key = hashlib.sha256(str(dest.resolve()).encode()).hexdigest()[:24]
    return lock_dir / f"{key}.lock"


def free_bytes(where: Path, disk_usage: Callable[[str], Any]) -> int:
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return int(disk_usage(str(probe)).free)


def _move_aside(path: Path, digest: str) -> Path:
    bad = path.with_name(f"{path.name.removesuffix('.part')}.bad-{digest[:12]}")
    os.replace(path, bad)
    return bad


def _open_part(path: Path) -> Any:
    """Unbuffered: every chunk goes straight to the kernel, so a SIGKILL loses nothing."""
    return open(path, "r+b", buffering=0)  # noqa: SIM115 - the caller's with-block closes it


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


@dataclass
class _State:
    offset: int
    hasher: _HashPipe
    fetched: int = 0
    first_request_offset: int | None = None


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
    lock_dir: Path | None = None,
) -> DownloadResult:
    """Fetch `remote` to `dest`, resuming a matching .part, verifying before the final rename.

    expected_sha256/size default to the RemoteFile's. With no sha256 at all the file is still
    written (the caller decided to allow it) and the result says verified=False.
    """
    from filelock import FileLock, Timeout

    policy = policy or RetryPolicy()
    progress = progress or NullProgress()
    sha = (expected_sha256 or remote.sha256 or "").lower() or None
    size = expected_size if expected_size is not None else remote.size
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock_file = _lock_path(dest, lock_dir)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_file), timeout=lock_timeout)
    try:
        lock.acquire()
    except Timeout:
        raise DownloadError(
            f"another quantpick process is downloading {dest} (waited {lock_timeout:g} s)",
            hint=f"let it finish and run the command again; if none is running, delete {lock_file}",
        ) from None
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
) -> DownloadResult:
    part, sidecar = part_paths(dest)
    wanted = _sidecar(remote.url, size, sha, remote.revision)

    if dest.exists():
        present = dest.stat().st_size
        if sha is not None and size is not None and present < size:
            # Truncated final file: it is a prefix as good as a .part; the hash check decides.
            progress.message(f"{dest.name}: {present} of {size} bytes present, resuming")
            _write_json_atomic(sidecar, wanted)
            os.replace(dest, part)
        else:
            progress.message(f"{dest.name}: already present, verifying")
            digest = hash_file(dest)
            if sha is None or (digest == sha and (size is None or present == size)):
                return DownloadResult(
                    remote.name, dest, present, digest, sha is not None, 0, 0, source_label, True
                )
            bad = _move_aside(dest, digest)
            progress.message(
                f"{dest.name}: present but its sha256 is {digest}, not {sha}: moved to "
                f"{bad.name}, fetching again"
            )

    if part.exists() and _sidecar_matches(sidecar, wanted):
        offset = part.stat().st_size
        if size is not None and offset > size:
            offset = 0
    else:
        offset = 0
    if offset == 0:
        _write_json_atomic(sidecar, wanted)
        part.write_bytes(b"")

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
        with open(part, "rb", buffering=0) as handle:
            buffer = bytearray(CHUNK)
            left = offset
            while left:
                n = handle.readinto(memoryview(buffer)[: min(CHUNK, left)])
                if not n:
                    break
                hasher.update(memoryview(buffer)[:n])
                left -= n
    state = _State(offset=offset, hasher=_HashPipe(hasher))
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
        )
    finally:
        state.hasher.close()


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
) -> DownloadResult:
    progress.file_started(dest.name, size, state.offset)

    failures = 0
    last_error = ""
    with _open_part(part) as handle:
        handle.seek(state.offset)
        while size is None or state.offset < size:
            before = state.offset
            try:
                finished = _transfer_once(
                    remote, handle, state, size, headers_for, policy, progress, dest.name
                )
                if finished:
                    break
                continue
            except RestartTransfer as exc:
                last_error = str(exc)
                progress.message(f"{dest.name}: {exc}; restarting from byte 0")
                handle.seek(0)
                handle.truncate(0)
                state.offset = 0
                state.hasher.reset()
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
    on_disk = part.stat().st_size
    if on_disk != got_size:  # the hash covers the stream; make sure the file is that stream
        raise DownloadError(f"{part} holds {on_disk} bytes, {got_size} were written")
    if (sha is not None and digest != sha) or (size is not None and got_size != size):
        sidecar.unlink(missing_ok=True)
        bad = _move_aside(part, digest)
        raise VerificationError(
            f"{remote.name}: downloaded sha256 {digest} ({got_size} bytes) does not match "
            f"{sha} ({size} bytes) expected from {expected_from}",
            hint=f"the bytes were kept as {bad} and not used; the source or the expected hash "
            "is wrong: report it, or try another --source",
        )
    os.replace(part, dest)
    sidecar.unlink(missing_ok=True)
    result = DownloadResult(
        remote.name,
        dest,
        got_size,
        digest,
        sha is not None,
        state.fetched,
        state.first_request_offset or 0,
        source_label,
        False,
    )
    progress.file_finished(dest.name, result)
    return result


def _transfer_once(
    remote: RemoteFile,
    handle: Any,
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
    if state.first_request_offset is None:
        state.first_request_offset = state.offset
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
                handle.seek(0)
                handle.truncate(0)
                state.offset = 0
                state.hasher.reset()
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
                handle.write(view[:n])
            except OSError as exc:
                state.hasher.give_back(buffer)
                if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    raise DiskSpaceError(
                        f"cannot write {label}: {exc.strerror} ({state.offset} bytes kept)",
                        hint="free some space and run the command again to resume",
                    ) from None
                raise
            state.hasher.feed(buffer, n)
            state.offset += n
            state.fetched += n
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
