"""The vocabulary of the quality prior: knots, quant-type classes, curve records. Pure.

Shared by the generated data (quality_prior.py), the code that reads it (quality.py) and the fit
(scripts/fit_quality.py), so the three cannot disagree on what a type or a knot is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# bpw knots of the prior's shape. 4.5 (a pure q4_K or iq4_nl: every source has points on both
# sides) is where a curve's level is read; past 8.5 (Q8_0) every source's curve is flat.
KNOTS = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.5, 8.5)
REF_BPW = 4.5
# The k-quant backbone: the shape is theirs (type effect 0); other types are measured against it.
BACKBONE = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0"})

_PREFIXES = ("UD-", "MQ-", "LM-", "IMAT-", "I-")
# Longest name first: "IQ3_XXS" before "IQ3_XS" before "IQ3_S". A mix takes the type that holds
# most of its weights (llama.cpp's llama_model_quantize_impl: IQ3_M and IQ3_S files are mostly
# iq3_s, IQ3_XS mostly iq3_xxs, IQ2_M mostly iq2_s).
_TYPES = (
    ("IQ4_XS", "IQ4_XS"), ("IQ4_NL", "IQ4_NL"),
    ("IQ3_XXS", "IQ3_XXS"), ("IQ3_XS", "IQ3_XXS"), ("IQ3_S", "IQ3_S"), ("IQ3_M", "IQ3_S"),
    ("IQ2_XXS", "IQ2_XXS"), ("IQ2_XS", "IQ2_XS"), ("IQ2_S", "IQ2_S"), ("IQ2_M", "IQ2_S"),
    ("IQ1_S", "IQ1_S"), ("IQ1_M", "IQ1_M"),
    ("Q4_0", "Q4_0"), ("Q4_1", "Q4_1"), ("Q5_0", "Q5_0"), ("Q5_1", "Q5_1"),
)  # fmt: skip
_K_QUANT = re.compile(r"^Q([2-6])_K")


def base_type(quant: str) -> str | None:
    """The ggml type a quant's name says holds most of its weights: 'UD-Q4_K_XL' -> 'Q4_K',
    'IQ3_M' -> 'IQ3_S', 'Q8_K_XL' -> 'Q8_0'; None for 16-bit, MXFP4 and unknown names."""
    q = quant.upper().split(" ")[0].replace("-FAMILY", "")
    for prefix in _PREFIXES:
        q = q.removeprefix(prefix)
    if q.startswith("Q8_"):
        return "Q8_0"
    m = _K_QUANT.match(q)
    if m:
        return f"Q{m[1]}_K"
    for name, base in _TYPES:
        if q.startswith(name):
            return base
    return None


@dataclass(frozen=True)
class PriorPoint:
    quant_type: str  # as the source names it
    bpw: float
    mean_kld: float  # in the source's harness
    row: str  # id in benchmarks/data/quality-*.json

    @property
    def base(self) -> str | None:
        return base_type(self.quant_type)


@dataclass(frozen=True)
class PriorCurve:
    """One source's measurements of one model, as fitted."""

    key: str  # "thireus/GLM-4.5-Air"
    source: str  # "thireus" | "llamacpp" | "magicquant" | "apex"
    model: str  # "GLM-4.5-Air"
    arch: str  # general.architecture
    params: float | None
    level: float  # ln mean KLD at REF_BPW in the source's harness (the fit's alpha)
    url: str
    points: tuple[PriorPoint, ...]  # sorted by bpw
