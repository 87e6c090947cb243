"""Qwen3-Next, Qwen3.5 and Qwen3.6 (qwen3next, qwen35, qwen35moe): gated delta net hybrids. Pure.

Three of every four layers are linear attention (a gated delta net) with a fixed-size recurrent
state; every `full_attention_interval`-th layer is full attention with a KV cache. The MTP/NextN
block (qwen35, qwen35moe) is dense attention and never recurrent.

Rules (llama.cpp b11312):
- recurrent layers: `attention.recurrent_layers` if present, else
  `(il + 1) % full_attention_interval != 0` on trunk layers, interval default 4
  (src/models/qwen35moe.cpp:12-24, qwen35.cpp, qwen3next.cpp);
- the hybrid memory keeps KV on `il < n_layer() && !is_recr(il)` and state on the recurrent
  trunk layers (src/llama-model.cpp ~2700, the QWEN3NEXT/QWEN35/QWEN35MOE filter);
- state per sequence and layer: (d_conv - 1) x (d_inner + 2 x n_group x d_state) + d_state x
  d_inner f32 values (src/llama-hparams.cpp n_embd_r / n_embd_s).
"""

from __future__ import annotations

from quantpick.arch.base import Architecture, HParams, MemoryClass
from quantpick.arch.family import Family, TensorShapes
from quantpick.arch.tensors import Table, head_count_kv, head_dims, per_layer

FULL_ATTENTION_INTERVAL = 4  # llama.cpp's default when the key is absent (qwen35moe.cpp:17)


def recurrent_flags(hp: HParams) -> list[bool]:
    listed = hp.key("attention.recurrent_layers")
    if isinstance(listed, tuple):
        return [bool(v) for v in listed] + [False] * (hp.n_layer_all - len(listed))
    interval = hp.int_key("full_attention_interval", FULL_ATTENTION_INTERVAL) or 1
    return [il < hp.n_layer() and (il + 1) % interval != 0 for il in range(hp.n_layer_all)]


def configure(hp: HParams) -> None:
    hp.read_ssm()
    hp.is_recr = recurrent_flags(hp)
    hp.memory = MemoryClass.HYBRID
    n = hp.n_layer()
    hp.kv_filter = lambda il: il < n and not hp.is_recr[il]
    hp.recr_filter = lambda il: il < n and hp.is_recr[il]


def recurrent_blocks(arch: Architecture) -> list[bool]:
    """is_recr per block as the loaders set it (qwen35.cpp:17-23, qwen35moe.cpp, qwen3next.cpp):
    `attention.recurrent_layers`, else every trunk block but each full_attention_interval-th."""
    listed = arch.get("attention.recurrent_layers")
    n_all = arch.block_count
    if isinstance(listed, tuple):
        return ([bool(v) for v in listed] + [False] * n_all)[:n_all]
    interval = arch.int_("full_attention_interval", FULL_ATTENTION_INTERVAL) or 1
    return [il < arch.n_layer and (il + 1) % interval != 0 for il in range(n_all)]


def tensor_shapes(arch: Architecture) -> TensorShapes:
    """(name, ne) for every tensor llama.cpp's qwen35 (src/models/qwen35.cpp:33-124), qwen35moe
    (src/models/qwen35moe.cpp:36-147) and qwen3next (src/models/qwen3next.cpp:31-129) loaders
    expect, MTP block included: gated attention (Q carries its output gate: 2 x head_k x n_head)
    or a gated delta net per trunk block, a dense FFN (qwen35) or routed experts with a gated
    shared expert, and the MTP block(s) as full-attention blocks plus the NextN tensors."""
    t = Table()
    t.head(arch)
    n_embd = arch.embedding_length
    hk, hv = head_dims(arch)
    n_head, n_kv = per_layer(arch, "attention.head_count")[0], head_count_kv(arch)[0]
    d_state, n_group = arch.int_("ssm.state_size"), arch.int_("ssm.group_count")
    n_v_heads, d_conv = arch.int_("ssm.time_step_rank"), arch.int_("ssm.conv_kernel")
    key_dim, value_dim = d_state * n_group, d_state * n_v_heads  # head_k_dim = head_v_dim = d_state
    conv_dim = key_dim * 2 + value_dim
    n_ff = per_layer(arch, "feed_forward_length")[0]
    n_expert = arch.expert_count
    n_ff_exp = arch.int_("expert_feed_forward_length") or n_ff // max(arch.expert_used_count, 1)
    n_ff_sh = arch.int_("expert_shared_feed_forward_length") or n_ff
    recurrent = recurrent_blocks(arch)
    for il in range(arch.block_count):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", n_embd)
        t.add(p + "post_attention_norm.weight", n_embd)
        if recurrent[il]:
            t.add(p + "attn_qkv.weight", n_embd, conv_dim)
            t.add(p + "attn_gate.weight", n_embd, value_dim)
            t.add(p + "ssm_conv1d.weight", d_conv, conv_dim)
            t.add(p + "ssm_dt.bias", n_v_heads)
            t.add(p + "ssm_a", n_v_heads)
            if arch.name == "qwen3next":  # one fused beta/alpha projection (qwen3next.cpp:92)
                t.add(p + "ssm_ba.weight", n_embd, 2 * n_v_heads)
            else:
                t.add(p + "ssm_beta.weight", n_embd, n_v_heads)
                t.add(p + "ssm_alpha.weight", n_embd, n_v_heads)
            t.add(p + "ssm_norm.weight", d_state)
            t.add(p + "ssm_out.weight", value_dim, n_embd)
        else:
            t.qkv(p, n_embd, hk * n_head * 2, hk * n_kv, hv * n_kv)
            t.add(p + "attn_output.weight", hk * n_head, n_embd)
            t.qk_norms(p, hk)
        if n_expert:
            t.add(p + "ffn_gate_inp.weight", n_embd, n_expert)
            t.experts(p, n_embd, n_ff_exp, n_expert)
            t.add(p + "ffn_gate_inp_shexp.weight", n_embd)
            t.shared_expert(p, n_embd, n_ff_sh)
        else:
            t.swiglu(p, n_embd, n_ff)
        if il >= arch.n_layer:
            t.nextn(p, n_embd)  # Qwen ships no embed_tokens / shared_head_head
    return t.shapes()


FAMILY = Family(
    name="qwen35",
    architectures=("qwen35moe", "qwen35", "qwen3next"),
    configure=configure,
    summary="gated delta net hybrid: KV on every full_attention_interval-th layer, "
    "fixed recurrent state on the others",
    rules=(
        "recurrent layers: attention.recurrent_layers, else (il+1) % full_attention_interval "
        "!= 0 (src/models/qwen35moe.cpp:12-24)",
        "KV on trunk attention layers only, NextN blocks excluded (src/llama-model.cpp ~2700)",
        "state F32 per sequence: n_embd_r + n_embd_s (src/llama-hparams.cpp:218-270)",
    ),
    # all three proven by tests/arch
    checked=frozenset({"qwen35moe", "qwen35", "qwen3next"}),
    tensor_shapes=tensor_shapes,
    # src/models/qwen35moe.cpp arrived with PR #19468 (b7988, notes llamacpp-memory.md §9)
    min_build={"qwen35moe": 7988, "qwen35": 7988},
    # src/models/qwen35moe.cpp load_arch_hparams: ml.get_key(LLM_KV_SSM_*) without `false`
    required_keys=(
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "ssm.conv_kernel",
        "ssm.inner_size",
        "ssm.state_size",
        "ssm.time_step_rank",
        "ssm.group_count",
    ),  # fmt: skip
    manifest_aliases={
        "ssm_conv_kernel": "ssm.conv_kernel",
        "ssm_state_size": "ssm.state_size",
        "ssm_group_count": "ssm.group_count",
        "ssm_time_step_rank": "ssm.time_step_rank",
        "ssm_inner_size": "ssm.inner_size",
    },
)
