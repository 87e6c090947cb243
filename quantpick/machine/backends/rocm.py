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
    device_prefix="ROCm",
    host_buffer="ROCm_Host",
    buffer=BufferRule("ROCm", 128, 512),
    visibility_env="HIP_VISIBLE_DEVICES",
    order_env=(),
    vendors=(Vendor.AMD,),
    always_unified=False,
    memory_source="sysfs mem_info_vram_total/used (mem_info_gtt_* on APUs), amd-smi/rocm-smi; "
    "llama.cpp: hipMemGetInfo",
    cmake_option="-DGGML_HIP=ON",
    image_suffix="rocm",
    # ROCm needs /dev/kfd and /dev/dri (ROCm docs, "Running ROCm Docker containers").
    container_devices=("/dev/kfd", "/dev/dri"),
    verify_efficiency=VERIFY_EFFICIENCY_AMD,
    # the CUDA backend's code built for HIP: the same scheduler callbacks and kernels
    compute=CUDA_COMPUTE,
)
