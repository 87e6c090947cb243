"""The model as llama.cpp will load it: a per-tensor table (name, ggml type, shape, bytes) plus the
architecture, grouped into llama.cpp's layer slots. Pure.

A layout comes from a GGUF header (exact: `model/gguf.py`) or is synthesized from a manifest's
architecture block and the file size (`synthesize_layout`, an estimate); `basis` says which.
Which slot a tensor loads into is llama.cpp's rule for every architecture (`slot_of`): `blk.N.*`
is layer N, the output head and its norms are the output layer, and the other global tensors are
the input (host memory) except the few llama.cpp creates on the first layer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from types import MappingProxyType
from typing import NamedTuple, TypeVar, cast

from quantpick.arch.base import Architecture, ModelView
from quantpick.model.ggml import CPU_BUFFER, GGML_TYPES, BufferRule, tensor_bytes

# llama.cpp common/common.h: llm_ffn_exps_cpu_override -- the routed-expert tensors that
# --cpu-moe / --n-cpu-moe move to host memory.
EXPERT_TENSOR_RE = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")

_T = TypeVar("_T")

INPUT_SLOT = -1  # token_embd: always host memory (llama_model_base::load_tensors, dev_input)

# Global tensors (no `blk.N.`) of the output layer and of the first layer, by name without the
# .weight/.bias suffix: llama.cpp's LLM_TENSOR_INFOS layer classes (src/llama-arch.cpp:728-1007,
# LLM_TENSOR_LAYER_OUTPUT / _REPEATING; names from LLM_TENSOR_NAMES :439-700). Everything else
# global is LLM_TENSOR_LAYER_INPUT (token_embd, position_embd, per_layer_token_embd, ...).
OUTPUT_TENSORS = frozenset({
    "output", "output_norm", "cls", "cls.norm", "cls.output", "dense_2", "dense_3",
    "dec.output_norm", "enc.output_norm", "output_res_score", "output_hc_base", "output_hc_down",
    "output_hc_fn", "output_hc_norm", "output_hc_scale", "output_hc_up", "altup_proj",
    "altup_unembd_proj", "nextn.post_projection", "fc", "d2t", "markov_w1", "markov_w2",
    "conf_proj", "selector_hidden", "selector_predecessor", "selector_successor",
})  # fmt: skip
# LLM_TENSOR_LAYER_REPEATING tensors without a block number are created on layer 0 (e.g.
# bloom.cpp:25 `tn(LLM_TENSOR_TOKEN_EMBD_NORM, "weight", 0)`): "do the norms on the first layer".
FIRST_LAYER_TENSORS = frozenset({
    "token_embd_norm", "per_layer_model_proj", "per_layer_proj_norm", "conv1d",
    "nextn.pre_projection", "hrm.z_l_init",
})  # fmt: skip
# ... and these once per device that holds a trunk layer: llama.cpp creates them for every layer
# with TENSOR_DUPLICATED for i != 0, which makes one copy per buffer type
# (src/llama-model-loader.cpp:1371-1376; e.g. llama.cpp:~1660 rope_freqs, phi3.cpp:54).
PER_DEVICE_TENSORS = frozenset({"rope_freqs", "rope_factors_long", "rope_factors_short"})


def _stem(name: str) -> str:
    for suffix in (".weight", ".bias"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: str  # "Q4_K", "F32", ...
    shape: tuple[int, ...]  # ggml ne order: ne[0] is the row length
    n_bytes: int

    @property
    def is_expert(self) -> bool:
        return is_expert_name(self.name)


@lru_cache(maxsize=8192)
def is_expert_name(name: str) -> bool:
    """A routed-expert tensor (EXPERT_TENSOR_RE), memoized by name: the quants of one model share
    their names, and a cached_property would be computed again on every layout's tensors."""
    return EXPERT_TENSOR_RE.search(name) is not None


class _NameFacts(NamedTuple):
    """What a tensor's name says under one architecture."""

    slot: int  # ModelLayout.slot_of
    per_device: bool  # one copy per device holding a trunk layer (PER_DEVICE_TENSORS)
    expert: bool  # a routed-expert tensor (EXPERT_TENSOR_RE: TensorInfo.is_expert)


@lru_cache(maxsize=16)
def _name_facts(arch: Architecture) -> dict[str, _NameFacts]:
    """The memo of `_NameFacts` by tensor name, one per architecture: a name's slot depends on
    the name and the architecture only (its block count, its view's output tensors)."""
    return {}


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

    @cached_property
    def view(self) -> ModelView:
        """The per-layer view of the architecture (quantpick/arch)."""
        from quantpick.arch.registry import view_of

        return view_of(self.architecture)

    @cached_property
    def _names(self) -> dict[str, _NameFacts]:
        # shared by every layout of the architecture (a pick's quants have the same names)
        return _name_facts(self.architecture)

    @cached_property
    def ffn_widths(self) -> tuple[int, int, int]:
        """(the widest dense FFN: ffn_up / ffn_gate rows; the routed experts' intermediate:
        ffn_up_exps rows, or half of a fused ffn_gate_up_exps; the per-layer embedding width:
        per_layer_token_embd rows, 0 without), read once from the tensor shapes."""
        ffn = n_ff_exp = per_layer = 0
        for t in self.tensors:
            if t.name == "per_layer_token_embd.weight":
                per_layer = t.shape[0]
            if len(t.shape) < 2 or not t.name.startswith("blk."):
                continue
            stem = t.name.rsplit(".", 2)[-2]
            if stem in ("ffn_up", "ffn_gate"):
                ffn = max(ffn, t.shape[1])
            elif stem in ("ffn_up_exps", "ffn_gate_exps"):
                n_ff_exp = max(n_ff_exp, t.shape[1])
            elif stem == "ffn_gate_up_exps":
                n_ff_exp = max(n_ff_exp, t.shape[1] // 2)
        return ffn, n_ff_exp, per_layer

    @cached_property
    def ffn_gated(self) -> bool:
        """Whether a dense FFN has a gate (ffn_gate, or a fused ffn_gate_up), or none has an FFN
        at all; False for an up projection and an activation alone (nemotron-h's relu^2)."""
        stems = {t.name.rsplit(".", 2)[-2] for t in self.tensors if t.name.startswith("blk.")}
        return "ffn_up" not in stems or bool({"ffn_gate", "ffn_gate_up"} & stems)

    @cached_property
    def block_tensor_bytes(self) -> tuple[Mapping[str, int], ...]:
        """Per block `blk.N`, its tensors' bytes by the name after `blk.N.` (the first of a name,
        as the loader finds it): what the host-layer templates match a block against
        (plan/host_layers.py, plan/hybrid_layers.py), read once per layout."""
        blocks: list[dict[str, int]] = [{} for _ in range(self.architecture.block_count)]
        for t in self.tensors:
            index, _, rest = t.name.removeprefix("blk.").partition(".")
            if t.name.startswith("blk.") and index.isdigit() and int(index) < len(blocks):
                blocks[int(index)].setdefault(rest, t.n_bytes)
        return tuple(MappingProxyType(b) for b in blocks)

    @cached_property
    def block_matrices(self) -> tuple[tuple[int, int, bool], ...]:
        """(slot, bytes, is_expert) of every block weight with two or more dimensions (what op
        offload may copy to a GPU), largest first: the planner asks once per estimate."""
        found = [
            (slot, t.n_bytes, is_expert)
            for t, (slot, _, is_expert) in self._rows
            if len(t.shape) >= 2 and slot != INPUT_SLOT and slot != self.output_slot
        ]
        return tuple(sorted(found, key=lambda x: -x[1]))

    def derived(self, fn: Callable[[ModelLayout], _T]) -> _T:
        """`fn(self)`, computed once per layout: `fn` is a pure function of the layout (a fact a
        later stage reads of the tensor table on every estimate, e.g. plan/speed_work.py)."""
        memo = self._derived
        if fn not in memo:
            memo[fn] = fn(self)
        return cast(_T, memo[fn])

    @cached_property
    def _derived(self) -> dict[Callable[[ModelLayout], object], object]:
        return {}

    @cached_property
    def tensor_slots(self) -> tuple[int, ...]:
        """The slot of each tensor, in `tensors` order (read once: every per-slot total walks
        the table)."""
        return tuple(facts.slot for _, facts in self._rows)

    @cached_property
    def _rows(self) -> tuple[tuple[TensorInfo, _NameFacts], ...]:
        """Every tensor with what its name says: what the per-slot totals read."""
        facts = self._facts
        return tuple((t, facts(t.name)) for t in self.tensors)

    @cached_property
    def q_proj_rows(self) -> dict[int, int]:
        """Each block's Q projection output rows (attn_q, or MLA's attn_q_b: n_head x
        (nope + rope)), by slot: what the compute model hands over with a moved attention."""
        return {
            slot: t.shape[1]
            for t, slot in zip(self.tensors, self.tensor_slots, strict=True)
            if len(t.shape) == 2 and t.name.endswith((".attn_q.weight", ".attn_q_b.weight"))
        }

    @cached_property
    def expert_bias(self) -> bool:
        """Routed experts with biases (gpt-oss): their gate and up results come back biased."""
        return any(
            t.name.endswith(("ffn_gate_exps.bias", "ffn_up_exps.bias")) for t in self.tensors
        )

    def tensor(self, name: str) -> TensorInfo | None:
        """The tensor called `name` (the first, as the loader would find it), or None."""
        return self._by_name.get(name)

    @cached_property
    def _by_name(self) -> dict[str, TensorInfo]:
        found: dict[str, TensorInfo] = {}
        for t in self.tensors:
            found.setdefault(t.name, t)
        return found

    @cached_property
    def slot_matrix_max(self) -> tuple[tuple[int, int], ...]:
        """Per block slot, the largest (dense, routed-expert) weight of two or more dimensions
        (0: none): `block_matrices` folded by slot, for the searches that ask for a maximum."""
        dense = [0] * self.n_slots
        expert = [0] * self.n_slots
        for slot, n_bytes, is_expert in self.block_matrices:
            into = expert if is_expert else dense
            into[slot] = max(into[slot], n_bytes)
        return tuple(zip(dense, expert, strict=True))

    def slot_of(self, name: str) -> int:
        """The layer slot a tensor belongs to (memoized: the planner asks some 10^4 times)."""
        return self._facts(name).slot

    def _facts(self, name: str) -> _NameFacts:
        found = self._names.get(name)
        if found is None:
            per_device = _stem(name) in PER_DEVICE_TENSORS
            expert = is_expert_name(name)
            found = self._names[name] = _NameFacts(self._slot_of(name), per_device, expert)
        return found

    def _slot_of(self, name: str) -> int:
        match = _BLOCK_RE.match(name)
        if match:
            return int(match.group(1))
        stem = _stem(name)
        if stem in OUTPUT_TENSORS or stem in self.view.output_tensors:
            return self.output_slot
        if stem in FIRST_LAYER_TENSORS or stem in PER_DEVICE_TENSORS:
            return 0
        return INPUT_SLOT  # token_embd and the other input tensors stay in host memory

    @cached_property
    def per_device_tensors(self) -> tuple[TensorInfo, ...]:
        """Tensors llama.cpp copies onto every device that holds a trunk layer."""
        return tuple(t for t in self.tensors if _stem(t.name) in PER_DEVICE_TENSORS)

    @cached_property
    def tied_output_bytes(self) -> int:
        """token_embd's bytes when it also serves as the output head (no output.weight): loaded
        again on the output layer's device (create_tensor with TENSOR_DUPLICATED)."""
        if not self.view.tied_embeddings or not self.tensors:
            return 0
        names = {t.name for t in self.tensors}
        if "output.weight" in names:
            return 0
        return next((t.n_bytes for t in self.tensors if t.name == "token_embd.weight"), 0)

    @cached_property
    def slots(self) -> tuple[SlotWeights, ...]:
        """Per-slot byte totals, index = slot (0..block_count); the input is `input_bytes`."""
        n_slots = self.n_slots
        dense = [0] * n_slots
        expert = [0] * n_slots
        for t, (slot, per_device, is_expert) in self._rows:
            if slot == INPUT_SLOT or slot >= n_slots or per_device:
                continue
            if is_expert:
                expert[slot] += t.n_bytes
            else:
                dense[slot] += t.n_bytes
        return tuple(SlotWeights(d, e) for d, e in zip(dense, expert, strict=False))

    @cached_property
    def _under(self) -> dict[str, tuple[tuple[SlotWeights, ...], int]]:
        return {}

    def slots_under(self, rule: BufferRule) -> tuple[SlotWeights, ...]:
        """`slots` as a backend's buffers hold them: each tensor padded by `rule`."""
        return self._padded(rule)[0]

    def input_bytes_under(self, rule: BufferRule = CPU_BUFFER) -> int:
        return self._padded(rule)[1]

    def _padded(self, rule: BufferRule) -> tuple[tuple[SlotWeights, ...], int]:
        found = self._under.get(rule.name)
        if found is not None:
            return found
        n_slots = self.n_slots
        dense = [0] * n_slots
        expert = [0] * n_slots
        inputs = 0
        alloc = rule.alloc
        for t, (slot, per_device, is_expert) in self._rows:
            size = alloc(t.ggml_type, t.shape[0] if t.shape else 1, t.n_bytes)
            if slot == INPUT_SLOT:
                inputs += size
            elif slot < n_slots and not per_device:
                if is_expert:
                    expert[slot] += size
                else:
                    dense[slot] += size
        found = (tuple(SlotWeights(d, e) for d, e in zip(dense, expert, strict=False)), inputs)
        self._under[rule.name] = found
        return found

    def tensor_alloc(self, t: TensorInfo, rule: BufferRule) -> int:
        return rule.alloc(t.ggml_type, t.shape[0] if t.shape else 1, t.n_bytes)

    @cached_property
    def slot_elements(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(dense, routed-expert) parameter counts per slot, the output head left out of dense
        (the speed model's FLOPs; computed once per layout)."""
        n_slots = self.n_slots
        dense = [0] * n_slots
        expert = [0] * n_slots
        for t, (slot, _, is_expert) in self._rows:
            if slot == INPUT_SLOT or slot >= n_slots or t.name.startswith("output."):
                continue
            n = 1
            for dim in t.shape:
                n *= dim
            if is_expert:
                expert[slot] += n
            else:
                dense[slot] += n
        return tuple(dense), tuple(expert)

    @cached_property
    def input_bytes(self) -> int:
        return sum(
            t.n_bytes
            for t, slot in zip(self.tensors, self.tensor_slots, strict=True)
            if slot == INPUT_SLOT
        )

    @cached_property
    def tensor_bytes_total(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    def is_nextn_slot(self, slot: int) -> bool:
        return 0 <= slot < len(self.view.layers) and self.view.layers[slot].nextn


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


class NoTensorTable(ValueError):
    """The architecture's family cannot list its tensors: a layout needs the GGUF header."""


class _SkeletonRow(NamedTuple):
    """What the quantizer's type choice reads of one tensor of the table, whatever the quant
    (a NamedTuple: a dataclass costs ~0.7 ms to define at import on Python 3.11)."""

    name: str
    shape: tuple[int, ...]
    unquantized: bool  # never quantized (1-D, norms, the router, ssm_conv1d)
    more_bits: bool  # a use_more_bits() layer of attn_v / attn_qkv / ffn_down
    expert: bool  # a routed-expert tensor (MXFP4_MOE keeps these MXFP4)


def can_synthesize(arch: Architecture) -> bool:
    """Whether `synthesize_layout` can build a layout of `arch` (its family lists its tensors),
    known without building one."""
    return _skeleton(arch) is not None


@lru_cache(maxsize=16)
def _skeleton(arch: Architecture) -> tuple[_SkeletonRow, ...] | None:
    """The architecture's tensor table with the quant-independent facts of each tensor, read
    once per architecture (a pick synthesizes every quant of one model from it); None: the
    family has no table."""
    from quantpick.arch.registry import tensor_shapes

    shapes = tensor_shapes(arch)
    if shapes is None:
        return None
    # use_more_bits() counts each tensor kind in layer order (llama-quant.cpp's i_attention_wv
    # and kin): the ordinal of a tensor among those with the same name past `blk.N.`.
    kind_of = {name: name.split(".", 2)[2] for name, _ in shapes if name.startswith("blk.")}
    counts: dict[str, int] = {}
    ordinal: dict[str, int] = {}
    for name, _ in shapes:
        kind = kind_of.get(name)
        if kind is not None:
            ordinal[name] = counts.get(kind, 0)
            counts[kind] = ordinal[name] + 1
    rows: list[_SkeletonRow] = []
    for name, shape in shapes:
        block = int(name.split(".")[1]) if name.startswith("blk.") else -1
        more_bits = False
        if ".ffn_down" in name:  # ffn_down_exps and ffn_down_shexp, by block index
            more_bits = _use_more_bits(block, arch.block_count)
        elif name in ordinal and name.endswith(("attn_v.weight", "attn_qkv.weight")):
            more_bits = _use_more_bits(ordinal[name], counts[kind_of[name]])
        expert = is_expert_name(name)
        rows.append(_SkeletonRow(name, shape, _unquantized(name, shape), more_bits, expert))
    return tuple(rows)


def synthesize_layout(arch: Architecture, quant: str, file_bytes: int) -> ModelLayout:
    """Tensor classes at the types llama.cpp's quantizer gives `quant`, then the remainder between
    that sum and the real file size spread over the quantized tensors, so the total matches.
    Raises NoTensorTable when the architecture's family has no tensor table."""
    skeleton = _skeleton(arch)
    if skeleton is None:
        raise NoTensorTable(f"quantpick cannot list {arch.name}'s tensors without its GGUF header")
    key = normalize_quant(quant)
    base = _BASE_TYPE.get(key, "Q4_K")
    mix = key.endswith(("_M", "_L")) or quant.upper().startswith("UD-")
    high = base in _HIGH_PRECISION
    raw: list[tuple[str, tuple[int, ...], str, int]] = []
    for row in skeleton:
        name, shape = row.name, row.shape
        if row.unquantized:
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
                qtype = "MXFP4" if row.expert else "Q8_0"
            if mix and row.more_bits and base in _MORE_BITS:
                qtype = _MORE_BITS[base]
        # ggml requires whole blocks; fall back to a block-free type when a row does not fill one.
        if shape[0] % GGML_TYPES[qtype][1] != 0:
            qtype = "F16" if qtype != "F32" else "F32"
        raw.append((name, shape, qtype, tensor_bytes(qtype, shape)))

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


def synthesized_layouts(manifest: object) -> dict[str, ModelLayout]:
    """Every model quant of a manifest, synthesized from its architecture block and file sizes
    (no header): what the planner weighs before any header is read (tests, benchmarks)."""
    from quantpick.model.manifest import Manifest

    assert isinstance(manifest, Manifest)
    out: dict[str, ModelLayout] = {}
    for quant in manifest.quants:
        size = sum(f.size_bytes for f in manifest.quant_files(quant))
        out[quant] = synthesize_layout(manifest.architecture, quant, size)
    return out
