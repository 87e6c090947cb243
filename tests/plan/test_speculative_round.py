"""The speculative round's model terms: a confidence-gated draft, an n-gram lookup that drafts in
only some rounds, a verify batch's compute floor past the mat-vec width, a draft model's own
step and overhead."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantpick.machine.describe import describe_gpu
from quantpick.machine.spec import Host, Machine
from quantpick.model.layout import synthesize_layout
from quantpick.model.registry import bundled_manifest_dir, load_manifest_file
from quantpick.model.speculative import SpecKind
from quantpick.plan.memory import RunConfig, estimate
from quantpick.plan.speculative import (
    DRAFT_TOKEN_OVERHEAD_MS,
    NGRAM_HIT,
    VERIFY_MATVEC_ROWS,
    SpecMode,
    StepCosts,
    Task,
    acceptance_from_rate,
    best_option,
    decide,
    draft_hit,
    drafted_per_round,
    rate_from_acceptance,
    round_speed,
    step_costs,
    verify_compute_seconds,
)
from quantpick.plan.speed import device_speeds
from quantpick.plan.speed_work import speed_work

GiB = 1024**3
GB = 1000**3

COSTS = StepCosts(decode_s=0.02, draft_s=0.003, verify_s=(0.02, 0.021, 0.022, 0.023, 0.024, 0.025))


@given(st.floats(0.0, 1.0), st.integers(1, 16))
def test_a_gate_drafts_at_most_n_and_at_least_one(a: float, n: int) -> None:
    drafted = drafted_per_round(a, n, gated=True)
    assert 1.0 - 1e-9 <= drafted <= n + 1e-9
    assert drafted_per_round(a, n) == n


@given(st.floats(0.01, 0.99), st.integers(2, 16))
def test_gated_rate_and_acceptance_are_inverse_and_the_gate_raises_the_rate(
    a: float, n: int
) -> None:
    rate = rate_from_acceptance(a, n, gated=True)
    assert acceptance_from_rate(rate, n, gated=True) == pytest.approx(a, abs=1e-6)
    # the same acceptance prints a higher rate when the drafts stop at the first miss
    assert rate >= rate_from_acceptance(a, n) - 1e-12


@given(st.floats(0.0, 1.0), st.integers(1, 5))
def test_an_ideal_gate_never_loses_to_drafting_n(a: float, n: int) -> None:
    # same tokens per round, fewer drafts and a smaller verify batch
    assert round_speed(COSTS, a, n, gated=True) >= round_speed(COSTS, a, n) * (1 - 1e-12)


def test_a_gated_round_verifies_its_mean_batch() -> None:
    # a = 0.5, n = 4: 1 + 0.5 + 0.25 + 0.125 = 1.875 drafts, a batch of 2.875 tokens
    drafted = drafted_per_round(0.5, 4, gated=True)
    assert drafted == pytest.approx(1.875)
    tokens = 1 + 0.5 + 0.25 + 0.125 + 0.0625
    seconds = COSTS.verify(2.875) + drafted * COSTS.draft_s + 1e-3
    assert round_speed(COSTS, 0.5, 4, gated=True) == pytest.approx(tokens / seconds)
    # between its neighbours' costs
    assert COSTS.verify(2.875) == pytest.approx(0.021 + 0.875 * 0.001)
    assert COSTS.verify(3) == 0.022
    assert COSTS.verify(99) == 0.025


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(1, 5))
def test_a_lookup_that_drafts_in_some_rounds_is_between_never_and_always(
    a: float, hit: float, n: int
) -> None:
    never = round_speed(COSTS, a, n, hit=0.0)
    always = round_speed(COSTS, a, n, hit=1.0)
    mixed = round_speed(COSTS, a, n, hit=hit)
    assert min(never, always) * (1 - 1e-9) <= mixed <= max(never, always) * (1 + 1e-9)


def test_a_lookup_that_finds_nothing_decodes_as_without_plus_its_lookup() -> None:
    assert round_speed(COSTS, 0.9, 3, hit=0.0) == pytest.approx(1 / (0.02 + 0.003))
    assert round_speed(COSTS, 0.9, 3, hit=1.0) == pytest.approx(round_speed(COSTS, 0.9, 3))


def test_ngram_is_not_offered_where_the_output_does_not_repeat_its_context() -> None:
    # rows 35-41: fresh generation finds no draft; editing in place is where a lookup pays
    assert NGRAM_HIT[Task.MIXED] == 0.0
    assert draft_hit(SpecKind.DRAFT, Task.MIXED) == 1.0
    plain = best_option(SpecKind.NGRAM, COSTS, Task.MIXED)
    assert plain.tps <= plain.tps_without
    edit = best_option(SpecKind.NGRAM, COSTS, Task.EDIT)
    assert edit.tps > 1.5 * edit.tps_without
    decision = decide(SpecMode.AUTO, (SpecKind.NGRAM,), {SpecKind.NGRAM: plain}, {}, 50.0)
    assert not decision.enabled


def test_scaling_to_the_plans_decode_keeps_a_draft_models_own_step() -> None:
    scaled = COSTS.scaled(2.0, draft=False)
    assert scaled.decode_s == 0.04 and scaled.verify(3) == 0.044
    assert scaled.draft_s == COSTS.draft_s
    assert COSTS.scaled(2.0).draft_s == 0.006


def _dense(gpu: str, tflops: float | None = None):  # type: ignore[no-untyped-def]
    manifest = load_manifest_file(bundled_manifest_dir() / "qwen3.8-35b-a3b-distill.toml")
    layout = synthesize_layout(manifest.architecture, "Q4_K_M", 22 * GB)
    card = describe_gpu(gpu, vram_bytes=96 * GiB)
    if tflops is not None:
        from dataclasses import replace

        card = replace(card, fp16_tflops=tflops)
    machine = Machine(gpus=(card,), host=Host(64 * GiB, 64 * GiB, 8), described=True, source="t")
    est = estimate(layout, machine, RunConfig(ctx_size=8192))
    return layout, est, device_speeds(machine)


def test_a_verify_batch_past_the_matvec_width_costs_at_least_its_compute() -> None:
    layout, est, devices = _dense("3090", tflops=5.0)  # few FLOPs per byte
    work = speed_work(layout, est)
    assert verify_compute_seconds(work, devices, 0, VERIFY_MATVEC_ROWS) == 0.0
    floor = verify_compute_seconds(work, devices, 0, 17)
    assert floor > 0
    costs = step_costs(layout, est, devices, SpecKind.NGRAM, fill=0, max_tokens=17)
    assert costs.verify(17) >= floor
    assert costs.verify(17) > 2 * costs.decode_s
    # up to the mat-vec width a batch streams the weights once: the bandwidth model alone
    bandwidth = step_costs(
        layout, est, devices, SpecKind.NGRAM, fill=0, max_tokens=8, token_share=0.05
    )
    assert costs.verify(8) == pytest.approx(bandwidth.verify(8))
    assert list(costs.verify_s) == sorted(costs.verify_s)


@given(st.floats(5.0, 400.0))
def test_verify_costs_grow_with_the_batch_on_any_card(tflops: float) -> None:
    layout, est, devices = _dense("3090", tflops=tflops)
    costs = step_costs(layout, est, devices, SpecKind.NGRAM, fill=0, max_tokens=20)
    assert all(b >= a for a, b in zip(costs.verify_s, costs.verify_s[1:], strict=False))
    assert costs.verify(1) == pytest.approx(costs.decode_s)


def test_a_draft_models_step_carries_its_per_token_overhead() -> None:
    layout, est, devices = _dense("3090")
    draft = step_costs(layout, est, devices, SpecKind.DRAFT, fill=0, draft_s=0.004)
    assert draft.draft_s == pytest.approx(0.004 + DRAFT_TOKEN_OVERHEAD_MS * 1e-3)
    sidecar = step_costs(layout, est, devices, SpecKind.MTP, fill=0, draft_s=0.004)
    assert sidecar.draft_s == pytest.approx(0.004)
    bare = step_costs(
        layout, est, devices, SpecKind.DRAFT, fill=0, draft_s=0.004, draft_overhead_ms=0.0
    )
    assert bare.draft_s == pytest.approx(0.004)


def test_the_draft_count_reads_as_english() -> None:
    from quantpick.plan.speculative import draft_count

    assert draft_count(1) == "1 draft"
    assert draft_count(3) == "3 drafts"


@given(
    decode_ms=st.floats(5.0, 200.0),
    step_ms=st.floats(0.1, 20.0),
    a=st.floats(0.05, 0.99),
    n=st.integers(1, 8),
    hit=st.floats(0.0, 1.0),
)
def test_a_backends_speculation_step_cost_slows_every_round_but_not_plain_decode(
    decode_ms: float, step_ms: float, a: float, n: int, hit: float
) -> None:
    """Backend.spec_step_ms: each decode call pays it once speculation is on: the target's step,
    drafted or not (an n-gram lookup that finds nothing included), and each draft step of a
    model or an MTP head; without speculation nothing changes."""
    verify = tuple(decode_ms * 1e-3 * (1 + 0.05 * k) for k in range(n + 1))
    bare = StepCosts(decode_ms * 1e-3, 0.5e-3, verify)
    paid = StepCosts(decode_ms * 1e-3, 0.5e-3, verify, step_ms * 1e-3)
    per_draft = StepCosts(decode_ms * 1e-3, 0.5e-3, verify, step_ms * 1e-3, step_ms * 1e-3)
    assert round_speed(paid, a, n, hit=hit) < round_speed(bare, a, n, hit=hit)
    if hit > 0:  # a round that drafts by decoding pays it once more per draft step
        assert round_speed(per_draft, a, n, hit=hit) < round_speed(paid, a, n, hit=hit)
    assert round_speed(paid, a, 0) == round_speed(bare, a, 0) == pytest.approx(1e3 / decode_ms)
    # scaling the target's steps to a measured decode leaves the backend's own cost as it is
    assert paid.scaled(2.0).spec_step_s == paid.spec_step_s
    assert per_draft.scaled(2.0).spec_draft_step_s == per_draft.spec_draft_step_s


def test_only_a_backend_that_measured_it_carries_a_speculation_step_cost() -> None:
    from quantpick.plan.speculative import spec_step_ms

    host = Host(64 * GiB, 64 * GiB, 12)
    mac = Machine(gpus=(describe_gpu("m4-max", vram_bytes=48 * GiB),), host=host, described=True)
    pc = Machine(gpus=(describe_gpu("3090"),), host=host, described=True)
    assert spec_step_ms(mac) == pytest.approx(5.23)  # row 41: an n-gram lookup with no draft
    assert spec_step_ms(pc) == 0.0
    assert spec_step_ms(Machine(gpus=(), host=host, described=True)) == 0.0
