"""State-space models and their attention hybrids (mamba, mamba2, jamba, granitehybrid,
falcon-h1, nemotron_h, nemotron_h_moe, plamo2). Pure.

Rules (llama.cpp b11312):
- mamba and mamba2 are recurrent throughout: no KV cache, one state per sequence and layer of
  (d_conv - 1) x (d_inner + 2 x n_group x d_state) + d_state x d_inner f32 values
  (src/llama-hparams.cpp:218-270; llm_arch_is_recurrent, src/llama-arch.cpp:1070-1081);
- jamba, granitehybrid, plamo2: a layer with head_count_kv(il) == 0 is a Mamba layer
  (src/models/jamba.cpp, granite-hybrid.cpp, plamo2.cpp); the others cache KV;
- nemotron_h(_moe): recurrent when head_count_kv(il) == 0 and feed_forward_length(il) == 0;
  KV only on attention layers without an FFN (src/models/nemotron-h.cpp, create_memory's
  NEMOTRON_H filter, src/llama-model.cpp ~2690);
- falcon-h1: every layer has both a KV cache and a Mamba state (create_memory ~2686).
"""

from __future__ import annotations

from quantpick.arch.base import Architecture, HParams, MemoryClass
from quantpick.arch.family import Family, TensorShapes
from quantpick.arch.tensors import Table, head_count_kv, head_dims, per_layer

RECURRENT = frozenset({"mamba", "mamba2"})


def configure(hp: HParams) -> None:
    name = hp.arch.name
    hp.ssm_d_conv = hp.int_key("ssm.conv_kernel")
    hp.ssm_d_inner = hp.int_key("ssm.inner_size")
    hp.ssm_d_state = hp.int_key("ssm.state_size")
    # mamba (v1) and jamba do not read the group count (src/models/mamba.cpp, jamba.cpp)
    if name not in ("mamba", "jamba"):
        hp.ssm_n_group = hp.int_key("ssm.group_count")
    n = hp.n_layer()
    if name in RECURRENT:
        hp.memory = MemoryClass.RECURRENT
        return
    hp.memory = MemoryClass.HYBRID
    if name == "falcon-h1":
        hp.is_recr = [True] * hp.n_layer_all
        hp.kv_filter = lambda il: True
        hp.recr_filter = lambda il: True
    elif name in ("nemotron_h", "nemotron_h_moe"):
        hp.is_recr = [
            il < n and hp.n_head_kv[il] == 0 and hp.n_ff[il] == 0 for il in range(hp.n_layer_all)
        ]
        hp.kv_filter = lambda il: not hp.is_recr[il] and hp.n_ff[il] == 0
        hp.recr_filter = lambda il: hp.is_recr[il] and hp.n_ff[il] == 0
    else:
        hp.is_recr = [il < n and hp.n_head_kv[il] == 0 for il in range(hp.n_layer_all)]


def _nemotron_h(arch: Architecture) -> TensorShapes:
    """src/models/nemotron-h.cpp:49-182 (dense nemotron_h): per block one of a Mamba2 mixer
    (head_count_kv and feed_forward_length both 0; the conv bias that Nemotron-H's
    `use_conv_bias` ships), attention without biases (feed_forward_length 0), or a non-gated
    ReLU^2 MLP (up/down only)."""
    t = Table()
    t.head(arch)
    n_embd = arch.embedding_length
    hk, hv = head_dims(arch)
    n_head, n_kv = per_layer(arch, "attention.head_count"), head_count_kv(arch)
    n_ff = per_layer(arch, "feed_forward_length")
    d_conv, d_inner = arch.int_("ssm.conv_kernel"), arch.int_("ssm.inner_size")
    d_state, n_group = arch.int_("ssm.state_size"), arch.int_("ssm.group_count")
    n_ssm_head = arch.int_("ssm.time_step_rank")
    d_in_proj = 2 * d_inner + 2 * n_group * d_state + n_ssm_head  # nemotron-h.cpp:63
    conv_ch = d_inner + 2 * n_group * d_state
    for il in range(arch.n_layer):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", n_embd)
        if n_kv[il] == 0 and n_ff[il] == 0:
            t.add(p + "ssm_in.weight", n_embd, d_in_proj)
            t.add(p + "ssm_conv1d.weight", d_conv, conv_ch)
            t.add(p + "ssm_conv1d.bias", conv_ch)
            t.add(p + "ssm_dt.bias", n_ssm_head)
            t.add(p + "ssm_a", 1, n_ssm_head)
            t.add(p + "ssm_d", 1, n_ssm_head)
            t.add(p + "ssm_norm.weight", d_inner // n_group, n_group)
            t.add(p + "ssm_out.weight", d_inner, n_embd)
        elif n_ff[il] == 0:
            t.qkv(p, n_embd, hk * n_head[il], hk * n_kv[il], hv * n_kv[il])
            t.add(p + "attn_output.weight", hk * n_head[il], n_embd)
        else:
            t.add(p + "ffn_down.weight", n_ff[il], n_embd)
            t.add(p + "ffn_up.weight", n_embd, n_ff[il])
    return t.shapes()


def tensor_shapes(arch: Architecture) -> TensorShapes | None:
    return _nemotron_h(arch) if arch.name == "nemotron_h" else None


ARCHS = (
    "mamba", "mamba2", "jamba", "granitehybrid", "falcon-h1", "nemotron_h", "nemotron_h_moe",
    "plamo2",
)  # fmt: skip

FAMILY = Family(
    name="ssm",
    architectures=ARCHS,
    configure=configure,
    summary="Mamba state-space layers (all of them, or those with head_count_kv 0 beside "
    "attention layers)",
    rules=(
        "state F32 per sequence and layer: n_embd_r + n_embd_s (src/llama-hparams.cpp:218-270)",
        "hybrids: recurrent where head_count_kv(il) == 0 (nemotron_h: and no FFN)",
    ),
    recurrent=RECURRENT,
    # every one proven by tests/arch
    checked=frozenset(ARCHS),
    tensor_shapes=tensor_shapes,
)
