"""The logits above the last layer (plan/compute.py state_rows_fence): where a recurrent layer's
single state fills the token ids' slot exactly, llama.cpp's allocator keeps a zero-byte free
block between the last layer's freed FFN and its last free block, and the logits land above
that FFN (LFM2-1.2B at -ub 4089-4096: 1568 MiB where 1085 MiB one token below)."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest
from arch_real import DATA, GRID, grid_config, load, reference
from conformance_model import rpc_machine

from quantpick.plan.compute import state_rows_fence, within
from quantpick.plan.memory import RunConfig, estimate

MiB = 1024**2
LFM2_STATE = 2 * 2048  # LFM2-1.2B: (L_cache - 1) x n_embd elements per sequence


def test_the_window_is_the_ubatches_whose_token_ids_slot_the_state_fills() -> None:
    """Measured on llama-memory-bytes (b11312), LFM2-1.2B at -c 32768: the jump at -ub 4089 to
    4096 and nowhere in 3800-4400; with -np 2 at 8185-8192, not at 4096."""
    jump = [ub for ub in range(3800, 4400) if state_rows_fence(ub, 1, LFM2_STATE, 0)]
    assert jump == list(range(4089, 4097))
    assert state_rows_fence(8192, 2, LFM2_STATE, 0)
    assert not state_rows_fence(4096, 2, LFM2_STATE, 0)


@pytest.mark.parametrize(
    ("ubatch", "state_r", "state_s"),
    [(24576, 24576, 524288), (30720, 30720, 786432), (30720, 30720, 1048576)],
)
def test_two_states_leave_no_fence(ubatch: int, state_r: int, state_s: int) -> None:
    """qwen3-next-80b-a3b, qwen3.5-27b, nemotron-h-8b at the ubatch whose slot their first
    state fills: llama.cpp measured no jump (16356.7, 30900.1, 16800.1 MiB, on the slope of
    the ubatches beside them)."""
    assert not state_rows_fence(ubatch, 1, state_r, state_s)


def test_the_grid_row_lfm2_at_ub_4096_is_within() -> None:
    """The compute grid's row that was 1136 vs 1568 MiB (27.6% under) is within max(5%, 16 MiB)."""
    doc = json.loads(gzip.open(GRID).read())
    _, layout = load(DATA / "lfm2-1.2b.json")
    checked = 0
    for case in doc["configs"]["lfm2-1.2b"]["cases"]:
        if case["config"]["devices"] != "none" or case["config"].get("ub") != 4096:
            continue
        config, _ = grid_config(case["config"])
        theirs = reference(case)[1]["Host"]["compute"]
        ours = estimate(layout, rpc_machine(0), config).host.compute_bytes
        assert within(ours, theirs), (ours / MiB, theirs / MiB)
        checked += 1
    assert checked == 1


# LFM2-1.2B and two variants (n_embd 1024, L_cache 4) around their windows: (hparams, -c, -np,
# ubatches); the jump measured at exactly the ubatches state_rows_fence names
LIVE = [
    ({}, 32768, 1, (3840, 4080, 4088, 4089, 4090, 4096, 4100)),
    ({}, 4096, 1, (4088, 4092, 4096)),
    ({}, 8192, 1, (4096,)),
    ({}, 32768, 2, (4096, 8184, 8192)),
    ({}, 65536, 4, (16376, 16384)),
    ({}, 131072, 1, (4088, 4096)),
    ({"embedding_length": 1024, "feed_forward_length": 4096}, 32768, 1, (2040, 2041, 2048, 2052)),
    ({"embedding_length": 1024, "feed_forward_length": 4096, "shortconv.l_cache": 4}, 32768, 1,
     (3064, 3072)),
]  # fmt: skip


@pytest.mark.llamacpp
def test_live_llamacpp_agrees_around_the_window(llamacpp_bin: Path, tmp_path: Path) -> None:
    """llama-memory-bytes on header-only LFM2 GGUFs: compute within max(5%, 16 MiB) on both
    sides of each window (measured: all 24, worst -3.1%; without the rule the 12 rows inside a
    window were 16.7-27.6% under)."""
    import subprocess

    from arch_configs import BY_NAME
    from arch_fixtures import write_header_only

    from quantpick.model.gguf import layout_from_header, read_gguf_file

    problems = []
    for n, (hparams, ctx, n_par, ubatches) in enumerate(LIVE):
        base = BY_NAME["lfm2-1.2b"]
        cfg = dataclasses.replace(base, hparams={**base.hparams, **hparams})
        path = tmp_path / f"lfm2-{n}.gguf"
        write_header_only(path, cfg.architecture, cfg.quant, name=cfg.name, file_type=False)
        layout = layout_from_header(read_gguf_file(path), basis=cfg.name)
        for ub in ubatches:
            flags = ["-c", str(ctx), "-np", str(n_par), "-fa", "on", "-ub", str(ub)]
            flags += ["-b", str(max(2048, ub)), "-dev", "none"]
            run = subprocess.run(
                [str(llamacpp_bin / "llama-memory-bytes"), "-m", str(path), "--log-disable"]
                + flags,
                capture_output=True,
                text=True,
                timeout=600,
            )
            line = next(x for x in run.stdout.splitlines() if x.startswith("{"))
            theirs = {d["name"]: d for d in json.loads(line)["devices"]}["Host"]["compute"]
            config = RunConfig(
                ctx_size=ctx,
                n_parallel=n_par,
                flash_attn="on",
                ubatch=ub,
                batch=max(2048, ub),
                logits_rows="batch",
            )
            ours = estimate(layout, rpc_machine(0), config).host.compute_bytes
            if not within(ours, theirs):
                problems.append(f"{hparams} {flags}: {ours / MiB:.1f} vs {theirs / MiB:.1f} MiB")
    assert problems == []
