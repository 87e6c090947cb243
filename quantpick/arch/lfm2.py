"""Liquid LFM2 (lfm2, lfm2moe): short-convolution layers beside attention layers. Pure.

Rules (llama.cpp b11312):
- a layer with head_count_kv(il) == 0 (a per-layer array) is a short-convolution layer: no KV,
  a state of n_embd x (shortconv.l_cache - 1) f32 values per sequence (src/models/lfm2.cpp,
  llama-hparams.cpp n_embd_r); gguf-parser-go read element [0] of that array and gave LFM2 no KV
  at all until v0.26;
- lfm2 with `attention.sliding_window` > 0: every attention layer slides (lfm2.cpp).
"""

from __future__ import annotations

from quantpick.arch.base import Architecture, HParams, MemoryClass, SwaType
from quantpick.arch.family import Family, TensorShapes
from quantpick.arch.tensors import Table, head_count_kv, head_dims, per_layer


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


def tensor_shapes(arch: Architecture) -> TensorShapes | None:
    """lfm2 (src/models/lfm2.cpp:34-87): the final norm is named token_embd_norm
    (LLM_TENSOR_OUTPUT_NORM_LFM2, src/llama-arch.cpp:442), the output is tied (LFM2 ships no
    lm_head), every block a dense SwiGLU FFN (n_layer_dense_lead = n_layer, lfm2.cpp:15) and
    either attention with Q/K norms (head_count_kv(il) > 0) or a short convolution."""
    if arch.name != "lfm2":
        return None
    t = Table()
    t.head(arch, output_norm="token_embd_norm")
    n_embd = arch.embedding_length
    hk, hv = head_dims(arch)
    n_kv, n_ff = head_count_kv(arch), per_layer(arch, "feed_forward_length")[0]
    l_cache = arch.int_("shortconv.l_cache")
    for il in range(arch.n_layer):
        p = f"blk.{il}."
        t.add(p + "ffn_norm.weight", n_embd)
        t.swiglu(p, n_embd, n_ff)
        t.add(p + "attn_norm.weight", n_embd)
        if n_kv[il] > 0:
            t.qk_norms(p, hk)
            t.qkv(p, n_embd, n_embd, hk * n_kv[il], hv * n_kv[il])
            t.add(p + "attn_output.weight", n_embd, n_embd)
        else:
            t.add(p + "shortconv.conv.weight", l_cache, n_embd)
            t.add(p + "shortconv.in_proj.weight", n_embd, 3 * n_embd)
            t.add(p + "shortconv.out_proj.weight", n_embd, n_embd)
    return t.shapes()


FAMILY = Family(
    name="lfm2",
    architectures=("lfm2", "lfm2moe"),
    configure=configure,
    summary="short-convolution layers (head_count_kv 0) beside attention layers",
    rules=("conv state n_embd x (l_cache - 1) F32 per sequence (src/llama-hparams.cpp)",),
    # both proven by tests/arch
    checked=frozenset({"lfm2", "lfm2moe"}),
    tensor_shapes=tensor_shapes,
)
