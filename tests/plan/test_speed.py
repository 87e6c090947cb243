"""The expected-speed model: reference figures, and properties that hold for every configuration."""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantpick.machine.describe import describe_gpu
from quantpick.machine.spec import Host, Machine
from quantpick.model.layout import ModelLayout, synthesize_layout
from quantpick.model.registry import find_manifest
from quantpick.plan.memory import RunConfig, estimate
from quantpick.plan.planner import PlanRequest, plan
from quantpick.plan.speed import (
    DEFAULT_SPEED_PARAMS,
    RECENT_BUILD,
    decode_seconds,
    decode_speed,
    device_speeds,
    expected_speed,
    legacy_build,
    speed_work,
)

GiB = 1024**3
MANIFEST = find_manifest("qwen3.6-35b-a3b-unsloth")
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def layout_of(quant: str) -> ModelLayout:
    size = sum(f.size_bytes for f in MANIFEST.quant_files(quant))
    return synthesize_layout(MANIFEST.architecture, quant, size)


def box(*gpus: str, ram_gib: int = 128, ram_gbs: float | None = 60, cores: int = 8) -> Machine:
    host = Host(
        ram_gib * GiB,
        ram_gib * GiB,
        cores,
        ram_bandwidth_bytes_per_s=int(ram_gbs * 1e9) if ram_gbs else None,
    )
    cards = tuple(describe_gpu(name, index=i) for i, name in enumerate(gpus))
    return Machine(gpus=cards, host=host, described=True, source="test")


def expected(quant: str, machine: Machine, config: RunConfig, target: int = 0):  # type: ignore[no-untyped-def]
    layout = layout_of(quant)
    est = estimate(layout, machine, config)
    return expected_speed(
        layout, est, device_speeds(machine), target_context=target or est.n_ctx
    ), est


SHORT = RunConfig(ctx_size=8192)


# ---- reference figures (notes: quality-and-speed.md; benchmarks/data) ----------------------------


def test_3090_q4_in_vram_decodes_in_the_measured_band() -> None:
    """Published runs: an RTX 3090 fully in VRAM at ~Q4 decodes 110-160 tok/s at short context
    (the bound says ~500)."""
    machine = box("3090")
    for quant in ("UD-Q4_K_M", "UD-Q4_K_XL", "UD-IQ4_XS"):
        e, est = expected(quant, machine, SHORT)
        assert est.fits
        # llama-server (the expected figure) pays its sampling cost per token; llama-bench not
        assert 100 <= e.decode_tps_empty <= 160, (quant, e.decode_tps_empty)
        bench = 1 / decode_seconds(
            speed_work(layout_of(quant), est), device_speeds(machine), 0, server=False
        )
        assert 110 <= bench <= 160, (quant, bench)
        assert 2000 <= e.prefill_tps <= 4000  # measured pp512: ~2500-3600


def test_4090_decodes_q3_q4_and_mxfp4_at_similar_speeds() -> None:
    """One build, one 4090, llama-bench: UD-Q3_K_XL, UD-Q4_K_XL and MXFP4_MOE decode at 164, 158
    and 159 tok/s: the fixed cost per token, not the bytes, dominates."""
    machine = box("4090")
    speeds = [
        1 / decode_seconds(work_of(q, machine), device_speeds(machine), 0, server=False)
        for q in ("UD-Q3_K_XL", "UD-Q4_K_XL", "MXFP4_MOE")
    ]
    assert max(speeds) / min(speeds) < 1.25
    assert all(140 <= s <= 185 for s in speeds), speeds


def test_expert_offload_keeps_a_fraction_of_the_full_gpu_speed() -> None:
    """Partial offload keeps roughly 25-50% of decode and 10-30% of prefill (notes)."""
    full, _ = expected("UD-Q4_K_M", box("3090"), SHORT)
    offload, est = expected("UD-Q4_K_M", box("3090"), dataclasses.replace(SHORT, n_cpu_moe=24))
    assert est.host.expert_layers
    assert 0.2 <= offload.decode_tps_empty / full.decode_tps_empty <= 0.6
    assert 0.05 <= offload.prefill_tps / full.prefill_tps <= 0.35


def test_legacy_builds_decode_slower() -> None:
    assert legacy_build(8207) and not legacy_build(RECENT_BUILD) and not legacy_build(None)
    assert not legacy_build(1)  # semver-era builds report build 1
    new, _ = expected("UD-Q4_K_XL", box("4090"), SHORT)
    layout = layout_of("UD-Q4_K_XL")
    est = estimate(layout, box("4090"), SHORT)
    old = expected_speed(
        layout,
        est,
        device_speeds(box("4090")),
        target_context=0,
        params=DEFAULT_SPEED_PARAMS.for_build(8207),
    )
    assert old.decode_tps_empty < new.decode_tps_empty / 1.3


def test_calibration_scales_the_prediction() -> None:
    params = DEFAULT_SPEED_PARAMS.calibrated(decode_ratio=0.8, prefill_ratio=1.1)
    layout = layout_of("UD-Q4_K_M")
    machine = box("3090")
    est = estimate(layout, machine, SHORT)
    base = expected_speed(layout, est, device_speeds(machine), target_context=8192)
    tuned = expected_speed(layout, est, device_speeds(machine), target_context=8192, params=params)
    assert tuned.decode_tps_target == pytest.approx(0.8 * base.decode_tps_target)
    assert tuned.prefill_tps == pytest.approx(1.1 * base.prefill_tps)
    assert "calibrated" in tuned.basis


def test_assumed_figures_are_named() -> None:
    machine = box("3090", ram_gbs=None)
    machine = dataclasses.replace(
        machine,
        gpus=(dataclasses.replace(machine.gpus[0], bandwidth_bytes_per_s=None, fp16_tflops=None),),
    )
    speeds = device_speeds(machine)
    assert speeds["CUDA0"].bandwidth_assumed and speeds["CUDA0"].compute_assumed
    assert speeds["CPU"].bandwidth_assumed
    e, _ = expected("UD-Q4_K_M", machine, dataclasses.replace(SHORT, n_cpu_moe=30))
    assert "CUDA0 bandwidth" in e.assumed and "CPU bandwidth" in e.assumed
    assert "assumed" in e.basis


def test_two_gpus_pay_a_hop_and_split_the_fixed_cost() -> None:
    one, _ = expected("UD-Q2_K_XL", box("5070ti"), SHORT)
    two, est = expected("UD-Q2_K_XL", box("5070ti", "5060ti"), SHORT)
    assert all(d.layers for d in est.gpus)
    assert work_of("UD-Q2_K_XL", box("5070ti", "5060ti")).gpu_transitions == 1
    assert two.decode_tps_empty < one.decode_tps_empty


def work_of(quant: str, machine: Machine, config: RunConfig = SHORT):  # type: ignore[no-untyped-def]
    layout = layout_of(quant)
    return speed_work(layout, estimate(layout, machine, config))


def test_expert_offload_counts_two_hops_per_layer() -> None:
    work = work_of("UD-Q4_K_M", box("3090"), dataclasses.replace(SHORT, n_cpu_moe=10))
    assert work.transitions == 20 and work.gpu_transitions == 0
    assert work_of("UD-Q4_K_M", box("3090")).transitions == 0


# ---- properties --------------------------------------------------------------------------------

QUANTS = ("UD-Q2_K_XL", "UD-Q4_K_M", "UD-Q6_K", "Q8_0")
CARDS = ("3060", "3090", "4090", "t4", "5060ti", "p40", "a100-80g")


@SETTINGS
@given(
    quant=st.sampled_from(QUANTS),
    card=st.sampled_from(CARDS),
    n_cpu_moe=st.integers(0, 40),
    kv=st.sampled_from(("f16", "q8_0", "q4_0")),
    fill=st.integers(0, 262144),
)
def test_expected_never_exceeds_the_bound(
    quant: str, card: str, n_cpu_moe: int, kv: str, fill: int
) -> None:
    machine = box(card)
    layout = layout_of(quant)
    config = RunConfig(ctx_size=262144, n_cpu_moe=n_cpu_moe, cache_type_k=kv, cache_type_v=kv)
    est = estimate(layout, machine, config)
    bandwidths = {k: d.bandwidth_bytes_per_s for k, d in device_speeds(machine).items()}
    bound = decode_speed(layout, est, bandwidths, target_context=fill)
    e = expected_speed(layout, est, device_speeds(machine), target_context=fill)
    assert e.decode_tps_target <= bound.tokens_per_s_target * (1 + 1e-9)
    assert e.decode_tps_empty <= bound.tokens_per_s_empty * (1 + 1e-9)


@SETTINGS
@given(
    quant=st.sampled_from(QUANTS),
    card=st.sampled_from(CARDS),
    n_cpu_moe=st.integers(0, 40),
    fill=st.integers(0, 200000),
    more=st.integers(1, 60000),
    kv=st.sampled_from(("f16", "q8_0")),
)
def test_longer_fill_is_never_faster(
    quant: str, card: str, n_cpu_moe: int, fill: int, more: int, kv: str
) -> None:
    config = RunConfig(ctx_size=262144, n_cpu_moe=n_cpu_moe, cache_type_k=kv, cache_type_v=kv)
    work = work_of(quant, box(card), config)
    speeds = device_speeds(box(card))
    assert decode_seconds(work, speeds, fill + more) >= decode_seconds(work, speeds, fill)


@SETTINGS
@given(
    quant=st.sampled_from(QUANTS),
    card=st.sampled_from(CARDS),
    fill=st.integers(1, 262144),
    kv=st.sampled_from(("q8_0", "q4_0", "q5_1")),
)
def test_quantized_kv_is_not_faster_than_f16_at_depth(
    quant: str, card: str, fill: int, kv: str
) -> None:
    """On CUDA flash attention dequantizes a quantized KV cache: it saves memory, not time."""
    f16 = work_of(quant, box(card), RunConfig(ctx_size=262144))
    quant_kv = work_of(
        quant, box(card), RunConfig(ctx_size=262144, cache_type_k=kv, cache_type_v=kv)
    )
    speeds = device_speeds(box(card))
    assert decode_seconds(quant_kv, speeds, fill) >= decode_seconds(f16, speeds, fill) * (1 - 1e-9)


@SETTINGS
@given(
    quant=st.sampled_from(QUANTS),
    card=st.sampled_from(CARDS),
    fill=st.integers(0, 131072),
    factor=st.floats(1.0, 4.0),
    host_factor=st.floats(1.0, 4.0),
    n_cpu_moe=st.integers(0, 40),
)
def test_more_bandwidth_is_never_slower(
    quant: str, card: str, fill: int, factor: float, host_factor: float, n_cpu_moe: int
) -> None:
    config = RunConfig(ctx_size=262144, n_cpu_moe=n_cpu_moe)
    machine = box(card)
    work = work_of(quant, machine, config)
    speeds = device_speeds(machine)
    faster = {
        name: dataclasses.replace(
            d,
            bandwidth_bytes_per_s=int(
                d.bandwidth_bytes_per_s * (factor if d.kind == "gpu" else host_factor)
            ),
        )
        for name, d in speeds.items()
    }
    assert decode_seconds(work, faster, fill) <= decode_seconds(work, speeds, fill) * (1 + 1e-9)


@SETTINGS
@given(
    quant=st.sampled_from(QUANTS),
    card=st.sampled_from(CARDS),
    n=st.integers(0, 39),
    fill=st.integers(0, 131072),
    ram_gbs=st.floats(20, 400),
)
def test_offloading_more_experts_is_never_faster(
    quant: str, card: str, n: int, fill: int, ram_gbs: float
) -> None:
    """Host memory is slower than VRAM on every machine in the catalogue (the property's domain:
    host bandwidth up to the slowest card's)."""
    machine = box(card, ram_gbs=ram_gbs)
    speeds = device_speeds(machine)
    fewer = work_of(quant, machine, RunConfig(ctx_size=262144, n_cpu_moe=n))
    more = work_of(quant, machine, RunConfig(ctx_size=262144, n_cpu_moe=n + 1))
    assert decode_seconds(more, speeds, fill) >= decode_seconds(fewer, speeds, fill) * (1 - 1e-9)


# ---- the planner fills it -----------------------------------------------------------------------


def test_planner_fills_the_expected_speed() -> None:
    p = plan(MANIFEST, box("3090"), layout_of, PlanRequest(ctx_size=32768))
    assert p.speed.expected is not None
    e = p.speed.expected
    assert e.target_context == 32768
    assert 0 < e.decode_tps_target <= e.decode_tps_empty <= p.speed.tokens_per_s_empty
    assert e.prefill_tps > 100 and "fitted" in e.basis
    assert all(c.speed is None or c.speed.expected is not None for c in p.candidates)
