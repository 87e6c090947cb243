"""Decode and prefill speed: the bandwidth upper bound, and the speed to expect. Pure.

**Bound** (`decode_speed`): tokens/s <= efficiency / sum over devices (bytes read per token on the
device / its bandwidth). Bytes read per token: every dense weight on the device (attention,
DeltaNet, router, shared expert, output head), expert_used/expert_count of the routed experts, the
KV cache up to the current fill, and the recurrent state (read and written once per token).

**Expected** (`expected_speed`): what llama.cpp measures, which on fast GPUs is several times
below the bound. One token of decode costs, in seconds (`decode_seconds`):

    once           `token_fixed_ms` (graph launch, sync, logits copy);
    on each GPU    its share of `gpu_fixed_ms` (the minimum run time of ~1500 small kernels,
                   quoted for a 142-TFLOPS 3090-class card, x 142 / the card's TFLOPS), plus
                   bytes read / (bandwidth x
                   `gpu_bandwidth_efficiency`), plus the context-depth term: fill x f16-sized KV
                   bytes x `kv_depth_factor` / bandwidth, times `kv_quant_factor` when the KV cache
                   is quantized (on CUDA flash attention dequantizes it: slower at depth, not
                   faster);
    on the host    routed experts (or whole layers) kept in RAM: bytes / min(RAM bandwidth x
                   `host_bandwidth_efficiency`, cores x `host_core_bytes_per_s`);
    between them   `hop_ms` per change between a GPU and the host along the layers (an expert
                   layer in RAM is two), `gpu_hop_ms` per change from one GPU to the next;
    llama-server   `server_ms` per token for sampling over the 248K vocabulary and streaming.

Prefill of one ubatch (`prefill_seconds`) is compute-bound on a GPU: 2 x active parameters x tokens
/ (FP16 tensor TFLOPS x `gpu_compute_efficiency`), plus the weights read once per ubatch, the same
fixed cost, attention over the fill; routed experts in RAM cross PCIe once per ubatch (llama.cpp
copies host weights to the GPU for batches of 32 tokens or more) at `pcie_efficiency` of the link;
on the CPU it runs at `cpu_core_gflops` per core.

The constants in `SpeedParams` are fitted to published llama.cpp runs by `scripts/fit_speed.py`;
`benchmarks/speed_accuracy.py` prints predicted against measured for every usable run.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace

from quantpick.machine.spec import (
    ASSUMED_GPU_BANDWIDTH_BYTES_PER_S,
    ASSUMED_GPU_FP16_TFLOPS,
    ASSUMED_HOST_BANDWIDTH_BYTES_PER_S,
    ASSUMED_PCIE,
    Machine,
)
from quantpick.model.layout import INPUT_SLOT, ModelLayout
from quantpick.plan.memory import (
    Estimate,
    kv_bytes_per_cell_per_layer,
    recurrent_bytes_per_layer_per_row,
)

DEFAULT_HOST_BANDWIDTH = ASSUMED_HOST_BANDWIDTH_BYTES_PER_S
DEFAULT_GPU_BANDWIDTH = ASSUMED_GPU_BANDWIDTH_BYTES_PER_S
# PCIe throughput per lane after line coding, GB/s (PCI-SIG: 2.5/5/8/16/32 GT/s; 8b/10b for gen 1-2,
# 128b/130b from gen 3).
PCIE_LANE_BYTES_PER_S = {1: 250_000_000, 2: 500_000_000, 3: 984_615_384, 4: 1_969_230_769,
                         5: 3_938_461_538, 6: 7_876_923_077}  # fmt: skip
# The FP16 tensor TFLOPS the fixed cost is quoted at: an RTX 3090 (catalogue: 142.3).
REFERENCE_TFLOPS = 142.3
# Builds before this one decode qwen35moe with a larger fixed cost per token (the same RTX 4090 and
# file: ~107 tok/s on b8207, ~158 on b8720; benchmarks/data rows 77-88 vs 53-64). Semver-era
# builds report build 1 and are current.
RECENT_BUILD = 8700
# llama.cpp copies host-resident weights to the GPU for ops on batches this large or larger
# (ggml-cuda: GGML_OP_OFFLOAD_MIN_BATCH); below, the CPU computes them.
OP_OFFLOAD_MIN_BATCH = 32


# What the default SpeedParams rest on (benchmarks/speed_accuracy.py prints the figures).
FIT_BASIS = (
    "fitted to 128 published llama.cpp runs (12 sources, b8148-b9294 and later; RTX 4090, 5090, "
    "5070 Ti, 5060 Ti, 4070, 3080, RTX 4000 Ada, P40, GB10, CPU); in-sample median error 7% "
    "decode, 5% prefill"
)


@dataclass(frozen=True)
class SpeedParams:
    """The expected-speed model's constants. Defaults: the fit of `scripts/fit_speed.py` to the
    published llama.cpp runs in benchmarks/data/speed-measurements.json (builds b8700 and later,
    or scaled by `legacy_fixed_factor`); each comment names the rows that pin it down.

    Per-machine calibration (a measured bench): `calibrated(...)` returns a copy whose predictions
    are multiplied by measured / predicted; any field can also be replaced with
    `dataclasses.replace` (e.g. `gpu_fixed_ms` after timing an empty-context decode).
    """

    # Fixed cost per token (and per prefill ubatch), in two parts. The floor: graph launch,
    # synchronisation, the logits copy, the same on every card. Pinned by the fully-in-VRAM runs
    # (4090 rows 53-100, 5070 Ti / 5060 Ti 145-150, P40 27-33, RTX 4000 Ada 34-39, GB10 234),
    # where model size barely changes speed.
    token_fixed_ms: float = 3.03
    # The GPU part: the minimum run time of the ~1500 small kernels per token, inversely
    # proportional to the card's throughput; quoted for the whole model on a 142-TFLOPS
    # (3090-class) card and shared out by the layers each GPU holds. Same rows, across cards.
    gpu_fixed_ms: float = 2.04
    # Fraction of the data-sheet bandwidth weight streaming reaches. Fit: at its bound 1.0 (the
    # fixed costs carry the rest), so the expected speed never exceeds the bound.
    gpu_bandwidth_efficiency: float = 1.0
    # Decode cost of one token of fill per f16-sized KV byte, in units of bytes/bandwidth (flash
    # attention's decode kernel is not bandwidth-bound). 4090 f16 runs at 8K-49K depth (rows
    # 53-100: in-sample within ~10%), P40 q8_0 to 164K (rows 27-33).
    kv_depth_factor: float = 3.67
    # Extra factor on the depth cost with a quantized KV cache (q8_0, q4_0, ...), applied to the
    # f16-sized bytes: a quantized cache reads fewer bytes but dequantizes them, so it is never
    # faster at depth. Fit (P40, RTX 4000 Ada, 3080 q8_0 rows): 1.0, its lower bound: these runs
    # show q8_0 costing what f16 costs per token of fill, i.e. ~1.9x its own bytes.
    kv_quant_factor: float = 1.0
    # Fraction of the host's RAM bandwidth that routed experts in RAM are read at. Fit: at its
    # bound 0.85 (STREAM's share on desktop DDR4/5); the --n-cpu-moe rows mostly state no RAM
    # speed, so this multiplies the assumed 50 GB/s (3080, 5060 Ti, 4070 rows).
    host_bandwidth_efficiency: float = 0.85
    # Quantized weight bytes one CPU core multiplies per second (the core-count ceiling): the
    # 8-thread 3080 box and the CPU-only Sapphire Rapids run (row 208).
    host_core_bytes_per_s: float = 7.25e9
    # One change between a GPU and the host along the layers (copy of the activations, sync, a
    # graph split): the --n-cpu-moe sweeps (3080 rows 1-26: ~1 tok/s per layer moved).
    hop_ms: float = 0.077
    # One change from a GPU to the next in a layer split (a copy through the host, the next
    # GPU's graph launch): only the 5070 Ti + 5060 Ti runs (rows 139-144) measure it; held out,
    # the prior (0.5 ms) predicts them ~1.4x too fast.
    gpu_hop_ms: float = 1.82
    # llama-server's own cost per generated token (sampling over the 248K vocabulary,
    # detokenizing, streaming); 0 for llama-bench. The 4090 bench/server pairs (rows 53-112) and
    # the Windows 3080 server rows; expected_speed includes it (it predicts llama-server).
    server_ms: float = 1.90
    # Fraction of the card's FP16 tensor TFLOPS prefill reaches (256 small expert GEMMs per
    # layer): pp512/pp1024 of the 4090, 5090, 5070 Ti, 5060 Ti, RTX 4000 Ada, P40 (dp4a figure);
    # in-sample median error 5%.
    gpu_compute_efficiency: float = 0.114
    # Fraction of the PCIe link's throughput the per-ubatch copy of host experts reaches
    # (pageable, mmap'd weights): the 3080, 5060 Ti --n-cpu-moe and --fit prefill rows.
    pcie_efficiency: float = 0.477
    # Effective GFLOPS of one CPU core in prefill: one CPU-only run (row 208, AVX-512 Sapphire
    # Rapids, cores not stated: 8 assumed), so weakly pinned.
    cpu_core_gflops: float = 146.0
    # Builds before RECENT_BUILD: the fixed costs (GPU, floor, server) are this many times larger.
    # The same 4090 and files on b8148-b8396 vs b8720 (rows 53-112, one source).
    legacy_fixed_factor: float = 1.54
    # Calibration: measured / predicted, applied to the tokens/s (1.0 = uncalibrated).
    decode_scale: float = 1.0
    prefill_scale: float = 1.0
    basis: str = FIT_BASIS

    def calibrated(self, *, decode_ratio: float = 1.0, prefill_ratio: float = 1.0) -> SpeedParams:
        """A copy for one machine, corrected by measured / predicted tokens/s from a bench."""
        return replace(
            self,
            decode_scale=self.decode_scale * decode_ratio,
            prefill_scale=self.prefill_scale * prefill_ratio,
            basis=self.basis + f"; calibrated on this machine (decode x{decode_ratio:.2f}, "
            f"prefill x{prefill_ratio:.2f})",
        )

    def for_build(self, build: int | None) -> SpeedParams:
        """The parameters for a llama.cpp build number (None or semver-era 1: current)."""
        if not legacy_build(build):
            return self
        return replace(
            self,
            gpu_fixed_ms=self.gpu_fixed_ms * self.legacy_fixed_factor,
            token_fixed_ms=self.token_fixed_ms * self.legacy_fixed_factor,
            server_ms=self.server_ms * self.legacy_fixed_factor,
            basis=self.basis + f"; build b{build} (before b{RECENT_BUILD}: slower decode)",
        )


DEFAULT_SPEED_PARAMS = SpeedParams()


def legacy_build(build: int | None) -> bool:
    """A b-number before RECENT_BUILD (None and semver-era build 1 are current)."""
    return build is not None and 1 < build < RECENT_BUILD


@dataclass(frozen=True)
class DeviceSpeed:
    """What the speed model needs to know of one llama.cpp device, and which figures are assumed."""

    device: str  # "CUDA0", ..., "CPU"
    kind: str  # "gpu" | "host"
    bandwidth_bytes_per_s: int
    fp16_tflops: float | None = None  # GPU: dense FP16 tensor TFLOPS
    pcie_bytes_per_s: int | None = None  # GPU: its host link
    cores: int | None = None  # host: cores llama.cpp's threads run on
    bandwidth_assumed: bool = False
    compute_assumed: bool = False
    pcie_assumed: bool = False

    @property
    def assumed(self) -> tuple[str, ...]:
        return tuple(
            name
            for name, flag in (
                ("bandwidth", self.bandwidth_assumed),
                ("compute", self.compute_assumed),
                ("PCIe link", self.pcie_assumed),
            )
            if flag
        )


def pcie_bytes_per_s(generation: int, width: int) -> int:
    return PCIE_LANE_BYTES_PER_S.get(generation, PCIE_LANE_BYTES_PER_S[3]) * width


def device_speeds(machine: Machine) -> dict[str, DeviceSpeed]:
    """llama.cpp device name -> its speed figures, with the assumed ones marked."""
    devices: dict[str, DeviceSpeed] = {}
    for g in machine.gpus:
        link = (g.pcie_generation, g.pcie_width)
        known_link = link[0] is not None and link[1] is not None
        gen, width = link if known_link else ASSUMED_PCIE  # type: ignore[misc]
        devices[f"CUDA{g.index}"] = DeviceSpeed(
            device=f"CUDA{g.index}",
            kind="gpu",
            bandwidth_bytes_per_s=g.bandwidth_bytes_per_s or DEFAULT_GPU_BANDWIDTH,
            fp16_tflops=g.fp16_tflops if g.fp16_tflops is not None else ASSUMED_GPU_FP16_TFLOPS,
            pcie_bytes_per_s=pcie_bytes_per_s(gen, width),
            bandwidth_assumed=not g.bandwidth_bytes_per_s,
            compute_assumed=g.fp16_tflops is None,
            pcie_assumed=not known_link,
        )
    # RPC devices, named as llama-server names them with every worker in --rpc (the planner's
    # default). Their network link is charged by the worker's `network` (see rpc_hop_seconds).
    rpc_index = 0
    for worker in machine.rpc_workers:
        for g in worker.devices:
            name = f"RPC{rpc_index}"
            rpc_index += 1
            devices[name] = DeviceSpeed(
                device=name,
                kind="gpu",
                bandwidth_bytes_per_s=g.bandwidth_bytes_per_s or DEFAULT_GPU_BANDWIDTH,
                fp16_tflops=g.fp16_tflops if g.fp16_tflops is not None else ASSUMED_GPU_FP16_TFLOPS,
                pcie_bytes_per_s=pcie_bytes_per_s(*ASSUMED_PCIE),
                bandwidth_assumed=not g.bandwidth_bytes_per_s,
                compute_assumed=g.fp16_tflops is None,
                pcie_assumed=True,
            )
    host = machine.host
    devices["CPU"] = DeviceSpeed(
        device="CPU",
        kind="host",
        bandwidth_bytes_per_s=host.ram_bandwidth_bytes_per_s or DEFAULT_HOST_BANDWIDTH,
        cores=max(1, host.cpu_cores),
        bandwidth_assumed=not host.ram_bandwidth_bytes_per_s,
    )
    return devices


# ----------------------------------------------------------------------------------------------
# The bound.


@dataclass(frozen=True)
class DeviceTraffic:
    device: str
    bandwidth_bytes_per_s: int
    weight_bytes_per_token: int
    kv_bytes_per_token_at_target: int
    state_bytes_per_token: int


@dataclass(frozen=True)
class ExpectedSpeed:
    """Tokens/s to expect from llama-server, with the basis of the figures."""

    decode_tps_empty: float
    decode_tps_target: float  # with the KV cache filled to target_context
    prefill_tps: float  # a 512-token prompt (pp512-like) at an empty context, the plan's -ub
    target_context: int
    basis: str
    assumed: tuple[str, ...] = ()  # "CUDA1 bandwidth", ...: figures the machine did not tell


@dataclass(frozen=True)
class SpeedEstimate:
    tokens_per_s_empty: float  # decode upper bound with an empty context
    tokens_per_s_target: float  # ... with the KV cache filled to the target context
    target_context: int
    efficiency: float
    devices: tuple[DeviceTraffic, ...]
    bound: str = "upper bound: bandwidth / bytes read per token"
    expected: ExpectedSpeed | None = field(default=None, compare=False)


def decode_speed(
    layout: ModelLayout,
    estimate: Estimate,
    bandwidths: dict[str, int],
    *,
    target_context: int | None = None,
    efficiency: float = 1.0,
) -> SpeedEstimate:
    """The bound. `bandwidths` maps device name ("CUDA0", "CPU") to bytes/s."""
    arch = layout.architecture
    used_fraction = arch.expert_used_count / arch.expert_count if arch.expert_count else 1.0
    target = target_context if target_context is not None else estimate.n_ctx
    kv_cell = kv_bytes_per_cell_per_layer(
        layout, estimate.config.cache_type_k, estimate.config.cache_type_v
    )
    state_row = recurrent_bytes_per_layer_per_row(layout)
    slots = layout.slots
    host_name = estimate.host.device
    traffic: list[DeviceTraffic] = []
    seconds_empty = 0.0
    seconds_target = 0.0
    expert_host = set(estimate.host.expert_layers)
    for dev in estimate.devices:
        weights = 0
        for slot in dev.layers:
            sw = slots[slot]
            weights += sw.dense_bytes
            if slot not in expert_host or dev.device == host_name:
                weights += int(sw.expert_bytes * used_fraction)
        if dev.device == host_name:
            # experts of GPU layers kept in host memory are read from the host
            for slot in expert_host:
                if slot not in dev.layers:
                    weights += int(slots[slot].expert_bytes * used_fraction)
        kv_target = len(dev.attention_layers) * kv_cell * target
        state = 2 * len(dev.recurrent_layers) * state_row
        bw = bandwidths.get(dev.device) or (
            DEFAULT_HOST_BANDWIDTH if dev.kind == "host" else DEFAULT_GPU_BANDWIDTH
        )
        traffic.append(DeviceTraffic(dev.device, bw, weights, kv_target, state))
        seconds_empty += (weights + state) / bw
        seconds_target += (weights + state + kv_target) / bw
    return SpeedEstimate(
        tokens_per_s_empty=efficiency / seconds_empty if seconds_empty else 0.0,
        tokens_per_s_target=efficiency / seconds_target if seconds_target else 0.0,
        target_context=target,
        efficiency=efficiency,
        devices=tuple(traffic),
    )


# ----------------------------------------------------------------------------------------------
# The expected speed.


@dataclass(frozen=True)
class DeviceWork:
    """What one device does for one token (decode) or holds (prefill), from the estimate."""

    device: str
    kind: str
    slots: int  # layer slots whose dense part runs here
    decode_bytes: int  # weights read per decoded token + recurrent state read and written
    kv_depth_bytes: int  # f16-sized KV bytes read per token of fill (attention layers here)
    attention_layers: int
    flops_per_token: float  # 2 x parameters a prompt token multiplies here (no output head)
    resident_bytes: int  # weights stored here that a ubatch reads (no token embeddings)
    expert_resident_bytes: int  # ... of which routed experts


@dataclass(frozen=True)
class SpeedWork:
    """The per-device work of one configuration: the input of decode_ and prefill_seconds."""

    devices: tuple[DeviceWork, ...]
    transitions: int  # changes between a GPU and the host along the layers, per token / ubatch
    gpu_transitions: int  # changes from one GPU to another
    kv_quantized: bool
    n_slots: int
    attention_flops_per_token_per_fill: float  # per attention layer: 4 x heads x head_dim
    expert_used_fraction: float
    ubatch: int


def _slot_elements(layout: ModelLayout) -> tuple[list[int], list[int]]:
    """(dense, routed-expert) parameter counts per slot, the output head left out of dense."""
    cached = _ELEMENTS.get(id(layout))
    if cached is not None and cached[0]() is layout:
        return cached[1]
    dense = [0] * layout.n_slots
    expert = [0] * layout.n_slots
    for t in layout.tensors:
        slot = layout.slot_of(t.name)
        if slot == INPUT_SLOT or slot >= layout.n_slots or t.name.startswith("output."):
            continue
        n = 1
        for dim in t.shape:
            n *= dim
        if t.is_expert:
            expert[slot] += n
        else:
            dense[slot] += n
    key = id(layout)
    _ELEMENTS[key] = (weakref.ref(layout, lambda _ref: _ELEMENTS.pop(key, None)), (dense, expert))
    return dense, expert


# The planner asks for the speed of one layout hundreds of times: its parameter counts are kept
# while the layout lives.
_ELEMENTS: dict[int, tuple[weakref.ref[ModelLayout], tuple[list[int], list[int]]]] = {}


def speed_work(layout: ModelLayout, estimate: Estimate) -> SpeedWork:
    arch = layout.architecture
    config = estimate.config
    used = arch.expert_used_count / arch.expert_count if arch.expert_count else 1.0
    kv_cell_f16 = kv_bytes_per_cell_per_layer(layout, "f16", "f16")
    # one request decodes: one sequence's recurrent state is read and written per token
    state_row = recurrent_bytes_per_layer_per_row(layout)
    slots = layout.slots
    dense_el, expert_el = _slot_elements(layout)
    ubatch = max(1, min(config.ubatch, config.batch))
    # A ubatch touches this share of the routed experts (each token picks expert_used of them).
    touched = 1.0 - (1.0 - used) ** ubatch
    works: list[DeviceWork] = []
    dense_dev: dict[int, str] = {}
    expert_dev: dict[int, str] = {}
    for d in estimate.devices:
        for s in d.layers:
            dense_dev[s] = d.device
        for s in d.expert_layers:
            expert_dev[s] = d.device
        host_input = layout.input_bytes if d.kind == "host" else 0
        expert_resident = sum(slots[s].expert_bytes for s in d.expert_layers)
        works.append(
            DeviceWork(
                device=d.device,
                kind=d.kind,
                slots=len(d.layers),
                decode_bytes=sum(slots[s].dense_bytes for s in d.layers)
                + int(expert_resident * used)
                + 2 * len(d.recurrent_layers) * state_row,
                kv_depth_bytes=len(d.attention_layers) * kv_cell_f16,
                attention_layers=len(d.attention_layers),
                flops_per_token=2.0
                * (
                    sum(dense_el[s] for s in d.layers)
                    + used * sum(expert_el[s] for s in d.expert_layers)
                ),
                resident_bytes=max(0, d.weights_bytes - host_input - expert_resident)
                + int(expert_resident * touched),
                expert_resident_bytes=expert_resident,
            )
        )
    sequence: list[str] = []
    for s in range(layout.n_slots):
        if s in dense_dev:
            sequence.append(dense_dev[s])
        if s in expert_dev:
            sequence.append(expert_dev[s])
    pairs = [(a, b) for a, b in zip(sequence, sequence[1:], strict=False) if a != b]
    gpu_pairs = sum(1 for a, b in pairs if a != "CPU" and b != "CPU")
    return SpeedWork(
        devices=tuple(works),
        transitions=len(pairs) - gpu_pairs,
        gpu_transitions=gpu_pairs,
        kv_quantized=config.cache_type_k not in ("f16", "bf16", "f32")
        or config.cache_type_v not in ("f16", "bf16", "f32"),
        n_slots=max(1, len(dense_dev)),
        attention_flops_per_token_per_fill=4.0 * arch.head_count * arch.key_length,
        expert_used_fraction=used,
        ubatch=ubatch,
    )


def _gpu_fixed_seconds(dev: DeviceSpeed, params: SpeedParams) -> float:
    tflops = dev.fp16_tflops or ASSUMED_GPU_FP16_TFLOPS
    return params.gpu_fixed_ms * 1e-3 * REFERENCE_TFLOPS / tflops


def _hops(work: SpeedWork, params: SpeedParams) -> float:
    return 1e-3 * (params.hop_ms * work.transitions + params.gpu_hop_ms * work.gpu_transitions)


def _gpu_flops(dev: DeviceSpeed | None, params: SpeedParams) -> float:
    """FLOP/s prefill reaches on a GPU: its FP16 tensor TFLOPS x gpu_compute_efficiency."""
    tflops = (dev.fp16_tflops if dev is not None else None) or ASSUMED_GPU_FP16_TFLOPS
    return tflops * 1e12 * params.gpu_compute_efficiency


def _host_rate(dev: DeviceSpeed, params: SpeedParams) -> float:
    return min(
        dev.bandwidth_bytes_per_s * params.host_bandwidth_efficiency,
        (dev.cores or 1) * params.host_core_bytes_per_s,
    )


def decode_seconds(
    work: SpeedWork,
    devices: dict[str, DeviceSpeed],
    fill: int,
    params: SpeedParams = DEFAULT_SPEED_PARAMS,
    *,
    server: bool = True,
) -> float:
    """Seconds per decoded token with `fill` tokens in the KV cache."""
    seconds = _hops(work, params) + params.token_fixed_ms * 1e-3
    seconds += params.server_ms * 1e-3 if server else 0.0
    quant = params.kv_quant_factor if work.kv_quantized else 1.0
    for w in work.devices:
        dev = devices.get(w.device) or _fallback(w)
        if w.kind == "gpu":
            if w.slots:
                seconds += _gpu_fixed_seconds(dev, params) * w.slots / work.n_slots
            bw = dev.bandwidth_bytes_per_s * params.gpu_bandwidth_efficiency
            seconds += w.decode_bytes / bw
            seconds += fill * w.kv_depth_bytes * params.kv_depth_factor * quant / bw
        else:
            rate = _host_rate(dev, params)
            seconds += w.decode_bytes / rate
            seconds += fill * w.kv_depth_bytes * params.kv_depth_factor / rate
    return seconds


def prefill_seconds(
    work: SpeedWork,
    devices: dict[str, DeviceSpeed],
    fill: int = 0,
    params: SpeedParams = DEFAULT_SPEED_PARAMS,
    *,
    tokens: int | None = None,
) -> float:
    """Seconds for one ubatch of `tokens` prompt tokens (default the ubatch) after `fill`."""
    n = tokens or work.ubatch
    seconds = _hops(work, params) + params.token_fixed_ms * 1e-3
    gpus = [w for w in work.devices if w.kind == "gpu" and (w.slots or w.resident_bytes)]
    first_gpu = devices.get(gpus[0].device) if gpus else None
    attn = work.attention_flops_per_token_per_fill * (fill + n / 2) * n
    for w in work.devices:
        dev = devices.get(w.device) or _fallback(w)
        if w.kind == "gpu":
            if w.slots:
                seconds += _gpu_fixed_seconds(dev, params) * w.slots / work.n_slots
            flops = n * w.flops_per_token + attn * w.attention_layers
            seconds += flops / _gpu_flops(dev, params)
            seconds += w.resident_bytes / (
                dev.bandwidth_bytes_per_s * params.gpu_bandwidth_efficiency
            )
        elif first_gpu is not None and n >= OP_OFFLOAD_MIN_BATCH:
            # host weights cross PCIe once per ubatch; the first GPU multiplies them
            link = (
                first_gpu.pcie_bytes_per_s or pcie_bytes_per_s(*ASSUMED_PCIE)
            ) * params.pcie_efficiency
            seconds += w.resident_bytes / link
            flops = n * w.flops_per_token + attn * w.attention_layers
            seconds += flops / _gpu_flops(first_gpu, params)
        else:
            flops = n * w.flops_per_token + attn * w.attention_layers
            seconds += flops / ((dev.cores or 1) * params.cpu_core_gflops * 1e9)
            seconds += w.resident_bytes / (
                dev.bandwidth_bytes_per_s * params.host_bandwidth_efficiency
            )
    return seconds


def _fallback(w: DeviceWork) -> DeviceSpeed:
    if w.kind == "gpu":
        return DeviceSpeed(w.device, "gpu", DEFAULT_GPU_BANDWIDTH, ASSUMED_GPU_FP16_TFLOPS,
                           pcie_bytes_per_s(*ASSUMED_PCIE), None, True, True, True)  # fmt: skip
    return DeviceSpeed(w.device, "host", DEFAULT_HOST_BANDWIDTH, cores=1, bandwidth_assumed=True)


PREFILL_PROMPT_TOKENS = 512  # the pp512 of llama-bench


def expected_speed(
    layout: ModelLayout,
    estimate: Estimate,
    devices: dict[str, DeviceSpeed],
    *,
    target_context: int,
    params: SpeedParams = DEFAULT_SPEED_PARAMS,
) -> ExpectedSpeed:
    """Expected llama-server decode tokens/s (empty and at `target_context` fill) and prefill
    tokens/s (a 512-token prompt at an empty context)."""
    work = speed_work(layout, estimate)
    empty = decode_seconds(work, devices, 0, params)
    target = decode_seconds(work, devices, target_context, params)
    tokens = min(work.ubatch, PREFILL_PROMPT_TOKENS)
    # a 512-token prompt in ubatches of `tokens`
    n_ub = -(-PREFILL_PROMPT_TOKENS // tokens)
    prefill = n_ub * prefill_seconds(work, devices, 0, params, tokens=tokens)
    used = {w.device for w in work.devices if w.slots or w.decode_bytes or w.resident_bytes}
    assumed = tuple(
        f"{name} {what}" for name, dev in devices.items() if name in used for what in dev.assumed
    )
    basis = params.basis + (f"; assumed: {', '.join(assumed)}" if assumed else "")
    return ExpectedSpeed(
        decode_tps_empty=params.decode_scale / empty,
        decode_tps_target=params.decode_scale / target,
        prefill_tps=params.prefill_scale * PREFILL_PROMPT_TOKENS / prefill,
        target_context=target_context,
        basis=basis,
        assumed=assumed,
    )
