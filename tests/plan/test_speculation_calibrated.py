"""A speculation acceptance measured on this machine (`quantpick bench --spec`, stored with the
calibration) decides later plans' speculation instead of the fitted figure (issue 29: "bench
--spec ... feeds the speed calibration")."""

from __future__ import annotations

from test_planner import LAYOUTS, MANIFEST, reference_box

from quantpick.model.speculative import SpecKind
from quantpick.plan.calibration import Calibration, SpeedFactors
from quantpick.plan.plan_types import PlanRequest
from quantpick.plan.planner import plan
from quantpick.plan.speculative import SpecMode, SpecRequest, rate_from_acceptance

NO_FACTORS = SpeedFactors(decode_empty=None, decode_depth=None, depth_tokens=0, prefill=None)


def _plan(acceptance: tuple[tuple[str, float], ...] | None):  # type: ignore[no-untyped-def]
    cal = None if acceptance is None else Calibration("2026-12-04", "b11312", NO_FACTORS,
                                                      acceptance=acceptance)  # fmt: skip
    request = PlanRequest(ctx_size=262144, spec=SpecRequest(mode=SpecMode.AUTO), calibration=cal)
    return plan(MANIFEST, reference_box(), LAYOUTS, request)


def test_a_measured_acceptance_replaces_the_fitted_one() -> None:
    fitted = _plan(None).speculative
    assert fitted is not None and fitted.enabled and "measured here" not in fitted.reason
    high = _plan((("mtp", 0.95),)).speculative
    assert high is not None and high.enabled
    assert high.tps > fitted.tps and "measured here by quantpick bench --spec" in high.reason
    rate = rate_from_acceptance(0.95, high.draft_n_max)
    assert f"acceptance {100 * rate:.0f}%" in high.reason


def test_a_poor_measured_acceptance_turns_mtp_off() -> None:
    low = _plan((("mtp", 0.05),)).speculative
    assert low is not None and low.kind is not SpecKind.MTP
    mtp = next(o for o in low.options if o.kind is SpecKind.MTP)
    assert mtp.measured and mtp.tps < mtp.tps_without * 1.15  # no real gain: not chosen


def test_a_measured_acceptance_moves_only_its_own_kind() -> None:
    fitted, other = _plan(None).speculative, _plan((("ngram", 0.9),)).speculative
    assert fitted is not None and other is not None

    def option(d, kind):  # type: ignore[no-untyped-def]
        return next(o for o in d.options if o.kind is kind)

    assert option(other, SpecKind.MTP) == option(fitted, SpecKind.MTP)
    assert option(other, SpecKind.NGRAM).measured and not option(fitted, SpecKind.NGRAM).measured
