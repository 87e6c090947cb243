#!/usr/bin/env python3
"""Record llama.cpp's projection of its own test model of every architecture.

Runs the pinned build's test-llama-archs (a tiny GGUF per architecture) and llama-memory-bytes
over tests/llamacpp_archs.GRID (the host alone, and two local RPC workers standing in for two
devices), and writes tests/data/llamacpp-archs.json.gz: per model, its GGUF header as quantpick
stores headers (model.gguf.header_to_json) and llama.cpp's bytes per device for each case.
tests/arch/test_conformance.py checks quantpick's estimate against it (and, with the binaries,
against a fresh run).

    scripts/record_arch_conformance.py --bin "$(scripts/build-llamacpp.sh | tail -n 1)"
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from llamacpp_archs import GRID, generate_models, project  # noqa: E402
from rpc_workers import rpc_workers  # noqa: E402

from quantpick.model.gguf import header_to_json, read_gguf_file  # noqa: E402

OUT = ROOT / "tests" / "data" / "llamacpp-archs.json.gz"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="the llama.cpp bin directory")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--arch", default="", help="only models whose name contains this")
    args = ap.parse_args()
    start = time.monotonic()
    doc: dict[str, object] = {"llamacpp": "b11312", "grid": [c.as_dict() for c in GRID],
                              "models": {}}  # fmt: skip
    models = doc["models"]
    assert isinstance(models, dict)
    with tempfile.TemporaryDirectory() as tmp, rpc_workers(args.bin, 2) as endpoints:
        for name, path in generate_models(args.bin, Path(tmp)).items():
            if args.arch not in name:
                continue
            header = read_gguf_file(path)
            moe = any("_exps" in t.name for t in header.tensors)
            cases = []
            for i, case in enumerate(GRID):
                if case.moe_only and not moe:
                    continue
                got = project(args.bin, path, case, endpoints)
                cases.append({"case": i, "devices": got.devices, "error": got.error})
            models[name] = {"header": header_to_json(header), "cases": cases}
            print(f"{name}: {len(cases)} cases", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"), sort_keys=True)
    print(
        f"{len(models)} models, {time.monotonic() - start:.0f} s -> {args.out} "
        f"({args.out.stat().st_size / 1024:.0f} KiB)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
