"""The gated delta-net families' host layers (qwen3next, qwen35, qwen35moe) as llama.cpp runs
them on a GPU by op offload, replayed through plan/host_replay.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from quantpick.model.ggml import row_size
from quantpick.model.layout import ModelLayout
from quantpick.plan.host_replay import (
    Copied,
    HostLayerConfig,
    Op,
    replay_layers,
    rotate,
    rotation_bytes,
    softmax_router,
    weighted_sum,
)


@dataclass(frozen=True)
class HybridFamily:
    """Where the qwen3next-derived families' layers differ (src/models/qwen3next.cpp,
    qwen35.cpp, qwen35moe.cpp at b11312)."""

    fused_ba: bool  # one `ssm_ba` projection for the decay and the beta (qwen3next), or two
    repeat_qk: bool  # Q and K repeated to the V heads before the delta net (qwen3next :516-533)
    positions: int  # token positions per token: 1, or 4 for the multi-section rope (qwen35)
    experts: bool  # routed experts beside a shared expert (qwen3next, qwen35moe), or a dense FFN


HYBRID_FAMILIES = {
    "qwen3next": HybridFamily(fused_ba=True, repeat_qk=True, positions=1, experts=True),
    # the delta net broadcasts the K heads itself; imrope positions: n_pos_per_embd() == 4
    "qwen35": HybridFamily(fused_ba=False, repeat_qk=False, positions=4, experts=False),
    "qwen35moe": HybridFamily(fused_ba=False, repeat_qk=False, positions=4, experts=True),
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
    ops += softmax_router(n, t, s.n_expert, k, w("ffn_gate_inp.weight"), "post_n" + n)
    ops.append(Op("experts" + n, 0, ("post_n" + n, "argsort" + n), on_host=True))
    down = t * k * (e // t)
    ops += weighted_sum(n, e, k, (act("moe_down", down), down), "moe_out" + n)
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


@lru_cache(maxsize=256)  # pure; an offload search asks again for the same host layers
def hybrid_host_layers_peak(s: HybridLayers, alignment: int) -> int:
    """The device buffer's high-water mark over the host layers of `s` run by op offload."""
    return replay_layers(s.e, len(s.kinds), lambda i, x: _hybrid_ops(i, s, x), alignment)


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
    ffn_block = _SHARED_EXPERTS_BLOCK if family.experts else _DENSE_FFN_BLOCK
    blocks, kinds = [], []
    for slot in slots:
        own = layout.block_tensor_bytes[slot]
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
        k_rot=rotation_bytes(type_k, attn.k_width // n_head_kv, grow=True),
        v_rot=rotation_bytes(type_v, attn.v_width // n_head_kv, grow=False),
        family=family,
        ffn=ubatch * up.shape[1] * 4 if up is not None and len(up.shape) > 1 else 0,
    )
