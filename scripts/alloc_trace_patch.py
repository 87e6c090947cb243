#!/usr/bin/env python3
"""Turn on ggml-alloc.c's allocator trace in a copy of the pinned tree (b11312), for
scripts/build-llamacpp-vulkan.sh with ALLOC_TRACE=1:

    python3 scripts/alloc_trace_patch.py SRC/ggml/src/ggml-alloc.c

AT_PRINTF goes to stderr, every allocation and free is prefixed with its allocator's address,
and each reserve prints one line per buffer ("[ADDR] buffer N Vulkan0") and one per reset, so a
trace of several buffers (a GPU's, the host's) can be replayed one buffer at a time
(scripts/replay_alloc_trace.py --buffer NAME). Idempotent; refuses a file it does not know.
"""

from __future__ import annotations

import sys
from pathlib import Path

MARK = "QUANTPICK_ALLOC_TRACE"
EDITS = (
    (
        "#define AT_PRINTF(...)\n",
        f"#define AT_PRINTF(...) fprintf(stderr, __VA_ARGS__)  // {MARK}\n",
    ),
    (
        'AT_PRINTF("%s: allocating %s (%zu bytes) - ", __func__,',
        'AT_PRINTF("[%p] %s: allocating %s (%zu bytes) - ", (void*)alloc, __func__,',
    ),
    (
        'AT_PRINTF("%s: freeing %s at {chunk=%d, offset=%zu} (%zu bytes) - n_free_blocks = %d\\n",'
        "\n        __func__,",
        'AT_PRINTF("[%p] %s: freeing %s at {chunk=%d, offset=%zu} (%zu bytes) - n_free_blocks = '
        '%d\\n",\n        (void*)alloc, __func__,',
    ),
    (
        "static void ggml_dyn_tallocr_reset(struct ggml_dyn_tallocr * alloc) {\n",
        "static void ggml_dyn_tallocr_reset(struct ggml_dyn_tallocr * alloc) {\n"
        '    AT_PRINTF("[%p] reset\\n", (void*)alloc);\n',
    ),
    (
        "        ggml_dyn_tallocr_reset(galloc->buf_tallocs[i]);\n",
        '        AT_PRINTF("[%p] buffer %d %s\\n", (void*)galloc->buf_tallocs[i], i,\n'
        "                  ggml_backend_buft_name(galloc->bufts[i]));\n"
        "        ggml_dyn_tallocr_reset(galloc->buf_tallocs[i]);\n",
    ),
)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: alloc_trace_patch.py PATH/ggml-alloc.c", file=sys.stderr)
        return 2
    path = Path(sys.argv[1])
    text = path.read_text(encoding="utf-8")
    if MARK in text:
        return 0
    for old, new in EDITS:
        if old not in text:
            print(f"alloc_trace_patch: {path} is not b11312's ggml-alloc.c", file=sys.stderr)
            return 1
        text = text.replace(old, new, 1)
    path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
