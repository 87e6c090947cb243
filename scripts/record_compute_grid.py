#!/usr/bin/env python3
"""Record llama.cpp's compute buffers over a compute-focused grid for the full-size real configs
(tests/arch_configs.py): tests/data/arch-real-compute.json.gz.

    bin="$(scripts/build-llamacpp.sh | tail -n 1)"
    scripts/record_compute_grid.py --bin "$bin" [--only NAME ...]

The grid adds what tests/data/arch-real (scripts/record_arch_real.py, -ub 512) leaves out and the
compute model must follow: -ub 128 to 4096, flash attention off at two ubatches, -np 4 and 8 with
and without the unified cache (-kvu), -ngl 0 on two devices, and for MoE models the routed experts
in host memory by -ot exps=CPU and by --n-cpu-moe at a large ubatch. Each config's header-only
GGUF is written as record_arch_real.py writes it (the same header as its arch-real fixture, which
the tests rebuild the layout from) and projected by llama-memory-bytes (scripts/llamacpp-memory/:
llama-fit-params' projection in bytes, with --kv-unified) on the CPU (-dev none) or two local CPU
RPC workers. The fixture keeps per case only the bytes per buffer type (model / context /
compute; the host is its CPU buffers plus CPU_REPACK, as tests/arch_real.py reads them), gzipped
JSON of a few KB; re-running rewrites it.
"""

from __future__ import annotations

import argparse
import gzip
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

OUT = ROOT / "tests" / "data" / "arch-real-compute.json.gz"
CTX = 32768
PORT_RE = re.compile(r"127\.0\.0\.1:\d+")


def grid(moe: bool) -> list[dict[str, Any]]:
    """The cases (flags as data; `b` is -b, raised with -ub so that -ub takes effect)."""
    cases: list[dict[str, Any]] = []
    for ub in (128, 1024, 4096):
        cases.append({"ub": ub, "devices": "none"})
    cases.append({"ub": 2048, "devices": "rpc2", "ngl": "all", "ts": "3,1"})
    for ub in (128, 2048):
        cases.append({"ub": ub, "fa": "off", "devices": "none"})
    for n_par in (4, 8):
        for kvu in (False, True):
            cases.append({"np": n_par, "kvu": kvu, "devices": "none"})
    for ub in (512, 2048):
        cases.append({"ub": ub, "devices": "rpc2", "ngl": "0", "ts": "1,1"})
    if moe:
        cases.append({"ot": "exps=CPU", "devices": "rpc2", "ngl": "all", "ts": "1,1"})
        cases.append({"ub": 2048, "n_cpu_moe": 8, "devices": "rpc2", "ngl": "all", "ts": "1,1"})
    defaults = {"ctx": CTX, "np": 1, "kvu": False, "fa": "on", "ub": 512}
    return [{**defaults, **c} for c in cases]


def flags(case: dict[str, Any], endpoints: list[str], n_ctx_train: int) -> list[str]:
    ub = case["ub"]
    a = ["-c", str(min(case["ctx"], n_ctx_train)), "-np", str(case["np"]), "-fa", case["fa"],
         "-ub", str(ub), "-b", str(max(2048, ub))]  # fmt: skip
    if case["kvu"]:
        a.append("-kvu")
    if case["devices"] == "none":
        return a + ["-dev", "none"]
    a += ["--rpc", ",".join(endpoints), "-ngl", case["ngl"], "-ts", case["ts"]]
    if case.get("ot"):
        a += ["-ot", case["ot"]]
    if case.get("n_cpu_moe"):
        a += ["--n-cpu-moe", str(case["n_cpu_moe"])]
    return a


def project(tool: Path, model: Path, args: list[str]) -> dict[str, Any]:
    proc = subprocess.run([str(tool), "-m", str(model), "--log-disable", *args],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    line = next((x for x in proc.stdout.splitlines() if x.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {"error": tail[-300:]}
    doc = json.loads(line)
    keep = ("device", "model", "context", "compute")
    return {"bytes": {"buffer_types": [{"name": PORT_RE.sub("PORT", b["name"]),
                                        **{k: b[k] for k in keep}}
                                       for b in doc["buffer_types"]]}}  # fmt: skip


def record(cfg: RealConfig, bin_dir: Path, endpoints: list[str], tmp: Path) -> dict[str, Any]:
    model = tmp / f"{cfg.name}.gguf"
    write_header_only(model, cfg.architecture, cfg.quant, name=cfg.name, file_type=False)
    try:
        cases = []
        for case in grid(cfg.moe):
            case["ctx"] = min(case["ctx"], cfg.architecture.context_length)
            args = flags(case, endpoints, cfg.architecture.context_length)
            cases.append({"config": case, **project(bin_dir / "llama-memory-bytes", model, args)})
    finally:
        model.unlink()
    return {"arch": cfg.arch, "cases": cases}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp bin dir")
    ap.add_argument("--only", nargs="*", default=[], help="config names (default: all)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    configs = [c for c in CONFIGS if not args.only or c.name in args.only]
    doc: dict[str, Any] = {"llama_cpp": args.bin.parent.name, "configs": {}}
    if args.out.exists():
        doc["configs"] = json.loads(gzip.open(args.out).read())["configs"]
    with rpc_workers(args.bin, 2) as endpoints, tempfile.TemporaryDirectory() as tmp:
        for cfg in configs:
            t0 = time.monotonic()
            doc["configs"][cfg.name] = record(cfg, args.bin, endpoints, Path(tmp))
            failed = sum("error" in c for c in doc["configs"][cfg.name]["cases"])
            print(f"{cfg.name}: {len(doc['configs'][cfg.name]['cases'])} cases, {failed} failed, "
                  f"{time.monotonic() - t0:.1f}s", flush=True)  # fmt: skip
            args.out.write_bytes(gzip.compress(json.dumps(doc, sort_keys=True).encode(), mtime=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
