"""plan/allocator.py: the transcription of ggml_dyn_tallocr (ggml-alloc.c at b11312), and the
zero-size free block that plan/compute.py's state_rows_fence rests on."""

from __future__ import annotations

import pytest

from quantpick.plan.allocator import Allocator

BIG = 1 << 62


def test_sizes_pad_to_the_alignment_and_a_tie_goes_to_the_later_block() -> None:
    alloc = Allocator(32)
    assert alloc.alloc(40) == (0, 0)
    assert alloc.blocks == [[64, BIG - 64]]
    alloc.blocks = [[0, 64], [128, 64], [512, BIG]]
    assert alloc.alloc(64) == (1, 128)  # block->size <= best_fit_size (ggml-alloc.c:211-224)
    assert alloc.blocks == [[0, 64], [512, BIG]]  # emptied, removed (:266-269)


@pytest.mark.parametrize("zero_free", [False, True])
def test_a_zero_byte_free_fences_the_last_block_off(zero_free: bool) -> None:
    """Freed blocks merge only with their array neighbours (:318-345): a size-0 block left
    inside a free block, once the block below grows past it, keeps the next frees apart from
    the last block, and a large tensor lands above them instead of at the bottom."""
    alloc = Allocator(32)
    alloc.blocks = [[0, 256], [1024, BIG]]
    if zero_free:
        alloc.free(128, 0)  # inserted, not merged (:135-150)
        assert alloc.blocks == [[0, 256], [128, 0], [1024, BIG]]
    assert alloc.alloc(192) == (0, 0)  # the block below moves up past the zero block (:264)
    if zero_free:
        # the zero-size block now sits below its predecessor's offset: the array is unsorted
        assert alloc.blocks == [[192, 64], [128, 0], [1024, BIG]]
    alloc.free(0, 192)
    alloc.free(256, 768)
    _, offset = alloc.alloc(2048)  # the logits
    assert offset == (1024 if zero_free else 0)
