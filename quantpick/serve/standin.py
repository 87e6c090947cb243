"""A sparse stand-in of a GGUF that is still on the hub, for llama.cpp's own dry run.

llama-fit-params loads a model without reading tensor data (no_alloc): it parses the header and
checks that every tensor lies inside the file (src/llama-model-loader.h llama_tensor_weight:
"data is not within the file bounds"). So a file made of the real header bytes at their offsets
and a hole up to the real size is, to it, the file: its projection of the stand-in is its
projection of the real file, for the user's own build and devices, before a byte of weights
moves (notes/llamacpp-memory.md, sparse files). Each shard of a split file gets its own stand-in,
under its own name (llama.cpp finds the other shards from the first one's name).

Stand-ins live in a temporary directory removed when the dry run ends, however it ends. One
named with the pid that made it (`quantpick-standin-<pid>-...`): a quantpick killed with SIGKILL
cannot remove its own, so each dry run first removes those whose pid no longer runs (or that are
older than STALE_S, whatever their pid). The parent (`<cache>/standins`) is used only when it is
a real directory of this user; a link there (a dangling one included), a file, or someone
else's directory is left alone and a fresh private directory in the system's temporary folder is
used instead. A file system without sparse files would write the whole size: that is refused
with NoSparseFiles (the caller then shows the estimate alone, with a note).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from quantpick.errors import QuantpickError
from quantpick.safe_names import name_problem


class NoSparseFiles(QuantpickError):
    """The file system would store the stand-in's hole as real blocks."""


# A hole counts as one when the file holds far fewer blocks than its size: the header itself
# and a file system's allocation granularity (up to a few MiB on some) are allowed for.
SPARSE_SLACK_BYTES = 16 * 1024 * 1024


# A dry run takes seconds (llama-fit-params' own timeout is minutes): a stand-in directory this
# old is left over whatever its pid says (the pid may have been reused).
STALE_S = 24 * 3600
_PREFIX = "quantpick-standin-"
_NAMED = re.compile(rf"^{_PREFIX}(\d+)-")


@contextmanager
def standins(shards: list[tuple[str, bytes, int]], *, parent: Path | None = None) -> Iterator[Path]:
    """Write each (name, header bytes, size) as a sparse file in a fresh temporary directory;
    yields the first shard's path and removes everything afterwards."""
    base = usable_parent(parent) if parent is not None else None
    if base is not None:
        remove_stale(base)
    directory = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base))
    try:
        paths = [_write(directory, name, data, size) for name, data, size in shards]
        yield paths[0]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def usable_parent(parent: Path) -> Path | None:
    """`parent`, created when missing, if it is a real directory (not a link) of this user;
    None otherwise (the caller then uses the system's temporary folder)."""
    try:
        parent.parent.mkdir(parents=True, exist_ok=True)
        parent.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        info = os.lstat(parent)
    except OSError:
        return None
    getuid = getattr(os, "getuid", None)
    if not stat.S_ISDIR(info.st_mode) or (getuid is not None and info.st_uid != getuid()):
        return None
    return parent


def _pid_running(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it runs, as someone else
    return True


def remove_stale(parent: Path, *, now: float | None = None) -> list[Path]:
    """Remove the stand-in directories in `parent` left by a quantpick that no longer runs
    (SIGKILL during a dry run), or older than STALE_S; the ones removed."""
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    for entry in entries:
        match = _NAMED.match(entry.name)
        if match is None:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            old = now - entry.stat(follow_symlinks=False).st_mtime > STALE_S
        except OSError:
            continue
        pid = int(match.group(1))
        if pid == os.getpid() and not old:
            continue
        if old or not _pid_running(pid):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def stored_bytes(fd: int) -> int | None:
    """Bytes the file system holds for the open file (None where it does not say: Windows)."""
    blocks = getattr(os.fstat(fd), "st_blocks", None)
    return None if blocks is None else blocks * 512


def _write(directory: Path, name: str, data: bytes, size: int) -> Path:
    if name_problem(name) is not None or size < len(data):
        raise QuantpickError(f"cannot stand in for {name!r}: {name_problem(name) or 'too short'}")
    # Keep the shard's own base name: llama.cpp derives the other shards' names from it.
    path = directory / Path(name).name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.ftruncate(fd, size)
        stored = stored_bytes(fd)
    finally:
        os.close(fd)
    if stored is not None and stored > len(data) + SPARSE_SLACK_BYTES:
        raise NoSparseFiles(
            f"{directory} is on a file system without sparse files: a stand-in of {name} would "
            f"take {size / 2**30:.1f} GiB of disk"
        )
    return path
