"""What confirming a plan with llama.cpp adds to `command` (and so to `get`): wall time of
`quantpick command` with and without `--no-confirm`, run interleaved, beside the goal (a few
seconds at most), and llama-fit-params alone on a full-size 35B-A3B header with two RPC workers
standing in for GPUs.

Usage:
    python benchmarks/confirm.py --bin /path/to/llama.cpp/build/bin [-n 7]

The models are written here: the full-size header-only Q4_K_M (sparse, no disk used) and the tiny
loadable model of the tests.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

GOAL_S = 3.0  # "it must not add more than a few seconds"


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    run = subprocess.run(argv, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{run.stderr[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    from conformance_model import write_conformance_gguf
    from record_conformance import RPC_PORTS, rpc_workers
    from tiny_model import write_tiny_model

    from quantpick.plan.memory import RunConfig
    from quantpick.serve.fitparams import fit_params_argv, run_fit_params

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp build/bin")
    ap.add_argument("-n", type=int, default=7, help="rounds")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="quantpick-confirm-"))
    full, tiny = tmp / "q4km.gguf", tmp / "tiny.gguf"
    write_conformance_gguf(full)
    write_tiny_model(tiny)
    tools = ["--llama-bin", str(args.bin), "--llama-server", str(args.bin / "llama-server")]
    cases = {
        "tiny, -c 8192": ["--gguf", str(tiny), "-c", "8192"],
        "35B-A3B Q4_K_M header, -c 65536 (host)": ["--gguf", str(full), "-c", "65536"],
    }
    for label, model in cases.items():
        base = [sys.executable, "-m", "quantpick", "command", *model, *tools]
        with_c, without = [], []
        for _ in range(args.n):
            with_c.append(timed(base))
            without.append(timed([*base, "--no-confirm"]))
        a, b = statistics.median(with_c), statistics.median(without)
        print(
            f"{label}: command {a:.2f} s, with --no-confirm {b:.2f} s -> confirm adds "
            f"{a - b:.2f} s (goal <= {GOAL_S:g} s)"
        )
    with rpc_workers(args.bin):
        argv, env = fit_params_argv(
            args.bin / "llama-fit-params",
            RunConfig(ctx_size=262144, tensor_split=(30.0, 12.0)),
            full,
            41,
            extra_args=("--rpc", ",".join(f"127.0.0.1:{p}" for p in RPC_PORTS)),
        )
        times = [run_fit_params(argv, env).seconds for _ in range(args.n)]
    print(
        f"llama-fit-params alone, 35B-A3B Q4_K_M header on two RPC devices, -c 262144: "
        f"median {statistics.median(times):.2f} s over {args.n} runs (goal <= {GOAL_S:g} s)"
    )


if __name__ == "__main__":
    main()
