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


def test_one_buffer_of_a_multi_buffer_trace_replays_from_its_last_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An ALLOC_TRACE build (scripts/alloc_trace_patch.py) prefixes each event with its
    allocator's address and names the buffers at each reserve: --buffer replays one of them from
    its last reset; names may hold spaces (a copied view: `Vulkan0#cache_k_l0 (view)#0`)."""
    gpu, host = "[0x1]", "[0x2]"
    lines = [
        f"{gpu} reset",
        f"{gpu} buffer 0 Vulkan0",
        f"{host} buffer 1 Vulkan_Host",
        f"{gpu} ggml_dyn_tallocr_alloc: allocating stale (512 bytes) - block 0, offset 0, chunk 0",
        f"{gpu} reset",
        f"{host} ggml_dyn_tallocr_alloc: allocating inp (64 bytes) - block 0, offset 0, chunk 0",
        f"{gpu} ggml_dyn_tallocr_alloc: allocating Vulkan0#k (view)#0 (96 bytes) - block 0, "
        "offset 0, chunk 0",
        f"{gpu} ggml_gallocr_free_node: freeing Vulkan0#k (view)#0 at {{chunk=0, offset=0}} "
        "(96 bytes) - n_free_blocks = 1",
        f"{gpu} ggml_dyn_tallocr_alloc: allocating mask (32 bytes) - block 0, offset 0, chunk 0",
    ]
    trace = tmp_path / "trace.log"
    trace.write_text("\n".join(lines) + "\n")
    argv = ["replay_alloc_trace.py", str(trace), "--buffer", "Vulkan0", "--alignment", "16"]
    monkeypatch.setattr("sys.argv", argv)
    assert replay.main() == 0
    out = capsys.readouterr().out
    assert "max size 0.000 MiB; 0 events differ" in out
    monkeypatch.setattr("sys.argv", [*argv[:3], "CUDA0"])
    with pytest.raises(SystemExit, match="no buffer named CUDA0"):
        replay.main()


def test_the_trace_patch_applies_to_the_pinned_allocator_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scripts/alloc_trace_patch.py on a copy of b11312's ggml-alloc.c lines (the five it edits):
    every edit lands, a second run changes nothing, another file is refused."""
    patch = load_script("alloc_trace_patch")
    target = tmp_path / "ggml-alloc.c"
    target.write_text("\n".join(old for old, _ in patch.EDITS) + "\n")
    monkeypatch.setattr("sys.argv", ["alloc_trace_patch.py", str(target)])
    assert patch.main() == 0
    once = target.read_text()
    assert patch.MARK in once and once.count("(void*)alloc") == 3
    assert patch.main() == 0 and target.read_text() == once
    target.write_text("int main(void) { return 0; }\n")
    assert patch.main() == 1
