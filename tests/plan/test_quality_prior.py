"""The generated prior: every number refitted from the data files, every point its row."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from quantpick.plan import quality_prior as prior
from quantpick.plan.quality_types import KNOTS, REF_BPW

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import fit_quality  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
ROWS = {
    r["id"]: r
    for name in ("quality-families.json", "quality-measurements.json")
    for r in json.loads((DATA / name).read_text())
}
# The module keeps 4 decimals of every fitted number.
ROUNDED = 6e-5


@pytest.fixture(scope="module")
def refit() -> fit_quality.Fit:
    curves, _ = fit_quality.load()
    return fit_quality.fit(curves)


def test_fitted_constants_are_the_fit_of_the_data(refit: fit_quality.Fit) -> None:
    assert prior.SHAPE == pytest.approx(refit.shape, abs=ROUNDED)
    assert prior.TYPE_EFFECT == pytest.approx(refit.tau, abs=ROUNDED)
    assert prior.HARNESS == pytest.approx(refit.harness, abs=ROUNDED)
    assert prior.SIZE_SLOPE == pytest.approx(refit.size_slope, abs=ROUNDED)
    assert prior.GENERIC_LEVEL == pytest.approx(refit.generic_level, abs=ROUNDED)
    assert prior.GENERIC_ARCHS == refit.generic_archs
    assert {c.key for c in prior.CURVES} == {c.key for c in refit.curves}
    for c in prior.CURVES:
        assert c.level == pytest.approx(refit.alpha[c.key], abs=ROUNDED), c.key
        fitted = next(x for x in refit.curves if x.key == c.key)
        assert [p.row for p in c.points] == [p.row for p in fitted.points], c.key
        assert (c.source, c.model, c.arch) == (fitted.source, fitted.model, fitted.arch)
        assert c.params == pytest.approx(fitted.params, rel=1e-5)


def test_every_point_is_the_row_it_cites() -> None:
    for c in prior.CURVES:
        for p in c.points:
            row = ROWS[p.row]
            kld = row["mean_kld"] if "mean_kld" in row else row["value_num"]
            assert row.get("metric", "mean_kld") == "mean_kld"
            assert kld == pytest.approx(p.mean_kld), p.row
            assert row["bpw"] == pytest.approx(p.bpw), p.row
            assert row["quant_type"] == p.quant_type, p.row
            assert not row.get("extrapolated"), p.row  # filled-in values are never fitted
        bpws = [p.bpw for p in c.points]
        assert bpws == sorted(bpws)


def test_the_shape_is_read_at_the_reference_and_never_rises() -> None:
    assert prior.SHAPE[KNOTS.index(REF_BPW)] == 0
    assert all(a >= b for a, b in zip(prior.SHAPE, prior.SHAPE[1:], strict=False))
    assert len(prior.SHAPE) == len(KNOTS)


def test_the_harness_offsets_come_from_shared_models(refit: fit_quality.Fit) -> None:
    # apex35 is the scale; Thireus measured its model; llama.cpp's table shares no model
    assert refit.harness["apex"] == 0 and refit.harness["llamacpp"] == 0
    th = {c.model: refit.alpha[c.key] for c in refit.curves if c.source == "thireus"}
    apex = next(refit.alpha[c.key] for c in refit.curves if c.source == "apex")
    assert refit.harness["thireus"] == pytest.approx(th["Qwen3.5-35B-A3B"] - apex)


def test_what_is_left_out_says_why() -> None:
    curves, skipped = fit_quality.load()
    keys = {c.key for c in curves}
    text = "\n".join(skipped)
    # a quantized baseline, a harness floor, a failed run
    assert "thireus/DeepSeek-V3.1-Terminus" not in keys and "baseline iq4_nl" in text
    assert "thireus/gemma-4-31B-it" not in keys and "Q8_0 mean KLD 0.302346" in text
    assert "thireus-kimi-k2.5-iq2_s: left out" in text
    # rows a source filled in are in the data, marked, and never fitted
    filled = [r for r in ROWS.values() if r.get("extrapolated")]
    assert filled and all("group0_enricher" in (r["source_note"] or "") for r in filled)
    fitted = {p.row for c in curves for p in c.points}
    assert not fitted & {r["id"] for r in filled}


def test_every_family_row_names_its_source_at_a_commit() -> None:
    fam = json.loads((DATA / "quality-families.json").read_text())
    for r in fam:
        assert r["source_url"].startswith("https://github.com/"), r["id"]
        assert r["commit"] and (r["commit"] in r["source_url"]), r["id"]
        assert r["arch"] and r["model"] and r["baseline"], r["id"]
        assert r["bpw"] is None or 1.0 < r["bpw"] < 17, r["id"]
        assert r["mean_kld"] >= 0 and math.isfinite(r["mean_kld"]), r["id"]
