"""llama.cpp's device list for a model (the local GPUs in order, each RPC worker's devices) and
what differs per device: its buffer rule, its compute backend, where a -ot buffer type points,
the single-allocation limits. Pure."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from quantpick.errors import UsageError
from quantpick.machine.backends import BackendKind, backend_of, host_buffer_names
from quantpick.machine.spec import Gpu, Machine
from quantpick.model.ggml import (
    BufferRule,
)
from quantpick.model.layout import ModelLayout
from quantpick.plan.compute import (
    ComputeBackend,
)
from quantpick.plan.memory_types import RunConfig

# ----------------------------------------------------------------------------------------------
# The device list (src/llama.cpp: llama_prepare_model_devices; ggml-rpc.cpp: ggml_backend_rpc_*).


@dataclass(frozen=True)
class LlamaDevice:
    """One device in llama.cpp's list for the model: a local GPU or a device of an RPC worker."""

    name: str  # llama.cpp's device name: "CUDA1", "RPC0"
    gpu: Gpu  # the card; for an RPC device, `index` is its position on the worker
    endpoint: str | None = None  # the RPC worker's "host:port"
    # The device's free memory was read after its runtime (CUDA context, cuBLAS) was created: a
    # probed worker creates its backends before it listens (ggml_backend_rpc_start_server), so
    # llama.cpp's accounting needs no context on top of what the worker reports.
    context_in_free: bool = False

    @property
    def is_rpc(self) -> bool:
        return self.endpoint is not None


def rpc_devices(machine: Machine, endpoints: tuple[str, ...]) -> tuple[LlamaDevice, ...]:
    """The devices llama-server creates for `--rpc` = `endpoints`, named as it names them.

    ggml_backend_rpc_add_server (ggml/src/ggml-rpc/ggml-rpc.cpp:2338-2372 at b11312) asks each
    endpoint for its device count and names the devices "RPC" + a counter shared by all
    endpoints, in --rpc order (common/arg.cpp add_rpc_devices), each worker's devices in its
    own order: two one-device workers are RPC0 and RPC1. Their buffer types are
    "RPC<i>[host:port]" with i the worker-local index (ggml_backend_rpc_buffer_type, :1092).
    """
    if len(set(endpoints)) != len(endpoints):
        raise UsageError("--rpc names a worker twice")
    workers = {w.endpoint: w for w in machine.rpc_workers}
    out: list[LlamaDevice] = []
    for endpoint in endpoints:
        worker = workers.get(endpoint)
        if worker is None:
            known = ", ".join(workers) or "none"
            raise UsageError(f"--rpc {endpoint}: not a worker of this machine (known: {known})")
        for gpu in worker.devices:
            out.append(LlamaDevice(f"RPC{len(out)}", gpu, endpoint, worker.probed))
    return tuple(out)


def llama_devices(machine: Machine, config: RunConfig) -> tuple[LlamaDevice, ...]:
    """The devices llama.cpp places the model on, in its order.

    Default (src/llama.cpp: llama_prepare_model_devices): RPC devices first ("add RPC servers
    at the front of the list to minimize network transfers"), then the local GPUs; the CPU is
    never in the list. With --device: exactly the named devices, in the given order (names
    match case-insensitively: ggml_backend_dev_by_name).
    """
    remote = rpc_devices(machine, config.rpc_servers)
    local = [
        LlamaDevice(backend_of(g.backend).device_name(g.index), g) for g in machine.usable_gpus
    ]
    local_names = {d.gpu.index: d.name for d in local}
    if config.devices is None:
        return (*remote, *local)
    usable = {g.index for g in machine.usable_gpus}
    by_name = {d.name.upper(): d for d in (*remote, *local)}
    chosen: list[LlamaDevice] = []
    for item in config.devices:
        if isinstance(item, int) and item not in usable:
            raise UsageError(f"--device: no usable GPU with index {item}")
        name = local_names[item].upper() if isinstance(item, int) else item.strip().upper()
        device = by_name.get(name)
        if device is None:
            known = ", ".join(d.name for d in (*remote, *local)) or "none"
            raise UsageError(f"--device {item}: not a device here (devices: {known})")
        if device in chosen:
            raise UsageError(f"--device names {device.name} twice")
        chosen.append(device)
    return tuple(chosen)


RPC_BUFFER_TYPE = re.compile(r"RPC(\d+)\[(.+)\]")


def buffer_device(buft: str, devices: tuple[LlamaDevice, ...]) -> int | None:
    """-ot buffer type -> device position (None = host): CPU or a backend's host buffer, a local
    device's name (CUDA0, ROCm1, MTL0, ...), or an RPC device's buffer type "RPC<i>[host:port]"
    (i: its index on that worker; ggml-rpc.cpp:1092)."""
    b = buft.strip()
    if b.upper() in host_buffer_names():
        return None
    for pos, d in enumerate(devices):
        if d.is_rpc:
            if b == f"RPC{d.gpu.index}[{d.endpoint}]":
                return pos
        elif b == d.name:
            return pos
    names = [f"RPC{d.gpu.index}[{d.endpoint}]" if d.is_rpc else d.name for d in devices]
    hint = "use CPU or " + ", ".join(names)
    if RPC_BUFFER_TYPE.fullmatch(b) is None and b.startswith("RPC"):
        hint += " (an RPC device's buffer type carries its worker: RPC0[host:port])"
    raise UsageError(f"-ot buffer type {b!r} is not a device here", hint=hint)


@lru_cache(maxsize=4096)
def backend_kind(device: LlamaDevice) -> ComputeBackend:
    """The compute rule of a device's backend (machine/backends): an RPC worker serving its CPU
    runs the CPU backend's graph; a local GPU, or a worker serving one, a GPU backend's."""
    cpu = backend_of(device.gpu.backend).kind is BackendKind.CPU
    return ComputeBackend.CPU if cpu else ComputeBackend.GPU


def host_weight_tensor(
    layout: ModelLayout,
    slot_device: list[int],
    host_pos: int,
    host_experts: list[int],
    skipped: Callable[[int], bool],
    limit: int | None = None,
    experts_only: bool = False,
) -> int:
    """The largest block weight held in host memory (routed experts under --n-cpu-moe / -ot, or
    whole blocks under -ngl): what op offload copies into the first GPU, one tensor at a time.
    With `limit` (a backend whose supports_op refuses larger tensors: ComputeTraits.ops_capped)
    only the weights up to it are offloaded; `experts_only`: the largest routed-expert tensor."""
    if limit is None:  # the largest eligible weight, read per slot (ModelLayout.slot_matrix_max)
        best = 0
        for slot, (dense, expert) in enumerate(layout.slot_matrix_max):
            if skipped(slot):
                continue
            if host_experts[slot]:
                best = max(best, expert)
            if not experts_only and slot_device[slot] == host_pos:
                best = max(best, dense, expert)
        return best
    for slot, n_bytes, is_expert in layout.block_matrices:  # largest first: the first one wins
        if skipped(slot) or (limit is not None and n_bytes > limit):
            continue
        if experts_only and not (is_expert and host_experts[slot]):
            continue
        if slot_device[slot] == host_pos or (is_expert and host_experts[slot]):
            return n_bytes
    return 0


def device_buffer(device: LlamaDevice) -> BufferRule:
    """How a device's backend sizes tensors (machine/backends: each backend's rule; an RPC
    device: the backend the worker serves, CUDA unless the worker is known to serve another),
    with the device's own alignment where its driver's is known (Gpu.buffer_alignment)."""
    rule = backend_of(device.gpu.backend).buffer
    align = device.gpu.buffer_alignment
    if (
        isinstance(align, int)
        and align > 0
        and align & (align - 1) == 0  # a power of two, as every driver's is
        and align != rule.alignment
    ):
        # its own name: layouts cache their sizes per rule name (ModelLayout.slots_under)
        return BufferRule(f"{rule.name}/{align}", align, rule.row_padding)
    return rule
