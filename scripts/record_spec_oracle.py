#!/usr/bin/env python3
"""Record llama-server's own buffer lines with MTP speculation over a grid, as a fixture.

    bin="$(scripts/build-llamacpp.sh | tail -n 1)"
    python scripts/record_spec_oracle.py "$bin" tests/data/llama-server-mtp-buffers.json

Writes quantpick's tiny qwen35moe model with an MTP block (tests/tiny_model.py, mtp=True), starts
the pinned llama-server with `--spec-type draft-mtp -lv 4` for every point of the grid (-c, -np,
--spec-draft-n-max, -ctk/-ctv, -ctkd/-ctvd) on the CPU build, stops it once the slots exist, and
keeps the main context's and the MTP draft context's buffer lines (common/speculative.cpp:2560
"creating MTP draft context" separates them): model buffer, KV (size, cells, layers), recurrent
state, output and compute buffers, in MiB as printed (two decimals).
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

from tiny_model import write_tiny_model  # noqa: E402

GRID = {
    "ctx": (4096, 16384),
    "np": (1, 4),
    "n_max": (1, 3),
    "types": (("f16", "f16"), ("q8_0", "f16"), ("q8_0", "q8_0")),  # (-ctk/-ctv, -ctkd/-ctvd)
}
MIB = r"([0-9.]+) MiB"
PATTERNS = {
    "model": re.compile(r"load_tensors:\s+\S+ model buffer size =\s+" + MIB),
    "output": re.compile(r"llama_context:\s+\S+\s+output buffer size =\s+" + MIB),
    "kv": re.compile(r"llama_kv_cache: size =\s+" + MIB + r" \(\s*(\d+) cells,\s+(\d+) layers"),
    "recurrent": re.compile(r"llama_memory_recurrent: size =\s+" + MIB),
    "compute": re.compile(r"sched_reserve:\s+\S+ compute buffer size =\s+" + MIB),
}


def parse(log: str) -> dict[str, dict[str, object]]:
    main, _, draft = log.partition("creating MTP draft context")
    out: dict[str, dict[str, object]] = {}
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
    return out


def run(server: Path, model: Path, args: list[str], port: int) -> str:
    cmd = [str(server), "-m", str(model), "--port", str(port), "-lv", "4", "-fit", "off",
           "--spec-type", "draft-mtp", *args]  # fmt: skip
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
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny-mtp.gguf"
        write_tiny_model(model, mtp=True)
        cases = []
        for i, (ctx, np_, n, (ct, ctd)) in enumerate(itertools.product(*GRID.values())):
            args = ["-c", str(ctx), "-np", str(np_), "--spec-draft-n-max", str(n),
                    "-ctk", ct, "-ctv", ct, "-ctkd", ctd, "-ctvd", ctd]  # fmt: skip
            log = run(bin_dir / "llama-server", model, args, 18400 + i)
            rec = parse(log)
            if "kv" not in rec.get("draft", {}):
                raise SystemExit(f"no MTP draft context in the log of {args}:\n{log[-2000:]}")
            cases.append({"ctx": ctx, "np": np_, "n_max": n, "ctk": ct, "ctkd": ctd, **rec})
            print(ctx, np_, n, ct, ctd, rec["draft"])
    out.write_text(json.dumps({"model": "tests/tiny_model.py write_tiny_model(mtp=True)",
                               "cases": cases}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
