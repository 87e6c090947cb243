#!/usr/bin/env python3
"""quantpick's per-device weights and KV+state against llama.cpp, for the real configs recorded
in tests/data/arch-real (scripts/record_arch_real.py), per architecture.

    python benchmarks/arch_real_accuracy.py            # summary per config
    python benchmarks/arch_real_accuracy.py -v         # every mismatching device row

The reference is oracle-mem's exact bytes where recorded (llama.cpp's loader and context, bytes
per buffer type; the host is the CPU buffers plus CPU_REPACK), else llama-fit-params' MiB
floored. A row counts as exact when quantpick's bytes equal llama.cpp's (bytes) or its MiB
floored equal (MiB). The layout is rebuilt from the recorded header, as tests do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conformance_model import rpc_machine  # noqa: E402

from quantpick.model.gguf import header_from_json, layout_from_header  # noqa: E402
from quantpick.plan.memory import RunConfig, estimate  # noqa: E402

DATA = ROOT / "tests" / "data" / "arch-real"
MiB = 1024**2


def run_config(case: dict[str, Any]) -> tuple[RunConfig, int]:
    """A recorded case's flags as quantpick's RunConfig, and the number of (RPC) GPUs."""
    rpc = case["devices"] != "none"
    ngl = case.get("ngl", "all")
    config = RunConfig(
        ctx_size=case["ctx"],
        n_parallel=case["np"],
        cache_type_k=case["ctk"],
        cache_type_v=case["ctv"],
        flash_attn=case["fa"],
        n_gpu_layers=None if ngl == "all" else int(ngl),
        tensor_split=tuple(float(x) for x in case["ts"].split(",")) if rpc else None,
        n_cpu_moe=int(case.get("n_cpu_moe", 0)),
        logits_rows="batch",  # llama-fit-params reserves n_ubatch logits rows
    )
    return config, 2 if rpc else 0


def reference(entry: dict[str, Any]) -> tuple[str, dict[str, dict[str, int]]]:
    """("bytes" | "MiB", device -> {"model", "context"}) in quantpick's device order."""
    got = entry.get("bytes") or {}
    if "buffer_types" in got:
        out: dict[str, dict[str, int]] = {}
        for buft in got["buffer_types"]:
            dev = buft["device"] if buft["device"] not in ("", "CPU") else "Host"
            acc = out.setdefault(dev, {"model": 0, "context": 0})
            acc["model"] += buft["model"]
            acc["context"] += buft["context"]
        return "bytes", out
    out = {}
    for row in entry["mib"]:
        if row["kind"] in ("device", "host"):
            out[row["name"]] = {"model": row["model"], "context": row["context"]}
    return "MiB", out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--only", nargs="*", default=[])
    args = ap.parse_args()
    print(f"{'config':<22} {'arch':<11} {'cases':>5} {'weights exact':>14} {'KV+state exact':>15}"
          f" {'max |dW| MiB':>13} {'max |dKV| MiB':>14}")  # fmt: skip
    for path in sorted(DATA.glob("*.json")):
        doc = json.loads(path.read_text())
        if args.only and doc["config"] not in args.only:
            continue
        header = header_from_json(doc["header"])
        layout = layout_from_header(header, basis=path.name, file_bytes=doc["file_bytes"])
        rows = w_ok = kv_ok = 0
        w_err = kv_err = 0.0
        for entry in doc["cases"]:
            if entry["exit_code"] != 0:
                continue
            config, n_gpu = run_config(entry["config"])
            est = estimate(layout, rpc_machine(n_gpu), config)
            unit, ref = reference(entry)
            names = [f"RPC{i}" for i in range(n_gpu)] + ["Host"]
            for dev, name in zip(est.devices, names, strict=True):
                want = ref.get(name, {"model": 0, "context": 0})
                got_w, got_kv = dev.weights_bytes, dev.kv_bytes + dev.recurrent_bytes
                if unit == "MiB":
                    got_w, got_kv = got_w // MiB, got_kv // MiB
                scale = 1 if unit == "MiB" else MiB
                rows += 1
                w_ok += got_w == want["model"]
                kv_ok += got_kv == want["context"]
                w_err = max(w_err, abs(got_w - want["model"]) / scale)
                kv_err = max(kv_err, abs(got_kv - want["context"]) / scale)
                if args.verbose and (got_w != want["model"] or got_kv != want["context"]):
                    c = entry["config"]
                    label = " ".join(f"{k}={v}" for k, v in c.items())
                    print(f"  {doc['config']} {label} {name}: weights {got_w} vs {want['model']}"
                          f", KV+state {got_kv} vs {want['context']} ({unit})")  # fmt: skip
        counts = f"{w_ok:>7}/{rows:<6} {kv_ok:>8}/{rows:<6}"
        print(f"{doc['config']:<22} {doc['arch']:<11} {len(doc['cases']):>5} {counts} "
              f"{w_err:>13.2f} {kv_err:>14.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
