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

from quantpick.arch.base import Architecture, HParams, MemoryClass
from quantpick.arch.family import Family
from quantpick.arch.graph import ArchLive, GraphSizes, GraphTrait


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


def kpool_selection(arch: Architecture, g: GraphSizes) -> int:
    """glm5-next's k-pool indexer: the slots one token selects in the reserved graph (n_sel).

    The reserve's full context counts every pool every sequence could own: n_pool =
    kpool_pad(cells / kpool x n_seq_max), kpool_pad(n) = max(64, pad(n + 1, 64))
    (src/llama-memory-hybrid-idx.cpp:706-708, :833-837); the indexer keeps
    min(n_pool, top_k / kpool) pools and their kpool cells each, plus the kpool - 1 cells of the
    incomplete tail (src/models/glm5-next.cpp:326-329)."""
    kpool = max(arch.int_("attention.indexer.kpool"), 1)
    n_pool = max(64, -(-(g.cells // kpool * g.n_seq_max + 1) // 64) * 64)
    n_top_pool = min(n_pool, arch.int_("attention.indexer.top_k") // kpool)
    tail = kpool - 1 if arch.get("attention.indexer.kpool_select_tail", False) else 0
    return kpool * n_top_pool + tail


def kpool_live(arch: Architecture, g: GraphSizes) -> ArchLive:
    """glm5-next's DSA layer (build_kpool_select, src/models/glm5-next.cpp:765-905).

    Its inputs (build_inp_kpool, :290-345): the slot mask (gather_mask, f32 [n_sel, n_tokens],
    kept allocated whether an op reads it or not, :333-337) and the pool mask ([n_pool,
    n_tokens], f16 for the fused lightning indexer, :303, :310); the index tensors are small.
    The layer turns the selection into a KQ mask by a scatter (:885-918), alive together per
    selected slot and token beside the slot mask (its last use is there): the filled mask's
    slots (mask_all, f16, :894-895), the zeros it scatters (f32, :897-899), the live slots (exp
    of the slot mask, f32, :904) and the slot indices as f32 (:905-908; sub, mul and add in
    place): 14 + 4 = 18 bytes per slot and token. Measured (tests/data/arch-traits.json,
    llama-memory-bytes on test-llama-archs' glm5-next at -c 8192-32768, -ub 256-1024, -np 1-8
    with and without -kvu): 18.2-18.5 bytes per slot and token beside the generic KQ mask, no
    separate term for mask_all's n_kv part; n_sel stops growing at top_k (-np 8 -kvu reserves
    less than -np 4). Within 2.6% of every row with flash attention, -7.4% without."""
    kpool = max(arch.int_("attention.indexer.kpool"), 1)
    n_pool = max(64, -(-(g.cells // kpool * g.n_seq_max + 1) // 64) * 64)
    n_sel = kpool_selection(arch, g)
    slot_mask = 4 * n_sel * g.ubatch
    pool_mask = 2 * n_pool * g.ubatch
    return ArchLive(
        layer=14 * n_sel * g.ubatch, inputs=slot_mask + pool_mask, inputs_in_layer=slot_mask
    )


ARCHS = ("minimax-01", "kimi-linear", "kimi-k3", "bailingmoe3", "glm5-next")

FAMILY = Family(
    name="linear_attention",
    architectures=ARCHS,
    configure=configure,
    summary="linear-attention layers with a fixed state beside softmax (or MLA) attention",
    rules=("state F32 per sequence and layer: n_embd_r + n_embd_s (src/llama-hparams.cpp)",),
    # every one proven by tests/arch
    checked=frozenset(ARCHS),
    graph_traits={
        "glm5-next": GraphTrait(
            kpool_live,
            source="src/models/glm5-next.cpp build_kpool_select: the k-pool selection's masks",
        )
    },
)
