"""Sparse attention with a lightning indexer (deepseek32, glm-dsa, hy_v4, minimax-m3): MLA (or
plain) attention beside a per-token indexer key cache. Pure.

Rules (llama.cpp b11312):
- DSA (deepseek32, glm-dsa, hy_v4): the main cache is MLA (K only); a second cache holds one
  indexer key head of `attention.indexer.key_length` per token, type -ctk, on every trunk layer
  (deepseek32) or on the layers `attention.indexer.types` marks (glm-dsa: every layer before
  GLM 5.2, i.e. context_length < 1048576, else GLM-5.2's default list; hy_v4: none when
  `attention.indexer.top_k` is 0) (src/llama-kv-cache-dsa.cpp:29-54, src/models/glm-dsa.cpp:31-38,
  src/models/hy-v4.cpp:22-38, src/llama-model.cpp:2375-2535);
- MSA (minimax-m3): a plain cache plus an indexer cache with one key head of indexer.key_length
  and one value head of value_length, on layers il >= leading_dense_block_count
  (src/llama-kv-cache-msa.cpp:28-50, src/llama-model.cpp:2376-2395).
"""

from __future__ import annotations

from quantpick.arch.base import Architecture, HParams
from quantpick.arch.family import Family
from quantpick.arch.graph import ArchLive, GraphSizes, GraphTrait

# src/models/glm-dsa.cpp:6-22 GLM_5_2_DEFAULT_INDEXER_TYPES: 1, 1, then one in four.
GLM_5_2_FIRST_FULL = 2
GLM_5_2_PERIOD = 4


def _types(hp: HParams, default: list[bool]) -> list[bool]:
    listed = hp.key("attention.indexer.types")
    if isinstance(listed, tuple):
        return [bool(v) for v in listed] + [False] * (hp.n_layer_all - len(listed))
    if isinstance(listed, (int, float)) and not isinstance(listed, bool):
        return [bool(listed)] * hp.n_layer_all
    return default


def configure(hp: HParams) -> None:
    name = hp.arch.name
    n = hp.n_layer()
    hp.n_embd_head_k_mla = hp.int_key("attention.key_length_mla")
    hp.n_embd_head_v_mla = hp.int_key("attention.value_length_mla")
    hp.index_k_width = hp.int_key("attention.indexer.key_length")
    if name == "deepseek32":
        hp.index_filter = lambda il: il < n
    elif name == "glm-dsa":
        if hp.n_ctx_train < 1048576:
            default = [True] * hp.n_layer_all
        else:
            default = [
                il < GLM_5_2_FIRST_FULL or (il - GLM_5_2_FIRST_FULL) % GLM_5_2_PERIOD == 0
                for il in range(hp.n_layer_all)
            ]
        types = _types(hp, default)
        hp.index_filter = lambda il: il < n and types[il]
    elif name == "hy_v4":
        if hp.int_key("attention.indexer.top_k") == 0:
            hp.index_k_width = 0
        else:
            types = _types(hp, [False] * hp.n_layer_all)
            hp.index_filter = lambda il: types[il]
    elif name == "minimax-m3":
        hp.n_embd_head_k_mla = hp.n_embd_head_v_mla = 0
        lead = hp.int_key("leading_dense_block_count")
        hp.index_v_width = hp.n_embd_head_v_full
        hp.index_filter = lambda il: il >= lead


def msa_live(arch: Architecture, g: GraphSizes) -> ArchLive:
    """minimax-m3's sparse (MSA) layers, il >= leading_dense_block_count (src/models/minimax-m3.cpp
    at b11312). MSA runs only with flash attention and per-sequence streams (one sequence, or no
    unified cache), else every layer is dense (:226-235). Hoisted for every sparse layer: an f32
    copy of the KQ mask (msa_mf, [n_kv, n_tokens], :256, :295); per stream in turn (:450-522)
    the block mask expanded to cells (bmc / bmx, f32 [n_kv, n_tokens / n_stream x
    n_indexer_head], :510-513, then cast to the f16 mask4 the flash attention reads, :514-515).
    The position-axis inputs (pos_mask, bias: [n_ps, n_tokens], :279-282) are sized by the
    positions in the cache, none in the reserve. llama-memory-bytes on test-llama-archs'
    minimax-m3 (2 indexer heads) at -c 4096-32768, -ub 256-1024, -np 1 and 2, and two RPC devices
    with pipeline copies: 18 bytes per cell and token at -np 1, 14 at -np 2, i.e. beside the f16
    KQ mask 8 per cell and token over the ubatch + 4 x n_indexer_head per cell and token of one
    stream; dense (nothing extra) with -kvu and more than one sequence, and with -fa off."""
    if g.mask_bytes != 2 or (g.n_seq_max > 1 and g.n_stream == 1):
        return ArchLive()
    per_stream = 4 * arch.int_("attention.indexer.head_count") * (g.ubatch // g.n_stream)
    return ArchLive(layer=g.cells * (8 * g.ubatch + per_stream))


def msa_layer(arch: Architecture, il: int) -> bool:
    """minimax-m3's sparse layers: every one from leading_dense_block_count on (:332)."""
    return il >= arch.int_("leading_dense_block_count")


FAMILY_ARCHS = ("deepseek32", "glm-dsa", "hy_v4", "minimax-m3")

FAMILY = Family(
    name="sparse_attention",
    architectures=FAMILY_ARCHS,
    configure=configure,
    summary="MLA or plain attention with a lightning indexer's per-token key cache beside it",
    rules=(
        "indexer cache: one key head of indexer.key_length per token, -ctk type, full context "
        "(src/llama-kv-cache-dsa.cpp:29-54; MSA adds a value head: llama-kv-cache-msa.cpp)",
    ),
    # every one proven by tests/arch
    checked=frozenset(FAMILY_ARCHS),
    graph_traits={
        "minimax-m3": GraphTrait(
            msa_live,
            "src/models/minimax-m3.cpp: MSA's f32 mask copy, position mask and block scores",
            layers=msa_layer,
        )
    },
)
