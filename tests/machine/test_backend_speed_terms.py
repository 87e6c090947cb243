"""Per-vendor decode terms of a backend (machine/backends: KernelPath, FixedCost): which weights a
decode path reads, how a device's weight mix slows its decode, and that the Vulkan and SYCL
terms reach the planner's speed figures for the GPUs of their vendor only."""

from __future__ import annotations

import dataclasses
import re
from functools import cache

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from quantpick.machine.backends import NO_TERMS, backend
from quantpick.machine.backends.base import (
    HALF_TYPES,
    KernelPath,
    Vendor,
    WeightPath,
    path_efficiency,
    resolve_path,
    vendor_of_name,
    weight_slowdown,
)
from quantpick.machine.catalog import CATALOG
from quantpick.machine.device_specs import describe_gpu
from quantpick.machine.spec import Host, Machine
from quantpick.model.layout import ModelLayout, synthesize_layout
from quantpick.model.registry import find_manifest
from quantpick.plan.memory import RunConfig, estimate
from quantpick.plan.speed import decode_seconds, device_speeds
from quantpick.plan.speed_work import speed_work

GiB = 1024**3
TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_K", "Q6_K", "Q8_0", "MXFP4", "IQ4_XS")
MANIFEST = find_manifest("qwen3.6-35b-a3b-unsloth")


@cache
def layout_of(quant: str) -> ModelLayout:
    size = sum(f.size_bytes for f in MANIFEST.quant_files(quant))
    return synthesize_layout(MANIFEST.architecture, quant, size)


def machine(gpu: str, backend_name: str) -> Machine:
    host = Host(128 * GiB, 128 * GiB, 8, ram_bandwidth_bytes_per_s=int(60e9))
    card = describe_gpu(gpu, backend_name=backend_name)
    return Machine(gpus=(card,), host=host, described=True, source="test")


def test_every_catalogue_gpu_names_its_vendor() -> None:
    """The vendor a decode term applies to is read from the GPU's name: every catalogue entry's
    name gives its own vendor, and Vulkan's device descriptions give theirs."""
    for model in CATALOG:
        assert vendor_of_name(model.name) is model.vendor, model.key
    assert vendor_of_name("Intel(R) Graphics (BMG G31)") is Vendor.INTEL
    assert vendor_of_name("AMD Radeon 8060S Graphics (RADV GFX1151)") is Vendor.AMD
    assert vendor_of_name("llvmpipe (LLVM 15.0.6, 256 bits)") is None


paths_st = st.lists(
    st.builds(
        KernelPath,
        st.sampled_from([Vendor.INTEL, None]),
        st.frozensets(st.sampled_from(TYPES), max_size=3),
        st.floats(0.05, 1.5),
        st.sampled_from(list(WeightPath)),
    ),
    max_size=4,
).map(tuple)


@given(paths_st, st.sampled_from(TYPES), st.booleans())
@example(  # Vulkan on Intel: the F16/BF16 mat-vec path, then BF16 experts' matrix path
    (
        KernelPath(Vendor.INTEL, HALF_TYPES, 0.86),
        KernelPath(None, frozenset({"BF16"}), 0.14, WeightPath.EXPERTS),
    ),
    "BF16",
    True,
)
def test_a_weight_takes_the_path_that_names_its_type(
    paths: tuple[KernelPath, ...], ggml_type: str, expert: bool
) -> None:
    """A path naming the type wins over one for every quantized type, and among those one for
    routed experts (or dense weights) only over one for both; a path for every quantized type
    never reads F32/F16/BF16; an experts path never reads a dense weight and a dense path never
    an expert; no path: 1.0."""
    chosen = resolve_path(paths, ggml_type, expert)
    if chosen is None:
        assert path_efficiency(paths, ggml_type, expert) == 1.0
        assert not any(p.reads(ggml_type, expert) for p in paths)
        return
    assert chosen.reads(ggml_type, expert)
    if any(p.types and p.reads(ggml_type, expert) for p in paths):
        assert ggml_type in chosen.types
    if any(
        p.types and p.weights is not WeightPath.ANY and p.reads(ggml_type, expert) for p in paths
    ):
        assert chosen.weights is not WeightPath.ANY  # the op (MUL_MAT_ID or not) picks first
    if not chosen.types:
        assert ggml_type not in HALF_TYPES | {"F32"}
    if chosen.weights is WeightPath.EXPERTS:
        assert expert
    if chosen.weights is WeightPath.DENSE:
        assert not expert
    assert path_efficiency(paths, ggml_type, expert) == chosen.efficiency


mix_st = st.lists(
    st.tuples(st.sampled_from(TYPES), st.booleans(), st.integers(1, 10**10)), min_size=1
).map(tuple)


@given(paths_st, mix_st)
def test_the_slowdown_lies_between_the_slowest_and_fastest_path_read(
    paths: tuple[KernelPath, ...], mix: tuple[tuple[str, bool, int], ...]
) -> None:
    """A device's decode slowdown is the byte-weighted mean of 1 / efficiency over the paths
    its weights take: between the extremes it reads, and 1.0 where no path differs."""
    effs = [path_efficiency(paths, t, e) for t, e, _ in mix]
    slow = weight_slowdown(paths, mix)
    assert 1 / max(effs) * (1 - 1e-9) <= slow <= 1 / min(effs) * (1 + 1e-9)
    assert weight_slowdown((), mix) == 1.0


def test_the_type_mix_covers_the_decoded_weights() -> None:
    """decode_type_bytes splits exactly the weights decode_bytes counts (plus nothing): the
    routed experts at the share a token reads, by type; the recurrent state is the rest."""
    layout = layout_of("UD-Q4_K_XL")
    m = machine("4090", "cuda")
    est = estimate(layout, m, RunConfig(ctx_size=8192))
    work = speed_work(layout, est)
    view = layout.view
    for w in work.devices:
        if not w.slots:
            continue
        typed = sum(n for _, _, n in w.decode_type_bytes)
        state = w.decode_bytes - typed
        recurrent = sum(1 for layer in view.layers if layer.recurrent)
        assert 0 <= state <= 2 * recurrent * view.state_bytes_per_row + len(w.decode_type_bytes)
        assert {t for t, _, _ in w.decode_type_bytes} >= {"Q4_K"}
        assert any(e for _, e, _ in w.decode_type_bytes)


def test_vulkan_intel_terms_reach_intel_gpus_only() -> None:
    """On an Arc Pro B70 under Vulkan the device carries the Intel paths and fixed-cost factor
    (ggml-vulkan.cpp's MMVQ and fusion rules for Intel) beside the paths for every vendor, and
    they slow its decode; an NVIDIA card under Vulkan carries only the paths for every vendor,
    which leave a quantized file's decode as it was."""
    vulkan = backend("vulkan")
    layout = layout_of("UD-Q4_K_XL")
    for gpu, vendor in (("b70", Vendor.INTEL), ("4090", Vendor.NVIDIA)):
        m = machine(gpu, "vulkan")
        dev = device_speeds(m)["Vulkan0"]
        mine = tuple(p for p in vulkan.decode_paths if p.vendor in (vendor, None))
        assert dev.terms.paths == mine
        assert all(p.on(vendor) for p in mine)
        est = estimate(layout, m, RunConfig(ctx_size=8192))
        work = speed_work(layout, est)
        plain = {k: dataclasses.replace(d, terms=NO_TERMS) for k, d in device_speeds(m).items()}
        with_terms = decode_seconds(work, device_speeds(m), 0, server=False)
        without = decode_seconds(work, plain, 0, server=False)
        if vendor is Vendor.INTEL:
            assert dev.terms.fixed_factor > 1.0
            assert with_terms > 1.5 * without
        else:
            assert dev.terms.fixed_factor == 1.0 and with_terms == without


@cache
def decode_case(gpu: str, backend_name: str):  # type: ignore[no-untyped-def]
    """The bundled model's UD-Q4_K_XL at -c 8192 on a described GPU: its work and devices."""
    m = machine(gpu, backend_name)
    layout = layout_of("UD-Q4_K_XL")
    return speed_work(layout, estimate(layout, m, RunConfig(ctx_size=8192))), device_speeds(m)


@given(st.floats(min_value=1.0, max_value=200.0))
def test_apples_fixed_cost_is_the_same_on_every_apple_gpu(tflops: float) -> None:
    """Metal's Apple fixed cost is not scaled by the chip's throughput (FixedCost.throughput_scaled
    off: ggml-metal encodes each dispatch from the host): a decode at an empty cache takes as
    long on an M4 Pro whatever its FP16 figure; the same device under the CUDA rule (scaled
    terms) decodes faster the more TFLOPS it has."""
    work, devs = decode_case("m4-pro", "metal")
    dev = devs["MTL0"]
    assert not dev.terms.fixed_scaled and dev.terms.fixed_factor > 1.0
    faster = {**devs, "MTL0": dataclasses.replace(dev, fp16_tflops=dev.fp16_tflops * 8)}
    other = {**devs, "MTL0": dataclasses.replace(dev, fp16_tflops=tflops)}
    base = decode_seconds(work, devs, 0, server=False)
    assert decode_seconds(work, other, 0, server=False) == pytest.approx(base, rel=1e-12)
    scaled = dataclasses.replace(dev.terms, fixed_scaled=True)
    cuda_rule = {**devs, "MTL0": dataclasses.replace(dev, terms=scaled)}
    cuda_faster = {**faster, "MTL0": dataclasses.replace(faster["MTL0"], terms=scaled)}
    assert decode_seconds(work, cuda_faster, 0, server=False) < decode_seconds(
        work, cuda_rule, 0, server=False
    )


def test_metal_terms_reach_apple_gpus_only() -> None:
    """The Apple fixed-cost term rides on Apple GPUs under Metal (an M2 Ultra and an M4 Pro
    carry the same factor, unscaled); besides it only Vulkan's Intel term is unscaled (an Arc
    Pro B70 and an Arc B390 carry the same factor): an NVIDIA or AMD card under CUDA, ROCm or
    Vulkan carries a scaled one."""
    metal = backend("metal")
    (term,) = metal.decode_fixed
    for gpu in ("m4-pro", "m2-ultra", "m1"):
        dev = device_speeds(machine(gpu, "metal"))["MTL0"]
        assert (dev.terms.fixed_factor, dev.terms.fixed_scaled) == (term.factor, False)
    (intel,) = backend("vulkan").decode_fixed
    for gpu in ("b70", "arc-b390", "arc-140v"):
        dev = device_speeds(machine(gpu, "vulkan"))["Vulkan0"]
        assert (dev.terms.fixed_factor, dev.terms.fixed_scaled) == (intel.factor, False)
    for gpu, name in (("4090", "cuda"), ("4090", "vulkan"), ("7900xtx", "rocm")):
        for dev in device_speeds(machine(gpu, name)).values():
            assert dev.terms.fixed_scaled
    for dev in device_speeds(machine("7900xtx", "vulkan")).values():
        assert dev.terms.fixed_scaled


@given(st.floats(min_value=1.0, max_value=400.0))
def test_intels_vulkan_fixed_cost_is_the_same_on_every_intel_gpu(tflops: float) -> None:
    """Vulkan's Intel fixed cost is not scaled by the GPU's throughput (FixedCost.throughput_scaled
    off: the backend splits an Intel GPU's layers into more dispatches, ggml-vulkan.cpp:4901-4903
    and :3784, and a dispatch's cost does not shrink with more Xe cores; published B390 and B70
    runs spend about the same time a layer beyond their bytes): an Arc Pro B70's decode takes as
    long whatever its FP16 figure, where under the CUDA rule (scaled) it would shorten with more
    TFLOPS."""
    work, devs = decode_case("b70", "vulkan")
    dev = devs["Vulkan0"]
    assert not dev.terms.fixed_scaled and dev.terms.fixed_factor > 1.0
    other = {**devs, "Vulkan0": dataclasses.replace(dev, fp16_tflops=tflops)}
    base = decode_seconds(work, devs, 0, server=False)
    assert decode_seconds(work, other, 0, server=False) == pytest.approx(base, rel=1e-12)
    scaled = dataclasses.replace(dev.terms, fixed_scaled=True)
    cuda_rule = {**devs, "Vulkan0": dataclasses.replace(dev, terms=scaled)}
    faster = dataclasses.replace(dev, fp16_tflops=dev.fp16_tflops * 8, terms=scaled)
    assert decode_seconds(work, {**devs, "Vulkan0": faster}, 0, server=False) < decode_seconds(
        work, cuda_rule, 0, server=False
    )


@pytest.mark.parametrize("gpu", ["7900xtx", "4090", "b70", "arc-b390", "m4-pro"])
def test_vulkans_bf16_expert_path_is_taken_on_every_gpu(gpu: str) -> None:
    """BF16 routed experts go through Vulkan's matrix kernel at decode on every device
    (ggml_vk_use_mul_mat_vec_id takes F32/F16/quantized experts only, ggml-vulkan.cpp:7904-7909):
    the term rides on an AMD, NVIDIA, Intel or Apple GPU alike, wins on Intel over the Intel
    F16/BF16 mat-vec path (which reads dense BF16), and spares files whose experts are
    quantized."""
    vulkan = backend("vulkan")
    (experts,) = [p for p in vulkan.decode_paths if p.weights is WeightPath.EXPERTS]
    assert experts.vendor is None and experts.types == frozenset({"BF16"})
    m = machine(gpu, "vulkan")
    dev = device_speeds(m)["Vulkan0"]
    assert experts in dev.terms.paths
    assert resolve_path(dev.terms.paths, "BF16", True) is experts
    assert resolve_path(dev.terms.paths, "BF16", False) is not experts
    layout = layout_of("UD-Q4_K_XL")
    work = speed_work(layout, estimate(layout, m, RunConfig(ctx_size=8192)))
    for w in work.devices:
        assert weight_slowdown(dev.terms.paths, w.decode_type_bytes) == 1.0
    assert weight_slowdown(dev.terms.paths, (("BF16", True, 100),)) > 5.0
    dense = weight_slowdown(dev.terms.paths, (("BF16", False, 100),))
    assert dense == pytest.approx(1 / path_efficiency(dev.terms.paths, "BF16", False))
    assert dense < 1.5


def test_every_decode_term_names_its_source_and_basis() -> None:
    """A fitted number names its data and error: each path and fixed cost of every backend
    cites llama.cpp lines and the runs it is fitted to."""
    from quantpick.machine.backends import all_backends

    for b in all_backends():
        for term in (*b.decode_paths, *b.decode_fixed):
            cites = re.search(r"\.(cpp|m|cu):\d", term.source)  # ggml-metal's are .m
            assert cites and "runs" in term.basis, (b.label, term)
        if b.decode_paths or b.decode_fixed:
            assert "fitted" in b.efficiency_source
