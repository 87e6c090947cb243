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


def tensor_shapes(arch: Architecture) -> TensorShapes:
    """(name, ne) for every tensor llama.cpp's qwen35moe loader expects, MTP block included
    (src/models/qwen35moe.cpp: load_arch_tensors)."""
    n_embd, n_vocab = arch.embedding_length, arch.vocab_size
    head_dim = arch.int_("attention.key_length")
    value_len = arch.int_("attention.value_length", head_dim)
    n_head, n_head_kv = arch.head_count, arch.int_("attention.head_count_kv", arch.head_count)
    d_state, n_group = arch.int_("ssm.state_size"), arch.int_("ssm.group_count")
    value_dim = arch.int_("ssm.inner_size")
    key_dim = d_state * n_group
    conv_dim = key_dim * 2 + value_dim
    n_v_heads = arch.int_("ssm.time_step_rank")
    n_expert = arch.expert_count
    ff_exp = arch.int_("expert_feed_forward_length")
    ff_sh = arch.int_("expert_shared_feed_forward_length")
    interval = arch.int_("full_attention_interval", FULL_ATTENTION_INTERVAL) or 1
    n_layer = arch.n_layer
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("token_embd.weight", (n_embd, n_vocab)),
        ("output_norm.weight", (n_embd,)),
    ]
    if arch.has_output_tensor:
        shapes.append(("output.weight", (n_embd, n_vocab)))
    for il in range(arch.block_count):
        p = f"blk.{il}."
        nextn = il >= n_layer
        shapes += [
            (p + "attn_norm.weight", (n_embd,)),
            (p + "post_attention_norm.weight", (n_embd,)),
        ]
        if not nextn and (il + 1) % interval != 0:
            shapes += [
                (p + "attn_qkv.weight", (n_embd, conv_dim)),
                (p + "attn_gate.weight", (n_embd, value_dim)),
                (p + "ssm_conv1d.weight", (arch.int_("ssm.conv_kernel"), conv_dim)),
                (p + "ssm_dt.bias", (n_v_heads,)),
                (p + "ssm_a", (n_v_heads,)),
                (p + "ssm_beta.weight", (n_embd, n_v_heads)),
                (p + "ssm_alpha.weight", (n_embd, n_v_heads)),
                (p + "ssm_norm.weight", (d_state,)),
                (p + "ssm_out.weight", (value_dim, n_embd)),
            ]
        else:
            shapes += [
                (p + "attn_q.weight", (n_embd, head_dim * n_head * 2)),
                (p + "attn_k.weight", (n_embd, head_dim * n_head_kv)),
                (p + "attn_v.weight", (n_embd, value_len * n_head_kv)),
                (p + "attn_output.weight", (head_dim * n_head, n_embd)),
                (p + "attn_q_norm.weight", (head_dim,)),
                (p + "attn_k_norm.weight", (head_dim,)),
            ]
        shapes += [
            (p + "ffn_gate_inp.weight", (n_embd, n_expert)),
            (p + "ffn_down_exps.weight", (ff_exp, n_embd, n_expert)),
            (p + "ffn_gate_exps.weight", (n_embd, ff_exp, n_expert)),
            (p + "ffn_up_exps.weight", (n_embd, ff_exp, n_expert)),
            (p + "ffn_gate_inp_shexp.weight", (n_embd,)),
            (p + "ffn_gate_shexp.weight", (n_embd, ff_sh)),
            (p + "ffn_up_shexp.weight", (n_embd, ff_sh)),
            (p + "ffn_down_shexp.weight", (ff_sh, n_embd)),
        ]
        if nextn:
            shapes += [
                (p + "nextn.eh_proj.weight", (2 * n_embd, n_embd)),
                (p + "nextn.enorm.weight", (n_embd,)),
                (p + "nextn.hnorm.weight", (n_embd,)),
                (p + "nextn.shared_head_norm.weight", (n_embd,)),
            ]
    return tuple(shapes)


def _shapes(arch: Architecture) -> TensorShapes:
    if arch.name != "qwen35moe":
        raise ValueError(f"no tensor table for {arch.name} yet (qwen35moe only)")
    return tensor_shapes(arch)


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
    checked=frozenset({"qwen35moe"}),
    tensor_shapes=_shapes,
    # src/models/qwen35moe.cpp arrived with PR #19468 (b7988, notes llamacpp-memory.md §9)
    min_build={"qwen35moe": 7988, "qwen35": 7988},
    # src/models/qwen35moe.cpp load_arch_hparams: ml.get_key(LLM_KV_SSM_*) without `false`
    required_keys=(
        "attention.head_count", "attention.head_count_kv", "attention.key_length",
        "ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank",
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
