"""Prefill with weights in host RAM: llama.cpp's op offload copies them to the first GPU for
each ubatch of 32 tokens or more, the routed experts only those the ubatch's tokens picked
(ggml-backend.cpp:1709-1797 at b11312), so that copy, bound by the PCIe link, paces prefill."""

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
from quantpick.plan.speed import (
    OP_OFFLOAD_MIN_BATCH,
    device_speeds,
    offload_copy_bytes,
    pcie_bytes_per_s,
    prefill_seconds,
)
from quantpick.plan.speed_work import ROUTING_RUN_TOKENS, SpeedWork, speed_work, touched_share

GiB = 1024**3
MANIFEST = find_manifest("qwen3.6-35b-a3b-unsloth")
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
QUANTS = ("UD-Q2_K_XL", "UD-Q4_K_M", "Q8_0")


@cache
def layout_of(quant: str) -> ModelLayout:
    size = sum(f.size_bytes for f in MANIFEST.quant_files(quant))
    return synthesize_layout(MANIFEST.architecture, quant, size)


def machine(pcie: tuple[int, int] = (4, 16)) -> Machine:
    card = dataclasses.replace(describe_gpu("3090"), pcie_generation=pcie[0], pcie_width=pcie[1])
    host = Host(128 * GiB, 128 * GiB, 8, ram_bandwidth_bytes_per_s=60 * 10**9)
    return Machine(gpus=(card,), host=host, described=True, source="test")


@cache
def cpu_moe_work(quant: str, ubatch: int = 512) -> SpeedWork:
    layout = layout_of(quant)
    config = RunConfig(ctx_size=8192, cpu_moe=True, ubatch=ubatch, batch=max(2048, ubatch))
    return speed_work(layout, estimate(layout, machine(), config))


def host_work(work: SpeedWork):  # type: ignore[no-untyped-def]
    return next(w for w in work.devices if w.kind == "host")


@given(
    used=st.floats(min_value=1e-3, max_value=1.0),
    tokens=st.integers(min_value=1, max_value=8192),
    more=st.integers(min_value=0, max_value=8192),
)
def test_a_ubatch_touches_a_share_that_grows_with_its_tokens(
    used: float, tokens: int, more: int
) -> None:
    share = touched_share(used, tokens)
    assert used - 1e-12 <= share <= 1.0
    assert touched_share(used, tokens + more) >= share


@given(
    used=st.floats(min_value=1e-3, max_value=1.0),
    tokens=st.integers(min_value=1, max_value=8192),
    run=st.floats(min_value=1.0, max_value=64.0),
)
def test_tokens_that_route_alike_touch_fewer_experts_never_fewer_than_one_token(
    used: float, tokens: int, run: float
) -> None:
    share = touched_share(used, tokens, run)
    assert used - 1e-12 <= share <= touched_share(used, tokens) + 1e-12


def test_gpt_oss_touches_the_experts_llama_cpp_counted() -> None:
    """gpt-oss-120b on 512 tokens touched 72-95 of 128 experts per layer, 83 on average
    (llama.cpp PR #15346): the copy of a 512-token ubatch holds that share, not all 128; a
    family without a measured routing picks independently."""
    used = 4 / 128
    assert touched_share(used, 512, ROUTING_RUN_TOKENS["gpt-oss"]) * 128 == pytest.approx(83, abs=1)
    assert touched_share(used, 512) > 0.999
    assert cpu_moe_work("UD-Q4_K_M").routing_run_tokens == 1.0


@SETTINGS
@given(
    quant=st.sampled_from(QUANTS),
    tokens=st.integers(min_value=OP_OFFLOAD_MIN_BATCH, max_value=512),
    more=st.integers(min_value=0, max_value=512),
)
def test_the_copy_never_exceeds_the_host_weights_and_grows_with_the_tokens(
    quant: str, tokens: int, more: int
) -> None:
    work = cpu_moe_work(quant)
    w = host_work(work)
    copied = offload_copy_bytes(w, work, tokens)
    whole = w.resident_bytes - w.expert_read_bytes + w.expert_resident_bytes
    assert 0 < copied <= whole
    assert offload_copy_bytes(w, work, tokens + more) >= copied


@SETTINGS
@given(
    quant=st.sampled_from(QUANTS),
    link=st.sampled_from([(3, 8), (3, 16), (4, 8), (4, 16), (5, 8), (5, 16)]),
    faster=st.sampled_from([(4, 16), (5, 16), (6, 16)]),
    tokens=st.sampled_from([32, 128, 512]),
)
def test_more_pcie_bandwidth_never_lowers_prefill_with_experts_in_ram(
    quant: str, link: tuple[int, int], faster: tuple[int, int], tokens: int
) -> None:
    if pcie_bytes_per_s(*faster) < pcie_bytes_per_s(*link):
        link, faster = faster, link
    work = cpu_moe_work(quant)
    slow = prefill_seconds(work, device_speeds(machine(link)), tokens=tokens)
    fast = prefill_seconds(work, device_speeds(machine(faster)), tokens=tokens)
    assert fast <= slow * (1 + 1e-12)


def test_a_short_ubatch_copies_only_the_experts_its_tokens_pick() -> None:
    """A 32-token ubatch of an 8-of-256 model picks about 64% of each layer's experts: with
    -ub 512 its copy is that of a 32-token ubatch, not of the 512 tokens a full one holds."""
    devices = device_speeds(machine())
    full = cpu_moe_work("UD-Q4_K_M", ubatch=512)
    small = cpu_moe_work("UD-Q4_K_M", ubatch=32)
    w = host_work(full)
    assert offload_copy_bytes(w, full, 32) < 0.7 * w.expert_resident_bytes + (
        w.resident_bytes - w.expert_read_bytes
    )
    short = prefill_seconds(full, devices, tokens=32)
    alone = prefill_seconds(small, devices, tokens=32)
    assert abs(short / alone - 1) < 0.05
