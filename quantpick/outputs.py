"""Every file quantpick writes, and the one policy they all follow.

Files written for the user (`--script`, `--modelfile`, `--preset`, `--swap-config`, their
backups, the `serve` log) and quantpick's own (caches, sidecars, SHA256SUMS) go through here:

* Only a regular file is ever written over. A device, FIFO, socket or directory at the name is
  refused, even with --force (as root, replacing /dev/null with a regular file breaks the
  system); a symlink at the name is refused for a file the user named unless --force, and then
  the link itself is replaced, never its target (`check_output`).
* Nothing is opened through a symlink: new files are created O_CREAT|O_EXCL|O_NOFOLLOW beside the
  final name and renamed over it (a rename replaces a link, it never follows one); appends and
  logs are opened O_NOFOLLOW|O_NONBLOCK and checked on the descriptor (`open_log`).
* An existing file is read bounded: O_NONBLOCK|O_NOFOLLOW, regular files only, at most
  EXISTING_MAX_BYTES (quantpick.local_files), so a FIFO never hangs a run and a /dev/zero-like
  node is never read or copied.
* A file the user wrote is replaced only with --force (the caller says what "quantpick wrote it"
  means: a marker line in the file, or in the section it updates), and the previous version is
  kept as a backup that no later run overwrites: FILE.bak, then FILE.bak.1, FILE.bak.2, ...
  (created O_EXCL, never through a link).

Durability: a rename is atomic but not durable: after a power loss the directory may hold the new
name pointing at blocks that never reached the disk (ext4 data=ordered makes that unlikely but
XFS, btrfs and others do not promise it). So the data is fsync'ed before the rename and the
directory after it (the rename is a directory write). `benchmarks/download.py` measures what it
costs.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from quantpick.errors import ExitCode, QuantpickError, UsageError
from quantpick.local_files import FileTooLarge, file_kind, read_small

# Errors that mean "the disk is full", not "this path is wrong".
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# An existing output read back (to merge into, to back up): a preset section is ~1 KiB, a
# Modelfile or launch script a few KiB, so 16 MiB is far past any real one and keeps a hostile
# one (a link to /dev/zero is refused anyway) from filling memory or the disk as a backup.
EXISTING_MAX_BYTES = 16 * 1024 * 1024
# Backups FILE.bak, FILE.bak.1 ... FILE.bak.999: a run never overwrites one; past the last the
# write is refused (a thousand backups of one file means something else is wrong).
MAX_BACKUPS = 1000
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_BINARY = getattr(os, "O_BINARY", 0)


class LocalFileError(QuantpickError):
    """A file or directory quantpick must write cannot be: `<what>: <path>: <reason>` (exit 1)."""

    exit_code = ExitCode.ERROR


class DiskSpaceError(QuantpickError):
    """Not enough free space, before or during a write (exit 1: retrying will not help)."""

    exit_code = ExitCode.ERROR


class OutputRefused(UsageError):
    """A path given on the command line that quantpick will not write over (exit 2)."""


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


class NotReplaceable(OSError):
    """The final name holds a device, FIFO, socket or directory: never written over."""


def replaceable(path: Path) -> os.stat_result | None:
    """The lstat of `path` when a rename may put a new file there (nothing, a regular file, or a
    symlink, which the rename replaces without following); NotReplaceable otherwise."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
        raise NotReplaceable(
            errno.EEXIST, f"is {file_kind(info.st_mode)}, never written over", str(path)
        )
    return info


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_atomic(path: Path, data: bytes, *, durable: bool = True, mode: int | None = None) -> None:
    """Replace `path` by `data`: a temporary file beside it (its own unique name, created
    O_EXCL|O_NOFOLLOW with the usual 0666 & ~umask mode, or `mode`), fsync, rename, directory
    fsync. A device, FIFO, socket or directory at `path` is never replaced (NotReplaceable); a
    symlink there is replaced by the file, its target untouched. On any failure (a full disk
    included) the temporary file is removed and the OSError propagates; `path` is untouched."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY
    fd = os.open(tmp, flags, 0o666)
    try:
        _write_fd(fd, data)
        if mode is not None and hasattr(os, "fchmod"):
            os.fchmod(fd, mode)  # explicit: the umask does not decide (0755 for a script)
        if durable:
            os.fsync(fd)
        os.close(fd)
        fd = -1
        replaceable(path)  # checked again just before the rename
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def create_new(path: Path, data: bytes, *, mode: int = 0o666) -> bool:
    """Create `path` holding `data` unless something (anything, a dangling link included) is
    there already: O_CREAT|O_EXCL|O_NOFOLLOW. False when it existed."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY, mode)
    except FileExistsError:
        return False
    try:
        _write_fd(fd, data)
    finally:
        os.close(fd)
    return True


# ---- files the user named --------------------------------------------------------------------


@dataclass(frozen=True)
class Existing:
    """What is at an output's name before it is written."""

    data: bytes | None  # the regular file's bytes (read bounded), None: nothing or a link
    mode: int | None  # its permission bits (kept by the new version)
    link: bool = False  # a symlink is there (replaced only with force)


def check_output(path: Path, what: str, *, force: bool = False) -> Existing:
    """What is at `path`, when quantpick may write there; OutputRefused otherwise. `what` names
    it in the message (`--modelfile`). Refused always: a device, FIFO, socket or directory;
    without `force`: a symbolic link (with it, the link is replaced, never its target). A regular
    file is read (bounded, never through a link, never blocking): the caller judges whether
    quantpick wrote it."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return Existing(None, None)
    except OSError as exc:
        raise os_error(f"cannot write {what}", path, exc) from None
    if stat.S_ISLNK(info.st_mode):
        if force:
            return Existing(None, None, link=True)
        raise OutputRefused(
            f"{what} {path}: is a symbolic link; quantpick writes a regular file there only with "
            "--force (the link is replaced, its target left alone)",
            hint="pass --force, or give the path of the file itself",
        )
    if not stat.S_ISREG(info.st_mode):
        raise OutputRefused(
            f"{what} {path}: is {file_kind(info.st_mode)}, not a regular file: quantpick never "
            "writes over it",
            hint="give a file name",
        )
    try:
        data = read_small(path, EXISTING_MAX_BYTES, follow=False)
    except FileTooLarge:
        raise OutputRefused(
            f"{what} {path}: is larger than {EXISTING_MAX_BYTES} bytes, not a file quantpick "
            "wrote; it is left as it is",
            hint="choose another path",
        ) from None
    except OSError as exc:  # swapped for a link or a FIFO since the lstat, unreadable, ...
        raise os_error(f"cannot read {what}", path, exc) from None
    return Existing(data, info.st_mode & 0o777)  # never set-id bits onto a new file


class Authorship(Enum):
    """Who wrote a file, or the part of one (a preset section, a llama-swap entry), quantpick
    would replace."""

    QUANTPICK = "quantpick"  # its stamp, and unchanged since
    EDITED = "edited"  # its stamp, but edited since: the user's now
    USER = "user"  # no stamp: written by hand or by another tool


# The stamp quantpick puts in every file (or section, or entry) it may later replace:
# "<comment> written by quantpick 0.1.0, checksum 0123456789ab: replaced only while unchanged".
_STAMP = re.compile(r"written by quantpick \S+, checksum ([0-9a-f]{12})\b")


def checksum(lines: Iterable[str]) -> str:
    """12 hex digits of sha256 over the lines that are not the stamp, each stripped of the blanks
    around it, blank lines left out (a file re-indented or given other line endings is
    unchanged; any other edit is an edit)."""
    body = "\n".join(line.strip() for line in lines if line.strip() and not _STAMP.search(line))
    return hashlib.sha256(body.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def has_stamp(text: str | None) -> bool:
    """Whether quantpick has written into this text before (any of its stamps is there)."""
    return bool(text) and _STAMP.search(text or "") is not None


def stamp(comment: str, lines: Iterable[str]) -> str:
    """The stamp line for `lines` (what quantpick writes besides it), after `comment` ("#", ";")."""
    from quantpick import __version__

    return (
        f"{comment} written by quantpick {__version__}, checksum {checksum(lines)}: "
        "replaced only while unchanged"
    )


def authorship(lines: Sequence[str]) -> Authorship:
    """Whether `lines` (a whole file, or one section of one) are quantpick's, unchanged."""
    found = next((m for m in map(_STAMP.search, lines) if m), None)
    if found is None:
        return Authorship.USER
    return Authorship.QUANTPICK if found[1] == checksum(lines) else Authorship.EDITED


def refuse_theirs(what: str, found: Authorship, *, other: str = "another path") -> OutputRefused:
    """The refusal for a file (`what`: "--modelfile PATH", or a part of one: "--preset PATH:
    the section [x]") that quantpick did not write, or that was edited since."""
    why = (
        "was edited since quantpick wrote it"
        if found is Authorship.EDITED
        else "was not written by quantpick (no 'written by quantpick' line)"
    )
    return OutputRefused(
        f"{what} {why}; it is left as it is",
        hint=f"pass --force to replace it (the old file is kept as a backup), or choose {other}",
    )


def backup_path(path: Path) -> Path:
    """The first backup name not taken: FILE.bak, FILE.bak.1, ... (a link counts as taken)."""
    for n in range(MAX_BACKUPS):
        candidate = path.with_name(path.name + (".bak" if n == 0 else f".bak.{n}"))
        if not os.path.lexists(candidate):
            return candidate
    raise LocalFileError(
        f"{path}: {MAX_BACKUPS} backups exist already ({path.name}.bak ...); nothing written",
        hint="remove the old backups",
    )


def _write_backup(path: Path, existing: Existing) -> Path:
    assert existing.data is not None
    for _ in range(MAX_BACKUPS):  # another run may take the name first: then the next one
        backup = backup_path(path)
        # the file's own mode (through the umask): a private file keeps a private backup
        if create_new(backup, existing.data, mode=existing.mode or 0o600):
            return backup
    raise LocalFileError(f"{path}: no free backup name; nothing written")


@dataclass(frozen=True)
class Written:
    path: Path
    backup: Path | None  # the previous version, kept
    created: bool  # nothing was there before
    changed: bool = True  # False: the file already held exactly these bytes (nothing written)


def write_output(
    path: Path,
    data: bytes,
    existing: Existing,
    what: str,
    *,
    backup: bool = True,
    mode: int | None = None,
    durable: bool = True,
) -> Written:
    """Write `data` at `path` (after `check_output` said `existing`): the previous version first
    kept under a new backup name when `backup` and its bytes differ; the file then replaced
    atomically with the previous file's mode (or `mode`). Identical bytes: nothing is written."""
    if existing.data is not None and existing.data == data:
        return Written(path, None, False, changed=False)
    kept = None
    try:
        if backup and existing.data is not None:
            kept = _write_backup(path, existing)
        write_atomic(path, data, durable=durable, mode=mode or existing.mode)
    except NotReplaceable as exc:  # swapped for a FIFO or device since the check
        raise OutputRefused(f"{what} {path}: {exc.strerror}", hint="give a file name") from None
    except OSError as exc:
        raise os_error(
            f"cannot write {what}", path, exc, hint="choose a file you can write"
        ) from None
    return Written(path, kept, existing.data is None and not existing.link)


# ---- logs ------------------------------------------------------------------------------------


def open_log(path: Path, *, append: bool = False) -> int:
    """A write descriptor for a log at `path` (created 0644 & ~umask, truncated unless `append`),
    never through a symlink, never a FIFO (O_NONBLOCK: opening one cannot hang), a device or a
    file with other names (a hard link): LocalFileError (exit 1) naming what is there instead.
    Truncation happens after the check on the descriptor. The caller closes it."""
    flags = os.O_WRONLY | os.O_CREAT | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
    flags |= getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0) | _BINARY
    if append:
        flags |= os.O_APPEND
    hint = "remove it (quantpick writes its logs as regular files of their own)"
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LocalFileError(
                f"cannot write the log: {path}: is a symbolic link; a log is never written "
                "through one",
                hint=hint,
                path=str(path),
            ) from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads: O_NONBLOCK refuses at once
            raise LocalFileError(
                f"cannot write the log: {path}: is a FIFO, not a regular file",
                hint=hint,
                path=str(path),
            ) from None
        raise os_error("cannot write the log", path, exc) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            kind = file_kind(info.st_mode) if not stat.S_ISREG(info.st_mode) else "a hard link"
            raise LocalFileError(
                f"cannot write the log: {path}: is {kind}, not a regular file of its own",
                hint=hint,
                path=str(path),
            )
        os.set_blocking(fd, True)
        if not append:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd
