"""SYCL: Intel GPUs through ggml-sycl (b11312, commit 0c1e570).

- Device names SYCL<i> (GGML_SYCL_NAME "SYCL", ggml/include/ggml-sycl.h:12; ggml-sycl.cpp:7277).
- Buffers: 128-byte aligned (SYCL_BUFFER_ALIGNMENT, ggml/src/ggml-sycl/common.hpp:253); quantized
  rows padded to MATRIX_ROW_PADDING = 512 as CUDA does (get_alloc_size, ggml-sycl.cpp:1049-1063;
  presets.hpp:20). Largest buffer: the device's max_mem_alloc_size (:1030-1047).
- Visibility: ONEAPI_DEVICE_SELECTOR=level_zero:<i>,... (oneAPI's runtime; dpct/helper.hpp:915).
- Memory: free equals total unless ZES_ENABLE_SYSMAN=1 ("ext_intel_free_memory is not supported").
"""

from __future__ import annotations

from quantpick.machine.backends.base import Backend, BackendKind, ComputeTraits, Vendor
from quantpick.model.ggml import BufferRule


class _SyclBackend(Backend):
    def visibility(self, indices: tuple[int, ...]) -> dict[str, str]:
        return {"ONEAPI_DEVICE_SELECTOR": ",".join(f"level_zero:{i}" for i in indices)}


BACKEND = _SyclBackend(
    kind=BackendKind.SYCL,
    label="SYCL",
    buffer=BufferRule("SYCL", 128, 512),
    visibility_env="ONEAPI_DEVICE_SELECTOR",
    vendors=(Vendor.INTEL,),
    memory_source="sysfs (xe/i915 lmem), xpu-smi; llama.cpp: SYCL global_mem_size",
    cmake_option="-DGGML_SYCL=ON",
    image_suffix="intel",
    container_devices=("/dev/dri",),
    # offload_op takes a batch of >= 32 rows (ggml-sycl.cpp:6863-6866); the rest is the
    # CUDA-fitted GPU rule, not checked against this backend's own allocations
    compute=ComputeTraits(
        offload_min_batch=32,
        fa_kv_convert=True,
        source="ggml-sycl.cpp:6863-6866; otherwise unchecked",
    ),
)
