"""The `.part` a download writes into and its `.part.json` sidecar, shared by the single stream
(quantpick.fetch.transfer) and the segmented transfer (quantpick.fetch.segmented).

The sidecar says what the .part is a piece of (url, size, sha256, commit) and how it is laid out:
* STREAM: bytes [0, size of the .part) are the file's prefix (written in order, unbuffered).
* SEGMENTS: the .part has the final size (sparse) and `done` lists the byte ranges written. A
  range is listed only after an fdatasync of the data (quantpick.fetch.segmented), the sidecar
  carries a checksum of itself and is replaced atomically (write, fsync, rename, fsync of the
  directory). On resume each listed range is checked against the file: inside its size, and no
  hole (SEEK_HOLE), so a torn, stale or edited sidecar never makes unwritten bytes count as done.

In a shared models folder (0777, or a 2775 group folder) another user can make `NAME.part` a
symlink to a file only root may write, a hard link to one, a FIFO, or a file of their own. So a
`.part` is written only when it is this user's own regular file with no other name
(`part_problem`): anything else is removed before the download starts, with one line saying what
it was (`claim_part`), or refused when it cannot be removed (a sticky folder). Every open of it
is O_NOFOLLOW and checked again on the descriptor (`open_part`; never O_TRUNC, which would act
before the check), and the identity checks compare the name itself (lstat), so a link swapped in
mid-transfer is never written through or renamed into the final name.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from quantpick.errors import DownloadError
from quantpick.fetch.atomic import LocalFileError, os_error, write_atomic
from quantpick.fetch.segments import RangeSet
from quantpick.local_files import file_kind, read_small_text

CHUNK = 1024 * 1024  # 1 MiB reads: the fastest read size measured for http.client + hashlib
# 2: the layout, the written ranges and a checksum. 1 (no layout: a single stream) is still read.
SIDECAR_VERSION = 2
# A sidecar lists merged ranges: a handful in practice (each connection writes its pieces in
# order), ~25 bytes each. 16 MiB (over 600,000 ranges) is more than any real one holds and keeps
# a hostile one (a link to /dev/zero) from filling memory; a larger one counts as torn.
SIDECAR_MAX_BYTES = 16 * 1024 * 1024


class PartLayout(Enum):
    STREAM = "stream"
    SEGMENTS = "segments"


def part_paths(dest: Path) -> tuple[Path, Path]:
    return dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.json")


@dataclass(frozen=True)
class Content:
    """What a .part holds pieces of. With a sha256 the bytes are identified by it (a resume may
    switch source, hub -> mirror); without one, url, size and commit must all match."""

    url: str
    size: int | None
    sha256: str | None
    commit: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "size": self.size, "sha256": self.sha256, "commit": self.commit}

    def same_as(self, other: Content) -> bool:
        if self.sha256:
            return other.sha256 == self.sha256 and other.size == self.size
        return (other.url, other.size, other.commit) == (self.url, self.size, self.commit)


@dataclass(frozen=True)
class Sidecar:
    content: Content
    layout: PartLayout
    done: RangeSet  # SEGMENTS: the ranges it lists (not yet checked against the file)


def _checksum(document: dict[str, Any]) -> str:
    body = {k: v for k, v in document.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


def sidecar_bytes(content: Content, layout: PartLayout, done: RangeSet | None = None) -> bytes:
    document: dict[str, Any] = {
        "version": SIDECAR_VERSION,
        **content.as_dict(),
        "layout": layout.value,
    }
    if layout is PartLayout.SEGMENTS:
        document["done"] = [[start, end] for start, end in done or RangeSet()]
    document["checksum"] = _checksum(document)
    return json.dumps(document).encode()


def write_sidecar(
    path: Path,
    content: Content,
    layout: PartLayout,
    done: RangeSet | None = None,
    *,
    durable: bool = True,
) -> None:
    with os_step("cannot write the download sidecar", path):
        write_atomic(path, sidecar_bytes(content, layout, done), durable=durable)


def read_sidecar(path: Path) -> Sidecar | None:
    """The sidecar, or None when it is missing, torn, edited or of an unknown version."""
    try:  # never through a link, never a FIFO or device, never more than the cap
        found = json.loads(read_small_text(path, SIDECAR_MAX_BYTES, follow=False))
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    size = found.get("size")
    content = Content(
        str(found.get("url")),
        size if type(size) is int else None,
        found.get("sha256") if isinstance(found.get("sha256"), str) else None,
        found.get("commit") if isinstance(found.get("commit"), str) else None,
    )
    if found.get("version") == 1:  # written before segmented transfers existed: a stream
        return Sidecar(content, PartLayout.STREAM, RangeSet())
    if found.get("version") != SIDECAR_VERSION or found.get("checksum") != _checksum(found):
        return None
    try:
        layout = PartLayout(found.get("layout"))
    except ValueError:
        return None
    done = RangeSet()
    if layout is PartLayout.SEGMENTS:
        ranges = found.get("done")
        if not isinstance(ranges, list):
            return None
        for item in ranges:
            if not (
                isinstance(item, list)
                and len(item) == 2
                and all(type(v) is int for v in item)
                and 0 <= item[0] < item[1]
            ):
                return None
            done.add(item[0], item[1])
    return Sidecar(content, layout, done)


def _data_until(fd: int, start: int, end: int) -> int:
    """How far from `start` (up to `end`) the file holds data without a hole. A range a sidecar
    lists but the file never received reads as a hole of the sparse .part; a file system that
    cannot tell (no SEEK_HOLE) reports none, and the final sha256 still decides."""
    try:
        return min(end, os.lseek(fd, start, os.SEEK_HOLE))
    except (OSError, AttributeError):
        return end


def written_ranges(part: Path, size: int, done: RangeSet) -> RangeSet:
    """The ranges of `done` that a SEGMENTS .part really holds: inside the final size and the
    file's current size, and with no hole."""
    out = RangeSet()
    try:
        fd = open_part(part, os.O_RDONLY)
    except OSError:
        return out
    try:
        on_disk = min(size, os.fstat(fd).st_size)
        for start, end in done:
            end = min(end, on_disk)
            if start < end:
                out.add(start, _data_until(fd, start, end))
    finally:
        os.close(fd)
    return out


def part_bytes(dest: Path) -> int:
    """Bytes of the file that the .part beside `dest` already holds (plans and dry runs)."""
    part, sidecar_path = part_paths(dest)
    try:
        info = os.lstat(part)
    except OSError:
        return 0
    if part_problem(info) is not None:
        return 0  # not one this user's download would resume
    size = info.st_size
    sidecar = read_sidecar(sidecar_path)
    if sidecar is not None and sidecar.layout is PartLayout.SEGMENTS:
        return min(size, sidecar.done.total)
    return size


@contextmanager
def os_step(what: str, path: Path | str, hint: str | None = None) -> Iterator[None]:
    """Turn an OSError inside the block into one line: `<what>: <path>: <reason>`."""
    try:
        yield
    except OSError as exc:
        raise os_error(what, path, exc, hint=hint) from None


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def check_still_ours(fd: int, part: Path, doing: str) -> None:
    """Refuse to go on when `part` is no longer the file this process has open: another process
    renamed it (to its final name, or aside) or replaced it. Writing, truncating or renaming
    through a stale handle is how a verified file at its final name gets damaged. Checked before
    every chunk written (a stat: ~2 us per MiB), every truncation and the final rename."""
    ours = _identity(os.fstat(fd))
    try:  # lstat: a symlink to this very file at the name is not this file
        theirs: tuple[int, int] | None = _identity(os.lstat(part))
    except FileNotFoundError:
        theirs = None
    if theirs != ours:
        raise DownloadError(
            f"{part} was renamed or replaced by another process while this one was writing it; "
            f"stopped before {doing}, nothing was touched",
            hint="another program writes into this directory: let it finish, then run again",
        )


class UnsafePart(OSError):
    """The entry at a `.part`'s name is not this user's own regular file with one name."""


def part_problem(info: os.stat_result) -> str | None:
    """Why the entry `info` (an lstat) is not a `.part` this process may write into, or None:
    it must be a regular file, owned by this user, with no other name (as root, a hard link to a
    root-only file is "owned by this user": only its link count gives it away)."""
    if not stat.S_ISREG(info.st_mode):
        return f"is {file_kind(info.st_mode)}"
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if uid is not None and info.st_uid != uid:
        return f"belongs to another user (uid {info.st_uid})"
    if info.st_nlink != 1:
        return f"has other names (a hard link, {info.st_nlink} names)"
    return None


# O_NONBLOCK: a FIFO opens at once (and is then refused) instead of waiting for a writer;
# O_NOCTTY: a terminal is never made our controlling tty. Never O_TRUNC: it would truncate a
# hard-linked stranger before the check below could refuse it.
_PART_FLAGS = (
    getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_BINARY", 0)
)


def open_part(part: Path, flags: int) -> int:
    """A descriptor of `part` (os.O_RDONLY / os.O_RDWR, maybe | os.O_CREAT), never through a
    symlink, and only when what was opened is this user's own regular file with one name
    (checked on the descriptor); UnsafePart (an OSError) otherwise. The caller closes it."""
    if flags & getattr(os, "O_TRUNC", 0):
        raise ValueError("open_part never truncates at open: ftruncate after the check")
    try:
        fd = os.open(part, flags | _PART_FLAGS, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise UnsafePart(
                errno.ELOOP, "is a symbolic link, not written through", str(part)
            ) from None
        raise
    try:
        problem = part_problem(os.fstat(fd))
        if problem is not None:
            raise UnsafePart(errno.EPERM, f"{problem}, not written through", str(part))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a regular file: writes and reads block normally
    except BaseException:
        os.close(fd)
        raise
    return fd


def claim_part(part: Path, say: Callable[[str], None]) -> None:
    """Leave at `part` nothing but this user's own regular `.part` (or nothing): an entry that is
    not one (`part_problem`) is removed, never opened, and `say` gets one line saying what it
    was. One that cannot be removed (another user's, in a sticky folder) is refused: one line,
    nothing written."""
    try:
        info = os.lstat(part)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise os_error("cannot read the partial download", part, exc) from None
    problem = part_problem(info)
    if problem is None:
        return
    try:
        os.unlink(part)  # removes the entry itself: a link's target is never touched
    except OSError as exc:
        raise LocalFileError(
            f"{part} {problem} and cannot be removed ({exc.strerror or exc}); quantpick never "
            "writes through it",
            hint="remove it (another user or program made it), or choose another --dir",
            path=str(part),
            os_errno=exc.errno,
        ) from None
    say(f"{part.name} {problem}: removed, not written through; starting a fresh one")
