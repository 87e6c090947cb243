"""The host layers a GPU runs by op offload (-ngl partial offload), replayed as llama.cpp schedules
and allocates them: the layer's ops in graph order, cut into splits by ggml_backend_sched's rules
and laid out by its graph allocator (plan/allocator.py). Pure: sizes in, the device buffer's
high-water mark out. Templates: a dense attention layer (llama, mistral3, qwen2, qwen3) with a
gated FFN or routed experts copied in (qwen3moe), and the gated delta-net and gated attention
layers of qwen3next, qwen35 and qwen35moe, with a dense FFN or routed experts run on the host
beside a shared expert; `dense_attention_layer` and `hybrid_layers` say where one fits.

Where this is exact (allocator traces and GGML_SCHED_DEBUG=2 of the lavapipe Vulkan build, b11312:
docs/compute.md "A host layer's splits"), the scheduler does this with a host layer:
- every op that takes a weight held in host memory starts a new split when the current split
  already has an input (ggml-backend.cpp, ggml_backend_sched_split_graph, "check if we should
  start a new split based on the sources of the current node"), so each weight gets a split of
  its own, and an op whose only host weight was copied before (a rope's `rope_freqs`) starts one
  with no input, which the next weight then joins;
- a split's inputs -- host weights, graph inputs (token positions, the attention temperature, the
  KQ mask), the K and V views of the host's cache -- are copied in when the split starts, before
  its first op (ggml-backend.cpp:1514-1531), each tensor once per graph: the copy lives until its
  last consumer, so a weight's copy is freed after its one op and a graph input's stays to the
  end of the graph;
- ops run in graph order; the allocator gives each result the best-fitting free block, or the
  block of its first source where the op can run in place (ggml_op_can_inplace: ADD, MUL, ROPE,
  RMS_NORM, ...; ggml-alloc.c:22-46) and that source has no other consumer and is not a view
  (a reshaped matmul result is: the rope of Q and K gets a new block), and frees each source after
  its last consumer (ggml-alloc.c:632-700).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from quantpick.model.ggml import is_quantized, row_size
from quantpick.model.layout import ModelLayout
from quantpick.plan.allocator import Allocator


@dataclass(frozen=True)
class Op:
    """One node of the graph: its result's bytes and its sources, by name."""

    out: str
    size: int
    srcs: tuple[str, ...]
    inplace: bool = False  # may reuse srcs[0]'s block (an in-place op on a non-view source)
    on_host: bool = False  # runs on the host (the cache writes): its sources here are copied out


@dataclass(frozen=True)
class Copied:
    """A tensor copied into the device as a split input."""

    size: int
    weight: bool  # a weight held in host memory (starts a split where the split has inputs)
    persistent: bool = False  # a graph input: used to the end of the graph


@dataclass(frozen=True)
class HostLayerConfig:
    """What a host layer replay needs of the run: the ubatch, the cache's cells and types."""

    ubatch: int
    cells: int
    type_k: str
    type_v: str
    streams: int = 1  # sequences or KV streams: the templates have one
    masks: int = 1  # attention kinds of the graph (iSWA: 2): the templates have one


@dataclass(frozen=True)
class DenseAttentionLayer:
    """The sizes of a dense attention layer with a gated FFN (bytes): llama and the families
    whose layer only adds biases, Q/K norms, a rope frequency table or an attention temperature
    (llama, mistral3, qwen2, qwen3)."""

    e: int  # n_ubatch x n_embd x 4: the residual stream
    q: int  # n_ubatch x n_head x head_dim_k x 4
    k: int  # n_ubatch x n_head_kv x head_dim_k x 4
    v: int  # n_ubatch x n_head_kv x head_dim_v x 4
    attn: int  # n_ubatch x n_head x head_dim_v x 4: flash attention's result
    ffn: int  # n_ubatch x n_ff x 4
    w_q: int
    w_k: int
    w_v: int
    w_o: int
    w_gate: int
    w_up: int
    w_down: int
    norm_w: int  # attn_norm / ffn_norm weight
    k_view: int  # the host cache's K of one layer, as flash attention reads it
    v_view: int
    mask: int  # the f16 KQ mask
    bias_q: int = 0  # qwen2: attn_q/k/v biases, added in place after each projection
    bias_k: int = 0
    bias_v: int = 0
    qk_norm_w: int = 0  # qwen3: attn_q_norm / attn_k_norm (an RMS norm of Q and K before rope)
    rope_freqs: int = 0  # llama-3 rope scaling: a host weight every rope reads
    attn_temp: int = 0  # mistral3: Q scaled by a per-token temperature (a graph input)
    # a quantized cache: the Hadamard rotations of K (and Q) and of V (and the attention's
    # result), graph inputs (src/llama-kv-cache.cpp:1447-1486), one matmul each (0: none)
    k_rot: int = 0
    v_rot: int = 0
    # routed experts instead of the dense FFN (qwen3moe), copied in whole by op offload: the
    # ubatch's tokens, the router's width (n_expert), the experts used per token and their FFN
    # width; the expert and router weights (0: a dense FFN)
    tokens: int = 0
    n_expert: int = 0
    n_used: int = 0
    moe_ff: int = 0
    w_router: int = 0
    w_gate_exps: int = 0
    w_up_exps: int = 0
    w_down_exps: int = 0


def _layer_ops(i: int, s: DenseAttentionLayer, x: str) -> tuple[list[Op], dict[str, Copied]]:
    """Layer `i`'s ops with the residual stream `x` (graph order of llama.cpp's build_attn and
    build_ffn, as GGML_SCHED_DEBUG=2 prints them), and what they copy in."""
    ops: list[Op] = []
    copied: dict[str, Copied] = {}

    def w(name: str, size: int) -> str:
        copied[name] = Copied(size, weight=True)
        return name

    def graph_input(name: str, size: int) -> str:
        copied[name] = Copied(size, weight=False, persistent=True)
        return name

    n = f"-{i}"
    ops.append(Op("attn_norm" + n, s.e, ("norm" + n, w("attn_norm.w" + n, s.norm_w)), True))
    pos = graph_input("inp_pos", 2048)
    rope_srcs: tuple[str, ...] = (pos,)
    if s.rope_freqs:
        rope_srcs += (w("rope_freqs", s.rope_freqs),)

    def projection(name: str, size: int, weight: int, bias: int, norm: bool, rope: bool) -> str:
        out = name + n
        ops.append(Op(out, size, (w("w_" + out, weight), "attn_norm" + n)))
        if bias:
            ops.append(Op(out + "_b", size, (out, w("b_" + out, bias)), True))
            out += "_b"
        if norm:
            ops.append(Op(out + "_rms", size, (out,)))  # the norm of a reshaped view: new
            ops.append(Op(out + "_n", size, (out + "_rms", w("n_" + out, s.qk_norm_w)), True))
            out += "_n"
        if rope:
            # in place where its input is the norm's own result; a reshaped view gets a new block
            ops.append(Op(out + "_rope", size, (out, *rope_srcs), inplace=norm))
            out += "_rope"
        return out

    q = projection("q", s.q, s.w_q, s.bias_q, bool(s.qk_norm_w), True)
    if s.attn_temp:
        ops.append(Op(q + "_t", s.q, (q, graph_input("inp_attn_scale", s.attn_temp)), True))
        q += "_t"

    q = rotate(ops, copied, q, s.q, "k_rot", s.k_rot)
    v = projection("v", s.v, s.w_v, s.bias_v, False, False)
    v = rotate(ops, copied, v, s.v, "v_rot", s.v_rot)
    k = projection("k", s.k, s.w_k, s.bias_k, bool(s.qk_norm_w), True)
    k = rotate(ops, copied, k, s.k, "k_rot", s.k_rot)
    # the cache writes run on the host: K and V are copied out, then freed here
    ops.append(Op("cache_write" + n, 0, (k, v), on_host=True))
    # the K and V views are activations of the host, not weights: they start no split
    copied["k_view" + n] = Copied(s.k_view, weight=False)
    copied["v_view" + n] = Copied(s.v_view, weight=False)
    kv = ("k_view" + n, "v_view" + n)
    ops.append(Op("fa" + n, s.attn, (q, *kv, graph_input("mask", s.mask))))
    fa = rotate(ops, copied, "fa" + n, s.attn, "v_rot", s.v_rot)
    ops.append(Op("attn_out" + n, s.e, (w("w_o" + n, s.w_o), fa)))
    ops.append(Op("ffn_inp" + n, s.e, ("attn_out" + n, x), True))
    ops.append(Op("ffn_rms" + n, s.e, ("ffn_inp" + n,)))
    ops.append(Op("ffn_norm" + n, s.e, ("ffn_rms" + n, w("ffn_norm.w" + n, s.norm_w)), True))
    if s.n_expert:
        ops += _routed_experts(n, s, w)
    else:
        ops.append(Op("gate" + n, s.ffn, (w("w_gate" + n, s.w_gate), "ffn_norm" + n)))
        ops.append(Op("up" + n, s.ffn, (w("w_up" + n, s.w_up), "ffn_norm" + n)))
        ops.append(Op("swiglu" + n, s.ffn, ("gate" + n, "up" + n)))
        ops.append(Op("ffn_out" + n, s.e, (w("w_down" + n, s.w_down), "swiglu" + n)))
    ops.append(Op("l_out" + n, s.e, ("ffn_out" + n, "ffn_inp" + n), True))
    ops.append(Op(f"norm-{i + 1}", s.e, ("l_out" + n,)))
    return ops, copied


def _routed_experts(n: str, s: DenseAttentionLayer, w: Callable[[str, int], str]) -> list[Op]:
    """The routed experts' ops (src/llama-graph.cpp build_moe_ffn: softmax gating, normalized
    weights; in the order GGML_SCHED_DEBUG=2 and the allocator trace of qwen3-30b-a3b give): the
    router, its softmax, the top-k (a view of the argsort), the selected weights normalized by
    their sum; each expert tensor copied in for its MUL_MAT_ID; the down result weighted in place
    and its k slices summed into one residual-wide result (the first add new, the rest in place).
    The router's logits are freed only after the weights' normalization (the trace's order)."""
    tokens, k = s.tokens, s.n_used
    topk = "argsort" + n
    mid = tokens * k * s.moe_ff * 4
    down = tokens * k * (s.e // tokens)
    ops = _router(n, tokens, s.n_expert, k, w("w_router" + n, s.w_router), "ffn_norm" + n)
    ops += [
        Op("moe_gate" + n, mid, (w("w_gexp" + n, s.w_gate_exps), "ffn_norm" + n, topk)),
        Op("moe_up" + n, mid, (w("w_uexp" + n, s.w_up_exps), "ffn_norm" + n, topk)),
        Op("moe_swiglu" + n, mid, ("moe_gate" + n, "moe_up" + n)),
        Op("moe_down" + n, down, (w("w_dexp" + n, s.w_down_exps), "moe_swiglu" + n, topk)),
    ]
    return ops + _weighted_sum(n, s.e, k, ("moe_down" + n, down), "ffn_out" + n)


def _router(n: str, tokens: int, n_expert: int, k: int, weight: str, x: str) -> list[Op]:
    """build_moe_ffn's softmax router: the logits, their softmax, the argsort (its first k
    columns, a view, are the choice), the chosen weights normalized by their sum. The logits are
    freed only after the normalization (the allocator trace's order)."""
    topk = "argsort" + n
    return [
        Op("logits" + n, tokens * n_expert * 4, (weight, x)),
        Op("probs" + n, tokens * n_expert * 4, ("logits" + n,)),
        Op(topk, tokens * n_expert * 4, ("probs" + n,)),
        Op("weights" + n, tokens * k * 4, ("probs" + n, topk)),
        Op("weights_sum" + n, tokens * 4, ("weights" + n,)),
        Op("weights_sum_c" + n, tokens * 4, ("weights_sum" + n,), True),
        Op("weights_norm" + n, tokens * k * 4, ("weights" + n, "weights_sum_c" + n, "logits" + n)),
    ]


def _weighted_sum(n: str, e: int, k: int, down: tuple[str, int], out: str) -> list[Op]:
    """The experts' down result weighted in place, then its k slices (views of it) summed: the
    first add gets a new block, the others run in place."""
    ops = [Op("moe_weighted" + n, down[1], (down[0], "weights_norm" + n), True)]
    sums = [f"moe_sum{j}{n}" for j in range(k - 2)] + [out]
    ops.append(Op(sums[0], e, ("moe_weighted" + n,) * 2))
    for prev, nxt in zip(sums, sums[1:], strict=False):
        ops.append(Op(nxt, e, (prev, "moe_weighted" + n), True))
    return ops


def dense_host_layers_peak(s: DenseAttentionLayer, n_layers: int, alignment: int) -> int:
    """The device buffer's high-water mark over `n_layers` host layers of `s` run by op offload,
    from the first (its input, the token embeddings, copied in) on."""
    ops: list[Op] = [Op("norm-0", s.e, ("embd",))]
    copied: dict[str, Copied] = {"embd": Copied(s.e, weight=False)}
    x = "embd"
    for i in range(n_layers):
        layer, inputs = _layer_ops(i, s, x)
        ops += layer
        copied.update(inputs)
        x = f"l_out-{i}"
    return replay(ops, copied, alignment)


def replay(ops: list[Op], copied: dict[str, Copied], alignment: int) -> int:
    """Schedule `ops` into splits, allocate them and return the device buffer's high-water mark."""
    outs = Counter(op.out for op in ops)
    if max(outs.values(), default=1) > 1:  # a template naming two results alike frees one early
        raise ValueError(f"a result named twice: {outs.most_common(1)[0][0]}")
    uses = Counter(src for op in ops for src in op.srcs)
    alloc = Allocator(alignment)
    where: dict[str, tuple[int, int]] = {}  # live tensor -> (offset, size)
    for inputs, split_ops in schedule(ops, copied):
        for name in inputs:  # a split's inputs are copied in before its first op
            where[name] = (alloc.alloc(copied[name].size)[1], copied[name].size)
        for op in split_ops:
            parent = op.srcs[0] if op.srcs else None
            if op.on_host:
                pass
            elif (
                op.inplace
                and parent in where
                and not (parent in copied and (copied[parent].weight or copied[parent].persistent))
                and uses[parent] == 1
                and where[parent][1] == op.size
            ):
                where[op.out] = where.pop(parent)
            elif op.size:
                where[op.out] = (alloc.alloc(op.size)[1], op.size)
            for src in op.srcs:
                uses[src] -= 1
                if uses[src] == 0 and src in where and not copied.get(src, _KEEP).persistent:
                    offset, size = where.pop(src)
                    alloc.free(offset, size)
    return alloc.max_size


_KEEP = Copied(0, weight=False)


def schedule(ops: list[Op], copied: dict[str, Copied]) -> list[tuple[list[str], list[Op]]]:
    """`ops` cut into splits, each with the tensors it copies in (in the order its ops first read
    them): a new split at an op on the host and at the next one after it, and at an op taking a
    host weight where the current split already has an input."""
    splits: list[tuple[list[str], list[Op]]] = []
    done: set[str] = set()
    current: tuple[list[str], list[Op]] | None = None
    for op in ops:
        takes_weight = any(s in copied and copied[s].weight for s in op.srcs)
        if op.on_host or current is None or (takes_weight and current[0]):
            current = ([], [])
            splits.append(current)
        for src in op.srcs:
            if src in copied and src not in done and not op.on_host:
                done.add(src)
                current[0].append(src)
        current[1].append(op)
        if op.on_host:
            current = None
    return splits


# the tensors of a block `DenseAttentionLayer` describes (biases and Q/K norms optional)
_DENSE_BLOCK = frozenset(
    {
        "attn_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "ffn_norm.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
    }
)
_DENSE_OPTIONAL = frozenset(
    {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight", "attn_k_norm.weight"}
)
# ... or with routed experts (qwen3moe) in place of the dense FFN
_EXPERT_BLOCK = (_DENSE_BLOCK - {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}) | {
    "ffn_gate_inp.weight",
    "ffn_gate_exps.weight",
    "ffn_up_exps.weight",
    "ffn_down_exps.weight",
}


def dense_attention_layer(
    layout: ModelLayout, slots: Sequence[int], run: HostLayerConfig, max_copy: int | None = None
) -> DenseAttentionLayer | None:
    """The host layers `slots` as one `DenseAttentionLayer` (flash attention, `cells` cells of
    cache, `ubatch` tokens), or None where they are not all that layer with the same tensors:
    each block holds exactly the template's tensors (llama, mistral3, qwen2, qwen3; any other
    tensor -- a post-norm, sinks, experts, a recurrent state -- is an op sequence the template
    does not have), one attention kind, K and V of the same width."""
    view = layout.view
    ubatch, cells, type_k, type_v = run.ubatch, run.cells, run.type_k, run.type_v
    if not slots:
        return None
    shapes: set[tuple[tuple[str, int], ...]] = set()
    for slot in slots:
        lv = view.layers[slot]
        if lv.recurrent or not lv.kv or lv.k_width != lv.v_width:
            return None
        if lv.attention is not view.layers[slots[0]].attention:
            return None  # one attention kind: one mask and one cache size
        prefix = f"blk.{slot}."
        own = {
            t.name[len(prefix) :]: t.n_bytes for t in layout.tensors if t.name.startswith(prefix)
        }
        if not any(b <= own.keys() <= b | _DENSE_OPTIONAL for b in (_DENSE_BLOCK, _EXPERT_BLOCK)):
            return None
        if max_copy is not None and max(own.values()) > max_copy:
            return None  # a weight the device refuses: its op runs on the host, another sequence
        shapes.add(tuple(sorted(own.items())))
    if len(shapes) != 1:
        return None  # layers of different sizes or quant mixes: not one template
    first = slots[0]
    lv = view.layers[first]
    sizes = dict(next(iter(shapes)))
    arch = layout.architecture
    n_embd, n_head = view.n_embd, max(lv.n_head, 1)
    n_head_kv = max(lv.n_head_kv, 1)
    head_k = lv.k_width // n_head_kv
    ffn = layout.tensor(f"blk.{first}.ffn_up.weight")
    n_ff = ffn.shape[1] if ffn is not None and len(ffn.shape) > 1 else 0
    router = layout.tensor(f"blk.{first}.ffn_gate_inp.weight")
    experts = layout.tensor(f"blk.{first}.ffn_up_exps.weight")
    rope_freqs = layout.tensor("rope_freqs.weight")
    return DenseAttentionLayer(
        e=ubatch * n_embd * 4,
        q=ubatch * n_head * head_k * 4,
        k=ubatch * lv.k_width * 4,
        v=ubatch * lv.v_width * 4,
        attn=ubatch * n_head * (lv.v_width // n_head_kv) * 4,
        ffn=ubatch * n_ff * 4,
        w_q=sizes["attn_q.weight"],
        w_k=sizes["attn_k.weight"],
        w_v=sizes["attn_v.weight"],
        w_o=sizes["attn_output.weight"],
        w_gate=sizes.get("ffn_gate.weight", 0),
        w_up=sizes.get("ffn_up.weight", 0),
        w_down=sizes.get("ffn_down.weight", 0),
        norm_w=sizes["attn_norm.weight"],
        k_view=row_size(type_k, lv.k_width) * cells,
        v_view=row_size(type_v, lv.v_width) * cells,
        mask=cells * ubatch * 2,
        bias_q=sizes.get("attn_q.bias", 0),
        bias_k=sizes.get("attn_k.bias", 0),
        bias_v=sizes.get("attn_v.bias", 0),
        qk_norm_w=sizes.get("attn_q_norm.weight", 0),
        rope_freqs=rope_freqs.n_bytes if rope_freqs is not None else 0,
        # the attention temperature (src/models/mistral3.cpp:107-111): a graph input of n_tokens
        attn_temp=ubatch * 4 if arch.get("attention.temperature_scale") else 0,
        k_rot=_rotation(type_k, head_k, grow=True),
        v_rot=_rotation(type_v, lv.v_width // n_head_kv, grow=False),
        tokens=ubatch,
        n_expert=router.shape[1] if router is not None and experts is not None else 0,
        n_used=arch.int_("expert_used_count"),
        moe_ff=experts.shape[1] if experts is not None else 0,
        w_router=sizes.get("ffn_gate_inp.weight", 0),
        w_gate_exps=sizes.get("ffn_gate_exps.weight", 0),
        w_up_exps=sizes.get("ffn_up_exps.weight", 0),
        w_down_exps=sizes.get("ffn_down_exps.weight", 0),
    )


def _rotation(cache_type: str, head_dim: int, grow: bool) -> int:
    """Bytes of a quantized cache's Hadamard rotation (src/llama-kv-cache.cpp:321-338,
    :1447-1486): for a quantized type and a head a multiple of 64, f32 [n, n] with n the largest
    power of two from 64 up dividing the head for K, 64 for V; 0 otherwise."""
    if not is_quantized(cache_type) or head_dim % 64:
        return 0
    n = 64
    while grow and head_dim % (n * 2) == 0:
        n *= 2
    return n * n * 4


@dataclass(frozen=True)
class HybridFamily:
    """Where the qwen3next-derived families' layers differ (src/models/qwen3next.cpp,
    qwen35.cpp, qwen35moe.cpp at b11312)."""

    fused_ba: bool  # one `ssm_ba` projection for the decay and the beta (qwen3next), or two
    repeat_qk: bool  # Q and K repeated to the V heads before the delta net (qwen3next :516-533)
    positions: int  # token positions per token: 1, or 4 for the multi-section rope (qwen35)


HYBRID_FAMILIES = {
    "qwen3next": HybridFamily(fused_ba=True, repeat_qk=True, positions=1),
    # the delta net broadcasts the K heads itself; imrope positions: n_pos_per_embd() == 4
    "qwen35": HybridFamily(fused_ba=False, repeat_qk=False, positions=4),
    "qwen35moe": HybridFamily(fused_ba=False, repeat_qk=False, positions=4),
}


@dataclass(frozen=True)
class HybridLayers:
    """The sizes of the gated delta-net families' host layers (bytes, or element counts where
    named): gated delta-net layers and, every `full_attention_interval`-th, a gated attention
    layer, each with routed experts that run on the host (the device refuses their tensors:
    ComputeTraits.ops_capped) beside a shared expert, or a dense FFN (src/models/qwen3next.cpp,
    qwen35.cpp, qwen35moe.cpp)."""

    tokens: int  # n_ubatch
    e: int  # n_ubatch x n_embd x 4
    kinds: tuple[bool, ...]  # per host layer: True for an attention layer
    blocks: tuple[tuple[tuple[str, int], ...], ...]  # per host layer: its tensors' bytes
    # gated delta net: the conv kernel, Q/K heads, V heads and their widths
    conv_kernel: int
    n_k_heads: int
    n_v_heads: int
    head_k: int
    head_v: int
    # gated attention: heads, KV heads, head width; the host cache's K and V views, the mask
    n_head: int
    n_head_kv: int
    head: int
    k_view: int
    v_view: int
    mask: int
    n_expert: int  # 0: a dense gated FFN (qwen35) instead of routed and shared experts
    n_used: int
    shexp_ff: int
    k_rot: int = 0  # a quantized cache's Hadamard rotations (DenseAttentionLayer)
    v_rot: int = 0
    family: HybridFamily = field(default_factory=lambda: HYBRID_FAMILIES["qwen3next"])
    ffn: int = 0  # n_ubatch x n_ff x 4 of a dense FFN


def rotate(ops: list[Op], copied: dict[str, Copied], x: str, size: int, rot: str, n: int) -> str:
    """`x` multiplied by a quantized cache's Hadamard rotation `rot` of `n` bytes (a graph input;
    src/llama-kv-cache.cpp:1447-1486), or `x` itself without one."""
    if not n:
        return x
    copied[rot] = Copied(n, weight=False, persistent=True)
    ops.append(Op(x + "_rot", size, (rot, x)))
    return x + "_rot"


def _hybrid_ops(i: int, s: HybridLayers, x: str) -> tuple[list[Op], dict[str, Copied]]:
    """Host layer `i` of `s`, in the order GGML_SCHED_DEBUG=2 and the allocator trace of the
    lavapipe build print (qwen3-next-80b-a3b -ngl 24, qwen3.6-35b-a3b -ngl 20, qwen3.5-27b
    -ngl 32)."""
    ops: list[Op] = []
    copied: dict[str, Copied] = {}
    own = dict(s.blocks[i])
    n = f"-{i}"
    t, e = s.tokens, s.e

    def w(name: str) -> str:
        copied[name + n] = Copied(own[name], weight=True)
        return name + n

    def act(name: str, size: int) -> str:  # an activation of the host copied in
        copied[name + n] = Copied(size, weight=False)
        return name + n

    ops.append(Op("attn_norm" + n, e, ("norm" + n, w("attn_norm.weight")), True))
    if s.kinds[i]:
        q_full = t * s.n_head * s.head * 2 * 4  # Q and its gate, one matmul
        q = t * s.n_head * s.head * 4
        kv = t * s.n_head_kv * s.head * 4
        pos = "inp_pos"
        copied[pos] = Copied(t * 4 * s.family.positions, weight=False, persistent=True)

        def normed_rope(x: str, size: int, src: str) -> str:
            # the RMS norm of a reshaped view (a new block), its weight and the rope in place
            ops.append(Op(x + "_rms" + n, size, (src,)))
            ops.append(Op(x + "_n" + n, size, (x + "_rms" + n, w(f"attn_{x}_norm.weight")), True))
            ops.append(Op(x + "_rope" + n, size, (x + "_n" + n, pos), True))
            return rotate(ops, copied, x + "_rope" + n, size, "k_rot", s.k_rot)

        ops.append(Op("q_full" + n, q_full, (w("attn_q.weight"), "attn_norm" + n)))
        q_in = normed_rope("q", q, "q_full" + n)
        ops.append(Op("v" + n, kv, (w("attn_v.weight"), "attn_norm" + n)))
        v_in = rotate(ops, copied, "v" + n, kv, "v_rot", s.v_rot)
        ops.append(Op("k" + n, kv, (w("attn_k.weight"), "attn_norm" + n)))
        k_in = normed_rope("k", kv, "k" + n)
        ops.append(Op("cache_write" + n, 0, (k_in, v_in), on_host=True))
        copied["mask"] = Copied(s.mask, weight=False, persistent=True)
        kvs = (act("k_view", s.k_view), act("v_view", s.v_view))
        ops.append(Op("fa" + n, q, (q_in, *kvs, "mask")))
        fa = rotate(ops, copied, "fa" + n, q, "v_rot", s.v_rot)
        ops += [
            # the gate: a contiguous copy of Q's other half, its sigmoid in place; the product
            # takes the sigmoid's block (the attention's result reaches it as a reshaped view)
            Op("gate" + n, q, ("q_full" + n,)),
            Op("gate_sig" + n, q, ("gate" + n,), True),
            Op("gated" + n, q, ("gate_sig" + n, fa), True),
            Op("attn_out" + n, e, (w("attn_output.weight"), "gated" + n)),
            Op("residual" + n, e, ("attn_out" + n, x), True),
        ]
    else:
        qkv = 2 * s.n_k_heads * s.head_k + s.n_v_heads * s.head_v
        mixed = t * qkv * 4
        conv_in = (t + s.conv_kernel - 1) * qkv * 4
        qk = t * s.n_k_heads * s.head_k * 4
        qk_rep = t * s.n_v_heads * s.head_k * 4
        state = s.n_v_heads * s.head_k * s.head_v * 4
        out = t * s.n_v_heads * s.head_v * 4
        heads = t * s.n_v_heads * 4
        ops += [
            Op("qkv" + n, mixed, (w("attn_qkv.weight"), "attn_norm" + n)),
            Op(
                "conv_in" + n,
                conv_in,
                (act("conv_states", (s.conv_kernel - 1) * qkv * 4), "qkv" + n),
            ),
            Op("conv_save" + n, 0, ("conv_in" + n,), on_host=True),  # the last states, out
            Op("conv" + n, mixed, ("conv_in" + n, w("ssm_conv1d.weight"))),
            Op("silu" + n, mixed, ("conv" + n,), True),
            Op("q_rms" + n, qk, ("silu" + n,)),
            Op("k_rms" + n, qk, ("silu" + n,)),
            Op("q_scaled" + n, qk, ("q_rms" + n,), True),
            Op("k_scaled" + n, qk, ("k_rms" + n,), True),
        ]
        q_in, k_in = "q_scaled" + n, "k_scaled" + n
        if s.family.repeat_qk and s.n_v_heads != s.n_k_heads:  # Q, K repeated to the V heads
            ops += [Op("q_rep" + n, qk_rep, (q_in,)), Op("k_rep" + n, qk_rep, (k_in,))]
            q_in, k_in = "q_rep" + n, "k_rep" + n
        if s.family.fused_ba:
            # one projection; the decay and beta are contiguous copies of its halves, updated
            # in place
            ops += [
                Op("ba" + n, 2 * heads, (w("ssm_ba.weight"), "attn_norm" + n)),
                Op("a" + n, heads, ("ba" + n,)),
                Op("a_dt" + n, heads, ("a" + n, w("ssm_dt.bias")), True),
                Op("a_sp" + n, heads, ("a_dt" + n,), True),
                Op("g" + n, heads, ("a_sp" + n, w("ssm_a")), True),
                Op("b" + n, heads, ("ba" + n,)),
                Op("beta" + n, heads, ("b" + n,), True),
            ]
        else:
            # two projections; their results reach the bias add and the sigmoid as reshaped
            # views, which take new blocks
            ops += [
                Op("alpha" + n, heads, (w("ssm_alpha.weight"), "attn_norm" + n)),
                Op("a_dt" + n, heads, ("alpha" + n, w("ssm_dt.bias"))),
                Op("a_sp" + n, heads, ("a_dt" + n,), True),
                Op("g" + n, heads, ("a_sp" + n, w("ssm_a")), True),
                Op("b" + n, heads, (w("ssm_beta.weight"), "attn_norm" + n)),
                Op("beta" + n, heads, ("b" + n,)),
            ]
        st = act("state", state)
        ops += [
            Op("gdn" + n, out + state, (q_in, k_in, "silu" + n, "g" + n, "beta" + n, st)),
            Op("state_save" + n, 0, ("gdn" + n,), on_host=True),
            Op("o_rms" + n, out, ("gdn" + n,)),
            Op("o_n" + n, out, ("o_rms" + n, w("ssm_norm.weight")), True),
            Op("z" + n, out, (w("attn_gate.weight"), "attn_norm" + n)),
            Op("z_silu" + n, out, ("z" + n,)),
            Op("o_gated" + n, out, ("o_n" + n, "z_silu" + n), True),
            Op("lin_out" + n, e, (w("ssm_out.weight"), "o_gated" + n)),
            # the projection reaches the add as a reshaped view: the sum takes the residual's
            Op("residual" + n, e, (x, "lin_out" + n), True),
        ]
    ops += [
        Op("post_rms" + n, e, ("residual" + n,)),
        Op("post_n" + n, e, ("post_rms" + n, w("post_attention_norm.weight")), True),
    ]
    if not s.n_expert:  # a dense gated FFN (qwen35)
        ops += [
            Op("ffn_gate" + n, s.ffn, (w("ffn_gate.weight"), "post_n" + n)),
            Op("ffn_up" + n, s.ffn, (w("ffn_up.weight"), "post_n" + n)),
            Op("ffn_swiglu" + n, s.ffn, ("ffn_gate" + n, "ffn_up" + n)),
            Op("ffn_out" + n, e, (w("ffn_down.weight"), "ffn_swiglu" + n)),
            Op("l_out" + n, e, ("ffn_out" + n, "residual" + n), True),
            Op(f"norm-{i + 1}", e, ("l_out" + n,)),
        ]
        return ops, copied
    # routed experts on the host: the router here, the experts' input and choice copied out,
    # their weighted result copied back in and summed here (build_moe_ffn)
    k = s.n_used
    ops += _router(n, t, s.n_expert, k, w("ffn_gate_inp.weight"), "post_n" + n)
    ops.append(Op("experts" + n, 0, ("post_n" + n, "argsort" + n), on_host=True))
    down = t * k * (e // t)
    ops += _weighted_sum(n, e, k, (act("moe_down", down), down), "moe_out" + n)
    sh = t * s.shexp_ff * 4
    ops += [
        Op("sh_gate" + n, sh, (w("ffn_gate_shexp.weight"), "post_n" + n)),
        Op("sh_up" + n, sh, (w("ffn_up_shexp.weight"), "post_n" + n)),
        Op("sh_swiglu" + n, sh, ("sh_gate" + n, "sh_up" + n)),
        Op("sh_out" + n, e, (w("ffn_down_shexp.weight"), "sh_swiglu" + n)),
        Op("sh_g" + n, t * 4, (w("ffn_gate_inp_shexp.weight"), "post_n" + n)),
        Op("sh_g_sig" + n, t * 4, ("sh_g" + n,), True),
        Op("sh_gated" + n, e, ("sh_out" + n, "sh_g_sig" + n), True),
        Op("ffn_out" + n, e, ("moe_out" + n, "sh_gated" + n), True),
        Op("l_out" + n, e, ("ffn_out" + n, "residual" + n), True),
        Op(f"norm-{i + 1}", e, ("l_out" + n,)),
    ]
    return ops, copied


def hybrid_host_layers_peak(s: HybridLayers, alignment: int) -> int:
    """The device buffer's high-water mark over the host layers of `s` run by op offload."""
    ops: list[Op] = [Op("norm-0", s.e, ("embd",))]
    copied: dict[str, Copied] = {"embd": Copied(s.e, weight=False)}
    x = "embd"
    for i in range(len(s.kinds)):
        layer, inputs = _hybrid_ops(i, s, x)
        ops += layer
        copied.update(inputs)
        x = f"l_out-{i}"
    return replay(ops, copied, alignment)


_GDN_BLOCK = frozenset(
    {
        "attn_norm.weight",
        "post_attention_norm.weight",
        "attn_qkv.weight",
        "attn_gate.weight",
        "ssm_conv1d.weight",
        "ssm_dt.bias",
        "ssm_a",
        "ssm_norm.weight",
        "ssm_out.weight",
    }
)
_DENSE_FFN_BLOCK = frozenset({"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
_GATED_ATTENTION_BLOCK = frozenset(
    {
        "attn_norm.weight",
        "post_attention_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "attn_q_norm.weight",
        "attn_k_norm.weight",
    }
)
_SHARED_EXPERTS_BLOCK = frozenset(
    {
        "ffn_gate_inp.weight",
        "ffn_gate_exps.weight",
        "ffn_up_exps.weight",
        "ffn_down_exps.weight",
        "ffn_gate_inp_shexp.weight",
        "ffn_gate_shexp.weight",
        "ffn_up_shexp.weight",
        "ffn_down_shexp.weight",
    }
)


def hybrid_layers(
    layout: ModelLayout, slots: Sequence[int], run: HostLayerConfig, max_copy: int | None
) -> HybridLayers | None:
    """The host layers `slots` of a qwen3next, qwen35 or qwen35moe model as `HybridLayers`, or
    None where they are not: each block a gated delta net or a gated attention layer, with a
    dense FFN (qwen35) or routed experts the device refuses (larger than `max_copy`: they run on
    the host) beside a shared expert, and no dense weight the device refuses."""
    view, arch = layout.view, layout.architecture
    ubatch, cells, type_k, type_v = run.ubatch, run.cells, run.type_k, run.type_v
    family = HYBRID_FAMILIES.get(arch.name)
    if family is None or not slots or max_copy is None:
        return None
    ab = {"ssm_ba.weight"} if family.fused_ba else {"ssm_alpha.weight", "ssm_beta.weight"}
    ffn_block = _SHARED_EXPERTS_BLOCK if arch.name != "qwen35" else _DENSE_FFN_BLOCK
    blocks, kinds = [], []
    for slot in slots:
        prefix = f"blk.{slot}."
        own = {
            t.name[len(prefix) :]: t.n_bytes for t in layout.tensors if t.name.startswith(prefix)
        }
        attention = own.keys() == _GATED_ATTENTION_BLOCK | ffn_block
        if not attention and own.keys() != _GDN_BLOCK | ab | ffn_block:
            return None
        if own.get("ffn_up_exps.weight", max_copy + 1) <= max_copy:
            return None  # experts copied in by op offload: a sequence not replayed here
        if max(b for name, b in own.items() if "exps" not in name) > max_copy:
            return None  # a dense weight the device refuses: its op runs on the host
        blocks.append(tuple(sorted(own.items())))
        kinds.append(attention)
    attn = next((view.layers[s] for s, a in zip(slots, kinds, strict=True) if a), None)
    if attn is None or attn.k_width != attn.v_width:
        return None
    shexp = layout.tensor(f"blk.{slots[0]}.ffn_up_shexp.weight")
    router = layout.tensor(f"blk.{slots[0]}.ffn_gate_inp.weight")
    up = layout.tensor(f"blk.{slots[0]}.ffn_up.weight")
    experts = shexp is not None and router is not None
    n_head_kv = max(attn.n_head_kv, 1)
    n_v_heads = arch.int_("ssm.time_step_rank")
    n_k_heads = arch.int_("ssm.group_count")
    head_k = arch.int_("ssm.state_size")
    return HybridLayers(
        tokens=ubatch,
        e=ubatch * view.n_embd * 4,
        kinds=tuple(kinds),
        blocks=tuple(blocks),
        conv_kernel=arch.int_("ssm.conv_kernel"),
        n_k_heads=n_k_heads,
        n_v_heads=n_v_heads,
        head_k=head_k,
        head_v=arch.int_("ssm.inner_size") // max(n_v_heads, 1),
        n_head=attn.n_head,
        n_head_kv=n_head_kv,
        head=attn.k_width // n_head_kv,
        k_view=row_size(type_k, attn.k_width) * cells,
        v_view=row_size(type_v, attn.v_width) * cells,
        mask=cells * ubatch * 2,
        n_expert=router.shape[1] if experts and router is not None else 0,
        n_used=arch.int_("expert_used_count"),
        shexp_ff=shexp.shape[1] if experts and shexp is not None else 0,
        k_rot=_rotation(type_k, attn.k_width // n_head_kv, grow=True),
        v_rot=_rotation(type_v, attn.v_width // n_head_kv, grow=False),
        family=family,
        ffn=ubatch * up.shape[1] * 4 if up is not None and len(up.shape) > 1 else 0,
    )


def replayed_host_layers_peak(
    layout: ModelLayout,
    slots: Sequence[int],
    run: HostLayerConfig,
    max_copy: int | None,
    alignment: int,
) -> int:
    """The offloading device's high-water mark over the host layers `slots`, replayed with the
    template they fit; 0 where none does (the fitted phases of plan/compute.py stay)."""
    if run.streams != 1 or run.masks != 1:
        return 0
    dense = dense_attention_layer(layout, slots, run, max_copy)
    if dense is not None:
        return dense_host_layers_peak(dense, len(slots), alignment)
    hybrid = hybrid_layers(layout, slots, run, max_copy)
    return hybrid_host_layers_peak(hybrid, alignment) if hybrid is not None else 0


def gated_ffn_up(layout: ModelLayout, slots: Sequence[int]) -> int:
    """The largest `ffn_up` weight among the blocks `slots` whose FFN has a gate (0: none): the
    copy a host layer's gated FFN reads (plan/compute.py DeviceGraph.offload_ffn_up)."""
    return max(
        (
            up.n_bytes
            for s in slots
            if (up := layout.tensor(f"blk.{s}.ffn_up.weight")) is not None
            and layout.tensor(f"blk.{s}.ffn_gate.weight") is not None
        ),
        default=0,
    )
