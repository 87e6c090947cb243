"""`bench --spec` stores what it measured: the per-token acceptance goes into the profile entry
(before: measured, printed, "not stored in the calibration")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantpick.jobs.bench import BenchReport, with_speculation
from quantpick.plan.calibration import plausibility_problems, speculation_acceptance
from quantpick.plan.speculative import rate_from_acceptance


def report(entry: dict) -> BenchReport:
    return BenchReport(None, None, {}, None, (), "b", "b", entry)  # type: ignore[arg-type]


def measured(rate: float | None, n: int = 4, ok: bool = True) -> dict:
    return {"measured": ok, "kind": "mtp", "draft_n_max": n, "acceptance": rate,
            "decode_tps_with": 30.0, "decode_tps_without": 20.0}  # fmt: skip


@given(st.floats(0.02, 0.98), st.integers(1, 8))
def test_the_stored_acceptance_is_the_measured_rate_per_token(rate: float, n: int) -> None:
    entry = with_speculation(report({"ratios": {}}), measured(rate, n)).entry
    stored = entry["speculation"]["mtp"]
    assert stored["rate"] == pytest.approx(rate, abs=1e-4)
    assert rate_from_acceptance(stored["acceptance"], n) == pytest.approx(rate, abs=2e-3)
    assert speculation_acceptance(entry) == (("mtp", stored["acceptance"]),)
    assert not [p for p in plausibility_problems(entry) if p.startswith("speculation")]


@pytest.mark.parametrize("doc", [None, measured(None), measured(0.5, ok=False), measured(0.0)])
def test_nothing_measured_stores_nothing(doc: dict | None) -> None:
    assert "speculation" not in with_speculation(report({"ratios": {}}), doc).entry
