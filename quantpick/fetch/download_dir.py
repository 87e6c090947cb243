"""The download directory: created (or a precise reason why not) and its free space read, with
the margin a transfer keeps free beyond the bytes still to fetch."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantpick.fetch.atomic import (
    LocalFileError,
)
from quantpick.fetch.partfile import (
    os_step,
)

SPACE_MARGIN = 128 * 1024 * 1024  # keep this much free beyond the bytes still to fetch


def make_dir(directory: Path) -> None:
    """Create `directory` (and parents), or say precisely why it cannot be."""
    with os_step("cannot create the download directory", directory):
        directory.mkdir(parents=True, exist_ok=True)
    if not os.access(directory, os.W_OK | os.X_OK):
        read_only = _read_only(directory)
        raise LocalFileError(
            f"cannot write in the download directory: {directory}: "
            + ("Read-only file system" if read_only else "Permission denied"),
            hint="choose a directory you can write to (--dir)",
            path=str(directory),
            os_errno=errno.EROFS if read_only else errno.EACCES,
        )


def _read_only(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def existing_parent(where: Path) -> Path:
    """`where`, or its nearest ancestor that exists (what a not-yet-created directory is on)."""
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def free_bytes(where: Path, disk_usage: Callable[[str], Any]) -> int:
    probe = existing_parent(where)
    with os_step("cannot read the free space of", probe):
        return int(disk_usage(str(probe)).free)
