"""Quality figures: every constant against the published rows it cites, the bases, the tiers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantpick.model.registry import find_manifest
from quantpick.plan.quality import (
    CORROBORATING,
    FAMILY,
    GENERIC,
    TIER_BOUNDS,
    QualitySource,
    quality_of,
    tier_of,
)

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "quality-measurements.json"
ROWS = {r["id"]: r for r in json.loads(DATA.read_text())}


@pytest.mark.parametrize("source", [FAMILY, *CORROBORATING, GENERIC], ids=lambda s: s.key)
def test_every_point_is_the_row_it_cites(source: QualitySource) -> None:
    for p in source.points:
        by_metric = {ROWS[i]["metric"]: ROWS[i] for i in p.rows}
        assert by_metric["mean_kld"]["value_num"] == pytest.approx(p.mean_kld)
        if p.ppl_ratio is not None:
            assert by_metric["ppl_ratio"]["value_num"] == pytest.approx(p.ppl_ratio)
        for row in by_metric.values():
            assert row["group"] == source.key
            assert row["quant_type"].upper() == p.quant_type.upper()
            assert row["bpw"] == pytest.approx(p.bpw)


def test_family_points_are_one_harness_and_sorted() -> None:
    groups = {ROWS[i]["group"] for p in FAMILY.points for i in p.rows}
    assert groups == {"apex35"}
    bpws = [p.bpw for p in FAMILY.points]
    assert bpws == sorted(bpws)


def test_bases() -> None:
    assert quality_of("IQ2_M", 2.83).basis == "measured"
    assert quality_of("Q8_0", 8.52).basis == "measured"
    q4 = quality_of("Q4_K_M", 4.89)
    assert q4.basis == "interpolated" and "UD-Q4_K_L" in q4.source and "apex35-0088" in q4.source
    assert quality_of("UD-IQ1_M", 2.32).basis == "estimated"
    assert quality_of("Q4_K_M", None).basis == "estimated"  # no size: the type's nominal size
    bf16 = quality_of("BF16", 16.0)
    assert bf16.basis == "reference" and bf16.mean_kld == 0 and "not for daily use" in bf16.verdict
    # a name that matches a measured point at another size is not "measured" (unsloth's newer
    # UD-Q8_K_XL is 8.88 bpw; the measured one was 11.23)
    assert quality_of("UD-Q8_K_XL", 8.88).basis == "interpolated"


def test_tiers_follow_the_data() -> None:
    # PPL within one stderr of BF16 / within 2% / until the task scores drop
    assert TIER_BOUNDS[0] < TIER_BOUNDS[1] < TIER_BOUNDS[2]
    assert tier_of(0.009737) == 0  # UD-Q4_K_XL: PPL +0.26%
    assert tier_of(0.015083) == 1  # UD-Q4_K_L: PPL +0.75%
    assert tier_of(0.042034) == 2  # Q3_K_M: PPL +2.95%, tasks within noise
    assert tier_of(0.111304) == 3  # IQ2_M: tasks drop
    # The notes: past the ~5 bpw knee more bits are not noticeable; Q2/IQ2 are.
    m = find_manifest("qwen3.8-35b-a3b-distill")
    tiers = {f.quant: quality_of(f.quant, f.bits_per_weight).tier for f in m.files}
    assert tiers["Q4_K_M"] == tiers["Q5_K_M"] == tiers["Q6_K"] == tiers["Q8_0"] == 0
    assert tiers["Q2_K"] == tiers["IQ2_M"] == 3


def test_other_harnesses_corroborate_without_mixing() -> None:
    q = quality_of("UD-Q4_K_XL", 5.16)
    assert q.basis == "measured" and q.mean_kld == pytest.approx(0.009737)
    assert any("Qwen3.6" in s and "0.0134" in s for s in q.also_measured)


@given(st.floats(min_value=1.5, max_value=15.0), st.floats(min_value=0.01, max_value=3.0))
def test_more_bits_never_lose_more(bpw: float, more: float) -> None:
    a, b = quality_of("custom", bpw), quality_of("custom", bpw + more)
    assert b.mean_kld <= a.mean_kld + 1e-9
    assert b.tier <= a.tier


def test_bundled_manifests_get_a_figure_for_every_quant() -> None:
    for model in ("qwen3.8-35b-a3b-distill", "qwen3.6-35b-a3b-unsloth"):
        m = find_manifest(model)
        for f in m.files:
            if f.role == "model":
                q = quality_of(f.quant, f.bits_per_weight)
                assert q.basis in ("reference", "measured", "interpolated", "estimated")
                assert q.source and q.verdict
