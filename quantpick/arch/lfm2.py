"""Liquid LFM2 (lfm2, lfm2moe): short-convolution layers beside attention layers. Pure.

Rules (llama.cpp b11312):
- a layer with head_count_kv(il) == 0 (a per-layer array) is a short-convolution layer: no KV,
  a state of n_embd x (shortconv.l_cache - 1) f32 values per sequence (src/models/lfm2.cpp,
  llama-hparams.cpp n_embd_r); gguf-parser-go read element [0] of that array and gave LFM2 no KV
  at all until v0.26;
- lfm2 with `attention.sliding_window` > 0: every attention layer slides (lfm2.cpp).
"""

from __future__ import annotations

from quantpick.arch.base import HParams, MemoryClass, SwaType
from quantpick.arch.family import Family


def configure(hp: HParams) -> None:
    n = hp.n_layer()
    hp.n_shortconv_l_cache = hp.int_key("shortconv.l_cache")
    hp.is_recr = [il < n and hp.n_head_kv[il] == 0 for il in range(hp.n_layer_all)]
    hp.memory = MemoryClass.HYBRID
    # LLM_TENSOR_OUTPUT_NORM_LFM2 is named "token_embd_norm" (src/llama-arch.cpp:442)
    hp.output_tensors.add("token_embd_norm")
    window = hp.int_key("attention.sliding_window")
    if hp.arch.name == "lfm2" and window > 0:
        hp.swa_type = SwaType.STANDARD
        hp.n_swa = window
        hp.is_swa = [il < n and not hp.is_recr[il] for il in range(hp.n_layer_all)]


FAMILY = Family(
    name="lfm2",
    architectures=("lfm2", "lfm2moe"),
    configure=configure,
    summary="short-convolution layers (head_count_kv 0) beside attention layers",
    rules=("conv state n_embd x (l_cache - 1) F32 per sequence (src/llama-hparams.cpp)",),
    checked=frozenset(),
)
