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

from quantpick.arch.base import HParams, MemoryClass
from quantpick.arch.family import Family

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


FAMILY = Family(
    name="ssm",
    architectures=(
        "mamba", "mamba2", "jamba", "granitehybrid", "falcon-h1", "nemotron_h",
        "nemotron_h_moe", "plamo2",
    ),  # fmt: skip
    configure=configure,
    summary="Mamba state-space layers (all of them, or those with head_count_kv 0 beside "
    "attention layers)",
    rules=(
        "state F32 per sequence and layer: n_embd_r + n_embd_s (src/llama-hparams.cpp:218-270)",
        "hybrids: recurrent where head_count_kv(il) == 0 (nemotron_h: and no FFN)",
    ),
    recurrent=RECURRENT,
    checked=frozenset(),
)
