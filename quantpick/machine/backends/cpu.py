"""CPU: the host, always present, never in --list-devices (common/arg.cpp:1147-1151 skips
GGML_BACKEND_DEVICE_TYPE_CPU). Also what an RPC worker serves when it has no GPU.

- Buffers: TENSOR_ALIGNMENT = 32 (ggml/src/ggml-impl.h:44), a tensor's plain bytes.
"""

from __future__ import annotations

from quantpick.machine.backends.base import Backend, BackendKind, Vendor
from quantpick.model.ggml import CPU_BUFFER

BACKEND = Backend(
    kind=BackendKind.CPU,
    label="CPU",
    host_buffer="CPU",
    buffer=CPU_BUFFER,
    visibility_env=None,
    vendors=(Vendor.NONE,),
    always_unified=True,
    memory_source="/proc/meminfo MemAvailable, cgroup limits",
)
