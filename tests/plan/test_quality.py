"""Quality figures: every constant against the published rows it cites, the bases, the tiers."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantpick.model.registry import find_manifest
from quantpick.plan import quality_prior as prior
from quantpick.plan.quality import (
    CORROBORATING,
    FAMILY,
    FAMILY_ARCH,
    FAMILY_PARAMS,
    GENERIC,
    TIER_BOUNDS,
    QualityModel,
    QualitySource,
    model_key,
    model_of,
    quality_of,
    tier_of,
)
from quantpick.plan.quality_types import PriorCurve

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
    rows = [ROWS[i] for p in FAMILY.points for i in p.rows]
    assert {r["arch"] for r in rows} == {FAMILY_ARCH}
    note = f"derived: size x 8 / {FAMILY_PARAMS / 1e9:g}e9 params"
    assert {r["bpw_note"] for r in rows} == {note}
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


# ---- any model: the basis chosen, the figure on the family scale -------------------------------

GLM_AIR = QualityModel("GLM-4.5-Air", "glm4moe", 110.469e9, frozenset({"glm-4.5-air"}))
GLM_OTHER = QualityModel("GLM-4.5-Air-Derestricted", "glm4moe", 110.469e9, frozenset())
UNKNOWN = QualityModel("Mistral-Small-3.2-24B", "mistral3", 24e9, frozenset())
QWEN3_4B = QualityModel(
    "Qwen3 4B Instruct 2507", "qwen3", 4.022e9, frozenset({"qwen3-4b-instruct-2507"})
)


def _curve(key: str) -> PriorCurve:
    return next(c for c in prior.CURVES if c.key == key)


def test_basis_follows_what_is_published() -> None:
    own = quality_of("Q4_K_M", 4.9, GLM_AIR)
    assert own.scope == "measured for this model (Thireus/GGUF-Tool-Suite)"
    assert own.basis == "interpolated" and "GLM-4.5-Air's curve" in own.source
    fam = quality_of("Q4_K_M", 4.9, GLM_OTHER)
    assert fam.scope == "same family (glm4moe, 4 models)" and fam.basis == "interpolated"
    gen = quality_of("Q4_K_M", 4.9, UNKNOWN)
    assert gen.scope == f"generic by bpw ({len(prior.GENERIC_ARCHS)} families)"
    assert gen.basis == "estimated" and gen.note and "mistral3" in gen.note
    both = quality_of("Q4_K_S", 4.74, QWEN3_4B)  # MagicQuant measured this recipe
    assert both.basis == "measured" and "MagicQuant" in both.scope
    assert any("its own harness" in s and "0.029803" in s for s in both.also_measured)
    # a reference is a reference whatever the model
    assert quality_of("BF16", 16.0, UNKNOWN).basis == "reference"


def test_a_measured_point_is_that_measurement_on_the_family_scale() -> None:
    c = _curve("thireus/GLM-4.5-Air")
    p = next(p for p in c.points if p.quant_type == "Q4_K")
    q = quality_of("Q4_K", p.bpw, GLM_AIR)
    assert q.basis == "measured" and p.row in q.source
    assert q.mean_kld == pytest.approx(p.mean_kld / math.exp(prior.HARNESS["thireus"]), rel=1e-4)
    # llama.cpp's table shares no model with the family scale: taken at face value
    llama = QualityModel("Meta-Llama-3-8B", "llama", 8.04e9, frozenset({"meta-llama-3-8b"}))
    assert quality_of("Q4_K_M", 4.8944, llama).mean_kld == pytest.approx(
        statistics.fmean([0.028152, 0.031273]), rel=0.02
    )  # the table's imatrix and plain Q4_K_M


def test_the_family_curve_is_unchanged_for_its_own_models() -> None:
    for name in ("qwen3.8-35b-a3b-distill", "qwen3.6-35b-a3b-unsloth"):
        m = find_manifest(name)
        model = model_of(m)
        assert model.arch == "qwen35moe" and model.params == pytest.approx(34.66e9, rel=0.05)
        for f in m.files:
            if f.role != "model":
                continue
            new, old = (
                quality_of(f.quant, f.bits_per_weight, model),
                quality_of(f.quant, f.bits_per_weight),
            )
            assert (new.mean_kld, new.tier, new.basis, new.source) == (
                old.mean_kld, old.tier, old.basis, old.source
            )  # fmt: skip
            assert new.scope == "same family (qwen35moe: Qwen3.5-35B-A3B's curve)"
    qwen35 = QualityModel("Qwen3.5-35B-A3B", "qwen35moe", 34.66e9, frozenset({"qwen3.5-35b-a3b"}))
    assert quality_of("Q8_0", 8.53, qwen35).scope == "measured for this model (mudler/apex-quant)"
    # a far larger qwen35moe reads its own published curve, not the 35B one
    big = QualityModel("Qwen3.5-397B-A17B", "qwen35moe", 396e9, frozenset({"qwen3.5-397b-a17b"}))
    assert quality_of("Q4_K_M", 4.9, big).scope.startswith("measured for this model")


def test_model_keys_and_size_from_a_manifest() -> None:
    assert model_key("unsloth/Qwen3.6-35B-A3B-GGUF") == "qwen3.6-35b-a3b"
    assert model_key("bartowski/Qwen_Qwen3-4B-Instruct-2507-GGUF") == "qwen3-4b-instruct-2507"
    assert model_key("mradermacher/GLM-4.5-Air-i1-GGUF") == "glm-4.5-air"
    assert model_key("Qwen3 4B Instruct 2507") == "qwen3-4b-instruct-2507"
    assert model_key("Qwen3.6-35B-A3B (unsloth GGUF)") == "qwen3.6-35b-a3b"
    m = model_of(find_manifest("qwen3.6-35b-a3b-unsloth"))
    assert "qwen3.6-35b-a3b" in m.keys


MODELS = st.sampled_from([GLM_AIR, GLM_OTHER, UNKNOWN, QWEN3_4B])
TYPES = st.sampled_from(["custom", "Q4_K_M", "Q3_K_S", "IQ4_XS", "IQ2_M", "Q4_0", "Q6_K"])


@given(MODELS, TYPES, st.floats(min_value=1.0, max_value=12.0), st.floats(0.01, 4.0))
def test_more_bits_of_one_type_never_lose_more(
    model: QualityModel, quant: str, bpw: float, more: float
) -> None:
    a, b = quality_of(quant, bpw, model), quality_of(quant, bpw + more, model)
    assert b.mean_kld <= a.mean_kld + 1e-9
    assert b.tier <= a.tier


@given(st.floats(min_value=1.0, max_value=12.0), st.floats(0.01, 4.0))
def test_the_generic_curve_never_favours_fewer_bits(bpw: float, more: float) -> None:
    a, b = quality_of("custom", bpw, UNKNOWN), quality_of("custom", bpw + more, UNKNOWN)
    assert b.mean_kld <= a.mean_kld + 1e-9


def test_the_type_effect_is_the_data_s() -> None:
    # at one size an IQ type loses less than a k-quant and a legacy type more (prior.TYPE_EFFECT,
    # fitted on Thireus's pure quants); the type of a name is the one holding most weights
    k, iq, legacy = (quality_of(q, 4.5, UNKNOWN).mean_kld for q in ("Q4_K_S", "IQ4_XS", "Q4_0"))
    assert iq < k < legacy
    assert k * math.exp(prior.TYPE_EFFECT["Q4_0"]) == pytest.approx(legacy, rel=1e-3)


@pytest.mark.parametrize(
    ("quant", "bpw"), [("IQ4_XS", 4.10), ("Q4_0", 4.35), ("Q4_K_M", 4.65), ("custom", 8.5)]
)
def test_no_step_up_where_a_measurement_s_neighbourhood_begins(quant: str, bpw: float) -> None:
    # these sizes once jumped: a measured point's own figure switched on 0.15 bpw away from it
    a, b = quality_of(quant, bpw, GLM_AIR), quality_of(quant, bpw + 0.01, GLM_AIR)
    assert b.mean_kld <= a.mean_kld + 1e-9
