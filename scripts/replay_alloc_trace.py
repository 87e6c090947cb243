#!/usr/bin/env python3
"""Replay a trace of llama.cpp's graph allocator and show its free blocks before one allocation.

    python scripts/replay_alloc_trace.py TRACE [--before result_output] [--alignment 32]
                                               [--buffer Vulkan0]

TRACE is the stderr of a llama.cpp tool (llama-memory-bytes, llama-fit-params) built with
ggml/src/ggml-alloc.c's `GGML_ALLOCATOR_DEBUG` defined and its `AT_PRINTF` sent to the log
(b11312: lines 16-19), one `allocating NAME (N bytes) - block B, offset O` and `freeing NAME at
{chunk=0, offset=O} (N bytes) - n_free_blocks = K` line per event. The trace gives the events;
this script gives the allocator's state between them, which the trace does not print: it runs
every event through a transcription of `ggml_dyn_tallocr` (b11312, commit 0c1e57098), checks
that every allocation lands on the block and offset llama.cpp printed and every free sees the
number of free blocks it printed, and prints the free list before the named allocation.

The transcription, one chunk (the CPU backend's buffer has no maximum size), is
quantpick/plan/allocator.py `Allocator`.

A trace of several buffers (a GPU's and the host's: the Vulkan build of
scripts/build-llamacpp-vulkan.sh with ALLOC_TRACE=1 prefixes every line with its allocator's
address and prints `[ADDR] buffer N NAME` and `[ADDR] reset` for each reserve) is replayed for
one buffer with `--buffer NAME`, from its last reset (the graph llama.cpp sized it by).

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

from quantpick.plan.allocator import Allocator

ALLOC_RE = re.compile(r"allocating (.+?) \((\d+) bytes\) - block (\d+), offset (\d+), chunk 0")
FREE_RE = re.compile(
    r"freeing (.+?) at \{chunk=0, offset=(\d+)\} \((\d+) bytes\) - n_free_blocks = (\d+)"
)
MiB = 1024**2


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


BUFFER_RE = re.compile(r"^\[(0x[0-9a-f]+)\] buffer \d+ (\S+)$")
RESET_RE = re.compile(r"^\[(0x[0-9a-f]+)\] reset$")


def buffer_events(lines: list[tuple[int, str]], name: str) -> list[tuple[int, str]]:
    """The lines of buffer `name`'s allocator after its last reset."""
    addresses = {m[1] for _, line in lines if (m := BUFFER_RE.match(line)) and m[2] == name}
    if not addresses:
        raise SystemExit(f"no buffer named {name} in the trace (an ALLOC_TRACE=1 build names them)")
    mine = [(n, line) for n, line in lines if line[1:].split("]", 1)[0] in addresses]
    resets = [i for i, (_, line) in enumerate(mine) if RESET_RE.match(line)]
    return mine[resets[-1] + 1 :] if resets else mine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--before", default="result_output", help="the allocation to stop before")
    ap.add_argument("--alignment", type=int, default=32, help="the buffer's (CPU: 32)")
    ap.add_argument("--buffer", help="replay this buffer's events only (an ALLOC_TRACE build)")
    args = ap.parse_args()
    alloc = Allocator(args.alignment)
    mismatches = 0
    lines = list(enumerate(args.trace.read_text().splitlines(), 1))
    if args.buffer:
        lines = buffer_events(lines, args.buffer)
    for n, line in lines:
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
