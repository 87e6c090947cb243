"""One process per file: `<name>.lock` beside the data (flock through `filelock`), shared by
every user who may write the directory. A second process waits as long as the holder makes
progress (its .part changes), and gives up only when the holder is stuck."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantpick.errors import DownloadError
from quantpick.fetch.atomic import (
    os_error,
)
from quantpick.fetch.partfile import (
    part_paths,
)
from quantpick.fetch.progress import NullProgress, ProgressSink

# How long a second process waits while the lock holder makes no visible progress (its .part
# neither grows nor changes, no final file appears) before it gives up. A live holder can be quiet
# for a while without being stuck: a 300 s Retry-After (RetryPolicy.max_retry_after) plus its
# backoff, or hashing a 20 GB file on a 150 MB/s disk (~130 s). 600 s covers both.
DEFAULT_LOCK_TIMEOUT = 600.0
LOCK_POLL_SECONDS = 1.0  # how often a waiter retries the lock and looks at the holder's progress


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


def progress_mark(dest: Path, part: Path) -> tuple[Any, ...]:
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
    mark = progress_mark(dest, part)
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
        now = progress_mark(dest, part)
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
