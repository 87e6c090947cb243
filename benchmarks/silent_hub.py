"""`get` with a verified file already on disk, and `pick`, against a hub that accepts connections
and never answers (tests/fakehub.py SilentServer), with quantpick's real default retry policy.

    python benchmarks/silent_hub.py [--only get|pick]

Each command runs as a subprocess (`python -m quantpick ...`, a described machine, `get` with
--no-confirm), timed from start to exit, with its own QUANTPICK_HOME. For `get`, the quant's file
and the SHA256SUMS an earlier `get` leaves beside it are already in --dir (nothing to download);
a second round repeats it with the sha256 cache that the first round filled. For `pick`, no
header is cached. Reference: the same commands with --offline, which never contact a hub.
"conn" counts the connections the silent hub accepted during the command.

Measured before issue 21's fix (2-core shared machine): get 227.8 s and 221.0 s (8 connections
each), pick 22.2 s (2); --offline 1.4 s and 2.7 s.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakehub import SMALL_ARCH_TOML, SilentServer  # noqa: E402
from gguf_fixtures import TINY, write_gguf  # noqa: E402

NAME = "Tiny-Q8_0.gguf"
MACHINE = ["--gpu", "3090", "--ram", "64G", "-c", "4096"]


def manifest_toml(size: int) -> str:
    return (
        'schema = 1\nid = "tiny-hf"\ndisplay_name = "Tiny"\nchecksums_file = "SHA256SUMS"\n'
        + SMALL_ARCH_TOML
        + '\n[[sources]]\nkind = "hf"\nrepo = "org/tiny"\n\n'
        + f'[[files]]\nname = "{NAME}"\nquant = "Q8_0"\n'
        + f"size_bytes = {size}\nsize_exact = true\nquality_rank = 1\n"
    )


def timed(args: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "quantpick", *args], env=env, capture_output=True, text=True
    )
    return time.perf_counter() - start, done.returncode, done.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("get", "pick"), default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="quantpick-silent-bench-"))
    try:
        dest = work / "models"
        dest.mkdir()
        size = write_gguf(dest / NAME, TINY, big="Q8_0", data="random")
        digest = hashlib.sha256((dest / NAME).read_bytes()).hexdigest()
        (dest / "SHA256SUMS").write_text(f"{digest}  {NAME}\n")
        (work / "manifests").mkdir()
        (work / "manifests" / "tiny-hf.toml").write_text(manifest_toml(size))
        with SilentServer() as silent:
            env = dict(os.environ)
            env.update(
                HF_ENDPOINT=silent.url,
                HF_HUB_DISABLE_TELEMETRY="1",
                HF_HOME=str(work / "hf-home"),
                HOME=str(work / "home"),
                QUANTPICK_MANIFESTS=str(work / "manifests"),
                NO_PROXY="127.0.0.1,localhost",
                PYTHONPATH=str(ROOT),
            )
            for name in ("HF_HUB_OFFLINE", "QUANTPICK_OFFLINE", "HF_HUB_DOWNLOAD_TIMEOUT"):
                env.pop(name, None)
            rows: list[tuple[str, float, int, str]] = []
            if args.only in (None, "get"):
                env["QUANTPICK_HOME"] = str(work / "qp-get")
                get = ["get", "tiny-hf", *MACHINE, "--no-confirm", "--dir", str(dest)]
                for label, extra in (
                    ("get, first", []),
                    ("get, sha256 cached", []),
                    ("get --offline", ["--offline"]),
                ):
                    before = silent.connections
                    seconds, code, err = timed([*get, *extra], env)
                    rows.append((label, seconds, code, f"{silent.connections - before} conn"))
                    if code != 0:
                        print(err, file=sys.stderr)
            if args.only in (None, "pick"):
                for label, extra in (("pick", []), ("pick --offline", ["--offline"])):
                    env["QUANTPICK_HOME"] = str(work / f"qp-{label.replace(' ', '')}")
                    before = silent.connections
                    seconds, code, err = timed(["pick", "tiny-hf", *MACHINE, *extra], env)
                    rows.append((label, seconds, code, f"{silent.connections - before} conn"))
                    if code != 0:
                        print(err, file=sys.stderr)
        print("silent hub (accepts, never answers), default retry policy:")
        for label, seconds, code, conns in rows:
            print(f"  {label:<20} {seconds:7.2f} s  exit {code}  {conns}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
