"""CUDA: NVIDIA GPUs through ggml-cuda (b11312, commit 0c1e570).

- Device names CUDA<i> (GGML_CUDA_NAME "CUDA", ggml/include/ggml-cuda.h:17), i the CUDA runtime's
  index: fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, which makes it NVML's (PCI) order.
- Buffers: 128-byte aligned (ggml_backend_cuda_buffer_type_get_alignment,
  ggml/src/ggml-cuda/ggml-cuda.cu:897-901); a quantized tensor whose rows are not a multiple of
  MATRIX_ROW_PADDING = 512 gets that much more of one row (get_alloc_size, :903-920,
  common.cuh:186); no maximum size (get_max_size NULL = SIZE_MAX, :926).
- Memory: cudaMemGetInfo after the context exists; on an integrated GPU (GB10, Jetson) free is
  the host's MemAvailable (ggml_backend_cuda_get_available_uma_memory).
"""

from __future__ import annotations

from quantpick.machine.backends.base import Backend, BackendKind, ComputeTraits, Vendor
from quantpick.model.ggml import BufferRule

CUDA_BUFFER = BufferRule("CUDA", 128, 512)

# The CUDA backend's scheduler callbacks: offload_op takes an op whose batch (get_op_batch_size:
# a matmul's ne[1], MUL_MAT_ID's ne[2]) is >= op_offload_min_batch_size (ggml-cuda.cu:5636-5655,
# default 32 at :5825); supports_op has no size limit; flash attention over a quantized K/V
# converts it to f16 in the graph's allocation (ggml-cuda.cu:903-907, ggml-cuda/fattn.cu:722-756).
# Checked on public logs (tests/data/cuda-logs.json, benchmarks/cuda_logs_accuracy.py).
CUDA_COMPUTE = ComputeTraits(
    offload_min_batch=32,
    ops_capped=False,
    fa_kv_convert=True,
    source="ggml-cuda.cu:5636-5655 offload_op, :5825 min batch; fattn.cu:722-756",
)

BACKEND = Backend(
    kind=BackendKind.CUDA,
    label="CUDA",
    buffer=CUDA_BUFFER,
    visibility_env="CUDA_VISIBLE_DEVICES",
    # CUDA's default order is fastest-first; the plan numbers GPUs as NVML does (PCI bus order).
    order_env=(("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),),
    vendors=(Vendor.NVIDIA,),
    memory_source="NVML (nvmlDeviceGetMemoryInfo); llama.cpp: cudaMemGetInfo",
    cmake_option="-DGGML_CUDA=ON",
    image_suffix="cuda",
    container_gpu_driver="nvidia",
    container_runtime="the NVIDIA Container Toolkit",
    compute=CUDA_COMPUTE,
)
