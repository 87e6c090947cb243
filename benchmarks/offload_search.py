#!/usr/bin/env python3
"""The multi-GPU --n-cpu-moe search against trying every N, on generated two-GPU machines.

    python benchmarks/offload_search.py              # 200 machines, seed 0
    python benchmarks/offload_search.py -n 500 --seed 3

With two GPUs the smallest --n-cpu-moe that fits is not always the fastest plan (more experts in
RAM can take the attention layers off a slow card), so the planner searches N (planner.
_Search._faster_offload: a short walk, a stride, a refinement). The reference, in the same run,
is the same planner with the walk long enough to try every N. Printed: how many expert-offload
candidates (quant x KV type) the search left slower than the exhaustive one, by how much, and
what a pick costs both ways.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from functools import cache

from quantpick.errors import NoFitError
from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.model.layout import ModelLayout, synthesize_layout
from quantpick.model.registry import find_manifest
from quantpick.plan import planner
from quantpick.units import GB, GiB

MANIFEST = find_manifest("qwen3.8-35b-a3b-distill")
BANDWIDTHS_GBS = (192, 320, 448, 936, 1008, 2039)  # catalogue cards, from a GTX 1650 to an A100


@cache
def layout_of(quant: str) -> ModelLayout:
    return synthesize_layout(
        MANIFEST.architecture, quant, sum(f.size_bytes for f in MANIFEST.quant_files(quant))
    )


LAYOUTS = {q: layout_of(q) for q in MANIFEST.quants}


def two_gpus(sizes_gib: tuple[int, int], bandwidths_gbs: tuple[int, int], ram_gib: int) -> Machine:
    gpus = tuple(
        Gpu(index=i, name=f"GPU{i}", total_bytes=g * GiB, free_bytes=g * GiB,
            bandwidth_bytes_per_s=bw * GB)
        for i, (g, bw) in enumerate(zip(sizes_gib, bandwidths_gbs, strict=True))
    )  # fmt: skip
    host = Host(ram_gib * GiB, ram_gib * GiB, 8, ram_bandwidth_bytes_per_s=50 * GB)
    return Machine(gpus=gpus, host=host, described=True, source="benchmark")


def random_machine(rng: random.Random) -> Machine:
    gpus = []
    for i in range(2):
        total = rng.randint(4, 48) * GiB
        bw = rng.choice(BANDWIDTHS_GBS) * GB
        gpus.append(
            Gpu(
                index=i,
                name=f"GPU{i}",
                total_bytes=total,
                free_bytes=total,
                bandwidth_bytes_per_s=bw,
            )
        )
    ram = rng.randint(8, 160) * GiB
    host = Host(ram, ram, 8, ram_bandwidth_bytes_per_s=rng.choice((25, 50, 90)) * GB)
    return Machine(gpus=tuple(gpus), host=host, described=True, source="benchmark")


def offload_speeds(
    m: Machine, ctx: int, walk: int | None
) -> tuple[dict[tuple[str, str], float], float]:
    """Expert-offload candidates' expected decode, and the pick's time; walk None: no search
    (the smallest N that fits, as before the search existed)."""
    planner.OFFLOAD_WALK = walk or 0
    planner._Search._faster_offload = (  # type: ignore[method-assign]
        _no_search if walk is None else _search
    )
    t = time.perf_counter()
    try:
        p = planner.plan(MANIFEST, m, LAYOUTS, planner.PlanRequest(ctx_size=ctx, prefer="speed"))
    except NoFitError:
        return {}, time.perf_counter() - t
    dt = time.perf_counter() - t
    return {
        (c.quant, c.cache_type): planner.expected_tps(c.speed)
        for c in p.candidates
        if c.speed is not None and c.placement == "expert-offload"
    }, dt


_search = planner._Search._faster_offload


def _no_search(self: planner._Search, base: object, found: object, n_layer: int) -> object:
    return found


_may_matter = planner._speed_may_matter


def shipped_pick_seconds(m: Machine, ctx: int, prefer: str) -> float:
    """A pick as the planner makes it: the search only where it can change the pick."""
    planner._speed_may_matter = _may_matter  # type: ignore[assignment]
    t = time.perf_counter()
    try:
        planner.plan(MANIFEST, m, LAYOUTS, planner.PlanRequest(ctx_size=ctx, prefer=prefer))
    except NoFitError:
        pass
    dt = time.perf_counter() - t
    planner._speed_may_matter = _every  # type: ignore[assignment]
    return dt


def _every(*args: object) -> bool:
    return True


def main() -> None:
    # Every offload candidate searched: the planner searches only those whose speed can change
    # its pick (planner._speed_may_matter); this measures the search itself.
    planner._speed_may_matter = _every  # type: ignore[assignment]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200, help="machines (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    shipped = planner.OFFLOAD_WALK
    exhaustive = 10_000  # past any layer count: every N is tried
    n_cand = 0
    missed: list[float] = []
    t_search: list[float] = []
    t_all: list[float] = []
    t_none: list[float] = []
    gain: list[float] = []
    t_shipped: dict[str, list[float]] = {"balanced": [], "speed": []}
    for _ in range(args.n):
        m, ctx = random_machine(rng), rng.randint(16, 1024) * 256
        got, dt = offload_speeds(m, ctx, shipped)
        ref, dt_ref = offload_speeds(m, ctx, exhaustive)
        smallest, dt_none = offload_speeds(m, ctx, None)
        t_none.append(dt_none)
        for prefer, ts in t_shipped.items():
            ts.append(shipped_pick_seconds(m, ctx, prefer))
        gain += [got[k] / smallest[k] for k in got if k in smallest]
        t_search.append(dt)
        t_all.append(dt_ref)
        for key, tps in got.items():
            n_cand += 1
            if ref.get(key, 0.0) > tps * (1 + 1e-9):
                missed.append(ref[key] / tps)
    planner.OFFLOAD_WALK = shipped
    planner._Search._faster_offload = _search  # type: ignore[method-assign]
    planner._speed_may_matter = _may_matter  # type: ignore[assignment]
    # The README's example: a 15 GiB A100-class card beside a 22 GiB 192 GB/s one, 96 GiB RAM.
    example = two_gpus((15, 22), (2039, 192), 96)
    planner._speed_may_matter = _every  # type: ignore[assignment]
    got, _ = offload_speeds(example, 259072, shipped)
    smallest, _ = offload_speeds(example, 259072, None)
    planner.OFFLOAD_WALK = shipped
    planner._Search._faster_offload = _search  # type: ignore[method-assign]
    planner._speed_may_matter = _may_matter  # type: ignore[assignment]
    gains = [got[k] / smallest[k] for k in got if k in smallest]
    print(
        "README example (15 GiB 2039 GB/s + 22 GiB 192 GB/s, -c 259072): the search's plans are "
        f"{min(gains):.2f}-{max(gains):.2f}x the decode of the smallest N ({len(gains)} plans)"
    )
    print(f"{args.n} two-GPU machines (seed {args.seed}), {n_cand} expert-offload candidates")
    print(
        f"  slower than trying every N: {len(missed)}"
        + (
            f"  (median {statistics.median(missed):.3f}x, worst {max(missed):.3f}x)"
            if missed
            else ""
        )
    )
    faster = [g for g in gain if g > 1 + 1e-9]
    print(
        f"  faster than the smallest N: {len(faster)}"
        + (
            f"  (median {statistics.median(faster):.3f}x, best {max(faster):.3f}x)"
            if faster
            else ""
        )
    )
    rows = [
        ("search", t_search),
        ("every N", t_all),
        ("smallest N", t_none),
        ("as shipped, balanced", t_shipped["balanced"]),
        ("as shipped, speed", t_shipped["speed"]),
    ]
    print("  --prefer speed, every offload plan searched, unless 'as shipped':")
    for name, ts in rows:
        print(
            f"  pick with {name:<20}: median {statistics.median(ts) * 1e3:5.0f} ms, "
            f"worst {max(ts) * 1e3:5.0f} ms"
        )


if __name__ == "__main__":
    main()
