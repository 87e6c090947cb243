"""A dense model that does not fit the GPUs gets a layer-offload plan (-ngl N): the most layers
the GPUs hold, the rest (and their KV) in host memory. A MoE model moves experts first."""

from __future__ import annotations

from dataclasses import replace

import pytest
from arch_configs import CONFIGS
from arch_fixtures import typed_tensors
from hypothesis import given, settings
from hypothesis import strategies as st

from quantpick.errors import NoFitError
from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.model.ggml import tensor_bytes
from quantpick.model.layout import synthesized_layouts
from quantpick.model.manifest import Manifest, ModelFile
from quantpick.plan.memory import estimate
from quantpick.plan.plan_types import Placement, PlanRequest
from quantpick.plan.planner import plan

GiB = 1024**3


def config(name: str):  # type: ignore[no-untyped-def]
    return next(c for c in CONFIGS if c.name == name)


def manifest_for(name: str, quants: tuple[str, ...] = ("Q4_K_M", "Q8_0")) -> Manifest:
    """A manifest of a real config, each quant's file as llama-quantize's types make it."""
    arch = config(name).architecture
    files = []
    for rank, quant in enumerate(quants, start=1):
        size = sum(tensor_bytes(t, ne) for _, ne, t in typed_tensors(arch, quant)) + 8 * 2**20
        files.append(ModelFile(f"{name}-{quant}.gguf", quant, size, True, quality_rank=rank))
    return Manifest(name, name, None, arch, (), tuple(files))


def box(*gpu_gib: float, ram_gib: float = 64, bandwidth: float = 900e9) -> Machine:
    gpus = tuple(
        Gpu(index=i, name=f"GPU{i}", total_bytes=int(g * GiB), free_bytes=int(g * GiB) - 2**28,
            bandwidth_bytes_per_s=int(bandwidth), fp16_tflops=70.0)
        for i, g in enumerate(gpu_gib)
    )  # fmt: skip
    ram = int(ram_gib * GiB)
    return Machine(
        gpus=gpus,
        host=Host(
            ram_total_bytes=ram,
            ram_available_bytes=ram - GiB,
            cpu_cores=8,
            ram_bandwidth_bytes_per_s=60_000_000_000,
        ),
    )


MISTRAL = manifest_for("mistral-small-24b")
MISTRAL_LAYOUTS = synthesized_layouts(MISTRAL)


def test_a_dense_model_too_big_for_the_gpu_offloads_whole_layers() -> None:
    request = PlanRequest(ctx_size=32768, quant="Q8_0", min_tps=0.1)
    p = plan(MISTRAL, box(16), MISTRAL_LAYOUTS, request)
    assert p.placement is Placement.LAYER_OFFLOAD
    ngl = p.config.n_gpu_layers
    assert ngl is not None and 0 < ngl < p.n_slots
    assert p.config.n_cpu_moe == 0  # no experts to move
    host = p.estimate.host
    assert host.layers == tuple(range(p.n_slots - ngl))  # the first layers, the output on the GPU
    assert host.kv_bytes > 0  # their KV lives with them
    # the most layers the GPU holds: one more overflows it
    more = estimate(MISTRAL_LAYOUTS["Q8_0"], box(16), replace(p.config, n_gpu_layers=ngl + 1))
    assert not more.gpus[0].fits


def test_the_why_line_and_the_flags_say_layers() -> None:
    p = plan(MISTRAL, box(16), MISTRAL_LAYOUTS, PlanRequest(ctx_size=32768, min_tps=0.1))
    if p.placement is Placement.LAYER_OFFLOAD:
        assert "layers partly in RAM" in p.why


def test_a_moe_model_moves_experts_before_layers() -> None:
    qwen3moe = manifest_for("qwen3-30b-a3b")
    layouts = synthesized_layouts(qwen3moe)
    p = plan(qwen3moe, box(12), layouts, PlanRequest(ctx_size=16384, quant="Q8_0", min_tps=0.1))
    assert p.placement is Placement.EXPERT_OFFLOAD
    assert p.config.n_cpu_moe > 0 and p.config.n_gpu_layers is None


def test_nothing_fits_when_the_host_cannot_take_the_rest() -> None:
    with pytest.raises(NoFitError):
        plan(MISTRAL, box(8, ram_gib=12), MISTRAL_LAYOUTS,
             PlanRequest(ctx_size=32768, quant="Q8_0", min_tps=0.1))  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    gpus=st.lists(st.floats(min_value=4, max_value=40), min_size=1, max_size=2),
    ram=st.floats(min_value=16, max_value=128),
    ctx=st.sampled_from([4096, 16384, 32768]),
)
def test_layer_offload_plans_fit_and_hold_the_most_layers(
    gpus: list[float], ram: float, ctx: int
) -> None:
    m = box(*gpus, ram_gib=ram)
    try:
        p = plan(MISTRAL, m, MISTRAL_LAYOUTS, PlanRequest(ctx_size=ctx, min_tps=0.1))
    except NoFitError:
        return
    assert p.estimate.fits
    if p.placement is Placement.LAYER_OFFLOAD and len(m.gpus) == 1:
        ngl = p.config.n_gpu_layers
        assert ngl is not None
        more = estimate(MISTRAL_LAYOUTS[p.quant], m, replace(p.config, n_gpu_layers=ngl + 1))
        assert not more.gpus[0].fits
