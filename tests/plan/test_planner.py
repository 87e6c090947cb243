"""The planner: the seed guide, the reference box, and properties that hold for every machine."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantpick.errors import NoFitError, UsageError
from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.model.layout import ModelLayout, synthesize_layout
from quantpick.model.manifest import Manifest
from quantpick.model.registry import find_manifest
from quantpick.plan.build_class import CONSERVATIVE, compute_rule
from quantpick.plan.memory import RunConfig, estimate
from quantpick.plan.planner import PlanRequest, max_context, plan

GiB = 1024**3
GB = 10**9

MANIFEST: Manifest = find_manifest("qwen3.8-35b-a3b-distill")


@cache
def layout_of(quant: str) -> ModelLayout:
    size = sum(f.size_bytes for f in MANIFEST.quant_files(quant))
    return synthesize_layout(MANIFEST.architecture, quant, size)


def gpu(index: int, gib: float, bandwidth_gbs: float = 900, name: str | None = None) -> Gpu:
    total = int(gib * GiB)
    return Gpu(
        index=index,
        name=name or f"GPU{index}",
        total_bytes=total,
        free_bytes=total,
        bandwidth_bytes_per_s=int(bandwidth_gbs * GB),
    )


def machine(*gpus: Gpu, ram_gib: float = 64, ram_bw_gbs: float = 50) -> Machine:
    ram = int(ram_gib * GiB)
    return Machine(
        gpus=tuple(gpus),
        host=Host(ram, ram, 8, ram_bandwidth_bytes_per_s=int(ram_bw_gbs * GB)),
        described=True,
        source="test",
    )


RANK = {q: i for i, q in enumerate(reversed(MANIFEST.quants))}  # higher = better


# ---- the second seed's hardware guide (low context: -c 4096, one slot) ------------------------


@pytest.mark.parametrize(
    ("vram_gib", "expected"),
    [(16, {"IQ2_M", "Q2_K"}), (24, {"IQ4_XS", "Q4_K_M"}), (48, {"Q8_0"}), (80, {"BF16"})],
)
def test_guide_one_gpu_vram_only(vram_gib: int, expected: set[str]) -> None:
    """The card's VRAM guide: everything on one GPU (no expert offload), -c 4096."""
    p = plan(
        MANIFEST,
        machine(gpu(0, vram_gib)),
        layout_of,
        PlanRequest(ctx_size=4096, allow_offload=False),
    )
    assert p.quant in expected
    assert p.placement == "gpu"


@pytest.mark.parametrize(
    ("ram_gib", "expected"), [(16, {"IQ2_M", "Q2_K"}), (24, {"IQ4_XS", "Q4_K_M"}), (48, {"Q8_0"})]
)
def test_guide_cpu_only_ram(ram_gib: int, expected: set[str]) -> None:
    """The card's RAM guide for CPU inference (16 / 24-32 / 48-64 GB), -c 4096."""
    p = plan(MANIFEST, machine(ram_gib=ram_gib), layout_of, PlanRequest(ctx_size=4096))
    assert p.quant in expected
    assert p.placement == "cpu"


# ---- the reference box: RTX 3090 + Tesla T4 at 262144 --------------------------------------


def reference_box(ram_gib: float = 64) -> Machine:
    return machine(
        gpu(0, 24, 936, "NVIDIA GeForce RTX 3090"), gpu(1, 15, 320, "Tesla T4"), ram_gib=ram_gib
    )


# The pinned tree's llama-server (b11312): logits for a few rows (plan/build_class.py).
CURRENT_TREE = compute_rule("0.5.0-dev", 11312, "0c1e57098")


def test_reference_box_full_gpu_plan_uses_both_cards() -> None:
    p = plan(
        MANIFEST,
        reference_box(),
        layout_of,
        PlanRequest(ctx_size=262144, prefer="speed", compute_rule=CURRENT_TREE),
    )
    assert p.compute_rule == CURRENT_TREE
    assert (p.quant, p.placement, p.config.cache_type_k) == ("Q6_K", "gpu", "f16")
    cuda0, cuda1, host = p.estimate.devices
    assert cuda0.layers and cuda1.layers  # both cards hold layers
    # bandwidth-aware: the 3x faster 3090 takes as many layers as fit; the T4 keeps headroom
    # (one more slot on the 3090 overflows its 23 GiB budget by the next layer's ~0.7 GiB)
    assert p.config.tensor_split == (27.0, 15.0)
    assert len(cuda0.attention_layers) == 6 and len(cuda1.attention_layers) == 4
    assert cuda0.kv_bytes == 6 * 262144 * 2048 and cuda1.kv_bytes == 4 * 262144 * 2048
    assert all(d.total_bytes <= d.budget_bytes for d in p.estimate.devices)
    assert cuda0.headroom_bytes < 1.2 * GiB
    assert 190 < p.speed.tokens_per_s_empty < 200
    assert 60 < p.speed.tokens_per_s_target < 70  # KV reads dominate at 256K


def test_an_older_or_unknown_build_reserves_whole_ubatch_logits_and_plans_smaller() -> None:
    """Before PR #23861 llama-server reserved 485 MiB of logits at -ub 512 (and the f32 FA mask):
    on the reference box that costs the Q6_K full-GPU plan; the unknown build gets the same."""
    old = compute_rule(None, 9000, "abc1234")
    for rule in (old, CONSERVATIVE):
        p = plan(
            MANIFEST,
            reference_box(),
            layout_of,
            PlanRequest(ctx_size=262144, prefer="speed", compute_rule=rule),
        )
        assert p.compute_rule == rule
        assert (p.quant, p.config.logits_rows, p.config.fa_mask_f32) == ("Q5_K_M", "batch", True)


def test_reference_box_quality_policy_offloads_experts_of_q8() -> None:
    p = plan(MANIFEST, reference_box(ram_gib=32), layout_of, PlanRequest(ctx_size=262144))
    assert p.quant == "Q8_0" and p.placement == "expert-offload"
    assert p.config.n_cpu_moe > 0
    assert p.estimate.host.expert_layers == tuple(range(p.config.n_cpu_moe))
    assert p.speed.tokens_per_s_target >= 10
    assert all(d.fits for d in p.estimate.devices)
    reasons = {(c.quant, c.cache_type): c.reason for c in p.candidates}
    assert reasons[("BF16", "f16")].startswith("too big by")
    # with 64 GiB of RAM even BF16 fits with its experts in host memory, above the speed floor
    p = plan(MANIFEST, reference_box(ram_gib=64), layout_of, PlanRequest(ctx_size=262144))
    assert p.quant == "BF16" and p.placement == "expert-offload"
    assert p.speed.tokens_per_s_target >= 10


def test_nothing_fits_exit_3_names_the_shortfall() -> None:
    with pytest.raises(NoFitError) as info:
        plan(MANIFEST, machine(gpu(0, 4), ram_gib=8), layout_of, PlanRequest(ctx_size=262144))
    assert info.value.exit_code == 3
    assert "GiB over budget on" in info.value.message and "IQ2_M" in info.value.message


def test_min_tps_floor_rejects_slow_offload() -> None:
    slow = machine(gpu(0, 8), ram_gib=128, ram_bw_gbs=5)
    with pytest.raises(NoFitError, match="min-tps"):
        plan(MANIFEST, slow, layout_of, PlanRequest(ctx_size=32768, min_tps=50))


def test_fixed_quant_and_vision() -> None:
    p = plan(
        MANIFEST,
        reference_box(),
        layout_of,
        PlanRequest(ctx_size=65536, quant="q4_k_m", vision=True),
    )
    assert p.quant == "Q4_K_M" and p.projector is not None
    assert p.estimate.devices[0].projector_bytes >= p.projector.size_bytes
    with pytest.raises(UsageError):
        plan(MANIFEST, reference_box(), layout_of, PlanRequest(ctx_size=4096, quant="Q7_K"))
    with pytest.raises(UsageError):
        plan(MANIFEST, reference_box(), layout_of, PlanRequest(ctx_size=300000))


def test_max_context_per_quant() -> None:
    limits = {
        lim.quant: lim
        for lim in max_context(
            MANIFEST,
            machine(gpu(0, 24, 936)),
            layout_of,
            PlanRequest(ctx_size=0, allow_offload=False),
        )
    }
    assert limits["BF16"].max_context == 0
    assert limits["IQ2_M"].max_context == 262144
    q4 = limits["Q4_K_M"].max_context
    assert 0 < q4 < 262144 and q4 % 256 == 0
    # the limit is tight: it fits there and not 256 tokens later
    plan(
        MANIFEST,
        machine(gpu(0, 24, 936)),
        layout_of,
        PlanRequest(ctx_size=q4, quant="Q4_K_M", allow_offload=False),
    )
    with pytest.raises(NoFitError):
        plan(
            MANIFEST,
            machine(gpu(0, 24, 936)),
            layout_of,
            PlanRequest(ctx_size=q4 + 256, quant="Q4_K_M", allow_offload=False),
        )


# ---- properties ---------------------------------------------------------------------------

gib_sizes = st.integers(min_value=4, max_value=96)
bandwidths = st.sampled_from([192, 320, 448, 936, 1008, 2039])
contexts = st.integers(min_value=16, max_value=1024).map(lambda k: k * 256)


@st.composite
def machines(draw: st.DrawFn) -> Machine:
    n = draw(st.integers(min_value=0, max_value=2))
    gpus = [gpu(i, draw(gib_sizes), draw(bandwidths)) for i in range(n)]
    return machine(
        *gpus,
        ram_gib=draw(st.integers(min_value=8, max_value=160)),
        ram_bw_gbs=draw(st.sampled_from([25, 50, 90])),
    )


def pick_or_none(m: Machine, request: PlanRequest) -> object:
    try:
        return plan(MANIFEST, m, layout_of, request)
    except NoFitError:
        return None


def rank_of(p: object) -> int:
    return -1 if p is None else RANK[p.quant]  # type: ignore[attr-defined]


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(m=machines(), ctx=contexts, prefer=st.sampled_from(["quality", "speed"]))
def test_no_plan_exceeds_any_budget(m: Machine, ctx: int, prefer: str) -> None:
    p = pick_or_none(m, PlanRequest(ctx_size=ctx, prefer=prefer))
    if p is not None:
        # recompute from the plan's own flags: what llama.cpp would be given
        est = estimate(layout_of(p.quant), m, p.config, projector_bytes=0)  # type: ignore[attr-defined]
        assert all(d.total_bytes <= d.budget_bytes for d in est.devices)


@SETTINGS
@given(m=machines(), ctx=contexts, which=st.integers(0, 2), extra=st.integers(1, 64))
def test_more_memory_never_lowers_the_pick(m: Machine, ctx: int, which: int, extra: int) -> None:
    request = PlanRequest(ctx_size=ctx)
    before = rank_of(pick_or_none(m, request))
    if which < len(m.gpus):
        g = m.gpus[which]
        bigger = Gpu(
            g.index,
            g.name,
            g.total_bytes + extra * GiB,
            g.free_bytes + extra * GiB,
            bandwidth_bytes_per_s=g.bandwidth_bytes_per_s,
        )
        gpus = list(m.gpus)
        gpus[which] = bigger
        more = Machine(gpus=tuple(gpus), host=m.host)
    else:
        h = m.host
        more = Machine(
            gpus=m.gpus,
            host=Host(
                h.ram_total_bytes + extra * GiB,
                h.ram_available_bytes + extra * GiB,
                h.cpu_cores,
                ram_bandwidth_bytes_per_s=h.ram_bandwidth_bytes_per_s,
            ),
        )
    assert rank_of(pick_or_none(more, request)) >= before


@SETTINGS
@given(m=machines(), ctx=contexts, longer=st.integers(1, 512))
def test_longer_context_never_raises_the_pick(m: Machine, ctx: int, longer: int) -> None:
    longer_ctx = min(ctx + longer * 256, 262144)
    short = rank_of(pick_or_none(m, PlanRequest(ctx_size=ctx)))
    long_ = rank_of(pick_or_none(m, PlanRequest(ctx_size=longer_ctx)))
    assert long_ <= short


@SETTINGS
@given(
    m=machines(),
    ctx=contexts,
    np_=st.integers(1, 8),
    unified=st.booleans(),
    quant=st.sampled_from(MANIFEST.quants),
)
def test_q8_0_kv_never_costs_more_than_f16(
    m: Machine, ctx: int, np_: int, unified: bool, quant: str
) -> None:
    base = RunConfig(ctx_size=ctx, n_parallel=np_, kv_unified=unified)
    f16 = estimate(layout_of(quant), m, base)
    q8 = estimate(
        layout_of(quant),
        m,
        RunConfig(
            ctx_size=ctx,
            n_parallel=np_,
            kv_unified=unified,
            cache_type_k="q8_0",
            cache_type_v="q8_0",
        ),
    )
    for a, b in zip(q8.devices, f16.devices, strict=True):
        assert a.kv_bytes <= b.kv_bytes
    assert sum(d.kv_bytes for d in q8.devices) < sum(d.kv_bytes for d in f16.devices)


def test_a_failed_gpu_is_left_out_by_name() -> None:
    broken = Gpu(index=1, name="GPU1", total_bytes=24 * GiB, free_bytes=0, error="Unknown Error")
    m = machine(gpu(0, 24, 936), broken, gpu(2, 16, 320))
    p = plan(MANIFEST, m, layout_of, PlanRequest(ctx_size=32768, prefer="speed"))
    assert p.config.devices == (0, 2)
    assert [d.device for d in p.estimate.gpus] == ["CUDA0", "CUDA2"]
