"""The KV cache and recurrent state as llama.cpp sizes them: context cells per sequence and stream,
SWA windows, bytes per cell and layer, the cache types a configuration may use. Pure.
"""

from __future__ import annotations

from quantpick.arch.base import LayerView, ModelView
from quantpick.errors import UsageError
from quantpick.model.ggml import (
    GGML_TYPES,
    KV_CACHE_TYPES,
    UNQUANTIZED,
    BufferRule,
    pad,
    row_size,
)
from quantpick.model.layout import ModelLayout
from quantpick.plan.memory_types import RunConfig

# ----------------------------------------------------------------------------------------------
# Context sizing (src/llama-context.cpp: llama_context ctor).


def context_cells(
    ctx_size: int, n_ctx_train: int, n_parallel: int, kv_unified: bool
) -> tuple[int, int, int]:
    """(n_ctx, kv_size per stream, n_stream): n_ctx padded to 256; non-unified splits per slot."""
    n_ctx = pad(ctx_size if ctx_size > 0 else n_ctx_train, 256)
    n_seq = max(1, n_parallel)
    if kv_unified or n_seq == 1:
        return n_ctx, n_ctx, 1
    n_ctx_seq = pad(n_ctx // n_seq, 256)
    return n_ctx_seq * n_seq, n_ctx_seq, n_seq


def swa_cells(view: ModelView, kv_size: int, n_parallel: int, kv_unified: bool, ubatch: int,
              swa_full: bool) -> int:  # fmt: skip
    """Cells per stream of a sliding-window layer: pad256(min(kv_size, n_swa x (unified ?
    n_seq : 1) + n_ubatch)), the full cache with --swa-full (src/llama-kv-cache-iswa.cpp:73-80)."""
    if swa_full or view.n_swa <= 0:
        return kv_size
    return pad(min(kv_size, view.n_swa * (max(1, n_parallel) if kv_unified else 1) + ubatch), 256)


def layer_kv_bytes_per_cell(
    layer: LayerView, view: ModelView, type_k: str, type_v: str, flash_attn: bool = True
) -> int:
    """K + V bytes one cell of `layer` takes (src/llama-kv-cache.cpp:200-237): V is padded to the
    widest layer without flash attention (V is stored transposed then), and absent for MLA."""
    v_width = layer.v_width if flash_attn or not layer.v_width else view.v_width_max
    return row_size(type_k, layer.k_width) + row_size(type_v, v_width)


def layer_kv_bytes(
    layer: LayerView,
    view: ModelView,
    cells: int,
    type_k: str,
    type_v: str,
    flash_attn: bool,
    rule: BufferRule,
) -> int:
    """The K and V tensors of one layer's cache, `cells` cells (x streams), as a buffer holds
    them: [row(type, width), cells] each, padded by the device's rule (src/llama-kv-cache.cpp
    :226-237; V absent for MLA, padded to the widest layer without flash attention)."""
    v_width = layer.v_width if flash_attn or not layer.v_width else view.v_width_max
    k = rule.alloc(type_k, layer.k_width, row_size(type_k, layer.k_width) * cells)
    v = rule.alloc(type_v, v_width, row_size(type_v, v_width) * cells) if v_width else 0
    return k + v


def kv_bytes_per_cell_per_layer(layout: ModelLayout, type_k: str, type_v: str) -> int:
    """K + V bytes per cell of the widest KV layer (speed's and compute's yardstick)."""
    view = layout.view
    layers = [view.layers[il] for il in view.kv_layers] or list(view.layers[:1])
    return max((layer_kv_bytes_per_cell(lv, view, type_k, type_v) for lv in layers), default=0)


def recurrent_bytes_per_layer_per_row(layout: ModelLayout) -> int:
    """One sequence's recurrent state of one layer: n_embd_r + n_embd_s, always f32
    (src/llama-hparams.cpp:218-270; create_memory passes GGML_TYPE_F32)."""
    return layout.view.state_bytes_per_row


def kv_type_problem(view: ModelView, type_k: str, type_v: str, flash_attn: str) -> str | None:
    """Why llama.cpp refuses these cache types for this model (None: it takes them), as
    llama_init_from_model checks (src/llama-context.cpp:3816-3871)."""
    fa = flash_attn != "off" and view.flash_attn
    if view.mla and type_k != type_v:
        return f"-ctk {type_k} -ctv {type_v}: this model's cache (MLA) needs -ctk equal to -ctv"
    for flag, kind, sizes in (("-ctk", type_k, view.head_k_sizes),
                              ("-ctv", type_v, view.head_v_sizes)):  # fmt: skip
        block = GGML_TYPES[kind.upper()][1]
        if block > 1 and fa:
            bad = sorted(n for n in sizes if n % block)
            if bad:
                return (
                    f"{flag} {kind}: its {block}-value blocks do not divide this model's head "
                    f"size {bad[0]}"
                )
    if not view.flash_attn and type_v.upper() not in UNQUANTIZED:
        return (
            f"-ctv {type_v}: llama.cpp runs {view.arch} without flash attention, which a "
            "quantized V cache needs"
        )
    return None


def validate_config(config: RunConfig, layout: ModelLayout) -> None:
    for flag, value in (("-ctk", config.cache_type_k), ("-ctv", config.cache_type_v)):
        if value not in KV_CACHE_TYPES:
            raise UsageError(
                f"{flag} {value}: not a KV cache type",
                hint="use one of " + ", ".join(KV_CACHE_TYPES),
            )
    if config.flash_attn not in ("on", "off", "auto"):
        raise UsageError(f"-fa {config.flash_attn}: use on, off or auto")
    if config.flash_attn == "off" and config.cache_type_v not in ("f16", "f32", "bf16"):
        # llama_context ctor: "quantized V cache was requested, but this requires Flash Attention"
        raise UsageError(
            f"-ctv {config.cache_type_v} needs flash attention, and -fa is off",
            hint="use -fa on (or auto), or an unquantized V cache",
        )
    problem = kv_type_problem(
        layout.view, config.cache_type_k, config.cache_type_v, config.flash_attn
    )
    if problem is not None:
        raise UsageError(problem, hint="use f16 (or another cache type that divides it)")
    if config.ctx_size < 0 or config.n_parallel < 1 or config.ubatch < 1 or config.batch < 1:
        raise UsageError("-c must be >= 0, -np, -ub and -b >= 1")
    if config.n_gpu_layers is not None and config.n_gpu_layers < 0:
        raise UsageError("-ngl must be >= 0 (omit it for all layers)")
    if config.n_cpu_moe < 0:
        raise UsageError("--n-cpu-moe must be >= 0")
    if config.tensor_split is not None and (
        any(v < 0 for v in config.tensor_split) or sum(config.tensor_split) <= 0
    ):
        raise UsageError("-ts needs non-negative proportions with a positive sum")
