#!/usr/bin/env python3
"""What a pick costs as the device count grows to the cap (spec.MAX_DEVICES, 15).

    python benchmarks/device_count.py                 # 1..15 RTX 3090s, and a 3090/T4/4090 mix
    python benchmarks/device_count.py -c 8192 --counts 2,8,15

Issue 21: a hardware file of 100 GPUs took 27 s and 1000 never ended, because the split search
for 3+ GPUs tries every ordered pair of devices. The cap refuses more devices than llama-server
drives before anything is planned; this prints the time and the number of memory estimates of
one `pick` at each count below it, so growth with the count is visible. Reference: the whole
pick at 2 GPUs, measured in the same run (ratios, not absolute times, carry across machines).
"""

from __future__ import annotations

import argparse
import time
from functools import cache

from quantpick.machine.catalog import with_catalog_figures
from quantpick.machine.describe import parse_gpu_spec
from quantpick.machine.spec import Host, Machine
from quantpick.model.layout import ModelLayout, synthesize_layout
from quantpick.model.registry import find_manifest
from quantpick.plan import memory, planner
from quantpick.units import GiB

MANIFEST = find_manifest("qwen3.8-35b-a3b-distill")


@cache
def layout_of(quant: str) -> ModelLayout:
    return synthesize_layout(
        MANIFEST.architecture, quant, sum(f.size_bytes for f in MANIFEST.quant_files(quant))
    )


def machine(names: list[str]) -> Machine:
    gpus = tuple(with_catalog_figures(parse_gpu_spec(n, index=i)) for i, n in enumerate(names))
    host = Host(ram_total_bytes=64 * GiB, ram_available_bytes=64 * GiB, cpu_cores=8)
    return Machine(gpus=gpus, host=host, described=True, source="benchmark")


def timed_pick(names: list[str], ctx: int) -> tuple[float, int, str]:
    calls = [0]
    original = memory.estimate

    def counting(*args: object, **kwargs: object) -> memory.Estimate:
        calls[0] += 1
        return original(*args, **kwargs)  # type: ignore[arg-type]

    planner.estimate = counting  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        p = planner.plan(MANIFEST, machine(names), layout_of, planner.PlanRequest(ctx_size=ctx))
        seconds = time.perf_counter() - start
    finally:
        planner.estimate = original  # type: ignore[assignment]
    return seconds, calls[0], f"{p.quant} {p.placement}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", type=int, default=262144, help="context (default 262144)")
    parser.add_argument("--counts", default="1,2,3,4,6,8,10,12,15")
    args = parser.parse_args()
    counts = [int(n) for n in args.counts.split(",")]
    reference, _, _ = timed_pick(["3090"] * 2, args.c)
    print(f"pick at -c {args.c}; reference: 2 x RTX 3090 in {reference:.2f} s")
    print(f"{'GPUs':>4}  {'same: s':>8} {'x ref':>6} {'estimates':>9}  "
          f"{'mixed: s':>8} {'x ref':>6} {'estimates':>9}  pick (same / mixed)")  # fmt: skip
    for n in counts:
        same = timed_pick(["3090"] * n, args.c)
        mixed = timed_pick([("3090", "t4", "4090")[i % 3] for i in range(n)], args.c)
        print(
            f"{n:>4}  {same[0]:>8.2f} {same[0] / reference:>6.1f} {same[1]:>9}  "
            f"{mixed[0]:>8.2f} {mixed[0] / reference:>6.1f} {mixed[1]:>9}  {same[2]} / {mixed[2]}"
        )


if __name__ == "__main__":
    main()
