#!/usr/bin/env python3
"""A Hugging Face-compatible hub on 127.0.0.1, to try quantpick with no network.

    python scripts/local_hub.py [--config llama-3.1-8b ...] [--tiny] [--port 0]

--config NAME (repeatable; default llama-3.1-8b without --tiny) serves a real model config
(tests/arch_configs.py: the `<arch>.*` keys the real GGUFs carry) as `local/<config>-GGUF`, its
quants (Q4_K_M, Q8_0, BF16; MXFP4_MOE for gpt-oss) full-size sparse files: the headers are real,
the weights a hole, so `pick OWNER/REPO` and its llama.cpp dry run work and a download does not
(the advertised hashes are stand-ins).

--tiny serves `org/Tiny-GGUF`: a tiny, loadable qwen35moe model with random weights
(tests/tiny_model.py, 16 MiB) and its SHA256SUMS, real hashes: the README's `manifest add`,
`get`, `serve` and `chat` session replays against it with llama.cpp's tools on PATH.

--port PORT is the hub's port (0, the default: any free one); the files' CDN takes another free
one. The script prints the environment to point quantpick at the hub and serves until
interrupted; the files it wrote (a temporary directory) are removed when it stops. This is the
hub the tests use (tests/fakehub.py).
"""

from __future__ import annotations

import argparse
import hashlib
import signal
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from arch_configs import BY_NAME  # noqa: E402
from arch_fixtures import write_header_only  # noqa: E402
from fakehub import FakeHub  # noqa: E402
from tiny_model import write_tiny_model  # noqa: E402

QUANTS = ("Q4_K_M", "Q8_0", "BF16")
TINY_REPO = "org/Tiny-GGUF"
TINY_FILE = "Tiny-Qwen35MoE-Q8_0.gguf"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", action="append", choices=sorted(BY_NAME), default=None,
                    help="a real model config to serve header-only (repeatable)")  # fmt: skip
    ap.add_argument("--tiny", action="store_true",
                    help=f"serve {TINY_REPO}: a tiny model llama.cpp loads")  # fmt: skip
    ap.add_argument("--port", type=int, default=0, help="the hub's port (0: any free one)")
    args = ap.parse_args(argv)
    if not 0 <= args.port <= 65535:
        ap.error(f"--port {args.port}: give 0 (any free port) to 65535")
    return args


def populate(hub: FakeHub, root: Path, configs: list[str], tiny: bool) -> list[str]:
    """Add the repositories; returns one line per repository served."""
    lines = []
    for name in configs:
        cfg = BY_NAME[name]
        files = {}
        quants = ("MXFP4_MOE", "BF16") if cfg.arch == "gpt-oss" else QUANTS
        for quant in quants:
            path = root / f"{name}-{quant}.gguf"
            write_header_only(path, cfg.architecture, quant, name=name)
            files[path.name] = path
        hub.add_repo(f"local/{name}-GGUF", files, unhashed=True)
        lines.append(f"serving local/{name}-GGUF: {', '.join(quants)}")
    if tiny:
        model = root / TINY_FILE
        write_tiny_model(model)
        sums = root / "SHA256SUMS"
        sums.write_text(f"{hashlib.sha256(model.read_bytes()).hexdigest()}  {TINY_FILE}\n")
        hub.add_repo(TINY_REPO, {TINY_FILE: model, "SHA256SUMS": sums})
        lines.append(f"serving {TINY_REPO}: {TINY_FILE} (loadable), SHA256SUMS")
    return lines


def main(argv: list[str] | None = None, *, ready: threading.Event | None = None,
         stop: threading.Event | None = None) -> int:  # fmt: skip
    """Serve until SIGINT/SIGTERM (or `stop`, for tests); `ready` is set once it serves."""
    args = parse_args(argv)
    configs = args.config or ([] if args.tiny else ["llama-3.1-8b"])
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    with tempfile.TemporaryDirectory(prefix="quantpick-local-hub-") as tmp:
        root = Path(tmp)
        with FakeHub(root / "hub", port=args.port) as hub:
            for line in populate(hub, root, configs, args.tiny):
                print(line, flush=True)
            print(f"export HF_ENDPOINT={hub.hf_endpoint} NO_PROXY=127.0.0.1,localhost", flush=True)
            if ready is not None:
                ready.set()
            stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
