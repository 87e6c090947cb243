"""Time and peak memory of the GGUF header parser on hostile headers inside its 64 MiB cap.

    .venv/bin/python benchmarks/hostile_headers.py [--size-mib 60] [--shape NAME ...]

Each shape (tests/gguf_fixtures.py: hostile_header) is parsed in a fresh subprocess, twice: once
timed (perf_counter, no tracing) and once under tracemalloc for the peak of Python allocations
(the header bytes themselves are allocated before tracing starts, so the peak is the parser's
own). The outcome is what the parser answered: `ok` (parsed, bounded) or the first words of its
GGUFError. Goal (issue 13): every shape well under 100 MB and a few seconds; the reference below
is a real Qwen3.6-35B-A3B-sized header (~11 MB, 248k-token vocabulary).

Shapes: as the issue wrote them (as many entries as the size holds: millions), and `@cap`: the
same with at most 65,536 metadata pairs or tensors, the most an attacker who knows the parser's
count caps (quantpick.model.gguf.MAX_KV_PAIRS / MAX_TENSORS) can make it walk.
To measure another tree's parser: `cd / && PYTHONPATH=<tree> python <this file>`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from gguf_fixtures import HOSTILE_SHAPES  # noqa: E402

CHILD = r"""
import json, sys, time, tracemalloc
sys.path.insert(0, sys.argv[1])
from gguf_fixtures import hostile_header, write_gguf, FULL
from quantpick.errors import GGUFError
from quantpick.model.gguf import parse_gguf_header

shape, size, traced = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
shape, _, capped = shape.partition("@")
if shape == "reference":
    import tempfile, pathlib
    path = pathlib.Path(tempfile.mkdtemp()) / "full.gguf"
    write_gguf(path, FULL, big="Q4_K", mtp=True)
    with open(path, "rb") as fh:
        data = fh.read(16 * 1024 * 1024)
else:
    data = hostile_header(shape, size, max_count=65536 if capped else None)

def fill(offset, min_bytes):
    return data[offset : offset + max(min_bytes, 1024 * 1024)]

if traced:
    tracemalloc.start()
start = time.perf_counter()
try:
    header = parse_gguf_header(fill, source=shape)
    outcome = f"ok ({len(header.metadata)} keys kept, {len(header.tensors)} tensors)"
except GGUFError as exc:
    outcome = "GGUFError: " + exc.message.split(": ", 1)[-1][:60]
seconds = time.perf_counter() - start
peak = tracemalloc.get_traced_memory()[1] if traced else 0
print(json.dumps({"seconds": seconds, "peak": peak, "outcome": outcome, "bytes": len(data)}))
"""


def run(shape: str, size: int, traced: bool) -> dict[str, object]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(ROOT / "tests"),
            shape,
            str(size),
            "1" if traced else "0",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",  # not the checkout: PYTHONPATH=<other tree> then measures that tree's parser
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=60)
    capped = [f"{s}@cap" for s in ("tiny-kvs", "short-arrays", "short-string-arrays", "tensors")]
    parser.add_argument("--shape", action="append", choices=["reference", *HOSTILE_SHAPES, *capped])
    args = parser.parse_args()
    size = args.size_mib * 1024 * 1024
    shapes = args.shape or ["reference", *HOSTILE_SHAPES, *capped]
    print(f"{'shape':24s} {'header MiB':>10s} {'seconds':>8s} {'peak MiB':>9s}  outcome")
    for shape in shapes:
        timed = run(shape, size, traced=False)
        traced = run(shape, size, traced=True)
        print(
            f"{shape:24s} {int(timed['bytes']) / 2**20:10.1f} {float(timed['seconds']):8.2f} "  # type: ignore[arg-type]
            f"{int(traced['peak']) / 2**20:9.1f}  {timed['outcome']}",  # type: ignore[arg-type]
            flush=True,
        )


if __name__ == "__main__":
    main()
