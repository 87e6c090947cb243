"""Decoder-only transformers with a plain KV cache, dense or MoE (llama, qwen2/3, qwen3moe,
mistral3, glm4moe, deepseek, granite, olmoe, ... and the sliding-window ones: gpt-oss, cohere2,
olmo2, exaone4, llama4's chunked attention, ...). Pure.

Everything here is llama.cpp's shared rule (src/llama-model.cpp:1298-1479 and create_memory's
default branch): every layer caches n_embd_head_k x n_head_kv(il) keys and n_embd_head_v x
n_head_kv(il) values per cell (head counts may be per-layer arrays; 0 means the layer has no
attention), NextN blocks are left out of the trunk's cache. The one quirk per architecture is its
sliding window: which layers slide, how wide, and whether it is on at all, as each model's
load_arch_hparams sets it (SWA_RULES below, each citing its file).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from quantpick.arch.base import Architecture, HParams, SwaType
from quantpick.arch.family import Family, TensorShapes
from quantpick.arch.tensors import Table, head_count_kv, head_dims, per_layer


class SwaOn(Enum):
    """When load_arch_hparams turns SWA on."""

    ALWAYS = "always"  # swa_type set unconditionally
    IF_WINDOW = "if-window"  # attention.sliding_window present and > 0
    ARRAY = "array"  # always; layers from the attention.sliding_window_pattern array only
    UNLESS_ZERO = "unless-zero"  # llama4: off only when the key is present and 0


@dataclass(frozen=True)
class SwaRule:
    pattern: int  # load_swa_pattern's default period (n_pattern)
    on: SwaOn
    dense_first: bool = False
    default_window: int = 0  # n_swa before (or instead of) the key
    window_fixed: bool = False  # the default replaces the key's value (smallthinker)
    swa_type: SwaType = SwaType.STANDARD
    where: str = ""


SWA_RULES: dict[str, SwaRule] = {
    "gpt-oss": SwaRule(2, SwaOn.ALWAYS, where="src/models/openai-moe.cpp:4-6"),
    "cohere2": SwaRule(4, SwaOn.ALWAYS, where="src/models/cohere2.cpp:2-9"),
    "cohere2moe": SwaRule(4, SwaOn.ALWAYS, dense_first=True,
                          where="src/models/cohere2moe.cpp:25-26"),
    "exaone-moe": SwaRule(4, SwaOn.ALWAYS, default_window=128,
                          where="src/models/exaone-moe.cpp:2-9"),
    "muse-glimmer": SwaRule(4, SwaOn.ALWAYS, where="src/models/muse-glimmer.cpp:3-11"),
    "afmoe": SwaRule(4, SwaOn.IF_WINDOW, where="src/models/afmoe.cpp:9-21"),
    "mellum": SwaRule(4, SwaOn.IF_WINDOW, where="src/models/mellum.cpp:4-16"),
    "olmo2": SwaRule(4, SwaOn.IF_WINDOW, where="src/models/olmo2.cpp:4-13"),
    "plamo3": SwaRule(8, SwaOn.IF_WINDOW, where="src/models/plamo3.cpp:3-9"),
    "laguna": SwaRule(4, SwaOn.IF_WINDOW, dense_first=True, where="src/models/laguna.cpp:26-31"),
    "smallthinker": SwaRule(4, SwaOn.IF_WINDOW, dense_first=True, default_window=4096,
                            window_fixed=True, where="src/models/smallthinker.cpp:2-13"),
    "llama4": SwaRule(4, SwaOn.UNLESS_ZERO, default_window=8192, window_fixed=True,
                      swa_type=SwaType.CHUNKED, where="src/models/llama4.cpp:6-17"),
    "granite_swa": SwaRule(0, SwaOn.ARRAY, where="src/models/granite-swa.cpp:12-15"),
    "maple": SwaRule(0, SwaOn.ARRAY, where="src/models/maple.cpp:2-8"),
    "mimo2": SwaRule(0, SwaOn.ARRAY, where="src/models/mimo2.cpp:4-10"),
    "spark2_5": SwaRule(0, SwaOn.ARRAY, where="src/models/spark2-5.cpp:3-6"),
    "step35": SwaRule(0, SwaOn.ARRAY, where="src/models/step35.cpp"),
}  # fmt: skip


def apply_swa(hp: HParams, rule: SwaRule) -> None:
    window = hp.key("attention.sliding_window")
    present = isinstance(window, (int, float)) and not isinstance(window, bool)
    n_swa = int(window) if present else rule.default_window  # type: ignore[arg-type]
    if rule.window_fixed:
        n_swa = rule.default_window
    if rule.on is SwaOn.IF_WINDOW and not (present and int(window) > 0):  # type: ignore[arg-type]
        hp.swa_type = SwaType.NONE
        return
    if rule.on is SwaOn.UNLESS_ZERO and present and int(window) == 0:  # type: ignore[arg-type]
        hp.swa_type = SwaType.NONE
        return
    hp.swa_type = rule.swa_type
    hp.n_swa = n_swa
    if rule.on is SwaOn.ARRAY:
        listed = hp.key("attention.sliding_window_pattern")
        flags = [bool(v) for v in listed] if isinstance(listed, tuple) else []
        hp.is_swa = (flags + [False] * hp.n_layer_all)[: hp.n_layer_all]
    else:
        hp.load_swa_pattern(rule.pattern, rule.dense_first)


def configure(hp: HParams) -> None:
    name = hp.arch.name
    rule = SWA_RULES.get(name)
    if rule is not None:
        apply_swa(hp, rule)
    elif name == "exaone4" and hp.n_layer() == 64:
        # src/models/exaone4.cpp:2-12: only the 32B (64 layers) slides, 4096 unless the key says
        apply_swa(hp, SwaRule(4, SwaOn.ALWAYS, default_window=4096))
    # phi3 (src/models/phi3.cpp:11-21) reads a window and then turns SWA off: nothing to do.
    if name == "grok":
        # "flash_attn is not compatible with Grok - forcing off" (src/llama-context.cpp:3816)
        hp.flash_attn = False


# Architectures with llama.cpp's shared rule and at most the sliding window above: each one's
# load_arch_hparams touches no other memory-sizing field (src/models/<arch>.cpp at b11312).
PLAIN = (
    "llama", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan", "starcoder",
    "refact", "bloom", "stablelm", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe",
    "qwen3vl", "qwen3vlmoe", "phi2", "phi3", "phimoe", "plamo", "codeshell", "orion", "internlm2",
    "minicpm", "minicpm3", "starcoder2", "xverse", "command-r", "dbrx", "olmo", "olmoe",
    "openelm", "arctic", "deepseek", "chatglm", "glm4", "glm4moe", "bitnet", "jais", "jais2",
    "nemotron", "exaone", "exaone4", "granite", "granitemoe", "chameleon", "plm", "bailingmoe",
    "bailingmoe2", "dots1", "arcee", "ernie4_5", "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense",
    "hunyuan_vl", "hy_v3", "smollm3", "seed_oss", "grovemoe", "apertus", "minimax-m2", "cogvlm",
    "pangu-embedded", "mistral3", "paddleocr", "maincoder", "talkie", "qwen3tts", "pockettts",
    "hrm_text",
)  # fmt: skip

# ----------------------------------------------------------------------------------------------
# Tensor tables (src/models/<arch>.cpp load_arch_tensors at b11312), for the architectures whose
# real GGUFs tests/data/arch-real records.

# Meta's `rope_type: llama3` (Llama 3.1 and later: the Llama 3 vocabulary with more than the 8192
# original context) makes the converter write rope_freqs (conversion/llama.py:298-326); the GGUF
# carries no key saying so, so the table infers it from those two facts.
LLAMA3_VOCAB = 128256
LLAMA3_ORIGINAL_CONTEXT = 8192


def _llama(arch: Architecture) -> TensorShapes:
    """llama and mistral3 (src/models/llama.cpp:34-92, src/models/mistral3.cpp:29-87: the same
    tensors): dense SwiGLU or MoE with an optional shared expert."""
    t = Table()
    t.head(arch)
    n_embd, (hk, hv) = arch.embedding_length, head_dims(arch)
    n_head, n_kv = per_layer(arch, "attention.head_count")[0], head_count_kv(arch)[0]
    n_ff = per_layer(arch, "feed_forward_length")[0]
    if arch.vocab_size == LLAMA3_VOCAB and arch.context_length > LLAMA3_ORIGINAL_CONTEXT:
        n_rot = arch.int_("rope.dimension_count", hk)
        t.add("rope_freqs.weight", n_rot // 2)  # llama.cpp:66 (i != 0: TENSOR_DUPLICATED)
    n_expert, n_ff_sh = arch.expert_count, arch.int_("expert_shared_feed_forward_length")
    for il in range(arch.n_layer):
        p = f"blk.{il}."
        t.attention(p, n_embd, hk * n_head, hk * n_kv, hv * n_kv)
        t.add(p + "ffn_norm.weight", n_embd)
        if n_expert == 0:
            t.swiglu(p, n_embd, n_ff)
        else:
            t.add(p + "ffn_gate_inp.weight", n_embd, n_expert)
            t.experts(p, n_embd, n_ff, n_expert)
            if n_ff_sh > 0:
                t.shared_expert(p, n_embd, n_ff_sh)
    return t.shapes()


def _qwen2(arch: Architecture) -> TensorShapes:
    """src/models/qwen2.cpp:19-47; Qwen2 attention always has Q/K/V biases
    (conversion/qwen.py Qwen2Model maps them; create_tensor_qkv loads them)."""
    t = Table()
    t.head(arch)
    n_embd, (hk, hv) = arch.embedding_length, head_dims(arch)
    n_kv, n_ff = head_count_kv(arch)[0], per_layer(arch, "feed_forward_length")[0]
    for il in range(arch.n_layer):
        p = f"blk.{il}."
        t.attention(p, n_embd, n_embd, hk * n_kv, hv * n_kv, bias=True)
        t.add(p + "ffn_norm.weight", n_embd)
        t.swiglu(p, n_embd, n_ff)
    return t.shapes()


def _qwen3(arch: Architecture) -> TensorShapes:
    """qwen3 (src/models/qwen3.cpp:15-47) and qwen3moe (src/models/qwen3moe.cpp:14-56): Q/K
    norms, a dense FFN or routed experts of expert_feed_forward_length (default
    n_ff / n_expert_used, qwen3moe.cpp:50)."""
    t = Table()
    t.head(arch)
    n_embd, (hk, hv) = arch.embedding_length, head_dims(arch)
    n_head, n_kv = per_layer(arch, "attention.head_count")[0], head_count_kv(arch)[0]
    n_ff, n_expert = per_layer(arch, "feed_forward_length")[0], arch.expert_count
    n_ff_exp = arch.int_("expert_feed_forward_length") or n_ff // max(arch.expert_used_count, 1)
    for il in range(arch.n_layer):
        p = f"blk.{il}."
        t.attention(p, n_embd, hk * n_head, hk * n_kv, hv * n_kv)
        t.qk_norms(p, hk)
        t.add(p + "ffn_norm.weight", n_embd)
        if arch.name == "qwen3moe":
            t.add(p + "ffn_gate_inp.weight", n_embd, n_expert)
            t.experts(p, n_embd, n_ff_exp, n_expert)
        else:
            t.swiglu(p, n_embd, n_ff)
    return t.shapes()


# GLM-4.5/4.6/4.7 (92 layers) set `use_qk_norm`, GLM-4.5-Air (46) does not; the GGUF has no key
# for it, and glm4-moe.cpp:67-70 loads the norms only when present.
GLM4MOE_QK_NORM_LAYERS = frozenset({92})


def _glm4moe(arch: Architecture) -> TensorShapes:
    """src/models/glm4-moe.cpp:28-123: biased Q/K/V, `leading_dense_block_count` dense blocks,
    routed experts with a selection bias and shared experts, and the NextN block(s) with
    embed_tokens / shared_head_head (GLM's MTP layer ships both, conversion/glm.py maps them)."""
    t = Table()
    t.head(arch)
    n_embd, (hk, hv), n_vocab = arch.embedding_length, head_dims(arch), arch.vocab_size
    n_head, n_kv = per_layer(arch, "attention.head_count")[0], head_count_kv(arch)[0]
    n_ff, n_expert = per_layer(arch, "feed_forward_length")[0], arch.expert_count
    n_ff_exp = arch.int_("expert_feed_forward_length") or n_ff // max(arch.expert_used_count, 1)
    n_shared, dense_lead = arch.int_("expert_shared_count"), arch.int_("leading_dense_block_count")
    qk_norm = arch.n_layer in GLM4MOE_QK_NORM_LAYERS
    for il in range(arch.block_count):
        p = f"blk.{il}."
        t.attention(p, n_embd, hk * n_head, hk * n_kv, hv * n_kv, bias=True)
        if qk_norm:
            t.qk_norms(p, hk)
        t.add(p + "post_attention_norm.weight", n_embd)
        if il >= dense_lead:
            t.add(p + "ffn_gate_inp.weight", n_embd, n_expert)
            t.add(p + "exp_probs_b.bias", n_expert)
            t.experts(p, n_embd, n_ff_exp, n_expert)
            if n_shared > 0:
                t.shared_expert(p, n_embd, n_ff_exp * n_shared)
        else:
            t.swiglu(p, n_embd, n_ff)
        if il >= arch.n_layer:
            t.nextn(p, n_embd, head_vocab=n_vocab)
    return t.shapes()


def _gpt_oss(arch: Architecture) -> TensorShapes:
    """src/models/openai-moe.cpp:22-56: an untied output, post-attention norms, biased Q/K/V
    and output (gpt-oss `attention_bias`), attention sinks, a biased router and experts with
    biases (conversion/gpt_oss.py splits gate_up and its bias)."""
    t = Table()
    t.head(arch)
    n_embd, (hk, _) = arch.embedding_length, head_dims(arch)
    n_rot = arch.int_("rope.dimension_count", hk)
    n_head, n_kv = per_layer(arch, "attention.head_count")[0], head_count_kv(arch)[0]
    n_expert, n_ff_exp = arch.expert_count, arch.int_("expert_feed_forward_length")
    for il in range(arch.n_layer):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", n_embd)
        t.add(p + "post_attention_norm.weight", n_embd)
        t.qkv(p, n_embd, n_head * n_rot, n_kv * n_rot, n_kv * n_rot, bias=True)
        t.add(p + "attn_output.weight", n_head * n_rot, n_embd)
        t.add(p + "attn_sinks.weight", n_head)
        t.add(p + "ffn_gate_inp.weight", n_embd, n_expert)
        t.experts(p, n_embd, n_ff_exp, n_expert)
        t.add(p + "attn_output.bias", n_embd)
        t.add(p + "ffn_gate_inp.bias", n_expert)
        t.add(p + "ffn_gate_exps.bias", n_ff_exp, n_expert)
        t.add(p + "ffn_down_exps.bias", n_embd, n_expert)
        t.add(p + "ffn_up_exps.bias", n_ff_exp, n_expert)
    return t.shapes()


TABLES = {
    "llama": _llama,
    "mistral3": _llama,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "qwen3moe": _qwen3,
    "glm4moe": _glm4moe,
    "gpt-oss": _gpt_oss,
}


def tensor_shapes(arch: Architecture) -> TensorShapes | None:
    table = TABLES.get(arch.name)
    return None if table is None else table(arch)


# test-llama-archs does not write these (src/llama-model-saver.cpp:16-27, tests/test-llama-archs
# .cpp:659-708) and no full-size recording covers them: their rules come from the source only.
NOT_RECORDED = frozenset({"apertus", "bitnet", "chameleon", "gptj", "plm", "step35"})

FAMILY = Family(
    name="transformer",
    architectures=PLAIN + tuple(SWA_RULES),
    configure=configure,
    summary="attention on every layer (per-layer head counts honoured); sliding window where "
    "the architecture has one",
    rules=(
        "K/V per cell: key_length x head_count_kv(il), value_length x head_count_kv(il) "
        "(src/llama-hparams.cpp n_embd_k_gqa/n_embd_v_gqa)",
        "SWA cells: pad256(min(n_ctx_seq, n_swa x (kvu ? np : 1) + n_ubatch)), the full cache "
        "with --swa-full (src/llama-kv-cache-iswa.cpp:73-80)",
        "NextN blocks: no trunk KV (src/llama-model.cpp ~2772)",
    ),
    # proven by tests/arch (llama.cpp test models and full-size configs) but for NOT_RECORDED
    checked=frozenset(PLAIN + tuple(SWA_RULES)) - NOT_RECORDED,
    tensor_shapes=tensor_shapes,
)
