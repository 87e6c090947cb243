#!/usr/bin/env python3
"""quantpick's per-device weights and KV+state against llama.cpp, for the real configs recorded
in tests/data/arch-real (scripts/record_arch_real.py), per architecture.

    python benchmarks/arch_real_accuracy.py            # summary per config
    python benchmarks/arch_real_accuracy.py -v         # every mismatching device row

The reference is oracle-mem's exact bytes where recorded (llama.cpp's loader and context, bytes
per buffer type; the host is the CPU buffers plus CPU_REPACK), else llama-fit-params' MiB
floored. A row counts as exact when quantpick's bytes equal llama.cpp's (bytes) or its MiB
floored equal (MiB). The layout is rebuilt from the recorded header, as tests do.

Compute buffers follow llama.cpp's graph allocator as a peak over phases (plan/compute.py): the
last columns give quantpick's figure against llama.cpp's per device row, the median and the worst
relative error and the rows within max(5%, 16 MiB) (goal: >= 95% of rows, none off by more than
25%). An under-estimate is what llama.cpp's own dry run (`pick`/`estimate` with llama-fit-params
installed) and confirmation (`get`, `command`) catch and re-plan on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from arch_real import DATA, MiB, grid_rows, load, rows  # noqa: E402

from quantpick.plan.compute import within  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--only", nargs="*", default=[])
    args = ap.parse_args()
    print(
        f"{'config':<22} {'arch':<11} {'cases':>5} {'weights exact':>14} {'KV+state exact':>15}"
        f" {'max |dW| MiB':>13} {'max |dKV| MiB':>14}  compute: median  worst   within"
    )
    # fmt: skip
    total_ok = total_rows = beyond = 0
    for path in sorted(DATA.glob("*.json")):
        doc, _layout = load(path)
        if args.only and doc["config"] not in args.only:
            continue
        got = rows(path)
        n = len(got)
        w_ok = sum(r.weights[0] == r.weights[1] for r in got)
        kv_ok = sum(r.context[0] == r.context[1] for r in got)
        scale = {"bytes": MiB, "MiB": 1}
        w_err = max((abs(r.weights[0] - r.weights[1]) / scale[r.unit] for r in got), default=0)
        kv_err = max((abs(r.context[0] - r.context[1]) / scale[r.unit] for r in got), default=0)
        if args.verbose:
            for r in got:
                if not r.exact:
                    print(
                        f"  {r.config} {r.case} {r.device}: weights {r.weights[0]} vs "
                        f"{r.weights[1]}, KV+state {r.context[0]} vs {r.context[1]} ({r.unit})"
                    )
        counts = f"{w_ok:>7}/{n:<6} {kv_ok:>8}/{n:<6}"
        unit = {"bytes": 1, "MiB": MiB}
        pairs = [(r.compute[0] * unit[r.unit], r.compute[1] * unit[r.unit]) for r in got]
        rel = sorted(abs(a - b) / max(b, 1) for a, b in pairs) or [0.0]
        ok = sum(within(a, b) for a, b in pairs)
        total_ok += ok
        total_rows += len(pairs)
        beyond += sum(abs(a - b) > max(0.25 * b, 16 * MiB) for a, b in pairs)
        print(f"{doc['config']:<22} {doc['arch']:<11} {len(doc['cases']):>5} {counts} "
              f"{w_err:>13.2f} {kv_err:>14.2f}  {' ' * 8}{rel[len(rel) // 2]:>6.1%} "
              f"{rel[-1]:>6.1%} {ok:>4}/{len(pairs)}")  # fmt: skip
    print(
        f"\ncompute: {total_ok}/{total_rows} device rows within max(5%, 16 MiB) of llama.cpp "
        f"({total_ok / max(total_rows, 1):.1%}); {beyond} off by more than 25% (and 16 MiB)"
    )
    # the compute grid (scripts/record_compute_grid.py): -ub 128-4096, FA off, -np 4/8 +- -kvu,
    # -ngl 0 on two devices, -ot exps=CPU, --n-cpu-moe at -ub 2048
    got = grid_rows()
    print(f"\ncompute grid (tests/data/arch-real-compute.json.gz): {'config':<20} rows  weights "
          f"KV+state  compute within  median  worst")  # fmt: skip
    g_ok = g_rows = g_beyond = 0
    for name in sorted({r.config for r in got}):
        rs = [r for r in got if r.config == name]
        ok = sum(within(*r.compute) for r in rs)
        rel = sorted(abs(r.compute[0] - r.compute[1]) / max(r.compute[1], 1) for r in rs)
        g_ok, g_rows = g_ok + ok, g_rows + len(rs)
        g_beyond += sum(abs(a - b) > max(0.25 * b, 16 * MiB) for a, b in (r.compute for r in rs))
        print(f"{'':<53}{name:<20} {len(rs):>4} {sum(r.weights[0] == r.weights[1] for r in rs):>8}"
              f" {sum(r.context[0] == r.context[1] for r in rs):>8} {ok:>8}/{len(rs):<6}"
              f"{rel[len(rel) // 2]:>6.1%} {rel[-1]:>6.1%}")  # fmt: skip
        if args.verbose:
            for r in rs:
                if not within(*r.compute):
                    print(f"    {r.case} {r.device}: compute {r.compute[0] / MiB:.1f} vs "
                          f"{r.compute[1] / MiB:.1f} MiB")  # fmt: skip
    print(f"compute grid: {g_ok}/{g_rows} device rows within ({g_ok / max(g_rows, 1):.1%}); "
          f"{g_beyond} off by more than 25%; weights and KV+state exact on "
          f"{sum(r.exact for r in got)}/{g_rows}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
