#!/usr/bin/env python3
"""Fit the cross-family quality prior (quantpick/plan/quality_prior.py) to published mean KLD.

    python scripts/fit_quality.py            # print the fit and its inputs
    python scripts/fit_quality.py --emit     # rewrite quantpick/plan/quality_prior.py

Inputs: benchmarks/data/quality-families.json (Thireus's per-type "pure" quants of 26 models,
llama.cpp's LLaMA-3-8B table, MagicQuant's Qwen3-4B-Instruct-2507) and, from
benchmarks/data/quality-measurements.json, the family curve (apex35: Qwen3.5-35B-A3B, the scale the
tiers are defined on) and MagicQuant's Qwen3.6-35B-A3B.

Each curve is one source measuring one model. What is left out, and why (printed):
- rows a source filled in rather than measured ("extrapolated": Thireus's group0_enricher.py),
  rows without a size, the reference itself, and sizes above the last knot (8.5 bpw: past Q8_0
  the curve is flat on every source);
- a curve whose baseline is itself a quant under BASELINE_MIN_BPW (KLD against a Q4 model says
  little of the loss against BF16), and rows within BASELINE_MARGIN_BPW of a quantized baseline;
- a curve whose Q8_0 sits FLOOR_FACTOR x above the median Q8_0 of the others (gemma-4-31B-it:
  its BF16 baseline has PPL 1954 on the harness corpus; GLM-4.7-Flash: Q8_0 0.055 and q4_K worse
  than q4_0): the harness does not measure that model's quantization loss;
- a row FAILED_FACTOR x above a lower-bpw row of its own curve (a failed run: Kimi-K2's IQ2_S
  12.9 beside IQ2_XS 0.42).

Model: ln KLD(curve c, type t, b bpw) = alpha_c + f(b) + tau_t, with
- f piecewise linear on KNOTS, f(REF_BPW) = 0, made non-increasing (pool-adjacent-violators);
- tau_t the effect of the quant type against the k-quant backbone (Q2_K..Q6_K, Q8_0 and every
  mix named after them: tau = 0), fitted on every type a curve has;
- alpha_c the curve's level at REF_BPW, in its own harness;
fitted by iteratively re-weighted least squares (Huber, HUBER_K robust sigmas; ITERATIONS rounds
from equal weights, so the fit is deterministic).
Then each source's harness offset to the family scale: apex35 is 0; a source that measured the
same model as a source of known offset gets the mean difference of their levels on the shared
models (Thireus: Qwen3.5-35B-A3B; MagicQuant: Qwen3.6-35B-A3B and Qwen3-4B-Instruct-2507 against
Thireus); one with no shared model is taken at face value (0: llama.cpp's table). A model's level
on the family scale is the mean of its curves' alpha minus offset. SIZE_SLOPE: the slope of model
level on ln(parameters) within architectures that have several sizes (fixed effects per
architecture). GENERIC_LEVEL: the median over architectures of each architecture's median model
level.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ROOT / "benchmarks" / "data" / "quality-families.json"
MEASUREMENTS = ROOT / "benchmarks" / "data" / "quality-measurements.json"
PRIOR_MODULE = ROOT / "quantpick" / "plan" / "quality_prior.py"

sys.path.insert(0, str(ROOT))
from quantpick.plan.quality_types import BACKBONE, KNOTS, REF_BPW, base_type  # noqa: E402

BASELINE_BPW = {"bf16": 16.0, "f16": 16.0, "q8_0": 8.5, "iq6_k": 6.6}  # nominal sizes
BASELINE_MIN_BPW = 6.0
BASELINE_MARGIN_BPW = 1.5
FLOOR_FACTOR = 10.0
FAILED_FACTOR = 3.0
HUBER_K = 1.5
ITERATIONS = 10
ANCHOR = "apex/Qwen3.5-35B-A3B"
# quality-measurements.json groups fitted as curves: group -> (curve key, source)
MEASUREMENT_CURVES = {
    "apex35": ("apex/Qwen3.5-35B-A3B", "apex"),
    "mq36": ("magicquant/Qwen3.6-35B-A3B", "magicquant"),
}


@dataclass(frozen=True)
class Point:
    quant_type: str
    base: str
    bpw: float
    kld: float
    row: str


@dataclass
class Curve:
    key: str
    source: str
    model: str
    arch: str
    params: float | None
    url: str
    points: list[Point] = field(default_factory=list)
    excluded: str | None = None


@dataclass
class Fit:
    shape: tuple[float, ...]  # f at KNOTS
    tau: dict[str, float]
    alpha: dict[str, float]  # curve key -> level at REF_BPW, own harness
    harness: dict[str, float]  # source -> ln offset to the family scale
    levels: dict[str, float]  # model -> level on the family scale
    size_slope: float
    generic_level: float
    generic_archs: tuple[str, ...]
    curves: list[Curve]


def load(
    families: Path = FAMILIES, measurements: Path = MEASUREMENTS
) -> tuple[list[Curve], list[str]]:
    """The curves the prior is fitted on, and one line per thing left out."""
    skipped: list[str] = []
    curves: dict[str, Curve] = {}
    for r in json.loads(families.read_text()):
        c = curves.setdefault(
            r["curve"], Curve(r["curve"], r["source"], r["model"], r["arch"], r["params"], "")
        )
        base_bpw = BASELINE_BPW.get(r["baseline"])
        if base_bpw is None or base_bpw < BASELINE_MIN_BPW:
            c.excluded = f"baseline {r['baseline']} (a quant under {BASELINE_MIN_BPW} bpw)"
            continue
        if r["extrapolated"] or r["bpw"] is None or r["mean_kld"] <= 0:
            continue
        if base_bpw < 16 and r["bpw"] > base_bpw - BASELINE_MARGIN_BPW:
            continue
        _add(c, r["quant_type"], r["bpw"], r["mean_kld"], r["id"], r["source_url"])
    for r in json.loads(measurements.read_text()):
        if r["group"] not in MEASUREMENT_CURVES or r["metric"] != "mean_kld":
            continue
        key, source = MEASUREMENT_CURVES[r["group"]]
        m = re.search(r"/ ([\d.]+)e9 params", r.get("bpw_note") or "")
        c = curves.setdefault(
            key,
            Curve(key, source, r["model"], r["arch"], float(m[1]) * 1e9 if m else None, ""),
        )
        if r["bpw"] is None or r["value_num"] <= 0 or r["quant_type"].startswith("custom"):
            continue
        _add(c, r["quant_type"], r["bpw"], r["value_num"], r["id"], r["source_url"])
    for c in curves.values():
        _drop_failed(c, skipped)
    q8 = {k: [p.kld for p in c.points if p.base == "Q8_0"] for k, c in curves.items()}
    for key, c in curves.items():
        others = [v[0] for k, v in q8.items() if v and k != key and not curves[k].excluded]
        if q8[key] and others and q8[key][0] > FLOOR_FACTOR * statistics.median(others):
            c.excluded = (
                f"Q8_0 mean KLD {q8[key][0]:g} is over {FLOOR_FACTOR:g}x the others' median "
                f"{statistics.median(others):g}: the harness does not see this model's quant loss"
            )
    for c in curves.values():
        if c.excluded:
            skipped.append(f"{c.key}: left out, {c.excluded}")
    return [c for c in curves.values() if not c.excluded and c.points], skipped


def _add(c: Curve, quant_type: str, bpw: float, kld: float, row: str, url: str) -> None:
    base = base_type(quant_type)
    if base is None or bpw > KNOTS[-1] + 0.1:
        return
    c.points.append(Point(quant_type, base, bpw, kld, row))
    # a curve's link: its first kept row's source (apex35 cites one JSON per file: the folder)
    c.url = c.url or (url.rsplit("/", 1)[0] if c.source == "apex" else url)


def _drop_failed(c: Curve, skipped: list[str]) -> None:
    # one point per quant type and size: llama.cpp's table repeats q2_K, q2_K_S and iq1_S for
    # five imatrix sizes (WT 1k..10m, within 1.5% of each other); the median row stands for them
    same: dict[tuple[str, float], list[Point]] = defaultdict(list)
    for p in c.points:
        same[(p.quant_type, p.bpw)].append(p)
    for group in same.values():
        if len(group) > 1:
            group.sort(key=lambda p: p.kld)
            mid = group[(len(group) - 1) // 2]
            skipped += [f"{p.row}: left out, {mid.row} is the median of its repeats"
                        for p in group if p is not mid]  # fmt: skip
            c.points = [p for p in c.points if p is mid or p not in group]
    keep = []
    for p in c.points:
        lower = [q for q in c.points if q.bpw < p.bpw - 0.05]
        if lower and p.kld > FAILED_FACTOR * min(q.kld for q in lower):
            skipped.append(f"{p.row}: left out, {p.kld:g} is over {FAILED_FACTOR:g}x a smaller "
                           "type of the same model (a failed run)")  # fmt: skip
            continue
        keep.append(p)
    c.points = sorted(keep, key=lambda p: (p.bpw, p.base))


def hat(bpw: float) -> list[float]:
    """Linear-interpolation weights of `bpw` on KNOTS (clamped at both ends)."""
    b = min(max(bpw, KNOTS[0]), KNOTS[-1])
    w = [0.0] * len(KNOTS)
    for i in range(len(KNOTS) - 1):
        if KNOTS[i] <= b <= KNOTS[i + 1]:
            frac = (b - KNOTS[i]) / (KNOTS[i + 1] - KNOTS[i])
            w[i], w[i + 1] = 1 - frac, frac
            break
    return w


def _nonincreasing(values: list[float]) -> list[float]:
    """Pool adjacent violators: the closest non-increasing sequence (least squares)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    out: list[float] = []
    for s, n in blocks:
        out.extend([s / n] * int(n))
    return out


def fit_shape(curves: list[Curve]) -> tuple[tuple[float, ...], dict[str, float], dict[str, float]]:
    """f at KNOTS, tau per type, alpha per curve (robust least squares, see the module doc)."""
    import numpy as np

    keys = [c.key for c in curves]
    types = sorted({p.base for c in curves for p in c.points} - BACKBONE)
    nk, nc = len(KNOTS), len(keys)
    rows, y = [], []
    for j, c in enumerate(curves):
        for p in c.points:
            row = [0.0] * (nc + nk + len(types))
            row[j] = 1.0
            row[nc : nc + nk] = hat(p.bpw)
            if p.base not in BACKBONE:
                row[nc + nk + types.index(p.base)] = 1.0
            rows.append(row)
            y.append(math.log(p.kld))
    x, yv = np.array(rows), np.array(y)
    ref = nc + KNOTS.index(REF_BPW)
    cols = [i for i in range(x.shape[1]) if i != ref and x[:, i].any()]
    weights = np.ones(len(yv))
    full = np.zeros(x.shape[1])
    for _ in range(ITERATIONS):
        sw = np.sqrt(weights)
        beta = np.linalg.lstsq(x[:, cols] * sw[:, None], yv * sw, rcond=None)[0]
        full = np.zeros(x.shape[1])
        full[cols] = beta
        res = yv - x @ full
        scale = max(1.4826 * float(np.median(np.abs(res))), 0.05)
        cut = HUBER_K * scale
        weights = np.where(np.abs(res) <= cut, 1.0, cut / np.maximum(np.abs(res), 1e-12))
    shape = _nonincreasing([float(v) for v in full[nc : nc + nk]])
    shift = shape[KNOTS.index(REF_BPW)]
    shape = [v - shift for v in shape]
    alpha = {k: float(full[j]) + shift for j, k in enumerate(keys)}
    tau = {t: float(full[nc + nk + i]) for i, t in enumerate(types)}
    return tuple(shape), tau, alpha


def fit_levels(
    curves: list[Curve], alpha: dict[str, float]
) -> tuple[dict[str, float], dict[str, float], float, float, tuple[str, ...]]:
    """Harness offsets, model levels on the family scale, SIZE_SLOPE, GENERIC_LEVEL."""
    by_source_model = {(c.source, c.model): alpha[c.key] for c in curves}
    anchor = next(c for c in curves if c.key == ANCHOR)
    harness = {anchor.source: 0.0}
    sources = sorted({c.source for c in curves})
    changed = True
    while changed:
        changed = False
        for s in sources:
            if s in harness:
                continue
            diffs = [
                a - by_source_model[(k, m)] + harness[k]
                for (src, m), a in by_source_model.items()
                if src == s
                for k in list(harness)
                if (k, m) in by_source_model
            ]
            if diffs:
                harness[s] = statistics.fmean(diffs)
                changed = True
    for s in sources:
        harness.setdefault(s, 0.0)  # no shared model: taken at face value
    per_model: dict[str, list[float]] = defaultdict(list)
    meta: dict[str, Curve] = {}
    for c in curves:
        per_model[c.model].append(alpha[c.key] - harness[c.source])
        meta[c.model] = c
    levels = {m: statistics.fmean(v) for m, v in per_model.items()}
    by_arch: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for m, lv in levels.items():
        params = meta[m].params
        if params:
            by_arch[meta[m].arch].append((math.log(params), lv))
    num = den = 0.0
    for pts in by_arch.values():
        if len({x for x, _ in pts}) < 2:
            continue
        xm = statistics.fmean(x for x, _ in pts)
        ym = statistics.fmean(y for _, y in pts)
        num += sum((x - xm) * (y - ym) for x, y in pts)
        den += sum((x - xm) ** 2 for x, _ in pts)
    slope = num / den if den else 0.0
    arch_levels: dict[str, list[float]] = defaultdict(list)
    for m, lv in levels.items():
        arch_levels[meta[m].arch].append(lv)
    generic = statistics.median(statistics.median(v) for v in arch_levels.values())
    return harness, levels, slope, generic, tuple(sorted(arch_levels))


def fit(curves: list[Curve]) -> Fit:
    shape, tau, alpha = fit_shape(curves)
    harness, levels, slope, generic, archs = fit_levels(curves, alpha)
    return Fit(shape, tau, alpha, harness, levels, slope, generic, archs, curves)


# ---- the emitted module --------------------------------------------------------------------------

HEADER = '''"""The cross-family quality prior (generated: scripts/fit_quality.py --emit). Pure.

Do not edit by hand: tests/plan/test_quality_prior.py refits it from benchmarks/data/
quality-families.json and quality-measurements.json and checks every number here (and each
point against the row it cites). How the numbers are fitted: scripts/fit_quality.py; how they
are used: quantpick/plan/quality.py.
"""

# ruff: noqa: E501  (generated tables: one record a line)
from __future__ import annotations

from quantpick.plan.quality_types import PriorCurve, PriorPoint
'''


def _r(v: float) -> float:
    return round(v, 4)


def emit(f: Fit) -> str:
    lines = [HEADER]
    lines.append("# ln KLD - level at quality_types.KNOTS (0 at REF_BPW), non-increasing")
    lines.append(f"SHAPE = {tuple(_r(v) for v in f.shape)!r}")
    lines.append("# ln KLD of a type against the k-quant backbone at the same bpw")
    lines.append("TYPE_EFFECT = {")
    for t, v in sorted(f.tau.items()):
        lines.append(f"    {t!r}: {_r(v)!r},")
    lines.append("}")
    lines.append("# ln offset of each source's harness to the family scale (subtracted)")
    lines.append("HARNESS = {")
    for s, v in sorted(f.harness.items()):
        lines.append(f"    {s!r}: {_r(v)!r},")
    lines.append("}")
    lines.append("# d level / d ln(parameters) within an architecture")
    lines.append(f"SIZE_SLOPE = {_r(f.size_slope)!r}")
    lines.append("# level (ln KLD at REF_BPW, family scale) of a model nobody measured: the")
    lines.append("# median over GENERIC_ARCHS of each architecture's median model level")
    lines.append(f"GENERIC_LEVEL = {_r(f.generic_level)!r}")
    lines.append(f"GENERIC_ARCHS = {f.generic_archs!r}")
    lines.append("")
    lines.append("CURVES = (")
    for c in sorted(f.curves, key=lambda c: c.key):
        params = f"{c.params:.6g}" if c.params else "None"
        lines.append("    PriorCurve(")
        lines.append(f"        {c.key!r}, {c.source!r}, {c.model!r}, {c.arch!r}, {params},")
        lines.append(f"        level={_r(f.alpha[c.key])!r},")
        lines.append(f"        url={c.url!r},")
        lines.append("        points=(")
        for p in c.points:
            lines.append(
                f"            PriorPoint({p.quant_type!r}, {p.bpw!r}, {p.kld!r}, {p.row!r}),"
            )
        lines.append("        ),")
        lines.append("    ),")
    lines.append(")")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--emit", action="store_true", help=f"rewrite {PRIOR_MODULE.name}")
    args = ap.parse_args()
    curves, skipped = load()
    f = fit(curves)
    for line in skipped:
        print("skip:", line)
    print(f"{len(curves)} curves, {sum(len(c.points) for c in curves)} points")
    print("shape:", ", ".join(f"{k}:{v:+.3f}" for k, v in zip(KNOTS, f.shape, strict=True)))
    print("type effect:", ", ".join(f"{t} {v:+.3f}" for t, v in sorted(f.tau.items())))
    print("harness:", ", ".join(f"{s} {v:+.3f}" for s, v in sorted(f.harness.items())))
    print(f"size slope {f.size_slope:+.3f}/ln(params); generic level {f.generic_level:.3f} "
          f"(KLD {math.exp(f.generic_level):.4f} at {REF_BPW} bpw) over {len(f.generic_archs)} "
          "architectures")  # fmt: skip
    for m, lv in sorted(f.levels.items(), key=lambda kv: kv[1]):
        print(f"  {m:32s} level {lv:+.3f}  KLD@{REF_BPW} {math.exp(lv):.4f}")
    if args.emit:
        import subprocess

        PRIOR_MODULE.write_text(emit(f))
        subprocess.run(
            [sys.executable, "-m", "ruff", "format", "-q", str(PRIOR_MODULE)], check=True
        )
        print(f"wrote {PRIOR_MODULE}")


if __name__ == "__main__":
    main()
