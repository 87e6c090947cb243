"""`pick OWNER/REPO` on a 25-file repository with no manifest: every quant's header read from the
local fake hub (tests/fakehub.py), cold and then from the cache, at 4 readers (quantpick's
HEADER_READERS) beside 1 reader (one header after another) in the same run.

    python benchmarks/repo_headers.py [--rate 20e6] [--files 25]

The repository is shaped like a real one (unsloth/bartowski Qwen3.6-35B-A3B): 24 single-file
quants from Q2_K to Q8_0 (UD- variants included) and a BF16 split in 2 parts, each with a full
248,320-token vocabulary in its header (~11 MB, as the real files carry), plus an mmproj and an
imatrix that are set aside. `--rate` caps each CDN connection (bytes/s; the public CDN gives a
single stream roughly 10-40 MB/s; 0 = loopback speed). Each command is a subprocess
(`python -m quantpick pick ... --json`, a described machine) with its own QUANTPICK_HOME, timed
from start to exit; "reads" counts the GGUF byte requests the hub served during the command.

Measured (2-core shared machine, 20 MB/s per connection, 266 MB of headers): cold 11.8 s with 4
readers against 28.6 s one at a time, 102 range reads either way (about 4 per file: hub redirect,
then a growing window on the CDN); from the cache 2.0 s (no request), --offline 1.2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakehub import FakeHub  # noqa: E402
from gguf_fixtures import FULL, write_gguf, write_split  # noqa: E402

REPO = "org/Big-MoE-GGUF"
# (file-name tag, the type of its big tensors): what each real quant's header holds, near enough
QUANTS = [
    ("Q2_K", "Q2_K"), ("UD-Q2_K_XL", "Q2_K"), ("Q3_K_S", "Q3_K"), ("Q3_K_M", "Q3_K"),
    ("UD-Q3_K_XL", "Q3_K"), ("IQ2_XXS", "IQ2_XXS"), ("IQ2_M", "IQ2_S"), ("IQ3_XXS", "IQ3_XXS"),
    ("IQ3_S", "IQ3_S"), ("IQ4_XS", "IQ4_XS"), ("IQ4_NL", "IQ4_NL"), ("Q4_0", "Q4_0"),
    ("Q4_1", "Q4_1"), ("Q4_K_S", "Q4_K"), ("Q4_K_M", "Q4_K"), ("UD-Q4_K_XL", "Q4_K"),
    ("Q5_0", "Q5_0"), ("Q5_1", "Q5_1"), ("Q5_K_S", "Q5_K"), ("Q5_K_M", "Q5_K"),
    ("UD-Q5_K_XL", "Q5_K"), ("Q6_K", "Q6_K"), ("UD-Q6_K_XL", "Q6_K"), ("Q8_0", "Q8_0"),
]  # fmt: skip
MACHINE = ["--gpu", "3090", "--gpu", "t4", "--ram", "64G", "--cores", "8", "-c", "65536"]
PICK = (
    "import sys, quantpick.model.from_repo as r; r.HEADER_READERS = int(sys.argv[1]); "
    "from quantpick.cli import app; app(sys.argv[2:])"
)


def build_repo(root: Path, n_files: int) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for tag, big in QUANTS[: max(0, n_files - 1)]:
        path = root / f"Big-MoE-{tag}.gguf"
        write_gguf(path, FULL, big=big)  # sparse: full apparent size, the header on disk
        files[path.name] = path
    split_dir = root / "BF16"
    split_dir.mkdir()
    for part in write_split(split_dir, "Big-MoE-BF16", 2, FULL, big="BF16"):
        files[f"BF16/{part.name}"] = part
    (root / "mmproj-F16.gguf").write_bytes(b"GGUF" + bytes(4096))
    (root / "imatrix.gguf_file").write_bytes(bytes(4096))
    files["mmproj-F16.gguf"] = root / "mmproj-F16.gguf"
    files["imatrix.gguf_file"] = root / "imatrix.gguf_file"
    return files


def run_pick(
    readers: int, home: Path, env: dict[str, str], extra: list[str]
) -> tuple[float, int, str, str]:
    env = dict(env, QUANTPICK_HOME=str(home))
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", PICK, str(readers), "pick", REPO, *MACHINE, "--json", *extra],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    return time.perf_counter() - start, done.returncode, done.stdout, done.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=20e6, help="bytes/s per CDN connection; 0: none")
    ap.add_argument("--files", type=int, default=25, help="quants in the repository (2-25)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="quantpick-repo-bench-"))
    try:
        (work / "repo").mkdir()
        files = build_repo(work / "repo", args.files)
        header_mb = sum(min(p.stat().st_blocks * 512, p.stat().st_size) for p in files.values())
        with FakeHub(work / "hub") as hub:
            hub.add_repo(REPO, files, unhashed=True)  # nothing is downloaded
            hub.per_connection_rate = args.rate or None
            env = dict(os.environ)
            env.update(
                HF_ENDPOINT=hub.hf_endpoint, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1",
                HF_HOME=str(work / "hf-home"), HOME=str(work / "home"),
                NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(ROOT),
            )  # fmt: skip
            for name in ("HF_HUB_OFFLINE", "QUANTPICK_OFFLINE"):
                env.pop(name, None)
            rows = []
            for readers in (4, 1):
                home = work / f"qp-{readers}"
                for label, extra in (("cold", []), ("cached", []), ("--offline", ["--offline"])):
                    before = len(hub.requests)
                    seconds, code, out, err = run_pick(readers, home, env, extra)
                    reads = [
                        r for r in hub.requests[before:] if str(r.get("file", "")).endswith(".gguf")
                    ]
                    doc = json.loads(out) if code == 0 else {"candidates": []}
                    quants = len({c["quant"] for c in doc["candidates"]})
                    rows.append((readers, label, seconds, code, len(reads), quants))
                    if code != 0:
                        print(err, file=sys.stderr)
        print(
            f"pick {REPO}: {len(files)} files ({args.files} quants, one split in 2), "
            f"{header_mb / 1e6:.0f} MB of headers, "
            + (f"{args.rate / 1e6:.0f} MB/s per CDN connection" if args.rate else "loopback")
        )
        print(f"  {'readers':>7}  {'run':<10} {'seconds':>8}  exit  reads  quants planned")
        for readers, label, seconds, code, reads, quants in rows:
            print(f"  {readers:>7}  {label:<10} {seconds:8.2f}  {code:>4}  {reads:>5}  {quants:>6}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
