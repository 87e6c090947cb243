"""The single stream's helper threads: sha256 computed beside the socket reads and file writes
(`HashPipe`), and writeback started while the download goes on (`Flusher`), so neither costs
wall time at the end."""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from typing import Any

from quantpick.fetch.partfile import (
    CHUNK,
)


class HashPipe:
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


class WakeThread:
    """A daemon thread that waits to be poked (`poke`) and then does its work (`_loop`, in the
    subclass, which reads `_wake` and `_stopping`); `close` stops it after the work in hand. A
    subclass sets what its loop reads before calling this __init__, which starts the thread."""

    def __init__(self, name: str) -> None:
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name=name)
        self._thread.start()

    def _loop(self) -> None:
        raise NotImplementedError

    def poke(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()


class Flusher(WakeThread):
    """Writeback while the download goes on: every FLUSH_EVERY bytes written, fdatasync runs on a
    thread (it releases the GIL), so the fsync before the final rename waits for the tail only,
    not for the whole file. Without it the kernel starts writing back only past its dirty
    threshold (10 % of RAM by default), and on a fast link the whole file waits at the end."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._sync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
        super().__init__("quantpick-flush")

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                self._sync(self._fd)
            except OSError:
                pass  # the final fsync, on the main thread, reports any error
