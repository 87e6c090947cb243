#!/usr/bin/env python3
"""quantpick's per-device memory for Vulkan devices against llama.cpp's projection on a real
Vulkan backend: Mesa's software driver (lavapipe) on a CPU-only Linux box, one device
(GGML_VK_VISIBLE_DEVICES=0) and two (0,0, -ts 3,1), recorded by scripts/record_vulkan_oracle.py
into tests/data/vulkan-oracle.json.gz.

    python benchmarks/vulkan_oracle_accuracy.py [--fixture PATH] [-v]

The reference is llama-memory-bytes' bytes per device (common/fit.cpp's grouping: host buffer
types -> Host; CPU_REPACK left out, as llama-fit-params does). A device row is exact when its
weights and its KV+state equal llama.cpp's bytes; compute is within when it is inside #32's
bound, max(5%, 16 MiB). The buffer alignment is the driver's (minStorageBufferOffsetAlignment):
the Vulkan backend assumes 64, so the table is printed for each candidate alignment and the one
that makes the most rows exact is lavapipe's (Gpu.buffer_alignment carries it).

Tensor types lavapipe has no kernel for stay in host buffers (llama.cpp checks
ggml_backend_dev_supports_op when it places weights): rows of such configs show host weights
above quantpick's, and the oracle does not cover those types on a device.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "vulkan-oracle.json.gz"

from quantpick.machine.spec import Gpu, Host, Machine  # noqa: E402
from quantpick.model.gguf import header_from_json, layout_from_header  # noqa: E402
from quantpick.plan.memory import RunConfig, estimate  # noqa: E402

GiB = 1024**3
MiB = 1024**2
COMPUTE_REL, COMPUTE_ABS = 0.05, 16 * MiB  # #32's bound
ALIGNMENTS = (None, 4, 8, 16, 32, 64, 128, 256)  # None: the Vulkan backend's assumed 64


@dataclass(frozen=True)
class Row:
    config: str
    case: str
    device: str
    weights: tuple[int, int]  # (quantpick, llama.cpp) bytes
    context: tuple[int, int]  # KV + recurrent state
    compute: tuple[int, int]

    @property
    def exact(self) -> bool:
        return self.weights[0] == self.weights[1] and self.context[0] == self.context[1]

    @property
    def compute_within(self) -> bool:
        got, want = self.compute
        return abs(got - want) <= max(COMPUTE_REL * want, COMPUTE_ABS)


def vulkan_machine(n: int, alignment: int | None) -> Machine:
    gpus = tuple(
        Gpu(
            index=i,
            name="llvmpipe (lavapipe)",
            total_bytes=64 * GiB,
            free_bytes=64 * GiB,
            backend="Vulkan",
            buffer_alignment=alignment,
        )  # fmt: skip
        for i in range(n)
    )
    host = Host(ram_total_bytes=256 * GiB, ram_available_bytes=256 * GiB, cpu_cores=2)
    return Machine(gpus=gpus, host=host)


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


def rows(oracle: dict[str, Any], alignment: int | None) -> list[Row]:
    out = []
    for doc in oracle["configs"]:
        header = header_from_json(doc["header"])
        layout = layout_from_header(header, basis=doc["config"], file_bytes=doc["file_bytes"])
        for entry in doc["cases"]:
            ref = entry["bytes"].get("devices")
            if entry["exit_code"] != 0 or not ref:
                continue
            config, n = run_config(entry["config"])
            est = estimate(layout, vulkan_machine(n, alignment), config)
            want = {d["name"]: d for d in ref}
            label = " ".join(f"{k}={v}" for k, v in entry["config"].items())
            names = [f"Vulkan{i}" for i in range(n)] + ["Host"]
            for dev, name in zip(est.devices, names, strict=True):
                w = want.get(name, {"model": 0, "context": 0, "compute": 0})
                out.append(Row(doc["config"], label, name, (dev.weights_bytes, w["model"]),
                               (dev.kv_bytes + dev.recurrent_bytes, w["context"]),
                               (dev.compute_bytes, w["compute"])))  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", type=Path, default=FIXTURE)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if not args.fixture.exists():
        print(
            f"no fixture at {args.fixture}: build the Vulkan tools with "
            "scripts/build-llamacpp-vulkan.sh, record with scripts/record_vulkan_oracle.py"
        )
        return 0
    oracle = json.loads(gzip.decompress(args.fixture.read_bytes()))
    print(f"llama.cpp: {oracle['llama_cpp']}; driver: {oracle['driver']}")
    best: tuple[int, int | None] = (-1, None)
    for alignment in ALIGNMENTS:
        got = rows(oracle, alignment)
        dev = [r for r in got if r.device != "Host"]
        exact = sum(r.exact for r in dev)
        within = sum(r.compute_within for r in dev)
        shown = alignment or "64 (assumed)"
        host_exact = sum(r.exact for r in got if r.device == "Host")
        print(
            f"alignment {shown}: {len(dev)} device rows, weights+KV/state exact {exact}, "
            f"compute within max(5%, 16 MiB) {within}; host rows exact "
            f"{host_exact}/{len(got) - len(dev)}"
        )
        best = max(best, (exact, alignment), key=lambda b: b[0])
    if args.verbose:
        for r in rows(oracle, best[1]):
            if not r.exact or not r.compute_within:
                dw, dk = r.weights[0] - r.weights[1], r.context[0] - r.context[1]
                dc = (r.compute[0] - r.compute[1]) / MiB
                print(f"  {r.config:<20} {r.device:<8} {r.case}: dW {dw:+} B, dKV {dk:+} B, "
                      f"dC {dc:+.1f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
