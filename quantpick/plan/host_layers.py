"""Dense attention host layers (llama, mistral3, qwen2, qwen3, gemma3; glm4moe's and qwen3moe's
with routed experts) as llama.cpp runs them on a GPU by op offload, replayed through
plan/host_replay.py; `replayed_host_layers_peak` is the entry point that picks this template or
plan/hybrid_layers.py's."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from quantpick.arch.base import AttentionKind
from quantpick.model.ggml import row_size
from quantpick.model.layout import ModelLayout
from quantpick.plan.host_replay import (
    Copied,
    HostLayerConfig,
    Op,
    replay_layers,
    rotate,
    rotation_bytes,
    sigmoid_router,
    softmax_router,
    weighted_sum,
)
from quantpick.plan.hybrid_layers import hybrid_host_layers_peak, hybrid_layers


@dataclass(frozen=True)
class DenseFamily:
    """Where a family's dense attention layer departs from llama's (src/models/<arch>.cpp)."""

    embd_scale: bool = False  # the token embeddings scaled (in place) before the first norm
    q_scale: bool = False  # Q scaled after its rope (in place) instead of inside the attention
    k_first: bool = False  # K projected before V (the graph's order)
    sliding: bool = False  # interleaved sliding-window layers: their own mask and cache cells


# gemma3 (src/models/gemma3.cpp): sqrt(n_embd) x the embeddings, Q x 1/sqrt(query_pre_attn_
# scalar) after rope, K before V, five sliding-window layers to one global (an allocator trace of
# gemma-3-27b -ngl 31)
DENSE_FAMILIES = {"gemma3": DenseFamily(embd_scale=True, q_scale=True, k_first=True, sliding=True)}


@dataclass(frozen=True)
class DenseAttentionLayer:
    """The sizes of a dense attention layer (bytes): llama and the families whose layer only adds
    biases, Q/K norms, a rope frequency table, an attention temperature (mistral3), post-norms
    and sliding-window layers (gemma3), with a dense gated FFN or routed experts (qwen3moe,
    glm4moe)."""

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
    tokens: int = 0  # n_ubatch (the token positions' input; the routers' widths)
    # routed experts instead of the dense FFN (qwen3moe), copied in whole by op offload: the
    # router's width (n_expert), the experts used per token and their FFN width; the expert and
    # router weights (0: a dense FFN)
    n_expert: int = 0
    n_used: int = 0
    moe_ff: int = 0
    w_router: int = 0
    w_gate_exps: int = 0
    w_up_exps: int = 0
    w_down_exps: int = 0
    # glm4moe: the first `dense_layers` host layers have the dense FFN (leading_dense_block_count),
    # the experts may be refused by the device and run on the host (their weighted result copied
    # back), the router may be a sigmoid with a selection bias (exp_probs_b: its bytes), and a
    # shared expert without a gate may follow (its weights and width)
    dense_layers: int = 0
    experts_on_host: bool = False
    probs_bias: int = 0
    w_gate_shexp: int = 0
    w_up_shexp: int = 0
    w_down_shexp: int = 0
    shexp_ff: int = 0
    family: DenseFamily = DenseFamily()
    # gemma3: the attention's result and the FFN's normalized again before the residual adds
    # (post_attention_norm, post_ffw_norm: the norm in place on the projection's result)
    post_norms: bool = False
    # per host layer: a sliding-window layer (its K and V views and mask of `swa_cells` cells)
    swa: tuple[bool, ...] = ()
    k_view_swa: int = 0
    v_view_swa: int = 0
    mask_swa: int = 0


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

    def post_norm(x: str, name: str, weight: str) -> str:
        # gemma3's norm of a projection's result: in place (its only consumer), then its weight
        if not s.post_norms:
            return x
        ops.append(Op(name + "_rms" + n, s.e, (x,), True))
        ops.append(Op(name + n, s.e, (name + "_rms" + n, w(weight, s.norm_w)), True))
        return name + n

    ops.append(Op("attn_norm" + n, s.e, ("norm" + n, w("attn_norm.w" + n, s.norm_w)), True))
    pos = graph_input("inp_pos", s.tokens * 4)
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
    if s.family.q_scale:
        ops.append(Op(q + "_s", s.q, (q,), True))
        q += "_s"

    q = rotate(ops, copied, q, s.q, "k_rot", s.k_rot)

    def value() -> str:
        v = projection("v", s.v, s.w_v, s.bias_v, False, False)
        return rotate(ops, copied, v, s.v, "v_rot", s.v_rot)

    def key() -> str:
        k = projection("k", s.k, s.w_k, s.bias_k, bool(s.qk_norm_w), True)
        return rotate(ops, copied, k, s.k, "k_rot", s.k_rot)

    if s.family.k_first:
        k = key()
        v = value()
    else:
        v = value()
        k = key()
    # the cache writes run on the host: K and V are copied out, then freed here
    ops.append(Op("cache_write" + n, 0, (k, v), on_host=True))
    # the K and V views are activations of the host, not weights: they start no split
    sliding = bool(s.swa) and s.swa[i]
    copied["k_view" + n] = Copied(s.k_view_swa if sliding else s.k_view, weight=False)
    copied["v_view" + n] = Copied(s.v_view_swa if sliding else s.v_view, weight=False)
    kv = ("k_view" + n, "v_view" + n)
    mask = graph_input("mask_swa", s.mask_swa) if sliding else graph_input("mask", s.mask)
    ops.append(Op("fa" + n, s.attn, (q, *kv, mask)))
    fa = rotate(ops, copied, "fa" + n, s.attn, "v_rot", s.v_rot)
    ops.append(Op("attn_out" + n, s.e, (w("w_o" + n, s.w_o), fa)))
    attn = post_norm("attn_out" + n, "attn_post", "post_attention_norm.w" + n)
    ops.append(Op("ffn_inp" + n, s.e, (attn, x), True))
    ops.append(Op("ffn_rms" + n, s.e, ("ffn_inp" + n,)))
    ops.append(Op("ffn_norm" + n, s.e, ("ffn_rms" + n, w("ffn_norm.w" + n, s.norm_w)), True))
    if s.n_expert and i >= s.dense_layers:
        down = s.tokens * s.n_used * (s.e // s.tokens)
        copied["moe_down" + n] = Copied(down, weight=False)  # when the host runs the experts
        ops += _routed_experts(n, s, w)
    else:
        ops.append(Op("gate" + n, s.ffn, (w("w_gate" + n, s.w_gate), "ffn_norm" + n)))
        ops.append(Op("up" + n, s.ffn, (w("w_up" + n, s.w_up), "ffn_norm" + n)))
        ops.append(Op("swiglu" + n, s.ffn, ("gate" + n, "up" + n)))
        ops.append(Op("ffn_out" + n, s.e, (w("w_down" + n, s.w_down), "swiglu" + n)))
    ffn_out = post_norm("ffn_out" + n, "ffn_post", "post_ffw_norm.w" + n)
    ops.append(Op("l_out" + n, s.e, (ffn_out, "ffn_inp" + n), True))
    ops.append(Op(f"norm-{i + 1}", s.e, ("l_out" + n,)))
    return ops, copied


def _routed_experts(n: str, s: DenseAttentionLayer, w: Callable[[str, int], str]) -> list[Op]:
    """The routed experts' ops (src/llama-graph.cpp build_moe_ffn, normalized weights; in the
    order GGML_SCHED_DEBUG=2 and the allocator traces of qwen3-30b-a3b and glm-4.5-air give): the
    router (a softmax, or a sigmoid with a selection bias), the top-k (a view of the argsort);
    each expert tensor copied in for its MUL_MAT_ID, or the experts run on the host and their
    down result copied back; that result weighted in place and its k slices summed into one
    residual-wide result (the first add new, the rest in place); then a gateless shared expert
    where the layer has one."""
    tokens, k, x = s.tokens, s.n_used, "ffn_norm" + n
    topk = "argsort" + n
    mid = tokens * k * s.moe_ff * 4
    down = tokens * k * (s.e // tokens)
    router = w("w_router" + n, s.w_router)
    if s.probs_bias:
        ops = sigmoid_router(n, tokens, s.n_expert, k, router, w("probs_b" + n, s.probs_bias), x)
    else:
        ops = softmax_router(n, tokens, s.n_expert, k, router, x)
    if s.experts_on_host:
        # the host runs them: their input and choice copied out, the down result copied back
        # in (an input of the next split, weighted in place)
        ops.append(Op("experts" + n, 0, (x, topk), on_host=True))
        result = "moe_down" + n
    else:
        ops += [
            Op("moe_gate" + n, mid, (w("w_gexp" + n, s.w_gate_exps), x, topk)),
            Op("moe_up" + n, mid, (w("w_uexp" + n, s.w_up_exps), x, topk)),
            Op("moe_swiglu" + n, mid, ("moe_gate" + n, "moe_up" + n)),
            Op("moe_result" + n, down, (w("w_dexp" + n, s.w_down_exps), "moe_swiglu" + n, topk)),
        ]
        result = "moe_result" + n
    if not s.shexp_ff:
        return ops + weighted_sum(n, s.e, k, (result, down), "ffn_out" + n)
    sh = tokens * s.shexp_ff * 4
    return [
        *ops,
        *weighted_sum(n, s.e, k, (result, down), "moe_out" + n),
        Op("sh_gate" + n, sh, (w("w_gsh" + n, s.w_gate_shexp), x)),
        Op("sh_up" + n, sh, (w("w_ush" + n, s.w_up_shexp), x)),
        Op("sh_swiglu" + n, sh, ("sh_gate" + n, "sh_up" + n)),
        Op("sh_out" + n, s.e, (w("w_dsh" + n, s.w_down_shexp), "sh_swiglu" + n)),
        Op("ffn_out" + n, s.e, ("moe_out" + n, "sh_out" + n), True),
    ]


@lru_cache(maxsize=256)  # pure; an offload search asks again for the same host layers
def dense_host_layers_peak(s: DenseAttentionLayer, n_layers: int, alignment: int) -> int:
    """The device buffer's high-water mark over `n_layers` host layers of `s` run by op offload,
    from the first (its input, the token embeddings, copied in) on."""
    return replay_layers(
        s.e, n_layers, lambda i, x: _layer_ops(i, s, x), alignment, s.family.embd_scale
    )


# the tensors of a block `DenseAttentionLayer` describes: the attention (biases and Q/K norms
# optional), the FFN's norm (glm4moe names it after the attention), and a dense gated FFN or
# routed experts (a selection bias and a gateless shared expert optional)
_ATTENTION = frozenset(
    {
        "attn_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
    }
)


_ATTENTION_OPTIONAL = frozenset(
    {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight", "attn_k_norm.weight"}
)


_FFN_NORMS = frozenset({"ffn_norm.weight", "post_attention_norm.weight"})


_DENSE_FFN = frozenset({"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})


_EXPERTS = frozenset(
    {"ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}
)


_SHARED = frozenset({"ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"})


_POST_NORMS = frozenset({"post_attention_norm.weight", "ffn_norm.weight", "post_ffw_norm.weight"})


def _ffn_kind(own: Mapping[str, int]) -> str | None:
    """ "dense", "experts" or None (a block the template does not describe)."""
    rest = own.keys() - _ATTENTION - _ATTENTION_OPTIONAL
    if _POST_NORMS <= rest:  # gemma3: the FFN's norm and both post-norms
        rest = (rest - _POST_NORMS) | {"ffn_norm.weight"}
    if not _ATTENTION <= own.keys() or len(rest & _FFN_NORMS) != 1:
        return None
    rest -= _FFN_NORMS
    if rest == _DENSE_FFN:
        return "dense"
    extra = rest - _EXPERTS - {"exp_probs_b.bias"}
    if _EXPERTS <= rest and extra in (set(), _SHARED):
        return "experts"
    return None


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
    family = DENSE_FAMILIES.get(layout.architecture.name, DenseFamily())
    if not slots:
        return None
    shapes: dict[str, set[tuple[tuple[str, int], ...]]] = {"dense": set(), "experts": set()}
    kinds: list[str] = []
    for slot in slots:
        lv = view.layers[slot]
        if lv.recurrent or not lv.kv or lv.k_width != lv.v_width:
            return None
        if lv.attention is not view.layers[slots[0]].attention and not family.sliding:
            return None  # one attention kind (one mask and cache size), but for iSWA families
        own = layout.block_tensor_bytes[slot]
        kind = _ffn_kind(own)
        if kind is None:
            return None
        dense_weights = [b for name, b in own.items() if "_exps." not in name]
        if max_copy is not None and max(dense_weights) > max_copy:
            return None  # a weight the device refuses: its op runs on the host, another sequence
        shapes[kind].add(tuple(sorted(own.items())))
        kinds.append(kind)
    if any(len(s) > 1 for s in shapes.values()) or kinds != sorted(kinds):
        return None  # layers of different sizes or quant mixes, or a dense FFN after experts
    first = slots[0]
    lv = view.layers[first]
    sizes: dict[str, int] = {}
    for kind in ("experts", "dense"):  # the attention's sizes are every layer's
        sizes.update(dict(next(iter(shapes[kind]), ())))
    moe_slot = slots[kinds.index("experts")] if "experts" in kinds else first
    arch = layout.architecture
    n_embd, n_head = view.n_embd, max(lv.n_head, 1)
    n_head_kv = max(lv.n_head_kv, 1)
    head_k = lv.k_width // n_head_kv
    ffn = layout.tensor(f"blk.{first}.ffn_up.weight")
    n_ff = ffn.shape[1] if ffn is not None and len(ffn.shape) > 1 else 0
    router = layout.tensor(f"blk.{moe_slot}.ffn_gate_inp.weight")
    experts = layout.tensor(f"blk.{moe_slot}.ffn_up_exps.weight")
    shexp = layout.tensor(f"blk.{moe_slot}.ffn_up_shexp.weight")
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
        norm_w=sizes["attn_norm.weight"],  # the FFN's norm: the same width
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
        k_rot=rotation_bytes(type_k, head_k, grow=True),
        v_rot=rotation_bytes(type_v, lv.v_width // n_head_kv, grow=False),
        tokens=ubatch,
        n_expert=router.shape[1] if router is not None and experts is not None else 0,
        n_used=arch.int_("expert_used_count"),
        moe_ff=experts.shape[1] if experts is not None else 0,
        w_router=sizes.get("ffn_gate_inp.weight", 0),
        w_gate_exps=sizes.get("ffn_gate_exps.weight", 0),
        w_up_exps=sizes.get("ffn_up_exps.weight", 0),
        w_down_exps=sizes.get("ffn_down_exps.weight", 0),
        dense_layers=kinds.count("dense"),
        experts_on_host=max_copy is not None and sizes.get("ffn_up_exps.weight", 0) > max_copy,
        probs_bias=sizes.get("exp_probs_b.bias", 0),
        w_gate_shexp=sizes.get("ffn_gate_shexp.weight", 0),
        w_up_shexp=sizes.get("ffn_up_shexp.weight", 0),
        w_down_shexp=sizes.get("ffn_down_shexp.weight", 0),
        shexp_ff=shexp.shape[1] if shexp is not None and len(shexp.shape) > 1 else 0,
        family=family,
        post_norms="post_ffw_norm.weight" in sizes,
        swa=tuple(view.layers[s].attention is AttentionKind.SLIDING for s in slots),
        k_view_swa=row_size(type_k, lv.k_width) * run.swa_cells,
        v_view_swa=row_size(type_v, lv.v_width) * run.swa_cells,
        mask_swa=run.swa_cells * ubatch * 2,
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
    if run.streams != 1 or run.masks > 2:
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
