"""Opening files that another program controls (LM Studio's pointer and settings, a Hugging Face
cache ref, a SHA256SUMS in a --dir, a store's GGUF, the config file): regular files only, and
small ones read with a cap.

Any of these paths can be a FIFO (open() blocks until a writer appears: every run hangs), a
symlink to /dev/zero or a tty (a whole-file read never ends, or eats memory), or be swapped
between a stat() and the open. So the file is opened with O_NONBLOCK (a FIFO opens at once
instead of waiting for a writer), checked with fstat() on the descriptor itself (what was opened
is what is judged) and refused unless it is a regular file; a small file is read to at most
`max_bytes + 1` bytes and refused when longer.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

# O_NOCTTY: a terminal device named by a hostile symlink never becomes our controlling tty.
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_BINARY", 0)
)


# The stat of the standard library as it was imported: answers.py wraps os.stat while it records a
# run, and a signature taken for it is not one of the run's inputs.
_stat = os.stat

Signature = list[int] | None  # [mode, inode, size, mtime_ns, ctime_ns]; None: absent


def stat_signature(path: Path | str) -> Signature:
    """What tells that a file changed without reading it: the stat fields a write, a replace or
    a removal changes (mode, inode, size, mtime, ctime: the fields git's index compares). An
    absent path is None; one that cannot be stat'ed (EACCES) is its own signature."""
    try:
        st = _stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return [-1, exc.errno or 0, 0, 0, 0]
    return [st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class NotARegularFile(OSError):
    """The path is a FIFO, a device, a socket or a directory: never read."""


class FileTooLarge(OSError):
    """A small file (pointer, settings, checksums) larger than its cap: never read whole."""


_FILE_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, with its article: "a FIFO", "a device", ..."""
    return next((what for test, what in _FILE_KINDS if test(mode)), "not a regular file")


class PipeTimeout(OSError):
    """A pipe (`--hardware <(...)`) that did not reach its end within its deadline."""


def open_regular(path: Path | str, *, follow: bool = True, allow_pipe: bool = False) -> int:
    """A read-only descriptor of `path`, which must be a regular file (after symlinks; with
    `follow=False` a symlink at `path` is refused too: OSError ELOOP); the caller closes it.
    NotARegularFile (an OSError) otherwise, FileNotFoundError etc. as usual.
    `allow_pipe`: a FIFO is accepted too, its descriptor left non-blocking (read_small)."""
    fd = os.open(path, _OPEN_FLAGS | (0 if follow else getattr(os, "O_NOFOLLOW", 0)))
    try:
        mode = os.fstat(fd).st_mode
        if allow_pipe and stat.S_ISFIFO(mode):
            return fd
        if not stat.S_ISREG(mode):
            raise NotARegularFile(errno.EINVAL, f"{file_kind(mode)}, not a regular file", str(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a regular file: reads block normally (no EAGAIN)
    except BaseException:
        os.close(fd)
        raise
    return fd


# How long a pipe given as a small file (`--hardware <(cat box.toml)`, a named FIFO) may take to
# deliver all of it: a shell's process substitution writes a few KB at once; a FIFO nobody writes
# to must not hang the command.
PIPE_TIMEOUT_S = 10.0


def read_small(
    path: Path | str,
    max_bytes: int,
    *,
    follow: bool = True,
    pipe_timeout_s: float | None = None,
) -> bytes:
    """The bytes of a small regular file, at most `max_bytes` of them (FileTooLarge beyond);
    `follow=False`: never through a symlink at `path` (open_regular). With `pipe_timeout_s`, a
    pipe (FIFO, `<(...)`) is read too, to its end, bounded by the same size and by that many
    seconds in all (PipeTimeout)."""
    fd = open_regular(path, follow=follow, allow_pipe=pipe_timeout_s is not None)
    if pipe_timeout_s is not None and stat.S_ISFIFO(os.fstat(fd).st_mode):
        try:
            return _read_pipe(fd, str(path), max_bytes, pipe_timeout_s)
        finally:
            os.close(fd)
    try:
        chunks: list[bytes] = []
        have = 0
        while have <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - have)
            if not chunk:
                break
            chunks.append(chunk)
            have += len(chunk)
    finally:
        os.close(fd)
    if have > max_bytes:
        raise FileTooLarge(errno.EINVAL, f"larger than {max_bytes} bytes", str(path))
    return b"".join(chunks)


def _read_pipe(fd: int, path: str, max_bytes: int, timeout_s: float) -> bytes:
    """A non-blocking pipe read to EOF, at most `max_bytes + 1` bytes and `timeout_s` seconds.
    Read only once poll(2) reports data or a hang-up: a FIFO no writer has opened yet reads as
    EOF but polls as nothing (Linux), so it is waited for, within the same deadline."""
    import select
    import time

    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    have = 0
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while have <= max_bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PipeTimeout(errno.ETIMEDOUT, f"no end of input within {timeout_s:g} s", path)
        if not poller.poll(max(1, int(left * 1000))):
            continue
        try:
            chunk = os.read(fd, max_bytes + 1 - have)
        except BlockingIOError:
            continue
        if not chunk:
            break  # every writer closed it: the end
        chunks.append(chunk)
        have += len(chunk)
    if have > max_bytes:
        raise FileTooLarge(errno.EINVAL, f"larger than {max_bytes} bytes", path)
    return b"".join(chunks)


def read_small_text(
    path: Path | str, max_bytes: int, *, errors: str = "strict", follow: bool = True
) -> str:
    """read_small, decoded as UTF-8 (UnicodeDecodeError with errors="strict")."""
    return read_small(path, max_bytes, follow=follow).decode("utf-8", errors=errors)
