"""Metal: Apple Silicon GPUs through ggml-metal (b11312, commit 0c1e570).

- Device names MTL<i> (snprintf "%s%d", "MTL", ggml/src/ggml-metal/ggml-metal-device.m:1302);
  builds of 2025 printed "Metal" (kept for parsing old --list-devices output).
- Buffers: 32-byte aligned (ggml_backend_metal_buffer_type_shared_get_alignment,
  ggml/src/ggml-metal/ggml-metal.cpp:269-273), a tensor's plain bytes for weights and caches
  (get_alloc_size adds only for MUL_MAT_ID/FLASH_ATTN_EXT/CUMSUM/ARGSORT/TOP_K results, i.e.
  compute, :220-254); largest buffer: the device's maxBufferLength (:275-279).
- Memory: total = free = recommendedMaxWorkingSetSize (what macOS lets the GPU wire; sysctl
  iogpu.wired_limit_mb overrides it), minus what this process already allocated.
- Unified: always on Apple Silicon; with mmap the GGUF mapping itself becomes the MTL0_Mapped
  buffer (no second copy).
- No visibility variable: one GPU per machine.
"""

from __future__ import annotations

from quantpick.machine.backends.base import (
    Backend,
    BackendKind,
    ComputeTraits,
    FixedCost,
    Vendor,
)
from quantpick.model.ggml import BufferRule

# Apple's decode graph costs 2.0x the CUDA reference card's per-layer fixed time on every Apple
# GPU, not that time scaled by 142 / the chip's TFLOPS (the CUDA rule, under which a 20-core M4
# Pro paid 4.0x the reference and a 76-core M2 Ultra 1.8x): ggml-metal encodes and dispatches
# each kernel of the graph from the host (command buffers split over threads,
# ggml_metal_graph_compute, ggml-metal-context.m:474-575 at b11312), a cost per dispatch that
# more GPU cores do not shorten. Fitted (benchmarks/backend_speed.py, grid 1.0-16.0 in 0.25
# steps) on the 39 Metal rows of three sources: the M2 Ultra's llama-bench runs (rows
# 1001-1030), an M4 Pro's llama-server runs of 8 models of 0.7-15 GiB (llmfit's community data,
# rows 1101-1108) and an M1 Ultra's llama-bench run of TinyLlama 1.1B (geerlingguy/ai-benchmarks
# issue 48, row 1201); each source predicted from the others: decode median error 10%, worst
# 1.64x (was 7% / 2.72x with one source; the 1B on the M4 Pro was 1.69x slow under the CUDA
# rule); fitted on the M2 Ultra alone 2.00, on the other two 1.50.
METAL_DECODE_FIXED = (
    FixedCost(
        Vendor.APPLE,
        2.0,
        source="ggml-metal-context.m:474-575 (ggml_metal_graph_compute: host-encoded "
        "command buffers)",
        basis="39 runs, 15 models, M2 Ultra, M4 Pro, M1 Ultra (llama.cpp benches/mac-m2-ultra, "
        "AlexsJones/llmfit community apple-m4-pro, geerlingguy/ai-benchmarks#48); held out by "
        "source 10% / 1.64x",
        throughput_scaled=False,
    ),
)

BACKEND = Backend(
    kind=BackendKind.METAL,
    label="Metal",
    device_prefix="MTL",
    buffer=BufferRule("Metal", 32, 0),
    visibility_env=None,
    vendors=(Vendor.APPLE,),
    always_unified=True,
    memory_source="sysctl hw.memsize and iogpu.wired_limit_mb; llama.cpp: "
    "recommendedMaxWorkingSetSize",
    # Fitted by benchmarks/backend_speed.py to the 30 runs of llama.cpp's own
    # benches/mac-m2-ultra/mac-m2-ultra.md (b7948; 6 models, depth 0-32768; rows 1001-1030 of
    # benchmarks/data/speed-measurements-backends.json) and the 9 of the M4 Pro and M1 Ultra
    # (above). Decode: 0.99 of the bandwidth (the CUDA-calibrated bandwidth model as it is,
    # at its bound). Decode attention over the cache:
    # ggml-metal's vector flash-attention kernel, which decode uses (fewer than 20 query rows,
    # ggml-metal-ops.cpp:2949-2956 at b11312), runs one query head per threadgroup
    # (nhptg = 1, :3588; dispatched over (queries, heads, workgroups), :3790), so the query heads
    # of a shared KV head each read and multiply its cells: the depth cost is the heads'
    # arithmetic, 2 x n_head x (K + V head size) FLOPs per layer and cell, at 0.077 of the
    # catalogue's FP16 figure (fitted on the rows with a cache of 1024 cells or more, with the
    # Apple fixed cost above). Head size 576 (MLA's latent) is supported
    # (ggml-metal-device.m:1742), so GLM-4.7-Flash's 20 heads over one latent take this kernel:
    # 5x the FLOPs per cache byte of a GQA layer, the 2.7-3.1x the bytes model
    # missed at 8K-32K. Held out by model (the terms fitted on the other 14 models' rows),
    # decode median error 7%, worst 1.42x (GLM-4.7-Flash at depth 0, its fixed cost); the
    # rate held out from GLM-4.7-Flash is 0.080. Prefill: 1.52 x the catalogue's FP16 (= FP32
    # ALU) figure, median error 33% held out by model, worst 2.9x.
    decode_efficiency=0.99,
    prefill_efficiency=1.52,
    decode_attention_efficiency=0.077,
    decode_fixed=METAL_DECODE_FIXED,
    efficiency_source="fitted: 30 runs of llama.cpp benches/mac-m2-ultra, 8 M4 Pro runs "
    "(llmfit community data), 1 M1 Ultra run: decode 7% median held out by model, worst 1.4x, "
    "10% / 1.6x held out by source; prefill 33%, worst 2.9x held out by model",
    # Speculation on, each decode call (the target's step, drafted or not, and each draft step of a
    # model or an MTP head) costs more: an M3 Max (b9430, llama-server, Qwen2.5-Coder-7B Q4_K_S)
    # decoded 55.33 tok/s without it and 42.83 with an n-gram lookup that drafted no token over the
    # suite (benchmarks/data/spec-measurements.json row 41): 1/42.83 - 1/55.33 s = 5.28 ms per
    # step, less the lookup's own 0.05 (NGRAM_DRAFT_MS). With it, the same run's draft model (row
    # 27, -41%) and PR #22673's M1 Max MTP runs (rows 46-47, another source) come within 1.16x
    # and 1.08x; fitted jointly on the five Metal rows it is 5.55 ms, and 3.85 with the M3 Max's
    # source held out (`python benchmarks/spec_accuracy.py --fit`). The CUDA, Vulkan and CPU runs
    # of the same suite lose at most 0.3 ms per step (rows 35-40), so theirs stays 0.
    spec_step_ms=5.23,
    legacy_prefixes=("Metal",),
    cmake_option="-DGGML_METAL=ON (default on macOS)",
    # offload_op takes a matmul (MUL_MAT, MUL_MAT_ID) of >= 32 rows (ggml-metal.cpp:774-780); the
    # rest is the CUDA-fitted GPU rule, not checked against this backend's own allocations
    compute=ComputeTraits(
        offload_min_batch=32,
        fa_kv_convert=True,
        source="ggml-metal.cpp:774-780; otherwise unchecked",
    ),
)
