"""ROCm/HIP: AMD GPUs through ggml-cuda built for HIP (b11312, commit 0c1e570).

- Device names ROCm<i> (GGML_CUDA_NAME "ROCm" under GGML_USE_HIP, ggml/include/ggml-cuda.h:11).
- Buffers: the CUDA backend's code, so the CUDA rule: 128-byte alignment and quantized rows padded
  to 512 (ggml/src/ggml-cuda/ggml-cuda.cu:897-920); no maximum size.
- Visibility: HIP_VISIBLE_DEVICES selects and renumbers the HIP devices (ROCm's HIP runtime;
  kyuz0's R9700 toolbox runs use HIP_VISIBLE_DEVICES=0,1).
- Memory: hipMemGetInfo; on an APU (Strix Halo) the HIP build reads free from the host's
  available memory (ggml_backend_cuda_get_available_uma_memory), which can exceed total.
"""

from __future__ import annotations

from quantpick.machine.backends.base import (
    VERIFY_EFFICIENCY_AMD,
    Backend,
    BackendKind,
    Vendor,
)
from quantpick.machine.backends.cuda import CUDA_COMPUTE
from quantpick.model.ggml import BufferRule

BACKEND = Backend(
    kind=BackendKind.ROCM,
    label="ROCm",
    buffer=BufferRule("ROCm", 128, 512),
    visibility_env="HIP_VISIBLE_DEVICES",
    vendors=(Vendor.AMD,),
    memory_source="sysfs mem_info_vram_total/used (mem_info_gtt_* on APUs), amd-smi/rocm-smi; "
    "llama.cpp: hipMemGetInfo",
    cmake_option="-DGGML_HIP=ON",
    image_suffix="rocm",
    # ROCm needs /dev/kfd and /dev/dri (ROCm docs, "Running ROCm Docker containers").
    container_devices=("/dev/kfd", "/dev/dri"),
    # Decode: benchmarks/backend_speed.py fits 0.99 of the bandwidth model on 25 published runs
    # (kyuz0's amd-strix-halo-toolboxes benchmark/results, rocm-7.2.3 toolbox, llama.cpp
    # b9187/b9193, May 2026: gpt-oss-20b/120b, Qwen3.6-35B-A3B UD-Q4/Q8_K_XL and BF16,
    # Qwen3.6-27B UD-Q8_K_XL, GLM-4.7-Flash UD-Q8_K_XL/BF16 at depth 0/32K/64K on a Radeon
    # 8060S; kyuz0's R9700 Qwen3.6-35B-A3B run). Held out by model: decode median error 15%,
    # worst 1.33x; held out by source (Strix Halo from the R9700 run and back): 11%, worst
    # 1.41x. Prefill is not fitted: the fit on all rows is 0.44 of the catalogue's FP16 figure,
    # but held out it errs 58% median (worst 3.8x), no better than the CUDA-calibrated 1.00
    # (66%), so none is carried.
    decode_efficiency=0.99,
    prefill_efficiency=1.00,
    efficiency_source="decode fitted: 25 published ROCm runs (Strix Halo, R9700; decode 15% "
    "median held out by model, worst 1.3x; 11% / 1.4x held out by source); prefill not fitted "
    "(held out 58%, worst 3.8x)",
    verify_efficiency=VERIFY_EFFICIENCY_AMD,
    # the CUDA backend's code built for HIP: the same scheduler callbacks and kernels
    compute=CUDA_COMPUTE,
)
