"""A sparse stand-in of a GGUF that is still on the hub, for llama.cpp's own dry run.

llama-fit-params loads a model without reading tensor data (no_alloc): it parses the header and
checks that every tensor lies inside the file (src/llama-model-loader.h llama_tensor_weight:
"data is not within the file bounds"). So a file made of the real header bytes at their offsets
and a hole up to the real size is, to it, the file: its projection of the stand-in is its
projection of the real file, for the user's own build and devices, before a byte of weights
moves (notes/llamacpp-memory.md, sparse files). Each shard of a split file gets its own stand-in,
under its own name (llama.cpp finds the other shards from the first one's name).

Stand-ins live in a temporary directory removed when the dry run ends, however it ends. A file
system without sparse files would write the whole size: that is refused with NoSparseFiles (the
caller then shows the estimate alone, with a note).
"""

from __future__ import annotations

import os
import shutil
import tempfile
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


@contextmanager
def standins(
    shards: list[tuple[str, bytes, int]], *, parent: Path | None = None
) -> Iterator[Path]:
    """Write each (name, header bytes, size) as a sparse file in a fresh temporary directory;
    yields the first shard's path and removes everything afterwards."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="quantpick-standin-", dir=parent))
    try:
        paths = [_write(directory, name, data, size) for name, data, size in shards]
        yield paths[0]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


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
