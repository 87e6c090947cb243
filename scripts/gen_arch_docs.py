#!/usr/bin/env python3
"""Write docs/architectures.md from the registry and the recorded llama.cpp projections.

Every status in the page is computed, not typed: an architecture is "exact" when quantpick's
weights and KV + state equal llama.cpp's bytes on every device of every recorded case
(tests/data/llamacpp-archs.json.gz: llama.cpp's own test model of each architecture;
tests/data/arch-real/*.json: full-size header-only files of real configs). tests/arch/test_docs.py
fails when the page is stale.

    python scripts/gen_arch_docs.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
OUT = ROOT / "docs" / "architectures.md"

HEAD = """# Architectures

quantpick reads any GGUF. What llama.cpp will allocate for it comes from two things:

- the **tensor table** in the header, for every architecture, known or not: each tensor loads into
  the slot llama.cpp gives it (`blk.N.*` is layer N, the output head and its norms are the output
  layer, the other global tensors stay in host memory), padded the way the device's backend pads it
  (32-byte alignment on the CPU, 128 and a padded last row of quantized matrices on CUDA);
- a **per-layer view** of the architecture (`quantpick/arch/`): for every layer its attention kind
  (full, sliding window, none), KV heads and K/V widths, whether it reads another layer's KV, its
  recurrent state, an indexer cache, whether it is an MTP/NextN block. One module per family
  builds it from the GGUF keys, as the model's `load_arch_hparams` and llama.cpp's
  `create_memory` do; memory, speed and the planner read only the view.

An architecture no family covers is planned with the generic rule (llama.cpp's shared
hyperparameters, KV on every layer), its basis shown as "generic, not checked for this
architecture", never refused.

## How it is proven

llama.cpp's own `tests/test-llama-archs -o DIR` (built by `scripts/build-llamacpp.sh`) writes a
tiny model of every architecture it loads. `scripts/record_arch_conformance.py` asks llama.cpp for
each one's per-device bytes over a grid (context padding and streams at `-c 33000 -np 3`,
`--kv-unified`, q8_0 KV, flash attention off, `--swa-full`, two RPC devices split `-ts 1,1` and
`3,1`, `-ngl 1`, `-nkvo`, `--n-cpu-moe 1`), with `llama-memory-bytes`
(`scripts/llamacpp-memory/`): the same no-alloc load as `llama-fit-params`, printed in bytes and
taking `--kv-unified`, which `llama-fit-params` in b11312 does not (`common/arg.cpp:1724-1730`);
floor(bytes / MiB) equals `llama-fit-params` on every row checked. `tests/arch/test_conformance.py`
compares quantpick to the byte, on the recording always and live when the binaries are built (CI).
Full-size header-only files of real configs (`tests/data/arch-real/`) check the tensor tables
quantpick synthesizes before a header is read, and the rules at real sizes.

## Adding an architecture

One module in `quantpick/arch/` (or one entry in a family's table) with its `configure` (and a
`tensor_shapes` to plan before the header is read), one line in `arch/registry.py`'s `families`,
one recorded projection (`scripts/record_arch_conformance.py`, or `scripts/record_arch_real.py` for
a full-size config), then `python scripts/gen_arch_docs.py`. Where its graph keeps alive what the
generic compute phases do not (a sparse indexer's masks, ...), the family gives it a `GraphTrait`
(`quantpick/arch/graph.py`, `Family.graph_traits`; docs/compute.md).
"""


def status_rows() -> list[tuple[str, str, str, str]]:
    import gzip
    import json

    from arch.test_conformance import DATA, NOT_EXACT, mismatches
    from arch_real import DATA as REAL
    from arch_real import load, rows
    from llamacpp_archs import case_from_dict

    from quantpick.arch.registry import families, support
    from quantpick.model.gguf import header_from_json, layout_from_header

    with gzip.open(DATA, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    grid = [case_from_dict(c) for c in doc["grid"]]
    results: dict[str, list[int]] = {}
    for name, entry in doc["models"].items():
        layout = layout_from_header(header_from_json(entry["header"]), basis=name)
        cases = [(grid[c["case"]], c["devices"]) for c in entry["cases"] if c["error"] is None]
        arch = layout.architecture.name
        bad = mismatches(layout, cases)
        got = results.setdefault(arch, [0, 0])
        got[0] += len(cases) - len({p.split(":")[0] for p in bad})
        got[1] += len(cases)
    real: dict[str, list[str]] = {}
    for path in sorted(REAL.glob("*.json")):
        doc_real, _layout = load(path)
        got_rows = rows(path)
        ok = all(r.exact for r in got_rows)
        real.setdefault(doc_real["arch"], []).append(
            f"{doc_real['config']} {'exact' if ok else 'NOT exact'}"
        )
    table = []
    covered = set()
    for fam in families():
        for arch in sorted(fam.architectures):
            covered.add(arch)
            parts = []
            if arch in results:
                ok, total = results[arch]
                parts.append(
                    f"exact ({ok}/{total} cases)" if ok == total else f"{ok}/{total} exact"
                )
            if arch in real:
                parts.append("full size: " + ", ".join(real[arch]))
            status = "; ".join(parts) or "rules from llama.cpp's source; no test model"
            table.append((fam.name, arch, status, fam.summary))
    for arch in sorted(set(results) - covered):
        ok, total = results[arch]
        why = NOT_EXACT.get(arch, "")
        status = f"generic rule: {ok}/{total} cases exact" + (f" ({why})" if why else "")
        table.append((support(arch).family, arch, status, ""))
    return table


def render() -> str:
    lines = [HEAD, "## Status (generated)", ""]
    lines.append("| family | architecture | status | what sets the family apart |")
    lines.append("|---|---|---|---|")
    last = None
    for fam, arch, status, summary in status_rows():
        lines.append(f"| {fam if fam != last else ''} | {arch} | {status} | "
                     f"{summary if fam != last else ''} |")  # fmt: skip
        last = fam
    from quantpick.arch.registry import families

    lines += ["", "## The rules each family applies", ""]
    for fam in families():
        lines.append(f"- **{fam.name}**: " + "; ".join(fam.rules))
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = ap.parse_args()
    text = render()
    if args.check:
        return 0 if OUT.exists() and OUT.read_text() == text else 1
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
