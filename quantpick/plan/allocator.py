"""llama.cpp's graph allocator, transcribed: `ggml_dyn_tallocr` of ggml/src/ggml-alloc.c (b11312,
commit 0c1e57098) over one chunk, as pure state. quantpick replays the op sequences of the
host layers a GPU runs by op offload with it (plan/host_replay.py), where a compute buffer's peak
is a best-fit placement no phase rule carries; scripts/replay_alloc_trace.py runs a whole
recorded trace through it and checks every event against llama.cpp's.

- alloc, :202-304: the best fit among the blocks but the last (`block->size <= best_fit_size`:
  a tie goes to the later block), else the last block; the block's offset moves up by the size
  (:264-265) and the block is removed only when that leaves it empty (:266-269);
- free, :312-349: the freed bytes join the first block (in the array's order) that ends where
  they start or starts where they end, which then merges with its array neighbour only
  (:323-329, :337-343); otherwise a new block is inserted before the first block whose offset
  is not below them (:135-150), even when the freed size is 0.
"""

from __future__ import annotations

from quantpick.model.ggml import pad


class Allocator:
    """ggml_dyn_tallocr over one chunk: free blocks as [offset, size], the last one unbounded;
    `max_size` is the buffer the allocations so far need."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, 1 << 62]]
        self.max_size = 0

    def alloc(self, size: int) -> tuple[int, int]:
        size = pad(size, self.alignment)
        best, best_size = -1, None
        for i, (_, bsize) in enumerate(self.blocks[:-1]):
            if bsize >= size and (best_size is None or bsize <= best_size):
                best, best_size = i, bsize
        if best == -1:
            best = len(self.blocks) - 1
        offset, bsize = self.blocks[best]
        self.blocks[best] = [offset + size, bsize - size]
        if bsize == size:
            del self.blocks[best]
        self.max_size = max(self.max_size, offset + size)
        return best, offset

    def free(self, offset: int, size: int) -> None:
        size = pad(size, self.alignment)
        for i, block in enumerate(self.blocks):
            if block[0] + block[1] == offset:
                block[1] += size
                if i < len(self.blocks) - 1 and block[0] + block[1] == self.blocks[i + 1][0]:
                    block[1] += self.blocks.pop(i + 1)[1]
                return
            if offset + size == block[0]:
                block[0], block[1] = offset, block[1] + size
                if i > 0 and self.blocks[i - 1][0] + self.blocks[i - 1][1] == block[0]:
                    self.blocks[i - 1][1] += self.blocks.pop(i)[1]
                return
        pos = 0
        while pos < len(self.blocks) and self.blocks[pos][0] < offset:
            pos += 1
        self.blocks.insert(pos, [offset, size])
