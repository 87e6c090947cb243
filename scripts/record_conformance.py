#!/usr/bin/env python3
"""Record llama.cpp's own per-device memory projection for a grid of configurations.

Writes tests/data/llamacpp-fit-extra.json, which tests/plan/test_memory.py checks the memory model
against (weights and KV+recurrent state exact, in MiB floored as llama.cpp prints them).

Needs a llama.cpp build with llama-fit-params and ggml-rpc-server (two RPC workers on 127.0.0.1
stand in for two GPUs, as in tests/data/llamacpp-fit-q4_k_m.json):

    scripts/record_conformance.py --bin /path/to/llama.cpp/build/bin [--out FILE]

The models are header-only sparse GGUFs written by tests/conformance_model.py (no disk used).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conformance_model import write_grid_models  # noqa: E402

# (model key, args) -- model keys: q4km (llama.cpp's Q4_K_M mix, with MTP), bf16, q8_0 (uniform
# types, with MTP), q4km-nomtp (40 blocks).
GRID: list[tuple[str, list[str]]] = [
    ("q4km", ["-c", "10000", "-np", "3", "-ngl", "99", "-ts", "24,16"]),
    (
        "q4km",
        ["-c", "65536", "-np", "2", "-ngl", "99", "-ts", "3,1", "-ctk", "q8_0", "-ctv", "f16"],
    ),
    (
        "q4km",
        ["-c", "131072", "-np", "1", "-ngl", "99", "-ts", "1,1", "-ctk", "q4_0", "-ctv", "q4_0"],
    ),
    ("q4km", ["-c", "65536", "-np", "4", "-ngl", "20", "-ts", "24,16"]),
    ("q4km", ["-c", "32768", "-np", "1", "-ngl", "1", "-ts", "24,16"]),
    ("q4km", ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "24,16", "--n-cpu-moe", "25"]),
    ("q4km", ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "24,16", "--cpu-moe"]),
    (
        "q4km",
        [
            "-c",
            "32768",
            "-np",
            "1",
            "-ngl",
            "99",
            "-ts",
            "24,16",
            "-ot",
            r"blk\.(1[0-9]|2[0-9])\.ffn_(up|down|gate)_exps=CPU",
        ],
    ),
    ("q4km", ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "24,16", "-nkvo"]),
    (
        "q4km",
        ["-c", "49152", "-np", "2", "-ngl", "99", "-ts", "30,12", "-ctk", "q5_1", "-ctv", "q5_0"],
    ),
    (
        "q4km",
        ["-c", "262144", "-np", "8", "-ngl", "99", "-ts", "24,16", "-ctk", "f32", "-ctv", "f32"],
    ),
    (
        "q4km",
        ["-c", "16384", "-np", "1", "-ngl", "99", "-ts", "24,16", "-ub", "2048", "-b", "2048"],
    ),
    (
        "q4km",
        ["-c", "8192", "-np", "1", "-ngl", "99", "-ts", "24,16", "-ctk", "iq4_nl", "-ctv", "q4_1"],
    ),
    ("q4km", ["-c", "100000", "-np", "4", "-dev", "none"]),
    ("bf16", ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "1,1", "--n-cpu-moe", "30"]),
    ("bf16", ["-c", "65536", "-np", "2", "-dev", "none"]),
    (
        "q8_0",
        [
            "-c",
            "131072",
            "-np",
            "1",
            "-ngl",
            "99",
            "-ts",
            "24,16",
            "--n-cpu-moe",
            "12",
            "-ctk",
            "q8_0",
            "-ctv",
            "q8_0",
        ],
    ),
    ("q8_0", ["-c", "4096", "-np", "1", "-ngl", "30", "-ts", "2,1"]),
    ("q4km-nomtp", ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "24,16"]),
    (
        "q4km-nomtp",
        ["-c", "262144", "-np", "4", "-ngl", "41", "-ts", "24,16", "-ctk", "q8_0", "-ctv", "q8_0"],
    ),
    ("q4km-nomtp", ["-c", "65536", "-np", "1", "-ngl", "99", "-ts", "24,16", "--n-cpu-moe", "8"]),
]


def write_models(tmp: Path) -> dict[str, Path]:
    return {key: path for key, (path, _) in write_grid_models(tmp).items()}


def parse(text: str) -> dict[str, dict[str, int | None]]:
    out: dict[str, dict[str, int | None]] = {}
    for line in text.splitlines():
        parts = line.split()
        if (
            len(parts) == 4
            and parts[0] in ("RPC0", "RPC1", "Host")
            and all(p.lstrip("-").isdigit() for p in parts[1:])
        ):
            model = int(parts[1])
            out[parts[0]] = {
                "model": None if parts[0] == "Host" else model,
                "context": int(parts[2]),
                "compute": int(parts[3]),
            }
    return out


RPC_PORTS = (50062, 50063)


@contextmanager
def rpc_workers(bin_dir: Path, ports: tuple[int, ...] = RPC_PORTS) -> Iterator[None]:
    """Two ggml-rpc-server workers on 127.0.0.1: the "GPUs" of the two-device cases."""
    workers = [
        subprocess.Popen(
            [str(bin_dir / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in ports
    ]
    time.sleep(1.5)
    try:
        yield
    finally:
        for w in workers:
            w.terminate()


def fit_params(
    bin_dir: Path, model: Path, args: list[str], ports: tuple[int, ...] = RPC_PORTS
) -> tuple[dict[str, dict[str, int | None]], str]:
    """llama.cpp's projection for `args` (-fa on, printed, not fitted): (MiB per device, stderr)."""
    cmd = [str(bin_dir / "llama-fit-params"), "-m", str(model), "-fa", "on", "-fitp", "on",
           "-fit", "off", *args]  # fmt: skip
    if "-dev" not in args:
        cmd += ["--rpc", ",".join(f"127.0.0.1:{p}" for p in ports)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return parse(run.stdout), run.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp build/bin")
    ap.add_argument("--out", type=Path, default=ROOT / "tests/data/llamacpp-fit-extra.json")
    ap.add_argument("--tmp", type=Path, default=Path("/tmp/quantpick-conformance"))
    args = ap.parse_args()
    args.tmp.mkdir(parents=True, exist_ok=True)
    models = write_models(args.tmp)
    version = subprocess.run(
        [str(args.bin / "llama-server"), "--version"], capture_output=True, text=True
    ).stderr.splitlines()[0]
    cases = []
    with rpc_workers(args.bin):
        for key, extra in GRID:
            mib, stderr = fit_params(args.bin, models[key], extra)
            if not mib:
                print(f"FAILED {key} {' '.join(extra)}\n{stderr[-2000:]}", file=sys.stderr)
                continue
            cases.append({"model": key, "llama_cpp_args": extra, "mib": mib})
            print(key, " ".join(extra), json.dumps(mib))
    args.out.write_text(
        json.dumps(
            {
                "source": f"llama-fit-params --fit-print on -fit off -fa on ({version})",
                "models": {
                    "q4km": "llama.cpp Q4_K_M tensor types (q4_k_m-tensor-types.tsv), 41 blocks",
                    "bf16": "every matrix BF16, 41 blocks",
                    "q8_0": "every matrix Q8_0, 41 blocks",
                    "q4km-nomtp": "Q4_K_M types without the MTP block (40 blocks)",
                },
                "devices_note": "RPC0/RPC1: two llama.cpp RPC workers on 127.0.0.1 stand in for "
                "two GPUs (free memory = host RAM). MiB floored. Compute: the CPU backend's.",
                "cases": cases,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
