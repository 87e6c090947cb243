"""DeepSeek-V4's caches (quantpick/arch/deepseek4.py) beyond what test-llama-archs records
(tests/arch/test_conformance.py pins every recorded case to the byte): the byte count of one case
worked by hand from src/llama-kv-cache-dsv4.cpp, -kvu, --swa-full and the rollback planes of
speculative decoding."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llamacpp_archs import Case, machine
from test_conformance import recorded

from quantpick.arch.base import AttentionKind
from quantpick.model.gguf import header_from_json, layout_from_header
from quantpick.model.layout import ModelLayout
from quantpick.plan.memory import RunConfig, estimate


@pytest.fixture(scope="module")
def layout() -> ModelLayout:
    entry = recorded()["models"]["deepseek4-moe"]
    return layout_from_header(header_from_json(entry["header"]), basis="deepseek4-moe")


def context(layout: ModelLayout, config: RunConfig) -> tuple[int, int]:
    host = estimate(layout, machine(False), config).host
    return host.kv_bytes, host.recurrent_bytes


def test_the_view_is_the_dsv4_cache(layout: ModelLayout) -> None:
    view = layout.view
    assert view.mla and view.split_streams
    assert all(lv.attention is AttentionKind.SLIDING and lv.v_width == 0 for lv in view.layers)
    # compress_ratios [0, 0, 4, 128]: CSA K + indexer K on layer 2, HCA K on layer 3
    assert [[(c.width, c.ratio) for c in lv.compressed] for lv in view.layers] == [
        [], [], [(64, 4), (128, 4)], [(64, 128)],
    ]  # fmt: skip
    assert [[(s.width, s.rows) for s in lv.states] for lv in view.layers] == [
        [], [], [(128, 8), (256, 8)], [(64, 128)],
    ]  # fmt: skip


def test_one_case_worked_by_hand(layout: ModelLayout) -> None:
    """-c 4096 -np 1 f16: raw window pad256(32 + 512) = 768 cells x 4 layers x 64 x 2 bytes; CSA
    1024 cells x 128 bytes, indexer 1024 x 256, HCA pad256(32) = 256 x 128; states f32 x 2:
    128 x 8, 256 x 8, 64 x 128 (llama-kv-cache-dsv4.cpp:1253-1321)."""
    kv, state = context(layout, RunConfig(ctx_size=4096, logits_rows="batch"))
    assert kv == 768 * 4 * 128 + 1024 * 128 + 1024 * 256 + 256 * 128
    assert state == 2 * 4 * (128 * 8 + 256 * 8 + 64 * 128)


@settings(max_examples=25, deadline=None)
@given(np=st.integers(1, 6), ctx=st.integers(256, 70000))
def test_a_unified_cache_keeps_one_stream_per_sequence(
    layout: ModelLayout, np: int, ctx: int
) -> None:
    """-kvu leaves the streams per sequence (unified_raw / unified_compressed false): the window
    half is the same per stream, and every cache covers n_ctx per stream instead of n_ctx / np."""
    split = context(layout, RunConfig(ctx_size=ctx, n_parallel=np, logits_rows="batch"))
    unified = context(
        layout, RunConfig(ctx_size=ctx, n_parallel=np, kv_unified=True, logits_rows="batch")
    )
    assert unified[1] == split[1]  # the states do not depend on the cells
    assert unified[0] >= split[0]
    one = context(layout, RunConfig(ctx_size=ctx, logits_rows="batch"))
    # with -kvu each of the np streams is a whole -np 1 cache of the same context
    assert unified[0] == np * one[0]


def test_swa_full_gives_the_window_the_whole_context(layout: ModelLayout) -> None:
    base = RunConfig(ctx_size=4096, logits_rows="batch")
    kv, _ = context(layout, base)
    full, _ = context(layout, replace(base, swa_full=True))
    assert full - kv == (4096 - 768) * 4 * 128


@pytest.mark.parametrize("drafts", [1, 3, 8])
def test_speculative_rollback_planes_multiply_the_states(layout: ModelLayout, drafts: int) -> None:
    """n_rs_seq = --spec-draft-n-max with MTP (common/common.h:396-402): n_stream x (1 +
    n_rs_seq) planes of each compressor state (llama-kv-cache-dsv4.cpp:963-965)."""
    base = RunConfig(ctx_size=4096, n_parallel=2, logits_rows="batch")
    kv, state = context(layout, base)
    kv_spec, state_spec = context(layout, replace(base, spec_draft_n=drafts))
    assert kv_spec == kv
    assert state_spec == state * (1 + drafts)


def test_each_device_copies_only_the_masks_its_layers_read(layout: ModelLayout) -> None:
    """The CSA layer (2) reads the CSA mask and the indexer's, the HCA layer (3) its own, the
    window-only layers (0, 1) none beyond the generic window mask; a device's part is each kind
    once, and the host sets them all (llama-graph.cpp:958-986)."""
    from quantpick.arch.graph import GraphSizes
    from quantpick.arch.registry import graph_trait

    trait = graph_trait("deepseek4")
    assert trait is not None
    arch = layout.architecture
    g = GraphSizes(ubatch=512, cells=33024, n_stream=1, n_seq_max=1, mask_bytes=2)
    csa = 8448 * 512 * (2 + 2)  # pad256(33024 / 4) cells x ubatch, f16 CSA + f16 indexer
    hca = 512 * 512 * 2  # pad256(ceil(33024 / 128))
    assert trait.of_layers(arch, g, [0, 1]).inputs == 0
    assert trait.of_layers(arch, g, [3]).inputs == hca
    assert trait.of_layers(arch, g, [0, 1, 2]).inputs == csa
    assert trait.host_inputs(arch, g, range(4)) == csa + hca
    # the CSA layer's temporaries: the indexer's Q (64 heads x 128) and scores, or top-k's
    assert trait.of_layers(arch, g, [2]).layer >= 8 * 8448 * 512


def test_pipeline_rows_follow_the_layers_each_device_runs(layout: ModelLayout) -> None:
    """-c 33000 -ngl all -ts 1,1 (pipeline parallel, 4 input copies): RPC0 runs the CSA layer
    and holds 4 copies of its 16.5 MiB of masks, RPC1 the HCA layer (llama.cpp: 143.6 and
    54.6 MiB; the host 76.4)."""
    from llamacpp_archs import machine as rpc_machine

    cfg = RunConfig(ctx_size=33000, n_gpu_layers=None, tensor_split=(1.0, 1.0), logits_rows="batch")
    est = estimate(layout, rpc_machine(True), cfg)
    MiB = 1024**2
    rpc0, rpc1 = (d.compute_bytes / MiB for d in est.gpus)
    assert abs(rpc0 - 143.58) <= 0.1 * 143.58
    assert abs(rpc1 - 54.60) <= 0.1 * 54.60
    assert abs(est.host.compute_bytes / MiB - 76.37) <= 0.05 * 76.37


# configurations beyond the recorded grid: more sequences, -ub, larger contexts, FA off
LIVE = [
    (Case(ctx=8192, np=2), ()),
    (Case(ctx=8192, np=4, kvu=True), ()),
    (Case(ctx=100000), ()),
    (Case(ctx=33000, fa="off"), ()),
    (Case(ctx=16384, np=2, swa_full=True), ()),
    (Case(ctx=16384), ("-ub", "256")),
    (Case(ctx=16384), ("-ub", "1024")),
    (Case(ctx=65536, np=2, kv="q8_0"), ()),
    (Case(ctx=2048), ("-ub", "2048")),
    (Case(ctx=33000, np=3, fa="off"), ()),
]


@pytest.mark.llamacpp
def test_live_llamacpp_agrees_beyond_the_grid(llamacpp_bin: Path, tmp_path: Path) -> None:
    """llama-memory-bytes on test-llama-archs' deepseek4 at configurations the recorded grid
    lacks: KV+state to the byte, compute within max(5%, 16 MiB) (measured: all 10)."""
    import json
    import subprocess

    from llamacpp_archs import generate_models

    from quantpick.model.gguf import read_gguf_file
    from quantpick.plan.compute import within

    path = generate_models(llamacpp_bin, tmp_path)["deepseek4-moe"]
    layout = layout_from_header(read_gguf_file(path), basis="deepseek4-moe")
    problems = []
    for case, extra in LIVE:
        argv = [str(llamacpp_bin / "llama-memory-bytes"), "-m", str(path), "--log-disable"]
        run = subprocess.run(
            [*argv, *case.flags(), *extra], capture_output=True, text=True, timeout=600
        )
        line = next(x for x in run.stdout.splitlines() if x.startswith("{"))
        theirs = {d["name"]: d for d in json.loads(line)["devices"]}["Host"]
        config = case.config()
        if extra:
            config = replace(config, ubatch=int(extra[1]))
        host = estimate(layout, machine(False), config).host
        if host.kv_bytes + host.recurrent_bytes != theirs["context"]:
            problems.append(f"{case.flags()} {extra}: context")
        if not within(host.compute_bytes, theirs["compute"]):
            problems.append(f"{case.flags()} {extra}: compute {host.compute_bytes}")
    assert problems == []
