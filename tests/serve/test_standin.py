"""serve/standin.py: sparse stand-ins of hub files for llama.cpp's dry run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quantpick.errors import QuantpickError
from quantpick.serve import standin
from quantpick.serve.standin import NoSparseFiles, standins

HEADER = b"GGUF" + bytes(range(256)) * 4
SIZE = 3 * 2**30  # a 3 GiB file that takes a header's worth of disk


def test_each_shard_is_its_header_then_a_hole_and_all_is_removed(tmp_path: Path) -> None:
    shards = [("Q8_0/M-00001-of-00002.gguf", HEADER, SIZE), ("Q8_0/M-00002-of-00002.gguf",
              HEADER[:100], SIZE // 2)]  # fmt: skip
    with standins(shards, parent=tmp_path) as first:
        assert first.name == "M-00001-of-00002.gguf"  # llama.cpp finds shard 2 by this name
        second = first.with_name("M-00002-of-00002.gguf")
        assert first.stat().st_size == SIZE and second.stat().st_size == SIZE // 2
        with first.open("rb") as fh:
            assert fh.read(len(HEADER)) == HEADER
            fh.seek(SIZE - 16)
            assert fh.read() == bytes(16)
        assert first.stat().st_blocks * 512 < 64 * 2**20  # sparse: no 3 GiB on disk
    assert list(tmp_path.iterdir()) == []


def test_removed_when_the_dry_run_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), standins([("m.gguf", HEADER, SIZE)], parent=tmp_path):
        raise RuntimeError("llama-fit-params died")
    assert list(tmp_path.iterdir()) == []


def test_a_file_system_without_holes_is_refused_not_filled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(standin, "stored_bytes", lambda fd: os.fstat(fd).st_size)
    with pytest.raises(NoSparseFiles, match="without sparse files"):
        with standins([("m.gguf", HEADER, SIZE)], parent=tmp_path):
            pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["../escape.gguf", "a\nb.gguf", ""])
def test_a_hostile_or_short_shard_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(QuantpickError), standins([(name, HEADER, SIZE)], parent=tmp_path):
        pass
    with pytest.raises(QuantpickError, match="too short"):
        with standins([("m.gguf", HEADER, 10)], parent=tmp_path):
            pass
