"""The memory model's inputs and outputs: a llama-server configuration (RunConfig, DraftRun), what
is kept free (Overheads and the host reserve rule) and the estimate per device (DeviceEstimate,
Estimate). Pure data; plan/memory.py computes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantpick.plan.compute import (
    UNCHECKED,
    ComputeAccuracy,
)
from quantpick.units import GiB, MiB

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
