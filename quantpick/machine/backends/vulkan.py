"""Vulkan: any vendor's GPU through ggml-vulkan (b11312, commit 0c1e570).

- Device names Vulkan<i> (GGML_VK_NAME "Vulkan", ggml/include/ggml-vulkan.h:10), i counting the
  devices GGML_VK_VISIBLE_DEVICES selects, in its order (ggml-vulkan.cpp:5264-5280); without it,
  every non-CPU device (iGPUs too, which can come first).
- Buffers: aligned to the device's minStorageBufferOffsetAlignment
  (ggml_backend_vk_buffer_type_get_alignment, ggml-vulkan.cpp:13034-13037); a tensor's plain
  bytes (get_alloc_size, :13044-13048). The alignment differs per driver (4 on RADV and AMDVLK,
  16 on NVIDIA's, 64 on Intel ANV: gpuinfo.org reports); 64 is taken, over-counting at most 60 B
  a tensor. Largest buffer: suballocation_block_size = min(1 GiB, maxMemoryAllocationSize)
  (:4210-4218) -- weights are split over several buffers, but a single tensor or compute buffer
  above maxMemoryAllocationSize fails (2 GiB on AMDVLK/AMD's driver, 4 GiB on RADV:
  llama.cpp #15054, #14698, AMDVLK #413).
- Memory: the device-local heap's size and budget (VK_EXT_memory_budget); a free figure above
  total is nonsense some drivers report and is ignored.
"""

from __future__ import annotations

from quantpick.machine.backends.base import (
    HALF_TYPES,
    VERIFY_EFFICIENCY_AMD,
    Backend,
    BackendKind,
    ComputeTraits,
    FixedCost,
    KernelPath,
    Vendor,
    WeightPath,
)
from quantpick.model.ggml import BufferRule

GiB = 1024**3

# The Vulkan backend's scheduler callbacks and kernels, as they shape its compute buffer (checked
# on the lavapipe oracle: tests/data/vulkan-oracle.json.gz, benchmarks/vulkan_oracle_accuracy.py):
# - offload_op: an op whose batch (ggml_vk_get_op_batch_size) is >= op_offload_min_batch_size
#   (ggml-vulkan.cpp:15973-15977; default 32 at :16111);
# - supports_op refuses an op with any source or result larger than max_buffer_size or, without
#   shader64BitIndexing, maxStorageBufferRange (ggml-vulkan.cpp:15307-15328): the scheduler then
#   runs it on the CPU backend (ggml-backend.cpp:888-900, 961-981). A device's largest tensor
#   (Gpu.max_tensor_bytes) is that limit: the logits of a large vocabulary, a no-FA KQ matrix
#   and the output head over it run on the host, and their live set is the host's buffer;
# - flash attention over a quantized K/V dequantizes it into a scratch of the backend's own
#   (prealloc buffers, ggml-vulkan.cpp:8082-8100), not into the graph's compute buffer.
VULKAN_COMPUTE = ComputeTraits(
    offload_min_batch=32,
    ops_capped=True,
    fa_kv_convert=False,
    source="ggml-vulkan.cpp:15307-15328 supports_op, :15973-15977 offload_op, :8082-8100",
    # the lavapipe oracle (tests/data/vulkan-oracle.json.gz, benchmarks/vulkan_oracle_accuracy.py):
    # 373/384 device rows within max(5%, 16 MiB), median error 0%. Every layer offloaded, one or
    # two devices: 280/288 within, the worst 20% (glm-4.5-air -fa off, one device, over);
    # -ngl partial offload: 93/96 within, the worst 19% (docs/compute.md "Not matched"; 84/96
    # and 28%, so max(35%, 16 MiB), before the host layers' replay, plan/host_layers.py)
    expected_error=0.25,
    error_basis="llama.cpp b11312 on lavapipe: 280/288 device rows within max(5%, 16 MiB)",
    offload_expected_error=0.25,
    offload_error_basis="llama.cpp b11312 on lavapipe, -ngl partial offload: 93/96 device rows "
    "within max(5%, 16 MiB), worst 19%",
    # -ngl partial offload: the host layers run on this device but for their cache writes (pass 2
    # of ggml_backend_sched_split_graph spreads an offloaded matmul's backend to the ops around
    # it, ggml-backend.cpp:1125-1160; GGML_SCHED_DEBUG=2 on the lavapipe build: one split per host
    # weight, the norms' included, and one per host layer's cache_k/cache_v views), each weight
    # and K/V view a split input allocated at the start of its split and freed after its one use
    # (:1377-1411, :1514-1531). So they are phases of their own, not a copy on top of the
    # device's layer. Fitted on the oracle's 96 partial-offload rows (54/96 with the copy on
    # top): a layer's live set + 0.75 x the largest copied weight (the copy takes the place of
    # part of the FFN's intermediates); a host layer's K and V + the mask + 9.5 E (the mask is a
    # split input allocated after the first host layer's K and V copies and alive to the last
    # layer, so the next layers' copies land around it: an allocator trace, docs/compute.md);
    # with a gated FFN whose up weight is smaller than its intermediate, 4E + that copy + 3 x
    # the intermediate (the gated product lands on top: the trace; plan/memory.py). 67/96
    # without that term (12 under by more than the bound; 7 with it; the copy on top: 4);
    # 0.625 gives as many rows within, but more under (20); 0.5, 0.875 and 1.0 fewer within.
    # Without flash attention, where the host runs a host layer's attention (its KQ over the
    # cap) and nothing else in it differs (plan/compute.py host_ffn_alone), the traced FFN phase
    # replaces the fitted share: 2E + the up weight's copy + 2 x the intermediate (78 -> 81/96).
    # Where every host layer fits a template (dense attention layers:
    # llama, mistral3, qwen2, qwen3, gemma3; routed experts copied in or run on the host,
    # glm4moe's included; the gated delta-net families qwen3next, qwen35, qwen35moe) none of
    # these is used: the layers' whole op sequence is scheduled and allocated as llama.cpp does
    # (plan/host_layers.py, plan/hybrid_layers.py: the 44 such rows to the byte; 84 -> 93/96,
    # worst 28% -> 19%).
    host_layer_weight_share=0.75,
    host_layer_kv_e=9.5,
    # flash attention narrower than the residual stream (gemma-3-27b, mistral-small-24b): the
    # FFN lands above the attention's Q, K and V (an allocator trace, plan/compute.py
    # DeviceGraph.attn_narrow): gemma-3-27b 168.5 vs 168.52 MiB, mistral-small-24b 233 vs 232.01
    narrow_attn_above=True,
)

# Decode on Vulkan, fitted by benchmarks/backend_speed.py to 40 published runs of seven sources:
# kyuz0's amd-strix-halo-toolboxes, amd-r9700-ai-toolboxes and intel-b70-ai-toolboxes (rows
# 2002-2219 of benchmarks/data/speed-measurements-backends.json; b9039-b9193), llama.cpp #22375
# (Radeon 8060S, b8460/b8933, rows 3006-3007), PR #22461 (Lunar Lake Arc 140V, b8997, row 3005),
# PR #23056 (Panther Lake Arc B390, b9093, rows 3101-3102) and PR #21751 (RX 9070 XT and Radeon
# 8060S, April 2026, rows 3103-3104): 0.97 of the bus on the rows no path below reads. In sample
# the terms leave a median error of 10%, worst 1.80x (without them 27%, worst 4.3x); held out by
# model 29%, worst 3.05x; held out by source 26%, worst 2.84x. Every row beyond 2x held out is
# a BF16-expert row on the Radeon 8060S: the AMD BF16-expert term rests on one source (kyuz0's
# Strix Halo runs, two models), so holding that source (or one of its two models) out leaves it
# unfitted (docs/backends.md).
VULKAN_DECODE_EVIDENCE = (
    "fitted: 40 published Vulkan runs of 7 sources (Strix Halo, R9700, RX 9070 XT, Arc Pro "
    "B70, Arc 140V, Arc B390; decode 10% median in sample, worst 1.80x; 29% / 3.05x held out by "
    "model; 26% / 2.84x held out by source)"
)
VULKAN_DECODE_PATHS = (
    # Intel, quantized weights: ggml_vk_should_use_mmvq (ggml-vulkan.cpp:6543-6620 at b11312)
    # sends an Intel GPU's quantized mat-vec through MMVQ (the activations quantized to Q8_1,
    # integer dot products) on Mesa ANV with k >= 2048 but Q4_0, Q5_1 and IQ4_XS ("From tests on
    # A770 Linux", :6610-6614), on Intel's Windows driver only Q2_K/Q3_K/Q6_K of Xe2 and later
    # (:6592-6603, "see #17628 and #23056"). Its weights stream at the bus's rate: 1.00 (the
    # grid's top), fitted on the B70's gpt-oss-20b, Qwen3.6-27B and Qwen3.6-35B-A3B at depth 0
    # and 16K and the B390's Qwen3.5-9B Q6_K (8 rows); the B70's slow quantized rows are the
    # per-dispatch fixed cost below (with the B70 alone the fit trades the two: 0.42 and x6.00
    # throughput-scaled, which put the B390 row 2.05x slow held out).
    KernelPath(
        Vendor.INTEL,
        frozenset(),
        1.00,
        source="ggml-vulkan.cpp:6543-6620 (ggml_vk_should_use_mmvq), :5567-5590",
        basis="8 Intel runs, 4 models (kyuz0/intel-b70-ai-toolboxes b9039; llama.cpp PR #23056, "
        "Arc B390, b9093)",
    ),
    # Intel, F16/BF16 weights: the plain DMMV shaders (mul_mat_vec_bf16_f32, :2929): 0.86,
    # fitted on Ministral-3-8B BF16 and gpt-oss-20b's F16 attention on the B70 and Gemma-4-E2B
    # BF16 on the Arc 140V (5 rows)
    KernelPath(
        Vendor.INTEL,
        HALF_TYPES,
        0.86,
        source="ggml-vulkan.cpp:2929-2958 (mul_mat_vec_bf16/f16 pipelines)",
        basis="5 Intel runs, 3 models (kyuz0/intel-b70-ai-toolboxes b9039; llama.cpp PR #22461, "
        "Arc 140V, b8997)",
    ),
    # Every GPU, BF16 routed experts: MUL_MAT_ID goes to the mat-vec kernel only for F32, F16
    # and quantized experts (ggml_vk_use_mul_mat_vec_id, ggml-vulkan.cpp:7904-7909; BF16 is not
    # quantized: ggml.c:886-893), so at decode BF16 experts run the matrix kernel
    # (ggml_vk_mul_mat_id_q_f16, :7917-7921) on every Vulkan device: a tile of at least 32
    # columns (:1859) for one token, the activations converted to BF16 first (:7361-7387), and no
    # MUL_MAT_ID+ADD_ID/MUL fusion (the fusions want the mat-vec path, :13591, :13626). Which
    # matrix shader runs depends on the device: without bfloat16 support (the device line's
    # "bf16: 0", which gates coopmat_bf16_support, :4726-4745) the scalar fp32-accumulating
    # matmul_id_bf16_fp32 (:2780, and on a KHR_coopmat device the fallback tiles of
    # :2794-2815); with it, the coopmat BF16 shaders (:2338, :2511). Fitted 0.14 on GLM-4.7-Flash
    # and Qwen3.6-35B-A3B BF16 on the Radeon 8060S under RADV ("bf16: 0", 6 rows; ROCm runs the
    # same files at the bus's speed: machine/backends/rocm.py); dense BF16 on the same machine
    # takes the mat-vec shader and runs at the bus's speed (Ministral-3-14B BF16: 7.83 t/s
    # Vulkan, 8.50 ROCm, same repository). The figure is a "bf16: 0" device's: no published run
    # of a 2026 build measures a "bf16: 1" device, and quantpick does not know a device's
    # bfloat16 support, so it is taken on every GPU. The rows' builds have the matrix path but
    # predate its MUL_MAT_ID row-id hoisting (PR #26686, which b11312 has: a scan of a token's 8
    # ids per workgroup saved), so they are kept (docs/backends.md "Per-vendor decode terms").
    KernelPath(
        None,
        frozenset({"BF16"}),
        0.14,
        WeightPath.EXPERTS,
        source="ggml-vulkan.cpp:7904-7909 (ggml_vk_use_mul_mat_vec_id), :7917-7921, "
        ":2780 / :2794-2815 (matmul_id_bf16_fp32)",
        basis="6 Radeon 8060S runs, 2 models (kyuz0/amd-strix-halo-toolboxes, b9187-b9193)",
    ),
)
# Intel's decode graph costs 7.50x the reference card's fixed time per layer, the same on every
# Intel GPU (not scaled to its throughput): the backend turns off its RMS-norm fusion
# (add_rms_fusion, ggml-vulkan.cpp:4901-4903) and subgroup collectives (:3784, "Do not enable
# collectives on Intel") on Intel, so each layer runs more, smaller dispatches, and a dispatch's
# cost is the driver's and the command processor's, which more Xe cores do not shorten (as
# Metal's host-encoded command buffers: machine/backends/metal.py). The data say so: the Arc
# B390 (60 FP16 TFLOPS) and the Arc Pro B70 (183.5) spend about the same time per layer beyond
# their weights' bytes (Qwen3.5-9B Q6_K on the B390: 67.9 ms a token, 48.5 of them the bus;
# the B70's Qwen3.6-27B: 75.7 ms, 29.8 the bus, over 64 layers against 32). Fitted with the paths
# above on the 11 Intel rows (6 models); throughput-scaled, the same fit left the B390 row 2.05x
# slow held out by source and the B70 rows 2.31x.
VULKAN_DECODE_FIXED = (
    FixedCost(
        Vendor.INTEL,
        7.50,
        source="ggml-vulkan.cpp:4901-4903, :3784",
        basis="11 Intel runs, 6 models (kyuz0/intel-b70-ai-toolboxes b9039; llama.cpp PR #22461 "
        "b8997; PR #23056 b9093)",
        throughput_scaled=False,
    ),
)

BACKEND = Backend(
    kind=BackendKind.VULKAN,
    label="Vulkan",
    buffer=BufferRule("Vulkan", 64, 0),
    visibility_env="GGML_VK_VISIBLE_DEVICES",
    vendors=(Vendor.NVIDIA, Vendor.AMD, Vendor.INTEL, Vendor.APPLE),
    memory_source="llama-server --list-devices (Vulkan heap size and budget)",
    max_alloc_bytes=2 * GiB,
    max_alloc_source="maxMemoryAllocationSize: 2 GiB on AMDVLK and AMD's driver, 4 GiB on RADV "
    "(llama.cpp #15054, #14698; AMDVLK #413); the smallest is assumed",
    cmake_option="-DGGML_VULKAN=ON",
    image_suffix="vulkan",
    container_devices=("/dev/dri",),
    verify_efficiency=VERIFY_EFFICIENCY_AMD,
    decode_efficiency=0.97,
    efficiency_source=VULKAN_DECODE_EVIDENCE,
    decode_paths=VULKAN_DECODE_PATHS,
    decode_fixed=VULKAN_DECODE_FIXED,
    compute=VULKAN_COMPUTE,
)
