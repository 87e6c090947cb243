"""Expected speed with speculative decoding, and the decision to use it."""

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
    SpecMode,
    SpecOption,
    StepCosts,
    acceptance_from_rate,
    accepted_per_round,
    best_option,
    decide,
    rate_from_acceptance,
    round_speed,
    step_costs,
)
from quantpick.plan.speed import device_speeds

GiB = 1024**3


@given(st.floats(0.01, 0.99), st.integers(1, 8))
def test_rate_and_acceptance_are_inverse(a: float, n: int) -> None:
    assert acceptance_from_rate(rate_from_acceptance(a, n), n) == pytest.approx(a, abs=1e-6)


@given(st.floats(0.0, 1.0), st.integers(1, 8))
def test_a_round_yields_between_one_and_n_plus_one_tokens(a: float, n: int) -> None:
    assert 0.0 <= accepted_per_round(a, n) <= n + 1e-9


def test_round_speed_counts_the_verify_and_the_drafts() -> None:
    costs = StepCosts(decode_s=0.01, draft_s=0.002, verify_s=(0.01, 0.011, 0.012, 0.013))
    # a = 1: every draft accepted, 4 tokens for 0.013 + 3 x 0.002 (+ 1 ms overhead)
    assert round_speed(costs, 1.0, 3) == pytest.approx(4 / 0.020)
    assert round_speed(costs, 0.5, 0) == pytest.approx(100.0)


def _bundled(gpus: tuple[str, ...]):  # type: ignore[no-untyped-def]
    manifest = load_manifest_file(bundled_manifest_dir() / "qwen3.8-35b-a3b-distill.toml")
    layout = synthesize_layout(manifest.architecture, "Q4_K_M", 22 * 10**9)
    machine = Machine(
        gpus=tuple(describe_gpu(g, index=i) for i, g in enumerate(gpus)),
        host=Host(64 * GiB, 64 * GiB, 8),
        described=True,
        source="test",
    )
    est = estimate(layout, machine, RunConfig(ctx_size=32768, spec_draft_n=3, cpu_moe=True))
    return layout, est, device_speeds(machine)


def test_mtp_costs_on_the_bundled_model() -> None:
    layout, est, devices = _bundled(("3090",))
    costs = step_costs(layout, est, devices, SpecKind.MTP, fill=0)
    # the draft step (one block and the output head) costs a fraction of a trunk step; the
    # verify batch costs more than one step (more experts read) and grows with its tokens
    assert 0 < costs.draft_s < costs.decode_s
    assert costs.verify(1) == pytest.approx(costs.decode_s)
    assert costs.verify(2) > costs.decode_s
    assert list(costs.verify_s) == sorted(costs.verify_s)
    # a backend with slow small batches pays more for the same verify
    slow = step_costs(layout, est, devices, SpecKind.MTP, fill=0, verify_efficiency=0.25)
    assert slow.verify(4) > costs.verify(4)
    assert best_option(SpecKind.MTP, slow).tps < best_option(SpecKind.MTP, costs).tps


def _opt(kind: SpecKind, tps: float) -> SpecOption:
    return SpecOption(kind, 3, 0.8, tps, 20.0)


def test_auto_turns_on_only_a_real_gain() -> None:
    opts = {SpecKind.MTP: _opt(SpecKind.MTP, 30.0), SpecKind.NGRAM: _opt(SpecKind.NGRAM, 21.0)}
    kinds = (SpecKind.MTP, SpecKind.NGRAM)
    on = decide(SpecMode.AUTO, kinds, opts, {}, 20.0)
    assert on.enabled and on.kind is SpecKind.MTP and on.draft_n_max == 3
    assert "30.0 vs 20.0" in on.reason
    small = {SpecKind.MTP: _opt(SpecKind.MTP, 21.0)}
    off = decide(SpecMode.AUTO, (SpecKind.MTP,), small, {}, 20.0)
    assert not off.enabled and "under 15% gain" in off.reason and off.tps == 20.0


def test_memory_refusal_and_unknown_kinds_plan_without() -> None:
    opts = {SpecKind.MTP: _opt(SpecKind.MTP, 30.0)}
    refused = {SpecKind.MTP: "its draft context needs 512 MiB more on CUDA0"}
    d = decide(SpecMode.AUTO, (SpecKind.MTP,), opts, refused, 20.0)
    assert not d.enabled and "512 MiB" in d.reason
    d = decide(SpecMode.MTP, (SpecKind.MTP,), opts, refused, 20.0)
    assert not d.enabled and d.reason.startswith("--spec mtp:")
    d = decide(SpecMode.DRAFT, (SpecKind.MTP,), opts, {}, 20.0)
    assert not d.enabled and "no draft model given (--draft PATH)" in d.reason
    assert not decide(SpecMode.OFF, (SpecKind.MTP,), opts, {}, 20.0).enabled


def test_asked_kind_is_an_override_that_says_when_it_loses() -> None:
    opts = {SpecKind.MTP: _opt(SpecKind.MTP, 15.0)}
    d = decide(SpecMode.MTP, (SpecKind.MTP,), opts, {}, 20.0)
    assert d.enabled and d.kind is SpecKind.MTP and "expected slower" in d.reason
    d = decide(SpecMode.MTP, (SpecKind.MTP,), {SpecKind.MTP: _opt(SpecKind.MTP, 21.0)}, {}, 20.0)
    assert d.enabled and d.reason.endswith("as asked")


def test_verify_efficiency_follows_the_backend() -> None:
    from quantpick.plan.speculative import verify_efficiency

    def box(*gpus: str) -> Machine:
        return Machine(
            gpus=tuple(describe_gpu(g, index=i) for i, g in enumerate(gpus)),
            host=Host(64 * GiB, 64 * GiB, 8),
        )

    assert verify_efficiency(box("3090")) == 1.0
    assert verify_efficiency(box("7900xtx")) == pytest.approx(0.35)
    assert verify_efficiency(box()) == 1.0  # the CPU


def test_a_speculation_measurement_that_cannot_be_true_is_named() -> None:
    from quantpick.serve.bench import SpecMeasurement

    ok = SpecMeasurement(30.0, 45.0, drafted=100, accepted=70, argv=())
    assert ok.problems() == [] and ok.acceptance == pytest.approx(0.7)
    assert "accepted of" in SpecMeasurement(30.0, 45.0, 10, 11, ()).problems()[0]
    assert "drafted nothing" in SpecMeasurement(30.0, 45.0, 0, 0, ()).problems()[0]
    assert "decode speed of 0" in SpecMeasurement(0.0, 45.0, 10, 5, ()).problems()[0]
