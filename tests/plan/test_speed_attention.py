"""Decode attention over the KV cache per backend and attention kind (issue #31, speed per
backend): where the backend's decode kernel runs each query head on its own (ggml-metal's vector
flash attention: one head per threadgroup), the depth cost is the heads' arithmetic, so MLA's
many heads over one latent cost far more per cached byte than a GQA layer; where it packs a KV
head's query heads together (CUDA), the cache's bytes."""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest
from arch_configs import BY_NAME, SPEED_CONFIGS
from arch_fixtures import typed_tensors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantpick.machine.backends import backend_of
from quantpick.machine.describe import describe_gpu
from quantpick.machine.spec import Host, Machine
from quantpick.model.ggml import tensor_bytes
from quantpick.model.layout import synthesize_layout
from quantpick.plan.bandwidth_bound import filled
from quantpick.plan.memory import RunConfig, estimate
from quantpick.plan.speed import (
    DEFAULT_SPEED_PARAMS,
    attention_depth_seconds,
    decode_seconds,
    device_speeds,
)
from quantpick.plan.speed_work import SpeedWork, speed_work

GiB = 1024**3
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAC = "m2-ultra:192G"
CUDA_CARD = "4090"
# MLA (GLM-4.7-Flash: 20 heads over one 576-wide latent), GQA (qwen2.5-7b-like 28/4 x 128,
# qwen3-30b-a3b 32/4), a mostly sliding-window model (gemma-3-4b), gpt-oss (alternating window)
CONFIGS = {**BY_NAME, **{c.name: c for c in SPEED_CONFIGS}}
MODELS = ("glm-4.7-flash", "qwen3-30b-a3b", "gemma-3-4b", "gpt-oss-20b")


def box(gpu: str) -> Machine:
    host = Host(256 * GiB, 256 * GiB, 16, ram_bandwidth_bytes_per_s=800_000_000_000)
    return Machine(gpus=(describe_gpu(gpu, index=0),), host=host, described=True, source="test")


@cache
def work_of(name: str, gpu: str) -> SpeedWork:
    cfg = CONFIGS[name]
    quant = "MXFP4_MOE" if cfg.arch == "gpt-oss" else "Q8_0"
    arch = cfg.architecture
    size = sum(tensor_bytes(t, ne) for _, ne, t in typed_tensors(arch, quant))
    layout = synthesize_layout(arch, quant, size)
    return speed_work(layout, estimate(layout, box(gpu), RunConfig(ctx_size=65536)))


def gpu_work(work: SpeedWork):  # type: ignore[no-untyped-def]
    return next(w for w in work.devices if w.kind == "gpu")


def test_the_metal_device_carries_its_decode_attention_rate_and_cuda_none() -> None:
    mac = device_speeds(box(MAC))
    metal = backend_of(describe_gpu(MAC).backend)
    gpu = next(d for d in mac.values() if d.kind == "gpu")
    assert metal.decode_attention_efficiency is not None
    assert gpu.attention_flops_per_s == pytest.approx(
        describe_gpu(MAC).fp16_tflops * 1e12 * metal.decode_attention_efficiency  # type: ignore[operator]
    )
    cuda = next(d for d in device_speeds(box(CUDA_CARD)).values() if d.kind == "gpu")
    assert cuda.attention_flops_per_s is None


def test_mla_on_metal_pays_its_heads_arithmetic_per_token_of_fill() -> None:
    """GLM-4.7-Flash on an M2 Ultra (llama.cpp benches/mac-m2-ultra, rows 1026-1030): 59.6 tok/s
    empty, 21.8 at 32K, 0.89 us per token of fill. Its cache is 47 x 576 f16 per token (54 KB,
    0.07 us at 800 GB/s), its heads' arithmetic 47 x 2 x 20 x (576 + 576) FLOPs: the depth cost
    is the arithmetic's, at least 5x what the bytes model (kv_depth_factor x bytes) says."""
    work = work_of("glm-4.7-flash", MAC)
    speeds = device_speeds(box(MAC))
    g = gpu_work(work)
    dev = speeds[g.device]
    assert dev.attention_flops_per_s
    per_token = (decode_seconds(work, speeds, 32768) - decode_seconds(work, speeds, 0)) / 32768
    bytes_model = g.kv_depth_bytes * DEFAULT_SPEED_PARAMS.kv_depth_factor / 800e9
    assert per_token >= g.attention_flops_full / dev.attention_flops_per_s * (1 - 1e-9)
    assert per_token > 5 * bytes_model
    # measured 0.89 us per token of fill: within 1.5x
    assert 0.89e-6 / 1.5 < per_token < 0.89e-6 * 1.5


def test_mla_costs_more_depth_per_cache_byte_than_gqa_on_metal_not_on_cuda() -> None:
    """Per byte of cache, MLA (20 heads reading one latent) does 5x the arithmetic of a GQA
    layer (8 query heads per KV head): on Metal its depth cost per byte is larger; on CUDA,
    where the cost is the bytes, the two are the same."""

    def per_byte(name: str, gpu: str) -> float:
        work = work_of(name, gpu)
        speeds = device_speeds(box(gpu))
        g = gpu_work(work)
        depth = decode_seconds(work, speeds, 32768) - decode_seconds(work, speeds, 0)
        return depth / filled(32768, g.kv_window_bytes, g.kv_depth_bytes, work.n_swa)

    assert per_byte("glm-4.7-flash", MAC) > 3 * per_byte("qwen3-30b-a3b", MAC)
    assert per_byte("glm-4.7-flash", CUDA_CARD) == pytest.approx(
        per_byte("qwen3-30b-a3b", CUDA_CARD), rel=1e-6
    )


@SETTINGS
@given(
    name=st.sampled_from(MODELS),
    gpu=st.sampled_from((MAC, CUDA_CARD, "m4-max:128G", "7900xtx")),
    fill=st.integers(0, 131072),
    more=st.integers(1, 65536),
    kv_quantized=st.booleans(),
)
def test_decode_never_gets_faster_with_more_depth(
    name: str, gpu: str, fill: int, more: int, kv_quantized: bool
) -> None:
    work = dataclasses.replace(work_of(name, gpu), kv_quantized=kv_quantized)
    speeds = device_speeds(box(gpu))
    assert decode_seconds(work, speeds, fill + more) >= decode_seconds(work, speeds, fill)


@SETTINGS
@given(
    name=st.sampled_from(MODELS),
    fill=st.integers(0, 131072),
    rate=st.floats(1e11, 1e15),
    quant=st.floats(1.0, 3.0),
)
def test_the_depth_cost_is_never_below_either_bound(
    name: str, fill: int, rate: float, quant: float
) -> None:
    """For any rate: at least the bytes term the bandwidth model charges, at least the heads'
    arithmetic at the kernel's rate; and without a per-head kernel exactly the bytes term."""
    work = work_of(name, MAC)
    g = gpu_work(work)
    dev = dataclasses.replace(
        next(d for d in device_speeds(box(MAC)).values() if d.kind == "gpu"),
        attention_flops_per_s=rate,
    )
    bytes_only = dataclasses.replace(dev, attention_flops_per_s=None)
    factor = DEFAULT_SPEED_PARAMS.kv_depth_factor * quant
    bw = dev.bandwidth_bytes_per_s
    seconds = attention_depth_seconds(g, dev, fill, work.n_swa, bw, factor)
    bytes_term = attention_depth_seconds(g, bytes_only, fill, work.n_swa, bw, factor)
    flops = filled(fill, g.attention_flops_window, g.attention_flops_full, work.n_swa)
    assert bytes_term == pytest.approx(
        filled(fill, g.kv_window_bytes, g.kv_depth_bytes, work.n_swa)
        * DEFAULT_SPEED_PARAMS.kv_depth_factor
        * quant
        / dev.bandwidth_bytes_per_s
    )
    assert seconds >= bytes_term
    assert seconds >= flops / rate * (1 - 1e-12)


@SETTINGS
@given(
    heads=st.integers(1, 8),
    fill=st.integers(1, 131072),
)
def test_more_query_heads_over_the_same_cache_are_never_faster_on_metal(
    heads: int, fill: int
) -> None:
    """The per-head kernel reads and multiplies a KV head's cells once per query head: more
    query heads over the same cache bytes never decode faster (on CUDA they cost nothing)."""
    work = work_of("qwen3-30b-a3b", MAC)
    g = gpu_work(work)
    dev = next(d for d in device_speeds(box(MAC)).values() if d.kind == "gpu")
    more = dataclasses.replace(
        g,
        attention_flops_full=g.attention_flops_full * (1 + heads),
        attention_flops_window=g.attention_flops_window * (1 + heads),
    )
    bw, factor = dev.bandwidth_bytes_per_s, DEFAULT_SPEED_PARAMS.kv_depth_factor
    slower = attention_depth_seconds(more, dev, fill, work.n_swa, bw, factor)
    assert slower > attention_depth_seconds(g, dev, fill, work.n_swa, bw, factor)
    cuda = next(d for d in device_speeds(box(CUDA_CARD)).values() if d.kind == "gpu")
    assert attention_depth_seconds(more, cuda, fill, work.n_swa, bw, factor) == (
        attention_depth_seconds(g, cuda, fill, work.n_swa, bw, factor)
    )
