"""scripts/replay_alloc_trace.py: its transcription of ggml_dyn_tallocr (ggml-alloc.c at b11312)
and the zero-size free block that plan/compute.py's state_rows_fence rests on."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_module import load_script

replay = load_script("replay_alloc_trace")
BIG = 1 << 62


def test_sizes_pad_to_the_alignment_and_a_tie_goes_to_the_later_block() -> None:
    alloc = replay.Allocator(32)
    assert alloc.alloc(40) == (0, 0)
    assert alloc.blocks == [[64, BIG - 64]]
    alloc.blocks = [[0, 64], [128, 64], [512, BIG]]
    assert alloc.alloc(64) == (1, 128)  # block->size <= best_fit_size (ggml-alloc.c:211-224)
    assert alloc.blocks == [[0, 64], [512, BIG]]  # emptied, removed (:266-269)


@pytest.mark.parametrize("zero_free", [False, True])
def test_a_zero_byte_free_fences_the_last_block_off(zero_free: bool) -> None:
    """Freed blocks merge only with their array neighbours (:318-345): a size-0 block left
    inside a free block, once the block below grows past it, keeps the next frees apart from
    the last block, and a large tensor lands above them instead of at the bottom."""
    alloc = replay.Allocator(32)
    alloc.blocks = [[0, 256], [1024, BIG]]
    if zero_free:
        alloc.free(128, 0)  # inserted, not merged (:135-150)
        assert alloc.blocks == [[0, 256], [128, 0], [1024, BIG]]
    assert alloc.alloc(192) == (0, 0)  # the block below moves up past the zero block (:264)
    if zero_free:
        assert any("fence" in line for line in replay.describe(alloc.blocks))
    alloc.free(0, 192)
    alloc.free(256, 768)
    _, offset = alloc.alloc(2048)  # the logits
    assert offset == (1024 if zero_free else 0)


def test_a_trace_replays_and_a_differing_event_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        "allocating a (40 bytes) - block 0, offset 0, chunk 0",
        "allocating b (64 bytes) - block 0, offset 64, chunk 0",
        "freeing a at {chunk=0, offset=0} (40 bytes) - n_free_blocks = 1",
        "allocating result_output (32 bytes) - block 0, offset 0, chunk 0",
    ]
    trace = tmp_path / "trace.log"
    trace.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr("sys.argv", ["replay_alloc_trace.py", str(trace)])
    assert replay.main() == 0
    assert "0 events differ" in capsys.readouterr().out
    trace.write_text("\n".join([*lines[:3], lines[3].replace("offset 0", "offset 128")]) + "\n")
    assert replay.main() == 1
    assert "result_output at block 0 offset 0, llama.cpp 0 128" in capsys.readouterr().out
