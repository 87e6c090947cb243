#!/usr/bin/env python3
"""Replay a trace of llama.cpp's graph allocator and show its free blocks before one allocation.

    python scripts/replay_alloc_trace.py TRACE [--before result_output] [--alignment 32]

TRACE is the stderr of a llama.cpp tool (llama-memory-bytes, llama-fit-params) built with
ggml/src/ggml-alloc.c's `GGML_ALLOCATOR_DEBUG` defined and its `AT_PRINTF` sent to the log
(b11312: lines 16-19), one `allocating NAME (N bytes) - block B, offset O` and `freeing NAME at
{chunk=0, offset=O} (N bytes) - n_free_blocks = K` line per event. The trace gives the events;
this script gives the allocator's state between them, which the trace does not print: it runs
every event through a transcription of `ggml_dyn_tallocr` (b11312, commit 0c1e57098), checks
that every allocation lands on the block and offset llama.cpp printed and every free sees the
number of free blocks it printed, and prints the free list before the named allocation.

Transcribed, one chunk (the CPU backend's buffer has no maximum size):
- alloc, :202-304: the best fit among the blocks but the last (`block->size <= best_fit_size`:
  a tie goes to the later block), else the last block; the block's offset moves up by the size
  (:264-265) and the block is removed only when that leaves it empty (:266-269);
- free, :312-349: the freed bytes join the first block (in the array's order) that ends where
  they start or starts where they end, which then merges with its array neighbour only
  (:323-329, :337-343); otherwise a new block is inserted before the first block whose offset
  is not below them (:135-150), even when the freed size is 0.

A zero-byte tensor (a recurrent state's `states_extra` get_rows of n_rs - n_seqs = 0 rows, src/
llama-graph.cpp:3538-3543) freed inside a free block leaves a zero-size block there; when the
block below it later grows past it (:264), the array is no longer sorted by address and the
zero-size block keeps two adjacent free blocks apart for the rest of the graph: the script marks
it `fence`. docs/compute.md ("Left open") tells what it does to LFM2 at -ub 4089-4096.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from quantpick.model.ggml import pad

ALLOC_RE = re.compile(r"allocating (\S+) \((\d+) bytes\) - block (\d+), offset (\d+), chunk 0")
FREE_RE = re.compile(
    r"freeing (\S+) at \{chunk=0, offset=(\d+)\} \((\d+) bytes\) - n_free_blocks = (\d+)"
)
MiB = 1024**2


class Allocator:
    """ggml_dyn_tallocr over one chunk: free blocks as [offset, size], the last one unbounded."""

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


def describe(blocks: list[list[int]]) -> list[str]:
    lines = []
    for i, (offset, size) in enumerate(blocks):
        last = i == len(blocks) - 1
        fence = size == 0 and i > 0 and blocks[i - 1][0] > offset
        end = "(last block)" if last else f"{size / MiB:10.3f} MiB"
        lines.append(
            f"  block {i}: offset {offset / MiB:10.3f} MiB  {end}{'  fence' if fence else ''}"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--before", default="result_output", help="the allocation to stop before")
    ap.add_argument("--alignment", type=int, default=32, help="the buffer's (CPU: 32)")
    args = ap.parse_args()
    alloc = Allocator(args.alignment)
    mismatches = 0
    for n, line in enumerate(args.trace.read_text().splitlines(), 1):
        if m := ALLOC_RE.search(line):
            if m[1] == args.before:
                print(f"free blocks before {m[1]} ({int(m[2]) / MiB:.3f} MiB), line {n}:")
                print("\n".join(describe(alloc.blocks)))
            got = alloc.alloc(int(m[2]))
            if got != (int(m[3]), int(m[4])):
                mismatches += 1
                print(
                    f"line {n}: {m[1]} at block {got[0]} offset {got[1]}, llama.cpp {m[3]} {m[4]}"
                )
            if m[1] == args.before:
                print(f"  -> block {got[0]}, offset {got[1] / MiB:.3f} MiB")
        elif m := FREE_RE.search(line):
            if len(alloc.blocks) != int(m[4]):
                mismatches += 1
                print(
                    f"line {n}: {len(alloc.blocks)} free blocks before freeing {m[1]}, "
                    f"llama.cpp {m[4]}"
                )
            alloc.free(int(m[2]), int(m[3]))
    print(f"max size {alloc.max_size / MiB:.3f} MiB; {mismatches} events differ from the trace")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
