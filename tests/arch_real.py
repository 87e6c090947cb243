"""The recorded llama.cpp projections of full-size real configs (tests/data/arch-real/*.json,
written by scripts/record_arch_real.py) beside quantpick's estimate: shared by
tests/arch/test_conformance.py and benchmarks/arch_real_accuracy.py.

The reference is llama.cpp's exact bytes (llama-memory-bytes / oracle-mem: bytes per buffer type;
the host is the CPU buffers plus CPU_REPACK) where recorded, else llama-fit-params' MiB floored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance_model import rpc_machine

from quantpick.model.gguf import header_from_json, layout_from_header
from quantpick.model.layout import ModelLayout
from quantpick.plan.memory import RunConfig, estimate

DATA = Path(__file__).resolve().parent / "data" / "arch-real"
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
            acc = out.setdefault(dev, {"model": 0, "context": 0, "compute": 0})
            acc["model"] += buft["model"]
            acc["context"] += buft["context"]
            acc["compute"] += buft.get("compute", 0)
        return "bytes", out
    out = {}
    for row in entry["mib"]:
        if row["kind"] in ("device", "host"):
            out[row["name"]] = {
                "model": row["model"],
                "context": row["context"],
                "compute": row["compute"],
            }
    return "MiB", out


@dataclass(frozen=True)
class Row:
    config: str
    case: str
    device: str
    unit: str
    weights: tuple[int, int]  # (quantpick, llama.cpp)
    context: tuple[int, int]
    # compute buffers (quantpick's estimate, llama.cpp's reservation): not part of `exact`, the
    # graph's scheduler sizes them; the benchmark reports how far the estimate is
    compute: tuple[int, int] = (0, 0)

    @property
    def exact(self) -> bool:
        return self.weights[0] == self.weights[1] and self.context[0] == self.context[1]


def load(path: Path) -> tuple[dict[str, Any], ModelLayout]:
    doc = json.loads(path.read_text())
    header = header_from_json(doc["header"])
    return doc, layout_from_header(header, basis=path.name, file_bytes=doc["file_bytes"])


def rows(path: Path) -> list[Row]:
    doc, layout = load(path)
    out = []
    for entry in doc["cases"]:
        if entry["exit_code"] != 0:
            continue
        config, n_gpu = run_config(entry["config"])
        est = estimate(layout, rpc_machine(n_gpu), config)
        unit, ref = reference(entry)
        names = [f"RPC{i}" for i in range(n_gpu)] + ["Host"]
        label = " ".join(f"{k}={v}" for k, v in entry["config"].items())
        for dev, name in zip(est.devices, names, strict=True):
            want = ref.get(name, {"model": 0, "context": 0, "compute": 0})
            got_w, got_kv = dev.weights_bytes, dev.kv_bytes + dev.recurrent_bytes
            got_c = dev.compute_bytes
            if unit == "MiB":
                got_w, got_kv, got_c = got_w // MiB, got_kv // MiB, got_c // MiB
            out.append(Row(doc["config"], label, name, unit, (got_w, want["model"]),
                           (got_kv, want["context"]), (got_c, want["compute"])))  # fmt: skip
    return out
