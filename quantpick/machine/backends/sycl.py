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


# Decode on SYCL, fitted by benchmarks/backend_speed.py to 13 published decode runs of four
# sources: kyuz0/intel-b70-ai-toolboxes (llama-bench, b9039, rows 2203-2212),
# steveseguin/b70-optimization-lab (llama-server, b9763, rows 2223-2225), llama.cpp PR #21580
# (B70, Qwen2.5-1.5B Q4_K_M / Q8_0 / BF16, rows 3001-3003) and llama.cpp #22413 (Arc Pro B60,
# b9159, row 3004); the decode of kyuz0's two Ministral-3-8B BF16 runs is not compared, their
# build predates the BF16 kernel b11312 runs (SYCL_BF16_DMMV_SINCE). In sample median 10%, worst
# 2.05x (GLM-4.7-Flash, MLA, which steveseguin finds "much slower" on SYCL than Qwen3's
# 30B-A3B; without the paths 53%, worst 3.0x); held out by source 23%, worst 2.00x (issue #31's
# goal, at its limit); held out by model 24%, worst 2.04x (GLM-4.7-Flash: with it out, the F16
# term has gpt-oss-20b alone, short of the two models a term needs).
SYCL_DECODE_EVIDENCE = (
    "fitted: 13 Arc Pro B70/B60 decode runs of four sources (decode 10% median in sample, worst "
    "2.05x; 23% / 2.00x held out by source; 24% / 2.04x held out by model)"
)
SYCL_DECODE_PATHS = (
    # quantized weights: the reordered MMVQ/DMMV kernels (ggml_sycl_supports_reorder_mmvq /
    # _dmmv, ggml-sycl.cpp:4060-4090 at b11312) and, for types they do not reorder (MXFP4),
    # plain MMVQ (mmvq.cpp:946-999): 0.63 of the bus, fitted on gpt-oss-20b, Qwen3.6-27B,
    # Qwen3.6-35B-A3B (kyuz0), Qwen3-30B-A3B, Mistral-Small-3.2-24B and GLM-4.7-Flash (steveseguin),
    # Qwen2.5-1.5B Q4_K_M and Q8_0 (PR #21580) and Qwen3.6-35B-A3B on the B60 (#22413)
    KernelPath(
        Vendor.INTEL,
        frozenset(),
        0.63,
        source="ggml-sycl.cpp:4060-4090; mmvq.cpp:946-999",
        basis="12 Arc Pro B70/B60 runs, 9 models, 4 sources (kyuz0/intel-b70-ai-toolboxes b9039; "
        "steveseguin/b70-optimization-lab b9763; llama.cpp PR #21580; llama.cpp #22413 b9159)",
    ),
    # F16 weights: the DMMV kernel (convert_f16, dmmv.cpp), F16's path since before any run here
    # was published: 0.14, fitted on gpt-oss-20b's F16 attention (kyuz0, 2 rows) and
    # GLM-4.7-Flash's F16 tensors (steveseguin): small tensors, so the term carries these two
    # models' other slowness on SYCL as well (GLM's MLA: "much slower" there, steveseguin)
    KernelPath(
        Vendor.INTEL,
        frozenset({"F16"}),
        0.14,
        source="dmmv.cpp:219 (convert_mul_mat_vec_f16_sycl); ggml-sycl.cpp:4110-4124, :4766-4768",
        basis="3 Arc Pro B70 runs, 2 models (kyuz0/intel-b70-ai-toolboxes b9039; "
        "steveseguin/b70-optimization-lab b9763)",
    ),
    # BF16 weights: the DMMV kernel of PR #21580 (dmmv.cpp:240; SYCL_BF16_DMMV_SINCE below). One
    # model's run of it is published (Qwen2.5-1.5B BF16 on the B70: ~0.58 of the bus), short of
    # the two a fitted term needs: 1.00, none. Until that PR a BF16 mat-vec took oneDNN's GEMM
    # (the "Fast path for bf16 src0", ggml-sycl.cpp:2959-2975 at b9039) at ~0.14, the figure the
    # F16/BF16 term carried before.
    KernelPath(
        Vendor.INTEL,
        frozenset({"BF16"}),
        1.00,
        source="dmmv.cpp:240 (convert_mul_mat_vec_bf16_sycl, PR #21580)",
        basis="runs of 1 model, too few to fit (llama.cpp PR #21580: Qwen2.5-1.5B BF16 on a B70)",
    ),
)

# The BF16 mat-vec b11312 runs: the DMMV kernel of llama.cpp PR #21580 (dmmv.cpp:240; BF16 in
# ggml_sycl_supports_dmmv, ggml-sycl.cpp:4110-4124, taken for a mat-vec at :4766-4768), merged
# 2026-05-22. Before it a BF16 mat-vec went through oneDNN's GEMM at ~14% of the bus (the PR's
# own before/after: Qwen2.5-1.5B BF16 on the B70, tg128 29.7 -> 123.9). Runs of builds up to 9187
# (0253fb21f, 2026-05-16, llama.cpp #23155) predate the merge: their BF16 decode measured a
# kernel b11312 no longer runs.
SYCL_BF16_DMMV_SINCE = 9188

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
