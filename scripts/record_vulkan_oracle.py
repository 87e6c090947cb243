#!/usr/bin/env python3
"""Record llama.cpp's memory projection on a real Vulkan backend (Mesa's software driver,
lavapipe, on a CPU-only Linux box) for full-size, header-only GGUFs of real model configurations
(tests/arch_configs.py): tests/data/vulkan-oracle.json.gz, read by tests/test_vulkan_oracle.py.

    scripts/build-llamacpp-vulkan.sh SRC /tmp/vk-build        # optional, ~35 min, never in CI
    scripts/record_vulkan_oracle.py --bin /tmp/vk-build/build/bin [--only NAME ...]

Each config's file is written by tests/arch_fixtures.py (sparse: a real header, the tensor data a
hole; deleted afterwards) and run through the Vulkan build's llama-fit-params
(`--fit-print on -fit off --log-jsonl`: lavapipe's heap is 2048 MiB, so llama.cpp is asked to
project, not to fit) and llama-memory-bytes (scripts/llamacpp-memory: the same projection in
bytes per buffer type) over a grid: -c 4096 and 32768 (the training context when smaller), f16
and q8_0 KV with -fa on and f16 with -fa off, on one device (GGML_VK_VISIBLE_DEVICES=0: lavapipe
is a CPU-type device llama.cpp skips unless named; ggml-vulkan.cpp:5264-5280 at b11312) with
-ngl all and a partial -ngl, and on two (GGML_VK_VISIBLE_DEVICES=0,0: Vulkan0 and Vulkan1 on the
one software GPU) with -ts 3,1. The fixture holds per config the GGUF header as quantpick stores
it (header_to_json), and per case the flags, the visible devices, llama-fit-params' rows (MiB
floored) and llama-memory-bytes' buffer types (bytes). llama.cpp is deterministic here: the
fixture only changes with the table, a config, the pinned llama.cpp or the Mesa version (which
sets the buffer alignment and which tensor types lavapipe runs; both are recorded).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from arch_configs import CONFIGS, RealConfig  # noqa: E402
from arch_fixtures import write_header_only  # noqa: E402
from record_arch_real import DEVICE_ROW_KEYS, printed_rows  # noqa: E402

from quantpick.model.gguf import header_to_json, read_gguf_file  # noqa: E402

OUT = ROOT / "tests" / "data" / "vulkan-oracle.json.gz"
CTX = (4096, 32768)
KV = (("f16", "on"), ("q8_0", "on"), ("f16", "off"))  # (-ctk = -ctv, -fa)
TIMEOUT_S = 600
# "  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)" (--list-devices)
DEVICE_LINE = re.compile(r"^\s+(Vulkan\d+: .+)$", re.MULTILINE)


def grid(cfg: RealConfig) -> list[dict[str, Any]]:
    n_ctx_train = cfg.architecture.context_length
    ctxs = sorted({min(c, n_ctx_train) for c in CTX})
    partial = cfg.architecture.block_count // 2  # blocks 0..half-1 stay on the CPU
    devices: list[dict[str, Any]] = [
        {"visible": "0", "ngl": "all"},
        {"visible": "0", "ngl": str(partial)},
        {"visible": "0,0", "ngl": "all", "ts": "3,1"},
    ]
    return [
        {"ctx": ctx, "np": 1, "ctk": kv, "ctv": kv, "fa": fa, **dev}
        for ctx, (kv, fa), dev in itertools.product(ctxs, KV, devices)
    ]


def flags(case: dict[str, Any]) -> list[str]:
    a = ["-c", str(case["ctx"]), "-np", str(case["np"]), "-ctk", case["ctk"],
         "-ctv", case["ctv"], "-fa", case["fa"], "-ngl", case["ngl"]]  # fmt: skip
    if "ts" in case:
        a += ["-ts", case["ts"]]
    return a


def run(argv: list[str], visible: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GGML_VK_VISIBLE_DEVICES": visible}
    return subprocess.run(argv, capture_output=True, text=True, errors="replace",
                          stdin=subprocess.DEVNULL, timeout=TIMEOUT_S, env=env)  # fmt: skip


def fit_params(bin_dir: Path, model: Path, case: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """llama-fit-params' rows; its async logger can lose the JSON record: retried, then the
    printed lines (as scripts/record_arch_real.py does)."""
    argv = [str(bin_dir / "llama-fit-params"), "-m", str(model), "--fit-print", "on",
            "-fit", "off", "--log-jsonl", *flags(case)]  # fmt: skip
    proc = None
    for _ in range(4):
        proc = run(argv, case["visible"])
        for line in proc.stdout.splitlines():
            if line.startswith('{"type":"fit_memory_breakdown"'):
                rows = json.loads(line)["data"]["rows"]
                keep = [{k: r[k] for k in DEVICE_ROW_KEYS if k in r} for r in rows]
                return proc.returncode, {"mib": keep, "log": proc.stderr}
        if proc.returncode != 0:
            return proc.returncode, {"mib": [], "stderr_tail": proc.stderr[-1500:]}
    assert proc is not None
    return proc.returncode, {"mib": printed_rows(proc.stdout), "log": proc.stderr,
                             "mib_from": "printed lines (no JSON record)"}  # fmt: skip


def memory_bytes(bin_dir: Path, model: Path, case: dict[str, Any]) -> dict[str, Any]:
    argv = [str(bin_dir / "llama-memory-bytes"), "-m", str(model), "--log-disable", *flags(case)]
    proc = run(argv, case["visible"])
    line = next((x for x in proc.stdout.splitlines() if x.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        return {"exit_code": proc.returncode, "stderr_tail": proc.stderr[-1500:]}
    doc = json.loads(line)
    return {k: doc[k] for k in ("n_ctx", "n_ctx_seq", "buffer_types", "devices")}


def record(cfg: RealConfig, bin_dir: Path, tmp: Path) -> dict[str, Any]:
    model = tmp / f"{cfg.name}.gguf"
    size = write_header_only(model, cfg.architecture, cfg.quant, name=cfg.name, file_type=False)
    header = header_to_json(read_gguf_file(model))
    header["source"] = model.name
    cases = []
    try:
        for case in grid(cfg):
            rc, fit = fit_params(bin_dir, model, case)
            fit.pop("log", None)
            entry = {"config": case, "exit_code": rc, **fit,
                     "bytes": memory_bytes(bin_dir, model, case)}  # fmt: skip
            cases.append(entry)
    finally:
        model.unlink()
    return {"config": cfg.name, "arch": cfg.arch, "quant": cfg.quant, "source": cfg.source,
            "file_bytes": size, "header": header, "cases": cases}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--bin", type=Path, required=True, help="the Vulkan build's bin dir (llama-fit-params)"
    )
    ap.add_argument("--only", nargs="*", default=[], help="config names (default: all)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    unknown = set(args.only) - {c.name for c in CONFIGS}
    if unknown:
        print(f"Error: unknown config(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    configs = [c for c in CONFIGS if not args.only or c.name in args.only]
    listed = run([str(args.bin / "llama-fit-params"), "--list-devices"], "0")
    found = DEVICE_LINE.search(listed.stdout + listed.stderr)
    driver = {"device": found.group(1).strip() if found else "unknown"}
    mesa = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "mesa-vulkan-drivers"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if mesa.returncode == 0 and mesa.stdout:
        driver["device"] += f"; Mesa {mesa.stdout.strip()} (Debian mesa-vulkan-drivers)"
    docs = []
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in configs:
            t0 = time.monotonic()
            doc = record(cfg, args.bin, Path(tmp))
            docs.append(doc)
            failed = sum(c["exit_code"] != 0 or "buffer_types" not in c["bytes"]
                         for c in doc["cases"])  # fmt: skip
            print(f"{cfg.name}: {len(doc['cases'])} cases, {failed} failed, "
                  f"{time.monotonic() - t0:.1f}s", flush=True)  # fmt: skip
    out = {
        "llama_cpp": "b11312 (0c1e57098), -DGGML_VULKAN=ON (scripts/build-llamacpp-vulkan.sh)",
        "driver": driver.get("device", "unknown"),
        "recorded_by": "scripts/record_vulkan_oracle.py",
        "configs": docs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(out, separators=(",", ":")).encode()
    # mtime=0: the same recording gives the same bytes
    args.out.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
    print(f"total {time.monotonic() - t_all:.0f}s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
