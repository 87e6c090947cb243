#!/usr/bin/env python3
"""Predicted vs llama.cpp, per device: quantpick's memory model against llama.cpp's own projection.

    python benchmarks/accuracy.py                      # against the recorded tables in tests/data
    python benchmarks/accuracy.py --llama-bin DIR      # re-measure with llama-fit-params live

For every case and device it prints llama.cpp's model / context / compute MiB beside quantpick's,
then the max and median absolute error per component. Weights and context (KV + recurrent state)
are expected to be exact; compute buffers in the tables come from llama.cpp's CPU backend behind
RPC, not CUDA, so their deviation is reported, not fitted (quantpick models CUDA's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conformance_model import (  # noqa: E402
    case_config,
    config_from_args,
    rpc_machine,
    write_grid_models,
)

from quantpick.model.gguf import layout_from_header, read_gguf_file  # noqa: E402
from quantpick.plan.memory import estimate  # noqa: E402

MiB = 1024**2
PORTS = (50072, 50073)  # not record_conformance's, so both can run at once


def models(tmp: Path) -> dict:
    return {
        key: (path, layout_from_header(read_gguf_file(path), basis=str(path), file_bytes=size))
        for key, (path, size) in write_grid_models(tmp).items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", type=Path, help="llama.cpp build/bin: measure live")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "scripts"))
    tables = [
        (
            "q4km",
            json.loads((ROOT / "tests/data/llamacpp-fit-q4_k_m.json").read_text())["cases"],
            True,
        ),
        (
            None,
            json.loads((ROOT / "tests/data/llamacpp-fit-extra.json").read_text())["cases"],
            False,
        ),
    ]
    from contextlib import nullcontext

    from record_conformance import fit_params, rpc_workers  # type: ignore[import-not-found]

    live = rpc_workers(args.llama_bin, PORTS) if args.llama_bin else nullcontext()
    errors: dict[str, list[int]] = {"model": [], "context": [], "compute": [], "host_compute": []}
    with live, tempfile.TemporaryDirectory() as tmp:
        built = models(Path(tmp))
        print(
            f"{'case':<62} {'device':<6} {'model q/l':>13} {'context q/l':>13} {'compute q/l':>13}"
        )
        for default_model, cases, original in tables:
            for case in cases:
                key = default_model or case["model"]
                path, layout = built[key]
                if original:
                    config = case_config(case["config"])
                    n_gpu = case["config"]["devices"]
                    flags = case["llama_cpp_args"]
                else:
                    config, n_gpu = config_from_args(case["llama_cpp_args"])
                    flags = case["llama_cpp_args"]
                want = (
                    fit_params(args.llama_bin, path, flags, PORTS)[0]
                    if args.llama_bin
                    else case["mib"]
                )
                est = estimate(layout, rpc_machine(n_gpu), config)
                label = (key + " " + " ".join(flags))[:62]
                for dev, (name, w) in zip(est.devices, want.items(), strict=True):
                    got = {
                        "model": dev.weights_bytes // MiB,
                        "context": (dev.kv_bytes + dev.recurrent_bytes) // MiB,
                        "compute": dev.compute_bytes // MiB,
                    }
                    cells = []
                    for comp in ("model", "context", "compute"):
                        ref = w[comp]
                        if ref is None:
                            cells.append(f"{got[comp]:>6}/{'-':>6}")
                            continue
                        cells.append(f"{got[comp]:>6}/{ref:>6}")
                        bucket = "host_compute" if comp == "compute" and name == "Host" else comp
                        errors[bucket].append(abs(got[comp] - ref))
                    print(f"{label:<62} {name:<6} {cells[0]:>13} {cells[1]:>13} {cells[2]:>13}")
                    label = ""
    print()
    print("absolute error, MiB (q = quantpick, l = llama.cpp):")
    for comp, values in errors.items():
        if values:
            print(
                f"  {comp:<13} n={len(values):<3} max={max(values):>6}  "
                f"median={statistics.median(values):>7.1f}"
                f"  exact={sum(v == 0 for v in values)}/{len(values)}"
            )
    print(
        "compute: llama.cpp figures are its CPU backend behind RPC; quantpick models CUDA "
        "(FA scratch for quantized KV, host experts copied for prompt processing)."
    )


if __name__ == "__main__":
    main()
