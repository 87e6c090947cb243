"""Linear-attention hybrids (minimax-01, kimi-linear, kimi-k3, bailingmoe3). Pure.

Rules (llama.cpp b11312):
- minimax-01: lightning-attention layers from `attention.recurrent_layers`, else every
  `full_attention_interval`-th layer (default 8) is softmax attention; state head_dim^2 x n_head
  f32 (n_embd_head_la = key_length; src/models/minimax-01.cpp, llama-hparams.cpp n_embd_s);
  KV on trunk attention layers (create_memory's MINIMAX_01 filter);
- kimi-linear, kimi-k3, bailingmoe3: Kimi delta attention (KDA) where head_count_kv(il) == 0,
  MLA (K-only cache) on the other layers; conv state 3 x (d_conv - 1) x n_head x kda_head_dim
  and state kda_head_dim^2 x n_head (src/models/kimi-linear.cpp, llama-hparams.cpp:218-270).
"""

from __future__ import annotations

from quantpick.arch.base import HParams, MemoryClass
from quantpick.arch.family import Family


def configure(hp: HParams) -> None:
    name = hp.arch.name
    n = hp.n_layer()
    hp.memory = MemoryClass.HYBRID
    if name == "minimax-01":
        hp.n_embd_head_la = hp.n_embd_head_k_full
        listed = hp.key("attention.recurrent_layers")
        if isinstance(listed, tuple):
            hp.is_recr = [bool(v) for v in listed] + [False] * (hp.n_layer_all - len(listed))
        else:
            interval = hp.int_key("full_attention_interval", 8) or 1
            hp.is_recr = [il < n and (il + 1) % interval != 0 for il in range(hp.n_layer_all)]
        hp.kv_filter = lambda il: il < n and not hp.is_recr[il]
        hp.recr_filter = lambda il: il < n and hp.is_recr[il]
        return
    hp.n_embd_head_k_mla = hp.int_key("attention.key_length_mla")
    hp.n_embd_head_v_mla = hp.int_key("attention.value_length_mla")
    hp.ssm_d_conv = hp.int_key("ssm.conv_kernel")
    hp.n_embd_head_kda = hp.int_key("kda.head_dim")
    if name in ("kimi-k3", "glm5-next"):
        hp.n_embd_head_v_full = hp.int_key("attention.kv_lora_rank")
    hp.is_recr = [il < n and hp.n_head_kv[il] == 0 for il in range(hp.n_layer_all)]
    if name == "glm5-next":
        # hybrid-idx (src/llama-memory-hybrid-idx.cpp:53-73, src/llama-model.cpp:2450-2493):
        # trunk attention layers only (NextN excluded), and an indexer cache of key, gate and
        # pooled values (3 x indexer.key_length with kpool) on the layers indexer.types marks
        listed = hp.key("attention.indexer.types")
        types = (
            [bool(v) for v in listed] + [False] * hp.n_layer_all
            if isinstance(listed, tuple)
            else [True] * hp.n_layer_all
        )
        pooled = hp.int_key("attention.indexer.kpool") > 0
        hp.index_k_width = hp.int_key("attention.indexer.key_length") * (3 if pooled else 1)
        hp.kv_filter = lambda il: il < n and not hp.is_recr[il]
        hp.recr_filter = lambda il: il < n and hp.is_recr[il]
        hp.index_filter = lambda il: il < n and not hp.is_recr[il] and types[il]


ARCHS = ("minimax-01", "kimi-linear", "kimi-k3", "bailingmoe3", "glm5-next")

FAMILY = Family(
    name="linear_attention",
    architectures=ARCHS,
    configure=configure,
    summary="linear-attention layers with a fixed state beside softmax (or MLA) attention",
    rules=("state F32 per sequence and layer: n_embd_r + n_embd_s (src/llama-hparams.cpp)",),
    # every one proven by tests/arch
    checked=frozenset(ARCHS),
)
