"""The model as llama.cpp will load it: a per-tensor table (name, ggml type, shape, bytes) plus the
architecture, grouped into llama.cpp's layer slots. Pure.

A layout comes from a GGUF header (exact: `gguf_header.py`) or is synthesized from a manifest's
architecture block and the file size (`synthesize_layout`, an estimate); `basis` says which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from quantpick.model.ggml import GGML_TYPES, tensor_bytes
from quantpick.model.manifest import Architecture

# llama.cpp common/common.h: llm_ffn_exps_cpu_override -- the routed-expert tensors that
# --cpu-moe / --n-cpu-moe move to host memory.
EXPERT_TENSOR_RE = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")

INPUT_SLOT = -1  # token_embd: always host memory (llama_model_base::load_tensors, dev_input)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: str  # "Q4_K", "F32", ...
    shape: tuple[int, ...]  # ggml ne order: ne[0] is the row length
    n_bytes: int

    @property
    def is_expert(self) -> bool:
        return EXPERT_TENSOR_RE.search(self.name) is not None


@dataclass(frozen=True)
class SlotWeights:
    """Bytes of one llama.cpp layer slot (a block, or the output layer)."""

    dense_bytes: int  # everything but the routed experts
    expert_bytes: int  # ffn_{gate,up,down}_exps


@dataclass(frozen=True)
class ModelLayout:
    architecture: Architecture
    tensors: tuple[TensorInfo, ...]
    basis: str  # "gguf:<path>", "gguf-remote:<url>", "synthesized:<quant> from <n> bytes"
    exact: bool  # True: tensor bytes read from a GGUF header
    file_bytes: int | None = None
    quant: str | None = None
    metadata: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def n_slots(self) -> int:
        """llama.cpp counts block_count + 1 slots; the last (index block_count) is the output."""
        return self.architecture.block_count + 1

    @property
    def output_slot(self) -> int:
        return self.architecture.block_count

    def slot_of(self, name: str) -> int:
        match = _BLOCK_RE.match(name)
        if match:
            return int(match.group(1))
        if name.startswith(("output.", "output_norm.")):
            return self.output_slot
        return INPUT_SLOT  # token_embd and any other global tensor stay with the input

    @cached_property
    def slots(self) -> tuple[SlotWeights, ...]:
        """Per-slot byte totals, index = slot (0..block_count); the input is `input_bytes`."""
        dense = [0] * self.n_slots
        expert = [0] * self.n_slots
        for t in self.tensors:
            slot = self.slot_of(t.name)
            if slot == INPUT_SLOT or slot >= self.n_slots:
                continue
            if t.is_expert:
                expert[slot] += t.n_bytes
            else:
                dense[slot] += t.n_bytes
        return tuple(SlotWeights(d, e) for d, e in zip(dense, expert, strict=False))

    @cached_property
    def input_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors if self.slot_of(t.name) == INPUT_SLOT)

    @cached_property
    def tensor_bytes_total(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @cached_property
    def recurrent_flags(self) -> tuple[bool, ...]:
        """For each trunk block (0..n_layer-1): True for DeltaNet, False for full attention."""
        arch = self.architecture
        return tuple(arch.is_recurrent(il) for il in range(arch.n_layer))

    def is_nextn_slot(self, slot: int) -> bool:
        arch = self.architecture
        return arch.n_layer <= slot < arch.block_count


# ----------------------------------------------------------------------------------------------
# Tensor shapes of an architecture (llama.cpp src/models/qwen35moe.cpp: load_arch_tensors).


SUPPORTED_ARCHITECTURES = ("qwen35moe",)


@lru_cache(maxsize=8)
def tensor_shapes(arch: Architecture) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, ne) for every tensor llama.cpp's qwen35moe loader expects, MTP block included."""
    if arch.name not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"architecture {arch.name!r} is not modelled (supported: qwen35moe)")
    n_embd, n_vocab = arch.embedding_length, arch.vocab_size
    head_dim, n_head, n_head_kv = arch.key_length, arch.head_count, arch.head_count_kv
    key_dim = arch.ssm_state_size * arch.ssm_group_count
    value_dim = arch.ssm_inner_size
    conv_dim = key_dim * 2 + value_dim
    n_v_heads = arch.ssm_time_step_rank
    n_expert, ff_exp, ff_sh = (
        arch.expert_count,
        arch.expert_feed_forward_length,
        arch.expert_shared_feed_forward_length,
    )
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("token_embd.weight", (n_embd, n_vocab)),
        ("output_norm.weight", (n_embd,)),
    ]
    if arch.has_output_tensor:
        shapes.append(("output.weight", (n_embd, n_vocab)))
    for il in range(arch.block_count):
        p = f"blk.{il}."
        nextn = il >= arch.n_layer
        shapes += [
            (p + "attn_norm.weight", (n_embd,)),
            (p + "post_attention_norm.weight", (n_embd,)),
        ]
        if arch.is_recurrent(il):
            shapes += [
                (p + "attn_qkv.weight", (n_embd, conv_dim)),
                (p + "attn_gate.weight", (n_embd, value_dim)),
                (p + "ssm_conv1d.weight", (arch.ssm_conv_kernel, conv_dim)),
                (p + "ssm_dt.bias", (n_v_heads,)),
                (p + "ssm_a", (n_v_heads,)),
                (p + "ssm_beta.weight", (n_embd, n_v_heads)),
                (p + "ssm_alpha.weight", (n_embd, n_v_heads)),
                (p + "ssm_norm.weight", (arch.ssm_state_size,)),
                (p + "ssm_out.weight", (value_dim, n_embd)),
            ]
        else:
            shapes += [
                (p + "attn_q.weight", (n_embd, head_dim * n_head * 2)),
                (p + "attn_k.weight", (n_embd, head_dim * n_head_kv)),
                (p + "attn_v.weight", (n_embd, arch.value_length * n_head_kv)),
                (p + "attn_output.weight", (head_dim * n_head, n_embd)),
                (p + "attn_q_norm.weight", (head_dim,)),
                (p + "attn_k_norm.weight", (head_dim,)),
            ]
        shapes += [
            (p + "ffn_gate_inp.weight", (n_embd, n_expert)),
            (p + "ffn_down_exps.weight", (ff_exp, n_embd, n_expert)),
            (p + "ffn_gate_exps.weight", (n_embd, ff_exp, n_expert)),
            (p + "ffn_up_exps.weight", (n_embd, ff_exp, n_expert)),
            (p + "ffn_gate_inp_shexp.weight", (n_embd,)),
            (p + "ffn_gate_shexp.weight", (n_embd, ff_sh)),
            (p + "ffn_up_shexp.weight", (n_embd, ff_sh)),
            (p + "ffn_down_shexp.weight", (ff_sh, n_embd)),
        ]
        if nextn:
            shapes += [
                (p + "nextn.eh_proj.weight", (2 * n_embd, n_embd)),
                (p + "nextn.enorm.weight", (n_embd,)),
                (p + "nextn.hnorm.weight", (n_embd,)),
                (p + "nextn.shared_head_norm.weight", (n_embd,)),
            ]
    return tuple(shapes)


# ----------------------------------------------------------------------------------------------
# Synthesizing a layout from a quant name and a file size (no header available).

# Base ggml type llama-quantize uses for each file type
# (src/llama-quant.cpp: llama_model_quantize_impl).
_BASE_TYPE = {
    "IQ1_S": "IQ1_S",
    "IQ1_M": "IQ1_M",
    "IQ2_XXS": "IQ2_XXS",
    "IQ2_XS": "IQ2_XS",
    "IQ2_S": "IQ2_XS",
    "IQ2_M": "IQ2_S",
    "Q2_K": "Q2_K",
    "Q2_K_S": "Q2_K",
    "Q2_K_L": "Q2_K",
    "IQ3_XXS": "IQ3_XXS",
    "IQ3_XS": "IQ3_XXS",
    "IQ3_S": "IQ3_S",
    "IQ3_M": "IQ3_S",
    "Q3_K_S": "Q3_K",
    "Q3_K_M": "Q3_K",
    "Q3_K_L": "Q3_K",
    "IQ4_XS": "IQ4_XS",
    "IQ4_NL": "IQ4_NL",
    "Q4_0": "Q4_0",
    "Q4_1": "Q4_1",
    "Q4_K_S": "Q4_K",
    "Q4_K_M": "Q4_K",
    "Q4_K_L": "Q4_K",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q5_K_S": "Q5_K",
    "Q5_K_M": "Q5_K",
    "Q5_K_L": "Q5_K",
    "Q6_K": "Q6_K",
    "Q6_K_L": "Q6_K",
    "Q8_0": "Q8_0",
    "BF16": "BF16",
    "F16": "F16",
    "F32": "F32",
    "MXFP4_MOE": "MXFP4",
}
# The "more bits" type for attn_v / DeltaNet in-projection / ffn_down on the layers llama.cpp's
# use_more_bits() selects (the *_M mixes).
_MORE_BITS = {
    "Q2_K": "Q3_K",
    "Q3_K": "Q4_K",
    "Q4_K": "Q6_K",
    "Q5_K": "Q6_K",
    "IQ2_S": "IQ3_S",
    "IQ3_S": "IQ4_XS",
    "IQ2_XS": "IQ3_XXS",
    "IQ3_XXS": "IQ3_S",
}
_HIGH_PRECISION = {"Q8_0", "BF16", "F16", "F32"}


def normalize_quant(quant: str) -> str:
    """'UD-Q4_K_XL' -> 'Q4_K_M'-like key for the base type table."""
    q = quant.upper()
    if q.startswith("UD-"):
        q = q[3:]
    if q.endswith("_XL"):
        q = q[:-3] + "_M" if q[:-3] + "_M" in _BASE_TYPE else q[:-3]
    if q == "Q8_K":
        q = "Q8_0"
    return q


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    # src/llama-quant.cpp: use_more_bits
    return (
        i_layer < n_layers // 8
        or i_layer >= 7 * n_layers // 8
        or (i_layer - n_layers // 8) % 3 == 2
    )


def _unquantized(name: str, shape: tuple[int, ...]) -> bool:
    # llama-quant.cpp never quantizes 1-D tensors, norms, the router, ssm_conv1d.
    return len(shape) == 1 or name.endswith(
        ("_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d.weight", "ssm_a", "ssm_dt.bias")
    )


def estimate_header_bytes(arch: Architecture, n_tensors: int) -> int:
    """GGUF metadata + tensor infos: dominated by the tokenizer (tokens, types, merges)."""
    return arch.vocab_size * 30 + n_tensors * 80 + 65536


def synthesize_layout(arch: Architecture, quant: str, file_bytes: int) -> ModelLayout:
    """Tensor classes at the types llama.cpp's quantizer gives `quant`, then the remainder between
    that sum and the real file size spread over the quantized tensors, so the total matches."""
    key = normalize_quant(quant)
    base = _BASE_TYPE.get(key, "Q4_K")
    mix = key.endswith(("_M", "_L")) or quant.upper().startswith("UD-")
    high = base in _HIGH_PRECISION
    # use_more_bits() counts each tensor kind in layer order: ordinals per kind.
    attn_blocks = [il for il in range(arch.block_count) if not arch.is_recurrent(il)]
    recurrent_blocks = [il for il in range(arch.block_count) if arch.is_recurrent(il)]
    attn_ordinal = {il: i for i, il in enumerate(attn_blocks)}
    recurrent_ordinal = {il: i for i, il in enumerate(recurrent_blocks)}
    n_attn_v, n_qkv = len(attn_blocks), len(recurrent_blocks)
    types: list[tuple[str, tuple[int, ...], str]] = []
    for name, shape in tensor_shapes(arch):
        if _unquantized(name, shape):
            qtype = "F32"
        elif high:
            qtype = base
        elif name == "output.weight":
            qtype = "Q6_K"
        elif name == "token_embd.weight":
            qtype = base if base in ("Q5_K", "Q6_K", "Q4_K", "Q3_K", "Q2_K") else "Q4_K"
        else:
            qtype = base
            if base == "MXFP4":
                qtype = "MXFP4" if EXPERT_TENSOR_RE.search(name) else "Q8_0"
            block = int(name.split(".")[1]) if name.startswith("blk.") else -1
            more_bits = False
            if ".ffn_down" in name:  # ffn_down_exps and ffn_down_shexp, by block index
                more_bits = _use_more_bits(block, arch.block_count)
            elif name.endswith("attn_v.weight"):
                more_bits = _use_more_bits(attn_ordinal[block], n_attn_v)
            elif name.endswith("attn_qkv.weight"):
                more_bits = _use_more_bits(recurrent_ordinal[block], n_qkv)
            if mix and more_bits and base in _MORE_BITS:
                qtype = _MORE_BITS[base]
        # ggml requires whole blocks; fall back to a block-free type when a row does not fill one.
        if shape[0] % GGML_TYPES[qtype][1] != 0:
            qtype = "F16" if qtype != "F32" else "F32"
        types.append((name, shape, qtype))

    raw = [(name, shape, qtype, tensor_bytes(qtype, shape)) for name, shape, qtype in types]
    target = max(file_bytes - estimate_header_bytes(arch, len(raw)), 1)
    quantized_total = sum(nb for _, _, q, nb in raw if q != "F32")
    fixed_total = sum(nb for _, _, q, nb in raw if q == "F32")
    scale = (target - fixed_total) / quantized_total if quantized_total else 1.0
    tensors: list[TensorInfo] = []
    assigned = 0
    scalable = [i for i, r in enumerate(raw) if r[2] != "F32"]
    last = scalable[-1] if scalable else -1
    for i, (name, shape, qtype, nb) in enumerate(raw):
        if qtype != "F32":
            nb = int(nb * scale) if i != last else 0
        tensors.append(TensorInfo(name, qtype, shape, nb))
        assigned += nb
    if last >= 0:  # the largest remainder lands on the last quantized tensor: the sum is exact
        t = tensors[last]
        tensors[last] = TensorInfo(t.name, t.ggml_type, t.shape, max(target - assigned, 0))
    return ModelLayout(
        architecture=arch,
        tensors=tuple(tensors),
        basis=f"synthesized: {quant} tensor types scaled to the {file_bytes}-byte file",
        exact=False,
        file_bytes=file_bytes,
        quant=quant,
    )
