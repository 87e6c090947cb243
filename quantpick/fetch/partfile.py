"""The `.part` a download writes into and its `.part.json` sidecar, shared by the single stream
(quantpick.fetch.transfer) and the segmented transfer (quantpick.fetch.segmented).

The sidecar says what the .part is a piece of (url, size, sha256, commit) and how it is laid out:
* STREAM: bytes [0, size of the .part) are the file's prefix (written in order, unbuffered).
* SEGMENTS: the .part has the final size (sparse) and `done` lists the byte ranges written. A
  range is listed only after an fdatasync of the data (quantpick.fetch.segmented), the sidecar
  carries a checksum of itself and is replaced atomically (write, fsync, rename, fsync of the
  directory). On resume each listed range is checked against the file: inside its size, and no
  hole (SEEK_HOLE), so a torn, stale or edited sidecar never makes unwritten bytes count as done.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from quantpick.errors import DownloadError
from quantpick.fetch.atomic import os_error, write_atomic
from quantpick.fetch.segments import RangeSet

CHUNK = 1024 * 1024  # 1 MiB reads: the fastest read size measured for http.client + hashlib
# 2: the layout, the written ranges and a checksum. 1 (no layout: a single stream) is still read.
SIDECAR_VERSION = 2


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
    try:
        found = json.loads(path.read_text())
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
        fd = os.open(part, os.O_RDONLY)
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
        size = part.stat().st_size
    except OSError:
        return 0
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
    try:
        theirs: tuple[int, int] | None = _identity(os.stat(part))
    except FileNotFoundError:
        theirs = None
    if theirs != ours:
        raise DownloadError(
            f"{part} was renamed or replaced by another process while this one was writing it; "
            f"stopped before {doing}, nothing was touched",
            hint="another program writes into this directory: let it finish, then run again",
        )
