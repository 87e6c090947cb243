"""--min-tps in the answer (issue 30, "Answers"): a low pick says which better quants missed the
floor and by how much, a named quant below the floor plans with a note, and a refusal's hint never
suggests the value already given."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_planner import LAYOUTS, MANIFEST, gpu, machine

from quantpick.errors import NoFitError
from quantpick.plan.planner import PlanRequest, expected_tps, plan

# A CPU-only box whose RAM bandwidth puts the better quants just under a floor (a 2-core desktop
# with dual-channel DDR4): the cheaper quants reach it, the better ones do not.
SLOW_CPU = machine(ram_gib=64, ram_bw_gbs=40)


def _floor_between() -> float:
    """A --min-tps that some quants reach and better ones miss on SLOW_CPU."""
    p = plan(MANIFEST, SLOW_CPU, LAYOUTS, PlanRequest(ctx_size=4096, min_tps=0))
    speeds = sorted(
        {round(expected_tps(c.speed), 2) for c in p.candidates if c.fits and c.speed is not None}
    )
    assert len(speeds) >= 2
    return (speeds[0] + speeds[-1]) / 2


def test_the_why_line_names_the_better_quant_that_missed_min_tps() -> None:
    floor = _floor_between()
    p = plan(MANIFEST, SLOW_CPU, LAYOUTS, PlanRequest(ctx_size=4096, min_tps=floor))
    missed = [c for c in p.candidates if c.fits and not c.feasible and c.quality is not None]
    assert missed and p.quality is not None
    better = [c for c in missed if c.quality.mean_kld < p.quality.mean_kld]  # type: ignore[union-attr]
    assert better
    best = min(better, key=lambda c: c.quality.mean_kld)  # type: ignore[union-attr]
    m = re.search(rf"; {re.escape(best.quant)} fits at ~([\d.]+) tok/s, below --min-tps ", p.why)
    assert m is not None, p.why
    assert float(m.group(1)) < floor
    assert f"below --min-tps {floor:g}" in p.why


def test_no_missed_note_when_nothing_better_was_too_slow() -> None:
    p = plan(MANIFEST, SLOW_CPU, LAYOUTS, PlanRequest(ctx_size=4096, min_tps=0))
    assert "below --min-tps" not in p.why


def test_a_named_quant_below_min_tps_plans_with_a_note() -> None:
    slow = machine(gpu(0, 8), ram_gib=128, ram_bw_gbs=5)
    with pytest.raises(NoFitError, match="min-tps"):  # a free choice still refuses
        plan(MANIFEST, slow, LAYOUTS, PlanRequest(ctx_size=32768, min_tps=50))
    p = plan(MANIFEST, slow, LAYOUTS, PlanRequest(ctx_size=32768, min_tps=50, quant="Q4_K_M"))
    assert p.quant == "Q4_K_M"
    (note,) = [n for n in p.notes if n.startswith("--quant Q4_K_M")]
    assert "below --min-tps 50; planned because the quant was named" in note


def test_the_refusal_hint_never_suggests_the_floor_given() -> None:
    """`--min-tps 1` on a box where nothing reaches 1 tok/s suggested "e.g. --min-tps 1"."""
    crawling = machine(ram_gib=128, ram_bw_gbs=0.5)
    with pytest.raises(NoFitError) as info:
        plan(MANIFEST, crawling, LAYOUTS, PlanRequest(ctx_size=4096, min_tps=1))
    m = re.search(r"e\.g\. --min-tps ([\d.]+)\)", info.value.hint or "")
    assert m is not None and 0 < float(m.group(1)) < 1, info.value.hint


@given(st.floats(0, 500, allow_nan=False), st.floats(0.01, 500, allow_nan=False))
def test_a_suggested_floor_is_below_the_given_one_and_reached(tps: float, floor: float) -> None:
    from quantpick.plan.planner import min_tps_suggestion

    s = min_tps_suggestion(tps, floor)
    assert s is None or 0 < s < floor and s <= tps


def test_pick_with_a_named_quant_below_min_tps_exits_0_with_the_note() -> None:
    from typer.testing import CliRunner

    from quantpick.cli import app

    args = ["pick", MANIFEST.id, "-c", "4096", "--gpu", "3090", "--ram", "64G", "--cores", "8",
            "--min-tps", "1000", "--no-network"]  # fmt: skip
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 3, refused.stderr
    named = CliRunner().invoke(app, [*args, "--quant", "Q4_K_M"])
    assert named.exit_code == 0, named.stderr
    assert "below --min-tps 1000; planned because the quant was named" in named.output
