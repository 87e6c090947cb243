"""quantpick's own ggml type table against the gguf package's (which mirrors ggml.c type_traits)."""

from __future__ import annotations

import gguf
import pytest

from quantpick.model.ggml import GGML_TYPES, TYPE_BY_ID, is_quantized, row_size, tensor_bytes


@pytest.mark.parametrize("name", sorted(GGML_TYPES))
def test_block_and_type_size_match_gguf(name: str) -> None:
    type_id, block, size = GGML_TYPES[name]
    qtype = gguf.GGMLQuantizationType(type_id)
    assert qtype.name == name
    assert gguf.GGML_QUANT_SIZES[qtype] == (block, size)


def test_every_gguf_type_is_known() -> None:
    # A type llama.cpp can write that quantpick cannot size would make a header unreadable.
    known = {tid for tid, _, _ in GGML_TYPES.values()}
    missing = [t.name for t in gguf.GGML_QUANT_SIZES if int(t) not in known]
    assert missing == []
    assert all(TYPE_BY_ID[GGML_TYPES[n][0]] == n for n in GGML_TYPES)


def test_sizes_of_rows_and_tensors() -> None:
    assert row_size("Q4_K", 2048) == 2048 // 256 * 144
    assert row_size("f16", 512) == 1024
    assert tensor_bytes("Q8_0", (2048, 512)) == 2048 // 32 * 34 * 512


def test_quantized_types_are_the_block_types() -> None:
    """ggml_is_quantized: the cache types whose K and V get a Hadamard rotation
    (src/llama-kv-cache.cpp:321-338)."""
    assert is_quantized("q8_0") and is_quantized("Q4_K") and is_quantized("iq4_nl")
    assert not any(is_quantized(t) for t in ("f16", "F32", "bf16"))
