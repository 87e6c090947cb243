#!/usr/bin/env python3
"""Fit the expected-speed constants (quantpick.plan.speed.SpeedParams) to published llama.cpp runs.

    python scripts/fit_speed.py                  # benchmarks/data/speed-measurements.json
    python scripts/fit_speed.py --data FILE

Procedure: every usable row is rebuilt as quantpick sees it (benchmarks/speed_accuracy.py), then
the parameters minimise a robust loss on log(predicted / measured) of decode and prefill:
soft-L1 with a 15% scale, so a few odd runs cannot pull the rest. Each source's rows (one
repository, page or report) weigh 1/sqrt(n) so a 60-row sweep does not outvote a 4-row one.
A weak prior (PRIOR_WEIGHT) keeps a parameter no row constrains near its physical value.
Search: Levenberg-Marquardt on the residuals whose squares are that loss, in the logarithm of each
parameter, projected onto physical bounds (efficiencies at most 1; the depth and quantized-KV
factors at least 1, so the expected speed never exceeds the bandwidth bound and quantized KV is
never faster at depth). It starts from the physical priors below, never from a previous fit, so
a fit that leaves rows out (the benchmark's held-out schemes) learns nothing from them; one fit
takes ten to twenty seconds.

It prints the fitted values with the rows and error behind them (per source and per
architecture, `[qwen3moe]`), for SpeedParams' defaults.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from speed_accuracy import DEFAULT_DATA, Case, load_cases, predict, ratio  # noqa: E402

from quantpick.plan.speed import SpeedParams  # noqa: E402

# name: (prior, low, high). Priors, from what is known before any row is read: kernel-bound
# decode of ~5 ms per token on 3090/4090-class cards (notes: quality-and-speed.md) split between
# the floor and ~40 layers' kernels; without CUDA graphs a few microseconds more per kernel
# launch (llama.cpp PR #27721: a GTX 1080 decodes a small MoE 10 ms per token faster with graphs
# on); full bandwidth; depth costing a few times its bytes; host reads at ~60% of RAM bandwidth;
# ~120 GFLOPS a core in prefill (below); half a PCIe link for pageable copies; a GPU-to-GPU hop
# of half a millisecond (a copy through the host and a second graph launch).
FITTED: dict[str, tuple[float, float, float]] = {
    "token_fixed_ms": (1.5, 0.2, 20.0),
    # a few microseconds of GPU time for each of ~10-40 small kernels per layer part
    "attention_layer_ms": (0.04, 0.002, 1.0),
    "recurrent_layer_ms": (0.06, 0.002, 1.0),
    "moe_layer_ms": (0.04, 0.002, 1.0),
    "ffn_layer_ms": (0.02, 0.002, 1.0),
    "layer_host_share": (0.3, 0.01, 0.99),
    # a separate launch costs about as much again as the kernel's run time
    "no_graph_factor": (1.5, 0.1, 10.0),
    "gpu_bandwidth_efficiency": (0.9, 0.4, 1.0),
    "kv_depth_factor": (3.0, 1.0, 20.0),
    "kv_quant_factor": (1.5, 1.0, 5.0),
    # STREAM on desktop DDR4/DDR5 reaches 70-85% of the theoretical figure: 0.85 at most
    "host_bandwidth_efficiency": (0.6, 0.15, 0.85),
    "host_core_bytes_per_s": (5e9, 5e8, 5e10),
    "hop_ms": (0.1, 0.005, 3.0),
    "gpu_hop_ms": (0.5, 0.01, 5.0),
    "server_ms": (0.6, 0.01, 5.0),
    # large quantized matmuls (MMQ) reach about half the tensor peak; a tile of 64-128 columns
    # is half full at a few dozen tokens
    "gpu_compute_efficiency": (0.5, 0.05, 1.0),
    "expert_compute_efficiency": (0.5, 0.05, 1.0),
    "attention_compute_efficiency": (0.3, 0.02, 1.0),
    "gemm_half_tokens": (64.0, 4.0, 1024.0),
    "pcie_efficiency": (0.5, 0.1, 1.0),
    # mainline llama.cpp, LLaMA-3.1-8B Q4_0 pp512 on a 16-core Ryzen 7950X: 123.5 t/s x 2 x 8.03e9
    # FLOP / 16 cores = 124 GFLOPS a core (ik_llama.cpp PR #54's comparison table, 2024-09)
    "cpu_core_gflops": (120.0, 10.0, 400.0),
    "legacy_fixed_factor": (1.5, 1.0, 5.0),
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


def residuals(cases: list[Case], params: SpeedParams) -> list[float]:
    """Residuals whose squares sum to twice the loss: per row and figure
    sign(z) sqrt(2 w (sqrt(1 + z^2) - 1)) with z = log(pred / meas) / SCALE, then the priors."""
    weight = Counter(c.source for c in cases)
    out: list[float] = []
    for name, (prior, _, _) in FITTED.items():
        out.append(
            math.sqrt(2 * PRIOR_WEIGHT) * math.log(getattr(params, name) / prior) / math.log(3)
        )
    builds: dict[int | None, SpeedParams] = {}
    for c in cases:
        tg, pp = predict(c, params, builds)
        w = 1.0 / math.sqrt(weight[c.source])
        for pred, meas in ((tg, c.tg_tps), (pp, c.pp_tps)):
            if meas is None:
                continue
            z = math.log(pred / meas) / SCALE if pred and pred > 0 else 50.0
            out.append(math.copysign(math.sqrt(2 * w * (math.sqrt(1 + z * z) - 1)), z))
    return out


def loss(cases: list[Case], params: SpeedParams) -> float:
    return 0.5 * sum(r * r for r in residuals(cases, params))


def levenberg_marquardt(f, x0: list[float], lows: list[float], highs: list[float],  # type: ignore[no-untyped-def]
                        iters: int = 60, tol: float = 1e-6) -> list[float]:  # fmt: skip
    """Minimise sum(f(x)^2) within [lows, highs] (projected steps, forward-difference Jacobian).
    Hand-written because SciPy is not among the project's dependencies; numpy solves the steps."""
    import numpy as np

    x = np.clip(np.array(x0, dtype=float), lows, highs)
    r = np.array(f(list(x)))
    cost = float(r @ r)
    damping = 1e-2
    for _ in range(iters):
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            h = 1e-4 if x[j] + 1e-4 <= highs[j] else -1e-4
            xj = x.copy()
            xj[j] += h
            jac[:, j] = (np.array(f(list(xj))) - r) / h
        gradient = jac.T @ r
        hessian = jac.T @ jac
        improved = False
        while damping < 1e8:
            step = np.linalg.solve(hessian + damping * np.diag(np.diag(hessian) + 1e-9), -gradient)
            trial = np.clip(x + step, lows, highs)
            r_trial = np.array(f(list(trial)))
            cost_trial = float(r_trial @ r_trial)
            if cost_trial < cost:
                done = cost - cost_trial < tol * (1 + cost)
                x, r, cost = trial, r_trial, cost_trial
                damping = max(damping / 3, 1e-7)
                improved = True
                break
            damping *= 4
        if not improved or done:
            break
    return list(x)


def fit(cases: list[Case], base: SpeedParams | None = None) -> SpeedParams:
    """The parameters minimising the loss on `cases`, searched from the priors."""
    base = base or SpeedParams()
    lows = [math.log(low) for _, low, _ in FITTED.values()]
    highs = [math.log(high) for _, _, high in FITTED.values()]
    x0 = [math.log(prior) for prior, _, _ in FITTED.values()]
    x = levenberg_marquardt(lambda v: residuals(cases, _params(v, base)), x0, lows, highs)
    return _params(x, base)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = ap.parse_args()
    cases, unusable = load_cases(args.data)
    params = fit(cases)
    errors: dict[str, list[tuple[float, float]]] = {}
    for c in cases:
        tg, pp = predict(c, params)
        for what, pred, meas in (("decode", tg, c.tg_tps), ("prefill", pp, c.pp_tps)):
            if pred and meas:
                errors.setdefault(what, []).append((ratio(pred, meas), pred / meas))
                errors.setdefault(f"{what} {c.source[:48]}", []).append(
                    (ratio(pred, meas), pred / meas)
                )
                errors.setdefault(f"{what} [{c.family}]", []).append(
                    (ratio(pred, meas), pred / meas)
                )
    n_sources = len({c.source for c in cases})
    print(f"{len(cases)} usable rows ({len(unusable)} unusable), {n_sources} sources")
    for name, values in sorted(errors.items(), key=lambda kv: (" " in kv[0], kv[0])):
        err = sorted(e for e, _ in values)
        bias = statistics.median(r for _, r in values)
        print(f"  {name}: {len(err)} rows, median error {100 * (statistics.median(err) - 1):.0f}%, "
              f"worst {err[-1]:.2f}x, median predicted/measured {bias:.2f}")  # fmt: skip
    print(f"loss {loss(cases, params):.3f}; SpeedParams defaults (prior, bounds):")
    for name, (prior, low, high) in FITTED.items():
        value = getattr(params, name)
        at = " (at its bound)" if math.isclose(value, low) or math.isclose(value, high) else ""
        print(f"    {name}: float = {value:.4g}  # prior {prior:g}, [{low:g}, {high:g}]{at}")


if __name__ == "__main__":
    main()
