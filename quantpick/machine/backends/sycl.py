"""SYCL: Intel GPUs through ggml-sycl (b11312, commit 0c1e570).

- Device names SYCL<i> (GGML_SYCL_NAME "SYCL", ggml/include/ggml-sycl.h:12; ggml-sycl.cpp:7277).
- Buffers: 128-byte aligned (SYCL_BUFFER_ALIGNMENT, ggml/src/ggml-sycl/common.hpp:253); quantized
  rows padded to MATRIX_ROW_PADDING = 512 as CUDA does (get_alloc_size, ggml-sycl.cpp:1049-1063;
  presets.hpp:20). Largest buffer: the device's max_mem_alloc_size (:1030-1047).
- Visibility: ONEAPI_DEVICE_SELECTOR=level_zero:<i>,... (oneAPI's runtime; dpct/helper.hpp:915).
- Memory: free equals total unless ZES_ENABLE_SYSMAN=1 ("ext_intel_free_memory is not supported").
"""

from __future__ import annotations

from quantpick.machine.backends.base import (
    HALF_TYPES,
    Backend,
    BackendKind,
    ComputeTraits,
    KernelPath,
    Vendor,
)
from quantpick.model.ggml import BufferRule


class _SyclBackend(Backend):
    def visibility(self, indices: tuple[int, ...]) -> dict[str, str]:
        return {"ONEAPI_DEVICE_SELECTOR": ",".join(f"level_zero:{i}" for i in indices)}


# Decode on SYCL, fitted by benchmarks/backend_speed.py to 11 published runs of two sources on
# the Arc Pro B70 (kyuz0/intel-b70-ai-toolboxes, llama-bench, b9039, rows 2203-2216;
# steveseguin/b70-optimization-lab, llama-server, b9763, rows 2223-2225): in sample median 3%,
# worst 2.05x (GLM-4.7-Flash, MLA, which that source finds "much slower" on SYCL than Qwen3's
# 30B-A3B; without the paths 66%, worst 6.4x); held out by model 8%, worst 1.8x; held out by
# source 24%, worst 6.2x: the F16/BF16 path has no BF16 model in the second source, so held out
# from the first Ministral-3-8B BF16 is predicted without it (6.2x at depth 0 and 16K).
SYCL_DECODE_EVIDENCE = (
    "fitted: 11 Arc Pro B70 runs of two sources (decode 3% median in sample, worst 2.05x; 8% / "
    "1.8x held out by model; 24% / 6.2x held out by source: BF16 in one source only)"
)
SYCL_DECODE_PATHS = (
    # quantized weights: the reordered MMVQ/DMMV kernels (ggml_sycl_supports_reorder_mmvq /
    # _dmmv, ggml-sycl.cpp:4060-4090 at b11312) and, for types they do not reorder (MXFP4),
    # plain MMVQ (mmvq.cpp:946-999): 0.63 of the bus, fitted on gpt-oss-20b, Qwen3.6-27B,
    # Qwen3.6-35B-A3B (kyuz0), Qwen3-30B-A3B, Mistral-Small-3.2-24B and GLM-4.7-Flash (steveseguin)
    KernelPath(
        Vendor.INTEL,
        frozenset(),
        0.63,
        source="ggml-sycl.cpp:4060-4090; mmvq.cpp:946-999",
        basis="9 Arc Pro B70 runs, 6 models, 2 sources (kyuz0/intel-b70-ai-toolboxes b9039; "
        "steveseguin/b70-optimization-lab b9763)",
    ),
    # F16/BF16 weights: 0.14, fitted on Ministral-3-8B BF16 and gpt-oss-20b's F16 attention
    # (4 rows). At b9039 a BF16 mat-vec went through oneDNN's GEMM (the "Fast path for bf16
    # src0", ggml-sycl.cpp:2959-2975); b11312 also has a BF16 DMMV kernel (dmmv.cpp:240), so
    # this figure may understate b11312's BF16 decode: no run of it has been published.
    KernelPath(
        Vendor.INTEL,
        HALF_TYPES,
        0.14,
        source="ggml-sycl.cpp:2959-2975 (oneDNN BF16 GEMM); dmmv.cpp:240 (b11312's BF16 DMMV)",
        basis="4 Arc Pro B70 runs, 2 models (kyuz0/intel-b70-ai-toolboxes, b9039)",
    ),
)

BACKEND = _SyclBackend(
    kind=BackendKind.SYCL,
    label="SYCL",
    buffer=BufferRule("SYCL", 128, 512),
    visibility_env="ONEAPI_DEVICE_SELECTOR",
    vendors=(Vendor.INTEL,),
    memory_source="sysfs (xe/i915 lmem), xpu-smi; llama.cpp: SYCL global_mem_size",
    cmake_option="-DGGML_SYCL=ON",
    image_suffix="intel",
    efficiency_source=SYCL_DECODE_EVIDENCE,
    decode_paths=SYCL_DECODE_PATHS,
    container_devices=("/dev/dri",),
    # offload_op takes a batch of >= 32 rows (ggml-sycl.cpp:6863-6866); the rest is the
    # CUDA-fitted GPU rule, not checked against this backend's own allocations
    compute=ComputeTraits(
        offload_min_batch=32,
        fa_kv_convert=True,
        source="ggml-sycl.cpp:6863-6866; otherwise unchecked",
    ),
)
