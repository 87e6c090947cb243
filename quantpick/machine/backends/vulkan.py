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
    VERIFY_EFFICIENCY_AMD,
    Backend,
    BackendKind,
    ComputeTraits,
    Vendor,
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
    # 318/384 device rows within max(5%, 16 MiB), median error 0%. Every layer offloaded, one or
    # two devices: 264/288 within, the worst 27% (gemma-4-e2b -fa off on the second device);
    # -ngl partial offload, where the device runs the host layers' matmuls one weight per split:
    # 54/96 within, the worst 43% (the allocator's best-fit placement of those copies is not
    # modelled: docs/compute.md)
    expected_error=0.25,
    error_basis="llama.cpp b11312 on lavapipe: 264/288 device rows within max(5%, 16 MiB)",
    offload_expected_error=0.45,
    offload_error_basis="llama.cpp b11312 on lavapipe, -ngl partial offload: 54/96 device rows "
    "within max(5%, 16 MiB), worst 43%",
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
    compute=VULKAN_COMPUTE,
)
