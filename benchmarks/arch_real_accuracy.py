#!/usr/bin/env python3
"""quantpick's per-device weights and KV+state against llama.cpp, for the real configs recorded
in tests/data/arch-real (scripts/record_arch_real.py), per architecture.

    python benchmarks/arch_real_accuracy.py            # summary per config
    python benchmarks/arch_real_accuracy.py -v         # every mismatching device row

The reference is oracle-mem's exact bytes where recorded (llama.cpp's loader and context, bytes
per buffer type; the host is the CPU buffers plus CPU_REPACK), else llama-fit-params' MiB
floored. A row counts as exact when quantpick's bytes equal llama.cpp's (bytes) or its MiB
floored equal (MiB). The layout is rebuilt from the recorded header, as tests do.

Compute buffers are not modelled to the byte (llama.cpp's scheduler sizes them from the graph):
the last columns give quantpick's estimate less llama.cpp's, in MiB, as the median and the worst
under- and over-estimate. An under-estimate is what llama.cpp's own dry run (`pick`/`estimate`
with llama-fit-params installed) and confirmation (`get`, `command`) catch and re-plan on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from arch_real import DATA, MiB, load, rows  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--only", nargs="*", default=[])
    args = ap.parse_args()
    print(
        f"{'config':<22} {'arch':<11} {'cases':>5} {'weights exact':>14} {'KV+state exact':>15}"
        f" {'max |dW| MiB':>13} {'max |dKV| MiB':>14}  compute MiB: median  under   over"
    )
    # fmt: skip
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
        dc = sorted((r.compute[0] - r.compute[1]) / scale[r.unit] for r in got) or [0.0]
        print(f"{doc['config']:<22} {doc['arch']:<11} {len(doc['cases']):>5} {counts} "
              f"{w_err:>13.2f} {kv_err:>14.2f}  {' ' * 12}{dc[len(dc) // 2]:+7.0f} "
              f"{min(0.0, dc[0]):+6.0f} {max(0.0, dc[-1]):+6.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
