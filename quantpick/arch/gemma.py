"""Gemma (gemma, gemma2, gemma3, gemma3n, gemma4): interleaved sliding-window attention, and in
gemma3n/gemma4 layers that read an earlier layer's KV instead of caching their own. Pure.

Rules (llama.cpp b11312):
- gemma2: SWA on, window 4096 unless `attention.sliding_window` says otherwise, one full layer in
  2 (src/models/gemma2.cpp:2-10);
- gemma3: SWA when the window key is present and > 0, one full layer in 6 (gemma3.cpp:2-9);
- gemma3n: SWA, one full layer in 5; only the first 20 layers own KV (n_layer_kv_from_start =
  20, hard-coded: gemma3n.cpp:2-6);
- gemma4: the per-layer `sliding_window_pattern` array; SWA layers have their own head sizes
  (`key_length_swa`, `value_length_swa`); the last `shared_kv_layers` layers own no KV
  (gemma4.cpp:2-16), so without flash attention V pads to the wider (full) layers;
- a layer past n_layer_kv_from_start reads layer n_layer_kv_from_start - (swa ? 2 : 1)
  (src/llama-model.cpp ~2772, create_memory's `reuse`).
"""

from __future__ import annotations

from quantpick.arch.base import HParams, SwaType
from quantpick.arch.family import Family

GEMMA3N_KV_LAYERS = 20  # src/models/gemma3n.cpp:5 hparams.n_layer_kv_from_start = 20


def configure(hp: HParams) -> None:
    name = hp.arch.name
    window = hp.key("attention.sliding_window")
    has_window = isinstance(window, (int, float)) and not isinstance(window, bool)
    if name == "gemma2":
        hp.swa_type = SwaType.STANDARD
        hp.n_swa = int(window) if has_window else 4096  # type: ignore[arg-type]
        hp.load_swa_pattern(2)
    elif name == "gemma3":
        if has_window and int(window) > 0:  # type: ignore[arg-type]
            hp.swa_type = SwaType.STANDARD
            hp.n_swa = int(window)  # type: ignore[arg-type]
            hp.load_swa_pattern(6)
    elif name == "gemma3n":
        hp.swa_type = SwaType.STANDARD
        hp.n_swa = int(window) if has_window else 0  # type: ignore[arg-type]
        hp.load_swa_pattern(5)
        hp.n_layer_kv_from_start = GEMMA3N_KV_LAYERS
    elif name == "gemma4":
        hp.swa_type = SwaType.STANDARD
        listed = hp.key("attention.sliding_window_pattern")
        flags = [bool(v) for v in listed] if isinstance(listed, tuple) else []
        hp.is_swa = (flags + [False] * hp.n_layer_all)[: hp.n_layer_all]
        hp.n_layer_kv_from_start = hp.n_layer_all - hp.int_key("attention.shared_kv_layers")
        hp.n_swa = int(window) if has_window else 0  # type: ignore[arg-type]
    if name in ("gemma3n", "gemma4"):
        start = hp.n_layer_kv_from_start

        def reuse(il: int) -> int:
            if il >= start:
                return start - (2 if hp.is_swa[il] else 1)
            return -1

        hp.kv_reuse = reuse


FAMILY = Family(
    name="gemma",
    architectures=("gemma", "gemma2", "gemma3", "gemma3n", "gemma4"),
    configure=configure,
    summary="interleaved sliding-window attention; gemma3n/gemma4 share KV across layers",
    rules=(
        "SWA period: 2 (gemma2), 6 (gemma3), 5 (gemma3n), the per-layer array (gemma4)",
        "SWA cells: pad256(min(n_ctx_seq, n_swa x (kvu ? np : 1) + n_ubatch)) "
        "(src/llama-kv-cache-iswa.cpp:73-80)",
        "shared KV: layers from n_layer_kv_from_start on own none (src/llama-hparams.cpp "
        "has_kv; gemma3n.cpp:5, gemma4.cpp:6-9)",
        "V padded to the widest layer without flash attention (src/llama-kv-cache.cpp:210)",
    ),
    checked=frozenset(),
)
