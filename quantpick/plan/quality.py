"""How much a quant loses against the BF16 weights, from published measurements. Pure.

One scale for every decision, "the family scale": mean KL divergence vs the 16-bit model measured
by one harness on one model (mudler/apex-quant on Qwen3.5-35B-A3B: llama-perplexity, wikitext-2,
ctx 2048). The tiers are read on it. Absolute KLD is never compared across harnesses; other
sources corroborate (`also_measured`) or, for other models, are put on this scale first.

Which measurements a figure rests on (`Quality.scope`, shown to the user), in this order:
- "measured for this model": a published curve of this model (its model key, `model_key`, from
  the repository, display name, id or aliases). For Qwen3.5-35B-A3B that is the family curve
  itself; other models' curves come from quality_prior.py;
- "same family": curves of models with the same general.architecture, their level moved along
  SIZE_SLOPE to this model's parameter count. A qwen35moe model within SIMILAR_SIZE of 35B
  (Qwen3.6-35B-A3B, the Qwen3.8 distill) uses the family curve as it always has;
- "generic by bpw": the cross-family curve at GENERIC_LEVEL, for an architecture nobody measured.
Within a scope the figure's `basis` says how: "reference" (the 16-bit file), "measured" (this quant
type at about this size), "interpolated" (between measured sizes), "estimated" (outside them, or
the type's nominal size when the file's is unknown).

The prior (scripts/fit_quality.py, data in quality_prior.py). Harnesses differ (corpus, context,
pure vs mixed recipes), so each source is normalized within itself before pooling: a curve is
ln KLD = level + shape(bpw) + type effect + its own residual, where the level is the curve's ln KLD
at 4.5 bpw in its own harness, the shape (0 at 4.5 bpw, non-increasing) and the type effects
(IQ/legacy types against the k-quant backbone at the same bpw) are shared by every curve, and the
residual is what is left of that curve's own points (interpolated between them by bpw). Only the
levels carry a harness: each source's offset to the family scale comes from a model it measured
in common with a source already on the scale (Thireus measured Qwen3.5-35B-A3B; MagicQuant shares
two models with Thireus); llama.cpp's LLaMA-3-8B table shares none and is taken at face value.
So a figure for another model is: its level on the family scale + the shape at the file's bpw +
its type's effect (+ its own residual when measured). Leave-one-family-out error of the generic
figure: benchmarks/quality_accuracy.py.

Every constant names the rows of benchmarks/data/quality-*.json it comes from;
tests/plan/test_quality.py and test_quality_prior.py check them against those files. Compare by
bits per weight, not by quant name: community recipes keep attention and shared experts at higher
precision, so this MoE loses 2.5-3x less KLD at <=5 bpw than the generic table says (notes
quality-and-speed.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from types import ModuleType
from typing import TYPE_CHECKING

from quantpick.plan.quality_types import BACKBONE, KNOTS, PriorCurve, PriorPoint, base_type

if TYPE_CHECKING:
    from quantpick.model.manifest import Manifest


@dataclass(frozen=True)
class QualityPoint:
    quant_type: str  # "Q5_K_S", "UD-Q4_K_XL"
    bpw: float  # file bytes x 8 / parameters
    mean_kld: float
    ppl_ratio: float | None  # PPL(quant) / PPL(16-bit)
    rows: tuple[str, ...]  # ids in quality-measurements.json


@dataclass(frozen=True)
class QualitySource:
    key: str
    model: str
    harness: str
    url: str
    points: tuple[QualityPoint, ...]  # sorted by bpw


# The family scale: every standard llama.cpp/unsloth quant apex-quant measured (its own APEX mixes
# are left out: one recipe family per curve). PPL stderr there is ~0.042 on 6.54 (0.64%, rows
# apex35-0052/0087/0099/0134/0158).
FAMILY = QualitySource(
    key="apex35",
    model="Qwen3.5-35B-A3B",
    harness="mudler/apex-quant, llama-perplexity KLD vs F16 on wikitext-2, ctx 2048",
    url="https://github.com/mudler/apex-quant/tree/a84d43e3f4a0898e1f629982d4d97145647ebc5c/benchmark_results/final",
    points=(
        QualityPoint("IQ2_M", 2.80, 0.111304, 1.1171, ("apex35-0159", "apex35-0168")),
        QualityPoint("Q3_K_M", 3.74, 0.042034, 1.0295, ("apex35-0135", "apex35-0144")),
        QualityPoint("UD-Q4_K_L", 4.66, 0.015083, 1.0075, ("apex35-0100", "apex35-0109")),
        QualityPoint("UD-Q4_K_XL", 5.13, 0.009737, 1.0026, ("apex35-0088", "apex35-0097")),
        QualityPoint("Q5_K_S", 5.72, 0.006918, 0.9997, ("apex35-0053", "apex35-0062")),
        QualityPoint("Q8_0", 8.53, 0.00458, 0.9993, ("apex35-0018", "apex35-0027")),
        QualityPoint("UD-Q8_K_XL", 11.23, 0.002464, 0.9998, ("apex35-0007", "apex35-0016")),
    ),
)

# The family curve's model: general.architecture and parameter count (rows apex35-*: "derived:
# size x 8 / 34.66e9 params").
FAMILY_ARCH = "qwen35moe"
FAMILY_PARAMS = 34.66e9
# A model of the family's architecture within this factor of its size reads the family curve.
SIMILAR_SIZE = 2.0

# Same harness author, the Qwen3.6 unsloth files themselves (sizes rounded to GiB on the card, so
# bpw is +-0.1): shown beside the family figure, never mixed into it.
CORROBORATING = (
    QualitySource(
        key="apex36",
        model="Qwen3.6-35B-A3B",
        harness="mudler/Qwen3.6-35B-A3B-APEX-GGUF card, KLD vs BF16 on wikitext-2",
        url="https://huggingface.co/mudler/Qwen3.6-35B-A3B-APEX-GGUF/blob/be6fa3a312f1b6a22a2a2a0769ec577afab056d6/README.md",
        points=(
            QualityPoint("UD-Q3_K_M", 3.97, 0.0435, 1.024, ("apex36-0237", "apex36-0241")),
            QualityPoint("UD-Q4_K_M", 5.2, 0.0138, 1.0021, ("apex36-0219", "apex36-0223")),
            QualityPoint("UD-Q4_K_XL", 5.2, 0.0134, 1.0019, ("apex36-0213", "apex36-0217")),
            QualityPoint("UD-Q5_K_S", 5.95, 0.0095, 1.0009, ("apex36-0183", "apex36-0187")),
            QualityPoint("UD-Q5_K_XL", 6.2, 0.0083, 1.0004, ("apex36-0177", "apex36-0181")),
            QualityPoint("Q8_0", 8.67, 0.0059, 0.9997, ("apex36-0171", "apex36-0175")),
        ),
    ),
)

# llama.cpp's generic table (Llama-3-8B, imatrix where the row says so): the shape of the curve
# where the family has no point, and the nominal size of a quant type when a file's is unknown.
GENERIC = QualitySource(
    key="llama3",
    model="Meta-Llama-3-8B",
    harness="llama.cpp tools/perplexity/README.md KLD table",
    url="https://github.com/ggml-org/llama.cpp/blob/master/tools/perplexity/README.md",
    points=(
        QualityPoint("IQ2_M", 2.9294, 0.325989, 1.3798, ("llama3-0463", "llama3-0466")),
        QualityPoint("Q2_K", 3.1593, 0.332223, 1.3874, ("llama3-0469", "llama3-0472")),
        QualityPoint("IQ3_M", 3.7628, 0.102534, 1.1067, ("llama3-0451", "llama3-0454")),
        QualityPoint("IQ4_XS", 4.4597, 0.036334, 1.0363, ("llama3-0427", "llama3-0430")),
        QualityPoint("Q4_K_S", 4.6672, 0.031951, 1.0283, ("llama3-0415", "llama3-0418")),
        QualityPoint("IQ4_NL", 4.6818, 0.035742, 1.0357, ("llama3-0421", "llama3-0424")),
        QualityPoint("Q4_K_M", 4.8944, 0.028152, 1.024, ("llama3-0403", "llama3-0406")),
        QualityPoint("Q5_K_S", 5.5704, 0.016595, 1.0166, ("llama3-0397", "llama3-0400")),
        QualityPoint("Q5_K_M", 5.7036, 0.010762, 1.0089, ("llama3-0391", "llama3-0394")),
        QualityPoint("Q6_K", 6.5633, 0.005452, 1.0032, ("llama3-0385", "llama3-0388")),
        QualityPoint("Q8_0", 8.5008, 0.001355, 1.0002, ("llama3-0379", "llama3-0382")),
    ),
)

REFERENCE_TYPES = ("BF16", "F16", "F32")

# Tiers: where the data says a difference can be noticed. The bounds are computed from the family
# points (below), not typed in:
# - tier 0: PPL within one standard error (0.64%) of the 16-bit model, task scores unchanged: the
#   ~5 bpw knee (UD-Q4_K_XL, 0.0097: PPL +0.26%). Above it more bits are not noticeable: 5.7 bpw
#   -> Q8_0 gains 0.002 KLD with PPL unchanged.
# - tier 1: PPL measurably higher, up to +2% (about three standard errors); task scores in noise.
# - tier 2: up to the geometric mean of Q3_K_M (0.042: PPL +2.95%, task scores within ~2.5
#   points) and IQ2_M (0.111), the nearest measured quants on either side of the drop.
# - tier 3: task scores drop (IQ2_M: PPL +11.7%, HellaSwag 82.5 -> 80.25, MMLU 41.5 -> 39.6;
#   rows apex35-0001/0003/0163/0165). Q2/IQ2 files land here.
PPL_STDERR = 0.0064  # 0.042 / 6.54, rows apex35-0052/0087/0099/0134/0158


def _kld_where_ppl(ppl_ratio: float) -> float:
    """Mean KLD on the family curve where the interpolated PPL ratio crosses `ppl_ratio`."""
    pts = FAMILY.points
    for lo, hi in zip(pts, pts[1:], strict=False):
        a, b = lo.ppl_ratio, hi.ppl_ratio
        if a is not None and b is not None and b <= ppl_ratio <= a:
            frac = (a - ppl_ratio) / (a - b)
            return math.exp(
                math.log(lo.mean_kld) + frac * (math.log(hi.mean_kld) - math.log(lo.mean_kld))
            )
    raise ValueError(f"PPL ratio {ppl_ratio} is outside the family curve")


_IQ2, _Q3 = FAMILY.points[0], FAMILY.points[1]
TIER_BOUNDS = (
    round(_kld_where_ppl(1 + PPL_STDERR), 4),
    round(_kld_where_ppl(1.02), 4),
    round(math.sqrt(_IQ2.mean_kld * _Q3.mean_kld), 4),
)
TIER_WORDS = (
    "near-lossless: not noticeable against BF16",
    "small loss: measurable in perplexity, not in task scores",
    "measurable loss: perplexity +2-6%, task scores within ~2.5 points",
    "noticeable loss: task scores drop",
)
# Two sizes count as the same measurement when their bpw differ by less than this (the card sizes
# of apex36 are rounded to whole GiB: +-0.1 bpw).
SAME_SIZE_BPW = 0.15


@dataclass(frozen=True)
class Quality:
    quant: str
    bpw: float | None
    mean_kld: float  # vs the 16-bit weights, on the family scale
    ppl_ratio: float | None
    basis: str  # "reference" | "measured" | "interpolated" | "estimated"
    source: str  # where the figure comes from, in words, with row ids
    tier: int  # 0 (not noticeable) .. 3 (noticeable), see TIER_BOUNDS
    verdict: str  # TIER_WORDS[tier]
    also_measured: tuple[str, ...] = ()  # same quant and size measured by other harnesses
    note: str | None = None
    # whose measurements the figure rests on: "measured for this model", "same family
    # (glm4moe, 4 models)", "generic by bpw (8 families)" (module doc)
    scope: str = ""


@dataclass(frozen=True)
class QualityModel:
    """The model a quant belongs to, as the quality figures need it."""

    name: str  # for the user
    arch: str  # general.architecture
    params: float | None  # parameters (file bytes x 8 / bits per weight)
    keys: frozenset[str] = frozenset()  # model_key of its names


_GGUF_SUFFIX = re.compile(r"(-i1)?-gguf$")
_PAREN = re.compile(r"\s*\(.*\)\s*$")


def model_key(name: str) -> str:
    """A model's name as the data names it: 'unsloth/Qwen3.6-35B-A3B-GGUF' -> 'qwen3.6-35b-a3b',
    'bartowski/Qwen_Qwen3-4B-Instruct-2507-GGUF' -> 'qwen3-4b-instruct-2507' (the publisher's
    'Org_' prefix), 'Qwen3 4B Instruct 2507' (general.name) -> 'qwen3-4b-instruct-2507'."""
    n = _PAREN.sub("", name.strip().rsplit("/", 1)[-1]).lower().replace(" ", "-")
    n = _GGUF_SUFFIX.sub("", n)
    if "_" in n:
        n = n.split("_", 1)[1]
    return n


def model_of(manifest: Manifest) -> QualityModel:
    """The QualityModel of a manifest: its names (repositories, display name, id, aliases) and
    parameter count (a quant's bytes x 8 / its bits per weight: the same for every quant)."""
    names = [s.repo for s in manifest.sources if s.repo]
    names += [manifest.display_name, manifest.id, *manifest.aliases]
    params = []
    for quant in manifest.quants:
        files = [f for f in manifest.quant_files(quant) if f.role == "model"]
        if files and files[0].bits_per_weight:
            params.append(sum(f.size_bytes for f in files) * 8 / files[0].bits_per_weight)
    return QualityModel(
        name=manifest.display_name,
        arch=manifest.architecture.name,
        params=sorted(params)[len(params) // 2] if params else None,
        keys=frozenset(model_key(n) for n in names if n),
    )


def tier_of(mean_kld: float) -> int:
    for tier, bound in enumerate(TIER_BOUNDS):
        if mean_kld <= bound:
            return tier
    return len(TIER_BOUNDS)


def _base_type(quant: str) -> str:
    """'UD-Q4_K_XL' -> 'Q4_K_XL', 'Q4_K_M' -> 'Q4_K_M' (publisher prefixes dropped)."""
    q = quant.upper()
    for prefix in ("UD-", "IMAT-", "I-"):
        q = q.removeprefix(prefix)
    return q


def _loglinear(points: tuple[QualityPoint, ...], bpw: float, attr: str) -> float | None:
    """Log-linear interpolation of `attr` (mean_kld) or linear of ppl_ratio between neighbours."""
    pts = [p for p in points if getattr(p, attr) is not None]
    for lo, hi in zip(pts, pts[1:], strict=False):
        if lo.bpw <= bpw <= hi.bpw:
            frac = (bpw - lo.bpw) / (hi.bpw - lo.bpw) if hi.bpw > lo.bpw else 0.0
            a, b = getattr(lo, attr), getattr(hi, attr)
            if attr == "mean_kld":
                return math.exp(math.log(a) + frac * (math.log(b) - math.log(a)))
            return float(a + frac * (b - a))
    return None


def _generic_slope_below(bpw: float, anchor: QualityPoint) -> float:
    """KLD below the family's lowest point: the anchor times the generic table's ratio between the
    two sizes (the generic curve's own slope, extrapolated log-linearly under its lowest point)."""
    g = GENERIC.points
    lo, hi = g[0], g[2]  # IQ2_M and IQ3_M: the steep end of the generic curve
    slope = (math.log(hi.mean_kld) - math.log(lo.mean_kld)) / (hi.bpw - lo.bpw)
    return float(anchor.mean_kld * math.exp(slope * (bpw - anchor.bpw)))


def _nominal_bpw(quant: str) -> float | None:
    """The generic table's size of a quant type (Q4_K_XL: its class, Q4_K_M's size)."""
    base = _base_type(quant)
    exact = {p.quant_type: p.bpw for p in GENERIC.points}
    if base in exact:
        return exact[base]
    same_class = [
        p.bpw for p in GENERIC.points if p.quant_type.rsplit("_", 1)[0] == base.rsplit("_", 1)[0]
    ]
    return max(same_class) if same_class else None


def _rows(p: QualityPoint) -> str:
    return ", ".join(p.rows)


def _also(quant: str, bpw: float | None) -> tuple[str, ...]:
    out = []
    for src in CORROBORATING:
        for p in src.points:
            if p.quant_type.upper() == quant.upper() and (
                bpw is None or abs(p.bpw - bpw) <= SAME_SIZE_BPW
            ):
                out.append(
                    f"{src.model} ({src.key}): mean KLD {p.mean_kld:g}"
                    + (f", PPL x{p.ppl_ratio:g}" if p.ppl_ratio else "")
                    + f" [{_rows(p)}]"
                )
    return tuple(out)


def _reads_family_curve(model: QualityModel | None) -> bool:
    if model is None:
        return True
    if model.arch != FAMILY_ARCH:
        return False
    return model.params is None or 1 / SIMILAR_SIZE <= model.params / FAMILY_PARAMS <= SIMILAR_SIZE


def _family_scope(model: QualityModel | None) -> str:
    if model is not None and model_key(FAMILY.model) in model.keys:
        return f"measured for this model ({FAMILY.harness.split(',')[0]})"
    return f"same family ({FAMILY_ARCH}: {FAMILY.model}'s curve)"


def quality_of(quant: str, bpw: float | None, model: QualityModel | None = None) -> Quality:
    """The quality figure of one quant (`bpw`: the file's bits per weight) of `model` (None: a
    model the family curve describes), with its basis and scope."""
    if _base_type(quant) not in REFERENCE_TYPES and not _reads_family_curve(model):
        assert model is not None
        return _prior_quality(quant, bpw, model)
    q = _family_quality(quant, bpw)
    return replace(q, scope=_family_scope(model))


def _family_quality(quant: str, bpw: float | None) -> Quality:
    note = None
    if _base_type(quant) in REFERENCE_TYPES:
        return Quality(
            quant,
            bpw,
            0.0,
            1.0,
            "reference",
            "the 16-bit weights every figure is measured against",
            0,
            "reference: the full-precision weights (not for daily use)",
        )
    if "MXFP4" in quant.upper():
        note = (
            "MXFP4 experts: one public comparison (r/LocalLLaMA 1rfds1h, row tw) measured an "
            "MXFP4-heavy mix at ~5x the KLD of a Q4_K_M of similar size; the figure is by size only"
        )
    fam = FAMILY.points
    basis = "interpolated"
    size = bpw
    if size is None:
        size = _nominal_bpw(quant)
        basis = "estimated"
        if size is None:
            # Nothing to go on: the knee, said as such.
            size = 4.5
            note = (note + "; " if note else "") + "unknown quant type and size"
    same = [p for p in fam if p.quant_type.upper() == quant.upper()]
    match = next((p for p in same if abs(p.bpw - size) <= SAME_SIZE_BPW), None)
    if match is not None and bpw is not None:
        kld, ppl = match.mean_kld, match.ppl_ratio
        basis = "measured"
        source = f"measured on {FAMILY.model} ({FAMILY.harness}) [{_rows(match)}]"
    elif size < fam[0].bpw:
        kld = _generic_slope_below(size, fam[0])
        ppl = None
        basis = "estimated"
        source = (
            f"below the lowest measured size ({fam[0].quant_type}, {fam[0].bpw} bpw, "
            f"{FAMILY.model}): extended with the slope of {GENERIC.harness}"
        )
    elif size > fam[-1].bpw:
        kld, ppl = fam[-1].mean_kld, fam[-1].ppl_ratio
        source = f"at or above the largest measured size ({fam[-1].quant_type}) on {FAMILY.model}"
    else:
        kld = _loglinear(fam, size, "mean_kld") or fam[-1].mean_kld
        ppl = _loglinear(fam, size, "ppl_ratio")
        lo = max((p for p in fam if p.bpw <= size), key=lambda p: p.bpw)
        hi = min((p for p in fam if p.bpw >= size), key=lambda p: p.bpw)
        what = "interpolated" if basis == "interpolated" else "estimated from the type's size"
        source = (
            f"{what} at {size:.2f} bpw between {lo.quant_type} ({lo.bpw}) and "
            f"{hi.quant_type} ({hi.bpw}) measured on {FAMILY.model} ({FAMILY.harness}) "
            f"[{_rows(lo)}; {_rows(hi)}]"
        )
    tier = tier_of(kld)
    return Quality(
        quant=quant,
        bpw=bpw,
        mean_kld=round(kld, 6),
        ppl_ratio=round(ppl, 4) if ppl is not None else None,
        basis=basis,
        source=source,
        tier=tier,
        verdict=TIER_WORDS[tier],
        also_measured=_also(quant, bpw),
        note=note,
    )


# ---- other models: the prior (quality_prior.py) -------------------------------------------


def _prior() -> ModuleType:
    """The fitted tables (quality_prior.py), loaded on first use: a qwen35moe plan never needs
    them, and they are some hundred records."""
    from quantpick.plan import quality_prior

    return quality_prior


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


SOURCE_NAMES = {
    "apex": "mudler/apex-quant",
    "thireus": "Thireus/GGUF-Tool-Suite",
    "llamacpp": "llama.cpp's perplexity table",
    "magicquant": "MagicQuant",
}
# A type's own measured departure from the k-quant backbone fades out over this many bpw beyond
# the sizes it was measured at (half a bit: the type's neighbours are other types).
TYPE_FADE_BPW = 0.5
# The size adjustment along SIZE_SLOPE stops this factor beyond the family's measured sizes: the
# slope is fitted within families (0.8B-27B dense, 35B-397B MoE); past them it is a guess.
SIZE_EXTRAPOLATION = 4.0


def _shape(bpw: float) -> float:
    b = min(max(bpw, KNOTS[0]), KNOTS[-1])
    for i in range(len(KNOTS) - 1):
        lo, hi = KNOTS[i], KNOTS[i + 1]
        if lo <= b <= hi:
            frac = (b - lo) / (hi - lo)
            return _prior().SHAPE[i] + frac * (_prior().SHAPE[i + 1] - _prior().SHAPE[i])
    return _prior().SHAPE[-1]


def _type_effect(base: str | None) -> float:
    return _prior().TYPE_EFFECT.get(base, 0.0) if base else 0.0


def _residual(c: PriorCurve, p: PriorPoint) -> float:
    return math.log(p.mean_kld) - c.level - _shape(p.bpw) - _type_effect(p.base)


def _merged(points: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """(bpw, value) sorted, points at one bpw averaged (so interpolation is continuous)."""
    by_bpw: dict[float, list[float]] = {}
    for b, v in points:
        by_bpw.setdefault(b, []).append(v)
    return tuple(sorted((b, _mean(v)) for b, v in by_bpw.items()))


def _interp(pts: tuple[tuple[float, float], ...], bpw: float) -> float:
    """Linear between merged (bpw, value) points, the end values outside them."""
    if bpw <= pts[0][0]:
        return pts[0][1]
    for (b0, r0), (b1, r1) in zip(pts, pts[1:], strict=False):
        if b0 <= bpw <= b1:
            return r0 + (bpw - b0) / (b1 - b0) * (r1 - r0)
    return pts[-1][1]


@dataclass(frozen=True)
class _Residuals:
    """A curve's departures from the shared shape, computed once per curve."""

    backbone: tuple[tuple[float, float], ...]  # at its k-quant points (all points without one)
    by_type: dict[str, tuple[tuple[float, float], ...]]  # other types: beyond the backbone


_RESIDUALS: dict[str, _Residuals] = {}


def _residuals(c: PriorCurve) -> _Residuals:
    found = _RESIDUALS.get(c.key)
    if found is None:
        pts = [p for p in c.points if p.base in BACKBONE] or list(c.points)
        backbone = _merged([(p.bpw, _residual(c, p)) for p in pts])
        by_type: dict[str, list[tuple[float, float]]] = {}
        for p in c.points:
            if p.base and p.base not in BACKBONE:
                extra = _residual(c, p) - _interp(backbone, p.bpw)
                by_type.setdefault(p.base, []).append((p.bpw, extra))
        found = _Residuals(backbone, {t: _merged(v) for t, v in by_type.items()})
        _RESIDUALS[c.key] = found
    return found


def _curve_residual(c: PriorCurve, base: str | None, bpw: float) -> float:
    """The curve's own departure from the shared shape at `bpw`: linear between its k-quant
    points (their nearest one outside them), plus, for a type it measured off the backbone, that
    type's own departure: linear between its points, fading to 0 over TYPE_FADE_BPW beyond them
    (continuous, so a figure cannot jump where a measurement's neighbourhood begins)."""
    res = _residuals(c)
    r = _interp(res.backbone, bpw)
    own = res.by_type.get(base) if base else None
    if not own:
        return r
    gap = max(own[0][0] - bpw, bpw - own[-1][0], 0.0)
    return r + _interp(own, bpw) * max(0.0, 1 - gap / TYPE_FADE_BPW)


def _on_scale(c: PriorCurve) -> float:
    """The curve's level on the family scale."""
    return c.level - _prior().HARNESS[c.source]


def _same_point(c: PriorCurve, base: str | None, bpw: float) -> PriorPoint | None:
    near = [p for p in c.points if base and p.base == base and abs(p.bpw - bpw) <= SAME_SIZE_BPW]
    return min(near, key=lambda p: abs(p.bpw - bpw)) if near else None


def _within(curves: list[PriorCurve], bpw: float) -> bool:
    """Inside some curve's measured sizes (give or take SAME_SIZE_BPW)?"""
    return any(
        c.points[0].bpw - SAME_SIZE_BPW <= bpw <= c.points[-1].bpw + SAME_SIZE_BPW for c in curves
    )


def _monotone(ln_kld: Callable[[float], float], bpw: float, extra: tuple[float, ...]) -> float:
    """ln KLD at `bpw`, never below a larger size's: the worst of it and every breakpoint above
    (the figure is piecewise linear between KNOTS, the curves' points and the fade edges, and
    constant past the last of them)."""
    above = {x for x in (*KNOTS, *extra) if x > bpw}
    return max([ln_kld(bpw), *(ln_kld(x) for x in above)])


def _breakpoints(curves: list[PriorCurve]) -> tuple[float, ...]:
    pts = [p.bpw for c in curves for p in c.points]
    return tuple({b + d for b in pts for d in (-TYPE_FADE_BPW, 0.0, TYPE_FADE_BPW)})


@lru_cache(maxsize=4096)
def _prior_quality(quant: str, bpw: float | None, model: QualityModel) -> Quality:
    base = base_type(quant)
    note = None
    size = bpw
    if size is None:
        size = _nominal_bpw(quant) or 4.5
        note = "no file size: the quant type's nominal size"
    if "MXFP4" in quant.upper():
        note = (note + "; " if note else "") + (
            "MXFP4 experts: no per-type measurement; the figure is by size only"
        )
    own = [c for c in _prior().CURVES if model_key(c.model) in model.keys]
    family = [c for c in _prior().CURVES if c.arch == model.arch and c not in own]
    also: tuple[str, ...] = ()
    if own:
        measured = [c for c in own if _same_point(c, base, size)]

        def ln_own(b: float) -> float:
            return _mean([_on_scale(c) + _shape(b) + _type_effect(base)
                          + _curve_residual(c, base, b) for c in own])  # fmt: skip

        ln = _monotone(ln_own, size, _breakpoints(own))
        sources = sorted({SOURCE_NAMES[c.source] for c in own})
        scope = f"measured for this model ({', '.join(sources)})"
        if measured and bpw is not None:
            basis = "measured"
            pts = [(c, _same_point(c, base, size)) for c in measured]
            source = "; ".join(
                f"{p.quant_type} at {p.bpw:.2f} bpw measured on {c.model} by "
                f"{SOURCE_NAMES[c.source]} [{p.row}]"
                for c, p in pts
                if p
            )
        else:
            basis = "interpolated" if bpw is not None and _within(own, size) else "estimated"
            source = (
                "; ".join(
                    f"{c.model}'s curve by {SOURCE_NAMES[c.source]} ({len(c.points)} sizes, "
                    f"{c.points[0].bpw:.2f}-{c.points[-1].bpw:.2f} bpw)"
                    for c in own
                )
                + f", at {size:.2f} bpw with the cross-family shape"
            )
        many = f"the mean of its {len(own)} curves, " if len(own) > 1 else ""
        source += f"; {many}put on the family scale by each source's harness offset"
        also = tuple(
            f"{c.model} ({SOURCE_NAMES[c.source]}, its own harness): mean KLD {p.mean_kld:g} "
            f"at {p.bpw:.2f} bpw [{p.row}]"
            for c in own
            for p in [_same_point(c, base, size)]
            if p
        )
    elif family:
        models = sorted({c.model for c in family})
        level = _family_level(family, model)
        ln = _monotone(lambda b: level + _shape(b) + _type_effect(base)
                       + _mean([_curve_residual(c, base, b) for c in family]),
                       size, _breakpoints(family))  # fmt: skip
        scope = f"same family ({model.arch}, {len(models)} model{'s' * (len(models) > 1)})"
        basis = "interpolated" if bpw is not None and _within(family, size) else "estimated"
        sized = f", moved to {model.params / 1e9:.3g}B parameters" if model.params else ""
        source = (
            f"{model.arch} curves of {', '.join(models)}{sized}, at {size:.2f} bpw; on the "
            "family scale"
        )
    else:
        ln = _prior().GENERIC_LEVEL + _shape(size) + _type_effect(base)
        scope = f"generic by bpw ({len(_prior().GENERIC_ARCHS)} families)"
        basis = "estimated"
        source = (
            f"the cross-family curve at {size:.2f} bpw ({len(_prior().GENERIC_ARCHS)} "
            f"architectures: {', '.join(_prior().GENERIC_ARCHS)})"
            + (f" with the {base} type's effect" if base and base not in BACKBONE else "")
        )
        note = (note + "; " if note else "") + (
            f"no published quant loss for {model.arch}: the figure is the median family's, and "
            "families differ by up to several times (benchmarks/quality_accuracy.py)"
        )
    kld = math.exp(ln)
    tier = tier_of(kld)
    return Quality(
        quant=quant,
        bpw=bpw,
        mean_kld=round(kld, 6),
        ppl_ratio=None,
        basis=basis,
        source=source,
        tier=tier,
        verdict=TIER_WORDS[tier],
        also_measured=also,
        note=note,
        scope=scope,
    )


def _family_level(family: list[PriorCurve], model: QualityModel) -> float:
    """The family's level on the family scale at this model's size: each measured model's level
    moved along SIZE_SLOPE (within SIZE_EXTRAPOLATION of the sizes measured), then averaged."""
    per_model: dict[str, list[PriorCurve]] = {}
    for c in family:
        per_model.setdefault(c.model, []).append(c)
    sizes = [math.log(cs[0].params) for cs in per_model.values() if cs[0].params]
    levels = []
    for cs in per_model.values():
        lv = _mean([_on_scale(c) for c in cs])
        if model.params and cs[0].params and sizes:
            x = math.log(model.params)
            x = min(max(x, min(sizes) - math.log(SIZE_EXTRAPOLATION)),
                    max(sizes) + math.log(SIZE_EXTRAPOLATION))  # fmt: skip
            lv += _prior().SIZE_SLOPE * (x - math.log(cs[0].params))
        levels.append(lv)
    return _mean(levels)


def noticeable(better: Quality, worse: Quality) -> bool:
    """Would a person notice going from `better` to `worse`? Only across a tier boundary."""
    return worse.tier > better.tier
