#!/usr/bin/env python3
"""Record llama.cpp's compute buffer of the architectures with a compute trait (quantpick/arch/
graph.py) over the sizes their traits scale with: context, ubatch, sequences, unified cache.

Runs the pinned build's test-llama-archs (a tiny GGUF per architecture) and llama-memory-bytes on
the host alone (-dev none) over TRAIT_GRID, and writes tests/data/arch-traits.json: per case the
model, the flags and llama.cpp's compute bytes. The models' headers are those of
tests/data/llamacpp-archs.json.gz (scripts/record_arch_conformance.py, the same test-llama-archs);
tests/arch/test_graph_traits.py rebuilds the layout from there and checks each trait's figure.

    scripts/record_arch_traits.py --bin "$(scripts/build-llamacpp.sh | tail -n 1)"
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from llamacpp_archs import generate_models  # noqa: E402

OUT = ROOT / "tests" / "data" / "arch-traits.json"

# (model, -c, -ub, -np, -kvu, -fa): what the glm5-next and minimax-m3 traits scale with.
TRAIT_GRID: tuple[tuple[str, int, int, int, bool, str], ...] = tuple(
    (model, ctx, ub, n_par, kvu, fa)
    for model in ("glm5-next-moe", "minimax-m3-moe")
    for ctx, ub, n_par, kvu, fa in (
        (8192, 512, 1, False, "on"),
        (32768, 256, 1, False, "on"),
        (32768, 512, 1, False, "on"),
        (32768, 1024, 1, False, "on"),
        (32768, 512, 2, False, "on"),
        (32768, 512, 4, False, "on"),
        (32768, 512, 2, True, "on"),
        (32768, 512, 4, True, "on"),
        (32768, 512, 8, True, "on"),
        (32768, 512, 1, False, "off"),
    )
)


def compute_bytes(bin_dir: Path, model: Path, flags: list[str]) -> int:
    argv = [str(bin_dir / "llama-memory-bytes"), "-m", str(model), "--log-disable", *flags]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    doc = json.loads(next(x for x in run.stdout.splitlines() if x.startswith("{")))
    return sum(b["compute"] for b in doc["buffer_types"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="the llama.cpp bin directory")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = generate_models(args.bin, Path(tmp))
        for model, ctx, ub, n_par, kvu, fa in TRAIT_GRID:
            flags = ["-c", str(ctx), "-ub", str(ub), "-b", str(max(2048, ub)), "-np", str(n_par),
                     "-fa", fa, "-dev", "none", *(["-kvu"] if kvu else [])]  # fmt: skip
            got = compute_bytes(args.bin, models[model], flags)
            rows.append({"model": model, "ctx": ctx, "ub": ub, "np": n_par, "kvu": kvu, "fa": fa,
                         "compute": got})  # fmt: skip
            print(f"{model} {' '.join(flags)}: {got / 2**20:.2f} MiB", flush=True)
    doc = {"llama_cpp": args.bin.parent.name, "rows": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
