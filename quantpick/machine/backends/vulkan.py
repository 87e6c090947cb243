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
    Vendor,
)
from quantpick.model.ggml import BufferRule

GiB = 1024**3

BACKEND = Backend(
    kind=BackendKind.VULKAN,
    label="Vulkan",
    device_prefix="Vulkan",
    host_buffer="Vulkan_Host",
    buffer=BufferRule("Vulkan", 64, 0),
    visibility_env="GGML_VK_VISIBLE_DEVICES",
    order_env=(),
    vendors=(Vendor.NVIDIA, Vendor.AMD, Vendor.INTEL, Vendor.APPLE),
    always_unified=False,
    memory_source="llama-server --list-devices (Vulkan heap size and budget)",
    max_alloc_bytes=2 * GiB,
    max_alloc_source="maxMemoryAllocationSize: 2 GiB on AMDVLK and AMD's driver, 4 GiB on RADV "
    "(llama.cpp #15054, #14698; AMDVLK #413); the smallest is assumed",
    cmake_option="-DGGML_VULKAN=ON",
    image_suffix="vulkan",
    container_devices=("/dev/dri",),
    verify_efficiency=VERIFY_EFFICIENCY_AMD,
)
