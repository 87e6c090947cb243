"""One file over several HTTP connections: ranged GETs against the URL the hub redirects to.

Threads and stdlib http.client, like the single stream (quantpick.hub.http says why not httpx:
~3x the CPU per byte on loopback). The parts:
* workers (one thread and one keep-alive connection each) take pieces from the Scheduler
  (quantpick.fetch.segments), write them with pwrite into the .part (already of the final size)
  and retry or resume their own piece after an error;
* the prefix hasher (a thread) reads the bytes back in file order as the written prefix grows,
  through the page cache, so the sha256 is done about when the last piece lands;
* checkpoints (a thread): fdatasync of the data, then the sidecar listing the written ranges,
  replaced atomically (quantpick.fetch.partfile); a SIGKILL loses at most the last second;
* the conductor (the caller's thread): progress, per-connection rates, the connection count
  (Concurrency), and the end: finished, failed, or "ranges do not work here, go on as one stream".

Faults: a 403/410 from the CDN URL means it expired: the next request goes through the hub again
(a fresh redirect). 429/503 mean "too many": one connection fewer, and that becomes the ceiling.
A server that ignores Range, or answers a range with the wrong bytes, 416 included, ends the
segmented transfer: the caller goes on as one stream from the contiguous prefix.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from quantpick.errors import DownloadError
from quantpick.fetch.atomic import NO_SPACE_ERRNOS, DiskSpaceError, os_error
from quantpick.fetch.partfile import (
    CHUNK,
    Content,
    PartLayout,
    check_still_ours,
    write_sidecar,
)
from quantpick.fetch.segments import Concurrency, RangeSet, Scheduler, Segment, SegmentPolicy
from quantpick.fetch.write_behind import WakeThread
from quantpick.hub.http import (
    HeadersFor,
    KeepAlive,
    RetryPolicy,
    TransientError,
    parse_content_range,
    retry_after_seconds,
    status_error,
    url_label,
)

TICK_SECONDS = 0.1  # how often the conductor updates progress, rates and the connection count
# A checkpoint starts at least this often, so a SIGKILL loses about a second of transfer at
# most (this interval plus the fdatasync before the ranges are recorded); each one is that
# fdatasync plus a small atomic write (a few ms on this machine's virtual disk).
CHECKPOINT_SECONDS = 0.5
# ...and after this many new bytes, so writeback keeps up with a fast link and the fsync before
# the final rename waits for the tail only (the single stream's FLUSH_EVERY, measured there).
CHECKPOINT_BYTES = 64 * 1024 * 1024
RATE_SECONDS = 1.0  # a connection's rate is measured over its last second


class _Progress(Protocol):
    def message(self, text: str) -> None: ...
    def advance(self, name: str, n_bytes: int) -> None: ...


@dataclass(frozen=True)
class SegmentedJob:
    """One file for the segmented transfer (built by quantpick.fetch.transfer)."""

    name: str
    url: str  # the hub (or mirror) URL; its redirect names the CDN URL the pieces come from
    size: int
    part: Path
    sidecar: Path
    content: Content
    headers_for: HeadersFor
    policy: RetryPolicy
    segments: SegmentPolicy
    progress: _Progress
    durable: bool


@dataclass(frozen=True)
class Finished:
    digest: str
    fetched: int  # bytes transferred by this run
    connections: int  # most connections at once


@dataclass(frozen=True)
class FallBack:
    """Ranges cannot be used with this server: go on as one stream from `offset` (the written
    prefix, whose sha256 so far is `hasher`)."""

    offset: int
    hasher: Any
    written: int  # bytes the .part held when the transfer stopped (past the prefix included)
    fetched: int
    connections: int
    reason: str


class _Stop(Exception):
    """This run is ending (finished, failed or falling back): a worker leaves quietly."""


class _Busy(TransientError):
    """429/503: the server wants fewer connections."""


class _CdnRejected(Exception):
    """403/410 from the CDN URL (a signed URL that expired): resolve it through the hub again."""


class _RangesUnusable(Exception):
    """The server ignores Range or answers with other bytes than asked."""


def _pwrite(fd: int, data: memoryview, offset: int) -> None:
    """Write every byte at `offset`: a write may take fewer than asked (a disk filling up)."""
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _read_at(fd: int, into: memoryview, offset: int) -> int:
    """pread into a reused buffer (preadv; macOS has only pread, which allocates)."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [into], offset)
    data = os.pread(fd, len(into), offset)
    into[: len(data)] = data
    return len(data)


def available() -> bool:
    """Whether this platform has positioned writes (Windows has no os.pwrite: one stream)."""
    return hasattr(os, "pwrite") and hasattr(os, "pread")


# ---------------------------------------------------------------------------------------------


class _PrefixHasher:
    """sha256 of the .part in file order, read back through the page cache as the prefix of
    written bytes grows. Pieces go out in order, so this trails the writers by about a window of
    pieces, and the bytes it reads were written moments ago (still in the page cache)."""

    def __init__(self, fd: int, available: int) -> None:
        self._fd = fd
        self._hasher = hashlib.sha256()
        self._hashed = 0
        self._available = available
        self._stopping = False
        self._error: OSError | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True, name="quantpick-sha256")
        self._thread.start()

    def advance(self, prefix_end: int) -> None:
        with self._cond:
            if prefix_end > self._available:
                self._available = prefix_end
                self._cond.notify_all()

    def _run(self) -> None:
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        while True:
            with self._cond:
                while self._hashed >= self._available and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                at, upto = self._hashed, self._available
            try:
                while at < upto:
                    n = _read_at(self._fd, view[: min(CHUNK, upto - at)], at)
                    if n <= 0:
                        raise OSError(5, f"the .part ended at byte {at}, {upto} were written")
                    self._hasher.update(view[:n])
                    at += n
                    with self._cond:
                        self._hashed = at
                        self._cond.notify_all()
            except OSError as exc:
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return

    def result(self, upto: int) -> Any:
        """The sha256 object over bytes [0, upto), once they are hashed; the thread ends."""
        with self._cond:
            while self._hashed < upto and self._error is None:
                self._cond.wait()
            error = self._error
        self.close()
        if error is not None:
            raise error
        return self._hasher

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()


# ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Worker:
    index: int
    conn: KeepAlive
    buffer: bytearray = field(default_factory=lambda: bytearray(CHUNK))
    thread: threading.Thread | None = None
    written: int = 0  # bytes this connection wrote
    moving: bool = False  # it has written a byte (counts for the controller's windows)
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    rate: float = 0.0  # bytes/s over its last RATE_SECONDS (0: not known yet)


class _Run:
    """The shared state of one segmented transfer; `lock` guards everything mutable."""

    def __init__(self, job: SegmentedJob, fd: int, done: RangeSet) -> None:
        self.job = job
        self.fd = fd
        self.lock = threading.Lock()
        self.wake = threading.Event()  # the conductor looks now (finished, failed, fell back)
        self.stopping = threading.Event()
        self.scheduler = Scheduler(job.size, job.segments, done.copy())
        self.concurrency = Concurrency(job.segments)
        self.hasher = _PrefixHasher(fd, done.prefix_end())
        self.url = job.url  # where the next piece is asked for: the hub, then the CDN URL
        self.ranges_confirmed = False
        self.workers: list[_Worker] = []
        self.next_index = 0
        self.most_connections = 0
        self.fetched = 0
        self.error: BaseException | None = None
        self.fallback: str | None = None
        self.notes: list[str] = []
        self._saved: RangeSet | None = done.copy()
        self._saved_at_bytes = 0
        self._save_lock = threading.Lock()

    # -- called by workers (each takes the lock itself) -------------------------------------

    def take(self, worker: _Worker) -> Segment | None:
        with self.lock:
            if self.stopping.is_set() or len(self.workers) > self.concurrency.target:
                return None  # finished, or one connection too many: this one goes
            rates = {w.index: w.rate for w in self.workers}
            return self.scheduler.take(worker.index, rates, self.concurrency.target)

    def claim(self, seg: Segment, n: int) -> int:
        with self.lock:
            return self.scheduler.claim(seg, n)

    def commit(self, worker: _Worker, seg: Segment, n: int) -> None:
        with self.lock:
            self.scheduler.commit(seg)
            worker.written += n
            worker.moving = True
            self.fetched += n
            prefix = self.scheduler.done.prefix_end()
            finished = self.scheduler.finished
        self.hasher.advance(prefix)
        if finished:
            self.wake.set()

    def failed(self, seg: Segment) -> int:
        with self.lock:
            seg.failures += 1
            return seg.failures

    def release(self, seg: Segment) -> None:
        with self.lock:
            self.scheduler.release(seg)

    def busy(self, worker: _Worker) -> bool:
        """A 429/503 on `worker`'s connection; True when that connection should go."""
        with self.lock:
            running = len(self.workers)
            target = self.concurrency.busy(running)
            self.notes.append(
                f"{self.job.name}: the server is busy; down to {target} connection(s)"
            )
            return running > target

    def resolved(self, final_url: str) -> None:
        """A piece asked through the hub came back as asked: its final URL serves the rest."""
        with self.lock:
            self.url = final_url
            if not self.ranges_confirmed:
                self.ranges_confirmed = True
                self.concurrency.start()
                self.wake.set()  # the conductor opens the other connections now

    def cdn_rejected(self, url: str) -> None:
        with self.lock:
            if self.url == url:
                self.url = self.job.url
                self.notes.append(
                    f"{self.job.name}: {url_label(url)} is no longer valid; asking the hub again"
                )

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if self.error is None and not self.stopping.is_set():
                self.error = exc
        self.wake.set()

    def fall_back(self, reason: str) -> None:
        with self.lock:
            if self.fallback is None:
                self.fallback = reason
        self.wake.set()

    def note(self, text: str) -> None:
        with self.lock:
            self.notes.append(text)

    def sleep(self, seconds: float) -> None:
        """The policy's sleep; the real one is cut short when the run stops."""
        if self.job.policy.sleep is time.sleep:
            self.stopping.wait(seconds)
        else:
            self.job.policy.sleep(seconds)

    def exited(self, worker: _Worker) -> None:
        with self.lock:
            if worker in self.workers:
                self.workers.remove(worker)
        self.wake.set()

    # -- checkpoints -------------------------------------------------------------------------

    def save(self) -> None:
        """fdatasync, then record what is written: a range is listed only once it is on disk."""
        with self._save_lock:
            with self.lock:
                snapshot = self.scheduler.done.copy()
                self._saved_at_bytes = self.fetched
            if snapshot == self._saved:
                return
            check_still_ours(self.fd, self.job.part, "recording what it holds")
            if self.job.durable:
                getattr(os, "fdatasync", os.fsync)(self.fd)  # macOS has no fdatasync
            write_sidecar(
                self.job.sidecar,
                self.job.content,
                PartLayout.SEGMENTS,
                snapshot,
                durable=self.job.durable,
            )
            self._saved = snapshot

    def save_due(self) -> bool:
        with self.lock:
            return self.fetched - self._saved_at_bytes >= CHECKPOINT_BYTES


class _Checkpoints(WakeThread):
    """Starts a save every CHECKPOINT_SECONDS, or sooner when poked (CHECKPOINT_BYTES written)."""

    def __init__(self, run: _Run) -> None:
        self._run = run
        super().__init__("quantpick-ckpt")

    def _loop(self) -> None:
        started = time.monotonic()
        while True:
            self._wake.wait(max(0.0, started + CHECKPOINT_SECONDS - time.monotonic()))
            self._wake.clear()
            if self._stopping:
                return
            started = time.monotonic()
            try:
                self._run.save()
            except BaseException as exc:  # noqa: BLE001 - re-raised by the conductor
                self._run.fail(exc)
                return


# ---------------------------------------------------------------------------------------------


def _work(run: _Run, worker: _Worker) -> None:
    """A worker thread: pieces until there is nothing left it can help with."""
    try:
        while True:
            seg = run.take(worker)
            if seg is None:
                return
            _work_on(run, worker, seg)
    except _Stop:
        pass
    except _RangesUnusable as exc:
        run.fall_back(str(exc))
    except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
        if not run.stopping.is_set():
            run.fail(exc)
    finally:
        worker.conn.close()
        run.exited(worker)


def _work_on(run: _Run, worker: _Worker, seg: Segment) -> None:
    """Fetch `seg` to its end (which a split may move), retrying it on its own."""
    policy = run.job.policy
    while not seg.done:
        if run.stopping.is_set():
            raise _Stop
        url = run.url
        try:
            _fetch(run, worker, seg, url)
        except _CdnRejected:
            run.cdn_rejected(url)  # the next attempt goes through the hub: a 403 there is final
        except TransientError as exc:
            if run.stopping.is_set():
                raise _Stop from None
            failures = run.failed(seg)
            if failures >= policy.attempts:
                kept = run.scheduler.done.total
                raise DownloadError(
                    f"{run.job.name}: {exc} (gave up after {failures} attempts)",
                    hint=f"run the command again to resume; {kept} bytes are kept in "
                    f"{run.job.part.name}",
                ) from None
            if isinstance(exc, _Busy) and run.busy(worker):
                run.release(seg)  # one connection fewer: this one's piece goes back
                return
            delay = policy.backoff(failures)
            if exc.retry_after is not None:
                delay = max(delay, min(exc.retry_after, policy.max_retry_after))
            run.note(f"{run.job.name}: {exc}; retrying in {delay:.1f} s")
            run.sleep(delay)


def _fetch(run: _Run, worker: _Worker, seg: Segment, url: str) -> None:
    """One ranged GET for [seg.cursor, seg.end), written as it arrives."""
    job = run.job
    start, end = seg.cursor, seg.end
    via_hub = url == job.url
    extra = {"Accept-Encoding": "identity", "Range": f"bytes={start}-{end - 1}"}
    # Credentials only ever go to the hub (the CDN URL is signed; the hub's token stays home).
    response, final = worker.conn.get(url, job.headers_for, extra, credentials_for=job.url)
    read_to_end = False
    try:
        status = response.status
        where = url_label(final)
        if status in (403, 410) and not via_hub:
            raise _CdnRejected(f"HTTP {status} from {where}")
        if status in (429, 503):
            retry_after = retry_after_seconds(response.getheader("Retry-After"))
            raise _Busy(f"HTTP {status} from {where}", retry_after)
        if status >= 500:
            raise TransientError(f"HTTP {status} from {where}")
        if status == 416:
            raise _RangesUnusable(f"the server refused the range bytes={start}-{end - 1} (416)")
        if status not in (200, 206):
            raise status_error(status, final, job.name, response)
        content_range = response.getheader("Content-Range")
        if content_range is None:
            raise _RangesUnusable(f"the server ignored Range (HTTP {status} with the whole file)")
        if parse_content_range(content_range) != (start, end - 1, job.size):
            raise _RangesUnusable(
                f"the server answered bytes={start}-{end - 1} with HTTP {status} "
                f"Content-Range {content_range!r}"
            )
        if response.length is not None and response.length != end - start:
            raise TransientError(
                f"Content-Length {response.length} from {where}, {end - start} bytes expected"
            )
        if via_hub:
            run.resolved(final)
        read_to_end = _read_body(run, worker, seg, response, end, where)
    finally:
        if not read_to_end:
            worker.conn.close()  # unread bytes on it: it cannot carry the next request


def _read_body(
    run: _Run,
    worker: _Worker,
    seg: Segment,
    response: http.client.HTTPResponse,
    requested_end: int,
    where: str,
) -> bool:
    """Write the answer at seg.cursor until seg.end; True when the answer was read to its end."""
    job = run.job
    view = memoryview(worker.buffer)
    while seg.cursor < seg.end:
        if run.stopping.is_set():
            raise _Stop
        want = min(CHUNK, seg.end - seg.cursor)
        try:
            n = response.readinto(view[:want])
        except (OSError, http.client.HTTPException) as exc:
            if run.stopping.is_set():
                raise _Stop from None
            raise TransientError(f"{type(exc).__name__} at byte {seg.cursor} ({where})") from None
        if not n:
            raise TransientError(f"connection closed at byte {seg.cursor} of {requested_end}")
        keep = run.claim(seg, n)  # a split may have moved the end below what was read
        if not keep:
            break
        check_still_ours(run.fd, job.part, "writing more into it")
        offset = seg.cursor
        try:
            _pwrite(run.fd, view[:keep], offset)
        except OSError as exc:
            kept = run.scheduler.done.total
            if exc.errno in NO_SPACE_ERRNOS:
                raise DiskSpaceError(
                    f"cannot write {job.part}: {exc.strerror} ({kept} bytes kept)",
                    hint="free some space and run the command again to resume",
                ) from None
            raise os_error(
                "cannot write the partial download",
                job.part,
                exc,
                hint=f"{kept} bytes are kept; run the command again to resume",
            ) from None
        run.commit(worker, seg, keep)
        if keep < n:
            break
    return seg.cursor == requested_end


# ---------------------------------------------------------------------------------------------


def fetch_segmented(job: SegmentedJob, fd: int, done: RangeSet) -> Finished | FallBack:
    """Fill the .part open as `fd` (already of the final size; `done` is what it holds) over
    several connections. Returns Finished (with the sha256 of the whole file) or FallBack; any
    error is raised here, after every worker stopped and the written ranges were recorded."""
    run = _Run(job, fd, done)
    checkpoints = _Checkpoints(run)
    try:
        outcome = _conduct(run, checkpoints)
    except BaseException:
        _stop(run)
        checkpoints.close()
        try:
            run.save()  # what was written stays written for the next run
        except Exception:  # noqa: BLE001, S110 - the error being raised matters more
            pass
        run.hasher.close()
        raise
    checkpoints.close()
    return outcome


def _spawn(run: _Run) -> None:
    with run.lock:
        worker = _Worker(run.next_index, KeepAlive(run.job.policy))
        run.next_index += 1
        run.workers.append(worker)
        run.most_connections = max(run.most_connections, len(run.workers))
    worker.thread = threading.Thread(
        target=_work, args=(run, worker), daemon=True, name=f"quantpick-seg-{worker.index}"
    )
    worker.thread.start()


def _stop(run: _Run) -> None:
    """Every worker out, none left writing (the caller closes the file next)."""
    run.stopping.set()
    with run.lock:
        workers = list(run.workers)
    for worker in workers:
        worker.conn.abort()
    for worker in workers:
        if worker.thread is not None:
            worker.thread.join()


def _has_work(run: _Run) -> bool:
    sched = run.scheduler
    return bool(sched.pending) or any(
        s.end - s.claimed >= 2 * sched.policy.min_split for s in sched.segments
    )


def _conduct(run: _Run, checkpoints: _Checkpoints) -> Finished | FallBack:
    job = run.job
    reported = 0
    shown_connections = 0
    show_connections = getattr(job.progress, "connections", None)
    if not run.scheduler.finished:
        _spawn(run)  # the first piece goes through the hub: it tells whether ranges work
    while True:
        run.wake.wait(TICK_SECONDS)
        run.wake.clear()
        now = time.monotonic()
        with run.lock:
            notes, run.notes = run.notes, []
            fetched, error, fallback = run.fetched, run.error, run.fallback
            finished = run.scheduler.finished
            running = sum(1 for w in run.workers if w.moving)
            alive = len(run.workers)
            for w in run.workers:
                w.samples.append((now, w.written))
                while len(w.samples) > 2 and now - w.samples[1][0] >= RATE_SECONDS:
                    w.samples.popleft()
                (t0, b0), (t1, b1) = w.samples[0], w.samples[-1]
                w.rate = (b1 - b0) / (t1 - t0) if t1 - t0 >= RATE_SECONDS / 2 else 0.0
            rates = sorted(w.rate for w in run.workers if w.rate > 0)
            if rates:
                run.scheduler.set_rate(rates[len(rates) // 2])
            target = (
                run.concurrency.observe(now, fetched, running)
                if run.ranges_confirmed
                else run.concurrency.target
            )
        for text in notes:
            job.progress.message(text)
        if fetched > reported:
            job.progress.advance(job.name, fetched - reported)
            reported = fetched
        if show_connections is not None and alive and alive != shown_connections:
            show_connections(job.name, alive)
            shown_connections = alive
        if error is not None:
            raise error
        if fallback is not None:
            _stop(run)
            prefix = run.scheduler.done.prefix_end()
            hasher = run.hasher.result(prefix)
            written = run.scheduler.done.total
            return FallBack(prefix, hasher, written, run.fetched, run.most_connections, fallback)
        if finished:
            _stop(run)
            digest = run.hasher.result(job.size).hexdigest()
            return Finished(digest, run.fetched, run.most_connections)
        if run.save_due():
            checkpoints.poke()
        if run.ranges_confirmed or alive == 0:
            with run.lock:
                room = max(1 if alive == 0 else 0, target - alive)
                wanted = room if _has_work(run) else 0
            for _ in range(wanted):
                _spawn(run)
