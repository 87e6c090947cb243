"""Compute buffers as a peak over the graph's phases (plan/compute.py), on full-size real configs
(tests/data/arch-real) and public CUDA logs (tests/data/cuda-logs.json)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
from arch_real import DATA, load
from conformance_model import rpc_machine
from cuda_logs import rows as cuda_rows
from hypothesis import given, settings
from hypothesis import strategies as st

from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.model.layout import ModelLayout
from quantpick.plan.compute import (
    GPU_ESTIMATE,
    MEASURED,
    ComputeBackend,
    DeviceGraph,
    GraphShape,
    accuracy,
    device_compute,
    host_ffn_alone,
    layer_live,
    output_buffer,
)
from quantpick.plan.graph_rules import GENERIC
from quantpick.plan.memory import RunConfig, estimate

MiB = 1024**2
GiB = 1024**3
CONFIGS = ("qwen3.6-35b-a3b", "qwen3-8b", "gemma-3-27b", "gpt-oss-20b", "deepseek-v3")


@cache
def layout(name: str) -> ModelLayout:
    return load(DATA / f"{name}.json")[1]


def cuda_machine(*gib: int) -> Machine:
    gpus = tuple(
        Gpu(index=i, name=f"GPU{i}", total_bytes=g * GiB, free_bytes=g * GiB)
        for i, g in enumerate(gib)
    )
    return Machine(gpus=gpus, host=Host(256 * GiB, 256 * GiB, 8))


configs = st.builds(
    RunConfig,
    ctx_size=st.sampled_from([4096, 32768, 131072]),
    n_parallel=st.integers(1, 8),
    kv_unified=st.booleans(),
    flash_attn=st.sampled_from(["on", "off"]),
    ubatch=st.sampled_from([128, 256, 512, 1024, 2048, 4096]),
    batch=st.just(4096),
    logits_rows=st.sampled_from(["server", "batch"]),
    n_cpu_moe=st.sampled_from([0, 4]),
)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(CONFIGS), config=configs, n_gpu=st.sampled_from([0, 2]))
def test_compute_is_never_below_the_logits_phase(name: str, config: RunConfig, n_gpu: int) -> None:
    """The device computing the output head holds the logits (n_vocab x rows x 4 B) at the end of
    the graph: its buffer is never smaller, whatever else the phases hold."""
    lay = layout(name)
    est = estimate(lay, rpc_machine(n_gpu), config)
    rows_max = config.n_parallel if config.logits_rows == "server" else config.batch
    rows = min(config.ubatch, config.batch, est.n_ctx, rows_max)
    logits = lay.view.n_vocab * rows * 4
    out = [d for d in est.devices if lay.output_slot in d.layers] or [est.host]
    assert out[0].compute_bytes >= logits


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(CONFIGS), config=configs, n_gpu=st.sampled_from([0, 2]))
def test_compute_grows_with_the_ubatch(name: str, config: RunConfig, n_gpu: int) -> None:
    """Every phase's live set is a ubatch of activations, masks or logits: a larger -ub never
    needs a smaller buffer, on any device."""
    lay, m = layout(name), rpc_machine(n_gpu)
    small = estimate(lay, m, config)
    large = estimate(lay, m, replace(config, ubatch=min(2 * config.ubatch, 8192), batch=8192))
    for a, b in zip(small.devices, large.devices, strict=True):
        assert b.compute_bytes >= a.compute_bytes, a.device


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(CONFIGS), config=configs)
def test_the_output_buffer_is_n_seq_rows_of_logits(name: str, config: RunConfig) -> None:
    """output_reserve(n_seq_max) at context creation (src/llama-context.cpp:377, 2116-2143): one
    row of n_vocab f32 logits per sequence, whatever the ubatch."""
    lay = layout(name)
    est = estimate(lay, rpc_machine(0), config)
    assert est.host.overhead_bytes == lay.view.n_vocab * config.n_parallel * 4
    assert output_buffer(lay.view.n_vocab, config.n_parallel) == est.host.overhead_bytes


def test_a_layer_phase_and_the_logits_phase_do_not_add_up() -> None:
    """One CPU device: llama.cpp b11312 reserves the logits + 2 ubatches of embeddings for qwen3-8b
    at -ub 512 (312.75 MiB, tests/data/arch-real/qwen3-8b.json), not logits + mask + layer."""
    est = estimate(
        layout("qwen3-8b"), rpc_machine(0), RunConfig(ctx_size=32768, logits_rows="batch")
    )
    assert est.host.compute_bytes == 151936 * 512 * 4 + 2 * 512 * 4096 * 4


def test_without_flash_attention_the_kq_matrix_is_the_peak() -> None:
    """-fa off at 32768: n_kv x n_ubatch x n_head x 4 B (2 GiB for qwen3-8b) + its f32 mask."""
    est = estimate(
        layout("qwen3-8b"), rpc_machine(0),
        RunConfig(ctx_size=32768, flash_attn="off", logits_rows="batch"),
    )  # fmt: skip
    kq = 32768 * 512 * 32 * 4
    mask = 32768 * 512 * 4
    assert kq + mask < est.host.compute_bytes < kq + mask + 64 * MiB
    # llama.cpp: 2156.01 MiB
    assert abs(est.host.compute_bytes / MiB - 2156.01) < 16


def test_op_offload_charges_the_first_gpu_one_weight_even_with_no_layer() -> None:
    """-ngl 0 on two GPUs: no layer on either, yet the first GPU runs the large-batch matmuls of the
    host weights (ggml-backend.cpp:970-975): one weight tensor at a time in its compute buffer."""
    lay = layout("qwen3.6-35b-a3b")
    est = estimate(lay, cuda_machine(24, 16), RunConfig(ctx_size=32768, n_gpu_layers=0))
    first, second = est.gpus
    biggest = max(t.n_bytes for t in lay.tensors if t.name.startswith("blk.") and len(t.shape) > 1)
    assert first.layers == () and second.layers == ()
    assert biggest <= first.compute_bytes < biggest + 256 * MiB
    assert second.compute_bytes == 0
    # below the offload batch (32) the host computes them
    small = estimate(
        lay, cuda_machine(24, 16), RunConfig(ctx_size=32768, n_gpu_layers=0, ubatch=16)
    )
    assert small.gpus[0].compute_bytes == 0


def test_an_rpc_worker_serving_its_cpu_runs_the_cpu_backends_graph() -> None:
    """`--rpc-device HOST:PORT=cpu:48G`: the CPU backend behind RPC, no op offload, the recorded
    CPU/RPC projection's rule; a local GPU is a GPU backend (op offload, its expected error)."""
    lay = layout("qwen3.6-35b-a3b")
    cfg = RunConfig(ctx_size=32768, n_cpu_moe=8, tensor_split=(1.0, 1.0))
    rpc = estimate(lay, rpc_machine(2), cfg)
    cuda = estimate(lay, cuda_machine(24, 24), cfg)
    assert [d.compute_accuracy for d in rpc.gpus] == [MEASURED, MEASURED]
    assert [d.compute_accuracy for d in cuda.gpus] == [GPU_ESTIMATE, GPU_ESTIMATE]
    # op offload: the first GPU holds a host expert tensor the RPC device does not
    assert cuda.gpus[0].compute_bytes > rpc.gpus[0].compute_bytes + 100 * MiB
    assert accuracy(ComputeBackend.CPU, checked=False).estimated


def test_flash_attention_on_a_gpu_copies_a_quantized_cache_to_f16() -> None:
    """CUDA's flash attention allocates f16 copies of a quantized K and V inside its op
    (ggml-cuda/fattn.cu:722-756): one layer's n_kv x width x 2 B each, not on the CPU backend."""
    lay = layout("qwen3.6-35b-a3b")
    base = RunConfig(ctx_size=262144, ubatch=1024, batch=1024)
    f16 = estimate(lay, cuda_machine(48), base).gpus[0].compute_bytes
    q4 = estimate(lay, cuda_machine(48), replace(base, cache_type_k="q4_0", cache_type_v="q4_0"))
    assert q4.gpus[0].compute_bytes - f16 == 262144 * (512 + 512) * 2


@pytest.mark.parametrize("row", cuda_rows(), ids=lambda r: f"{r.id}-{r.buffer}")
def test_public_cuda_logs_within_15_percent(row: object) -> None:
    """qwen35moe's public CUDA logs (tests/data/cuda-logs.json): within 15% where the log gives
    the flags."""
    from cuda_logs import LogRow

    assert isinstance(row, LogRow)
    if row.flags_complete:
        assert abs(row.error) <= 0.15


# --- a backend's own compute traits (machine/backends ComputeTraits) -------------------------

LAVAPIPE_RANGE = 128 * MiB  # lavapipe's maxStorageBufferRange (tests/test_vulkan_oracle.py)


def gpu_machine(backend: str, n: int = 1, max_tensor: int | None = LAVAPIPE_RANGE) -> Machine:
    gpus = tuple(
        Gpu(index=i, name=f"GPU{i}", total_bytes=64 * GiB, free_bytes=64 * GiB, backend=backend,
            max_tensor_bytes=max_tensor)
        for i in range(n)
    )  # fmt: skip
    return Machine(gpus=gpus, host=Host(256 * GiB, 256 * GiB, 8))


def vulkan_partial_mib(name: str, ngl: int, ctx: int, kv: str = "f16", fa: str = "on") -> float:
    """Vulkan0's compute buffer (MiB) for a lavapipe oracle row under -ngl partial offload (the
    oracle's flags: tests/data/vulkan-oracle.json.gz, logits for the whole batch)."""
    cfg = RunConfig(ctx_size=ctx, n_gpu_layers=ngl, cache_type_k=kv, cache_type_v=kv,
                    flash_attn=fa, logits_rows="batch")  # fmt: skip
    return estimate(layout(name), gpu_machine("Vulkan"), cfg).gpus[0].compute_bytes / MiB


def within_oracle_bound(got: float, want: float) -> bool:
    """Within max(5%, 16 MiB) of llama.cpp's figure (MiB), the oracle's compute bound."""
    return abs(got - want) <= max(0.05 * want, 16)


def test_a_capped_backend_computes_logits_above_its_cap_on_the_host() -> None:
    """The Vulkan backend's supports_op refuses an op whose result is above the device's
    maxStorageBufferRange (ggml-vulkan.cpp:15307-15328): qwen3-8b's 297 MiB of logits at -ub 512
    are computed by the CPU backend, so they are in the host's buffer, not the device's (llama.cpp
    on lavapipe: 94.0 MiB on Vulkan0). CUDA's supports_op has no such cap."""
    lay = layout("qwen3-8b")
    cfg = RunConfig(ctx_size=4096, logits_rows="batch")
    logits = 151936 * 512 * 4
    vk = estimate(lay, gpu_machine("Vulkan"), cfg)
    assert vk.gpus[0].compute_bytes < 100 * MiB < logits <= vk.host.compute_bytes
    cu = estimate(lay, gpu_machine("CUDA"), cfg)
    assert cu.gpus[0].compute_bytes >= logits > cu.host.compute_bytes


def test_a_capped_backend_leaves_a_kq_matrix_above_its_cap_to_the_host() -> None:
    """-fa off at 32768: qwen3-8b's KQ (2 GiB a layer) is above lavapipe's range; the KQ matmul,
    softmax and KQV run on the host, the device keeps its layer's live set and gets the attention
    output back (llama.cpp: 96 MiB on Vulkan0, 2156+ MiB on the host)."""
    lay = layout("qwen3-8b")
    cfg = RunConfig(ctx_size=32768, flash_attn="off", logits_rows="batch")
    kq = 32768 * 512 * 32 * 4
    est = estimate(lay, gpu_machine("Vulkan"), cfg)
    assert abs(est.gpus[0].compute_bytes - 96 * MiB) <= 16 * MiB
    assert est.host.compute_bytes > kq
    # without the cap (a driver with 64-bit indexing) the device computes it
    uncapped = estimate(lay, gpu_machine("Vulkan", max_tensor=None), cfg)
    assert uncapped.gpus[0].compute_bytes > kq > uncapped.host.compute_bytes


def test_with_pipeline_parallelism_what_the_host_returns_is_copied_per_layer() -> None:
    """Two capped devices, every layer offloaded, -fa off: each layer's attention output comes
    back from the host as a split input, a leaf copied GGML_SCHED_MAX_COPIES = 4 times
    (ggml-backend.cpp:1379-1411): llama.cpp on lavapipe, llama-3.1-8b -ts 3,1 at 4096: Vulkan0
    956 MiB for 25 layers (not the 148 MiB with flash attention)."""
    lay = load(DATA / "llama-3.1-8b.json")[1]
    cfg = RunConfig(ctx_size=4096, flash_attn="off", logits_rows="batch", tensor_split=(3.0, 1.0))
    est = estimate(lay, gpu_machine("Vulkan", 2), cfg)
    first = est.gpus[0]
    e_attn = 512 * 4096 * 4
    assert sum(1 for s in first.layers if 0 <= s < 32) == 25
    assert 4 * 25 * e_attn <= first.compute_bytes
    assert abs(first.compute_bytes - 956 * MiB) <= 0.05 * 956 * MiB


def test_vulkan_flash_attention_dequantizes_the_cache_outside_the_compute_buffer() -> None:
    """CUDA converts a quantized K/V to f16 in the graph's allocation; the Vulkan backend into a
    prealloc scratch of its own (ggml-vulkan.cpp:8082-8100): the compute buffer does not grow."""
    lay = layout("qwen3.6-35b-a3b")
    base = RunConfig(ctx_size=262144, ubatch=1024, batch=1024)
    q4 = replace(base, cache_type_k="q4_0", cache_type_v="q4_0")

    def gpu0(backend: str, cfg: RunConfig) -> int:
        return estimate(lay, gpu_machine(backend, max_tensor=None), cfg).gpus[0].compute_bytes

    assert gpu0("Vulkan", q4) == gpu0("Vulkan", base)
    assert gpu0("CUDA", q4) - gpu0("CUDA", base) == 262144 * (512 + 512) * 2


def test_each_gpu_backend_carries_its_compute_traits_and_expected_error() -> None:
    from quantpick.machine.backends import BackendKind, all_backends

    traits = {b.kind: b.compute for b in all_backends()}
    assert traits[BackendKind.VULKAN].ops_capped and not traits[BackendKind.CUDA].ops_capped
    assert traits[BackendKind.ROCM] == traits[BackendKind.CUDA]  # ggml-cuda built for HIP
    assert all(t.offload_min_batch == 32 for t in traits.values())
    for kind, t in traits.items():
        assert kind is BackendKind.CPU or "ggml-" in t.source
    vk = estimate(layout("qwen3-8b"), gpu_machine("Vulkan"), RunConfig(ctx_size=4096))
    acc = vk.gpus[0].compute_accuracy
    assert acc.estimated and acc.relative == traits[BackendKind.VULKAN].expected_error
    assert "lavapipe" in acc.basis


def test_a_vulkan_device_running_host_layers_carries_the_offload_error() -> None:
    """-ngl partial offload: the device runs the host layers (one split per host weight, placed
    by the allocator's best fit: docs/compute.md); its figure carries the backend's op-offload
    expected error and its basis (lavapipe: 88/96 within max(5%, 16 MiB), worst 20%)."""
    from quantpick.machine.backends import BackendKind, backend

    vk = backend(BackendKind.VULKAN).compute
    lay = layout("qwen3-8b")
    partial = estimate(lay, gpu_machine("Vulkan"), RunConfig(ctx_size=4096, n_gpu_layers=18))
    full = estimate(lay, gpu_machine("Vulkan"), RunConfig(ctx_size=4096))
    assert partial.gpus[0].compute_accuracy.relative == vk.offload_expected_error == 0.25
    assert partial.gpus[0].compute_accuracy.basis == vk.offload_error_basis
    assert full.gpus[0].compute_accuracy.relative == vk.expected_error == 0.25
    assert full.gpus[0].compute_accuracy.basis == vk.error_basis != vk.offload_error_basis
    # below the offload batch nothing runs there by op offload
    small = estimate(
        lay, gpu_machine("Vulkan"), RunConfig(ctx_size=4096, n_gpu_layers=18, ubatch=16)
    )
    assert small.gpus[0].compute_accuracy.relative == vk.expected_error


def host_layer_graph(weight: int, kv: int, share: float | None) -> tuple[DeviceGraph, GraphShape]:
    shape = GraphShape(e=8 * MiB, ffn=28 * MiB, moe_mid=0, moe_out=0, logits=0, ubatch=512)
    dev = DeviceGraph(
        backend=ComputeBackend.GPU, is_host=False, holds_layers=True, holds_output=False,
        mask_f16=4 * MiB, mask_f32=8 * MiB, kq=0, flash_attn=True, offload_weight=weight,
        offload_weight_share=share, offload_kv=kv, offload_kv_e=9.5,
    )  # fmt: skip
    return dev, shape


@given(weight=st.integers(0, 512 * MiB), kv=st.integers(0, 512 * MiB), share=st.floats(0.0, 1.0))
def test_host_layers_are_phases_of_their_own_on_a_backend_that_says_so(
    weight: int, kv: int, share: float
) -> None:
    """-ngl partial offload on Vulkan (ComputeTraits.host_layer_weight_share): the host layers run
    on the device before its own layers, their weight and K/V copies freed after their one use
    (ggml-backend.cpp:1514-1531), so the device's figure is the largest of its layer, a host
    layer with its copied weight and a host layer's K and V: never their sum with its layer."""
    dev, shape = host_layer_graph(weight, kv, share)
    own = device_compute(replace(dev, offload_weight=0, offload_kv=0), shape, GENERIC)
    got = device_compute(dev, shape, GENERIC)
    e, mask = shape.e, dev.mask_f16
    assert got == int(max(own, own + share * weight, (kv + 9.5 * e + mask) if weight else 0))
    # the CUDA rule (share None) adds the copy to the layer's live set
    cuda, _ = host_layer_graph(max(weight, kv), 0, None)
    assert device_compute(cuda, shape, GENERIC) == own + max(weight, kv)


def test_a_vulkan_devices_host_layers_are_replayed_where_a_template_fits() -> None:
    """-ngl partial offload on lavapipe (tests/data/vulkan-oracle.json.gz, Vulkan0, -fa on): where
    the host layers fit a template of plan/host_layers.py, the device's figure is their replayed
    op sequence, llama.cpp's to 0.1 MiB (the fitted phases gave 196 MiB for qwen3-30b-a3b, 377
    and then 283.5 for mistral-small-24b, 204 for llama-3.1-8b with a q8_0 cache, 207.4 for
    qwen2.5-7b's q8_0 cache at 32768). plan/host_layers.py's own tests hold every row; this one
    holds the estimate's wiring: which layers are the host's, the device's cap and alignment."""
    cases = (
        ("qwen3-30b-a3b", 24, 4096, "f16", 168.0),
        ("mistral-small-24b", 20, 32768, "f16", 319.25),
        ("mistral-small-24b", 20, 4096, "q8_0", 267.31),
        ("llama-3.1-8b", 16, 32768, "q8_0", 166.06),
        ("qwen2.5-7b", 14, 4096, "f16", 183.44),
        ("qwen2.5-7b", 14, 32768, "q8_0", 234.52),
    )
    for name, ngl, ctx, kv, want in cases:
        got = vulkan_partial_mib(name, ngl, ctx, kv)
        assert abs(got - want) < 0.1, (name, ctx, kv, got, want)


@given(
    weight=st.integers(1, 256 * MiB),
    ffn=st.integers(1, 256 * MiB),
    fa=st.booleans(),
    elsewhere=st.booleans(),
    narrow=st.booleans(),
    plain=st.booleans(),
    moe=st.booleans(),
)
def test_a_host_layers_ffn_alone_starts_above_the_residual_stream(
    weight: int, ffn: int, fa: bool, elsewhere: bool, narrow: bool, plain: bool, moe: bool
) -> None:
    """-ngl partial offload on Vulkan without flash attention, the KQ refused by the device (the
    host runs a host layer's attention): no mask or K/V is copied in, and a host layer's gated
    FFN starts at 2E: 2E + the up weight's copy + the gate and up results, in place of the fitted
    share of the copy on top of a layer (only there: flash attention, a narrow attention, a
    recurrent host layer or routed experts keep the fitted phase)."""
    shape = GraphShape(e=8 * MiB, ffn=ffn, moe_mid=4 * MiB if moe else 0, moe_out=MiB,
                       logits=0, ubatch=512)  # fmt: skip
    dev = DeviceGraph(
        backend=ComputeBackend.GPU, is_host=False, holds_layers=True, holds_output=False,
        mask_f16=4 * MiB, mask_f32=8 * MiB, kq=0, flash_attn=fa, offload_weight=weight,
        offload_weight_share=0.75, offload_ffn_up=weight, offload_plain=plain,
        attn_elsewhere=elsewhere, attn_back=4 * MiB, attn_narrow=2 * MiB if narrow else 0,
    )  # fmt: skip
    alone = not fa and elsewhere and not narrow and plain and not moe
    assert host_ffn_alone(dev, shape) == alone
    got = device_compute(dev, shape, GENERIC)
    own = device_compute(replace(dev, offload_weight=0, offload_ffn_up=0), shape, GENERIC)
    mask = dev.mask_f16 if fa else dev.mask_f32
    e = shape.e
    gated = (2 * e + weight + 2 * ffn if weight >= ffn else 4 * e + weight + 3 * ffn) + mask
    attn = 4 * MiB + 2 * e + weight if elsewhere else 0  # the returned attention's phase
    if alone:
        assert got == int(max(own, gated, attn))
    else:
        # the fitted share of the copy on top of the layer's live set
        assert got >= int(layer_live(shape) + 0.75 * weight + mask)


def test_a_vulkan_host_layers_ffn_without_flash_attention_is_the_traced_one() -> None:
    """lavapipe (tests/data/vulkan-oracle.json.gz, Vulkan0, -fa off): a host layer's FFN lands on
    the residual stream and its norm, below the device's own layer (allocator trace of
    llama-3.1-8b -ngl 16: 103.5 MiB; the device's figure is its layer, 108 MiB). The fitted
    share of the copy on top of a layer gave 127.6 MiB (llama-3.1-8b) and 143.4 (gemma-4-e2b,
    28% over)."""
    cases = (
        ("llama-3.1-8b", 16, 4096, 108.0),
        ("llama-3.1-8b", 16, 32768, 108.0),
        ("gemma-4-e2b", 17, 32768, 111.6),
        ("qwen3-8b", 18, 4096, 99.0),
        ("ministral-3-8b", 17, 4096, 112.5),
    )
    for name, ngl, ctx, want in cases:
        got = vulkan_partial_mib(name, ngl, ctx, fa="off")
        assert within_oracle_bound(got, want), (name, ctx, got, want)
        assert got <= want + 5, (name, ctx, got, want)


def test_a_vulkan_device_with_no_layer_still_holds_a_host_layers_kv() -> None:
    """-ngl 0 on Vulkan: the device runs every host layer, its flash attention over the K and V
    it copies in; keeping the copied weight and K/V apart must not drop the K/V phase."""
    lay = layout("qwen3-8b")
    cfg = RunConfig(ctx_size=32768, n_gpu_layers=0, logits_rows="batch")
    vk = estimate(lay, gpu_machine("Vulkan"), cfg).gpus[0]
    kv = 32768 * (1024 + 1024) * 2  # one layer's f16 K and V
    assert vk.layers == () and vk.compute_bytes >= kv


def test_a_last_device_whose_head_runs_on_the_host_peaks_in_a_layer_over_its_inputs() -> None:
    """Pipeline parallelism, the last device's backend refused the head (Vulkan over its
    maxStorageBufferRange: the logits run on the host): its buffer is its inputs, each copied 4
    times -- the previous device's residual and the rms_norm of it (ggml-backend.cpp:1129-1148
    leaves the weightless norm there), the mask, its layers' slices of the per-layer token
    embeddings -- and a layer's live set above them, with no fitted term (an allocator trace
    of the lavapipe build: llama-3.1-8b -ts 3,1 Vulkan1 180.05 MiB)."""
    e, ffn, mask = 8 * MiB, 28 * MiB, 4 * MiB
    shape = GraphShape(e=e, ffn=ffn, moe_mid=0, moe_out=0, logits=250 * MiB, ubatch=512)
    dev = DeviceGraph(
        backend=ComputeBackend.GPU, is_host=False, holds_layers=True, holds_output=True,
        output_elsewhere=True, mask_f16=mask, mask_f32=2 * mask, kq=0, flash_attn=True,
        copies=4,
    )  # fmt: skip
    # llama.cpp's 180.05 MiB: 4 x (2E + mask) + 2E + 3 x the FFN (the .05 are the small inputs)
    assert device_compute(dev, shape, GENERIC) == 4 * (2 * e + mask) + 2 * e + 3 * ffn
    # the per-layer inputs: its layers' slices, not the model's whole width (gemma4.cpp:376)
    with_ple = replace(shape, per_layer=35 * MiB // 2)
    got = device_compute(replace(dev, layer_share=8 / 35), with_ple, GENERIC)
    assert got == device_compute(dev, shape, GENERIC) + 4 * 8 * MiB // 2
    # with the head on the device the fitted coefficients stay (the CPU/RPC projections)
    here = replace(dev, output_elsewhere=False)
    assert device_compute(here, shape, GENERIC) == int(
        4 * (e + mask) + max(2 * e + 3 * ffn, 250 * MiB + e) + GENERIC.pipeline_output * e
    )


def test_a_narrow_attentions_q_k_and_v_stay_below_the_ffn() -> None:
    """Flash attention whose output (n_head x head_dim_v) is narrower than the residual stream
    (gemma-3-27b: 32 x 128 < 5376): the output projection's E fits none of the blocks the
    attention freed, lands at the top of its Q, K and V, and the FFN above it (an allocator
    trace of the lavapipe build: 168.52 MiB, llama.cpp's; the generic rule 152.5). With
    pipeline parallelism the first device's fitted term carries it."""
    e, ffn, mask, qkv = 10.5 * MiB, 42 * MiB, 5.5 * MiB, 16 * MiB
    shape = GraphShape(e=int(e), ffn=ffn, moe_mid=0, moe_out=0, logits=512 * MiB, ubatch=512)
    dev = DeviceGraph(
        backend=ComputeBackend.GPU, is_host=False, holds_layers=True, holds_output=False,
        mask_f16=int(mask), mask_f32=int(2 * mask), kq=0, flash_attn=True, attn_narrow=qkv,
    )  # fmt: skip
    assert device_compute(dev, shape, GENERIC) == int(2 * e + 3 * ffn + mask + qkv)
    assert (
        device_compute(dev, shape, GENERIC)
        - device_compute(replace(dev, attn_narrow=0), shape, GENERIC)
        == qkv
    )
    first = replace(dev, copies=4)
    assert device_compute(first, shape, GENERIC) == device_compute(
        replace(first, attn_narrow=0), shape, GENERIC
    )


def test_only_a_backend_whose_traits_say_so_puts_the_ffn_above_a_narrow_attention() -> None:
    """The rule is measured on the Vulkan backend's lavapipe oracle only: a CUDA device keeps the
    generic layer (gemma-3-27b, one device, flash attention)."""
    lay = layout("gemma-3-27b")
    config = RunConfig(ctx_size=4096, flash_attn="on")
    vk = Machine(
        gpus=(Gpu(index=0, name="vk", total_bytes=64 * GiB, free_bytes=64 * GiB,
                  backend="Vulkan"),),
        host=Host(256 * GiB, 256 * GiB, 8),
    )  # fmt: skip
    cuda = estimate(lay, cuda_machine(64), config).devices[0].compute_bytes
    vulkan = estimate(lay, vk, config).devices[0].compute_bytes
    view = lay.view
    layer = next(x for x in view.layers if x.attends)
    qkv = 512 * (layer.n_head * layer.k_width // layer.n_head_kv + layer.k_width + layer.v_width)
    assert vulkan - cuda == qkv * 4


def test_without_flash_attention_the_v_caches_indices_are_an_input_of_each_device() -> None:
    """A transposed V cache (no flash attention) is written element by element: one I64 index per
    token and V element of each cache, n_ubatch x n_embd_v_gqa x 8 B (src/llama-kv-cache.cpp:
    1435-1439), alive beside the masks on the host and on every device writing that cache;
    with pipeline parallelism copied with the other inputs."""
    lay = layout("qwen3-8b")  # 8 KV heads x 128: 4 MiB at -ub 512
    off = RunConfig(ctx_size=4096, flash_attn="off")
    seen: list[DeviceGraph] = []
    import quantpick.plan.memory as memory

    real = memory.device_compute

    def spy(dev: DeviceGraph, shape: GraphShape, rule: object) -> int:
        seen.append(dev)
        return real(dev, shape, rule)  # type: ignore[arg-type]

    memory.device_compute = spy  # type: ignore[assignment]
    try:
        estimate(lay, rpc_machine(1), off)
        assert [d.v_idxs for d in seen] == [4 * MiB, 4 * MiB]
        seen.clear()
        estimate(lay, rpc_machine(1), replace(off, flash_attn="on"))
        assert [d.v_idxs for d in seen] == [0, 0]
    finally:
        memory.device_compute = real  # type: ignore[assignment]
    # in the layer phase they sit beside the masks
    shape = GraphShape(e=8 * MiB, ffn=28 * MiB, moe_mid=0, moe_out=0, logits=0, ubatch=512)
    dev = DeviceGraph(
        backend=ComputeBackend.CPU, is_host=False, holds_layers=True, holds_output=False,
        mask_f16=4 * MiB, mask_f32=8 * MiB, kq=0, flash_attn=False, attn_elsewhere=True,
    )  # fmt: skip
    with_idxs = device_compute(replace(dev, v_idxs=4 * MiB), shape, GENERIC)
    assert with_idxs - device_compute(dev, shape, GENERIC) == 4 * MiB


def test_an_ffn_without_a_gate_is_one_block() -> None:
    """An up projection and its activation (relu^2, gelu: unary ops) share one block -- the
    activation reuses its input in place (ggml_op_can_inplace, ggml-alloc.c:22-46) -- where a
    gated FFN keeps gate, up and their product: 2E + 1 x or 3 x the FFN's intermediate."""
    gated = GraphShape(e=8 * MiB, ffn=42 * MiB, moe_mid=0, moe_out=0, logits=0, ubatch=512)
    assert layer_live(gated) == 16 * MiB + 3 * 42 * MiB
    assert layer_live(replace(gated, ffn_gated=False)) == 16 * MiB + 42 * MiB
    assert not layout("nemotron-h-8b").ffn_gated
    assert all(layout(n).ffn_gated for n in ("qwen3-8b", "gemma-3-27b", "gpt-oss-20b"))
