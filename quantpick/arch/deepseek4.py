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

from quantpick.arch.base import Architecture, CompressedCache, CompressorState, HParams, SwaType
from quantpick.arch.family import Family
from quantpick.arch.graph import ArchLive, GraphSizes, GraphTrait

# src/llama-kv-cache-dsv4.cpp:18-19
CSA_RATIO = 4
HCA_RATIO = 128
# Bytes per compressed cell and token alive in a CSA layer's top-k selection (layer_live): the
# f32 scores and the argsort, then the argsort and its I32 copy (8), + 2 measured: against
# llama-memory-bytes on test-llama-archs' deepseek4, 10 puts the recorded rows at a median of
# 0.5% (8: 1.2%; 12: 1.2%) and -c 100000 at 203 vs 204 MiB (8: 179).
TOP_K_BYTES = 10


def _ratios(arch: Architecture) -> list[int]:
    listed = arch.get("attention.compress_ratios")
    ratios = [int(v) for v in listed] if isinstance(listed, tuple) else []
    return ratios + [0] * (arch.block_count - len(ratios))


def configure(hp: HParams) -> None:
    window = hp.key("attention.sliding_window")
    hp.n_swa = int(window) if isinstance(window, (int, float)) else 0
    hp.swa_type = SwaType.STANDARD
    hp.is_swa = [True] * hp.n_layer_all  # set_swa_pattern(0), NextN blocks forced on
    hp.k_only = True
    hp.split_streams = True
    hp.kv_filter = lambda il: True  # the raw cache's filter is null: every block
    ratios = _ratios(hp.arch)
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


def compressed_layer(arch: Architecture, il: int) -> bool:
    """A layer that attends over a compressed cache (ratio 4 or 128) beside its window."""
    return _ratios(arch)[il] in (CSA_RATIO, HCA_RATIO)


def no_live(arch: Architecture, g: GraphSizes) -> ArchLive:
    return ArchLive()


def layer_live(arch: Architecture, g: GraphSizes, il: int) -> ArchLive:
    """A compressed layer's own attention (src/models/deepseek4.cpp at b11312), n = its
    compressed cells per stream in the reserve (plan.n_kv = the cache's size,
    llama-kv-cache-dsv4.cpp:842-853), T = the ubatch, m = the mask's bytes (f16 with flash
    attention, else f32), w = the raw window's cells (pad256(min(kv_size, n_swa + T))).

    Inputs (llama-graph.cpp:958-986 dsv4_build_comp_inputs): a CSA layer reads the CSA mask
    (n x T x m) and the lightning indexer's (n x T, f16: the fused indexer, cparams.fused_lid,
    src/llama-context.cpp:237, 571), an HCA layer its own mask; the raw window's mask is the
    generic sliding-window one; the small index vectors (O(T) I32) are left out.

    Temporaries: CSA (build_lid_top_k, build_top_k_mask, build_csa_lid_attention :590-760)
    the indexer's Q (T x indexer.head_count x indexer.key_length f32, :607-620) beside its f32
    scores (nT x 4), then ggml_top_k's argsort and its I32 copy (n_top_k = n: top_k is
    131072), alive two at a time (TOP_K_BYTES x nT); then fill + add of the mask (2 x m nT)
    and its concat with the raw mask (m (w + n) T): the largest of these. (A second copy of
    the indexer's Q, rope then Hadamard rotation, would put the -np 1 host rows 16% over:
    measured, not kept.) HCA (:790-815): the concat mask. Without flash attention the KQ
    matrix is over w + n cells (the generic rule counts the window's w): n x T x n_head
    x 4 more."""
    ratio = _ratios(arch)[il]
    if ratio not in (CSA_RATIO, HCA_RATIO):
        return ArchLive()
    n = CompressedCache(0, ratio).cells(g.cells)
    t, m = g.ubatch, g.mask_bytes
    window = arch.int_("attention.sliding_window")
    w = min(g.cells, window + t)
    w = (w + 255) // 256 * 256
    concat = m * (w + n) * t
    no_fa = n * t * arch.head_count * 4 if m == 4 else 0
    if ratio == CSA_RATIO:
        masks = n * t * (m + 2)
        n_index = arch.int_("attention.indexer.head_count")
        index_q = t * n_index * arch.int_("attention.indexer.key_length") * 4
        layer = max(index_q + 4 * n * t, TOP_K_BYTES * n * t, 2 * m * n * t, m * n * t + concat)
        layer += no_fa
    else:
        masks = n * t * m
        layer = concat + no_fa
    return ArchLive(layer=layer, inputs=masks, inputs_in_layer=masks)


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
    graph_traits={
        "deepseek4": GraphTrait(
            no_live,
            "src/models/deepseek4.cpp, llama-graph.cpp:958-986: each compressed layer's masks",
            layers=compressed_layer,
            by_layer=layer_live,
        )
    },
)
