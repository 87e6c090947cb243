"""Durable, atomic small-file writes and the OS-error messages of the fetch stage.

A rename is atomic but not durable: after a power loss the directory may hold the new name
pointing at blocks that never reached the disk (ext4 data=ordered makes that unlikely but XFS,
btrfs and others do not promise it). So the data is fsync'ed before the rename and the directory
after it (the rename is a directory write). `benchmarks/download.py` measures what it costs.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from quantpick.errors import ExitCode, QuantpickError

# Errors that mean "the disk is full", not "this path is wrong".
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class LocalFileError(QuantpickError):
    """A file or directory quantpick must write cannot be: `<what>: <path>: <reason>` (exit 1)."""

    exit_code = ExitCode.ERROR


class DiskSpaceError(QuantpickError):
    """Not enough free space, before or during a write (exit 1: retrying will not help)."""

    exit_code = ExitCode.ERROR


def os_error(
    what: str, path: Path | str, exc: OSError, *, hint: str | None = None
) -> QuantpickError:
    """The one-line error for an OSError met while doing `what` on `path`."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno in NO_SPACE_ERRNOS:
        return DiskSpaceError(
            f"{what}: {path}: {reason}", hint=hint or "free some space and run the command again"
        )
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and hint is None:
        hint = "choose a directory you can write to (--dir)"
    return LocalFileError(
        f"{what}: {path}: {reason}", hint=hint, path=str(path), os_errno=exc.errno
    )


def fsync_dir(directory: Path) -> None:
    """Make the names in `directory` durable (after a create or rename in it).

    POSIX only: Windows cannot open a directory, and its renames are journalled by NTFS. File
    systems that cannot fsync a directory (EINVAL on some FUSE and network mounts) are skipped:
    there is nothing more to do on them.
    """
    if os.name == "nt":  # pragma: no cover - POSIX CI
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace `path` by `data`: a temporary file beside it (its own unique name, created with
    the usual 0666 & ~umask mode), fsync, rename, directory fsync. On any failure (a full disk
    included) the temporary file is removed and the OSError propagates; `path` is untouched."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if durable:
            os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
