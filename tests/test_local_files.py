"""quantpick.local_files: another program's small files are read only when regular, and capped."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from quantpick.local_files import FileTooLarge, NotARegularFile, open_regular, read_small


def test_a_regular_file_is_read_up_to_its_cap(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_small(path, 100) == b"x" * 100
    with pytest.raises(FileTooLarge, match="larger than 99 bytes"):
        read_small(path, 99)
    link = tmp_path / "link"
    link.symlink_to(path)  # a symlink to a regular file is that file
    assert read_small(link, 100) == b"x" * 100


def test_a_fifo_opens_at_once_and_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    box: dict[str, BaseException] = {}

    def read() -> None:
        try:
            read_small(fifo, 10)
        except OSError as exc:
            box["error"] = exc

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "blocked on a FIFO with no writer"
    assert isinstance(box["error"], NotARegularFile) and "a FIFO" in str(box["error"])


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_devices_and_directories_are_refused(tmp_path: Path, device: str) -> None:
    link = tmp_path / "settings.json"
    link.symlink_to(device)
    with pytest.raises(NotARegularFile, match="a character device"):
        read_small(link, 1 << 20)
    with pytest.raises(NotARegularFile, match="a directory"):
        open_regular(tmp_path)


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_small(tmp_path / "nope", 10)
