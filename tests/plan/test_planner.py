"""The planner: the seed guide, the reference box, and properties that hold for every machine."""

from __future__ import annotations

import os
from dataclasses import replace
from functools import cache

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from quantpick.errors import NoFitError, UsageError
from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.model.layout import ModelLayout, synthesize_layout
from quantpick.model.manifest import Manifest
from quantpick.model.registry import find_manifest
from quantpick.plan import placement, planner, policy
from quantpick.plan.build_class import PINNED, compute_rule
from quantpick.plan.memory import Overheads, RunConfig, estimate
from quantpick.plan.plan_types import Candidate, Plan, PlanRequest, expected_tps
from quantpick.plan.planner import max_context, plan
from quantpick.plan.policy import SPEED_FLOOR_TIER, SPEED_TIE, balanced_key

GiB = 1024**3
GB = 10**9

MANIFEST: Manifest = find_manifest("qwen3.8-35b-a3b-distill")


@cache
def layout_of(quant: str) -> ModelLayout:
    size = sum(f.size_bytes for f in MANIFEST.quant_files(quant))
    return synthesize_layout(MANIFEST.architecture, quant, size)


LAYOUTS = {q: layout_of(q) for q in MANIFEST.quants}


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


# ---- the card's hardware guide (seed 004; low context: -c 4096, one slot) --------------------


@pytest.mark.parametrize(
    ("vram_gib", "expected"),
    [(16, {"IQ2_M", "Q2_K"}), (24, {"IQ4_XS", "Q4_K_M"}), (48, {"Q8_0"})],
)
def test_guide_one_gpu_vram_only(vram_gib: int, expected: set[str]) -> None:
    """The card's VRAM guide: everything on one GPU (no expert offload), -c 4096."""
    p = plan(
        MANIFEST,
        machine(gpu(0, vram_gib)),
        LAYOUTS,
        PlanRequest(ctx_size=4096, allow_offload=False),
    )
    assert p.quant in expected
    assert p.placement == "gpu"


def test_bf16_only_when_asked() -> None:
    """80 GB: the card lists BF16 as a reference, "not for daily use": never the default pick."""
    big = machine(gpu(0, 80, 2039))
    assert plan(MANIFEST, big, LAYOUTS, PlanRequest(ctx_size=4096)).quant == "Q8_0"
    p = plan(MANIFEST, big, LAYOUTS, PlanRequest(ctx_size=4096, prefer="quality"))
    assert p.quant == "BF16"
    default = plan(MANIFEST, big, LAYOUTS, PlanRequest(ctx_size=4096))
    reasons = {c.quant: c.reason for c in default.candidates}
    assert "not for daily use" in reasons["BF16"]


@pytest.mark.parametrize(
    ("ram_gib", "expected"),
    [(32, {"IQ4_XS", "Q4_K_M"}), (48, {"Q5_K_M", "Q6_K"}), (64, {"Q6_K", "Q8_0"})],
)
def test_guide_cpu_only_ram(ram_gib: int, expected: set[str]) -> None:
    """The card's RAM guide for CPU inference, on a desktop (8 cores, dual-channel ~50 GB/s)."""
    p = plan(MANIFEST, machine(ram_gib=ram_gib), LAYOUTS, PlanRequest(ctx_size=4096))
    assert p.quant in expected
    assert p.placement == "cpu"
    # a described desktop keeps a quarter of its RAM for the OS, a desktop session and the cache
    assert p.estimate.host.budget_bytes == int(0.75 * ram_gib * GiB)


# ---- the reference box: RTX 3090 + Tesla T4 at 262144 --------------------------------------


def reference_box(ram_gib: float = 64) -> Machine:
    return machine(
        gpu(0, 24, 936, "NVIDIA GeForce RTX 3090"), gpu(1, 15, 320, "Tesla T4"), ram_gib=ram_gib
    )


# The pinned tree's llama-server (b11312): logits for a few rows (plan/build_class.py).
CURRENT_TREE = compute_rule("0.5.0-dev", 11312, "0c1e57098")


def test_reference_box_fully_on_both_cards_at_q5_or_better() -> None:
    p = plan(MANIFEST, reference_box(), LAYOUTS, PlanRequest(ctx_size=262144))
    assert p.quant in {"Q5_K_M", "Q6_K", "Q8_0"} and p.placement == "gpu"
    cuda0, cuda1, host = p.estimate.devices
    assert cuda0.layers and cuda1.layers  # both cards hold layers
    assert all(d.total_bytes <= d.budget_bytes for d in p.estimate.devices)
    assert p.quality is not None and p.quality.tier == 0
    # the explanation names what it was preferred to and why
    assert "Q8_0 would need experts in RAM" in p.why
    # the expected figure is well under the bandwidth bound, and both are reported
    assert 0 < p.speed.expected.decode_tps_target < p.speed.tokens_per_s_target
    assert p.speed.expected.decode_tps_empty > p.speed.expected.decode_tps_target


def test_reference_box_at_32k_takes_q8_fully_on_the_cards() -> None:
    # with the installed build known (a current llama-server reserves a few logits rows)
    request = PlanRequest(ctx_size=32768, compute_rule=CURRENT_TREE)
    p = plan(MANIFEST, reference_box(), LAYOUTS, request)
    assert (p.quant, p.placement) == ("Q8_0", "gpu")


def test_two_4090s_keep_q8_in_vram_instead_of_bf16_with_offload() -> None:
    m = machine(gpu(0, 24, 1008), gpu(1, 24, 1008), ram_gib=64)
    p = plan(MANIFEST, m, LAYOUTS, PlanRequest(ctx_size=262144))
    assert p.quant in {"Q6_K", "Q8_0"} and p.placement == "gpu"


def test_one_3090_with_32g_fits_q4_on_the_card() -> None:
    m = machine(gpu(0, 24, 936), ram_gib=32)
    p = plan(MANIFEST, m, LAYOUTS, PlanRequest(ctx_size=32768))
    assert p.quant in {"IQ4_XS", "Q4_K_M"} and p.placement == "gpu"


def test_3060_with_32g_does_not_fill_the_desktop_with_q8() -> None:
    m = machine(gpu(0, 12, 360), ram_gib=32)
    p = plan(MANIFEST, m, LAYOUTS, PlanRequest(ctx_size=32768))
    assert p.placement == "expert-offload" and p.quant not in {"Q8_0", "BF16"}
    assert p.estimate.host.headroom_bytes >= 0.1 * p.estimate.host.budget_bytes
    q8 = [c for c in p.candidates if c.quant == "Q8_0" and c.fits]
    for c in q8:  # when it fits at all, Q8_0 is slower than the pick
        assert c.speed is not None
        assert c.speed.expected.decode_tps_target < p.speed.expected.decode_tps_target


def test_experts_in_ram_only_for_a_real_quality_step() -> None:
    """A 16 GB card: everything that fits fully is a "noticeable loss" Q2/IQ2; experts of a
    near-lossless quant in RAM buy a real step, and stay usable."""
    m = machine(gpu(0, 16, 448), ram_gib=64)
    p = plan(MANIFEST, m, LAYOUTS, PlanRequest(ctx_size=32768))
    assert p.placement == "expert-offload" and p.quality is not None and p.quality.tier == 0
    assert "nothing of this quality fits fully on the GPUs" in p.why
    fully = [c for c in p.candidates if c.placement == "gpu"]
    assert all(c.quality is not None and c.quality.tier > 0 for c in fully)
    assert p.speed.expected.decode_tps_target >= 5


def test_prefer_speed_is_the_fastest_above_the_floor() -> None:
    p = plan(MANIFEST, reference_box(), LAYOUTS, PlanRequest(ctx_size=32768, prefer="speed"))
    assert p.quality is not None and p.quality.tier <= 1 and p.placement == "gpu"
    feasible = [c for c in p.candidates if c.feasible and c.quality and c.quality.tier <= 1]
    fastest = max(c.speed.expected.decode_tps_target for c in feasible if c.speed)
    assert p.speed.expected.decode_tps_target * 1.05 >= fastest
    # nothing fits on the GPUs: the fastest offload plan, not the largest
    small = machine(gpu(0, 8, 448), ram_gib=64)
    s = plan(MANIFEST, small, LAYOUTS, PlanRequest(ctx_size=8192, prefer="speed"))
    offload = [c for c in s.candidates if c.feasible and c.quality and c.quality.tier <= 1]
    assert s.placement == "expert-offload"
    assert s.speed.expected.decode_tps_target * 1.05 >= max(
        c.speed.expected.decode_tps_target for c in offload if c.speed
    )
    assert s.quant != "Q8_0"


def _offload_speeds(m: Machine, ctx: int) -> dict[tuple[str, str], tuple[float, int]]:
    p = plan(MANIFEST, m, LAYOUTS, PlanRequest(ctx_size=ctx, prefer="speed"))
    return {
        (c.quant, c.cache_type): (expected_tps(c.speed), c.config.n_cpu_moe or 0)
        for c in p.candidates
        if c.speed is not None and c.placement == "expert-offload"
    }


def test_two_gpus_offload_more_experts_to_take_attention_off_a_slow_card(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 9 GiB at 1008 GB/s beside 20 GiB at 192 GB/s, -c 231424: the KV read at depth on the slow
    # card dominates; more experts in RAM let the fast card hold the attention layers.
    m = machine(gpu(0, 9, 1008), gpu(1, 20, 192), ram_gib=64)
    # every offload candidate searched, not only those whose speed can change the pick
    monkeypatch.setattr(planner, "speed_may_matter", lambda *args: True)
    searched = _offload_speeds(m, 231424)
    with monkeypatch.context() as mp:  # the smallest --n-cpu-moe that fits, as before the search
        mp.setattr(
            placement.PlacementSearch, "_faster_offload", lambda self, base, found, n_layer: found
        )
        smallest = _offload_speeds(m, 231424)
    with monkeypatch.context() as mp:  # every N tried
        mp.setattr(placement, "OFFLOAD_WALK", 10_000)
        every = _offload_speeds(m, 231424)
    assert searched.keys() == smallest.keys() == every.keys() and searched
    for key, (tps, n) in searched.items():
        assert tps >= smallest[key][0] - 1e-9 and n >= smallest[key][1]
        assert tps * 1.05 >= every[key][0], key
    gains = [searched[k][0] / smallest[k][0] for k in searched]
    assert max(gains) > 1.3


def test_the_offload_search_never_leaves_the_host_tight_when_the_smallest_n_did_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 11 GiB at 936 GB/s beside 23 GiB at 192 GB/s, 35 GiB of RAM: the fastest N would leave
    # under 10% of the host free (Q6_K: N 5 -> 38), which the balanced policy ranks below speed
    m = machine(gpu(0, 11, 936), gpu(1, 23, 192), ram_gib=35)
    request = PlanRequest(ctx_size=225536, prefer="speed")
    # every offload candidate searched, not only those whose speed can change the pick
    monkeypatch.setattr(planner, "speed_may_matter", lambda *args: True)

    def offload(p: Plan) -> dict[tuple[str, str], Candidate]:
        return {(c.quant, c.cache_type): c for c in p.candidates if c.placement == "expert-offload"}

    searched = offload(plan(MANIFEST, m, LAYOUTS, request))
    with monkeypatch.context() as mp:
        mp.setattr(
            placement.PlacementSearch, "_faster_offload", lambda self, base, found, n_layer: found
        )
        smallest = offload(plan(MANIFEST, m, LAYOUTS, request))
    assert searched.keys() == smallest.keys() and searched
    for key, c in searched.items():
        assert policy.tight(c) <= policy.tight(smallest[key]), key
    assert any(
        expected_tps(c.speed) > 1.2 * expected_tps(smallest[k].speed) for k, c in searched.items()
    )


def test_one_gpu_offload_keeps_the_smallest_n_cpu_moe() -> None:
    # one card: every extra layer of experts in RAM only reads slower memory
    m = machine(gpu(0, 12, 360), ram_gib=64)
    p = plan(MANIFEST, m, LAYOUTS, PlanRequest(ctx_size=32768))
    assert p.placement == "expert-offload"
    n = p.config.n_cpu_moe
    assert n is not None and n > 0
    assert estimate(layout_of(p.quant), m, p.config, projector_bytes=0).fits
    fewer = replace(p.config, n_cpu_moe=n - 1)
    assert not estimate(layout_of(p.quant), m, fewer, projector_bytes=0).fits


def test_an_older_build_reserves_whole_ubatch_logits_and_no_build_plans_for_the_pinned_one() -> (
    None
):
    """Before PR #23861 llama-server reserved 485 MiB of logits at -ub 512 (and the f32 FA mask);
    with no llama.cpp found the plan is the pinned build's (what an install gets today)."""
    current = plan(
        MANIFEST, reference_box(), LAYOUTS,
        PlanRequest(ctx_size=262144, quant="Q6_K", compute_rule=CURRENT_TREE),
    )  # fmt: skip
    assert (current.config.logits_rows, current.config.fa_mask_f32) == ("server", False)
    none_found = plan(
        MANIFEST, reference_box(), LAYOUTS,
        PlanRequest(ctx_size=262144, quant="Q6_K", compute_rule=PINNED),
    )  # fmt: skip
    assert none_found.estimate == current.estimate
    old = compute_rule(None, 9000, "abc1234")
    for rule in (old,):
        p = plan(
            MANIFEST, reference_box(), LAYOUTS,
            PlanRequest(ctx_size=262144, quant="Q6_K", compute_rule=rule),
        )  # fmt: skip
        assert p.compute_rule == rule
        assert (p.config.logits_rows, p.config.fa_mask_f32) == ("batch", True)
        # the card that holds the output layer (the last one used: with experts in RAM the old
        # rule's plan may leave the T4 empty) reserves more
        assert max(d.compute_bytes for d in p.estimate.gpus) > max(
            d.compute_bytes for d in current.estimate.gpus
        )


def test_nothing_fits_exit_3_names_the_shortfall() -> None:
    with pytest.raises(NoFitError) as info:
        plan(MANIFEST, machine(gpu(0, 4), ram_gib=8), LAYOUTS, PlanRequest(ctx_size=262144))
    assert info.value.exit_code == 3
    assert "GiB over budget on" in info.value.message and "IQ2_M" in info.value.message


def test_min_tps_floor_applies_to_the_expected_figure() -> None:
    slow = machine(gpu(0, 8), ram_gib=128, ram_bw_gbs=5)
    with pytest.raises(NoFitError, match="min-tps"):
        plan(MANIFEST, slow, LAYOUTS, PlanRequest(ctx_size=32768, min_tps=50))
    m = machine(gpu(0, 24, 936), ram_gib=64)
    p = plan(MANIFEST, m, LAYOUTS, PlanRequest(ctx_size=32768, min_tps=40))
    assert p.speed.expected.decode_tps_target >= 40
    # a plan whose bound clears the floor but whose expected figure does not is refused
    refused = [c for c in p.candidates if c.fits and not c.feasible and c.speed]
    assert any(
        c.speed.tokens_per_s_target >= 40 > c.speed.expected.decode_tps_target  # type: ignore[union-attr]
        for c in refused
    )


def test_fixed_quant_and_vision() -> None:
    p = plan(
        MANIFEST,
        reference_box(),
        LAYOUTS,
        PlanRequest(ctx_size=65536, quant="q4_k_m", vision=True),
    )
    assert p.quant == "Q4_K_M" and p.projector is not None
    assert p.estimate.devices[0].projector_bytes >= p.projector.size_bytes
    with pytest.raises(UsageError):
        plan(MANIFEST, reference_box(), LAYOUTS, PlanRequest(ctx_size=4096, quant="Q7_K"))
    with pytest.raises(UsageError):
        plan(MANIFEST, reference_box(), LAYOUTS, PlanRequest(ctx_size=300000))


def test_max_context_per_quant() -> None:
    limits = {
        lim.quant: lim
        for lim in max_context(
            MANIFEST,
            machine(gpu(0, 24, 936)),
            LAYOUTS,
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
        LAYOUTS,
        PlanRequest(ctx_size=q4, quant="Q4_K_M", allow_offload=False),
    )
    with pytest.raises(NoFitError):
        plan(
            MANIFEST,
            machine(gpu(0, 24, 936)),
            LAYOUTS,
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


def pick_or_none(m: Machine, request: PlanRequest) -> Plan | None:
    try:
        return plan(MANIFEST, m, LAYOUTS, request)
    except NoFitError:
        return None


def at_least_as_good(a: Plan | None, b: Plan | None, prefer: str) -> bool:
    """Is pick `a` at least as good as pick `b` under the policy's own objective?"""
    if b is None:
        return True
    if a is None:
        return False
    if prefer == "balanced":
        # one fixed order of plans (planner.balanced_key): more memory only adds or improves plans
        return balanced_key_of(a) >= balanced_key_of(b)
    if prefer == "quality":
        assert a.quality is not None and b.quality is not None
        return a.quality.mean_kld <= b.quality.mean_kld + 1e-12
    # speed: the fastest plan above the floor, speeds within SPEED_TIE counted as equal
    floor_a = a.quality is not None and a.quality.tier <= SPEED_FLOOR_TIER
    floor_b = b.quality is not None and b.quality.tier <= SPEED_FLOOR_TIER
    if floor_a != floor_b:
        return floor_a
    return expected_tps(a.speed) * SPEED_TIE**2 >= expected_tps(b.speed)


def balanced_key_of(p: Plan) -> tuple[int, bool, bool, bool, float]:
    chosen = next(c for c in p.candidates if c.reason.startswith("chosen"))
    key = balanced_key(chosen)
    return key[:4] + (round(key[4], 9),)


# QUANTPICK_PROPERTY_EXAMPLES=500 for a longer search (the default keeps the suite quick).
SETTINGS = settings(
    max_examples=int(os.environ.get("QUANTPICK_PROPERTY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
policies = st.sampled_from(["balanced", "quality", "speed"])


@SETTINGS
@given(m=machines(), ctx=contexts, prefer=policies)
def test_no_plan_exceeds_any_budget(m: Machine, ctx: int, prefer: str) -> None:
    p = pick_or_none(m, PlanRequest(ctx_size=ctx, prefer=prefer))
    if p is not None:
        # recompute from the plan's own flags: what llama.cpp would be given
        est = estimate(layout_of(p.quant), m, p.config, projector_bytes=0)
        assert all(d.total_bytes <= d.budget_bytes for d in est.devices)


@SETTINGS
@given(
    m=machines(), ctx=contexts, which=st.integers(0, 2), extra=st.integers(1, 64), prefer=policies
)
def test_more_memory_never_makes_the_pick_worse(
    m: Machine, ctx: int, which: int, extra: int, prefer: str
) -> None:
    request = PlanRequest(ctx_size=ctx, prefer=prefer)
    before = pick_or_none(m, request)
    if which < len(m.gpus):
        g = m.gpus[which]
        bigger = replace(
            g, total_bytes=g.total_bytes + extra * GiB, free_bytes=g.free_bytes + extra * GiB
        )
        gpus = list(m.gpus)
        gpus[which] = bigger
        more = replace(m, gpus=tuple(gpus))
    else:
        h = m.host
        more = replace(
            m,
            host=replace(
                h,
                ram_total_bytes=h.ram_total_bytes + extra * GiB,
                ram_available_bytes=h.ram_available_bytes + extra * GiB,
            ),
        )
    assert at_least_as_good(pick_or_none(more, request), before, prefer)


@SETTINGS
@given(m=machines(), ctx=contexts, longer=st.integers(1, 512), prefer=policies)
def test_longer_context_never_makes_the_pick_better(
    m: Machine, ctx: int, longer: int, prefer: str
) -> None:
    longer_ctx = min(ctx + longer * 256, 262144)
    short = pick_or_none(m, PlanRequest(ctx_size=ctx, prefer=prefer))
    long_ = pick_or_none(m, PlanRequest(ctx_size=longer_ctx, prefer=prefer))
    assert at_least_as_good(short, long_, prefer)


@st.composite
def two_gpu_machines(draw: st.DrawFn) -> Machine:
    gpus = [gpu(i, draw(gib_sizes), draw(bandwidths)) for i in range(2)]
    return machine(
        *gpus,
        ram_gib=draw(st.integers(min_value=8, max_value=160)),
        ram_bw_gbs=draw(st.sampled_from([25, 50, 90])),
    )


@SETTINGS
@given(m=two_gpu_machines(), ctx=contexts, prefer=policies)
# The tentative pick (IQ3_M, with desktop room) lost its room once searched; Q3_K_M, skipped
# behind it, then won unsearched (--n-cpu-moe 24 where the search gives 27).
@example(m=machine(gpu(0, 4, 192), gpu(1, 7, 192), ram_gib=16, ram_bw_gbs=50), ctx=4096,
         prefer="balanced")  # fmt: skip
def test_the_offload_search_is_skipped_only_where_it_cannot_change_the_pick(
    m: Machine, ctx: int, prefer: str
) -> None:
    request = PlanRequest(ctx_size=ctx, prefer=prefer)
    lazy = pick_or_none(m, request)
    original = planner.speed_may_matter
    planner.speed_may_matter = lambda *args: True  # type: ignore[assignment]
    try:
        every = pick_or_none(m, request)
    finally:
        planner.speed_may_matter = original
    assert (lazy is None) == (every is None)
    if lazy is not None and every is not None:
        assert (lazy.quant, lazy.config, lazy.placement) == (
            every.quant,
            every.config,
            every.placement,
        )


@SETTINGS
@given(
    a=gib_sizes,
    b=gib_sizes,
    ctx=contexts,
    n_cpu_moe=st.integers(1, 40),
    quant=st.sampled_from(MANIFEST.quants),
    bracket=st.tuples(*[st.integers(-2, 44)] * 4),
)
def test_a_bracket_only_speeds_up_the_two_gpu_split_search(
    a: int, b: int, ctx: int, n_cpu_moe: int, quant: str, bracket: tuple[int, int, int, int]
) -> None:
    """The --n-cpu-moe search passes each N the interval ends of its neighbours; any bracket,
    even a wrong one, must give the split search's own answer."""
    m = machine(gpu(0, a, 936), gpu(1, b, 320))
    search = placement.PlacementSearch(
        layout_of(quant), m, Overheads(), 0, planner.device_bandwidths(m), 1.0, ctx
    )
    config = RunConfig(ctx_size=ctx, n_cpu_moe=n_cpu_moe)
    plain_fit, plain_least = search.best_split(config)
    plain_bounds = search.bounds
    fit, least = search.best_split(config, placement._Bracket(*bracket))
    assert search.bounds == plain_bounds
    assert (fit and fit.config) == (plain_fit and plain_fit.config)
    assert least.config == plain_least.config


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
    p = plan(MANIFEST, m, LAYOUTS, PlanRequest(ctx_size=32768, prefer="speed"))
    assert p.config.devices == (0, 2)
    assert [d.device for d in p.estimate.gpus] == ["CUDA0", "CUDA2"]


# ---- RPC workers -------------------------------------------------------------------------------


def with_workers(m: Machine, *workers: tuple[str, Gpu]) -> Machine:
    from dataclasses import replace

    from quantpick.machine.spec import RpcWorker

    rpc = tuple(
        RpcWorker(host=ep.split(":")[0], port=int(ep.split(":")[1]), devices=(g,))
        for ep, g in workers
    )
    return replace(m, rpc_workers=rpc)


def test_a_3090_here_and_a_t4_on_a_worker_is_planned_across_both() -> None:
    """At 262144 tokens the 3090 alone needs experts in RAM; with the T4 worker (over 1 GbE) the
    model runs fully on the two cards, faster: the worker is used."""
    here = machine(gpu(0, 24, 936, "NVIDIA GeForce RTX 3090"))
    cluster = with_workers(here, ("10.0.0.7:50052", gpu(0, 15, 320, "Tesla T4")))
    request = PlanRequest(ctx_size=262144, compute_rule=CURRENT_TREE)
    alone, both = (
        plan(MANIFEST, here, LAYOUTS, request),
        plan(MANIFEST, cluster, LAYOUTS, request),
    )
    assert alone.placement == "expert-offload"
    assert both.config.rpc_servers == ("10.0.0.7:50052",)
    assert [d.device for d in both.estimate.gpus] == ["RPC0", "CUDA0"]  # the worker first
    assert both.placement == "gpu" and both.estimate.fits
    assert both.config.tensor_split is not None and len(both.config.tensor_split) == 2
    assert all(d.layers for d in both.estimate.gpus)
    assert both.speed.expected.decode_tps_target > alone.speed.expected.decode_tps_target
    assert both.speed.expected.network_ms_target > 0  # the network is charged, and still wins
    assert both.config.devices is None  # llama.cpp's own order, nothing to name


def test_a_worker_that_buys_nothing_is_left_unused() -> None:
    """At 65536 tokens Q4_K_M runs fully on the 3090 at ~100 tok/s; the T4 worker would only add a
    quality step nobody notices, at a network cost: it is left out, and the plan says why."""
    here = machine(gpu(0, 24, 936, "NVIDIA GeForce RTX 3090"))
    cluster = with_workers(here, ("10.0.0.7:50052", gpu(0, 15, 320, "Tesla T4")))
    p = plan(MANIFEST, cluster, LAYOUTS, PlanRequest(ctx_size=65536))
    assert p.config.rpc_servers == () and p.placement == "gpu"
    assert any("left unused" in n and "this machine alone" in n for n in p.notes)


def test_a_failed_local_gpu_is_left_out_and_the_workers_named() -> None:
    broken = Gpu(index=1, name="GPU1", total_bytes=24 * GiB, free_bytes=0, error="Unknown Error")
    m = with_workers(
        machine(gpu(0, 24, 936), broken),
        ("10.0.0.7:50052", gpu(0, 15, 320)),
        ("10.0.0.8:50052", gpu(0, 12, 360)),
    )
    p = plan(MANIFEST, m, LAYOUTS, PlanRequest(ctx_size=32768, quant="Q8_0"))
    assert p.config.devices == ("RPC0", "RPC1", 0)
    assert [d.device for d in p.estimate.gpus] == ["RPC0", "RPC1", "CUDA0"]


def test_two_equal_workers_share_the_layers_only_when_needed() -> None:
    workers = [(f"10.0.0.{i}:50052", gpu(0, 24, 500)) for i in (7, 8)]
    cluster = with_workers(machine(ram_gib=64), *workers)
    p = plan(MANIFEST, cluster, LAYOUTS, PlanRequest(ctx_size=8192, quant="Q8_0"))
    a, b = (len(d.layers) for d in p.estimate.gpus)
    assert abs(a - b) <= 2  # Q8_0 needs both: balanced, not one worker stuffed to the brim
    # one worker holds Q4_K_M alone: a second would only add a network hop per token
    p = plan(MANIFEST, cluster, LAYOUTS, PlanRequest(ctx_size=8192, quant="Q4_K_M"))
    assert len(p.config.rpc_servers) == 1 and any("left out of --rpc" in n for n in p.notes)


def test_a_worker_left_empty_is_left_out_of_rpc() -> None:
    # Q4_K_M at a small context fits the 3090 alone, and the 3090 is the faster device.
    here = machine(gpu(0, 24, 936))
    m = with_workers(here, ("10.0.0.7:50052", gpu(0, 15, 320)))
    p = plan(MANIFEST, m, LAYOUTS, PlanRequest(ctx_size=8192, quant="Q4_K_M", prefer="speed"))
    assert p.config.rpc_servers == ()
    assert [d.device for d in p.estimate.gpus] == ["CUDA0"]
    assert any("10.0.0.7:50052 hold no layer" in n for n in p.notes)
    chosen = next(c for c in p.candidates if c.reason.startswith("chosen"))
    assert chosen.config == p.config


def test_dropping_a_worker_renumbers_the_rpc_devices() -> None:
    from quantpick.plan.memory import estimate as run
    from quantpick.plan.planner import _without_workers

    broken = Gpu(index=1, name="GPU1", total_bytes=24 * GiB, free_bytes=0, error="Unknown Error")
    m = with_workers(
        machine(gpu(0, 24, 936), broken),
        ("10.0.0.7:50052", gpu(0, 15, 320)),
        ("10.0.0.8:50052", gpu(0, 12, 360)),
    )
    config = RunConfig(
        ctx_size=4096,
        rpc_servers=("10.0.0.7:50052", "10.0.0.8:50052"),
        devices=("RPC0", "RPC1", 0),
        tensor_split=(0.0, 10.0, 32.0),
    )
    est = run(layout_of("Q4_K_M"), m, config)
    slim = _without_workers(m, config, est, ("10.0.0.7:50052",))
    assert slim.rpc_servers == ("10.0.0.8:50052",)
    assert slim.devices == ("RPC0", 0)  # the second worker's device is RPC0 now
    assert slim.tensor_split == (10.0, 32.0)
    after = run(layout_of("Q4_K_M"), m, slim)
    assert [len(d.layers) for d in after.gpus] == [len(d.layers) for d in est.gpus[1:]]


def test_a_worker_behind_a_slow_link_is_left_unused_and_the_plan_says_why() -> None:
    """At 262144 tokens every token sends the KQ mask (512 KiB) to a worker with attention
    layers: over a slow link this machine alone, with experts in its own RAM, is faster."""
    from quantpick.machine.spec import Network

    here = machine(gpu(0, 24, 936, "NVIDIA GeForce RTX 3090"), ram_gib=64)
    fast = with_workers(here, ("10.0.0.7:50052", gpu(0, 15, 320, "Tesla T4")))
    fast = replace(
        fast,
        rpc_workers=tuple(
            replace(w, network=Network(bandwidth_bytes_per_s=1_170_000_000, rtt_s=0.0001))
            for w in fast.rpc_workers
        ),
    )
    slow = replace(
        fast,
        rpc_workers=tuple(
            replace(w, network=Network(bandwidth_bytes_per_s=12_000_000, rtt_s=0.002))
            for w in fast.rpc_workers
        ),
    )
    request = PlanRequest(ctx_size=262144, compute_rule=CURRENT_TREE)
    used = plan(MANIFEST, fast, LAYOUTS, request)
    assert used.config.rpc_servers == ("10.0.0.7:50052",)
    unused = plan(MANIFEST, slow, LAYOUTS, request)
    assert unused.config.rpc_servers == () and "RPC0" not in [
        d.device for d in unused.estimate.gpus
    ]
    note = next(n for n in unused.notes if "left unused" in n)
    assert "10.0.0.7:50052" in note and "on the network" in note and "this machine alone" in note
    assert "left unused" in unused.why
    # the unused worker's plan really is slower: what was weighed is what is said
    alone_tps = unused.speed.expected.decode_tps_target
    with_tps = float(note.split("~")[1].split(" tok/s")[0])
    assert with_tps < alone_tps
