#!/usr/bin/env python3
"""The quality prior against published KLD of families it did not see: leave one family out.

    python benchmarks/quality_accuracy.py

For each architecture (general.architecture) with published curves, the prior is refitted
(scripts/fit_quality.py, from scratch) without that architecture's curves, and its generic
figure (quantpick/plan/quality.py's "generic by bpw": GENERIC_LEVEL + shape + type effect) is
compared with every measured point of the held-out family, both on the family scale (a source's
harness offset is a calibration, kept from the full fit). Printed per family and bpw range:
the median ratio predicted / measured (bias), the median and the largest error factor
(max(p/m, m/p)); then the same with each held-out curve's own level (the shape and type effects
alone, what "measured for this model" and "same family" lean on), and the "same family" level
left one model out within its architecture (SIZE_SLOPE from the full fit). qwen35moe is the
family scale's own architecture (its curve anchors the harness offsets) and is not held out.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fit_quality import Curve, Fit, fit, load  # noqa: E402

from quantpick.plan.quality_types import BACKBONE, KNOTS  # noqa: E402

BINS = ((0.0, 3.0), (3.0, 5.0), (5.0, 9.0))
ANCHOR_ARCH = "qwen35moe"


def shape_at(f: Fit, bpw: float) -> float:
    b = min(max(bpw, KNOTS[0]), KNOTS[-1])
    for i in range(len(KNOTS) - 1):
        if KNOTS[i] <= b <= KNOTS[i + 1]:
            frac = (b - KNOTS[i]) / (KNOTS[i + 1] - KNOTS[i])
            return f.shape[i] + frac * (f.shape[i + 1] - f.shape[i])
    return f.shape[-1]


def generic_ln(f: Fit, base: str, bpw: float) -> float:
    """quality.py's generic figure (ln mean KLD on the family scale) under fit `f`."""
    effect = 0.0 if base in BACKBONE else f.tau.get(base, 0.0)
    return f.generic_level + shape_at(f, bpw) + effect


def _errors(pairs: list[tuple[float, float]]) -> str:
    """'n, bias, median error, max error' of (bpw, ln predicted - ln measured) pairs."""
    if not pairs:
        return "      -"
    r = [d for _, d in pairs]
    bias = math.exp(statistics.median(r))
    med = math.exp(statistics.median(abs(d) for d in r))
    worst = math.exp(max(abs(d) for d in r))
    return f"{len(r):3d} x{bias:4.2f} {med:4.2f} {worst:5.2f}"


def held_out(curves: list[Curve], full: Fit) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """arch -> {"generic": pairs, "shape": pairs}: (bpw, ln predicted - ln measured)."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for arch in sorted({c.arch for c in curves} - {ANCHOR_ARCH}):
        train = [c for c in curves if c.arch != arch]
        f = fit(train)
        generic, shape = [], []
        for c in curves:
            if c.arch != arch:
                continue
            offset = full.harness[c.source]
            own = []
            for p in c.points:
                measured = math.log(p.kld) - offset
                predicted = generic_ln(f, p.base, p.bpw)
                generic.append((p.bpw, predicted - measured))
                own.append((p.bpw, predicted - f.generic_level - measured))
            level = statistics.median(-d for _, d in own)  # the curve's own level
            shape += [(b, d + level) for b, d in own]
        out[arch] = {"generic": generic, "shape": shape}
    return out


def same_family_levels(full: Fit) -> list[tuple[str, str, float]]:
    """(arch, model, ln predicted - ln measured level) with each model left out of its family."""
    meta = {c.model: c for c in full.curves}
    by_arch: dict[str, list[str]] = defaultdict(list)
    for m in full.levels:
        by_arch[meta[m].arch].append(m)
    rows = []
    for arch, models in sorted(by_arch.items()):
        for m in sorted(models):
            others = [o for o in models if o != m and meta[o].params]
            params = meta[m].params
            if not others or not params:
                continue
            predicted = statistics.fmean(
                full.levels[o]
                + full.size_slope * (math.log(params) - math.log(meta[o].params or params))
                for o in others
            )
            rows.append((arch, m, predicted - full.levels[m]))
    return rows


def main() -> None:
    curves, skipped = load()
    full = fit(curves)
    print(f"{len(curves)} curves, {sum(len(c.points) for c in curves)} points, "
          f"{len({c.arch for c in curves})} architectures; {len(skipped)} things left out "
          "(scripts/fit_quality.py lists them)")  # fmt: skip
    print("\nLeave one family out: generic figure vs measured (n, bias = median predicted/"
          "measured, median error factor, max)")  # fmt: skip
    head = "".join(f"  {f'{lo:g}-{hi:g} bpw':>22s}" for lo, hi in BINS)
    print(f"{'family':12s} {'':8s}{head}  {'all':>22s}")
    results = held_out(curves, full)
    every: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for arch, kinds in results.items():
        for kind in ("generic", "shape"):
            pairs = kinds[kind]
            every[kind] += pairs
            cells = "".join(
                f"  {_errors([p for p in pairs if lo <= p[0] < hi]):>22s}" for lo, hi in BINS
            )
            label = arch if kind == "generic" else ""
            print(f"{label:12s} {kind:8s}{cells}  {_errors(pairs):>22s}")
    for kind in ("generic", "shape"):
        print(f"{'all':12s} {kind:8s}{'':72s}  {_errors(every[kind]):>22s}")
    print("\nSame family, one model left out (its level at 4.5 bpw, size-adjusted):")
    rows = same_family_levels(full)
    for arch, model, d in rows:
        print(f"  {arch:11s} {model:30s} predicted/measured x{math.exp(d):.2f}")
    errs = [abs(d) for _, _, d in rows]
    med, worst = math.exp(statistics.median(errs)), math.exp(max(errs))
    print(f"  median error x{med:.2f}, max x{worst:.2f}")


if __name__ == "__main__":
    main()
