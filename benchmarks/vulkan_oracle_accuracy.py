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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "vulkan-oracle.json.gz"

sys.path.insert(0, str(ROOT / "tests"))

from vulkan_oracle import MiB, load, rows  # noqa: E402

ALIGNMENTS = (None, 4, 8, 16, 32, 64, 128, 256)  # None: the Vulkan backend's assumed 64


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", type=Path, default=FIXTURE)
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument(
        "--max-tensor-mib",
        type=int,
        default=128,
        help="the driver's storage-buffer range: weights above it stay on the host "
        "(lavapipe: 128; 0: quantpick as it is)",
    )
    args = ap.parse_args()
    if not args.fixture.exists():
        print(
            f"no fixture at {args.fixture}: build the Vulkan tools with "
            "scripts/build-llamacpp-vulkan.sh, record with scripts/record_vulkan_oracle.py"
        )
        return 0
    oracle = load(args.fixture)
    print(f"llama.cpp: {oracle['llama_cpp']}; driver: {oracle['driver']}")
    best: tuple[int, int | None] = (-1, None)
    for alignment in ALIGNMENTS:
        limit = args.max_tensor_mib * MiB or None
        got = rows(oracle, alignment, limit)
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
    dev = [
        r for r in rows(oracle, best[1], args.max_tensor_mib * MiB or None) if r.device != "Host"
    ]
    for label, keep in (
        ("every layer, one device", lambda c: "visible=0 " in c and "ngl=all" in c),
        ("-ngl partial offload", lambda c: "ngl=all" not in c),
        ("every layer, two devices (-ts 3,1)", lambda c: "visible=0,0" in c),
    ):
        part = [r for r in dev if keep(r.case)]
        worst = max(abs(r.compute[0] / r.compute[1] - 1) for r in part)
        # under by more than the bound: the side that can run out of memory
        under = sum(not r.compute_within and r.compute[0] < r.compute[1] for r in part)
        print(f"  {label}: compute within {sum(r.compute_within for r in part)}/{len(part)}, "
              f"worst {worst:.0%}, {under} under by more than the bound")  # fmt: skip
    if args.verbose:
        for r in rows(oracle, best[1], args.max_tensor_mib * MiB or None):
            if not r.exact or not r.compute_within:
                dw, dk = r.weights[0] - r.weights[1], r.context[0] - r.context[1]
                dc = (r.compute[0] - r.compute[1]) / MiB
                print(f"  {r.config:<20} {r.device:<8} {r.case}: dW {dw:+} B, dKV {dk:+} B, "
                      f"dC {dc:+.1f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
