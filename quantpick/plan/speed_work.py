"""The work one token costs, per device, read from the layout and the estimate's placement: which
layers (attention, recurrent, experts) sit where, their weight bytes and FLOPs, and the RPC
stages between devices. plan/speed.py turns it into seconds."""

from __future__ import annotations

from dataclasses import dataclass, field

from quantpick.arch.base import AttentionKind
from quantpick.model.layout import ModelLayout
from quantpick.plan.bandwidth_bound import attention_reads
from quantpick.plan.memory import Estimate

# FP4 weights (MXFP4, gpt-oss's experts; NVFP4) multiply with 4-bit activations on the FP4 tensor
# cores on Blackwell (ggml-cuda/mmq.cu:116-130 at b11312, ggml_cuda_mmq_get_prec_src1: Q4 for
# the FP4 types when blackwell_mma_available, compute capability 12.x), at twice the INT8 rate
# of those cards (NVIDIA's GeForce RTX 50 data sheets: FP4 TOPS = 2 x FP8/INT8 TOPS).
FP4_TYPES = frozenset({"MXFP4", "NVFP4"})


# A KQ mask element: f16 with flash attention, f32 without (src/llama-graph.cpp:39-41 at b11312,
# n_kv x n_tokens per stream).
MASK_BYTES_FA = 2


MASK_BYTES_NO_FA = 4

# Prompt tokens that route as one independent pick of expert_used experts, by
# general.architecture (absent: 1, every token picks on its own). llama.cpp copies only the
# experts a ubatch's tokens picked to the GPU (ggml-backend.cpp:1709-1797 at b11312), and how
# many that is depends on how the model routes: gpt-oss-120b on 512 tokens of code touched
# 72-95 of its 128 experts per layer (layers 0-7, mean 83 = 0.649; slaren, llama.cpp PR
# #15346) where independent picks of 4 touch all 128; 1 - (1 - 4/128)^(512 / run) = 0.649
# gives run = 15.5. The same thread's larger batch touched 111-128 (layers 0-7, mean 0.93), as
# this rule gives between 1024 and 2048 tokens (0.88-0.985). ik_llama.cpp found the same
# (PRs #698, #842: "for some models (e.g., GPT-OSS) it is much better"; for most others every
# expert is active at an offloading batch). Not fitted.
ROUTING_RUN_TOKENS: dict[str, float] = {"gpt-oss": 15.5}


def touched_share(used: float, tokens: int, run: float = 1.0) -> float:
    """The share of a layer's routed experts that `tokens` prompt tokens pick, each token
    `used` of them, every `run` tokens routing as one independent pick (ROUTING_RUN_TOKENS):
    1 - (1 - used)^max(tokens / run, 1). With run 1 a 512-token ubatch of a 4-of-128 model
    touches all of them, a 32-token one 64%; gpt-oss's 15.5 gives 65% at 512. Never below one
    token's own `used`."""
    if used >= 1.0:
        return 1.0
    return 1.0 - (1.0 - used) ** max(max(tokens, 1) / max(run, 1.0), 1.0)


@dataclass(frozen=True)
class LayerKinds:
    """Layer counts by what their decode graph runs (each kind's kernels cost a fixed time)."""

    attention: int = 0  # layers that attend over a KV cache
    recurrent: int = 0  # layers with recurrent state (DeltaNet, Mamba, short conv)
    moe: int = 0  # layers with routed experts (router, top-k, expert matmuls, shared expert)
    ffn: int = 0  # layers with a dense feed-forward block


@dataclass(frozen=True)
class DeviceWork:
    """What one device does for one token (decode) or holds (prefill), from the estimate."""

    device: str
    kind: str
    slots: int  # layer slots whose dense part runs here
    decode_bytes: int  # weights read per decoded token + recurrent state read and written
    kv_depth_bytes: int  # f16-sized KV bytes read per token of fill (attention layers here)
    kv_window_bytes: int  # ... of its sliding-window layers (read up to n_swa tokens of fill)
    attention_layers: int
    flops_per_token: float  # 2 x parameters a prompt token multiplies here (no output head)
    resident_bytes: int  # weights stored here that a ubatch reads (no token embeddings)
    expert_resident_bytes: int  # ... of which routed experts
    endpoint: str | None = None  # an RPC device's worker
    worker_position: int | None = None  # ... and its position among that worker's devices here
    weights_bytes: int = 0  # every weight stored here (what loading sends to an RPC worker)
    # The layers whose graph runs here, by kind (the decode graph's fixed cost): a token mixer
    # (attention, recurrent) and a feed-forward part (routed experts, a dense FFN) each
    layer_kinds: LayerKinds = field(default_factory=LayerKinds)
    expert_flops_per_token: float = 0.0  # the routed experts' share of flops_per_token
    expert_read_bytes: int = 0  # the routed experts of resident_bytes a ubatch touches
    # prefill attention FLOPs per prompt token and token of fill, over the full-context layers
    # here and over the sliding-window ones (2 x heads x (K + V head size) per layer)
    attention_flops_full: float = 0.0
    attention_flops_window: float = 0.0
    # decode_bytes' weights by ggml type and routed-expert flag, (type, expert, bytes read per
    # token): a backend's decode kernel path can differ per type (Backend.decode_paths)
    decode_type_bytes: tuple[tuple[str, bool, int], ...] = ()


@dataclass(frozen=True)
class RpcStage:
    """A run of consecutive layers on one RPC device: one synchronous exchange per ubatch.

    llama.cpp's scheduler copies a split's inputs into the RPC backend (SET_TENSOR, sent without
    waiting for a reply), queues the graph (GRAPH_COMPUTE / GRAPH_RECOMPUTE, asynchronous), and
    the next split reads the result back with GET_TENSOR, a synchronous round trip that returns
    once the worker has computed (ggml-rpc.cpp at b11312: buffer set_tensor :720-741,
    get_tensor :743-750, graph_compute :1038-1057; the worker serves one command at a time).
    A copy between two workers goes through the head: `cpy_tensor` refuses buffers of different
    servers (ggml-rpc.cpp:752-770), so the scheduler gets the tensor from one and sets it on the
    other.
    """

    device: str
    endpoint: str
    receives: bool  # activations arrive over this worker's link (from the head or another worker)
    mask: bool  # the device's first stage with attention layers: the KQ mask arrives with it
    # What ends the stage: "activations" (read back by the head: round trip + bytes), "logits"
    # (the output layer is here: n_vocab floats per output row come back), "copy" (the next
    # stage is another device of the same worker: COPY_TENSOR there, a round trip, no bytes).
    returns: str


@dataclass(frozen=True)
class SpeedWork:
    """The per-device work of one configuration: the input of decode_ and prefill_seconds."""

    devices: tuple[DeviceWork, ...]
    transitions: int  # changes between a GPU and the host along the layers, per token / ubatch
    gpu_transitions: int  # changes from one GPU (local or RPC) to another
    kv_quantized: bool
    expert_used_fraction: float
    ubatch: int
    rpc_stages: tuple[RpcStage, ...] = ()
    n_embd: int = 0
    n_vocab: int = 0
    mask_bytes: int = MASK_BYTES_FA  # one KQ mask element
    n_swa: int = 0  # the sliding window (0: none)
    expert_tokens: float = 0.0  # prompt tokens each touched expert multiplies per ubatch
    fp4_expert_share: float = 0.0  # routed-expert parameters in MXFP4 / NVFP4
    routing_run_tokens: float = 1.0  # prompt tokens per independent expert pick


def _tensor_facts(layout: ModelLayout) -> tuple[frozenset[int], float]:
    """(slots with a dense feed-forward block: ffn_up / ffn_down that are not routed experts,
    the share of the routed experts' parameters stored as FP4: MXFP4, NVFP4); read once per
    layout (ModelLayout.derived)."""
    ffn: set[int] = set()
    experts = fp4 = 0
    for t in layout.tensors:
        if not t.name.startswith("blk."):
            continue
        if t.is_expert:
            n = 1
            for dim in t.shape:
                n *= dim
            experts += n
            fp4 += n if t.ggml_type in FP4_TYPES else 0
        elif ".ffn_down." in t.name or ".ffn_up." in t.name:
            ffn.add(layout.slot_of(t.name))
    return frozenset(ffn), fp4 / experts if experts else 0.0


def _type_bytes_by_slot(layout: ModelLayout) -> tuple[tuple[int, tuple[str, bool], int], ...]:
    """(slot, (ggml type, expert), bytes) summed per slot, once per layout (ModelLayout.derived):
    per-device copies left out, as DeviceWork.decode_bytes leaves them."""
    sums: dict[tuple[int, tuple[str, bool]], int] = {}
    for t in layout.tensors:
        if not t.is_expert and t in layout.per_device_tensors:
            continue
        k = (layout.slot_of(t.name), (t.ggml_type.upper(), t.is_expert))
        sums[k] = sums.get(k, 0) + t.n_bytes
    return tuple((slot, key, n) for (slot, key), n in sums.items())


def _embd_type(layout: ModelLayout) -> str:
    return next((t.ggml_type for t in layout.tensors if t.name == "token_embd.weight"), "F16")


def decode_type_bytes(
    layout: ModelLayout, layers: set[int], expert_layers: set[int], used: float, tied: int
) -> tuple[tuple[str, bool, int], ...]:
    """The weight bytes a decoded token reads on a device holding `layers` (dense parts) and
    `expert_layers` (routed experts, `used` of them per token), by (ggml type, expert): the
    same tensors as DeviceWork.decode_bytes (per-device copies and the input excepted), plus a
    tied output head's `tied` bytes of token_embd's type."""
    totals: dict[tuple[str, bool], float] = {}
    for slot, key, nbytes in layout.derived(_type_bytes_by_slot):
        if key[1]:
            if slot not in expert_layers:
                continue
            n = nbytes * used
        elif slot in layers:
            n = nbytes
        else:
            continue
        totals[key] = totals.get(key, 0.0) + n
    if tied:
        embd = layout.derived(_embd_type)
        key = (embd.upper(), False)
        totals[key] = totals.get(key, 0.0) + tied
    return tuple(sorted((k[0], k[1], int(v)) for k, v in totals.items()))


def layer_kinds(layout: ModelLayout, slots: list[int], ffn: frozenset[int]) -> LayerKinds:
    """The kinds of the trunk layers among `slots` (the output slot counts as none)."""
    view = layout.view
    attention = recurrent = moe = dense = 0
    for s in slots:
        if s >= len(view.layers):
            continue
        layer = view.layers[s]
        attention += layer.attends
        recurrent += layer.recurrent
        if layout.slots[s].expert_bytes:
            moe += 1
        elif s in ffn:
            dense += 1
    return LayerKinds(attention, recurrent, moe, dense)


def attention_flops(layout: ModelLayout, slots: list[int]) -> tuple[float, float]:
    """Prefill attention FLOPs per prompt token and token of fill over the attending layers
    among `slots` (2 x heads x (K head + V head): QK^T and AV), (full-context, sliding-window).
    An MLA layer's V is its K (K-only cache): K width counted twice."""
    view = layout.view
    full = window = 0.0
    for s in slots:
        if s >= len(view.layers):
            continue
        layer = view.layers[s]
        if not layer.attends:
            continue
        source = view.layers[layer.kv_shared_from] if layer.kv_shared_from is not None else layer
        if not source.n_head_kv:
            continue
        head_k = source.k_width // source.n_head_kv
        head_v = (source.v_width or source.k_width) // source.n_head_kv
        flops = 2.0 * layer.n_head * (head_k + head_v)
        if layer.attention is AttentionKind.SLIDING and view.n_swa > 0:
            window += flops
        else:
            full += flops
    return full, window


def speed_work(layout: ModelLayout, estimate: Estimate) -> SpeedWork:
    arch = layout.architecture
    config = estimate.config
    view = layout.view
    # the share of each MoE layer's routed experts a token reads: the view's counts (leading
    # dense blocks carry no routed experts, so their slots have none to scale)
    used = view.expert_used_count / view.expert_count if view.expert_count else 1.0
    # one request decodes: one sequence's recurrent state is read and written per token
    state_row = view.state_bytes_per_row
    slots = layout.slots
    dense_el, expert_el = layout.slot_elements
    ffn, fp4_share = layout.derived(_tensor_facts)
    ubatch = max(1, min(config.ubatch, config.batch))
    # A ubatch touches this share of the routed experts (each token picks expert_used of them).
    run = ROUTING_RUN_TOKENS.get(arch.name, 1.0)
    touched = touched_share(used, ubatch, run)
    # The MTP/NextN block is loaded but only computed when speculating with it
    # (src/models/qwen35moe.cpp builds the trunk layers 0..n_layer-1).
    skip = (
        set()
        if config.spec_draft_n
        else {s for s in range(layout.n_slots) if layout.is_nextn_slot(s)}
    )
    works: list[DeviceWork] = []
    dense_dev: dict[int, str] = {}
    expert_dev: dict[int, str] = {}
    endpoint_of: dict[str, str] = {}
    attention_dev: dict[str, set[int]] = {}
    seen_on_worker: dict[str, int] = {}
    for d in estimate.devices:
        layers = [s for s in d.layers if s not in skip]
        expert_layers = [s for s in d.expert_layers if s not in skip]
        for s in layers:
            dense_dev[s] = d.device
        for s in expert_layers:
            expert_dev[s] = d.device
        position = None
        if d.endpoint is not None:
            endpoint_of[d.device] = d.endpoint
            position = seen_on_worker.get(d.endpoint, 0)
            seen_on_worker[d.endpoint] = position + 1
        attention_dev[d.device] = set(d.attention_layers)
        host_input = layout.input_bytes if d.kind == "host" else 0
        expert_resident = sum(slots[s].expert_bytes for s in expert_layers)
        kv_full, kv_window = attention_reads(layout, d, "f16", "f16")
        # a tied output head multiplies token_embd's rows: read on every token where the output
        # layer runs (the copy on its device, or token_embd itself in host memory)
        tied = layout.tied_output_bytes if layout.output_slot in layers else 0
        expert_flops = 2.0 * used * sum(expert_el[s] for s in expert_layers)
        full_flops, window_flops = attention_flops(layout, layers)
        works.append(
            DeviceWork(
                device=d.device,
                kind=d.kind,
                slots=len(layers),
                decode_bytes=sum(slots[s].dense_bytes for s in layers)
                + tied
                + int(expert_resident * used)
                + 2 * len(d.recurrent_layers) * state_row,
                kv_depth_bytes=kv_full,
                kv_window_bytes=kv_window,
                attention_layers=len(d.attention_layers),
                flops_per_token=2.0 * sum(dense_el[s] for s in layers) + expert_flops,
                resident_bytes=max(
                    0,
                    d.weights_bytes
                    - host_input
                    - sum(slots[s].expert_bytes for s in d.expert_layers)
                    - sum(slots[s].dense_bytes for s in d.layers if s in skip),
                )
                + int(expert_resident * touched),
                expert_resident_bytes=expert_resident,
                endpoint=d.endpoint,
                worker_position=position,
                weights_bytes=d.weights_bytes,
                layer_kinds=layer_kinds(layout, layers, ffn),
                expert_flops_per_token=expert_flops,
                expert_read_bytes=int(expert_resident * touched),
                attention_flops_full=full_flops,
                attention_flops_window=window_flops,
                decode_type_bytes=decode_type_bytes(
                    layout, set(layers), set(expert_layers), used, tied
                ),
            )
        )
    sequence: list[str] = []
    for s in range(layout.n_slots):
        if s in dense_dev:
            sequence.append(dense_dev[s])
        if s in expert_dev:
            sequence.append(expert_dev[s])
    # every change of device costs what a local one costs (a copy through the head, the next
    # device's graph launch); a change to or from an RPC device adds the network (rpc_seconds)
    pairs = [(a, b) for a, b in zip(sequence, sequence[1:], strict=False) if a != b]
    gpu_pairs = sum(1 for a, b in pairs if a != "CPU" and b != "CPU")
    return SpeedWork(
        devices=tuple(works),
        transitions=len(pairs) - gpu_pairs,
        gpu_transitions=gpu_pairs,
        kv_quantized=config.cache_type_k not in ("f16", "bf16", "f32")
        or config.cache_type_v not in ("f16", "bf16", "f32"),
        expert_used_fraction=used,
        routing_run_tokens=run,
        ubatch=ubatch,
        rpc_stages=_rpc_stages(layout, sequence, dense_dev, endpoint_of, attention_dev),
        n_embd=arch.embedding_length,
        n_vocab=arch.vocab_size,
        mask_bytes=MASK_BYTES_NO_FA if config.flash_attn == "off" else MASK_BYTES_FA,
        n_swa=view.n_swa,
        expert_tokens=ubatch * used / touched if view.expert_count else 0.0,
        fp4_expert_share=fp4_share,
    )


def _rpc_stages(
    layout: ModelLayout,
    sequence: list[str],
    dense_dev: dict[int, str],
    endpoint_of: dict[str, str],
    attention_dev: dict[str, set[int]],
) -> tuple[RpcStage, ...]:
    """The runs of the layer sequence on RPC devices, with what crosses the network for each."""
    if not endpoint_of:
        return ()
    runs: list[list[str]] = []
    for dev in sequence:
        if runs and runs[-1][0] == dev:
            runs[-1].append(dev)
        else:
            runs.append([dev])
    output_dev = dense_dev.get(layout.output_slot)
    masked: set[str] = set()
    stages: list[RpcStage] = []
    for i, run in enumerate(runs):
        dev = run[0]
        endpoint = endpoint_of.get(dev)
        if endpoint is None:
            continue
        prev = runs[i - 1][0] if i > 0 else None
        nxt = runs[i + 1][0] if i + 1 < len(runs) else None
        same_worker_before = prev is not None and endpoint_of.get(prev) == endpoint
        mask = dev not in masked and bool(attention_dev.get(dev))
        if mask:
            masked.add(dev)
        if nxt is None and output_dev == dev:
            returns = "logits"
        elif nxt is not None and endpoint_of.get(nxt) == endpoint:
            returns = "copy"
        else:
            returns = "activations"
        stages.append(RpcStage(dev, endpoint, not same_worker_before, mask, returns))
    return tuple(stages)
