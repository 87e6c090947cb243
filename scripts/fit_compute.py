#!/usr/bin/env python3
"""Fit the per-architecture compute-graph rules (quantpick/plan/graph_rules.py) to llama.cpp's own
projections: full-size real configs (tests/data/arch-real, scripts/record_arch_real.py, and
the compute grid tests/data/arch-real-compute.json.gz, scripts/record_compute_grid.py) and
every test-llama-archs model (tests/data/llamacpp-archs.json.gz,
scripts/record_arch_conformance.py).

    python scripts/fit_compute.py                 # every recorded architecture
    python scripts/fit_compute.py --only qwen3-8b llama-dense   # configs / tiny models

Every recorded device row is rebuilt as quantpick sees it (tests/arch_real.py): the estimate runs
once per row and records each device's part of the graph (plan/compute.py DeviceGraph); the rule's
coefficients (multiples of E = n_ubatch x n_embd x 4 B, on a 0.5 grid) are then searched by
coordinate descent, from the generic rule, to maximise the rows within max(5%, 16 MiB) of
llama.cpp (ties: the smallest summed relative error), beside what an architecture's GraphTrait
(quantpick/arch/graph.py) adds (read from its graph builder, not fitted here). It prints one
GRAPH_RULES record per architecture with the rows within, the median and the worst error;
`--emit` writes them into quantpick/plan/graph_rules.py: the records of the architectures this run
had rows for (with `--only`, those configs'); a record's note after "beyond 25%", such as
"(beside its GraphTrait)", stays with it, and a record with a note is kept where the generic rule
now holds on its rows (the note names data this script does not read).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import fields, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from arch_real import DATA, GRID, grid_config, load, reference, run_config  # noqa: E402
from conformance_model import rpc_machine  # noqa: E402
from llamacpp_archs import case_from_dict, machine  # noqa: E402

import quantpick.plan.memory as memory  # noqa: E402
from quantpick.model.gguf import header_from_json, layout_from_header  # noqa: E402
from quantpick.plan.compute import DeviceGraph, GraphShape, device_compute  # noqa: E402
from quantpick.plan.graph_rules import GENERIC, GraphRule  # noqa: E402

MiB = 1024**2
ARCHS = ROOT / "tests" / "data" / "llamacpp-archs.json.gz"
STEPS = [x / 2 for x in range(0, 81)]
LAYER_STEPS = [x / 2 for x in range(-20, 81)]
PARAMS = (
    "layer",
    "no_fa",
    "output",
    "pipeline",
    "pipeline_output",
    "pipeline_host_no_fa",
    "kv_scores",
    "expert_mid",
    "remote_kv",
    "pipeline_host_masks",
    "no_experts",
)


def within(ours: int, theirs: int) -> bool:
    return abs(ours - theirs) <= max(0.05 * theirs, 16 * MiB)


def real_archs() -> set[str]:
    return {load(path)[1].architecture.name for path in DATA.glob("*.json")}


def collect(only: list[str]) -> dict[str, list[tuple[DeviceGraph, GraphShape, int]]]:
    """arch -> (device graph, shape, llama.cpp's compute bytes) per recorded device row."""
    seen: list[tuple[DeviceGraph, GraphShape]] = []
    real = memory.device_compute

    def spy(dev: DeviceGraph, shape: GraphShape, rule: GraphRule) -> int:
        seen.append((dev, shape))
        return real(dev, shape, rule)

    memory.device_compute = spy  # type: ignore[assignment]
    out: dict[str, list[tuple[DeviceGraph, GraphShape, int]]] = defaultdict(list)
    try:
        for path in sorted(DATA.glob("*.json")):
            doc, layout = load(path)
            if only and doc["config"] not in only:
                continue
            for entry in doc["cases"]:
                if entry["exit_code"] != 0:
                    continue
                config, n_gpu = run_config(entry["config"])
                seen.clear()
                memory.estimate(layout, rpc_machine(n_gpu), config)
                unit, ref = reference(entry)
                names = [f"RPC{i}" for i in range(n_gpu)] + ["Host"]
                for (dev, shape), name in zip(seen, names, strict=True):
                    want = ref.get(name, {}).get("compute", 0) * (MiB if unit == "MiB" else 1)
                    out[layout.architecture.name].append((dev, shape, want))
        grid_doc = json.loads(gzip.open(GRID).read())
        for name, entry in sorted(grid_doc["configs"].items()):
            if only and name not in only:
                continue
            _, layout = load(DATA / f"{name}.json")
            for case in entry["cases"]:
                if "error" in case:
                    continue
                config, n_gpu = grid_config(case["config"])
                seen.clear()
                memory.estimate(layout, rpc_machine(n_gpu), config)
                _, ref = reference(case)
                names = [f"RPC{i}" for i in range(n_gpu)] + ["Host"]
                for (dev, shape), dname in zip(seen, names, strict=True):
                    want = ref.get(dname, {}).get("compute", 0)
                    out[layout.architecture.name].append((dev, shape, want))
        doc = json.loads(gzip.open(ARCHS).read())
        grid = [case_from_dict(c) for c in doc["grid"]]
        for model in sorted(doc["models"]):
            entry = doc["models"][model]
            layout = layout_from_header(header_from_json(entry["header"]), basis=model)
            if only and model not in only:
                continue
            for c in entry["cases"]:
                if c["error"] is not None:
                    continue
                case = grid[c["case"]]
                seen.clear()
                memory.estimate(layout, machine(case.rpc), case.config())
                names = [f"RPC{i}" for i in range(len(seen) - 1)] + ["Host"]
                for (dev, shape), name in zip(seen, names, strict=True):
                    if name in c["devices"]:
                        want = c["devices"][name]["compute"]
                        out[layout.architecture.name].append((dev, shape, want))
    finally:
        memory.device_compute = real  # type: ignore[assignment]
    return out


def score(rule: GraphRule, rows: list[tuple[DeviceGraph, GraphShape, int]]) -> tuple[int, float]:
    good, err = 0, 0.0
    for dev, shape, want in rows:
        got = device_compute(dev, shape, rule)
        good += within(got, want)
        err += abs(got - want) / max(want, 16 * MiB)
    return good, -err


def fit(rows: list[tuple[DeviceGraph, GraphShape, int]]) -> GraphRule:
    rule = GENERIC
    best = score(rule, rows)
    for _ in range(3):
        for name in PARAMS:
            for value in LAYER_STEPS if name == "layer" else STEPS:
                trial = replace(rule, **{name: value})
                s = score(trial, rows)
                if s > best:
                    rule, best = trial, s
    return rule


RULES_PY = ROOT / "quantpick" / "plan" / "graph_rules.py"
BLOCK = re.compile(
    r"(# -- GRAPH_RULES: written by scripts/fit_compute.py --emit --\n"
    r"GRAPH_RULES: dict\[str, GraphRule\] = \{\n)(.*?)(\}\n# -- end of GRAPH_RULES --\n)",
    re.DOTALL,
)
RECORD = re.compile(r'^    "(?P<arch>[^"]+)": GraphRule\(.*beyond 25%(?P<note>[^"]*)"\),$')


def emit(records: dict[str, str], *, generic: set[str]) -> None:
    """Write `records` (arch -> its line) as GRAPH_RULES in graph_rules.py, one record a line.
    An architecture in `generic` (its rows all fit the generic rule) loses its record, unless the
    record carries a note after "beyond 25%": then it rests on data this script does not read
    (minimax-m3's tests/data/arch-traits.json) and is kept as it is. A record of an
    architecture this run read no rows of is kept too."""
    text = RULES_PY.read_text(encoding="utf-8")
    match = BLOCK.search(text)
    if match is None:
        raise SystemExit(f"{RULES_PY}: no GRAPH_RULES block")
    old = {m["arch"]: m for m in map(RECORD.match, match[2].splitlines()) if m}
    kept = {
        a: m.string for a, m in old.items() if a not in records and (a not in generic or m["note"])
    }
    new = {**kept, **records}
    for arch, line in new.items():
        note = old[arch]["note"] if arch in old else ""
        if note and arch in records:
            new[arch] = line[: -len('"),')] + note + '"),'
    body = "".join(f"{new[a]}\n" for a in sorted(new))
    RULES_PY.write_text(text[: match.start(2)] + body + text[match.end(2) :], encoding="utf-8")
    print(
        f"wrote {len(records)} of {len(new)} records into {RULES_PY.relative_to(ROOT)}"
        + (f" (kept as they were: {', '.join(sorted(kept))})" if kept else "")
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--emit", action="store_true", help="write the records into graph_rules.py")
    args = ap.parse_args()
    real = real_archs()
    records: dict[str, str] = {}
    generic: set[str] = set()
    for arch, rows in sorted(collect(args.only).items()):
        if score(GENERIC, rows)[0] == len(rows) and arch not in real:
            generic.add(arch)
            continue  # the generic rule holds on every row: no entry
        rule = fit(rows)
        errs = [abs(device_compute(d, s, rule) - w) / max(w, 1) for d, s, w in rows]
        beyond = sum(
            abs(device_compute(d, s, rule) - w) > max(0.25 * w, 16 * MiB) for d, s, w in rows
        )
        good, _ = score(rule, rows)
        values = ", ".join(
            f"{f.name}={getattr(rule, f.name)}"
            for f in fields(rule)
            if f.name in PARAMS and getattr(rule, f.name) != getattr(GENERIC, f.name)
        )
        records[arch] = (
            f'    "{arch}": GraphRule({values}{", " if values else ""}source="{good}/{len(rows)} '
            f'rows within, median {statistics.median(errs):.1%}, {beyond} beyond 25%"),'
        )
        print(records[arch])
    if args.emit:
        emit(records, generic=generic)
    return 0


if __name__ == "__main__":
    sys.exit(main())
