#!/usr/bin/env python3
"""quantpick against llama.cpp for every architecture its own test-llama-archs writes: per
architecture, the cases and the device rows exact to the byte for weights and KV+state, and the
compute buffers' error.

    python benchmarks/arch_accuracy.py            # one line per architecture, then the totals
    python benchmarks/arch_accuracy.py -v         # and every mismatching row (compute: outside
                                                  # max(5%, 16 MiB))

The reference is tests/data/llamacpp-archs.json.gz (scripts/record_arch_conformance.py: llama.cpp
b11312's test-llama-archs models, projected by llama-memory-bytes over tests/llamacpp_archs.py's
grid of contexts, -np, -kvu, KV types, flash attention, CPU and two RPC devices with -ngl/-ts, and
--n-cpu-moe), each device's bytes as llama.cpp allocates them. The layout is rebuilt from the
recorded header, as tests/arch/test_conformance.py does. Compute buffers are sized by llama.cpp's
scheduler from the graph as a peak over its phases (plan/compute.py): "compute" is quantpick's
figure against llama.cpp's, the median and worst relative error and the rows within
max(5%, 16 MiB), for the CPU backend these tiny models run on. The full-size real configs are in
benchmarks/arch_real_accuracy.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "arch"))

from llamacpp_archs import case_from_dict, machine  # noqa: E402
from test_conformance import NOT_EXACT, recorded  # noqa: E402

from quantpick.model.gguf import header_from_json, layout_from_header  # noqa: E402
from quantpick.plan.compute import within  # noqa: E402
from quantpick.plan.memory import estimate  # noqa: E402

MiB = 1024**2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    doc = recorded()
    grid = [case_from_dict(c) for c in doc["grid"]]
    print(f"{'model':<24} {'cases':>5} {'rows':>5} {'weights':>8} {'KV+state':>9}"
          f"  compute: median  worst  within")  # fmt: skip
    totals = {"cases": 0, "rows": 0, "w": 0, "kv": 0, "c": 0, "c25": 0}
    exact_archs, archs = 0, 0
    for model in sorted(doc["models"]):
        entry = doc["models"][model]
        layout = layout_from_header(header_from_json(entry["header"]), basis=model)
        cases = [(grid[c["case"]], c["devices"]) for c in entry["cases"] if c["error"] is None]
        rows = w_ok = kv_ok = 0
        compute: list[float] = []
        c_ok = 0
        for case, devices in cases:
            est = estimate(layout, machine(case.rpc), case.config())
            ours = {"Host": est.host, **{f"RPC{i}": d for i, d in enumerate(est.gpus)}}
            for name, theirs in devices.items():
                d = ours[name]
                rows += 1
                w_ok += d.weights_bytes == theirs["model"]
                kv_ok += d.kv_bytes + d.recurrent_bytes == theirs["context"]
                compute.append(abs(d.compute_bytes - theirs["compute"]) / max(theirs["compute"], 1))
                c_ok += within(d.compute_bytes, theirs["compute"])
                totals["c25"] += abs(d.compute_bytes - theirs["compute"]) > max(
                    0.25 * theirs["compute"], 16 * MiB
                )
                if args.verbose and (
                    d.weights_bytes != theirs["model"]
                    or d.kv_bytes + d.recurrent_bytes != theirs["context"]
                ):
                    print(f"    {' '.join(case.flags())} {name}: weights {d.weights_bytes} vs "
                          f"{theirs['model']}, KV+state {d.kv_bytes + d.recurrent_bytes} vs "
                          f"{theirs['context']}")  # fmt: skip
                if args.verbose and not within(d.compute_bytes, theirs["compute"]):
                    got, want = d.compute_bytes / MiB, theirs["compute"] / MiB
                    print(f"    {' '.join(case.flags())} {name}: compute {got:.2f} vs "
                          f"{want:.2f} MiB")  # fmt: skip
        compute.sort()
        arch = layout.architecture.name
        archs += 1
        exact_archs += w_ok == kv_ok == rows
        mark = f"  (not modelled: {NOT_EXACT[arch]})" if arch in NOT_EXACT else ""
        med = compute[len(compute) // 2] if compute else 0.0
        worst = compute[-1] if compute else 0.0
        print(f"{model:<24} {len(cases):>5} {rows:>5} {w_ok:>8} {kv_ok:>9}"
              f"  {' ' * 8}{med:>7.1%} {worst:>6.1%} {c_ok:>3}/{rows}{mark}")  # fmt: skip
        totals["c"] += c_ok
        totals["cases"] += len(cases)
        totals["rows"] += rows
        totals["w"] += w_ok
        totals["kv"] += kv_ok
    print(
        f"\n{archs} models: {exact_archs} exact on every row; {totals['cases']} cases, "
        f"{totals['rows']} device rows: weights {totals['w']}/{totals['rows']} exact, "
        f"KV+state {totals['kv']}/{totals['rows']} exact (llama.cpp {doc['llamacpp']}); "
        f"compute {totals['c']}/{totals['rows']} within max(5%, 16 MiB) "
        f"({totals['c'] / max(totals['rows'], 1):.1%}), {totals['c25']} off by more than 25%"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
