"""What an architecture is, as data: the GGUF hyperparameters of one model (`Architecture`) and
the per-layer view llama.cpp sizes its memory from (`ModelView`). Pure.

The view is built in two steps that mirror llama.cpp b11312:

1. `load_hparams` reads the keys every architecture shares, exactly as
   `llama_model_base::load_hparams` does (src/llama-model.cpp:1298-1479): block count, NextN
   blocks, per-layer head counts (`get_key_or_arr`: a scalar or one value per layer), head sizes
   (default n_embd / n_head), the SWA head sizes, experts.
2. The architecture's family module (`quantpick/arch/<family>.py`) adjusts that, as the model's
   `load_arch_hparams` (src/models/<arch>.cpp) and `llama_model::create_memory`
   (src/llama-model.cpp:2352-2800) do: which layers slide (SWA), which are recurrent, which share
   another layer's KV, MLA head sizes, the recurrent state's size, the memory class.

`build_view` then lays out each layer's cache exactly as the cache constructors do
(src/llama-kv-cache.cpp:160-250, llama-kv-cache-iswa.cpp:52-100, llama-memory-recurrent.cpp,
llama-memory-hybrid.cpp). Nothing outside quantpick/arch/ knows a family's quirks: memory, speed
and the planner read only the view.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

# A hyperparameter value as GGUF stores it: a scalar or one value per layer.
HValue = int | float | bool | str | tuple[int | float | bool, ...]

# src/llama-hparams.h:11 LLAMA_MAX_LAYERS: llama.cpp refuses more blocks than this.
MAX_LAYERS = 512


class AttentionKind(str, Enum):
    """How one layer attends (str values: they appear in --json documents)."""

    FULL = "full"  # over the whole context: cells = the context per sequence
    SLIDING = "sliding"  # a window (SWA, chunked): cells capped by n_swa (+ ubatch)
    NONE = "none"  # no attention: recurrent (SSM, linear attention), short convolution


class SwaType(str, Enum):
    """src/llama-hparams.h llama_swa_type."""

    NONE = "none"
    STANDARD = "standard"
    CHUNKED = "chunked"
    SYMMETRIC = "symmetric"


class MemoryClass(str, Enum):
    """Which llama_memory_i `create_memory` builds (src/llama-model.cpp:2352-2800)."""

    NONE = "none"  # embedding and diffusion models: no cache
    KV = "kv"  # llama_kv_cache
    ISWA = "iswa"  # llama_kv_cache_iswa: a full cache and a window-sized one
    RECURRENT = "recurrent"  # llama_memory_recurrent
    HYBRID = "hybrid"  # llama_memory_hybrid: KV on some layers, recurrent state on others
    HYBRID_ISWA = "hybrid-iswa"  # llama_memory_hybrid_iswa


class OffloadKind(str, Enum):
    """What moves to host memory first when the GPUs are short."""

    EXPERTS = "experts"  # routed experts (--n-cpu-moe / -ot), then layers
    LAYERS = "layers"  # whole layers (-ngl N)


def _int_key(key: str) -> cached_property[int]:
    """A fact every stage reads: the GGUF key `key` as an int (`Architecture.int_`), read once."""

    def read(arch: Architecture) -> int:
        return arch.int_(key)

    read.__doc__ = f"`{key}` as an int (0 when absent)."
    return cached_property(read)


@dataclass(frozen=True)
class Architecture:
    """The GGUF hyperparameters of one model: `general.architecture` and its `<arch>.*` keys
    (the prefix stripped: "attention.head_count_kv"), plus the two facts the tensor table gives.

    Built from a GGUF header (model/gguf.py) or a manifest's [architecture] table."""

    name: str  # general.architecture, e.g. "qwen35moe"
    hparams: tuple[tuple[str, HValue], ...]  # sorted (key, value): hashable, so views cache
    vocab_size: int
    has_output_tensor: bool = True  # False: output tied to token_embd (loaded twice)

    @staticmethod
    def of(
        name: str, hparams: Mapping[str, HValue], vocab_size: int, has_output_tensor: bool = True
    ) -> Architecture:
        items = tuple(
            sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in hparams.items())
        )
        return Architecture(name, items, vocab_size, has_output_tensor)

    @cached_property
    def keys(self) -> dict[str, HValue]:
        return dict(self.hparams)

    def get(self, key: str, default: HValue | None = None) -> HValue | None:
        return self.keys.get(key, default)

    def int_(self, key: str, default: int = 0) -> int:
        """A scalar integer key (a per-layer array: its first value, as in a summary)."""
        value = self.keys.get(key, default)
        if isinstance(value, tuple):
            value = value[0] if value else default
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, (int, float)):
            return int(value)
        return default

    # The facts every stage reads, named as they were before architectures became data (cached:
    # the planner reads block_count some 10^4 times a pick).
    block_count = _int_key("block_count")
    nextn_predict_layers = _int_key("nextn_predict_layers")

    @cached_property
    def n_layer(self) -> int:
        """Trunk layers (llama.cpp's n_layer()): block_count minus the NextN blocks."""
        return self.block_count - self.nextn_predict_layers

    context_length = _int_key("context_length")
    embedding_length = _int_key("embedding_length")
    head_count = _int_key("attention.head_count")
    expert_count = _int_key("expert_count")
    expert_used_count = _int_key("expert_used_count")


# ----------------------------------------------------------------------------------------------
# The per-layer view.


@dataclass(frozen=True)
class CompressedCache:
    """A K-only cache of one cell per `ratio` tokens beside a layer's own (DeepSeek-V4's CSA, HCA
    and lightning-indexer caches): pad256(max(1, ceil(kv_size / ratio))) cells per stream of
    `width` K elements, -ctk type (src/llama-kv-cache-dsv4.cpp:28-30, 1290-1306)."""

    width: int
    ratio: int

    def cells(self, kv_size: int) -> int:
        n = max(1, (kv_size + self.ratio - 1) // self.ratio)
        return (n + 255) // 256 * 256


@dataclass(frozen=True)
class CompressorState:
    """A compressor's running state beside a layer's cache (DeepSeek-V4): two f32 tensors (kv
    and score) of `width` x `rows` per stream and rollback plane, n_stream x (1 + n_rs_seq)
    planes (src/llama-kv-cache-dsv4.cpp:963-965)."""

    width: int
    rows: int


@dataclass(frozen=True)
class LayerView:
    """One llama.cpp block (index il) as its caches see it."""

    index: int
    attention: AttentionKind
    n_head: int
    n_head_kv: int
    k_width: int  # n_embd_k_gqa(il): K elements per cell
    v_width: int  # n_embd_v_gqa(il): V elements per cell (0: K-only cache, MLA)
    kv: bool  # owns a KV cache in the main context
    kv_shared_from: int | None = None  # attends over this earlier layer's KV (gemma3n, gemma4)
    recurrent: bool = False  # owns recurrent state (SSM, linear attention, short conv)
    nextn: bool = False  # an MTP/NextN block: no trunk KV, weights only with an MTP context
    # A sparse-attention indexer's own cache beside the KV (DSA, MSA, hybrid-idx): K (and for
    # MSA V) elements per cell, full context, -ctk/-ctv types (0: none)
    index_k_width: int = 0
    index_v_width: int = 0
    # compressed caches and compressor states beside the KV (DeepSeek-V4)
    compressed: tuple[CompressedCache, ...] = ()
    states: tuple[CompressorState, ...] = ()

    @property
    def attends(self) -> bool:
        """Reads a KV cache in decode (its own or a shared one)."""
        return self.attention is not AttentionKind.NONE and not self.nextn


@dataclass(frozen=True)
class ModelView:
    """An architecture as llama.cpp's memory sees it: model facts and one LayerView per block."""

    arch: str
    family: str  # the quantpick/arch module that built it ("generic" when unknown)
    known: bool  # False: the generic rule, not checked against llama.cpp for this architecture
    memory: MemoryClass
    layers: tuple[LayerView, ...]  # len == block_count (NextN blocks last)
    n_layer: int  # trunk layers
    context_length: int
    n_embd: int
    n_vocab: int
    n_head: int  # layer 0's (compute estimates)
    n_swa: int  # the window, in tokens (0: no SWA)
    swa_type: SwaType
    v_width_max: int  # n_embd_v_gqa_max(): V is padded to it without flash attention
    state_r: int  # recurrent state elements per sequence and layer (n_embd_r, f32)
    state_s: int  # ... (n_embd_s, f32)
    expert_count: int
    expert_used_count: int
    tied_embeddings: bool  # no output.weight: token_embd is loaded again as the output
    mtp_kv_layers: tuple[int, ...] = ()  # NextN layers an MTP context caches (f16)
    # global tensors this architecture loads on the output layer beyond the shared table
    # (model/layout.py OUTPUT_TENSORS), by name without .weight/.bias
    output_tensors: frozenset[str] = frozenset()
    # head sizes of the trunk layers (n_embd_head_k/v(il)): a quantized cache type must divide
    # each (src/llama-context.cpp:3851-3871)
    head_k_sizes: frozenset[int] = frozenset()
    head_v_sizes: frozenset[int] = frozenset()
    mla: bool = False  # K-only cache: -ctk must equal -ctv (src/llama-context.cpp:3835)
    flash_attn: bool = True  # False: llama.cpp forces flash attention off (grok)
    # The tied output is created before token_embd, so the duplicate is never merged: two
    # copies even when the output stays in host memory (gemma3n, gemma4)
    tied_copy_always: bool = False
    # The caches keep one stream per sequence even with a unified KV cache (-kvu): the window
    # then holds n_swa + n_ubatch cells per stream (DeepSeek-V4: src/llama-kv-cache-dsv4.cpp
    # :1238-1241, 1283)
    split_streams: bool = False
    notes: tuple[str, ...] = ()  # what a generic or partial rule could not check

    @property
    def block_count(self) -> int:
        return len(self.layers)

    @cached_property
    def kv_layers(self) -> tuple[int, ...]:
        return tuple(lv.index for lv in self.layers if lv.kv)

    @cached_property
    def recurrent_layers(self) -> tuple[int, ...]:
        return tuple(lv.index for lv in self.layers if lv.recurrent)

    @cached_property
    def attending_layers(self) -> tuple[int, ...]:
        return tuple(lv.index for lv in self.layers if lv.attends)

    @property
    def is_moe(self) -> bool:
        return self.expert_count > 0

    @property
    def offload(self) -> OffloadKind:
        return OffloadKind.EXPERTS if self.is_moe else OffloadKind.LAYERS

    @cached_property
    def attention_period(self) -> int:
        """Layers per attention layer with its own full-context KV: 4 for qwen35moe (one in
        four), 1 for a dense transformer; where a layer split's speed steps as it moves."""
        full = [lv.index for lv in self.layers if lv.kv and lv.attention is AttentionKind.FULL]
        if len(full) < 2:
            return 1
        gaps = {b - a for a, b in zip(full, full[1:], strict=False)}
        return min(gaps) if len(gaps) == 1 else 1

    @property
    def state_bytes_per_row(self) -> int:
        """One sequence's recurrent state of one layer, f32 whatever -ctk/-ctv (create_memory
        passes GGML_TYPE_F32 for type_r and type_s)."""
        return (self.state_r + self.state_s) * 4


# ----------------------------------------------------------------------------------------------
# The llama_hparams mirror a family adjusts.


LayerFilter = Callable[[int], bool]
LayerReuse = Callable[[int], int]


@dataclass
class HParams:
    """quantpick's copy of the llama_hparams fields that size memory (src/llama-hparams.h),
    filled by `load_hparams` and then by a family's `configure`."""

    arch: Architecture
    n_layer_all: int
    n_layer_nextn: int = 0
    # filled by load_hparams from the header (below), then by the family's configure
    n_ctx_train: int = 0
    n_embd: int = 0
    n_vocab: int = 0
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff: list[int] = field(default_factory=list)
    n_head: list[int] = field(default_factory=list)
    n_head_kv: list[int] = field(default_factory=list)
    n_embd_head_k_full: int = 0
    n_embd_head_v_full: int = 0
    n_embd_head_k_swa: int = 0
    n_embd_head_v_swa: int = 0
    n_embd_head_k_mla: int = 0  # n_embd_head_k_mla_impl: with v below, is_mla()
    n_embd_head_v_mla: int = 0
    swa_type: SwaType = SwaType.NONE
    n_swa: int = 0
    is_swa: list[bool] = field(default_factory=list)
    is_recr: list[bool] = field(default_factory=list)
    n_layer_kv_from_start: int = -1  # has_kv(il): il < this (gemma3n, gemma4)
    router_layer: int = -1
    # recurrent state dimensions (n_embd_r / n_embd_s, src/llama-hparams.cpp:218-290)
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    wkv_head_size: int = 0
    token_shift_count: int = 2
    n_shortconv_l_cache: int = 0
    n_embd_head_kda: int = 0
    n_embd_head_la: int = 0
    # create_memory's choices
    memory: MemoryClass = MemoryClass.KV
    kv_filter: LayerFilter | None = None  # layers the main-context KV covers (None: all)
    recr_filter: LayerFilter | None = None  # layers with recurrent state (None: is_recr)
    kv_reuse: LayerReuse | None = None  # layer -> the layer whose KV it uses (-1: its own)
    mtp_kv_layers: tuple[int, ...] | None = None  # None: the NextN blocks
    # indexer caches: which layers, and their K / V widths (elements per cell)
    index_filter: LayerFilter | None = None
    index_k_width: int = 0
    index_v_width: int = 0
    # K-only caches although the model is not MLA (DeepSeek-V4's dsv4_make_k_only)
    k_only: bool = False
    split_streams: bool = False  # ModelView.split_streams
    # per layer: compressed caches and compressor states beside the KV (DeepSeek-V4)
    compressed: Callable[[int], tuple[CompressedCache, ...]] | None = None
    states: Callable[[int], tuple[CompressorState, ...]] | None = None
    output_tensors: set[str] = field(default_factory=set)
    flash_attn: bool = True  # llama_init_from_model forces it off for some architectures
    tied_copy_always: bool = False
    notes: list[str] = field(default_factory=list)

    def n_layer(self) -> int:
        return self.n_layer_all - self.n_layer_nextn

    def key(self, suffix: str) -> HValue | None:
        return self.arch.get(suffix)

    def _pattern(self, n_pattern: int, dense_first: bool) -> list[bool]:
        """The rule set_swa_pattern and set_recr_pattern share (src/llama-hparams.cpp:8-38):
        every layer but one in n_pattern, the odd one first or last; NextN blocks never."""
        n = self.n_layer()
        return [
            il < n
            and (
                n_pattern == 0
                or (il % n_pattern != 0 if dense_first else il % n_pattern < n_pattern - 1)
            )
            for il in range(self.n_layer_all)
        ]

    def set_swa_pattern(self, n_pattern: int, dense_first: bool = False) -> None:
        """llama_hparams::set_swa_pattern (src/llama-hparams.cpp:8-22)."""
        self.is_swa = self._pattern(n_pattern, dense_first)

    def load_swa_pattern(self, n_pattern: int, dense_first: bool = False) -> None:
        """llama_model_base::load_swa_pattern (src/llama-model.cpp:3434-3441): a per-layer
        `attention.sliding_window_pattern` array wins, else its scalar, else the default."""
        value = self.key("attention.sliding_window_pattern")
        if isinstance(value, tuple):
            self.is_swa = [bool(v) for v in value] + [False] * (self.n_layer_all - len(value))
            return
        if isinstance(value, int) and not isinstance(value, bool):
            n_pattern = value
        self.set_swa_pattern(n_pattern, dense_first)

    def read_swa(self, n_pattern: int, *, dense_first: bool = False, always: bool = False,
                 swa_type: SwaType = SwaType.STANDARD) -> None:  # fmt: skip
        """The usual SWA block of load_arch_hparams: `attention.sliding_window` gives the
        window; SWA is on when the key is present and > 0 (or `always`)."""
        window = self.key("attention.sliding_window")
        n_swa = int(window) if isinstance(window, (int, float)) else 0
        if always or n_swa > 0:
            self.n_swa = n_swa
            self.swa_type = swa_type
            self.load_swa_pattern(n_pattern, dense_first)
        else:
            self.swa_type = SwaType.NONE

    def set_recr_pattern(self, n_pattern: int, dense_first: bool = False) -> None:
        """llama_hparams::set_recr_pattern (src/llama-hparams.cpp:24-38)."""
        self.is_recr = self._pattern(n_pattern, dense_first)

    def per_layer(self, suffix: str, default: int) -> list[int]:
        """get_key_or_arr: one value per layer (a scalar is repeated)."""
        value = self.key(suffix)
        if isinstance(value, tuple):
            return [int(v) for v in value] + [default] * (self.n_layer_all - len(value))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return [int(value)] * self.n_layer_all
        return [default] * self.n_layer_all

    def int_key(self, suffix: str, default: int = 0) -> int:
        return self.arch.int_(suffix, default)

    # llama_hparams accessors (src/llama-hparams.cpp)
    def n_embd_head_k(self, il: int) -> int:
        return self.n_embd_head_k_swa if self.is_swa[il] else self.n_embd_head_k_full

    def n_embd_head_v(self, il: int) -> int:
        return self.n_embd_head_v_swa if self.is_swa[il] else self.n_embd_head_v_full

    def n_embd_k_gqa(self, il: int) -> int:
        return self.n_embd_head_k(il) * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return self.n_embd_head_v(il) * self.n_head_kv[il]

    def is_mla(self) -> bool:
        return self.n_embd_head_k_mla != 0 and self.n_embd_head_v_mla != 0

    def has_kv(self, il: int) -> bool:
        return self.n_layer_kv_from_start < 0 or il < self.n_layer_kv_from_start

    def n_embd_r(self) -> int:
        """src/llama-hparams.cpp:218-246."""
        if self.wkv_head_size:
            return self.token_shift_count * self.n_embd
        if self.n_shortconv_l_cache:
            return self.n_embd * (self.n_shortconv_l_cache - 1)
        if self.n_embd_head_kda:
            d_inner = self.n_head[0] * self.n_embd_head_kda
            return 3 * (self.ssm_d_conv - 1 if self.ssm_d_conv > 0 else 3) * d_inner
        conv = self.ssm_d_conv - 1 if self.ssm_d_conv > 0 else 0
        return conv * (self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state)

    def n_embd_s(self) -> int:
        """src/llama-hparams.cpp:248-270."""
        if self.wkv_head_size:
            return self.n_embd * self.wkv_head_size
        if self.n_embd_head_kda:
            return self.n_embd_head_kda * self.n_embd_head_kda * self.n_head[0]
        if self.n_embd_head_la:
            return self.n_embd_head_la * self.n_embd_head_la * self.n_head[0]
        return self.ssm_d_state * self.ssm_d_inner

    def read_ssm(self) -> None:
        """The Mamba2 / gated-delta-net keys (LLM_KV_SSM_*)."""
        self.ssm_d_conv = self.int_key("ssm.conv_kernel")
        self.ssm_d_inner = self.int_key("ssm.inner_size")
        self.ssm_d_state = self.int_key("ssm.state_size")
        self.ssm_n_group = self.int_key("ssm.group_count")


def load_hparams(arch: Architecture, *, recurrent_arch: bool = False) -> HParams:
    """llama_model_base::load_hparams (src/llama-model.cpp:1298-1479) for the fields that size
    memory. `recurrent_arch`: llm_arch_is_recurrent (every layer starts recurrent)."""
    n_layer_all = arch.block_count
    if not 0 < n_layer_all <= MAX_LAYERS:
        raise ValueError(f"block_count {n_layer_all} is outside 1..{MAX_LAYERS}")
    n_nextn = min(arch.nextn_predict_layers, n_layer_all)
    hp = HParams(arch, n_layer_all, n_nextn)
    # the keys as load_hparams reads them (src/llama-model.cpp:1321-1333), then the vocabulary
    hp.n_ctx_train = arch.context_length
    hp.n_embd = arch.embedding_length
    hp.n_expert = arch.expert_count
    hp.n_expert_used = arch.expert_used_count
    hp.n_vocab = arch.vocab_size
    hp.n_ff = hp.per_layer("feed_forward_length", 0)
    hp.n_head = hp.per_layer("attention.head_count", 0)
    # n_head_kv is optional, default to n_head
    kv = hp.key("attention.head_count_kv")
    hp.n_head_kv = hp.per_layer("attention.head_count_kv", 0) if kv is not None else list(hp.n_head)
    if hp.n_head and hp.n_head[0] > 0:
        head = hp.n_embd // hp.n_head[0]
        hp.n_embd_head_k_full = hp.int_key("attention.key_length", head)
        hp.n_embd_head_v_full = hp.int_key("attention.value_length", head)
    hp.n_embd_head_k_swa = hp.int_key("attention.key_length_swa", hp.n_embd_head_k_full)
    hp.n_embd_head_v_swa = hp.int_key("attention.value_length_swa", hp.n_embd_head_v_full)
    hp.is_swa = [False] * n_layer_all
    hp.is_recr = [recurrent_arch] * n_layer_all
    if recurrent_arch:
        hp.memory = MemoryClass.RECURRENT
    return hp


def build_view(hp: HParams, *, family: str, known: bool) -> ModelView:
    """The caches create_memory builds for `hp`, layer by layer."""
    n_all, n_trunk = hp.n_layer_all, hp.n_layer()
    mla = hp.is_mla() or hp.k_only
    memory = hp.memory
    if memory in (MemoryClass.KV, MemoryClass.ISWA):
        memory = MemoryClass.ISWA if hp.swa_type is not SwaType.NONE else MemoryClass.KV
    elif memory in (MemoryClass.HYBRID, MemoryClass.HYBRID_ISWA):
        swa = hp.swa_type is not SwaType.NONE
        memory = MemoryClass.HYBRID_ISWA if swa else MemoryClass.HYBRID

    def kv_filter(il: int) -> bool:
        if hp.kv_filter is not None:
            return hp.kv_filter(il)
        if memory in (MemoryClass.HYBRID, MemoryClass.HYBRID_ISWA):
            return not hp.is_recr[il]  # llama_memory_hybrid's default filter_attn
        # create_memory: the NextN blocks are left out of the trunk's cache when there is a
        # trunk (src/llama-model.cpp ~2772)
        if hp.n_layer_nextn > 0 and n_trunk > 0 and hp.router_layer < 0:
            return il < n_trunk
        return True

    def recr_filter(il: int) -> bool:
        if hp.recr_filter is not None:
            return hp.recr_filter(il)
        return hp.is_recr[il]

    reuse: dict[int, int] = {}
    if hp.kv_reuse is not None:
        for il in range(n_all):
            target = hp.kv_reuse(il)
            if target >= 0:
                reuse[il] = target
    layers: list[LayerView] = []
    for il in range(n_all):
        nextn = il >= n_trunk
        has_cache = memory is not MemoryClass.NONE and memory is not MemoryClass.RECURRENT
        kv = has_cache and hp.has_kv(il) and kv_filter(il)
        recurrent = (
            memory in (MemoryClass.RECURRENT, MemoryClass.HYBRID, MemoryClass.HYBRID_ISWA)
            and il < n_trunk
            and (recr_filter(il) if memory is not MemoryClass.RECURRENT else True)
        )
        shared = reuse.get(il) if not kv else None
        indexed = hp.index_filter is not None and has_cache and hp.index_filter(il)
        if recurrent and not kv:
            kind = AttentionKind.NONE
        elif hp.n_head_kv[il] == 0 and not kv and shared is None:
            kind = AttentionKind.NONE
        elif hp.is_swa[il]:
            kind = AttentionKind.SLIDING
        else:
            kind = AttentionKind.FULL
        layers.append(
            LayerView(
                index=il,
                attention=kind,
                n_head=hp.n_head[il],
                n_head_kv=hp.n_head_kv[il],
                k_width=hp.n_embd_k_gqa(il),
                v_width=0 if mla else hp.n_embd_v_gqa(il),
                kv=kv,
                kv_shared_from=shared,
                recurrent=recurrent,
                nextn=nextn,
                index_k_width=hp.index_k_width if indexed else 0,
                index_v_width=hp.index_v_width if indexed else 0,
                compressed=hp.compressed(il) if hp.compressed is not None and kv else (),
                states=hp.states(il) if hp.states is not None and kv else (),
            )
        )
    v_max = max((hp.n_embd_v_gqa(il) for il in range(n_all)), default=0)
    has_state = any(lv.recurrent for lv in layers)
    mtp = hp.mtp_kv_layers if hp.mtp_kv_layers is not None else tuple(range(n_trunk, n_all))
    return ModelView(
        arch=hp.arch.name,
        family=family,
        known=known,
        memory=memory,
        layers=tuple(layers),
        n_layer=n_trunk,
        context_length=hp.n_ctx_train,
        n_embd=hp.n_embd,
        n_vocab=hp.n_vocab,
        n_head=hp.n_head[0] if hp.n_head else 0,
        n_swa=hp.n_swa if hp.swa_type is not SwaType.NONE else 0,
        swa_type=hp.swa_type,
        v_width_max=0 if mla else v_max,
        state_r=hp.n_embd_r() if has_state else 0,
        state_s=hp.n_embd_s() if has_state else 0,
        expert_count=hp.n_expert,
        expert_used_count=hp.n_expert_used,
        tied_embeddings=not hp.arch.has_output_tensor,
        mtp_kv_layers=mtp,
        output_tensors=frozenset(hp.output_tensors),
        head_k_sizes=frozenset(hp.n_embd_head_k(il) for il in range(n_trunk)),
        head_v_sizes=frozenset(hp.n_embd_head_v(il) for il in range(n_trunk)),
        mla=mla,
        flash_attn=hp.flash_attn,
        tied_copy_always=hp.tied_copy_always,
        split_streams=hp.split_streams,
        notes=tuple(hp.notes),
    )
