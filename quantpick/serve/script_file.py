"""A launch script on disk: written atomically, mode 0755, and only over a file quantpick wrote
itself (its marker line), never a device, FIFO or directory."""

from __future__ import annotations

import os
from pathlib import Path

from quantpick.errors import QuantpickError, UsageError

# The marker line of every file quantpick renders (script, systemd unit, compose file): a file
# holding it in its first bytes is one quantpick wrote, and may replace.
WRITTEN_BY = "# Written by quantpick."


_MARKER_SCAN_BYTES = 4096


def _file_kind(mode: int) -> str:
    import stat

    for test, kind in ((stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket")):  # fmt: skip
        if test(mode):
            return kind
    return "special file"


def written_by_quantpick(path: Path) -> bool:
    """Whether `path` is a regular file whose first bytes hold quantpick's marker line (opened
    without following a link and without blocking, so a FIFO cannot hang the check)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return WRITTEN_BY.encode() in os.read(fd, _MARKER_SCAN_BYTES)
    except OSError:
        return False
    finally:
        os.close(fd)


def check_script_target(path: Path, *, force: bool = False) -> None:
    """Raise UsageError unless `path` may be written: absent, a regular file quantpick wrote (its
    marker line), or, with `force`, any regular file or a symbolic link (the link is replaced,
    never its target). A device, FIFO, socket or directory is never written over, even with
    `force` (as root, writing over /dev/null would turn it into a regular file)."""
    import stat

    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise QuantpickError(
            f"cannot write the launch script: {path}: {exc.strerror or exc}"
        ) from None
    if stat.S_ISLNK(info.st_mode):
        if force:
            return
        raise UsageError(
            f"--script {path}: is a symbolic link; quantpick writes a regular file there only "
            "with --force (the link is replaced, its target left alone)",
            hint="pass --force, or give the path of the file itself",
        )
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(
            f"--script {path}: is a {_file_kind(info.st_mode)}, not a regular file: quantpick "
            "never writes over it",
            hint="give a file name for the script",
        )
    if not force and not written_by_quantpick(path):
        raise UsageError(
            f"--script {path}: exists and was not written by quantpick (no {WRITTEN_BY!r} line "
            "at its start); it is left as it is",
            hint="pass --force to replace it, or choose another path",
        )


def write_script(path: Path, text: str, *, force: bool = False) -> None:
    """Write `text` to `path` atomically with mode 0755 (temp file in the same dir + os.replace),
    only where `check_script_target` allows (checked again here, just before the write)."""
    import tempfile  # only when writing: `pick` imports this module for its flags

    check_script_target(path, force=force)

    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # a read-only or missing directory: one line naming the path
        raise QuantpickError(
            f"cannot write the launch script: {path}: {exc.strerror or exc}",
            hint="choose a --script path in a directory you can write to",
            path=str(path),
            os_errno=exc.errno,
        ) from None
    try:
        # surrogateescape: a path that is not UTF-8 (a model directory named in Latin-1) reaches
        # the script as the bytes it is on disk, which bash then opens as they are.
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
            # Explicit mode: mkstemp creates 0600 and the umask must not decide executability.
            os.fchmod(f.fileno(), 0o755)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise QuantpickError(
                f"cannot write the launch script: {path}: {exc.strerror or exc}",
                path=str(path),
                os_errno=exc.errno,
            ) from None
        raise
