"""Decode and prefill speed: the bandwidth upper bound, and the speed to expect. Pure.

Any architecture: what a token reads and runs comes from the per-layer view (`layout.view`) and
the layer slots' bytes and parameters (`layout.slots`, `layout.slot_elements`): a dense model
reads every weight per token, a MoE layer its dense part (attention, shared expert, router) and
expert_used / expert_count of its routed experts (leading dense blocks have none), a tied output
head token_embd's rows; attention reads its KV cache to the fill (a sliding-window layer at most
n_swa cells, an MLA layer its K-only cache) and a recurrent layer its state.

**Bound** (`decode_speed`): tokens/s <= efficiency / sum over devices (bytes read per token on the
device / its bandwidth): those weights, the KV cache up to the current fill, and the recurrent
state (read and written once per token).

**Expected** (`expected_speed`): what llama.cpp measures, which on fast GPUs is several times
below the bound. One token of decode costs, in seconds (`decode_seconds`):

    once           `token_fixed_ms` (graph launch, sync, logits copy);
    on each GPU    the fixed cost of the layers it runs, by kind (`LayerKinds`: attention and
                   recurrent token mixers, MoE and dense feed-forward parts, `*_layer_ms` each,
                   quoted for a 142-TFLOPS 3090-class card: `layer_host_share` of it as is, the
                   rest x 142 / the card's TFLOPS), `no_graph_factor` times more when llama.cpp
                   runs the card without CUDA graphs (compute capability below 7.0, i.e. Pascal;
                   below 8.0 on builds before Volta/Turing got them), plus bytes read /
                   (bandwidth x `gpu_bandwidth_efficiency`), plus the context-depth term: fill x
                   f16-sized KV bytes x `kv_depth_factor` / bandwidth, times `kv_quant_factor`
                   when the KV cache is quantized (on CUDA flash attention dequantizes it: slower
                   at depth, never faster), or the heads' FLOPs over the fill where the
                   backend's kernel runs each query head alone (`attention_depth_seconds`);
    on the host    routed experts (or whole layers) kept in RAM: bytes / min(RAM bandwidth x
                   `host_bandwidth_efficiency`, cores x `host_core_bytes_per_s`);
    between them   `hop_ms` per change between a GPU and the host along the layers (an expert
                   layer in RAM is two), `gpu_hop_ms` per change from one GPU to the next;
    the network    for llama.cpp RPC workers (`rpc_seconds`): each run of layers on a worker's
                   device is one synchronous exchange: a round trip, the activations in and out,
                   the KQ mask its attention layers need, the logits when it holds the output;
    llama-server   `server_ms` per token for sampling and streaming (quoted for a 248K
                   vocabulary, scaled by the model's).

Prefill of one ubatch (`prefill_seconds`) is compute-bound on a GPU: 2 x parameters x tokens /
(FP16 tensor TFLOPS x `gemm_efficiency`: a dense matmul sees the ubatch, a routed expert the
ubatch's tokens that pick it, on a lower ceiling; FP4 experts on Blackwell run on its FP4 tensor
cores), the weights streamed once per MMQ tile of tokens, flash attention over the fill at
`attention_compute_efficiency`, the same fixed cost; weights in RAM cross PCIe once per ubatch
(llama.cpp copies host weights to the GPU for batches of 32 tokens or more; of the routed
experts only those the ubatch's tokens picked, as the family routes them:
`offload_copy_bytes`, speed_work.ROUTING_RUN_TOKENS) at `pcie_efficiency` of the link; on
the CPU it runs at `cpu_core_gflops` per core; RPC stages exchange the ubatch's activations and
mask over the network.

The constants in `SpeedParams` are fitted to published llama.cpp runs of ten architectures by
`scripts/fit_speed.py`; `benchmarks/speed_accuracy.py` prints predicted against measured for
every usable run, in-sample and on rows the fit did not see (other rows, other sources, other
architectures). The network terms have no fitted constant: they are bytes and round trips of
llama.cpp's RPC protocol over the link the machine describes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from quantpick.machine.backends import NO_TERMS, VendorTerms, backend_of, weight_slowdown
from quantpick.machine.spec import (
    ASSUMED_GPU_FP16_TFLOPS,
    ASSUMED_PCIE,
    DEFAULT_RPC_BANDWIDTH,
    DEFAULT_RPC_RTT_S,
    Machine,
)
from quantpick.model.layout import ModelLayout
from quantpick.plan.bandwidth_bound import (
    DEFAULT_GPU_BANDWIDTH,
    DEFAULT_HOST_BANDWIDTH,
    ExpectedSpeed,
    filled,
)
from quantpick.plan.memory import Estimate
from quantpick.plan.speed_work import DeviceWork, LayerKinds, SpeedWork, speed_work, touched_share

# PCIe throughput per lane after line coding, GB/s (PCI-SIG: 2.5/5/8/16/32 GT/s; 8b/10b for gen 1-2,
# 128b/130b from gen 3).
PCIE_LANE_BYTES_PER_S = {1: 250_000_000, 2: 500_000_000, 3: 984_615_384, 4: 1_969_230_769,
                         5: 3_938_461_538, 6: 7_876_923_077}  # fmt: skip
# The FP16 tensor TFLOPS the fixed cost is quoted at: an RTX 3090 (catalogue: 142.3).
REFERENCE_TFLOPS = 142.3
# The vocabulary llama-server's per-token cost is quoted for: qwen35moe's (the rows that fit it).
SERVER_VOCAB = 248320
# Builds before this one decode qwen35moe with a larger fixed cost per token (the same RTX 4090 and
# file: ~107 tok/s on b8207, ~158 on b8720; benchmarks/data rows 77-88 vs 53-64), carried by its
# recurrent (DeltaNet) layers. Semver-era builds report build 1 and are current.
RECENT_BUILD = 8700
# CUDA graphs (one launch for the whole decode graph instead of one per kernel): llama.cpp turns
# them off below compute capability 7.0, i.e. on Pascal (ggml-cuda.cu:4426 at b11312,
# ggml_cuda_graph_set_enabled: `cc < GGML_CUDA_CC_VOLTA`; llama.cpp PR #27721, open, measures
# +40-78% decode on a GTX 1080 with them on). Volta and Turing (7.0, 7.5: V100, T4, RTX 20xx) got
# them with PR #25749, merged 2026-07-16 (commit 3f08ef2); before it the gate was 8.0. That
# build is not recorded where we can read it: b9601 was released 2026-06-12 and b10107 on
# 07-25, so b10000 (within ~50 builds by date).
GRAPHS_MIN_CC = 7.0
GRAPHS_MIN_CC_BEFORE_TURING = 8.0
TURING_GRAPHS_BUILD = 10000
# MMQ's SRAM tile spans this many prompt tokens at most: each tile of a ubatch's tokens streams the
# whole weight matrix again (ggml-cuda/mmq-config-ampere.cuh and -blackwell.cuh at b11312: J up
# to 128; mmq-config-pascal-dp4a.cuh: 64).
MMQ_TILE_TOKENS = 128
MMQ_TILE_TOKENS_PASCAL = 64
FP4_MMA_SPEEDUP = 2.0
BLACKWELL_CC = 12.0
# Pascal has no tensor cores: flash attention runs on its FP32 units, a quarter of the dp4a-based
# figure the catalogue gives it (Tesla P40: 11.8 FP32 TFLOPS against 47).
PASCAL_FA_RATE = 0.25
# llama.cpp copies host-resident weights to the GPU for ops on batches this large or larger
# (ggml-cuda: GGML_OP_OFFLOAD_MIN_BATCH); below, the CPU computes them.
OP_OFFLOAD_MIN_BATCH = 32
# The KV cells attention reads (and the KQ mask covers): the used cells rounded up to 256
# (src/llama-kv-cache.cpp:1265-1270 at b11312, get_n_kv: max(n_pad, 256)).
KV_CELL_PAD = 256
# Activations and logits cross devices as f32 (the residual stream, n_embd per token; the logits,
# n_vocab per output row).
F32_BYTES = 4


# What the default SpeedParams rest on (benchmarks/speed_accuracy.py prints the figures).
FIT_BASIS = (
    "fitted to 182 published llama.cpp runs of 10 architectures (14 sources, b7941-b10970; RTX "
    "4090, 5090, 5070 Ti, 5060 Ti, 4070, 3080, RTX 4000 Ada, P40, GB10, CPU); median error on "
    "rows the fit did not see 6% decode, 13% prefill (5-fold), 18% / 20% with each source held "
    "out, 12% / 17% with each architecture held out"
)


@dataclass(frozen=True)
class SpeedParams:
    """The expected-speed model's constants. Defaults: the fit of `scripts/fit_speed.py` to the
    published llama.cpp runs in benchmarks/data/speed-measurements.json (builds b8700 and later,
    or scaled by `legacy_fixed_factor`); each comment names the rows that pin it down and the
    in-sample error of those rows (`python scripts/fit_speed.py` prints both).

    Per-machine calibration (a measured bench): `calibrated(...)` returns a copy whose predictions
    are multiplied by measured / predicted; any field can also be replaced with
    `dataclasses.replace` (e.g. `token_fixed_ms` after timing an empty-context decode).
    """

    # Fixed cost per token (and per prefill ubatch). The floor: graph launch, synchronisation,
    # the logits copy, the same on every card and model. Pinned against the per-layer costs
    # below by the fully-in-VRAM runs of many depths of graph on one card: GB10 rows 247-276 (6
    # architectures, decode median error 7%), the 5070 Ti / 5060 Ti rows 139-150 and 277-298
    # (6 architectures, 5%), the 4090 rows 53-112 (5%), RTX 4000 Ada 34-39, P40 27-33 (3%).
    token_fixed_ms: float = 0.746
    # The decode graph's small kernels, per layer by what the layer runs: a token mixer (an
    # attention layer, a recurrent one: DeltaNet, Mamba) and a feed-forward part (routed
    # experts with their router and shared expert, or a dense FFN), quoted on a 142-TFLOPS
    # (3090-class) card. Same rows: dense transformers (llama, qwen2, gemma3; decode median
    # error 4-11%), MoE transformers (qwen3moe, gpt-oss, deepseek2: 6-12%), the hybrids
    # (qwen35 dense 2%, qwen35moe 5%, qwen3next 15%, too fast: its 512-expert layers cost
    # more than a MoE layer of 128-256).
    attention_layer_ms: float = 0.0332
    recurrent_layer_ms: float = 0.0876
    moe_layer_ms: float = 0.0339
    ffn_layer_ms: float = 0.0205
    # The share of those per-layer costs that does not scale with the card's throughput (the
    # host building and launching the graph); the rest scales as 142 / the card's TFLOPS. The
    # 5090 rows (174, 299-300: 419 TFLOPS) against the GB10's (125) and the 3080's (119):
    # without it a 5090 decodes Llama-3.1-8B 1.24x too slow.
    layer_host_share: float = 0.674
    # Without CUDA graphs each of the decode graph's kernels is launched on its own (see
    # GRAPHS_MIN_CC): this many times the layers' fixed cost more per token (in proportion to
    # the kernels). Only the P40 rows (27-33, one source; decode median error 3%) run without
    # them; prior 1.5 (PR #27721's GTX 1080: 10 ms per token saved on a smaller MoE).
    no_graph_factor: float = 1.55
    # Fraction of the data-sheet bandwidth weight streaming reaches. Fit: at its bound 1.0 (the
    # fixed costs carry the rest), so the expected speed never exceeds the bound.
    gpu_bandwidth_efficiency: float = 1.0
    # Decode cost of one token of fill per f16-sized KV byte, in units of bytes/bandwidth (flash
    # attention's decode kernel is not bandwidth-bound; MLA and sliding-window layers count the
    # bytes they read: a K-only cache, at most n_swa cells). 4090 f16 runs at 8K-49K depth (rows
    # 53-112), the GB10 f16 series to 32K of 6 architectures (247-276, decode median error 7%;
    # the GB10 asks for less than the 4090: its series decay 5-10% slower than predicted),
    # P40 q8_0 to 164K (rows 27-33, 3%).
    kv_depth_factor: float = 1.74
    # Extra factor on the depth cost with a quantized KV cache (q8_0, q4_0, ...), applied to the
    # f16-sized bytes: a quantized cache reads fewer bytes but dequantizes them, so it is never
    # faster at depth (lower bound 1, a hard property). Fit: 1.73: the q8_0 depth series (P40
    # rows 27-33, RTX 4000 Ada 34-39, 3080 1-26) against the f16 ones (4090 rows 53-112, GB10
    # 247-276) put q8_0 at ~1.7x f16's cost per token of fill, ~3.2x its own bytes. The 3090
    # figures of the notes (-3% at 32K with f16, -17% with q8_0) would ask for ~5x, but no row
    # measures a 3090.
    kv_quant_factor: float = 1.73
    # Fraction of the host's RAM bandwidth that routed experts in RAM are read at. Fit: at its
    # bound 0.85 (STREAM's share on desktop DDR4/5); the --n-cpu-moe rows mostly state no RAM
    # speed, so this multiplies the assumed 50 GB/s (3080 rows 1-26, decode median error 5%;
    # 5060 Ti 47-52 and 120-123, 9-10%; 4070 231, 14%).
    host_bandwidth_efficiency: float = 0.85
    # Quantized weight bytes one CPU core multiplies per second (the core-count ceiling): the
    # 6- and 8-thread offload boxes (jon's 5060 Ti rows 47-52, the 3080 rows) and the CPU-only
    # Sapphire Rapids run (row 208, decode 17% slow).
    host_core_bytes_per_s: float = 7.08e9
    # One change between a GPU and the host along the layers (copy of the activations, sync, a
    # graph split): the --n-cpu-moe sweeps (3080 rows 1-26: ~1 tok/s per layer moved).
    hop_ms: float = 0.102
    # One change from a GPU to the next in a layer split (a copy through the host, the next
    # GPU's graph launch; an RPC device pays it too, the network on top): only the 5070 Ti +
    # 5060 Ti runs (rows 139-144 and 277-298, one source, 6 architectures; decode median error
    # 5%) measure it; held out, the prior (0.5 ms) predicts them ~1.2x too fast.
    gpu_hop_ms: float = 2.75
    # llama-server's own cost per generated token (sampling, detokenizing, streaming), quoted
    # for the 248K vocabulary (SERVER_VOCAB) and scaled by the model's; 0 for llama-bench. The
    # 4090 llama-bench / llama-benchy pairs (rows 53-112) and the Windows 3080 server rows;
    # expected_speed includes it (it predicts llama-server).
    server_ms: float = 1.38
    # Prefill's matmuls: the fraction of the card's tensor TFLOPS (catalogue: half the dense
    # INT8 rate MMQ runs at) a matmul reaches once its tiles fill, rising as
    # tokens / (tokens + gemm_half_tokens) with the prompt tokens per weight matrix: a dense
    # matmul sees the whole ubatch, each routed expert about ubatch x used / experts tokens (16
    # for qwen35moe at -ub 512, 64 for gpt-oss-20b). The routed experts' matmul (tokens gathered
    # per expert, one launch over all of them) has its own, lower ceiling; FP4 experts run on
    # Blackwell's FP4 tensor cores (FP4_MMA_SPEEDUP). Besides the multiplications the weights
    # stream once per MMQ tile of 128 tokens (MMQ_TILE_TOKENS), a large part of the GB10's
    # prefill at -ub 2048 (273 GB/s). Dense: GB10 qwen2 / gemma3 rows (262-271), qwen35 and gemma3
    # on the 5070 Ti / 5060 Ti (277-285, 297-298; prefill median error 7-12%); experts: the
    # qwen35moe rows (12%), qwen3moe (21%), gpt-oss (4%), deepseek2 (8%), qwen3next (29%, too
    # slow: its 512 experts see 10 tokens each).
    gpu_compute_efficiency: float = 0.640
    expert_compute_efficiency: float = 0.194
    gemm_half_tokens: float = 44.0
    # Fraction of the tensor TFLOPS flash attention reaches in prefill (QK^T and AV over the
    # fill, 2 x heads x (K + V head size) per token pair; on Pascal a quarter of the rate,
    # PASCAL_FA_RATE): the depth series' prompt figures, 4090 rows 53-112 (to 49K), GB10
    # 247-276 (to 32K: deepseek2's MLA prefill falls 4x from 0 to 32K), P40 27-33 (to 164K).
    # The two disagree: the GB10's series (6 architectures) reach 0.35-0.5 of its figure, the
    # 4090's qwen35moe series ~0.1 of its own, so the fit predicts the 4090's prompts past 32K
    # up to 1.7x too fast (rows 91-112) and the GB10's slightly slow.
    attention_compute_efficiency: float = 0.356
    # Fraction of the PCIe link's throughput the per-ubatch copy of host experts reaches
    # (pageable, mmap'd weights): the 3080 (4%), 5060 Ti --n-cpu-moe and --fit (10-25%) prefill
    # rows, with each family's routing (docs/speed.md; 0.435 with independent picks for all).
    pcie_efficiency: float = 0.428
    # Effective GFLOPS of one CPU core in prefill: one CPU-only run (row 208, AVX-512 Sapphire
    # Rapids, cores not stated: 8 assumed; 1%), near the prior of 120 (mainline llama.cpp on a
    # Ryzen 7950X, see scripts/fit_speed.py).
    cpu_core_gflops: float = 149.0
    # Builds before RECENT_BUILD: a recurrent layer's fixed cost is this many times larger (the
    # DeltaNet kernels llama.cpp rewrote for qwen35moe). The same 4090 and files on
    # b8148-b8396 vs b8720 (rows 53-112, one source; 5%); held out, nothing else measures it.
    # The other parts of the graph did not move: the GB10 rows of b7941 (247-276, no
    # recurrent layer) fit as current builds (decode median error 7%).
    legacy_fixed_factor: float = 2.05
    # The lowest compute capability llama.cpp runs CUDA graphs on (GRAPHS_MIN_CC; for_build
    # raises it for builds before TURING_GRAPHS_BUILD). From the source, not fitted.
    graphs_min_cc: float = GRAPHS_MIN_CC
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
        params = self
        if build is not None and 1 < build < TURING_GRAPHS_BUILD:
            params = replace(
                params, graphs_min_cc=max(params.graphs_min_cc, GRAPHS_MIN_CC_BEFORE_TURING)
            )
        if not legacy_build(build):
            return params
        return replace(
            params,
            recurrent_layer_ms=params.recurrent_layer_ms * params.legacy_fixed_factor,
            basis=params.basis + f"; build b{build} (before b{RECENT_BUILD}: slower recurrent "
            "layers)",
        )


DEFAULT_SPEED_PARAMS = SpeedParams()


def legacy_build(build: int | None) -> bool:
    """A b-number before RECENT_BUILD (None and semver-era build 1 are current)."""
    return build is not None and 1 < build < RECENT_BUILD


@dataclass(frozen=True)
class DeviceSpeed:
    """What the speed model needs to know of one llama.cpp device, and which figures are assumed."""

    device: str  # "CUDA0", ..., "RPC0", "CPU"
    kind: str  # "gpu" | "host"
    bandwidth_bytes_per_s: int
    fp16_tflops: float | None = None  # GPU: dense FP16 tensor TFLOPS
    pcie_bytes_per_s: int | None = None  # GPU: its host link
    cores: int | None = None  # host: cores llama.cpp's threads run on
    bandwidth_assumed: bool = False
    compute_assumed: bool = False
    pcie_assumed: bool = False
    compute_capability: str | None = None  # GPU: "8.6" (None: unknown, taken as current)
    # An RPC device: its worker's "host:port", its position there, its link (machine.spec.Network)
    endpoint: str | None = None
    worker_position: int | None = None
    network_bytes_per_s: int | None = None
    network_rtt_s: float | None = None
    network_assumed: bool = False  # the link's figures are quantpick's defaults (1 GbE)
    # GPU: per-head decode attention FLOP/s (Backend.decode_attention_efficiency x FP16), or None
    attention_flops_per_s: float | None = None
    terms: VendorTerms = NO_TERMS  # GPU: its backend's decode terms on its vendor (per weight type)

    @property
    def assumed(self) -> tuple[str, ...]:
        return tuple(
            name
            for name, flag in (
                ("bandwidth", self.bandwidth_assumed),
                ("compute", self.compute_assumed),
                ("PCIe link", self.pcie_assumed and self.endpoint is None),
                ("network", self.network_assumed),
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
        gen, width = ASSUMED_PCIE
        # A unified GPU has no link to cross: host-resident weights are in its own memory.
        known_link = (link[0] is not None and link[1] is not None) or g.unified
        if link[0] is not None and link[1] is not None:
            gen, width = link[0], link[1]
        # The backend's kernels reach a share of what CUDA's reach on the same bus and ALUs
        # (machine/backends: decode_efficiency, prefill_efficiency, each with its source).
        backend = backend_of(g.backend)
        name = backend.device_name(g.index)
        bandwidth = g.bandwidth_bytes_per_s or DEFAULT_GPU_BANDWIDTH
        tflops = g.fp16_tflops if g.fp16_tflops is not None else ASSUMED_GPU_FP16_TFLOPS
        attention = backend.decode_attention_efficiency
        devices[name] = DeviceSpeed(
            device=name,
            kind="gpu",
            bandwidth_bytes_per_s=int(bandwidth * backend.decode_efficiency),
            fp16_tflops=tflops * backend.prefill_efficiency,
            pcie_bytes_per_s=bandwidth if g.unified else pcie_bytes_per_s(gen, width),
            bandwidth_assumed=not g.bandwidth_bytes_per_s,
            compute_assumed=g.fp16_tflops is None,
            pcie_assumed=not known_link,
            compute_capability=g.compute_capability,
            attention_flops_per_s=tflops * 1e12 * attention if attention is not None else None,
            terms=backend.terms_for(g.name),
        )
    # RPC devices, named as llama-server names them with every worker in --rpc (the planner's
    # default); speed_work finds a device of an Estimate by its worker and position, so a plan
    # that leaves a worker out (and so renumbers the rest) still gets its own figures.
    rpc_index = 0
    for worker in machine.rpc_workers:
        for position, g in enumerate(worker.devices):
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
                compute_capability=g.compute_capability,
                endpoint=worker.endpoint,
                worker_position=position,
                network_bytes_per_s=worker.network.bandwidth_bytes_per_s,
                network_rtt_s=worker.network.rtt_s,
                network_assumed=worker.network.bandwidth_source.startswith("default")
                or worker.network.rtt_source.startswith("default"),
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


# ----------------------------------------------------------------------------------------------
# The expected speed.


def _cc(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def cuda_graphs(dev: DeviceSpeed, params: SpeedParams = DEFAULT_SPEED_PARAMS) -> bool:
    """Whether llama.cpp decodes on this GPU with CUDA graphs (an unknown card: yes)."""
    cc = _cc(dev.compute_capability)
    return cc is None or cc >= params.graphs_min_cc


def layer_fixed_ms(kinds: LayerKinds, params: SpeedParams) -> float:
    """The decode graph's fixed cost of these layers on the reference card, in ms."""
    return (
        kinds.attention * params.attention_layer_ms
        + kinds.recurrent * params.recurrent_layer_ms
        + kinds.moe * params.moe_layer_ms
        + kinds.ffn * params.ffn_layer_ms
    )


def _gpu_fixed_seconds(
    kinds: LayerKinds, dev: DeviceSpeed, params: SpeedParams, *, decode: bool = True
) -> float:
    """The fixed cost of a GPU's layers, scaled from the reference card by its throughput (not
    in decode where VendorTerms.fixed_scaled is off); in decode plus the kernels' own launches
    without CUDA graphs (in proportion to them; prefill launches each once per ubatch anyway)."""
    ms, share = layer_fixed_ms(kinds, params), params.layer_host_share
    scale = share + (1.0 - share) * REFERENCE_TFLOPS / (dev.fp16_tflops or ASSUMED_GPU_FP16_TFLOPS)
    seconds = ms * 1e-3 * (scale if dev.terms.fixed_scaled or not decode else 1.0)
    if decode and not cuda_graphs(dev, params):
        seconds += params.no_graph_factor * ms * 1e-3
    return seconds * dev.terms.fixed_factor if decode else seconds


def gemm_efficiency(tokens: float, params: SpeedParams, *, experts: bool = False) -> float:
    """Fraction of the tensor TFLOPS a quantized matmul reaches with `tokens` rows (prompt
    tokens per weight matrix): rising to its ceiling as the kernel's tiles fill, half of it at
    gemm_half_tokens. The routed experts' matmul (tokens gathered per expert, one launch over
    all of them) has its own, lower ceiling."""
    ceiling = params.expert_compute_efficiency if experts else params.gpu_compute_efficiency
    return ceiling * tokens / (tokens + params.gemm_half_tokens)


def _fp4_speedup(dev: DeviceSpeed, work: SpeedWork) -> float:
    """How much faster the routed experts multiply on this GPU for their FP4 share."""
    cc = _cc(dev.compute_capability)
    if cc is None or not BLACKWELL_CC <= cc < BLACKWELL_CC + 1 or not work.fp4_expert_share:
        return 1.0
    share = work.fp4_expert_share
    return 1.0 / ((1.0 - share) + share / FP4_MMA_SPEEDUP)


def _fa_rate(dev: DeviceSpeed) -> float:
    """Flash attention's FLOP rate relative to the card's tensor figure: a quarter on Pascal."""
    cc = _cc(dev.compute_capability)
    return PASCAL_FA_RATE if cc is not None and cc < 7.0 else 1.0


def _mmq_tile(dev: DeviceSpeed) -> int:
    cc = _cc(dev.compute_capability)
    return MMQ_TILE_TOKENS_PASCAL if cc is not None and cc < 7.0 else MMQ_TILE_TOKENS


def _window(fill: float, n_swa: int) -> float:
    return min(fill, n_swa) if n_swa else fill


def _hops(work: SpeedWork, params: SpeedParams) -> float:
    return 1e-3 * (params.hop_ms * work.transitions + params.gpu_hop_ms * work.gpu_transitions)


def _gpu_flops(dev: DeviceSpeed | None) -> float:
    """A GPU's FP16 tensor FLOP/s (the data sheet's; gemm_efficiency says how much a matmul
    reaches)."""
    tflops = (dev.fp16_tflops if dev is not None else None) or ASSUMED_GPU_FP16_TFLOPS
    return tflops * 1e12


def _host_rate(dev: DeviceSpeed, params: SpeedParams) -> float:
    return min(
        dev.bandwidth_bytes_per_s * params.host_bandwidth_efficiency,
        (dev.cores or 1) * params.host_core_bytes_per_s,
    )


def _lookup(devices: dict[str, DeviceSpeed]):  # type: ignore[no-untyped-def]
    """DeviceWork -> its DeviceSpeed: an RPC device by its worker and position on it (the
    Estimate numbers RPC devices over the workers it uses), a local one by name."""
    by_worker = {
        (d.endpoint, d.worker_position): d for d in devices.values() if d.endpoint is not None
    }

    def find(w: DeviceWork) -> DeviceSpeed:
        if w.endpoint is not None:
            found = by_worker.get((w.endpoint, w.worker_position))
            if found is not None:
                return found
        return devices.get(w.device) or _fallback(w)

    return find


def _link(endpoint: str, devices: dict[str, DeviceSpeed]) -> tuple[float, float]:
    """(bytes/s, round trip s) of the link to an RPC worker (the machine's defaults if unknown)."""
    for d in devices.values():
        if d.endpoint == endpoint and d.network_bytes_per_s:
            rtt = d.network_rtt_s if d.network_rtt_s is not None else DEFAULT_RPC_RTT_S
            return float(d.network_bytes_per_s), rtt
    return float(DEFAULT_RPC_BANDWIDTH), DEFAULT_RPC_RTT_S


def kv_cells(fill: int) -> int:
    """KV cells attention covers with `fill` tokens in the cache (llama.cpp get_n_kv)."""
    return max(KV_CELL_PAD, -(-fill // KV_CELL_PAD) * KV_CELL_PAD)


def rpc_seconds(
    work: SpeedWork, devices: dict[str, DeviceSpeed], fill: int, tokens: int = 1, outputs: int = 1
) -> float:
    """Seconds one ubatch of `tokens` (decode: 1) spends on the network to RPC workers, with
    `fill` tokens already in the cache and `outputs` rows of logits wanted.

    Per stage (a run of layers on one RPC device): one round trip (the head's GET_TENSOR waits
    for the worker), the activations in (tokens x n_embd x 4 B, unless they come from a device
    of the same worker), the KQ mask the device's attention layers read (n_kv x tokens x 2 B with
    flash attention: 512 KiB per token at 262144 filled), and the activations or, for the output
    layer, the logits (outputs x n_vocab x 4 B) back.
    """
    if not work.rpc_stages:
        return 0.0
    activations = tokens * work.n_embd * F32_BYTES
    mask = kv_cells(fill + tokens) * tokens * work.mask_bytes
    logits = outputs * work.n_vocab * F32_BYTES
    seconds = 0.0
    for stage in work.rpc_stages:
        bandwidth, rtt = _link(stage.endpoint, devices)
        sent = (activations if stage.receives else 0) + (mask if stage.mask else 0)
        back = {"logits": logits, "activations": activations}.get(stage.returns, 0)
        seconds += rtt + (sent + back) / bandwidth
    return seconds


def load_seconds(work: SpeedWork, devices: dict[str, DeviceSpeed]) -> float:
    """The one-time transfer of the RPC devices' weights at load: bytes / link bandwidth, one
    tensor after the other (llama.cpp's loader sets tensors sequentially; a worker started with
    `-c` keeps a tensor cache, and a warm cache sends hashes instead: SET_TENSOR_HASH)."""
    seconds = 0.0
    for w in work.devices:
        if w.endpoint is not None and w.weights_bytes:
            bandwidth, _rtt = _link(w.endpoint, devices)
            seconds += w.weights_bytes / bandwidth
    return seconds


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
    if server:
        seconds += params.server_ms * 1e-3 * work.n_vocab / SERVER_VOCAB if work.n_vocab else 0.0
    seconds += rpc_seconds(work, devices, fill)
    quant = params.kv_quant_factor if work.kv_quantized else 1.0
    find = _lookup(devices)
    for w in work.devices:
        dev = find(w)
        if w.kind == "gpu":
            seconds += _gpu_fixed_seconds(w.layer_kinds, dev, params)
            bw = dev.bandwidth_bytes_per_s * params.gpu_bandwidth_efficiency
            seconds += w.decode_bytes * weight_slowdown(dev.terms.paths, w.decode_type_bytes) / bw
            kv_factor = params.kv_depth_factor * quant
            seconds += attention_depth_seconds(w, dev, fill, work.n_swa, bw, kv_factor)
        else:  # the CPU backend: the bytes, at the host's rate, no quantized-cache factor
            rate = _host_rate(dev, params)
            seconds += w.decode_bytes / rate
            seconds += attention_depth_seconds(
                w, dev, fill, work.n_swa, rate, params.kv_depth_factor
            )
    return seconds


def attention_depth_seconds(
    w: DeviceWork, dev: DeviceSpeed, fill: int, n_swa: int, bandwidth: float, kv_factor: float
) -> float:
    """Seconds a decoded token attends over `fill` cells on `w`'s device: its f16-sized KV bytes
    x `kv_factor` at `bandwidth`, or, where the backend's decode kernel runs each query head on
    its own (`DeviceSpeed.attention_flops_per_s`), the heads' FLOPs over the cells if slower."""
    seconds = filled(fill, w.kv_window_bytes, w.kv_depth_bytes, n_swa) * kv_factor / bandwidth
    if dev.attention_flops_per_s:
        flops = filled(fill, w.attention_flops_window, w.attention_flops_full, n_swa)
        seconds = max(seconds, flops / dev.attention_flops_per_s)
    return seconds


def verify_seconds(
    work: SpeedWork,
    devices: dict[str, DeviceSpeed],
    fill: int,
    tokens: int,
    params: SpeedParams = DEFAULT_SPEED_PARAMS,
    *,
    token_share: float = 0.0,
    efficiency: float = 1.0,
    server: bool = True,
) -> float:
    """Seconds for one speculative verify batch of `tokens` tokens (the drafts plus the last
    accepted one) after `fill`: one decode step, plus what the extra rows add. Each MoE layer
    reads the experts `tokens` tokens pick (1 - (1 - used)^tokens of them, not `used`); each
    extra row costs `token_share` of the step's weight streaming and of its pass over the KV
    cache (the quantized mat-vec kernels take a few rows at one pass over the weights, ggml-cuda
    mmvq up to 8; the flash-attention decode kernels a few query columns at one pass over K and
    V). `efficiency` < 1 slows that extra part (a backend whose small-batch kernels are slower
    than its mat-vec ones)."""
    seconds = decode_seconds(work, devices, fill, params, server=server)
    if tokens <= 1:
        return seconds
    used = work.expert_used_fraction
    touched = 1.0 - (1.0 - used) ** tokens if used < 1.0 else 1.0
    quant = params.kv_quant_factor if work.kv_quantized else 1.0
    find = _lookup(devices)
    extra = 0.0
    for w in work.devices:
        dev = find(w)
        if w.kind == "gpu":
            rate = dev.bandwidth_bytes_per_s * params.gpu_bandwidth_efficiency
        else:
            rate = _host_rate(dev, params)
        kv_factor = params.kv_depth_factor * quant
        depth_s = attention_depth_seconds(w, dev, fill, work.n_swa, rate, kv_factor)
        extra += w.expert_resident_bytes * max(0.0, touched - used) / rate
        extra += (tokens - 1) * token_share * w.decode_bytes / rate
        extra += (tokens - 1) * token_share * depth_s
    return seconds + extra / max(efficiency, 1e-6)


def layers_seconds(
    work: SpeedWork,
    devices: dict[str, DeviceSpeed],
    slots: dict[str, tuple[LayerKinds, int]],
    params: SpeedParams = DEFAULT_SPEED_PARAMS,
) -> float:
    """Seconds of one token through a few layers only (an MTP draft step: the NextN block and
    the output head): the token's fixed cost, each GPU's fixed cost of its `LayerKinds`, and
    the bytes read there. `slots`: device -> (its layers' kinds, the bytes they read)."""
    seconds = params.token_fixed_ms * 1e-3
    find = _lookup(devices)
    for w in work.devices:
        if w.device not in slots:
            continue
        kinds, nbytes = slots[w.device]
        dev = find(w)
        if w.kind == "gpu":
            seconds += _gpu_fixed_seconds(kinds, dev, params)
            seconds += nbytes / (dev.bandwidth_bytes_per_s * params.gpu_bandwidth_efficiency)
        else:
            seconds += nbytes / _host_rate(dev, params)
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
    seconds += rpc_seconds(work, devices, fill, tokens=n)
    find = _lookup(devices)
    gpus = [w for w in work.devices if w.kind == "gpu" and (w.slots or w.resident_bytes)]
    first_gpu = find(gpus[0]) if gpus else None
    # the dense matmuls see all n tokens; each touched expert about n x used / touched of them
    expert_tokens = min(float(n), work.expert_tokens * n / work.ubatch) if work.ubatch else n
    dense_eff = gemm_efficiency(n, params)
    expert_eff = gemm_efficiency(max(expert_tokens, 1.0), params, experts=True)
    # each prompt token attends over the fill plus half the ubatch on average; a sliding-window
    # layer over at most n_swa of them
    span = fill + n / 2
    for w in work.devices:
        dev = find(w)
        window = _window(span, work.n_swa)
        attn = n * (w.attention_flops_full * span + w.attention_flops_window * window)
        dense_flops = n * (w.flops_per_token - w.expert_flops_per_token)
        expert_flops = n * w.expert_flops_per_token
        if w.kind == "gpu":
            seconds += _gpu_fixed_seconds(w.layer_kinds, dev, params, decode=False)
            peak = _gpu_flops(dev)
            seconds += dense_flops / (peak * dense_eff)
            seconds += attn / (peak * params.attention_compute_efficiency * _fa_rate(dev))
            seconds += expert_flops / (peak * expert_eff * _fp4_speedup(dev, work))
            # the weights stream once per MMQ tile of tokens (the experts: per tile of the tokens
            # each one sees), beside the multiplications rather than hidden under them
            tile = _mmq_tile(dev)
            streamed = (w.resident_bytes - w.expert_read_bytes) * -(-n // tile) + (
                w.expert_read_bytes * -(-max(1, round(expert_tokens)) // tile)
            )
            seconds += streamed / (dev.bandwidth_bytes_per_s * params.gpu_bandwidth_efficiency)
        elif first_gpu is not None and n >= OP_OFFLOAD_MIN_BATCH:
            # host weights cross PCIe once per ubatch, the routed experts only those the ubatch's
            # tokens picked; the first GPU multiplies them
            link = (
                first_gpu.pcie_bytes_per_s or pcie_bytes_per_s(*ASSUMED_PCIE)
            ) * params.pcie_efficiency
            seconds += offload_copy_bytes(w, work, n) / link
            peak = _gpu_flops(first_gpu)
            seconds += dense_flops / (peak * dense_eff)
            seconds += expert_flops / (peak * expert_eff * _fp4_speedup(first_gpu, work))
            # attention has no weights to offload: it runs where the layer's KV cache is
            cpu_flops = (dev.cores or 1) * params.cpu_core_gflops * 1e9
            seconds += attn / cpu_flops
        else:
            flops = dense_flops + expert_flops + attn
            seconds += flops / ((dev.cores or 1) * params.cpu_core_gflops * 1e9)
            seconds += w.resident_bytes / (
                dev.bandwidth_bytes_per_s * params.host_bandwidth_efficiency
            )
    return seconds


def offload_copy_bytes(w: DeviceWork, work: SpeedWork, tokens: int) -> float:
    """Bytes of host-resident weights a ubatch of `tokens` copies to the GPU that multiplies
    them (llama.cpp's op offload): every dense weight, and of each routed-expert tensor only the
    experts the ubatch's tokens picked (ggml-backend.cpp:1709-1797 at b11312: "copying only
    the experts that are used", from the ids of the MUL_MAT_ID), as the model routes them
    (speed_work.touched_share with the work's routing_run_tokens)."""
    dense = max(0, w.resident_bytes - w.expert_read_bytes)
    touched = touched_share(work.expert_used_fraction, tokens, work.routing_run_tokens)
    return dense + w.expert_resident_bytes * touched


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
    # a 512-token prompt in ubatches of `tokens`; llama-server wants the last token's logits
    n_ub = -(-PREFILL_PROMPT_TOKENS // tokens)
    prefill = sum(
        prefill_seconds(work, devices, i * tokens, params, tokens=tokens) for i in range(n_ub)
    )
    used = {w.device for w in work.devices if w.slots or w.decode_bytes or w.resident_bytes}
    assumed = tuple(
        f"{name} {what}" for name, dev in devices.items() if name in used for what in dev.assumed
    )
    basis = params.basis + (f"; assumed: {', '.join(assumed)}" if assumed else "")
    if work.rpc_stages:
        basis += "; RPC: network round trips, activations, KQ mask and logits per token"
    return ExpectedSpeed(
        decode_tps_empty=params.decode_scale / empty,
        decode_tps_target=params.decode_scale / target,
        prefill_tps=params.prefill_scale * PREFILL_PROMPT_TOKENS / prefill,
        target_context=target_context,
        basis=basis,
        assumed=assumed,
        load_seconds=load_seconds(work, devices),
        network_ms_target=1e3 * rpc_seconds(work, devices, target_context),
    )
