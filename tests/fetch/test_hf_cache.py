"""quantpick.fetch.hf_cache: reading huggingface_hub's refs (another program's files)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from quantpick.fetch.hf_cache import REF_MAX_BYTES, read_ref

COMMIT = "c" * 40


def test_a_ref_is_read_as_huggingface_hub_writes_it(tmp_path: Path) -> None:
    ref = tmp_path / "main"
    ref.write_text(COMMIT)  # no newline, as _cache_commit_hash_for_specific_revision writes
    assert read_ref(ref) == COMMIT
    assert read_ref(tmp_path / "missing") is None


def test_a_ref_that_is_a_fifo_a_device_or_huge_is_no_ref(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    box: dict[str, str | None] = {}
    worker = threading.Thread(target=lambda: box.setdefault("ref", read_ref(fifo)), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and box["ref"] is None
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    assert read_ref(zero) is None
    huge = tmp_path / "huge"
    huge.write_text(COMMIT + " " * REF_MAX_BYTES)
    assert read_ref(huge) is None
