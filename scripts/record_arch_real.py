#!/usr/bin/env python3
"""Record llama.cpp's per-device memory projection for full-size, header-only GGUFs of real
model configurations (tests/arch_configs.py), one fixture per config:
tests/data/arch-real/<config>.json.

    scripts/record_arch_real.py --bin DIR [--only NAME ...] [--oracle-mem PATH] [--out DIR]

Each config's file is written by tests/arch_fixtures.py (a sparse file: the header is real, the
tensor data a hole; it is deleted afterwards, never committed) and run through llama-fit-params
(`--fit-print on -fit off --log-jsonl`) over a grid: -c 4096 and 32768 (the training context when
smaller), -np 1 and 2, f16 and q8_0 KV with -fa on and f16 with -fa off, on the CPU (-dev none)
and on two local RPC workers (ggml-rpc-server, tests/rpc_workers.py) with -ngl all and a partial
-ngl, both -ts 3,1, plus --n-cpu-moe 4 for MoE models. A fixture holds the GGUF header as
quantpick stores it (quantpick.model.gguf.header_to_json), so tests rebuild the layout without
the file, and per case the argv (ports generalised), llama-fit-params' fit_memory_breakdown rows
(MiB floored; the machine-dependent total/free left out) and, with --oracle-mem, the exact bytes
per device and buffer type from a memory-probe tool built against the same llama.cpp libraries
(PATH; scripts/llamacpp-memory/ builds the llama-memory-bytes tool of the same kind).
Re-running rewrites the fixtures; llama.cpp is deterministic here, so they only change when the
table, a config or the pinned llama.cpp does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from arch_configs import CONFIGS, RealConfig  # noqa: E402
from arch_fixtures import write_header_only  # noqa: E402
from rpc_workers import rpc_workers  # noqa: E402

from quantpick.model.gguf import header_to_json, read_gguf_file  # noqa: E402

OUT = ROOT / "tests" / "data" / "arch-real"
CTX = (4096, 32768)
NP = (1, 2)
KV = (("f16", "on"), ("q8_0", "on"), ("f16", "off"))  # (-ctk = -ctv, -fa)
N_CPU_MOE = 4
DEVICE_ROW_KEYS = ("kind", "name", "self", "model", "context", "compute")
PORT_RE = re.compile(r"127\.0\.0\.1:\d+")


def grid(cfg: RealConfig) -> list[dict[str, Any]]:
    """The cases of one config: memory settings x device settings."""
    n_ctx_train = cfg.architecture.context_length
    ctxs = sorted({min(c, n_ctx_train) for c in CTX})
    partial = cfg.architecture.block_count // 2  # blocks 0..half-1 stay on the CPU
    devices: list[dict[str, Any]] = [
        {"devices": "none"},
        {"devices": "rpc2", "ngl": "all", "ts": "3,1"},
        {"devices": "rpc2", "ngl": str(partial), "ts": "3,1"},
    ]
    if cfg.moe:
        devices.append({"devices": "rpc2", "ngl": "all", "ts": "3,1", "n_cpu_moe": N_CPU_MOE})
    cases = []
    for ctx, n_par, (kv, fa), dev in itertools.product(ctxs, NP, KV, devices):
        cases.append({"ctx": ctx, "np": n_par, "ctk": kv, "ctv": kv, "fa": fa, **dev})
    return cases


def flags(case: dict[str, Any], endpoints: list[str]) -> list[str]:
    a = ["-c", str(case["ctx"]), "-np", str(case["np"]), "-ctk", case["ctk"],
         "-ctv", case["ctv"], "-fa", case["fa"]]  # fmt: skip
    if case["devices"] == "none":
        return a + ["-dev", "none"]
    a += ["--rpc", ",".join(endpoints), "-ngl", case["ngl"], "-ts", case["ts"]]
    if case.get("n_cpu_moe"):
        a += ["--n-cpu-moe", str(case["n_cpu_moe"])]
    return a


def shown(argv: list[str], model: Path, name: str) -> list[str]:
    """argv as recorded: the tool's name, the model's file name, the RPC ports generalised."""
    out = [Path(argv[0]).name]
    for arg in argv[1:]:
        if arg == str(model):
            out.append(f"{name}.gguf")
        else:
            out.append(PORT_RE.sub("127.0.0.1:PORT", arg))
    return out


def run(argv: list[str]) -> tuple[int, str, str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


def printed_rows(out: str) -> list[dict[str, Any]]:
    """The `DEV model context compute` lines llama-fit-params prints (printf: they survive when
    the JSON record is lost; CPU_REPACK is not among them)."""
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            kind = "host" if parts[0] == "Host" else "device"
            rows.append({"kind": kind, "name": parts[0], "model": int(parts[1]),
                         "context": int(parts[2]), "compute": int(parts[3])})  # fmt: skip
    return rows


def fit_params(bin_dir: Path, model: Path, args: list[str]) -> tuple[list[str], int, dict]:
    """(argv, exit code, result). llama-fit-params can exit before its async logger writes the
    fit_memory_breakdown JSON record (oracle SURVEY §6): retried, then the printed lines."""
    argv = [str(bin_dir / "llama-fit-params"), "-m", str(model), "--fit-print", "on",
            "-fit", "off", "--log-jsonl", *args]  # fmt: skip
    rc, out, err = 0, "", ""
    for _ in range(8):
        rc, out, err = run(argv)
        for line in out.splitlines():
            if line.startswith('{"type":"fit_memory_breakdown"'):
                rows = json.loads(line)["data"]["rows"]
                return argv, rc, {"mib": [{k: r[k] for k in DEVICE_ROW_KEYS if k in r}
                                          for r in rows]}  # fmt: skip
        if rc != 0:
            return argv, rc, {"mib": [], "stderr_tail": (err or out)[-1500:]}
    return argv, rc, {"mib": printed_rows(out), "mib_from": "printed lines (no JSON record)"}


def oracle_mem(tool: Path, model: Path, args: list[str]) -> dict[str, Any] | None:
    rc, out, err = run([str(tool), "-m", str(model), "--log-disable", *args])
    for line in out.splitlines():
        if line.startswith('{"type":"oracle_mem"'):
            doc = json.loads(line)
            for buft in doc.get("buffer_types", []):
                buft["name"] = PORT_RE.sub("PORT", buft["name"])
            return {k: doc[k] for k in ("n_ctx", "n_ctx_seq", "buffer_types", "devices")}
    return {"exit_code": rc, "stderr_tail": err[-1500:]}


def dump(doc: dict[str, Any]) -> str:
    """JSON with one tensor and one case per line (readable diffs, a few hundred KB)."""
    header = dict(doc["header"])
    tensors = header.pop("tensors")
    head = {k: v for k, v in doc.items() if k not in ("header", "cases")}
    lines = ["{"]
    lines += [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append(' "header": {')
    lines += [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in header.items()]
    lines.append('  "tensors": [')
    lines.append(",\n".join("   " + json.dumps(t) for t in tensors))
    lines.append("  ]")
    lines.append(" },")
    lines.append(' "cases": [')
    lines.append(",\n".join("  " + json.dumps(c, separators=(",", ":")) for c in doc["cases"]))
    lines.append(" ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def record(cfg: RealConfig, bin_dir: Path, endpoints: list[str], tmp: Path,
           tool: Path | None) -> dict[str, Any]:  # fmt: skip
    model = tmp / f"{cfg.name}.gguf"
    # no general.file_type: the recorded headers stay the ones llama.cpp was shown
    size = write_header_only(model, cfg.architecture, cfg.quant, name=cfg.name, file_type=False)
    header = header_to_json(read_gguf_file(model))
    header["source"] = model.name
    cases = []
    try:
        for case in grid(cfg):
            args = flags(case, endpoints)
            argv, rc, result = fit_params(bin_dir, model, args)
            entry: dict[str, Any] = {"config": case, "argv": shown(argv, model, cfg.name),
                                     "exit_code": rc, **result}  # fmt: skip
            if tool is not None:
                entry["bytes"] = oracle_mem(tool, model, args)
            cases.append(entry)
    finally:
        model.unlink()
    return {
        "config": cfg.name,
        "arch": cfg.arch,
        "quant": cfg.quant,
        "source": cfg.source,
        "llama_cpp": bin_dir.parent.name,
        "file_bytes": size,
        "header": header,
        "cases": cases,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp bin dir (llama-fit-params)")
    ap.add_argument("--only", nargs="*", default=[], help="config names (default: all)")
    ap.add_argument("--oracle-mem", type=Path, help="oracle-mem binary: exact bytes per device")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    configs = [c for c in CONFIGS if not args.only or c.name in args.only]
    unknown = set(args.only) - {c.name for c in CONFIGS}
    if unknown:
        print(f"Error: unknown config(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    t_all = time.monotonic()
    with rpc_workers(args.bin, 2) as endpoints, tempfile.TemporaryDirectory() as tmp:
        for cfg in configs:
            t0 = time.monotonic()
            doc = record(cfg, args.bin, endpoints, Path(tmp), args.oracle_mem)
            (args.out / f"{cfg.name}.json").write_text(dump(doc))
            failed = sum(c["exit_code"] != 0 or not c["mib"] for c in doc["cases"])
            print(f"{cfg.name}: {len(doc['cases'])} cases, {failed} failed, "
                  f"{time.monotonic() - t0:.1f}s", flush=True)  # fmt: skip
    print(f"total {time.monotonic() - t_all:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
