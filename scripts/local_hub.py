#!/usr/bin/env python3
"""A Hugging Face-compatible hub on 127.0.0.1 serving header-only GGUFs of real model configs, to
try `quantpick pick OWNER/REPO` (and its llama.cpp dry run) with no network.

    python scripts/local_hub.py [--config llama-3.1-8b ...] [--port 0]

Each config (tests/arch_configs.py: the `<arch>.*` keys the real GGUFs carry) becomes a repository
`local/<config>-GGUF` with its quants (Q4_K_M, Q8_0, BF16; MXFP4_MOE for gpt-oss) as full-size
sparse files: the headers are real, the weights a hole, so planning works and downloads do not
(the advertised hashes are stand-ins). It prints the environment to point quantpick at it and
serves until interrupted. This is the hub the tests use (tests/fakehub.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from arch_configs import BY_NAME  # noqa: E402
from arch_fixtures import write_header_only  # noqa: E402
from fakehub import FakeHub  # noqa: E402

QUANTS = ("Q4_K_M", "Q8_0", "BF16")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", choices=sorted(BY_NAME), default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="quantpick-local-hub-"))
    with FakeHub(root / "hub") as hub:
        for name in args.config or ["llama-3.1-8b"]:
            cfg = BY_NAME[name]
            files = {}
            quants = ("MXFP4_MOE", "BF16") if cfg.arch == "gpt-oss" else QUANTS
            for quant in quants:
                path = root / f"{name}-{quant}.gguf"
                write_header_only(path, cfg.architecture, quant, name=name)
                files[path.name] = path
            hub.add_repo(f"local/{name}-GGUF", files, unhashed=True)
            print(f"serving local/{name}-GGUF: {', '.join(quants)}", flush=True)
        print(f"export HF_ENDPOINT={hub.hf_endpoint} NO_PROXY=127.0.0.1,localhost", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    raise SystemExit(main())
