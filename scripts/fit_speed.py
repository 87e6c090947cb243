#!/usr/bin/env python3
"""Fit the expected-speed constants (quantpick.plan.speed.SpeedParams) to published llama.cpp runs.

    python scripts/fit_speed.py                  # benchmarks/data/speed-measurements.json
    python scripts/fit_speed.py --data FILE

Procedure: every usable row is rebuilt as quantpick sees it (benchmarks/speed_accuracy.py), then
the parameters minimise a robust loss on log(predicted / measured) of decode and prefill:
soft-L1 with a 15% scale, so a few odd runs cannot pull the rest. Each source's rows (one
repository, page or report) weigh 1/sqrt(n) so a 60-row sweep does not outvote a 4-row one.
A weak prior (PRIOR_WEIGHT) keeps a parameter no row constrains near its physical value.
Search: Nelder-Mead in the logarithm of each parameter, inside physical bounds (efficiencies at
most 1; the depth and quantized-KV factors at least 1, so the expected speed never exceeds the
bandwidth bound and quantized KV is never faster at depth). Starting values are the physical
priors below.

It prints the fitted values with the rows and error behind them, for SpeedParams' defaults.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from speed_accuracy import DEFAULT_DATA, Case, load_cases, predict, ratio  # noqa: E402

from quantpick.plan.speed import RECENT_BUILD, SpeedParams  # noqa: E402

# name: (prior, low, high). Priors: kernel-bound decode of ~5 ms per token on 3090/4090-class
# cards (notes: quality-and-speed.md), full bandwidth, depth costing a few times its bytes,
# host reads at ~60% of RAM bandwidth, ~30 GFLOPS a core, half a PCIe link for pageable copies.
FITTED: dict[str, tuple[float, float, float]] = {
    "token_fixed_ms": (3.5, 0.2, 20.0),
    "gpu_fixed_ms": (1.5, 0.05, 20.0),
    "gpu_bandwidth_efficiency": (0.9, 0.4, 1.0),
    "kv_depth_factor": (3.0, 1.0, 20.0),
    "kv_quant_factor": (1.5, 1.0, 5.0),
    # STREAM on desktop DDR4/DDR5 reaches 70-85% of the theoretical figure: 0.85 at most
    "host_bandwidth_efficiency": (0.6, 0.15, 0.85),
    "host_core_bytes_per_s": (5e9, 5e8, 5e10),
    "hop_ms": (0.1, 0.005, 3.0),
    "gpu_hop_ms": (0.5, 0.01, 5.0),
    "server_ms": (0.6, 0.01, 5.0),
    "gpu_compute_efficiency": (0.25, 0.02, 1.0),
    "pcie_efficiency": (0.5, 0.1, 1.0),
    "cpu_core_gflops": (30.0, 2.0, 300.0),
    "legacy_fixed_factor": (1.5, 1.0, 3.0),
}
SCALE = 0.15  # soft-L1 scale on log ratios
# A weak pull of each parameter toward its prior (a factor 3 away costs PRIOR_WEIGHT): a parameter
# the rows in hand do not constrain (the GPU-to-GPU hop without a multi-GPU source, CPU prefill
# without a CPU run) stays physical instead of drifting to a bound.
PRIOR_WEIGHT = 0.3


def _params(x: list[float], base: SpeedParams) -> SpeedParams:
    values = {}
    for (name, (_, low, high)), v in zip(FITTED.items(), x, strict=True):
        values[name] = min(high, max(low, math.exp(v)))
    return replace(base, **values)


def loss(cases: list[Case], params: SpeedParams) -> float:
    weight = Counter(c.source for c in cases)
    legacy = params.for_build(RECENT_BUILD - 1)
    total = 0.0
    for name, (prior, _, _) in FITTED.items():
        total += PRIOR_WEIGHT * (math.log(getattr(params, name) / prior) / math.log(3.0)) ** 2
    for c in cases:
        tg, pp = predict(c, params, legacy)
        w = 1.0 / math.sqrt(weight[c.source])
        for pred, meas in ((tg, c.tg_tps), (pp, c.pp_tps)):
            if pred is not None and meas is not None and pred > 0:
                r = math.log(pred / meas) / SCALE
                total += w * (math.sqrt(1.0 + r * r) - 1.0)
    return total


def nelder_mead(f, x0: list[float], step: float = 0.3, iters: int = 3000, tol: float = 1e-7):  # type: ignore[no-untyped-def]
    """Plain Nelder-Mead (no SciPy in the project's dependencies)."""
    n = len(x0)
    simplex = [list(x0)] + [[x0[j] + (step if j == i else 0.0) for j in range(n)] for i in range(n)]
    values = [f(p) for p in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) < tol * (1 + abs(values[0])):
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst, strict=True)]
        fr = f(reflected)
        if fr < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centroid, worst, strict=True)]
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst, strict=True)]
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [
                    [b + 0.5 * (p - b) for b, p in zip(best, q, strict=True)] for q in simplex[1:]
                ]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    i = min(range(n + 1), key=values.__getitem__)
    return simplex[i], values[i]


def fit(cases: list[Case], base: SpeedParams | None = None) -> SpeedParams:
    """The parameters minimising the loss on `cases` (two restarts of Nelder-Mead)."""
    base = base or SpeedParams()
    x = [math.log(prior) for prior, _, _ in FITTED.values()]
    for _ in range(3):
        x, _value = nelder_mead(lambda v: loss(cases, _params(v, base)), x)
    return _params(x, base)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = ap.parse_args()
    cases, unusable = load_cases(args.data)
    params = fit(cases)
    tg = [ratio(p, c.tg_tps) for c in cases for p in [predict(c, params)[0]] if p and c.tg_tps]
    pp = [ratio(p, c.pp_tps) for c in cases for p in [predict(c, params)[1]] if p and c.pp_tps]
    med = lambda e: sorted(e)[len(e) // 2] if e else float("nan")  # noqa: E731
    n_sources = len({c.source for c in cases})
    print(f"{len(cases)} usable rows ({len(unusable)} unusable), {n_sources} sources")
    print(f"decode rows {len(tg)}: median error {100 * (med(tg) - 1):.0f}%, worst {max(tg):.2f}x")
    print(f"prefill rows {len(pp)}: median error {100 * (med(pp) - 1):.0f}%, worst {max(pp):.2f}x")
    for name in FITTED:
        print(f"    {name} = {getattr(params, name):.4g}")


if __name__ == "__main__":
    main()
