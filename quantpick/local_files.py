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


class NotARegularFile(OSError):
    """The path is a FIFO, a device, a socket or a directory: never read."""


class FileTooLarge(OSError):
    """A small file (pointer, settings, checksums) larger than its cap: never read whole."""


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, with its article: "a FIFO", "a device", ..."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def open_regular(path: Path | str, *, follow: bool = True) -> int:
    """A read-only descriptor of `path`, which must be a regular file (after symlinks; with
    `follow=False` a symlink at `path` is refused too: OSError ELOOP); the caller closes it.
    NotARegularFile (an OSError) otherwise, FileNotFoundError etc. as usual."""
    fd = os.open(path, _OPEN_FLAGS | (0 if follow else getattr(os, "O_NOFOLLOW", 0)))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFile(errno.EINVAL, f"{file_kind(mode)}, not a regular file", str(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a regular file: reads block normally (no EAGAIN)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small(path: Path | str, max_bytes: int, *, follow: bool = True) -> bytes:
    """The bytes of a small regular file, at most `max_bytes` of them (FileTooLarge beyond);
    `follow=False`: never through a symlink at `path` (open_regular)."""
    fd = open_regular(path, follow=follow)
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


def read_small_text(
    path: Path | str, max_bytes: int, *, errors: str = "strict", follow: bool = True
) -> str:
    """read_small, decoded as UTF-8 (UnicodeDecodeError with errors="strict")."""
    return read_small(path, max_bytes, follow=follow).decode("utf-8", errors=errors)
