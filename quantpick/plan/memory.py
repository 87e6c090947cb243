"""What llama.cpp will allocate on each device for one configuration. Pure: data in, data out.

Every rule mirrors llama.cpp (tree of 2026-10-01, commit 0c1e570); the project's llamacpp-memory
notes cite the functions. Weights, KV cache and recurrent state are deterministic in llama.cpp and
are computed to the byte; compute buffers and the GPU runtime's context are estimates, labelled
as such.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache

from quantpick.arch.base import AttentionKind, LayerView, MemoryClass, ModelView
from quantpick.arch.graph import ArchLive, GraphSizes
from quantpick.arch.registry import graph_trait
from quantpick.errors import UsageError
from quantpick.machine.backends import BackendKind, backend_of, host_buffer_names
from quantpick.machine.spec import Gpu, Machine
from quantpick.model.ggml import (
    CPU_BUFFER,
    GGML_TYPES,
    KV_CACHE_TYPES,
    UNQUANTIZED,
    BufferRule,
    row_size,
)
from quantpick.model.layout import INPUT_SLOT, ModelLayout, TensorInfo
from quantpick.plan.compute import (
    GENERIC,
    GPU_ESTIMATE,
    GRAPH_RULES,
    PIPELINE_COPIES,
    UNCHECKED,
    ComputeAccuracy,
    ComputeBackend,
    DeviceGraph,
    accuracy,
    device_compute,
    gpu_accuracy,
    graph_shape,
    output_buffer,
)

MiB = 1024**2
GiB = 1024**3

# The vision projector's own compute buffer (LlamaFit calibration: ~248 MiB). Estimate.
PROJECTOR_COMPUTE_BYTES = 256 * MiB


@dataclass(frozen=True)
class DraftRun:
    """A draft model run beside the target (`--spec-type draft-simple -md PATH`): what the command
    says of it. Its own memory is plan/draft.py's (a second model and llama_context); the
    target's configuration only grows its output rows to np x (1 + n_max)."""

    path: str  # -md (or -hfd's OWNER/REPO:QUANT where `hub`)
    n_max: int  # --spec-draft-n-max
    # -ngld: None = all layers; 0 = none (the host)
    n_gpu_layers: int | None = None
    # -devd, in its order (None: follows --device; (): none, the host)
    devices: tuple[int | str, ...] | None = None
    hub: bool = False  # -hfd OWNER/REPO:QUANT: llama-server fetches it from Hugging Face


@dataclass(frozen=True)
class RunConfig:
    """One llama-server configuration, in its own flag spellings (comments name the flag)."""

    ctx_size: int = 0  # -c (0 = the model's context_length)
    n_parallel: int = 1  # -np
    kv_unified: bool = False  # -kvu
    n_gpu_layers: int | None = None  # -ngl (None = all slots: -ngl all / auto with full offload)
    tensor_split: tuple[float, ...] | None = None  # -ts (proportions; a plan writes layer counts)
    n_cpu_moe: int = 0  # --n-cpu-moe N: routed experts of blocks 0..N-1 in host memory
    cpu_moe: bool = False  # --cpu-moe: all routed experts in host memory
    override_tensors: tuple[tuple[str, str], ...] = ()  # -ot "regex=BUFT" in order
    cache_type_k: str = "f16"  # -ctk
    cache_type_v: str = "f16"  # -ctv
    flash_attn: str = "on"  # -fa on|off|auto
    ubatch: int = 512  # -ub
    batch: int = 2048  # -b
    kv_offload: bool = True  # -nkvo turns it off
    vision: bool = False  # --mmproj with the manifest's projector
    spec_draft_n: int = 0  # --spec-type draft-mtp --spec-draft-n-max N (0 = no MTP speculation)
    # -ctkd/-ctvd: the draft context's own cache types (default f16; common/speculative.cpp
    # :2478-2479 gives the draft context these, not -ctk/-ctv)
    spec_cache_type_k: str = "f16"
    spec_cache_type_v: str = "f16"
    # --spec-type ngram-mod with --spec-ngram-mod-n-min/-n-max N (0: none); no model, no memory
    # beyond its hash pool in host memory
    spec_ngram_n: int = 0
    # a draft model (-md ...; its cache types are spec_cache_type_k/v, -ctkd/-ctvd)
    draft: DraftRun | None = None
    # --device, in its order (None = llama.cpp's default list, see llama_devices): an int is a
    # local GPU's index (CUDA<i>), a str a llama.cpp device name ("RPC0", "CUDA1").
    devices: tuple[int | str, ...] | None = None
    rpc_servers: tuple[str, ...] = ()  # --rpc HOST:PORT,...: workers of machine.rpc_workers
    logits_rows: str = "server"  # "server": np*(1+draft) rows; "batch": n_ubatch rows (fit-params)
    # Builds before PR #23764 (2026-05-29) keep the f32 KQ mask beside its f16 cast with flash
    # attention (plan/build_class.py chooses this per installed build).
    fa_mask_f32: bool = False
    swa_full: bool = False  # --swa-full: the sliding-window layers get the full cache


@dataclass(frozen=True)
class Overheads:
    """What llama.cpp does not account for, and what the rest of the machine needs (all
    configurable: --gpu-overhead, --margin, --gpu-reserve, --ram-reserve)."""

    gpu_context_bytes: int = 384 * MiB  # CUDA context + cuBLAS + kernels (notes: 0.3-0.6 GiB)
    # safety margin kept free (VMM pool growth, fragmentation): llama.cpp --fit-target default
    gpu_margin_bytes: int = 1 * GiB
    # A desktop session on the display card takes 0.3-2.5 GiB (real-cuda.md). A probed card
    # shows it as used memory; a described card with nothing known in use keeps this much on the
    # first GPU (the usual display card). 0 for a headless box.
    gpu_desktop_bytes: int = 512 * MiB
    # Host RAM kept for everything but the model. None: the rule of `host_reserve_bytes`.
    host_reserve_bytes: int | None = None
    # Measured on this machine (quantpick bench, calibration profile): device -> bytes the driver
    # takes beyond llama.cpp's buffers; replaces gpu_context_bytes for that GPU.
    gpu_context_by_device: tuple[tuple[str, int], ...] = ()
    # From llama.cpp's own projection (confirm): device -> bytes added to the estimate so that it
    # overflows exactly where llama-fit-params says the device overflows.
    device_correction_bytes: tuple[tuple[str, int], ...] = ()
    # Measured on this machine (quantpick check --learn, plan/memory_calibration.py): device ->
    # llama.cpp's compute buffers / this model's estimate, applied to the estimate's output
    # (apply_compute_ratios), with the basis in `compute_basis`.
    compute_ratio_by_device: tuple[tuple[str, float], ...] = ()
    compute_basis: str = ""


# Host reserve rule (documented in the README): a probed machine's available RAM already excludes
# what runs now, so keep max(1 GiB, 5%) for growth; a described machine (nothing known in use)
# keeps max(4 GiB, 25%) for the OS, a desktop session with a browser and the page cache -- what a
# 32 GB desktop typically has in use (a desktop and browser: 4-8 GB).
PROBED_HOST_RESERVE = (1 * GiB, 0.05)
DESCRIBED_HOST_RESERVE = (4 * GiB, 0.25)


def spec_n_max(config: RunConfig) -> int:
    """common_speculative_n_max (common/speculative.cpp:2315-2340): the largest draft of the
    enabled speculation types (MTP, a draft model, n-gram)."""
    return max(config.spec_draft_n, config.spec_ngram_n, config.draft.n_max if config.draft else 0)


def host_reserve_bytes(ram_total_bytes: int, ram_available_bytes: int, overheads: Overheads) -> int:
    """RAM the plan leaves to the rest of the machine."""
    if overheads.host_reserve_bytes is not None:
        return overheads.host_reserve_bytes
    floor, share = (
        PROBED_HOST_RESERVE if ram_available_bytes < ram_total_bytes else DESCRIBED_HOST_RESERVE
    )
    return max(floor, int(share * ram_total_bytes))


@dataclass(frozen=True)
class DeviceEstimate:
    name: str  # "NVIDIA GeForce RTX 3090" / "Host"
    kind: str  # "gpu" | "host"
    device: str  # llama.cpp's name: "CUDA0", ..., "CPU"
    gpu_index: int | None
    weights_bytes: int
    kv_bytes: int
    recurrent_bytes: int
    compute_bytes: int  # the graph allocator's peak (plan/compute.py); see compute_accuracy
    overhead_bytes: int  # CUDA context (GPU) / output buffer (host); estimate
    projector_bytes: int  # vision projector weights + its compute (estimate)
    total_bytes: int
    free_bytes: int
    budget_bytes: int  # free minus the safety margin
    layers: tuple[int, ...]  # slots held (block indices; block_count = the output layer)
    attention_layers: tuple[int, ...]  # blocks whose KV cache lives here
    recurrent_layers: tuple[int, ...]  # blocks whose recurrent state lives here
    expert_layers: tuple[int, ...]  # blocks whose routed experts live here
    endpoint: str | None = None  # an RPC device's worker "host:port" (None: a local device)
    # The ggml backend that holds it ("CUDA", "ROCm", "Metal", "Vulkan", "SYCL"; "RPC" for an RPC
    # device, "CPU" for the host), and whether its memory is the host's RAM.
    backend: str = "CPU"
    unified: bool = False
    correction_bytes: int = 0  # from llama.cpp's own projection (Overheads.device_correction_bytes)
    # how far compute_bytes is expected to be from llama.cpp's reservation (plan/compute.py)
    compute_accuracy: ComputeAccuracy = UNCHECKED

    @property
    def headroom_bytes(self) -> int:
        return self.budget_bytes - self.total_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.budget_bytes


@dataclass(frozen=True)
class Estimate:
    devices: tuple[DeviceEstimate, ...]  # llama.cpp device order, the host last
    config: RunConfig
    basis: str
    exact_weights: bool
    n_ctx: int  # after padding (and rounding for non-unified streams)
    kv_size: int  # cells per stream
    n_stream: int
    pipeline_parallel: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices)

    @property
    def gpus(self) -> tuple[DeviceEstimate, ...]:
        return tuple(d for d in self.devices if d.kind == "gpu")

    @property
    def host(self) -> DeviceEstimate:
        return self.devices[-1]


# ----------------------------------------------------------------------------------------------
# Context sizing (src/llama-context.cpp: llama_context ctor).


def pad(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def context_cells(
    ctx_size: int, n_ctx_train: int, n_parallel: int, kv_unified: bool
) -> tuple[int, int, int]:
    """(n_ctx, kv_size per stream, n_stream): n_ctx padded to 256; non-unified splits per slot."""
    n_ctx = pad(ctx_size if ctx_size > 0 else n_ctx_train, 256)
    n_seq = max(1, n_parallel)
    if kv_unified or n_seq == 1:
        return n_ctx, n_ctx, 1
    n_ctx_seq = pad(n_ctx // n_seq, 256)
    return n_ctx_seq * n_seq, n_ctx_seq, n_seq


def swa_cells(view: ModelView, kv_size: int, n_parallel: int, kv_unified: bool, ubatch: int,
              swa_full: bool) -> int:  # fmt: skip
    """Cells per stream of a sliding-window layer: pad256(min(kv_size, n_swa x (unified ?
    n_seq : 1) + n_ubatch)), the full cache with --swa-full (src/llama-kv-cache-iswa.cpp:73-80)."""
    if swa_full or view.n_swa <= 0:
        return kv_size
    return pad(min(kv_size, view.n_swa * (max(1, n_parallel) if kv_unified else 1) + ubatch), 256)


def layer_kv_bytes_per_cell(
    layer: LayerView, view: ModelView, type_k: str, type_v: str, flash_attn: bool = True
) -> int:
    """K + V bytes one cell of `layer` takes (src/llama-kv-cache.cpp:200-237): V is padded to the
    widest layer without flash attention (V is stored transposed then), and absent for MLA."""
    v_width = layer.v_width if flash_attn or not layer.v_width else view.v_width_max
    return row_size(type_k, layer.k_width) + row_size(type_v, v_width)


def layer_kv_bytes(
    layer: LayerView,
    view: ModelView,
    cells: int,
    type_k: str,
    type_v: str,
    flash_attn: bool,
    rule: BufferRule,
) -> int:
    """The K and V tensors of one layer's cache, `cells` cells (x streams), as a buffer holds
    them: [row(type, width), cells] each, padded by the device's rule (src/llama-kv-cache.cpp
    :226-237; V absent for MLA, padded to the widest layer without flash attention)."""
    v_width = layer.v_width if flash_attn or not layer.v_width else view.v_width_max
    k = rule.alloc(type_k, layer.k_width, row_size(type_k, layer.k_width) * cells)
    v = rule.alloc(type_v, v_width, row_size(type_v, v_width) * cells) if v_width else 0
    return k + v


def kv_bytes_per_cell_per_layer(layout: ModelLayout, type_k: str, type_v: str) -> int:
    """K + V bytes per cell of the widest KV layer (speed's and compute's yardstick)."""
    view = layout.view
    layers = [view.layers[il] for il in view.kv_layers] or list(view.layers[:1])
    return max((layer_kv_bytes_per_cell(lv, view, type_k, type_v) for lv in layers), default=0)


def recurrent_bytes_per_layer_per_row(layout: ModelLayout) -> int:
    """One sequence's recurrent state of one layer: n_embd_r + n_embd_s, always f32
    (src/llama-hparams.cpp:218-270; create_memory passes GGML_TYPE_F32)."""
    return layout.view.state_bytes_per_row


def kv_type_problem(view: ModelView, type_k: str, type_v: str, flash_attn: str) -> str | None:
    """Why llama.cpp refuses these cache types for this model (None: it takes them), as
    llama_init_from_model checks (src/llama-context.cpp:3816-3871)."""
    fa = flash_attn != "off" and view.flash_attn
    if view.mla and type_k != type_v:
        return f"-ctk {type_k} -ctv {type_v}: this model's cache (MLA) needs -ctk equal to -ctv"
    for flag, kind, sizes in (("-ctk", type_k, view.head_k_sizes),
                              ("-ctv", type_v, view.head_v_sizes)):  # fmt: skip
        block = GGML_TYPES[kind.upper()][1]
        if block > 1 and fa:
            bad = sorted(n for n in sizes if n % block)
            if bad:
                return (
                    f"{flag} {kind}: its {block}-value blocks do not divide this model's head "
                    f"size {bad[0]}"
                )
    if not view.flash_attn and type_v.upper() not in UNQUANTIZED:
        return (
            f"-ctv {type_v}: llama.cpp runs {view.arch} without flash attention, which a "
            "quantized V cache needs"
        )
    return None


def validate_config(config: RunConfig, layout: ModelLayout) -> None:
    for flag, value in (("-ctk", config.cache_type_k), ("-ctv", config.cache_type_v)):
        if value not in KV_CACHE_TYPES:
            raise UsageError(
                f"{flag} {value}: not a KV cache type",
                hint="use one of " + ", ".join(KV_CACHE_TYPES),
            )
    if config.flash_attn not in ("on", "off", "auto"):
        raise UsageError(f"-fa {config.flash_attn}: use on, off or auto")
    if config.flash_attn == "off" and config.cache_type_v not in ("f16", "f32", "bf16"):
        # llama_context ctor: "quantized V cache was requested, but this requires Flash Attention"
        raise UsageError(
            f"-ctv {config.cache_type_v} needs flash attention, and -fa is off",
            hint="use -fa on (or auto), or an unquantized V cache",
        )
    problem = kv_type_problem(
        layout.view, config.cache_type_k, config.cache_type_v, config.flash_attn
    )
    if problem is not None:
        raise UsageError(problem, hint="use f16 (or another cache type that divides it)")
    if config.ctx_size < 0 or config.n_parallel < 1 or config.ubatch < 1 or config.batch < 1:
        raise UsageError("-c must be >= 0, -np, -ub and -b >= 1")
    if config.n_gpu_layers is not None and config.n_gpu_layers < 0:
        raise UsageError("-ngl must be >= 0 (omit it for all layers)")
    if config.n_cpu_moe < 0:
        raise UsageError("--n-cpu-moe must be >= 0")
    if config.tensor_split is not None and (
        any(v < 0 for v in config.tensor_split) or sum(config.tensor_split) <= 0
    ):
        raise UsageError("-ts needs non-negative proportions with a positive sum")


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


# ----------------------------------------------------------------------------------------------
# The estimate.


@dataclass
class _Acc:
    weights: int = 0
    kv: int = 0
    recurrent: int = 0
    compute: int = 0
    overhead: int = 0
    projector: int = 0
    layers: list[int] = field(default_factory=list)
    attention: list[int] = field(default_factory=list)
    recurrent_layers: list[int] = field(default_factory=list)
    experts: list[int] = field(default_factory=list)


_RPC_BUFT = re.compile(r"RPC(\d+)\[(.+)\]")


def _buft_to_device(buft: str, devices: tuple[LlamaDevice, ...]) -> int | None:
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
    if _RPC_BUFT.fullmatch(b) is None and b.startswith("RPC"):
        hint += " (an RPC device's buffer type carries its worker: RPC0[host:port])"
    raise UsageError(f"-ot buffer type {b!r} is not a device here", hint=hint)


@lru_cache(maxsize=4096)
def _f32(value: float) -> float:
    """`value` rounded to single precision (C++ float); memoized (a plan asks ~10^4 times)."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


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
    best = 0
    for t in layout.tensors:
        if len(t.shape) < 2:
            continue
        slot = layout.slot_of(t.name)
        if slot == INPUT_SLOT or slot == layout.output_slot or skipped(slot):
            continue
        if limit is not None and t.n_bytes > limit:
            continue
        if experts_only and not (t.is_expert and host_experts[slot]):
            continue
        if slot_device[slot] == host_pos or (t.is_expert and host_experts[slot]):
            best = max(best, t.n_bytes)
    return best


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


def _max_alloc_notes(
    layout: ModelLayout,
    devs: tuple[LlamaDevice, ...],
    slot_device: list[int],
    n_cpu_moe: int,
    acc: list[_Acc],
) -> list[str]:
    """A backend whose driver caps one allocation (Vulkan: machine/backends/vulkan.py) cannot
    hold a single tensor or compute buffer above the cap: llama.cpp splits weights over several
    buffers, but not one tensor, and a compute buffer is one allocation."""
    notes: list[str] = []
    for pos, d in enumerate(devs):
        b = backend_of(d.gpu.backend)
        cap = None if d.is_rpc else b.max_alloc_bytes
        if not cap:
            continue
        biggest = max(
            (
                t.n_bytes
                for t in layout.tensors
                if (slot := layout.slot_of(t.name)) != INPUT_SLOT
                and slot_device[slot] == pos
                and not (t.is_expert and slot < n_cpu_moe)
            ),
            default=0,
        )
        for what, size in (("tensor", biggest), ("compute buffer", acc[pos].compute)):
            if size > cap:
                notes.append(
                    f"{d.name}: a {what} of {size / GiB:.2f} GiB is above {b.label}'s "
                    f"{cap / GiB:.0f} GiB single allocation on some drivers ({b.max_alloc_source})"
                )
    return notes


def estimate(
    layout: ModelLayout,
    machine: Machine,
    config: RunConfig,
    *,
    overheads: Overheads | None = None,
    projector_bytes: int = 0,
) -> Estimate:
    """Bytes on every device for `config` on `machine`, device order as llama.cpp's."""
    overheads = overheads or Overheads()
    validate_config(config, layout)
    arch = layout.architecture
    devs = llama_devices(machine, config)
    n_gpu = len(devs)
    host_pos = n_gpu  # index of the host accumulator

    n_slots = layout.n_slots  # block_count + 1
    ngl = n_slots if config.n_gpu_layers is None else min(config.n_gpu_layers, n_slots)
    if n_gpu == 0:
        ngl = 0
    i_gpu_start = max(n_slots - ngl, 0)
    act_gpu_layers = min(ngl, n_slots) if n_gpu else 0

    # llama_model_base::load_tensors (src/llama-model.cpp:1556-1614): cumulative split fractions,
    # from -ts or free memory, in float (single precision, as llama.cpp computes them: a split
    # exactly at a layer boundary falls where float32 rounding puts it).
    if config.tensor_split is not None and any(config.tensor_split) and n_gpu:
        shares = list(config.tensor_split[:n_gpu]) + [0.0] * max(
            0, n_gpu - len(config.tensor_split)
        )
    else:
        shares = [float(d.gpu.free_bytes) for d in devs]
    splits: list[float] = []
    running = 0.0
    for share in shares:
        running = _f32(running + _f32(share))
        splits.append(running)
    total_share = running or 1.0
    splits = [_f32(edge / total_share) for edge in splits]

    def device_of_slot(slot: int) -> int:
        if n_gpu == 0 or slot < i_gpu_start or slot - i_gpu_start >= act_gpu_layers:
            return host_pos
        frac = _f32(_f32(slot - i_gpu_start) / act_gpu_layers)
        # std::upper_bound: the first split strictly greater than frac
        for pos, edge in enumerate(splits):
            if edge > frac:
                return pos
        return n_gpu - 1

    slot_device = [device_of_slot(s) for s in range(n_slots)]
    acc = [_Acc() for _ in range(n_gpu + 1)]
    view = layout.view
    per_device = frozenset(layout.per_device_tensors)
    mtp_loaded = config.spec_draft_n > 0 and arch.nextn_predict_layers > 0

    # Weights. The NextN/MTP block is skipped (never allocated) unless MTP speculation loads it.
    overrides = [(re.compile(p), _buft_to_device(b, devs)) for p, b in config.override_tensors]
    n_cpu_moe = arch.block_count if config.cpu_moe else config.n_cpu_moe

    nextn_skipped = frozenset() if mtp_loaded else frozenset(range(arch.n_layer, arch.block_count))

    def skipped(slot: int) -> bool:
        return slot in nextn_skipped

    # Each device's buffers size their tensors by its backend's rule (model/ggml.py BufferRule:
    # alignment, quantized row padding: machine/backends); the host is the CPU backend.
    rules = [device_buffer(d) for d in devs] + [CPU_BUFFER]
    host_experts = [0] * n_slots  # routed-expert bytes of each block that live in host memory
    # A device whose driver takes no tensor above a size (Gpu.max_tensor_bytes) leaves larger
    # weights in host memory: its backend's supports_op refuses them, and the loader takes the
    # next buffer type, the CPU's (llama-model.cpp select_weight_buft; ggml-vulkan.cpp:15304-15330).
    limits = [d.gpu.max_tensor_bytes for d in devs] + [None]

    def too_big(t: TensorInfo, pos: int) -> bool:
        limit = limits[pos]
        return isinstance(limit, int) and limit > 0 and t.n_bytes > limit

    limited = any(limits) and any(too_big(t, pos) for t in layout.tensors for pos in range(n_gpu))
    if overrides or limited:
        # -ot: std::regex_search on every tensor name, first match wins, before the normal choice
        # (llama_model_loader::create_tensor); --n-cpu-moe's own patterns come after the user's.
        for t in layout.tensors:
            if t in per_device:
                continue
            slot = layout.slot_of(t.name)
            if skipped(slot):
                continue
            target = host_pos if slot == INPUT_SLOT else slot_device[slot]
            for pattern, dev in overrides:
                if pattern.search(t.name):
                    target = host_pos if dev is None else dev
                    break
            else:
                if slot != INPUT_SLOT and t.is_expert and slot < n_cpu_moe:
                    target = host_pos
            if too_big(t, target):
                target = host_pos
            acc[target].weights += layout.tensor_alloc(t, rules[target])
            if t.is_expert and target == host_pos and slot != INPUT_SLOT:
                host_experts[slot] += t.n_bytes
    else:
        acc[host_pos].weights += layout.input_bytes_under(CPU_BUFFER)
        by_rule = {rule.name: layout.slots_under(rule) for rule in set(rules)}
        host_slots = by_rule[CPU_BUFFER.name]
        for slot, sw in enumerate(layout.slots):
            if skipped(slot):
                continue
            dev = slot_device[slot]
            on_host = slot < n_cpu_moe or dev == host_pos
            acc[dev].weights += by_rule[rules[dev].name][slot].dense_bytes
            if on_host:
                acc[host_pos].weights += host_slots[slot].expert_bytes
                host_experts[slot] = sw.expert_bytes
            else:
                acc[dev].weights += by_rule[rules[dev].name][slot].expert_bytes
    # rope_freqs and kin: one copy per device holding a trunk layer (TENSOR_DUPLICATED)
    if per_device:
        holders = dict.fromkeys(slot_device[il] for il in range(arch.n_layer))
        for pos in holders:
            acc[pos].weights += sum(layout.tensor_alloc(t, rules[pos]) for t in per_device)
    # A tied output head: token_embd loaded again on the output layer's device when that is not
    # the host (the same buffer type keeps one copy: src/llama-model-loader.cpp:1371-1376).
    output_dev = slot_device[layout.output_slot]
    if layout.tied_output_bytes and (output_dev != host_pos or view.tied_copy_always):
        embd = next(t for t in layout.tensors if t.name == "token_embd.weight")
        if not too_big(embd, output_dev):
            acc[output_dev].weights += layout.tensor_alloc(embd, rules[output_dev])
        elif view.tied_copy_always:  # the copy falls back to the host, where it is loaded anyway
            acc[host_pos].weights += layout.tensor_alloc(embd, rules[host_pos])
        # else: the host's one copy serves the output too
    for slot in range(n_slots):
        if skipped(slot):
            continue
        acc[slot_device[slot]].layers.append(slot)
        if layout.slots[slot].expert_bytes:
            acc[host_pos if host_experts[slot] else slot_device[slot]].experts.append(slot)

    # KV cache and recurrent state, layer by layer from the architecture's view: each layer's
    # cache on its layer's device (dev_layer(il)), or the host with -nkvo
    # (src/llama-kv-cache.cpp:213-222, llama-memory-recurrent.cpp).
    n_ctx, kv_size, n_stream = context_cells(
        config.ctx_size, arch.context_length, config.n_parallel, config.kv_unified
    )
    ub = min(config.ubatch, config.batch, n_ctx)
    fa = config.flash_attn != "off" and view.flash_attn
    window_cells = swa_cells(
        view, kv_size, config.n_parallel, config.kv_unified, ub, config.swa_full
    )
    # one row per sequence, times (1 + drafts) rollback snapshots with MTP speculation
    rows = max(1, config.n_parallel) * (1 + config.spec_draft_n)
    for layer in view.layers:
        il = layer.index
        dev = slot_device[il] if config.kv_offload else host_pos
        rule = rules[dev]
        if layer.kv:
            cells = window_cells if layer.attention is AttentionKind.SLIDING else kv_size
            acc[dev].kv += layer_kv_bytes(
                layer, view, cells * n_stream, config.cache_type_k, config.cache_type_v, fa, rule
            )
            acc[dev].attention.append(il)
        if layer.index_k_width:
            # the indexer's cache: one key head (and for MSA a value head), every cell
            acc[dev].kv += rule.alloc(
                config.cache_type_k, layer.index_k_width,
                row_size(config.cache_type_k, layer.index_k_width) * kv_size * n_stream,
            )  # fmt: skip
            if layer.index_v_width:
                acc[dev].kv += rule.alloc(
                    config.cache_type_v, layer.index_v_width,
                    row_size(config.cache_type_v, layer.index_v_width) * kv_size * n_stream,
                )  # fmt: skip
        if layer.recurrent:
            # r and s: two f32 tensors of rows x n_embd_r / n_embd_s
            acc[dev].recurrent += rule.alloc("F32", view.state_r, rows * view.state_r * 4)
            acc[dev].recurrent += rule.alloc("F32", view.state_s, rows * view.state_s * 4)
            acc[dev].recurrent_layers.append(il)
    if mtp_loaded:
        # The MTP draft context (common/speculative.cpp:2525-2567): the target's n_ctx, the same
        # sequences and streams, n_rs_seq 0, a plain KV cache of the NextN layers only
        # (src/llama-model.cpp ~2662-2800 filter il >= n_layer()) at -ctkd/-ctvd, on each
        # layer's device. Its cells total n_ctx whatever the streams (checked against
        # llama-server -lv 4: tests/data/llama-server-mtp-buffers.json).
        for il in view.mtp_kv_layers:
            mtp_dev = slot_device[il] if config.kv_offload else host_pos
            acc[mtp_dev].kv += layer_kv_bytes(
                view.layers[il], view, n_ctx, config.spec_cache_type_k,
                config.spec_cache_type_v, fa, rules[mtp_dev],
            )  # fmt: skip

    # Compute buffers: the peak of each device's part of the graph (plan/compute.py).
    overridden = bool(config.override_tensors) or config.cpu_moe or config.n_cpu_moe > 0
    full_offload = n_gpu > 0 and ngl >= n_slots
    pipeline = n_gpu > 1 and full_offload and not overridden and config.kv_offload
    copies = PIPELINE_COPIES if pipeline else 1
    n_outputs_max = (
        # server_output_limits: np x (1 + common_speculative_n_max), the largest draft of the
        # enabled types (common/speculative.cpp:2315-2350)
        min(
            config.batch,
            max(1, config.n_parallel) * (1 + spec_n_max(config)),
        )
        if config.logits_rows == "server"
        else config.batch
    )
    shape = graph_shape(layout, ub, min(ub, n_outputs_max))
    graph_rule = GRAPH_RULES.get(arch.name, GENERIC)
    # A backend whose supports_op refuses ops over the device's largest tensor
    # (ComputeTraits.ops_capped: Vulkan's maxStorageBufferRange) leaves such ops to the CPU
    # backend: their live set moves to the host's compute buffer.
    traits = [backend_of(d.gpu.backend).compute for d in devs]
    caps: list[int | None] = [
        lim if t.ops_capped and isinstance(lim, int) and lim > 0 else None
        for t, lim in ((t, d.gpu.max_tensor_bytes) for t, d in zip(traits, devs, strict=True))
    ] + [None]

    def refuses(pos: int, nbytes: int) -> bool:
        cap = caps[pos]
        return cap is not None and nbytes > cap

    kinds: list[dict[AttentionKind, int]] = [{} for _ in range(n_gpu + 1)]
    trait = graph_trait(arch.name)
    trait_pos: set[int] = set()  # devices running a layer the architecture's trait covers
    kq = [0] * (n_gpu + 1)
    # A layer whose attention the device's backend refuses (its Q, its output or, without flash
    # attention, its KQ matrix above the cap) has it computed on the host: the KQ there, the
    # output (n_head x head_dim_v x n_ubatch x 4) back here as a split input
    kq_host = 0
    attn_moved = [False] * (n_gpu + 1)
    attn_q_moved = [False] * (n_gpu + 1)
    attn_back = [0] * (n_gpu + 1)  # the largest attention output a device gets back
    # ... and the largest Q it hands over, beside the Q projection's output it was built from
    # (attn_q, or MLA's attn_q_b: n_head x (nope + rope) wide)
    attn_handoff = [0] * (n_gpu + 1)
    host_received = 0  # split inputs of the host's part, summed over the layers it runs for others
    q_proj_rows = {
        layout.slot_of(t.name): t.shape[1]
        for t in layout.tensors
        if len(t.shape) == 2 and t.name.endswith((".attn_q.weight", ".attn_q_b.weight"))
    }
    attn_returned = [0] * (n_gpu + 1)  # summed over its layers
    # a host layer's K and V: with op offload its flash attention runs on the offloading GPU too
    # (the scheduler spreads a GPU's assignment to the ops around an offloaded matmul:
    # ggml-backend.cpp ggml_backend_sched_split_graph, pass 2), which copies them in
    host_layer_kv = 0
    layer_kq: dict[int, int] = {}  # each attending layer's no-FA KQ matrix (bytes)
    remote: list[dict[int, int]] = [{} for _ in range(n_gpu + 1)]
    remote_views = [0] * (n_gpu + 1)
    no_cache = view.memory is MemoryClass.NONE  # non-causal (diffusion): n_kv = the ubatch
    for layer in view.layers:
        reads_kv = layer.kv or layer.kv_shared_from is not None or no_cache
        if not layer.attends or not reads_kv or skipped(layer.index):
            continue
        # the attention runs on the layer's device, also with -nkvo (its K and V are copied in)
        pos = slot_device[layer.index]
        cells = window_cells if layer.attention is AttentionKind.SLIDING else kv_size
        if no_cache:
            cells = ub
        layer_kq[layer.index] = cells * ub * max(layer.n_head, 1) * 4
        head_k = layer.k_width // max(layer.n_head_kv, 1)
        head_v = (
            layer.v_width // max(layer.n_head_kv, 1)
            if layer.v_width
            else max(view.head_v_sizes, default=head_k)  # MLA: the latent's width
        )
        q_bytes = ub * max(layer.n_head, 1) * head_k * 4
        out_bytes = ub * max(layer.n_head, 1) * head_v * 4
        if (
            refuses(pos, q_bytes)
            or refuses(pos, out_bytes)
            or (not fa and refuses(pos, layer_kq[layer.index]))
        ):
            attn_moved[pos] = True
            attn_q_moved[pos] = attn_q_moved[pos] or refuses(pos, q_bytes)
            attn_back[pos] = max(attn_back[pos], out_bytes)
            q_proj = ub * q_proj_rows.get(layer.index, 0) * 4
            attn_handoff[pos] = max(attn_handoff[pos], q_bytes + q_proj)
            attn_returned[pos] += out_bytes
            kq_host = max(kq_host, layer_kq[layer.index])
            # what the host receives for it: the Q, and the layer's K and V (views of a cache
            # in device memory)
            host_received += q_bytes + layer_kv_bytes(
                layer, view, cells * n_stream, config.cache_type_k, config.cache_type_v, fa,
                CPU_BUFFER,
            )  # fmt: skip
            kinds[host_pos][layer.attention] = cells
            continue
        src = layer.kv_shared_from
        if src is not None and (slot_device[src] if config.kv_offload else host_pos) != pos:
            remote[pos][src] = layer_kv_bytes(
                view.layers[src], view, cells * n_stream, config.cache_type_k,
                config.cache_type_v, fa, CPU_BUFFER,
            )  # fmt: skip
            # each layer's view of the shared cache is its own split input (DeviceGraph)
            remote_views[pos] += remote[pos][src]
        kinds[pos][layer.attention] = cells
        if pos == host_pos and layer.kv and fa:
            host_layer_kv = max(host_layer_kv, layer_kv_bytes(
                layer, view, cells * n_stream, config.cache_type_k, config.cache_type_v, fa,
                CPU_BUFFER,
            ))  # fmt: skip
        if trait is not None and trait.layers(arch, layer.index):
            trait_pos.add(pos)
        kq[pos] = max(kq[pos], layer_kq[layer.index])
    all_kinds: dict[AttentionKind, int] = {}
    for k in kinds:
        all_kinds.update(k)
    # the f16 FA mask since PR #23764 (src/llama-graph.cpp:29-46); before, the host kept the f32
    # input it was cast from: a pre-cap CUDA log's CUDA_Host buffer is the f32 mask + 2E
    # (real-cuda.md, tests/data/cuda-logs.json)
    host_fa_bytes = 4 if config.fa_mask_f32 else 2
    # the output head: its weight (the tied token_embd where there is no output.weight) and the
    # logits it writes; either above the cap and the matmul runs on the host
    head = next((t for t in layout.tensors if t.name == "output.weight"), None) or next(
        (t for t in layout.tensors if t.name == "token_embd.weight"), None
    )
    output_compute = output_dev
    if output_dev != host_pos and (
        refuses(output_dev, shape.logits)
        or (head is not None and refuses(output_dev, head.n_bytes))
    ):
        output_compute = host_pos
    # what each device's layers get back from the ops the host ran for them: the attention's
    # output after a KQ over the cap, the routed experts' outputs where their weights stayed in
    # host memory over the cap (split inputs: ggml-backend.cpp:1514-1531)
    returned = list(attn_returned)
    # expert biases (gpt-oss): the gate and up results come back to be biased here, too
    expert_bias = any(
        t.name.endswith(("ffn_gate_exps.bias", "ffn_up_exps.bias")) for t in layout.tensors
    )
    experts_back = 2 * shape.moe_mid if expert_bias else 0
    for layer in view.layers:
        pos = slot_device[layer.index]
        if pos == host_pos or skipped(layer.index) or caps[pos] is None:
            continue
        if host_experts[layer.index]:
            returned[pos] += shape.moe_out + experts_back
            # the host receives the normed hidden state (and the selected experts, small), and
            # with expert biases the biased gate and up product for the down matmul
            host_received += shape.e + (shape.moe_mid if expert_bias else 0)
    # a cache other than f16: a GPU's flash attention converts one layer's K and V to f16
    kv_convert = 0
    if fa and (config.cache_type_k, config.cache_type_v) != ("f16", "f16"):
        kv_convert = max(
            (kv_size * n_stream * (lv.k_width + lv.v_width) * 2 for lv in view.layers if lv.kv),
            default=0,
        )
    # the architecture's own live set in an attention layer (arch/graph.py), on each device
    # running one; the reserved ubatch is a multiple of n_seq_max (src/llama-context.cpp:2529)
    n_seq = max(1, config.n_parallel)
    sizes = GraphSizes(-(-ub // n_seq) * n_seq, kv_size, n_stream, n_seq, 2 if fa else 4)
    arch_live = trait.live(arch, sizes) if trait is not None else ArchLive()
    backends = [backend_kind(d) for d in devs] + [ComputeBackend.CPU]
    # op offload: the first device whose backend takes offloaded ops (a local GPU; an RPC device
    # never does: its offload_op is NULL, ggml-rpc.cpp device interface)
    op_offload_pos = next(
        (p for p, d in enumerate(devs) if not d.is_rpc and backends[p] is ComputeBackend.GPU), None
    )
    offloading = op_offload_pos is not None and ub >= traits[op_offload_pos].offload_min_batch
    op_cap = caps[op_offload_pos] if op_offload_pos is not None else None
    host_weight = host_weight_tensor(layout, slot_device, host_pos, host_experts, skipped, op_cap)
    # routed experts in host memory that the offloading device refuses stay the host's to compute
    experts_offloaded = offloading and not (
        op_cap is not None
        and host_weight_tensor(
            layout, slot_device, host_pos, host_experts, skipped, experts_only=True
        )
        > op_cap
    )
    for pos in range(n_gpu + 1):
        a = acc[pos]
        is_host = pos == host_pos
        mask_cells = sum((all_kinds if is_host else kinds[pos]).values())
        computes = [s for s in a.layers if 0 <= s < arch.n_layer or s == layout.output_slot]
        block_layers = [s for s in a.layers if s != layout.output_slot]
        a.compute = device_compute(
            DeviceGraph(
                backend=backends[pos],
                is_host=is_host,
                holds_layers=bool(block_layers) or (bool(kinds[pos]) and not is_host),
                holds_output=(pos == output_dev and bool(computes))
                or (pos == output_compute != output_dev),
                output_elsewhere=pos == output_dev != output_compute,
                returned=host_received if is_host else returned[pos],
                experts_back=experts_back if pos < n_gpu and caps[pos] is not None else 0,
                mask_f16=mask_cells * ub * (host_fa_bytes if is_host else 2),
                mask_f32=mask_cells * ub * 4,
                kq=0 if fa else (max(kq_host, kq[pos]) if is_host else kq[pos]),
                attn_elsewhere=attn_moved[pos],
                attn_back=attn_back[pos],
                attn_handoff=attn_handoff[pos],
                attn_q_elsewhere=attn_q_moved[pos],
                flash_attn=fa,
                host_experts=is_host and any(host_experts) and not experts_offloaded,
                offload_weight=max(host_weight, host_layer_kv)
                if offloading and pos == op_offload_pos
                else 0,
                copies=copies,
                remote_kv=sum(remote[pos].values()),
                remote_kv_views=remote_views[pos],
                arch_live=(
                    arch_live
                    if pos in trait_pos
                    else ArchLive(inputs=arch_live.inputs)
                    if is_host
                    else ArchLive()
                ),
                kv_convert=kv_convert if pos < n_gpu and traits[pos].fa_kv_convert else 0,
                experts=bool(a.experts) or not view.is_moe,
            ),
            shape,
            graph_rule,
        )
        if pos < n_gpu:
            a.overhead = (
                0
                if devs[pos].context_in_free
                else dict(overheads.gpu_context_by_device).get(
                    devs[pos].name, overheads.gpu_context_bytes
                )
            )
    host = acc[host_pos]
    # The output buffer: output_reserve(n_seq_max) at context creation; llama-server's verify
    # batches of speculative decoding grow it to their outputs, np x (1 + drafts) rows
    # (output_reserve(n_outputs_all), src/llama-context.cpp:1857)
    out_rows = config.n_parallel
    if config.logits_rows == "server":
        out_rows = max(out_rows, min(ub, n_outputs_max))
    host.overhead = output_buffer(arch.vocab_size, out_rows)
    if mtp_loaded:
        # the draft context's own output buffer: n_outputs_max = n_parallel rows
        # (common_base_params_to_speculative, common/speculative.cpp:2480)
        host.overhead += output_buffer(arch.vocab_size, config.n_parallel)
        # Its compute buffer: a second llama_context with its own scheduler, so it adds to the
        # main one's. The same phases (plan/compute.py) for its one NextN block, its mask over
        # the main context's cells per stream, logits for n_parallel rows, on the NextN block's
        # device; llama-server -lv 4 on the tiny model (tests/data/llama-server-mtp-buffers.json):
        # 1.3-2.0x (its layer allowance is the main context's).
        nextn_dev = slot_device[arch.n_layer] if arch.n_layer < n_slots else host_pos
        draft_rows = min(ub, max(1, config.n_parallel))
        acc[nextn_dev].compute += device_compute(
            DeviceGraph(
                backend=backends[nextn_dev],
                is_host=nextn_dev == host_pos,
                holds_layers=True,
                holds_output=True,
                mask_f16=kv_size * ub * 2,
                mask_f32=kv_size * ub * 4,
                kq=0 if fa else kv_size * ub * max(view.n_head, 1) * 4,
                flash_attn=fa,
            ),
            replace(shape, logits=arch.vocab_size * draft_rows * 4),
            graph_rule,
        )
    if config.vision and projector_bytes:
        # The projector goes to --device's first device, else to the first GPU registered, which
        # is a local one when there is any: RPC devices register at --rpc, after the built-in
        # backends (common/arg.cpp: mmproj_device; tools/mtmd/clip.cpp clip_ctx).
        first = 0 if config.devices is not None or op_offload_pos is None else op_offload_pos
        projector_acc = acc[first] if n_gpu else host
        projector_acc.projector = projector_bytes + PROJECTOR_COMPUTE_BYTES

    notes: list[str] = []
    if not fa:
        notes.append("flash attention off: the KQ matrix is materialised (large at long context)")
    notes += _max_alloc_notes(layout, devs, slot_device, n_cpu_moe, acc)
    corrections = dict(overheads.device_correction_bytes)
    # the rule is checked for a known architecture and the current build class
    checked = view.known and not config.fa_mask_f32
    # each GPU's expected error: its backend's (machine/backends ComputeTraits), the op-offload
    # one on the device that runs host-resident layers' matmuls where the backend has one
    gpu_acc = [GPU_ESTIMATE] * (n_gpu + 1)
    for pos in range(n_gpu):
        tr = traits[pos]
        offloaded_here = offloading and pos == op_offload_pos and host_weight > 0
        if offloaded_here and tr.offload_expected_error:
            gpu_acc[pos] = gpu_accuracy(tr.offload_expected_error, tr.offload_error_basis)
        else:
            gpu_acc[pos] = gpu_accuracy(tr.expected_error, tr.error_basis)
    devices: list[DeviceEstimate] = []
    # Unified memory (docs/backends.md): a local GPU whose memory is the host's draws on the same
    # RAM as the host's buffers. Its own budget is the share the OS lets it take (its free_bytes:
    # Metal's working set, the GTT limit, ...); what it takes is then not the host's.
    unified_taken = 0
    for pos in range(n_gpu + 1):
        a = acc[pos]
        endpoint: str | None = None
        if pos < n_gpu:
            rdev = devs[pos]
            # llama.cpp reports an RPC device as type GPU (ggml_backend_rpc_device_get_type).
            name, kind, device, endpoint = rdev.gpu.name, "gpu", rdev.name, rdev.endpoint
            free = rdev.gpu.free_bytes
            budget = free - overheads.gpu_margin_bytes
            if pos == 0 and not rdev.is_rpc and rdev.gpu.free_bytes >= rdev.gpu.total_bytes:
                budget -= overheads.gpu_desktop_bytes
            gpu_index: int | None = None if rdev.is_rpc else rdev.gpu.index
            backend = "RPC" if rdev.is_rpc else backend_of(rdev.gpu.backend).label
            unified = not rdev.is_rpc and rdev.gpu.unified
        else:
            name, kind, device, gpu_index = "Host", "host", "CPU", None
            backend, unified = "CPU", True
            free = max(0, machine.host.ram_available_bytes - unified_taken)
            budget = free - host_reserve_bytes(
                machine.host.ram_total_bytes, machine.host.ram_available_bytes, overheads
            )
        correction = corrections.get(device, 0)
        total = a.weights + a.kv + a.recurrent + a.compute + a.overhead + a.projector + correction
        if pos < n_gpu and not devs[pos].is_rpc and devs[pos].gpu.unified:
            unified_taken += total
        devices.append(
            DeviceEstimate(
                name=name,
                kind=kind,
                device=device,
                gpu_index=gpu_index,
                weights_bytes=a.weights,
                kv_bytes=a.kv,
                recurrent_bytes=a.recurrent,
                compute_bytes=a.compute,
                overhead_bytes=a.overhead,
                projector_bytes=a.projector,
                total_bytes=total,
                free_bytes=free,
                budget_bytes=budget,
                layers=tuple(a.layers),
                attention_layers=tuple(a.attention),
                recurrent_layers=tuple(a.recurrent_layers),
                expert_layers=tuple(a.experts),
                endpoint=endpoint,
                correction_bytes=correction,
                compute_accuracy=accuracy(backends[pos], checked, gpu_acc[pos]),
                backend=backend,
                unified=unified,
            )
        )
    result = Estimate(
        devices=tuple(devices),
        config=config,
        basis=layout.basis,
        exact_weights=layout.exact,
        n_ctx=n_ctx,
        kv_size=kv_size,
        n_stream=n_stream,
        pipeline_parallel=pipeline,
        notes=tuple(notes),
    )
    return apply_compute_ratios(result, overheads)


def apply_compute_ratios(est: Estimate, overheads: Overheads) -> Estimate:
    """The estimate with each device's compute buffers scaled by the measured ratio of this
    machine (Overheads.compute_ratio_by_device), a step on the estimate's output, outside the
    compute model; totals follow, the basis is named in the notes."""
    ratios = dict(overheads.compute_ratio_by_device)
    if not ratios:
        return est
    devices = []
    changed = []
    for d in est.devices:
        ratio = ratios.get(d.device)
        if ratio is None or not d.compute_bytes:
            devices.append(d)
            continue
        compute = round(d.compute_bytes * ratio)
        devices.append(
            replace(d, compute_bytes=compute, total_bytes=d.total_bytes - d.compute_bytes + compute)
        )
        changed.append(f"{d.device} x{ratio:.2f}")
    if not changed:
        return est
    note = f"compute {', '.join(changed)}: {overheads.compute_basis or 'measured on this machine'}"
    return replace(est, devices=tuple(devices), notes=(*est.notes, note))
