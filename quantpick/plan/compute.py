"""Compute buffers as llama.cpp's graph allocator sizes them: a peak over the graph, not a sum.

Pure. llama.cpp reserves each backend's compute buffer with `ggml_gallocr`
(ggml/src/ggml-alloc.c at b11312): it walks the graph in execution order, frees a tensor after
its last consumer ran (`ggml_gallocr_free_node`, :691, called at :813-817) and keeps the highest
offset used (`chunk->max_size`, :304). So tensors alive at different times share bytes, and a
device's buffer is the largest live set of the part of the graph that runs on it. This module
models that as a max over phases of the graph, each phase with the tensors alive in it (bytes;
E = one ubatch of the residual stream, n_ubatch x n_embd x 4):

- inputs: the KQ masks (n_kv x n_ubatch per attention kind; f16 with flash attention since PR
  #23764, f32 without: src/llama-graph.cpp:29-46) and the token embeddings (E, on the host);
- a layer: the mask, the residual stream and the layer's temporaries (attention, FFN or MoE, in
  units of E, fitted per architecture: `GraphRule`), plus what the architecture's own graph keeps
  alive there (its family module's `GraphTrait`, quantpick/arch/graph.py: a sparse indexer's
  selection masks, ...); without flash attention the KQ matrix
  (n_kv x n_ubatch x n_head x 4 B) and its f32 mask (src/llama-graph.cpp:2690-2700);
- routed experts computed on the host (--n-cpu-moe / -ot): 2E + 3 x the experts' intermediate
  (gate, up, their product: n_ubatch x n_expert_used x n_ff_exp x 4 B) + their outputs
  (n_ubatch x n_expert_used x n_embd x 4 B);
- the output: the logits, n_vocab x rows x 4 B with rows = min(n_ubatch, n_outputs_max) as the
  build reserves them (src/llama-context.cpp:670), beside the normed last hidden state; above
  the last layer's live set where the allocator's free list keeps that layer's freed blocks
  apart from its last block (a zero-byte free block: `state_rows_fence`);
- op offload (a GPU backend only): a matmul whose weight lives in host memory runs on the first
  GPU for batches >= 32 (ggml-backend.cpp:972; ggml-cuda.cu:5654, default at :5825); the weight
  is an input of that split, copied into the GPU's compute buffer and freed after
  (ggml-backend.cpp:1311-1411): one weight tensor at a time, also when the GPU holds no layer.
- ops a backend refuses: the scheduler asks each backend's supports_op and gives an op it
  refuses to the CPU backend (ggml-backend.cpp:888-900, 961-981). A backend whose supports_op
  refuses any tensor above the device's largest (machine/backends ComputeTraits.ops_capped: the
  Vulkan backend's maxStorageBufferRange, ggml-vulkan.cpp:15307-15328) leaves the logits of a
  large vocabulary, a layer's attention whose Q, output or no-FA KQ matrix is over the cap, and
  the matmuls over weights kept in host memory for their size to the host: those phases are the
  host's (`DeviceGraph.output_elsewhere`, `attn_elsewhere`); the device keeps what it hands over
  and gets back (`attn_handoff`, `attn_back`), split inputs (`returned`; the host's: what it
  receives), which with pipeline parallelism are copied 4 times and alive for the whole graph.
  Each backend's traits (its op offload batch, that cap, whether flash attention's f16 copy of a
  quantized cache is in the graph) live in its machine/backends module, with their llama.cpp
  lines.

With pipeline parallelism (several devices, every layer offloaded, no tensor overrides:
src/llama-context.cpp:430-435) the inputs of each split become graph leafs copied
GGML_SCHED_MAX_COPIES = 4 times (ggml-backend.cpp:772, :1379-1411), alive for the whole graph.

The coefficients are fitted (scripts/fit_compute.py) on llama.cpp b11312's own projections on the
CPU backend, directly and behind RPC (tests/data/arch-real, arch-real-compute.json.gz,
llamacpp-archs.json.gz), and checked by benchmarks/arch_real_accuracy.py and arch_accuracy.py. The
GPU backend's rule adds op offload and flash attention's f16 copy of a quantized cache, checked
against public CUDA logs (tests/data/cuda-logs.json, benchmarks/cuda_logs_accuracy.py). Each
device's figure carries its expected error (`ComputeAccuracy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from quantpick.arch.base import AttentionKind, LayerView
from quantpick.arch.graph import ArchLive
from quantpick.model.ggml import CPU_BUFFER, pad
from quantpick.model.layout import ModelLayout
from quantpick.plan.graph_rules import GraphRule

MiB = 1024**2

# GGML_SCHED_MAX_COPIES (ggml/src/ggml-backend.cpp:772): input copies with pipeline parallelism.
PIPELINE_COPIES = 4

# The expected error's floor: small buffers are off by a few MiB of the allocator's alignment and
# fragmentation whatever their size.
EXPECTED_ERROR_FLOOR = 16 * MiB


class ComputeBackend(str, Enum):
    """How a device's backend allocates its graph: the CPU backend (also behind an RPC worker that
    serves its CPU), or a GPU backend (CUDA and kin) with op offload and a pinned `*_Host` input
    buffer. machine/backends' Backend maps onto these two (plan/memory.py backend_kind)."""

    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True)
class ComputeAccuracy:
    """How far a compute figure is expected to be from what llama.cpp reserves: within
    max(relative x the figure, floor_bytes)."""

    estimated: bool  # True: no recorded llama.cpp projection checks this backend/architecture
    relative: float
    floor_bytes: int
    basis: str  # one line: what the expected error was measured on


# llama.cpp b11312's projection on the CPU backend (directly and behind RPC), every recorded device
# row of tests/data/arch-real (1560 rows, 16 real configs) and tests/data/llamacpp-archs.json.gz
# (2323 rows, 128 models): 99.7% and 99.7% within max(5%, 16 MiB) (benchmarks/arch_*accuracy.py).
MEASURED = ComputeAccuracy(
    False, 0.05, EXPECTED_ERROR_FLOOR, "llama.cpp b11312's allocator on the CPU backend"
)
# A GPU backend: the CPU backend's phases plus op offload; public CUDA logs of qwen35moe
# (tests/data/cuda-logs.json, benchmarks/cuda_logs_accuracy.py) within 15%.
GPU_ESTIMATE = ComputeAccuracy(True, 0.15, EXPECTED_ERROR_FLOOR, "public GPU-backend logs")
# An architecture without a module checked against llama.cpp, or a build older than the cap
# (PR #23861): the generic rule, not checked; the worst recorded fitted-rule row is 25% off.
UNCHECKED = ComputeAccuracy(True, 0.25, EXPECTED_ERROR_FLOOR, "the generic rule, unchecked")


def accuracy(
    backend: ComputeBackend, checked: bool, gpu: ComputeAccuracy = GPU_ESTIMATE
) -> ComputeAccuracy:
    """The expected error of a device's compute figure: `checked` when the architecture's rule
    and the build's rule are the ones recorded projections check; `gpu`: a GPU backend's own
    (machine/backends ComputeTraits.expected_error, via gpu_accuracy)."""
    if not checked:
        return UNCHECKED
    return MEASURED if backend is ComputeBackend.CPU else gpu


def gpu_accuracy(relative: float, basis: str) -> ComputeAccuracy:
    """A GPU backend's expected error (ComputeTraits.expected_error and error_basis): an estimate,
    at least the generic GPU rule's."""
    return ComputeAccuracy(True, max(relative, GPU_ESTIMATE.relative), EXPECTED_ERROR_FLOOR, basis)


def within(ours: int, theirs: int, acc: ComputeAccuracy = MEASURED) -> bool:
    """`ours` is within `acc`'s expected error of llama.cpp's `theirs` (bytes)."""
    return abs(ours - theirs) <= max(acc.relative * theirs, acc.floor_bytes)


def accuracy_legend(items: list[ComputeAccuracy]) -> str:
    """One line for a device table: what the compute column's figures are expected to be off by,
    an asterisk marking the estimates."""
    parts: list[str] = []
    for acc in dict.fromkeys(items):
        mark = "* " if acc.estimated else ""
        parts.append(
            f"{mark}compute within max({acc.relative:.0%}, {acc.floor_bytes // MiB} MiB) "
            f"({acc.basis})"
        )
    return "; ".join(parts)


@dataclass(frozen=True)
class GraphShape:
    """The model's and the configuration's sizes every phase is built from (bytes)."""

    e: int  # n_ubatch x n_embd x 4: one ubatch of the residual stream
    ffn: int  # n_ubatch x widest dense FFN x 4 (0: none)
    moe_mid: int  # n_ubatch x n_expert_used x n_ff_exp x 4 (0: no routed experts)
    moe_out: int  # n_ubatch x n_expert_used x n_embd x 4
    logits: int  # n_vocab x logits rows x 4
    ubatch: int
    # per-layer token embeddings (gemma3n, gemma4: get_rows of per_layer_token_embd on the host,
    # n_ubatch x its width x 4, an input of every block)
    per_layer: int = 0
    # the dense FFN has a gate (gate, up and their GLU product: three blocks); without one (an
    # activation of the up result: relu, sqr, gelu as unary ops) the activation reuses the up
    # result's block in place (ggml_op_can_inplace, ggml/src/ggml-alloc.c:22-46, :632-680): one
    ffn_gated: bool = True


@dataclass(frozen=True)
class DeviceGraph:
    """The part of the graph one device runs, as the allocator sees it."""

    backend: ComputeBackend
    is_host: bool  # the CPU backend of the machine running llama.cpp (inputs live there)
    holds_layers: bool  # computes at least one block
    holds_output: bool  # computes the output head (the logits)
    mask_f16: int  # its KQ masks with flash attention (bytes)
    mask_f32: int  # its KQ masks without (bytes)
    kq: int  # the widest no-FA KQ matrix of its layers (0 with flash attention)
    flash_attn: bool
    # without flash attention: the V cache's element indices of each cache its layers write
    # (n_ubatch x n_embd_v_gqa_max x 8 B; src/llama-kv-cache.cpp:1435-1439), a graph input
    # alive beside the masks (an allocator trace of the lavapipe build: mistral-small-24b's
    # 4 MiB attn_inp_v_idxs right above the token embeddings, to the last layer)
    v_idxs: int = 0
    # its layers' no-FA KQ matrix runs on the host (its backend refuses a tensor that large:
    # ComputeTraits.ops_capped); the host's DeviceGraph carries that KQ in `kq`
    attn_elsewhere: bool = False
    attn_back: int = 0  # the largest attention output it gets back from the host
    attn_q_elsewhere: bool = False  # ... because its Q is above the cap
    attn_handoff: int = 0  # the largest Q it hands to the host + the projection it came from
    # it holds the output layer, but the head's matmul runs on the host (its backend refuses the
    # head's weight or the logits: ComputeTraits.ops_capped); the host's DeviceGraph holds_output
    output_elsewhere: bool = False
    # what its layers get back from ops the host ran for them (ComputeTraits.ops_capped: a KQ's
    # attention output, routed experts' outputs), summed over its layers: split inputs, which
    # with pipeline parallelism are leafs with `copies` copies alive for the whole graph
    returned: int = 0
    # one layer's gate and up results of routed experts the host computed, added to biases here
    # (gpt-oss: ffn_*_exps.bias live with the device's layer: src/llama-graph.cpp build_moe_ffn
    # adds them after each expert matmul), alive in its layer beside the experts' outputs
    experts_back: int = 0
    host_experts: bool = False  # computes routed experts held in host memory
    offload_weight: int = 0  # op offload: the largest host-resident weight copied in (GPU only)
    # -ngl partial offload on a backend whose traits give the host layers' own phases
    # (ComputeTraits.host_layer_weight_share; None: the weight copy is added to a layer's live set,
    # the larger of it and a host layer's K and V): the host layers run on this device but for
    # their cache writes, so they are phases of their own beside its layers: a layer's live set
    # with `offload_weight_share` x the copied weight, and the K and V of a host layer's flash
    # attention (`offload_kv`, split inputs) beside the mask and `offload_kv_e` x E
    offload_weight_share: float | None = None
    offload_kv: int = 0
    offload_kv_e: float = 0.0
    # the largest gated FFN's copied up weight of a host layer, where it is smaller than the FFN's
    # intermediate (n_ubatch x n_ff x 4 B): the gated product cannot take the freed copy's block
    # and lands above the gate and up results (0: none)
    offload_ffn_up: int = 0
    # every host layer is an attention layer (none recurrent: their own op sequences differ)
    offload_plain: bool = False
    copies: int = 1  # PIPELINE_COPIES with pipeline parallelism
    # K and V of another device's cache that layers here attend over (a shared KV cache, gemma3n
    # and gemma4): split inputs copied in (ggml-backend.cpp:1514-1531)
    remote_kv: int = 0
    # the same, once per layer that reads it: the scheduler copies each layer's view of the
    # shared cache as its own split input (ggml_backend_sched_split_graph keys input copies by
    # tensor, ggml-backend.cpp:1311-1411), and the inputs of a split are allocated before its
    # first node: without flash attention the KQ matrix of the split's last full-attention layer
    # does not fit in the copies freed before it and lands above all of them
    remote_kv_views: int = 0
    # what the architecture's graph keeps alive beyond these phases (its family module's
    # GraphTrait, quantpick/arch/graph.py): on a device running its attention layers, or only its
    # inputs on the host that sets them
    arch_live: ArchLive = ArchLive()
    # a GPU backend's flash attention converts a quantized K and V of one layer to f16 inside the
    # op's own allocation (ggml-cuda.cu:903-907, ggml-cuda/fattn.cu:722-756): n_kv x width x 2 B
    kv_convert: int = 0
    # holds routed experts of its layers (False: they live in host memory, -ot exps=CPU /
    # --n-cpu-moe, and this device's layers run only their dense part)
    experts: bool = True
    # the logits land above the last layer's live set, not beside the residual stream: a
    # zero-byte free block keeps the last layer's freed FFN blocks apart from the last block
    # (state_rows_fence)
    logits_above_layer: bool = False
    # Q + K + V of its widest flash-attention layer whose output (n_head x head_dim_v) is
    # narrower than the residual stream (gemma-3-27b 4096 < 5376, mistral-small-24b 4096 <
    # 5120), on a backend whose traits say the FFN lands above them (ComputeTraits
    # .narrow_attn_above). An allocator trace of the lavapipe build (gemma-3-27b, one device,
    # -fa on): the output projection's result (E) fits none of the blocks the attention freed
    # (ggml-alloc.c:211-224, best fit; the attention's output and the normed Q are smaller), so
    # it lands at the top of the attention's high-water mark -- the norm (E), Q, K and V above
    # the inputs -- and the FFN's gate, up and product above it: E + mask + (E + Q + K + V) + 3
    # x the FFN = 168.52 MiB, llama.cpp's (the generic rule: 152.5)
    attn_narrow: int = 0
    # its share of the model's blocks (the per-layer inputs its layers take: gemma3n, gemma4)
    layer_share: float = 1.0
    # the high-water mark of the host layers it runs by op offload, where they fit one of the
    # templates of plan/host_layers.py and plan/hybrid_layers.py: their op sequence scheduled and
    # allocated as llama.cpp does (exact on the lavapipe oracle's 44 such rows). It replaces the
    # fitted host-layer phases (offload_weight_share, offload_kv_e), which
    # describe the same sequence (0: none or not that template)
    host_layers_peak: int = 0


def state_rows_fence(ubatch: int, n_seq: int, state_r: int, state_s: int) -> bool:
    """Whether llama.cpp's allocator leaves a zero-byte free block between the last layer's freed
    FFN temporaries and the last free block of the host's buffer, so that the logits land above
    the last layer's live set instead of just above the residual stream.

    A recurrent layer copies its states with `build_rs` (src/llama-graph.cpp:3512-3545): the rows
    of the ubatch's sequences (`output_states`, n_seq x state_r x 4 B) and the extra states,
    n_rs - n_seqs = 0 rows in the reserved graph (n_seqs = n_seq_max): a zero-byte tensor. Where
    the state's rows are exactly the size of the token ids' slot (n_ubatch x 4 B padded to the
    buffer's alignment), the best fit (ggml-alloc.c:211-224) fills that freed slot and removes
    it (:266-269); the zero-byte tensor then lands at the start of the large free block, where
    the state copy's 4-byte input (`rs_s_copy`) sits below it, and after that input's free grew
    the block over it, freeing zero bytes joins no block and is inserted as a block of size 0
    (:333-348, :135-150). Later allocations move the large block past it (:264), and the free of
    the last layer's FFN temporaries merges only with a block's neighbours in the array
    (:318-345): the zero-size block keeps them apart from the last block, and the logits,
    larger than any other free block, start where the last block starts (:226-247): above the
    last layer's FFN, or above the masks when they reach higher.

    Measured on llama-memory-bytes: LFM2-1.2B at -ub 4089-4096 1565-1568 MiB where 1086 at 4088
    (tests/plan/test_compute_fence.py: 24 configurations around the windows, worst -3.1%).

    Only for layers with a single state (a short convolution, state_s == 0): with two states
    (Mamba-2, gated delta nets) the second state's copy takes the zero-byte tensor's place
    (measured: nemotron-h-8b, qwen3.5-27b, qwen3-next-80b-a3b at the ubatch where their first
    state's rows fill the slot, no jump)."""
    if state_r <= 0 or state_s:
        return False
    # the allocator pads every size to the buffer's alignment (ggml/src/ggml-alloc.c:203, :313)
    slot = pad(ubatch * 4, CPU_BUFFER.alignment)
    return n_seq * state_r * 4 == slot


def v_cache_indices(
    layers: Sequence[LayerView], writer: Sequence[int], host: int, ubatch: int
) -> list[int]:
    """Bytes of the V cache's element indices on each device (`host` the last), without flash
    attention: the V cache is transposed and written element by element, one I64 index per token
    and V element of each cache (each sub-cache of an iSWA one), n_ubatch x n_embd_v_gqa_max x
    8 B (src/llama-kv-cache.cpp:1435-1439): a graph input alive to the last layer writing it, on
    the host that sets it and on each device whose layers write that cache (`writer`: each
    layer's device, -1 for none)."""
    widest: dict[AttentionKind, int] = {}
    writes: list[set[AttentionKind]] = [set() for _ in range(host + 1)]
    for lv, pos in zip(layers, writer, strict=True):
        if lv.kv:
            widest[lv.attention] = max(widest.get(lv.attention, 0), lv.v_width)
            if pos >= 0:
                writes[pos].add(lv.attention)
    writes[host] = set(widest)
    return [sum(ubatch * widest[k] * 8 for k in w) for w in writes]


def graph_shape(layout: ModelLayout, ubatch: int, logits_rows: int) -> GraphShape:
    """The sizes of `layout`'s graph for one ubatch of `ubatch` tokens: the widest dense FFN
    (ffn_up / ffn_gate rows) and the routed experts' intermediate (ffn_up_exps rows, or half of a
    fused ffn_gate_up_exps) x n_expert_used, read from the tensor shapes."""
    view = layout.view
    ffn, n_ff_exp, per_layer = layout.ffn_widths
    used = max(view.expert_used_count, 1) if n_ff_exp else 0
    return GraphShape(
        e=ubatch * view.n_embd * 4,
        ffn=ubatch * ffn * 4,
        moe_mid=ubatch * used * n_ff_exp * 4,
        moe_out=ubatch * used * view.n_embd * 4,
        logits=view.n_vocab * logits_rows * 4,
        ubatch=ubatch,
        per_layer=ubatch * per_layer * 4,
        ffn_gated=layout.ffn_gated,
    )


def layer_live(shape: GraphShape, experts: bool = True) -> float:
    """A layer's live set beyond its mask, in bytes, by the generic rule: 2E (the residual stream
    and its norm) + 3 x the FFN's intermediate (gate, up, their product) for a dense FFN, or for
    routed experts 4E + 3 x their intermediate + their outputs (the larger where a model has
    both; with the experts in host memory, 2E + their outputs)."""
    dense = 2.0 * shape.e + (3.0 if shape.ffn_gated else 1.0) * shape.ffn
    if not shape.moe_mid:
        return dense
    if not experts:
        # the experts run in host memory: their outputs come back to be weighted and summed here
        return max(dense, 2.0 * shape.e + shape.moe_out)
    moe = 4.0 * shape.e + 3.0 * shape.moe_mid + shape.moe_out
    return max(dense, moe)


def host_ffn_alone(dev: DeviceGraph, shape: GraphShape) -> bool:
    """Whether the host layers a device runs by op offload (-ngl partial offload,
    ComputeTraits.host_layer_weight_share) leave only their FFN's sequence on it: no flash
    attention and the attention's KQ above the device's cap (ComputeTraits.ops_capped: the host
    runs it, `attn_elsewhere`), its output as wide as the residual stream (not `attn_narrow`),
    dense gated FFNs (no routed experts) and no recurrent host layer (`offload_plain`). Then no
    split input of the attention (the mask, K and V) is allocated on the device, and a host
    layer's gated FFN starts above the residual stream and its norm (ggml-backend.cpp:1514-1531:
    split inputs are allocated at their split's start; ggml-alloc.c:211-247, best fit)."""
    return (
        not dev.flash_attn
        and dev.attn_elsewhere
        and not dev.attn_narrow
        and dev.offload_plain
        and dev.offload_ffn_up > 0
        and shape.ffn_gated
        and not shape.moe_mid
    )


def device_compute(dev: DeviceGraph, shape: GraphShape, rule: GraphRule) -> int:
    """Bytes of one device's compute buffer: the largest live set of the phases it runs."""
    e = shape.e
    # without flash attention the transposed V cache's row indices are an input beside the masks
    mask = dev.mask_f16 if dev.flash_attn else dev.mask_f32 + dev.v_idxs
    # the token embeddings' get_rows output (and the per-layer ones)
    host_e = e + shape.per_layer if dev.is_host else 0
    # (phase, whether the masks are part of its live set)
    phases: list[tuple[float, bool]] = [(0, False)]
    if dev.is_host:
        phases.append((host_e + dev.arch_live.inputs, True))
    if dev.holds_layers:
        scores = rule.kv_scores * dev.mask_f32
        # the fitted per-architecture terms describe a device that runs its layers' attention
        # from its Q on; where even the Q is refused (attn_q_elsewhere: deepseek-v3's absorbed
        # MLA Q on lavapipe) the host runs all of it and they are not this device's (measured:
        # 268 vs 223 MiB without them, 555 with)
        fitted = 0.0 if dev.attn_q_elsewhere else 1.0
        live = (
            layer_live(shape, dev.experts)
            + fitted * rule.layer * e
            + scores
            + host_e
            + (dev.offload_weight if dev.offload_weight_share is None else 0)
            + dev.arch_live.layer
            + (dev.arch_live.inputs_in_layer if dev.copies == 1 else 0)
        )
        if dev.backend is ComputeBackend.GPU and dev.flash_attn:
            live += dev.kv_convert
        if not dev.experts and shape.moe_mid:
            live += fitted * rule.no_experts * e + dev.experts_back
        live += e if dev.is_host else 0
        if dev.copies == 1:
            live += rule.remote_kv * dev.remote_kv
        # with pipeline parallelism the returned attention output of the last layer stays beside
        # the layer's live set (its copies are leafs: measured on the lavapipe oracle, 1 E)
        # the narrow attention's Q, K and V below the FFN; with pipeline parallelism the fitted
        # `pipeline` term carries them (fitted on the first of two RPC devices, whose peak is a
        # layer: gemma3's 2.0 E), but not on a last device whose head runs on the host (no
        # fitted term there)
        fitted_pipeline = dev.copies > 1 and not (dev.holds_output and dev.output_elsewhere)
        narrow = 0 if fitted_pipeline else dev.attn_narrow
        phases.append((live + (e if dev.attn_elsewhere and dev.copies > 1 else 0) + narrow, True))
        if dev.host_layers_peak:
            # the mask is in the replay: a graph input copied in by the first host layer
            phases.append((dev.host_layers_peak, False))
        elif dev.offload_weight_share is not None and dev.offload_weight:
            # the host layers, run here by op offload (one split per host weight)
            # (the copy goes with the FFN it feeds: where the FFN has no gate it is not the
            # layer's peak -- one block, ggml-alloc.c:22-46 -- and the fitted layer term
            # describes another sublayer (nemotron-h's Mamba-2), so its live set is the FFN's)
            base = live if shape.ffn_gated else layer_live(shape, dev.experts) + host_e
            if host_ffn_alone(dev, shape):
                # without flash attention and its KQ refused here, a host layer's attention runs
                # on the host: no mask is copied in to pin the layout, and its FFN starts above
                # the residual stream and its norm (2E): the up weight's copy and the gate and up
                # results above it; the GLU product takes the freed copy's block (an allocator
                # trace: llama-3.1-8b -ngl 16 -fa off, 2E + 31.5 + 2 x 28 = 103.5 MiB, below
                # the device's layer, 108: llama.cpp's)
                if dev.offload_ffn_up >= shape.ffn:
                    phases.append((2 * e + dev.offload_ffn_up + 2 * shape.ffn, True))
            else:
                phases.append((base + dev.offload_weight_share * dev.offload_weight, True))
            if dev.offload_kv:
                phases.append((dev.offload_kv + dev.offload_kv_e * e, True))
            if 0 < dev.offload_ffn_up < shape.ffn:
                # an allocator trace (docs/compute.md): the residual stream and the layer's
                # inputs below (4E), the up weight's copy, the gate and up results and their
                # gated product above them (qwen2.5-7b -ngl 14 -fa off: 175.4 MiB, llama.cpp's)
                phases.append((4 * e + dev.offload_ffn_up + 3 * shape.ffn, True))
        if dev.attn_elsewhere:
            # the attention that reads the mask runs on the host; its output comes back as a
            # split input, alive beside the output projection's result and the residual stream
            # (the mask here covers the layers it kept; with op offload, beside the host
            # layers' offloaded attention weight)
            attn = max(dev.attn_back, dev.attn_handoff) + 2 * e + dev.offload_weight
            phases.append((attn, False))
        if not dev.flash_attn and (dev.kq or not dev.attn_elsewhere):
            views = dev.remote_kv_views if dev.copies == 1 else 0
            # the architecture's own tensors stay below the KQ matrix (it lands above them)
            own = dev.arch_live.layer + (dev.arch_live.inputs_in_layer if dev.copies == 1 else 0)
            phases.append((dev.kq + rule.no_fa * e + host_e + views + own, True))
    elif dev.kq and not dev.flash_attn:
        # the KQ of another device's layers, computed here (that device's backend refused it)
        phases.append((dev.kq + rule.no_fa * e + host_e, True))
    elif dev.offload_weight:
        # op offload on a GPU that holds no layer: the weight and the activations it multiplies
        # (or a host layer's K and V copied in for its flash attention, where the backend's
        # traits keep them apart from the weight: offload_kv)
        phases.append((max(dev.offload_weight, dev.offload_kv) + 2 * e, False))
    if dev.host_experts:
        phases.append((2 * e + rule.expert_mid * shape.moe_mid + shape.moe_out, True))
    if dev.holds_output and not dev.output_elsewhere:
        out = shape.logits + rule.output * e + host_e
        if dev.logits_above_layer and dev.holds_layers:
            # the last free block starts where nothing below it could merge back
            # (state_rows_fence): above the last layer's FFN, or above the masks (graph inputs
            # allocated first, above the token embeddings, freed after the last attention
            # layer) when they reach higher
            ffn = layer_live(shape, dev.experts) + rule.layer * e
            out = shape.logits + max(ffn, mask) + host_e
        phases.append((out, False))
    if dev.copies > 1:
        # split inputs are leafs with n_copies copies, alive for the whole graph
        per_layer = shape.per_layer if dev.holds_layers else 0
        extra = rule.pipeline_output if dev.holds_output else rule.pipeline
        if dev.holds_output and dev.output_elsewhere:
            # The last device when its backend refused the head (the logits run on the host):
            # its peak is a layer phase over what it received, each input copied, and nothing
            # fitted on top (an allocator trace of the lavapipe build, -ts 3,1, Vulkan1:
            # llama-3.1-8b 4 x (2E + mask) + 2E + 3 x the FFN = 180.05 MiB, llama.cpp's;
            # gemma-4-e2b 234.0 vs 234.02 at -c 4096, 794.0 vs 794.02 at 32768):
            # - its first layer's input twice: the residual stream and its rms_norm, which has no
            #   weight, so pass 2 of ggml_backend_sched_split_graph ("expand gpu down",
            #   ggml-backend.cpp:1129-1148) leaves it on the previous device and only the
            #   multiply by attn_norm.weight runs here: two split inputs of E;
            # - per-layer token embeddings (gemma3n, gemma4) as each of its layers' slice of
            #   inp_per_layer (gemma4.cpp:376, gemma4_view_2d_slice: n_ubatch x n_embd_per_layer
            #   x 4 B a layer), not the whole width.
            # The fitted pipeline coefficients carry both where the logits phase is the output
            # device's peak (the CPU/RPC projections they were fitted on, with the head there).
            per_layer = int(per_layer * dev.layer_share)
            extra = 0.0
            inputs = mask + 2 * e + per_layer
        else:
            inputs = mask + e + per_layer
        resident = dev.copies * (
            inputs + rule.remote_kv * dev.remote_kv + dev.arch_live.inputs + dev.returned
        )
        if dev.is_host and not dev.holds_layers:
            extra = rule.pipeline_host_masks * dev.copies * mask
            # its own phases: the inputs (their architecture part is in `resident`: phases[1]
            # is the inputs phase), and what it runs for a device that refused it (the logits, a
            # KQ: ComputeTraits.ops_capped)
            peak = max([host_e] + [p for p, _ in phases[2:]])
            return int(
                resident + peak + extra + (0 if dev.flash_attn else rule.pipeline_host_no_fa * e)
            )
        return int(resident + max(p for p, _ in phases) + extra * e)
    return int(max(p + (mask if with_mask else 0) for p, with_mask in phases))


def host_input_buffer(mask_f16: int, mask_f32: int, flash_attn: bool, shape: GraphShape) -> int:
    """A GPU backend's pinned host compute buffer (CUDA_Host and kin): the graph inputs it stages,
    the KQ mask (f16 with flash attention after PR #23764, else f32) and the input embeddings."""
    return (mask_f16 if flash_attn else mask_f32) + shape.e


def output_buffer(n_vocab: int, n_seq_max: int) -> int:
    """The output buffer reserved at context creation: output_reserve(n_seq_max)
    (src/llama-context.cpp:377, 2116-2143): n_seq_max rows of n_vocab f32 logits."""
    return n_vocab * max(1, n_seq_max) * 4
