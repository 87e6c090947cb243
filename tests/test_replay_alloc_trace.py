"""scripts/replay_alloc_trace.py: a recorded allocator trace replayed through plan/allocator.py
(its own tests: tests/plan/test_allocator.py), every event checked against llama.cpp's."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_module import load_script

replay = load_script("replay_alloc_trace")


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
