"""benchmarks/quality_accuracy.py: the held-out figure is quantpick's own generic figure."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from fit_quality import Curve, Fit, fit, load  # noqa: E402
from quality_accuracy import ANCHOR_ARCH, generic_ln, held_out, same_family_levels  # noqa: E402

from quantpick.plan.quality import QualityModel, quality_of  # noqa: E402
from quantpick.plan.quality_types import base_type  # noqa: E402

NOBODY = QualityModel("unmeasured", "no-such-arch", 7e9, frozenset())


Data = tuple[list[Curve], Fit]


@pytest.fixture(scope="module")
def data() -> Data:
    curves, _ = load()
    return curves, fit(curves)


@pytest.mark.parametrize("quant,bpw", [("Q4_K_M", 4.9), ("IQ4_XS", 4.25), ("Q2_K", 2.7)])
def test_the_benchmark_predicts_what_quantpick_says(data: Data, quant: str, bpw: float) -> None:
    _, full = data
    ours = quality_of(quant, bpw, NOBODY).mean_kld
    assert math.exp(generic_ln(full, base_type(quant) or "", bpw)) == pytest.approx(ours, rel=1e-3)


def test_every_family_but_the_scale_s_own_is_held_out(data: Data) -> None:
    curves, full = data
    results = held_out(curves, full)
    assert set(results) == {c.arch for c in curves} - {ANCHOR_ARCH}
    for arch, kinds in results.items():
        n = sum(len(c.points) for c in curves if c.arch == arch)
        assert len(kinds["generic"]) == len(kinds["shape"]) == n
    assert {m for _, m, _ in same_family_levels(full)} <= set(full.levels)
