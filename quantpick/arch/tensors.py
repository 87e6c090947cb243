"""Building blocks of the family modules' tensor tables (`Family.tensor_shapes`). Pure.

A table lists the tensors a real GGUF of the architecture holds, as llama.cpp's loader
(src/models/<arch>.cpp `load_arch_tensors`, b11312) creates them: the name llama.cpp looks up
(src/llama-arch.cpp LLM_TENSOR_NAMES) and `ne` in ggml order (ne[0] the row length). Optional
tensors (TENSOR_NOT_REQUIRED) are listed where the converter (conversion/*.py) writes them for the
model; NextN/MTP tensors (TENSOR_SKIP without an MTP context) are listed when the GGUF has
`nextn_predict_layers`, as they take a place in the file and in `-ngl` numbering.
"""

from __future__ import annotations

from quantpick.arch.base import Architecture
from quantpick.arch.family import TensorShapes


class Table:
    """An ordered (name, ne) list with the blocks every decoder shares."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, tuple[int, ...]]] = []

    def add(self, name: str, *ne: int) -> None:
        self.rows.append((name, tuple(int(d) for d in ne)))

    def shapes(self) -> TensorShapes:
        return tuple(self.rows)

    def head(self, arch: Architecture, *, output_norm: str = "output_norm") -> None:
        """token_embd, the final norm and the output head; no output.weight when the model ties
        it to token_embd (every loader: `output` TENSOR_NOT_REQUIRED, then token_embd again with
        TENSOR_DUPLICATED, e.g. src/models/llama.cpp:37-45)."""
        n_embd, n_vocab = arch.embedding_length, arch.vocab_size
        self.add("token_embd.weight", n_embd, n_vocab)
        self.add(f"{output_norm}.weight", n_embd)
        if arch.has_output_tensor:
            self.add("output.weight", n_embd, n_vocab)

    def qkv(self, p: str, n_embd: int, n_q: int, n_k: int, n_v: int, *, bias: bool = False) -> None:
        """Separate Q/K/V projections (llama_model_base::create_tensor_qkv,
        src/llama-model.cpp:3396-3431: the fused attn_qkv is the optional first try; converters
        write the three), with their optional biases."""
        self.add(p + "attn_q.weight", n_embd, n_q)
        self.add(p + "attn_k.weight", n_embd, n_k)
        self.add(p + "attn_v.weight", n_embd, n_v)
        if bias:
            self.add(p + "attn_q.bias", n_q)
            self.add(p + "attn_k.bias", n_k)
            self.add(p + "attn_v.bias", n_v)

    def attention(
        self, p: str, n_embd: int, n_q: int, n_k: int, n_v: int, *, bias: bool = False
    ) -> None:
        """The attention block most loaders create first: its input norm, Q/K/V (`qkv`) and the
        output projection back to n_embd (e.g. src/models/llama.cpp:49-53)."""
        self.add(p + "attn_norm.weight", n_embd)
        self.qkv(p, n_embd, n_q, n_k, n_v, bias=bias)
        self.add(p + "attn_output.weight", n_q, n_embd)

    def qk_norms(self, p: str, head_dim: int) -> None:
        """Per-head RMS norms of Q and K (over the head dimension, e.g. src/models/qwen3.cpp)."""
        self.add(p + "attn_q_norm.weight", head_dim)
        self.add(p + "attn_k_norm.weight", head_dim)

    def swiglu(self, p: str, n_embd: int, n_ff: int) -> None:
        """A dense gate/up/down FFN."""
        self.add(p + "ffn_gate.weight", n_embd, n_ff)
        self.add(p + "ffn_down.weight", n_ff, n_embd)
        self.add(p + "ffn_up.weight", n_embd, n_ff)

    def experts(self, p: str, n_embd: int, n_ff_exp: int, n_expert: int) -> None:
        """Routed experts, gate and up separate (create_tensor_gate_up_exps,
        src/llama-model.cpp:3379-3393: the merged gate_up is the optional first try)."""
        self.add(p + "ffn_gate_exps.weight", n_embd, n_ff_exp, n_expert)
        self.add(p + "ffn_down_exps.weight", n_ff_exp, n_embd, n_expert)
        self.add(p + "ffn_up_exps.weight", n_embd, n_ff_exp, n_expert)

    def shared_expert(self, p: str, n_embd: int, n_ff_shexp: int) -> None:
        self.add(p + "ffn_gate_shexp.weight", n_embd, n_ff_shexp)
        self.add(p + "ffn_down_shexp.weight", n_ff_shexp, n_embd)
        self.add(p + "ffn_up_shexp.weight", n_embd, n_ff_shexp)

    def nextn(self, p: str, n_embd: int, *, head_vocab: int = 0) -> None:
        """The NextN/MTP block's own tensors (e.g. src/models/qwen35.cpp:110-115); with
        `head_vocab`, also the optional embed_tokens / shared_head_head the model ships (GLM's
        and DeepSeek's MTP layers: conversion/glm.py maps both), before the shared head norm."""
        self.add(p + "nextn.eh_proj.weight", 2 * n_embd, n_embd)
        self.add(p + "nextn.enorm.weight", n_embd)
        self.add(p + "nextn.hnorm.weight", n_embd)
        if head_vocab:
            self.add(p + "nextn.embed_tokens.weight", n_embd, head_vocab)
            self.add(p + "nextn.shared_head_head.weight", n_embd, head_vocab)
        self.add(p + "nextn.shared_head_norm.weight", n_embd)


def per_layer(arch: Architecture, key: str, default: int = 0) -> list[int]:
    """get_key_or_arr: one value per block (a scalar repeated), as the loaders read
    `feed_forward_length`, `attention.head_count(_kv)` (src/llama-model.cpp:1396-1404)."""
    value = arch.get(key)
    n = arch.block_count
    if isinstance(value, tuple):
        return [int(v) for v in value] + [default] * (n - len(value))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [int(value)] * n
    return [default] * n


def head_dims(arch: Architecture) -> tuple[int, int]:
    """(n_embd_head_k, n_embd_head_v): `attention.key_length` / `value_length`, default
    n_embd / n_head(0) (src/llama-model.cpp:1435-1445)."""
    n_head = per_layer(arch, "attention.head_count")[0]
    default = arch.embedding_length // n_head if n_head else 0
    k = arch.int_("attention.key_length", default)
    return k, arch.int_("attention.value_length", default)


def head_count_kv(arch: Architecture) -> list[int]:
    """n_head_kv(il): `attention.head_count_kv`, default head_count
    (src/llama-model.cpp:1401-1404)."""
    if arch.get("attention.head_count_kv") is None:
        return per_layer(arch, "attention.head_count")
    return per_layer(arch, "attention.head_count_kv")
