"""How much a quant loses against the BF16 weights, from published measurements. Pure.

One scale for every decision: mean KL divergence vs the 16-bit model measured by one harness on
this architecture (mudler/apex-quant on Qwen3.5-35B-A3B: llama-perplexity, wikitext-2, ctx 2048).
Absolute KLD is never compared across harnesses; other sources only corroborate (`also_measured`).

A quant's figure has one of four bases:
- "reference": the 16-bit file itself (KLD 0 by definition);
- "measured": the family harness measured a file of this quant type at about this size;
- "interpolated": log-linear in bits per weight between the two nearest measured points;
- "estimated": outside the measured range (below ~2.8 bpw) or without a size: the family curve
  extended with the slope of llama.cpp's generic Llama-3-8B table (tools/perplexity/README.md).

Every constant names the rows of benchmarks/data/quality-measurements.json it comes from;
tests/plan/test_quality.py checks them against that file. Compare by bits per weight, not by quant
name: community recipes keep attention and shared experts at higher precision, so this MoE loses
2.5-3x less KLD at <=5 bpw than the generic table says (notes quality-and-speed.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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


def quality_of(quant: str, bpw: float | None) -> Quality:
    """The quality figure of one quant of a qwen35moe model, with its basis."""
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


def noticeable(better: Quality, worse: Quality) -> bool:
    """Would a person notice going from `better` to `worse`? Only across a tier boundary."""
    return worse.tier > better.tier
