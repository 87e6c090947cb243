"""ggml tensor types: block sizes and byte sizes (ggml/src/ggml.c type_traits). Pure, no numpy.

Kept here rather than imported from `gguf` so the planner starts fast (gguf pulls in numpy).
tests/model/test_ggml.py checks this table against gguf.constants.GGML_QUANT_SIZES.
"""

from __future__ import annotations

# name -> (ggml type id, elements per block, bytes per block)
GGML_TYPES: dict[str, tuple[int, int, int]] = {
    "F32": (0, 1, 4),
    "F16": (1, 1, 2),
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q8_1": (9, 32, 40),
    "Q2_K": (10, 256, 84),
    "Q3_K": (11, 256, 110),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
    "Q8_K": (15, 256, 292),
    "IQ2_XXS": (16, 256, 66),
    "IQ2_XS": (17, 256, 74),
    "IQ3_XXS": (18, 256, 98),
    "IQ1_S": (19, 256, 50),
    "IQ4_NL": (20, 32, 18),
    "IQ3_S": (21, 256, 110),
    "IQ2_S": (22, 256, 82),
    "IQ4_XS": (23, 256, 136),
    "I8": (24, 1, 1),
    "I16": (25, 1, 2),
    "I32": (26, 1, 4),
    "I64": (27, 1, 8),
    "F64": (28, 1, 8),
    "IQ1_M": (29, 256, 56),
    "BF16": (30, 1, 2),
    "TQ1_0": (34, 256, 54),
    "TQ2_0": (35, 256, 66),
    "MXFP4": (39, 32, 17),
    "NVFP4": (40, 64, 36),
    "Q1_0": (41, 128, 18),
}
TYPE_BY_ID: dict[int, str] = {v[0]: k for k, v in GGML_TYPES.items()}

# KV cache types llama-server accepts for -ctk/-ctv (common/arg.cpp: kv_cache_types).
KV_CACHE_TYPES: tuple[str, ...] = (
    "f32",
    "f16",
    "bf16",
    "q8_0",
    "q4_0",
    "q4_1",
    "iq4_nl",
    "q5_0",
    "q5_1",
)


def normalize_type(name: str) -> str:
    upper = name.strip().upper()
    if upper not in GGML_TYPES:
        raise KeyError(f"unknown ggml type {name!r}")
    return upper


def row_size(type_name: str, n_elements: int) -> int:
    """ggml_row_size: bytes of one row of n_elements (n_elements must fill whole blocks)."""
    _, block, size = GGML_TYPES[normalize_type(type_name)]
    return n_elements // block * size


def is_quantized(type_name: str) -> bool:
    """ggml_is_quantized: a block type (more than one element per block; ggml.c type_traits)."""
    return GGML_TYPES[normalize_type(type_name)][1] > 1


def tensor_bytes(type_name: str, shape: tuple[int, ...]) -> int:
    """ggml_nbytes of a contiguous tensor with ggml `ne` shape (ne[0] = row length)."""
    rows = 1
    for dim in shape[1:]:
        rows *= dim
    return row_size(type_name, shape[0]) * rows


# Types ggml_is_quantized is false for (ggml/src/ggml.c type_traits: is_quantized).
UNQUANTIZED = frozenset({"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"})


def pad(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


class BufferRule:
    """How a backend's buffer sizes one tensor: ggml_backend_buft_get_alloc_size, then padded to
    the buffer's alignment (ggml/src/ggml-alloc.c:1184 ggml_backend_alloc_ctx_tensors_from_buft).

    `alignment` is the buffer type's get_alignment; `row_padding` (0: none) adds to a quantized
    tensor whose rows are not a multiple of it the rest of one such row, as get_alloc_size does
    on backends with padded matrix kernels. Each backend's values and their source lines are in
    quantpick/machine/backends/."""

    __slots__ = ("name", "alignment", "row_padding")

    def __init__(self, name: str, alignment: int, row_padding: int) -> None:
        self.name = name
        self.alignment = alignment
        self.row_padding = row_padding

    def __repr__(self) -> str:
        return f"BufferRule({self.name})"

    def alloc(self, type_name: str, ne0: int, n_bytes: int) -> int:
        size = n_bytes
        if self.row_padding and ne0 % self.row_padding and type_name.upper() not in UNQUANTIZED:
            size += row_size(type_name, self.row_padding - ne0 % self.row_padding)
        return pad(size, self.alignment)


# The host's rule; each backend's own is in quantpick/machine/backends/ (its module cites it).
CPU_BUFFER = BufferRule("CPU", 32, 0)
