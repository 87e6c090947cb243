"""llama.cpp's projection on a real Vulkan backend (Mesa's lavapipe), recorded into
tests/data/vulkan-oracle.json.gz by scripts/record_vulkan_oracle.py, beside quantpick's estimate
for Vulkan devices: shared by tests/test_vulkan_oracle.py and benchmarks/vulkan_oracle_accuracy.py.

The reference is llama-memory-bytes' bytes per device (the grouping of common/fit.cpp: host
buffer types -> "Host"); CPU_REPACK is left out of both sides, as llama-fit-params does.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.model.gguf import header_from_json, layout_from_header
from quantpick.model.layout import ModelLayout
from quantpick.plan.memory import RunConfig, estimate

FIXTURE = Path(__file__).resolve().parent / "data" / "vulkan-oracle.json.gz"
GiB = 1024**3
MiB = 1024**2
# #32's bound for a compute buffer: within max(5%, 16 MiB)
COMPUTE_REL, COMPUTE_ABS = 0.05, 16 * MiB


def load(path: Path = FIXTURE) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes()))


def vulkan_machine(n: int, alignment: int | None, max_tensor_bytes: int | None = None) -> Machine:
    """`n` Vulkan devices on the one software GPU (GGML_VK_VISIBLE_DEVICES=0 or 0,0), large
    enough that nothing is fitted (the recording used -fit off)."""
    gpus = tuple(
        Gpu(
            index=i,
            name="llvmpipe (lavapipe)",
            total_bytes=64 * GiB,
            free_bytes=64 * GiB,
            backend="Vulkan",
            buffer_alignment=alignment,
            max_tensor_bytes=max_tensor_bytes,
        )
        for i in range(n)
    )
    return Machine(
        gpus=gpus, host=Host(ram_total_bytes=256 * GiB, ram_available_bytes=256 * GiB, cpu_cores=2)
    )


def run_config(case: dict[str, Any]) -> tuple[RunConfig, int]:
    ngl = case["ngl"]
    config = RunConfig(
        ctx_size=case["ctx"],
        n_parallel=case["np"],
        cache_type_k=case["ctk"],
        cache_type_v=case["ctv"],
        flash_attn=case["fa"],
        n_gpu_layers=None if ngl == "all" else int(ngl),
        tensor_split=tuple(float(x) for x in case["ts"].split(",")) if "ts" in case else None,
        logits_rows="batch",  # llama-fit-params reserves n_ubatch logits rows
    )
    return config, len(case["visible"].split(","))


@dataclass(frozen=True)
class Row:
    config: str
    case: str
    device: str
    weights: tuple[int, int]  # (quantpick, llama.cpp), bytes
    context: tuple[int, int]  # KV + recurrent state
    compute: tuple[int, int]

    @property
    def exact(self) -> bool:
        return self.weights[0] == self.weights[1] and self.context[0] == self.context[1]

    @property
    def compute_within(self) -> bool:
        got, want = self.compute
        return abs(got - want) <= max(COMPUTE_REL * want, COMPUTE_ABS)


def by_device(buffer_types: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """llama.cpp's bytes per device: a device's own buffers, and every host-side buffer type
    (CPU, CPU_REPACK, Vulkan_Host) as "Host" -- the repacked weights included, which
    llama-fit-params' rows leave out (tests/arch_real.py reads them the same way)."""
    out: dict[str, dict[str, int]] = {}
    for b in buffer_types:
        dev = "Host" if b["is_host"] or b["device"] in ("", "CPU") else b["device"]
        if b["name"] == "CPU_REPACK":
            dev = "Host"
        acc = out.setdefault(dev, {"model": 0, "context": 0, "compute": 0})
        for k in acc:
            acc[k] += b[k]
    return out


def layout_of(doc: dict[str, Any]) -> ModelLayout:
    return layout_from_header(
        header_from_json(doc["header"]), basis=doc["config"], file_bytes=doc["file_bytes"]
    )


def rows(
    oracle: dict[str, Any], alignment: int | None, max_tensor_bytes: int | None = None
) -> list[Row]:
    """Every device row of every case; the Vulkan devices carry the driver's alignment and
    largest tensor (Gpu.buffer_alignment, Gpu.max_tensor_bytes) where given."""
    out = []
    for doc in oracle["configs"]:
        layout = layout_of(doc)
        for entry in doc["cases"]:
            if entry["exit_code"] != 0 or "buffer_types" not in entry["bytes"]:
                continue
            config, n = run_config(entry["config"])
            est = estimate(layout, vulkan_machine(n, alignment, max_tensor_bytes), config)
            want = by_device(entry["bytes"]["buffer_types"])
            label = " ".join(f"{k}={v}" for k, v in entry["config"].items())
            names = [f"Vulkan{i}" for i in range(n)] + ["Host"]
            for dev, name in zip(est.devices, names, strict=True):
                w = want.get(name, {"model": 0, "context": 0, "compute": 0})
                out.append(
                    Row(
                        doc["config"],
                        label,
                        name,
                        (dev.weights_bytes, w["model"]),
                        (dev.kv_bytes + dev.recurrent_bytes, w["context"]),
                        (dev.compute_bytes, w["compute"]),
                    )
                )
    return out


LAVAPIPE_ALIGNMENT = 16  # minStorageBufferOffsetAlignment of Mesa 22.3's lavapipe
LAVAPIPE_MAX_TENSOR = 128 * MiB  # its maxStorageBufferRange: larger weights stay on the host


def partial_rows(oracle: dict[str, Any], name: str) -> list[tuple[dict[str, Any], int]]:
    """(case, llama.cpp's Vulkan0 compute bytes) of a config's -ngl rows with flash attention."""
    config = next(c for c in oracle["configs"] if c["config"] == name)
    return [
        (case["config"], dev["compute"])
        for case in config["cases"]
        if case["config"]["ngl"] != "all" and case["config"]["fa"] == "on"
        for dev in case["bytes"]["devices"]
        if dev["name"] == "Vulkan0"
    ]
