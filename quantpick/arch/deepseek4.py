"""DeepSeek-V4 (deepseek4): a sliding-window raw cache on every layer, and on the layers that
compress, K-only caches of one cell per 4 (CSA, with a lightning indexer) or 128 (HCA) tokens
and the compressors' running state. Pure.

Rules (llama.cpp b11312, src/llama-kv-cache-dsv4.cpp unless named):
- every block slides (set_swa_pattern(0), NextN blocks too: src/models/deepseek4.cpp:67-74);
  `attention.sliding_window_pattern` is not read;
- the raw cache is an ISWA cache of K only (dsv4_make_k_only, :883-887, 1253-1258) on every
  block (no filter), so only its window half holds layers: pad256(min(kv_size, n_swa +
  n_ubatch)) cells per stream, the whole kv_size with --swa-full (llama-kv-cache-iswa.cpp
  :72-80); K and V types must match (src/llama-context.cpp:3835);
- every cache keeps one stream per sequence whatever -kvu says (unified_raw = false :1238-1241,
  unified_compressed = false :1283), over kv_size = n_ctx_seq (n_ctx with -kvu);
- a block with `attention.compress_ratios[il]` 4 (CSA, :18) keeps a compressed K cache and a
  lightning-indexer cache of `attention.indexer.key_length` per cell, each
  pad256(max(1, ceil(kv_size / 4))) cells per stream; one with ratio 128 (HCA, :19) a compressed
  K cache of pad256(max(1, ceil(kv_size / 128))) cells (:28-30, 1270-1306), -ctk type;
- their compressors keep f32 state on the trunk layers of that ratio (model.hparams.n_layer(),
  :941): CSA 2 x head_k wide, 8 rows; HCA head_k wide, 128 rows; the indexer's 2 x
  indexer.key_length wide, 8 rows (:1308-1321); two tensors (kv, score) of n_stream x
  (1 + n_rs_seq) planes each (:963-965), n_rs_seq the MTP/EAGLE3/DFlash draft length
  (common/common.h:396-402; deepseek4 supports rollback: src/llama-arch.cpp:1123-1129).
"""

from __future__ import annotations

from quantpick.arch.base import CompressedCache, CompressorState, HParams, SwaType
from quantpick.arch.family import Family

# src/llama-kv-cache-dsv4.cpp:18-19
CSA_RATIO = 4
HCA_RATIO = 128


def configure(hp: HParams) -> None:
    window = hp.key("attention.sliding_window")
    hp.n_swa = int(window) if isinstance(window, (int, float)) else 0
    hp.swa_type = SwaType.STANDARD
    hp.is_swa = [True] * hp.n_layer_all  # set_swa_pattern(0), NextN blocks forced on
    hp.k_only = True
    hp.split_streams = True
    hp.kv_filter = lambda il: True  # the raw cache's filter is null: every block
    listed = hp.key("attention.compress_ratios")
    ratios = [int(v) for v in listed] if isinstance(listed, tuple) else []
    ratios += [0] * (hp.n_layer_all - len(ratios))
    n_trunk = hp.n_layer()
    head_k = hp.n_embd_head_k(0)  # model.hparams.n_embd_head_k(): layer 0's
    index_k = hp.int_key("attention.indexer.key_length")
    widths = {il: hp.n_embd_k_gqa(il) for il in range(hp.n_layer_all)}

    def compressed(il: int) -> tuple[CompressedCache, ...]:
        if ratios[il] == CSA_RATIO:
            # the indexer cache: one head (n_head_kv 1) of indexer.key_length (:1263-1268)
            return (CompressedCache(widths[il], CSA_RATIO), CompressedCache(index_k, CSA_RATIO))
        if ratios[il] == HCA_RATIO:
            return (CompressedCache(widths[il], HCA_RATIO),)
        return ()

    def states(il: int) -> tuple[CompressorState, ...]:
        if il >= n_trunk:
            return ()
        if ratios[il] == CSA_RATIO:
            return (
                CompressorState(2 * head_k, 2 * CSA_RATIO),
                CompressorState(2 * index_k, 2 * CSA_RATIO),
            )
        if ratios[il] == HCA_RATIO:
            return (CompressorState(head_k, HCA_RATIO),)
        return ()

    hp.compressed = compressed
    hp.states = states


FAMILY = Family(
    name="deepseek4",
    architectures=("deepseek4",),
    configure=configure,
    summary="a K-only sliding-window cache on every layer, plus caches compressed 4x (with a "
    "lightning indexer) or 128x and their compressors' state",
    rules=(
        "raw cache: K only, every layer slides, pad256(min(kv_size, n_swa + n_ubatch)) cells "
        "per sequence even with -kvu (src/llama-kv-cache-dsv4.cpp:1238-1258)",
        "compress ratio 4: K and indexer K caches of pad256(ceil(kv_size / 4)) cells; ratio "
        "128: a K cache of pad256(ceil(kv_size / 128)) cells (src/llama-kv-cache-dsv4.cpp"
        ":1270-1306)",
        "compressor state: f32 kv + score, per sequence x (1 + n_rs_seq) "
        "(src/llama-kv-cache-dsv4.cpp:963-965, 1308-1321)",
    ),
    checked=frozenset({"deepseek4"}),
)
