"""The Backend type (one module per backend fills it in; the registry is the package). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from quantpick.model.ggml import BufferRule

# The verify-batch efficiency of AMD's kernels (ROCm and Vulkan), relative to the mat-vec decode
# of the same backend (Backend.verify_efficiency; the reference, 1.0, is a kernel that takes up
# to 8 rows in one pass over the weights: ggml-cuda/mmvq.cu MMVQ_MAX_BATCH_SIZE): 0.35, fitted
# (grid 0.10-1.00, `benchmarks/spec_accuracy.py --fit`) to the 8 AMD rows of
# benchmarks/data/spec-measurements.json (Strix Halo ROCm/Vulkan, RX 7900 XTX, Radeon 780M, a
# HIP card; 5 sources), the acceptance held out by source: refitted without each row's source,
# median error 4%, worst 1.48x (1.0 gives 18% and 1.57x). Metal, SYCL: no rows, 1.0.
VERIFY_EFFICIENCY_AMD = 0.35

# ggml's 16-bit float weight types: a mat-vec reads them without dequantizing (the other types
# with a block structure are quantized; F32 tensors are norms and biases, not mat-vec weights).
HALF_TYPES = frozenset({"F16", "BF16"})


@dataclass(frozen=True)
class ComputeTraits:
    """How a backend's part of the graph lands in its compute buffer (plan/compute.py, applied by
    plan/memory.py): what its scheduler callbacks accept (ggml-backend.cpp's
    ggml_backend_sched_split_graph asks supports_op and offload_op of every node) and what its
    kernels allocate inside the graph rather than in a scratch of their own. Each backend module
    cites its llama.cpp lines."""

    # offload_op: a matmul (any op for some backends) whose weight lives in host memory runs on
    # this device when its batch is at least this many rows (GGML_OP_OFFLOAD_MIN_BATCH, default 32)
    offload_min_batch: int = 32
    # supports_op refuses an op any of whose sources or result is larger than the device's
    # largest tensor (Gpu.max_tensor_bytes): the scheduler gives the op to the CPU backend, so
    # its live set (the logits, a no-FA KQ matrix, an offloaded weight) is the host's
    ops_capped: bool = False
    # flash attention over a quantized K/V converts one layer's K and V to f16 in a tensor of the
    # graph (in the compute buffer); False: in a scratch buffer of the backend's own, outside it
    fa_kv_convert: bool = False
    source: str = ""
    # how far its compute figures are expected to be from llama.cpp's (relative; the floor is
    # plan/compute.py's), and what that was measured on
    expected_error: float = 0.15
    error_basis: str = "public GPU-backend logs"
    # ... on the device that runs host-resident layers' matmuls by op offload (-ngl partial
    # offload), where it differs (0: the same)
    offload_expected_error: float = 0.0
    offload_error_basis: str = ""
    # -ngl partial offload: the host layers run on the offloading device as phases of their own
    # (plan/compute.py DeviceGraph.offload_weight_share): its layer's live set + this share of
    # the largest copied host weight, and a host layer's copied K and V + the mask +
    # host_layer_kv_e x E (and a gated FFN's up weight copy: DeviceGraph.offload_ffn_up). None:
    # the copy is added to a layer's live set (the CUDA rule)
    host_layer_weight_share: float | None = None
    host_layer_kv_e: float = 0.0
    # flash attention whose output is narrower than the residual stream: a layer's FFN lands
    # above the attention's Q, K and V (plan/compute.py DeviceGraph.attn_narrow; measured on
    # the Vulkan backend's lavapipe oracle only)
    narrow_attn_above: bool = False


class Vendor(str, Enum):
    NVIDIA = "nvidia"
    AMD = "amd"
    APPLE = "apple"
    INTEL = "intel"
    NONE = "none"  # the CPU


# How a GPU's name says its vendor (catalogue names, llama.cpp's device descriptions, Vulkan's
# deviceName: "Intel(R) Graphics (BMG G31)", "AMD Radeon 8060S Graphics", "NVIDIA GeForce ...").
_VENDOR_WORDS = (
    (Vendor.INTEL, re.compile(r"\bintel|\barc\b|\biris\b", re.IGNORECASE)),
    (Vendor.AMD, re.compile(r"\bamd\b|radeon|\bradv\b|\binstinct\b", re.IGNORECASE)),
    (Vendor.APPLE, re.compile(r"\bapple\b|\bm[1-9]\b", re.IGNORECASE)),
    (
        Vendor.NVIDIA,
        re.compile(
            r"nvidia|geforce|\brtx\b|\bgtx\b|\btesla\b|\bquadro\b|\borin\b|\bjetson\b|\bgb10\b",
            re.IGNORECASE,
        ),
    ),
)


def vendor_of_name(name: str) -> Vendor | None:
    """The vendor a GPU's name states, or None where it states none."""
    for vendor, words in _VENDOR_WORDS:
        if words.search(name):
            return vendor
    return None


class WeightPath(str, Enum):
    """Which weights a decode kernel path reads: a mat-vec of dense weights (MUL_MAT) or of the
    routed experts a token picked (MUL_MAT_ID)."""

    ANY = "any"
    DENSE = "dense"
    EXPERTS = "experts"


@dataclass(frozen=True)
class KernelPath:
    """A decode kernel path of a backend on one vendor's GPUs (None: on every GPU the backend
    drives, where the backend's own rule picks the kernel whatever the vendor) that reaches a
    different share of the memory bus than the backend's decode_efficiency: the weight types it
    reads (ggml names; empty: every quantized type no other path of the vendor names), and the
    share of that efficiency it reaches. `source` names the llama.cpp lines that choose the
    path and `basis` the data the efficiency is fitted to, with its error."""

    vendor: Vendor | None
    types: frozenset[str]
    efficiency: float
    weights: WeightPath = WeightPath.ANY
    source: str = ""
    basis: str = ""

    def reads(self, ggml_type: str, expert: bool) -> bool:
        """Whether this path reads a weight of `ggml_type` (routed expert or not); an empty
        `types` reads the quantized types (not F32, F16, BF16)."""
        if self.weights is WeightPath.DENSE and expert:
            return False
        if self.weights is WeightPath.EXPERTS and not expert:
            return False
        if self.types:
            return ggml_type.upper() in self.types
        return ggml_type.upper() not in HALF_TYPES | {"F32"}

    def on(self, vendor: Vendor | None) -> bool:
        """Whether this path is taken on a GPU of `vendor` (None: a GPU whose name states no
        vendor, which only a path for every vendor reaches)."""
        return self.vendor is None or self.vendor is vendor


@dataclass(frozen=True)
class FixedCost:
    """A backend's decode graph on one vendor's GPUs costing `factor` times the CUDA-fitted
    fixed cost of its layers (SpeedParams' per-layer-kind times: the kernels' launches and
    small ops), where its dispatch differs (fusions or graph submission the backend disables
    on that vendor). `source` names the llama.cpp lines, `basis` the fitted data and error."""

    vendor: Vendor
    factor: float
    source: str = ""
    basis: str = ""
    # True: `factor` multiplies the fixed cost as scaled to the GPU's throughput (plan/speed.py:
    # the reference card's per-layer times x 142 / its TFLOPS, in part); False: it multiplies
    # the reference card's per-layer times as they are, the same on every GPU of the vendor (a
    # per-dispatch cost that does not shrink with more ALUs)
    throughput_scaled: bool = True


@dataclass(frozen=True)
class VendorTerms:
    """A backend's decode terms on one GPU (its vendor's KernelPaths and FixedCost factor, and
    whether the factor applies to the throughput-scaled cost: FixedCost.throughput_scaled)."""

    paths: tuple[KernelPath, ...] = ()
    fixed_factor: float = 1.0
    fixed_scaled: bool = True


NO_TERMS = VendorTerms()


def resolve_path(paths: tuple[KernelPath, ...], ggml_type: str, expert: bool) -> KernelPath | None:
    """The path among `paths` that reads a weight of `ggml_type`: one naming the type first
    (among those, one for routed experts or dense weights only before one for both: the op,
    MUL_MAT_ID or MUL_MAT, picks the kernel before the type does), else one for every quantized
    type; None: no path differs (decode_efficiency)."""
    named = [p for p in paths if p.types and p.reads(ggml_type, expert)]
    named.sort(key=lambda p: p.weights is WeightPath.ANY)  # stable: the module's order within
    generic = [p for p in paths if not p.types and p.reads(ggml_type, expert)]
    return next(iter(named or generic), None)


def path_efficiency(paths: tuple[KernelPath, ...], ggml_type: str, expert: bool) -> float:
    """The share of decode_efficiency a weight of `ggml_type` reaches among `paths` (1.0 where
    no path reads it)."""
    path = resolve_path(paths, ggml_type, expert)
    return path.efficiency if path is not None else 1.0


def weight_slowdown(
    paths: tuple[KernelPath, ...], type_bytes: tuple[tuple[str, bool, int], ...]
) -> float:
    """How much longer than at decode_efficiency a device takes to read weights of these
    (type, expert, bytes): the byte-weighted sum of 1 / path efficiency (1.0: no path differs)."""
    total = sum(n for _, _, n in type_bytes)
    if not paths or total <= 0:
        return 1.0
    return sum(n / max(path_efficiency(paths, t, e), 1e-6) for t, e, n in type_bytes) / total


class BackendKind(str, Enum):
    CUDA = "cuda"
    ROCM = "rocm"
    METAL = "metal"
    VULKAN = "vulkan"
    SYCL = "sycl"
    CPU = "cpu"


@dataclass(frozen=True, kw_only=True)
class Backend:
    """One ggml backend as llama.cpp builds it. A backend module states what differs from the
    usual: a device prefix other than its name (Metal's MTL), a host buffer not named
    `<name>_Host` (the CPU's), variables that order its devices, memory that is the host's."""

    kind: BackendKind
    label: str  # how quantpick names it in output: "CUDA", "ROCm", "Metal", ...
    # llama.cpp's device names are prefix + index (ggml_backend_dev_name): the backend's name
    # ("CUDA0", "ROCm0", "Vulkan0", "SYCL0") unless it says otherwise; older builds that printed
    # another spelling are listed in `legacy_prefixes` (parsing only).
    device_prefix: str = ""
    # The pinned host buffer type's name, an -ot target that means host memory: `<name>_Host`
    # for each GPU backend ("CUDA_Host", "ROCm_Host", "Vulkan_Host", "SYCL_Host", "Metal_Host").
    host_buffer: str = ""
    buffer: BufferRule  # how its device buffers size a tensor (model/ggml.py)
    # The variable that selects and orders this backend's devices (None: none exists), and
    # variables set whenever devices are named (CUDA_DEVICE_ORDER=PCI_BUS_ID).
    visibility_env: str | None
    order_env: tuple[tuple[str, str], ...] = ()
    # The GPUs this backend drives (Metal drives Apple GPUs only; Vulkan drives every vendor).
    vendors: tuple[Vendor, ...]
    # True: the device's memory is the host's (Metal on Apple Silicon); per device otherwise
    # (Gpu.unified, from the catalogue or the probe).
    always_unified: bool = False
    # Where llama.cpp's total and free for a device come from (docs/backends.md).
    memory_source: str
    # The fraction of the memory bus's bandwidth this backend's decode kernels reach, relative to
    # CUDA's (1.0), where published runs fit one (benchmarks/speed_accuracy.py).
    decode_efficiency: float = 1.0
    # Prompt processing relative to CUDA's compute-bound rate.
    prefill_efficiency: float = 1.0
    efficiency_source: str = "not fitted: the CUDA-calibrated model as it is"
    # Decode attention over the KV cache, where the backend's flash-attention decode kernel runs
    # each query head on its own (it reads and multiplies a shared KV head once per query head,
    # so its cost per cell of fill is the heads' arithmetic, 2 x n_head x (K + V head size)
    # FLOPs per layer, not the cache's bytes): the share of the catalogue's FP16 figure that
    # kernel reaches. None: the kernel packs the query heads of a KV head together (CUDA's
    # tensor-core kernels), the depth cost is the bytes read (SpeedParams.kv_depth_factor).
    decode_attention_efficiency: float | None = None
    # Decode mat-vec paths that differ from decode_efficiency on some vendor's GPUs (per weight
    # type: Vulkan's integer-dot path on Intel, SYCL's MXFP4 path); none: one efficiency for all.
    decode_paths: tuple[KernelPath, ...] = ()
    # Per-vendor factors on the decode graph's fixed cost per layer (FixedCost); none: 1.0.
    decode_fixed: tuple[FixedCost, ...] = ()
    legacy_prefixes: tuple[str, ...] = ()
    # The largest single buffer the driver allocates (None: no limit below the memory itself):
    # a tensor or compute buffer above it fails to allocate.
    max_alloc_bytes: int | None = None
    max_alloc_source: str = ""
    # The llama.cpp build option that enables it (docs, build hints).
    cmake_option: str = ""
    # Docker image suffix of ghcr.io/ggml-org/llama.cpp:server-<suffix> ("" = the CPU image).
    image_suffix: str = ""
    # How a container reaches the GPUs: a compose `deploy` device reservation with this driver,
    # which `container_runtime` provides on the host, else these device files passed through.
    container_gpu_driver: str | None = None
    container_runtime: str = ""
    container_devices: tuple[str, ...] = ()
    # How its graph lands in its compute buffer (plan/compute.py).
    compute: ComputeTraits = ComputeTraits()
    # How fast it runs a speculative verify batch relative to its own mat-vec decode
    # (plan/speculative.py; fitted where published runs exist, 1.0 otherwise).
    verify_efficiency: float = 1.0
    # What each decode call costs llama-server beyond the call itself once speculation is on: the
    # target's step, whether or not the round found a draft, and each draft step of a model or an
    # MTP head (plan/speculative.py round_speed); measured where a published run isolates it (an
    # n-gram lookup that found no draft), 0 otherwise.
    spec_step_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.device_prefix:
            object.__setattr__(self, "device_prefix", self.label)
        if not self.host_buffer:
            object.__setattr__(self, "host_buffer", f"{self.label}_Host")

    @property
    def key(self) -> str:
        return self.kind.value

    def device_name(self, index: int) -> str:
        """llama.cpp's name for this backend's device `index` ("ROCm1")."""
        return f"{self.device_prefix}{index}"

    def device_index(self, name: str) -> int | None:
        """The index in a device name of this backend ("MTL0" -> 0), or None."""
        for prefix in (self.device_prefix, *self.legacy_prefixes):
            m = re.fullmatch(re.escape(prefix) + r"(\d*)", name.strip(), re.IGNORECASE)
            if m:
                return int(m.group(1)) if m.group(1) else 0
        return None

    def terms_for(self, gpu_name: str) -> VendorTerms:
        """This backend's decode paths and fixed-cost factor on the GPU named `gpu_name` (its
        vendor read from the name); NO_TERMS where none differs from decode_efficiency."""
        vendor = vendor_of_name(gpu_name)
        fixed = next((f for f in self.decode_fixed if f.vendor is vendor), None)
        return VendorTerms(
            tuple(p for p in self.decode_paths if p.on(vendor)),
            fixed.factor if fixed is not None else 1.0,
            fixed.throughput_scaled if fixed is not None else True,
        )

    def drives(self, vendor: Vendor) -> bool:
        return vendor in self.vendors

    def visibility(self, indices: tuple[int, ...]) -> dict[str, str]:
        """The variables that make exactly `indices` visible, in that order (renumbered from 0)."""
        if self.visibility_env is None:
            return {}
        return {self.visibility_env: ",".join(str(i) for i in indices)}
