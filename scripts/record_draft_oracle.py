#!/usr/bin/env python3
"""Record llama-server's own buffer lines with a draft model over a grid, as a fixture.

    bin="$(scripts/build-llamacpp.sh | tail -n 1)"
    python scripts/record_draft_oracle.py "$bin" tests/data/llama-server-draft-buffers.json

Writes quantpick's tiny qwen35moe model (tests/tiny_model.py) and a smaller draft of the same
vocabulary (TINY_DRAFT), starts the pinned llama-server with `--spec-type draft-simple -md DRAFT
-lv 4 -fit off` for every point of the grid (-c, -np, --spec-draft-n-max, -ctkd/-ctvd, -kvu) on
the CPU build, stops it once the slots exist, and keeps the target's and the draft's buffer lines
("loading draft model", common/speculative.cpp:2540, separates them): model buffer, KV (size,
cells, layers), recurrent state, output and compute buffers, in MiB as printed (two decimals),
and whether the speculation started ("adding speculative implementation 'draft-simple'"). Two
drafts llama.cpp must refuse are recorded too: a vocabulary 1024 tokens larger, and one token's
text changed (common_speculative_are_compatible, common/speculative.cpp:67-122). And an `mtp-`
sidecar (tests/tiny_model.py sidecar=True: the NextN block, embeddings and output head alone) run
with `--spec-type draft-mtp -md SIDECAR` over the grid without -kvu ("sidecar_cases"): llama.cpp
loads it as the draft model with an MTP context.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from tiny_model import TINY_DRAFT, write_tiny_model  # noqa: E402

GRID = {
    "ctx": (4096, 16384),
    "np": (1, 4),
    "n_max": (1, 3),
    "ctkd": ("f16", "q8_0"),
    "kvu": (False, True),
}
MIB = r"([0-9.]+) MiB"
PATTERNS = {
    "model": re.compile(r"load_tensors:\s+\S+ model buffer size =\s+" + MIB),
    "output": re.compile(r"llama_context:\s+\S+\s+output buffer size =\s+" + MIB),
    "kv": re.compile(r"llama_kv_cache: size =\s+" + MIB + r" \(\s*(\d+) cells,\s+(\d+) layers"),
    "recurrent": re.compile(r"llama_memory_recurrent: size =\s+" + MIB),
    "compute": re.compile(r"sched_reserve:\s+\S+ compute buffer size =\s+" + MIB),
}
STARTED = "adding speculative implementation 'draft-"
REFUSED = "the target and draft vocabs are not compatible"


def parse(log: str) -> dict[str, object]:
    main, _, draft = log.partition("loading draft model")
    out: dict[str, object] = {}
    for part, text in (("main", main), ("draft", draft.split("initializing, n_slots")[0])):
        rec: dict[str, object] = {}
        for key, pat in PATTERNS.items():
            m = pat.search(text)
            if m is None:
                continue
            rec[key] = float(m.group(1))
            if key == "kv":
                rec["kv_cells"], rec["kv_layers"] = int(m.group(2)), int(m.group(3))
        out[part] = rec
    # the implementation is added before the check that refuses it (speculative.cpp:198-255)
    out["refused"] = REFUSED in log
    out["started"] = STARTED in log and not out["refused"]
    return out


def run(
    server: Path, model: Path, draft: Path, args: list[str], port: int, kind: str = "draft-simple"
) -> str:
    cmd = [str(server), "-m", str(model), "--port", str(port), "-lv", "4", "-fit", "off",
           "--spec-type", kind, "-md", str(draft), "-ngld", "0", "-devd", "none",
           *args]  # fmt: skip
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.3)
                log.seek(0)
                if "new slot" in log.read():
                    break
        finally:
            proc.terminate()
            proc.wait(30)
        log.seek(0)
        return log.read()


def main() -> None:
    bin_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    server = bin_dir / "llama-server"
    with tempfile.TemporaryDirectory() as tmp:
        model, draft = Path(tmp) / "tiny.gguf", Path(tmp) / "tiny-draft.gguf"
        write_tiny_model(model)
        write_tiny_model(draft, hparams=TINY_DRAFT, seed=1)
        cases = []
        for i, (ctx, np_, n, ctkd, kvu) in enumerate(itertools.product(*GRID.values())):
            args = ["-c", str(ctx), "-np", str(np_), "--spec-draft-n-max", str(n),
                    "-ctkd", ctkd, "-ctvd", ctkd, *(["-kvu"] if kvu else [])]  # fmt: skip
            rec = parse(run(server, model, draft, args, 18500 + i))
            if not rec["started"] or "kv" not in rec["draft"]:  # type: ignore[operator]
                raise SystemExit(f"no draft context in the log of {args}")
            cases.append({"ctx": ctx, "np": np_, "n_max": n, "ctkd": ctkd, "kvu": kvu, **rec})
            print(ctx, np_, n, ctkd, kvu, rec["draft"])
        sidecar = Path(tmp) / "mtp-tiny-Q8_0.gguf"
        write_tiny_model(sidecar, sidecar=True, seed=3)
        sidecar_cases = []
        for i, (ctx, np_, n, ctkd, kvu) in enumerate(itertools.product(*GRID.values())):
            if kvu:
                continue
            args = ["-c", str(ctx), "-np", str(np_), "--spec-draft-n-max", str(n),
                    "-ctkd", ctkd, "-ctvd", ctkd]  # fmt: skip
            rec = parse(run(server, model, sidecar, args, 18700 + i, kind="draft-mtp"))
            if not rec["started"] or "kv" not in rec["draft"]:  # type: ignore[operator]
                raise SystemExit(f"no MTP sidecar context in the log of {args}")
            sidecar_cases.append({"ctx": ctx, "np": np_, "n_max": n, "ctkd": ctkd, **rec})
            print("sidecar", ctx, np_, n, ctkd, rec["draft"])
        refusals = []
        for name, kwargs in (
            ("vocab-1024-larger", {"hparams": dict(TINY_DRAFT, n_vocab=2048)}),
            ("token-600-text", {"hparams": TINY_DRAFT, "odd_token": 600}),
        ):
            odd = Path(tmp) / f"{name}.gguf"
            write_tiny_model(odd, seed=2, **kwargs)
            rec = parse(run(server, model, odd, ["-c", "4096"], 18600 + len(refusals)))
            refusals.append({"draft": name, "started": rec["started"], "refused": rec["refused"]})
            print(name, refusals[-1])
    doc = {
        "model": "tests/tiny_model.py write_tiny_model()",
        "draft": "tests/tiny_model.py write_tiny_model(hparams=TINY_DRAFT, seed=1)",
        "flags": "-fit off --spec-type draft-simple -md DRAFT -ngld 0 -devd none",
        "sidecar": "tests/tiny_model.py write_tiny_model(sidecar=True, seed=3), draft-mtp",
        "cases": cases,
        "sidecar_cases": sidecar_cases,
        "refusals": refusals,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
