"""DeepSeek-V2/V3 and the models built on them (deepseek2, deepseek2-ocr): multi-head latent
attention (MLA). Pure.

Rules (llama.cpp b11312):
- MLA when `attention.key_length_mla` and `attention.value_length_mla` are both set
  (src/models/deepseek2.cpp:14-15, llama_hparams::is_mla): the cache then holds K only,
  key_length x head_count_kv per cell (the converter writes key_length = kv_lora_rank + rope
  dims = 576 and head_count_kv = 1 for DeepSeek-V3), and no V: `-ctv` changes nothing
  (src/llama-kv-cache.cpp:233-237, has_v = !is_mla);
- without the MLA keys (older GGUFs) it is a plain per-head cache;
- NextN blocks (DeepSeek-V3's MTP layer) are left out of the trunk's cache.
"""

from __future__ import annotations

from quantpick.arch.base import Architecture, HParams
from quantpick.arch.family import Family, TensorShapes
from quantpick.arch.tensors import Table, head_dims, per_layer


def configure(hp: HParams) -> None:
    hp.n_embd_head_k_mla = hp.int_key("attention.key_length_mla")
    hp.n_embd_head_v_mla = hp.int_key("attention.value_length_mla")


# `expert_gating_func` 2 = sigmoid (llama-hparams.h LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID): the
# noaux_tc routers (DeepSeek-V3, GLM-4.7-Flash) that ship e_score_correction_bias, which the
# converter writes as exp_probs_b (deepseek2.cpp:132 loads it when present); V2's softmax router
# has none.
GATING_SIGMOID = 2


def tensor_shapes(arch: Architecture) -> TensorShapes | None:
    """deepseek2 (src/models/deepseek2.cpp:55-161): MLA projections (q through a LoRA pair when
    `attention.q_lora_rank` is set; K/V through kv_a_mqa and the split k_b / v_b when the MLA
    keys are set, the fused kv_b of old GGUFs otherwise), `leading_dense_block_count` dense
    blocks, routed plus shared experts, and NextN blocks with the embed_tokens / shared_head
    tensors DeepSeek-V3's MTP module ships."""
    if arch.name != "deepseek2":
        return None
    t = Table()
    t.head(arch)
    n_embd, n_vocab = arch.embedding_length, arch.vocab_size
    n_head = per_layer(arch, "attention.head_count")[0]
    hk, hv = head_dims(arch)
    mla = bool(arch.int_("attention.key_length_mla") and arch.int_("attention.value_length_mla"))
    hk_mla = arch.int_("attention.key_length_mla") if mla else hk  # llama-hparams.cpp:313-319
    hv_mla = arch.int_("attention.value_length_mla") if mla else hv
    n_rot = arch.int_("rope.dimension_count", hk)
    qk_nope = hk_mla - n_rot
    q_lora, kv_lora = arch.int_("attention.q_lora_rank"), arch.int_("attention.kv_lora_rank")
    n_ff = per_layer(arch, "feed_forward_length")[0]
    n_expert, n_ff_exp = arch.expert_count, arch.int_("expert_feed_forward_length")
    n_shared, dense_lead = arch.int_("expert_shared_count"), arch.int_("leading_dense_block_count")
    exp_bias = arch.int_("expert_gating_func") == GATING_SIGMOID
    for il in range(arch.block_count):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", n_embd)
        if q_lora > 0:
            t.add(p + "attn_q_a_norm.weight", q_lora)
        t.add(p + "attn_kv_a_norm.weight", kv_lora)
        if q_lora > 0:
            t.add(p + "attn_q_a.weight", n_embd, q_lora)
            t.add(p + "attn_q_b.weight", q_lora, n_head * hk_mla)
        else:
            t.add(p + "attn_q.weight", n_embd, n_head * hk_mla)
        t.add(p + "attn_kv_a_mqa.weight", n_embd, kv_lora + n_rot)
        if mla:
            t.add(p + "attn_k_b.weight", qk_nope, kv_lora, n_head)
            t.add(p + "attn_v_b.weight", kv_lora, hv_mla, n_head)
        else:
            t.add(p + "attn_kv_b.weight", kv_lora, n_head * (qk_nope + hv_mla))
        t.add(p + "attn_output.weight", n_head * hv_mla, n_embd)
        t.add(p + "ffn_norm.weight", n_embd)
        if il < dense_lead:
            t.swiglu(p, n_embd, n_ff)
        else:
            t.add(p + "ffn_gate_inp.weight", n_embd, n_expert)
            if exp_bias:
                t.add(p + "exp_probs_b.bias", n_expert)
            t.experts(p, n_embd, n_ff_exp, n_expert)
            t.shared_expert(p, n_embd, n_ff_exp * n_shared)
        if il >= arch.n_layer:
            t.nextn(p, n_embd, head_vocab=n_vocab)
    return t.shapes()


FAMILY = Family(
    name="deepseek",
    # mistral4's model class is deepseek2's (src/models/models.h:1399)
    architectures=("deepseek2", "deepseek2-ocr", "mistral4"),
    configure=configure,
    summary="multi-head latent attention: a K-only cache of kv_lora_rank + rope dims per token",
    rules=(
        "MLA: K only, key_length x head_count_kv per cell; V takes 0 bytes, -ctv has no effect "
        "(src/llama-kv-cache.cpp:233-237)",
    ),
    # deepseek2-ocr: no llama.cpp test model or full-size recording: rules from the source only
    checked=frozenset({"deepseek2", "mistral4"}),
    tensor_shapes=tensor_shapes,
)
