"""The balanced pick leaves a desktop room to work (policy.desktop_room): within one quality
tier, the lighter plan that keeps max(4 GiB, 25 %) of the host budget free wins over one that
fills RAM with experts for a step nobody notices (issue 30)."""

from __future__ import annotations

from test_planner import LAYOUTS, MANIFEST, gpu, machine

from quantpick.machine.spec import Machine
from quantpick.plan.plan_types import PlanRequest
from quantpick.plan.planner import plan
from quantpick.plan.policy import desktop_room


def _desktop_12gb() -> Machine:
    """A 32 GB desktop with an RTX 4070 (12 GB, 504 GB/s: NVIDIA's data sheet)."""
    return machine(gpu(0, 12, 504), ram_gib=32)


def test_a_32gb_desktop_with_a_12gb_card_keeps_its_room() -> None:
    """Before: Q6_K with ~17 GiB of experts in RAM, ~5 GiB of the budget left, ~10 % slower than
    Q5_K_M, for a step inside the same near-lossless tier."""
    p = plan(MANIFEST, _desktop_12gb(), LAYOUTS, PlanRequest(ctx_size=32768))
    assert p.quant == "Q5_K_M", p.why
    assert desktop_room(p.estimate)
    q6 = next(c for c in p.candidates if c.quant == "Q6_K" and c.fits)
    assert q6.estimate is not None and not desktop_room(q6.estimate)
    assert q6.quality is not None and p.quality is not None
    assert q6.quality.tier == p.quality.tier  # the same tier: a tier step would still win
    assert "Q6_K would leave the desktop under max(4 GiB, 25%) of its free RAM" in p.why


def test_a_tier_step_still_beats_the_room() -> None:
    """Room is weighed inside one tier only: a plan of a better tier wins even without it."""
    p = plan(MANIFEST, _desktop_12gb(), LAYOUTS, PlanRequest(ctx_size=32768))
    best_tier = min(c.quality.tier for c in p.candidates if c.feasible and c.quality)
    assert p.quality is not None and p.quality.tier == best_tier
