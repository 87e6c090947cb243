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

from quantpick.arch.base import Architecture, HParams, SwaType
from quantpick.arch.family import Family, TensorShapes
from quantpick.arch.tensors import Table, head_count_kv, head_dims, per_layer

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
        # output (the tied duplicate) is created before tok_embd (gemma4.cpp:50-56,
        # gemma3n.cpp:28-34): the loader merges a duplicate only into an existing tensor
        # (src/llama-model-loader.cpp:1371-1376), so both copies are allocated, on the host too
        hp.tied_copy_always = True
        start = hp.n_layer_kv_from_start

        def reuse(il: int) -> int:
            if il >= start:
                return start - (2 if hp.is_swa[il] else 1)
            return -1

        hp.kv_reuse = reuse


# ----------------------------------------------------------------------------------------------
# Tensor tables (load_arch_tensors at b11312).


def _gemma3(arch: Architecture) -> TensorShapes:
    """src/models/gemma3.cpp:34-71: Q/K norms and post-attention/post-FFN norms on every layer;
    the output is usually tied (Gemma 3 ships no lm_head)."""
    t = Table()
    t.head(arch)
    n_embd, (hk, hv) = arch.embedding_length, head_dims(arch)
    n_head, n_kv = per_layer(arch, "attention.head_count")[0], head_count_kv(arch)[0]
    n_ff = per_layer(arch, "feed_forward_length")[0]
    for il in range(arch.n_layer):
        p = f"blk.{il}."
        t.attention(p, n_embd, hk * n_head, hk * n_kv, hv * n_kv)
        t.add(p + "post_attention_norm.weight", n_embd)
        t.qk_norms(p, hk)
        t.add(p + "ffn_norm.weight", n_embd)
        t.swiglu(p, n_embd, n_ff)
        t.add(p + "post_ffw_norm.weight", n_embd)
    return t.shapes()


def _gemma4(arch: Architecture) -> TensorShapes | None:
    """src/models/gemma4.cpp:37-142, dense Gemma 4 (E2B, E4B, 31B): per-layer head sizes
    (`key_length` on full layers, `key_length_swa` on sliding ones) and head counts, per-layer
    FFN widths (`use_double_wide_mlp`), the per-layer embeddings (PLE) when
    `embedding_length_per_layer_input` > 0, one rope_freqs for the full layers (gemma4.cpp:94-98;
    conversion/gemma.py writes it) and a layer_output_scale per layer (HF `layer_scalar`).
    Full layers of the K=V models (`attention_k_eq_v`: those with `num_global_key_value_heads`,
    which the converter writes as a per-layer head_count_kv) have no attn_v (gemma4.cpp:78-84).
    The MoE variant (26B-A4B) is not tabled: no recorded header shows its expert layout."""
    if arch.expert_count:
        return None
    t = Table()
    t.add("token_embd.weight", arch.embedding_length, arch.vocab_size)
    if arch.has_output_tensor:
        t.add("output.weight", arch.embedding_length, arch.vocab_size)
    n_embd, n_layer = arch.embedding_length, arch.n_layer
    n_pl = arch.int_("embedding_length_per_layer_input")
    if n_pl > 0:
        t.add("per_layer_token_embd.weight", n_pl * n_layer, arch.vocab_size)
        t.add("per_layer_model_proj.weight", n_embd, n_pl * n_layer)
        t.add("per_layer_proj_norm.weight", n_pl)
    t.add("output_norm.weight", n_embd)
    hk_full, hv_full = head_dims(arch)
    hk_swa = arch.int_("attention.key_length_swa", hk_full)
    hv_swa = arch.int_("attention.value_length_swa", hv_full)
    swa = per_layer(arch, "attention.sliding_window_pattern")
    n_head, n_kv = per_layer(arch, "attention.head_count"), head_count_kv(arch)
    n_ff = per_layer(arch, "feed_forward_length")
    k_eq_v = isinstance(arch.get("attention.head_count_kv"), tuple)
    rope_freqs = False
    for il in range(n_layer):
        p = f"blk.{il}."
        hk, hv = (hk_swa, hv_swa) if swa[il] else (hk_full, hv_full)
        t.add(p + "attn_norm.weight", n_embd)
        t.add(p + "attn_q.weight", n_embd, hk * n_head[il])
        t.add(p + "attn_k.weight", n_embd, hk * n_kv[il])
        if swa[il] or not k_eq_v:
            t.add(p + "attn_v.weight", n_embd, hv * n_kv[il])
        t.add(p + "attn_output.weight", hk * n_head[il], n_embd)
        t.qk_norms(p, hk)
        t.add(p + "post_attention_norm.weight", n_embd)
        t.add(p + "layer_output_scale.weight", 1)
        if not swa[il] and not rope_freqs:
            t.add("rope_freqs.weight", hk // 2)
            rope_freqs = True
        t.add(p + "ffn_norm.weight", n_embd)
        t.swiglu(p, n_embd, n_ff[il])
        t.add(p + "post_ffw_norm.weight", n_embd)
        if n_pl > 0:
            t.add(p + "inp_gate.weight", n_embd, n_pl)
            t.add(p + "proj.weight", n_pl, n_embd)
            t.add(p + "post_norm.weight", n_embd)
    return t.shapes()


def tensor_shapes(arch: Architecture) -> TensorShapes | None:
    if arch.name == "gemma3":
        return _gemma3(arch)
    if arch.name == "gemma4":
        return _gemma4(arch)
    return None


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
    # gemma3n: no llama.cpp test model or full-size recording: rules from the source only
    checked=frozenset({"gemma", "gemma2", "gemma3", "gemma4"}),
    tensor_shapes=tensor_shapes,
)
