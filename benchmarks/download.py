"""Download + verification throughput on loopback, against tests/fakehub.py.

    python benchmarks/download.py [--rounds 3] [--size-mib 1024] [--methods a,b]

Methods, interleaved round-robin (one round = each method once), each client in a fresh
subprocess timed around the transfer only (imports excluded), output deleted and `sync` run
between runs outside the timing:
  * quantpick   - quantpick.fetch.transfer.download_file: hub 302 -> CDN, sha256 while downloading,
                  verified, fsync of the data, atomic rename, fsync of the directory (durable).
  * quantpick-nofsync - the same with durable=False: the two rows side by side are the cost of
                  durability (the data must reach the disk before the rename, not after).
  * curl        - `curl -s -o FILE` on the CDN URL (bare download, no verification).
  * curl+hash   - the same followed by hashlib sha256 of the file.
  * hf_hub      - huggingface_hub.hf_hub_download(local_dir=...) (size check only).
Then `quantpick verify` (verify_files, threads) vs `sha256sum -c` on 1 and 4 files (4 hard links
of the same file, page-cached). Goal: quantpick <= 1.1 x curl.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakehub import FakeHub  # noqa: E402

PY = sys.executable
NAME = "model.gguf"

QUANTPICK = r"""
import json, sys, time
from pathlib import Path
from quantpick.fetch.transfer import download_file
from quantpick.fetch.sources import RemoteFile
url, dest, size, sha = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
durable = sys.argv[5] == "1"
remote = RemoteFile("model.gguf", size, sha, url, "hf", None)
t = time.perf_counter()
result = download_file(remote, dest, headers_for=lambda u: {"User-Agent": "bench"}, durable=durable)
elapsed = time.perf_counter() - t
assert result.verified and result.sha256 == sha
print(json.dumps({"seconds": elapsed}))
"""

HF_HUB = r"""
import json, sys, time
from huggingface_hub import hf_hub_download
endpoint, repo, out = sys.argv[1], sys.argv[2], sys.argv[3]
t = time.perf_counter()
hf_hub_download(repo, "model.gguf", local_dir=out, endpoint=endpoint)
print(json.dumps({"seconds": time.perf_counter() - t}))
"""


def make_file(path: Path, size: int) -> None:
    """Real random bytes (no sparse file), GGUF magic first."""
    with open(path, "wb") as handle:
        handle.write(b"GGUF" + os.urandom(1024 * 1024 - 4))
        left = size - 1024 * 1024
        while left > 0:
            n = min(left, 16 * 1024 * 1024)
            handle.write(os.urandom(n))
            left -= n


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(1024 * 1024)
    with open(path, "rb", buffering=0) as handle:
        while n := handle.readinto(buffer):
            digest.update(memoryview(buffer)[:n])
    return digest.hexdigest()


def clean(*paths: Path) -> None:
    for path in paths:
        if path.is_dir():
            subprocess.run(["rm", "-rf", str(path)], check=True)
        elif path.exists():
            path.unlink()
    os.sync()


def child_seconds(argv: list[str], env: dict[str, str]) -> float:
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument(
        "--methods",
        default="quantpick,quantpick-nofsync,curl,curl+hash,hf_hub",
        help="comma-separated subset of the methods, in this order",
    )
    parser.add_argument("--skip-verify", action="store_true", help="downloads only")
    parser.add_argument(
        "--rate-mbps",
        type=float,
        default=None,
        help="throttle the server to this many MB/s (a real link instead of loopback)",
    )
    args = parser.parse_args()
    size = args.size_mib * 1024 * 1024

    work = Path(tempfile.mkdtemp(prefix="quantpick-bench-"))
    source = work / "source.gguf"
    print(f"creating {args.size_mib} MiB of random bytes in {work} ...", flush=True)
    make_file(source, size)
    hub = FakeHub(work / "hub").start()
    try:
        repo = hub.add_repo("bench/model", {NAME: source})
        if args.rate_mbps:
            hub.faults.add(NAME, "throttle", rate=args.rate_mbps * 1e6, times=None)
        sha = repo.files[NAME].sha256
        resolve = f"{hub.hf_endpoint}/bench/model/resolve/{repo.commit}/{NAME}"
        cdn = f"{hub.cdn_url}/lfs/{sha}?name={NAME}&repo=bench/model"
        env = dict(
            os.environ,
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_XET="1",
            HF_HOME=str(work / "hf-home"),
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            NO_PROXY="127.0.0.1",
        )
        out = work / "out"
        out.mkdir()
        target = out / NAME

        def quantpick() -> float:
            argv = [PY, "-c", QUANTPICK, resolve, str(target), str(size), sha, "1"]
            return child_seconds(argv, env)

        def quantpick_nofsync() -> float:
            argv = [PY, "-c", QUANTPICK, resolve, str(target), str(size), sha, "0"]
            return child_seconds(argv, env)

        def curl() -> float:
            t = time.perf_counter()
            subprocess.run(["curl", "-s", "-o", str(target), cdn], check=True)
            return time.perf_counter() - t

        def curl_hash() -> float:
            t = time.perf_counter()
            subprocess.run(["curl", "-s", "-o", str(target), cdn], check=True)
            assert sha256_of(target) == sha
            return time.perf_counter() - t

        def hf_hub() -> float:
            return child_seconds([PY, "-c", HF_HUB, hub.hf_endpoint, "bench/model", str(out)], env)

        every = {
            "quantpick": quantpick,
            "quantpick-nofsync": quantpick_nofsync,
            "curl": curl,
            "curl+hash": curl_hash,
            "hf_hub": hf_hub,
        }
        methods = {m: every[m] for m in args.methods.split(",")}
        times: dict[str, list[float]] = {m: [] for m in methods}
        for round_no in range(args.rounds):
            for label, method in methods.items():
                clean(target, out / ".cache", out / f".{NAME}.lock")
                seconds = method()
                times[label].append(seconds)
                print(
                    f"round {round_no + 1} {label:17s} {seconds:6.2f} s  "
                    f"{size / seconds / 2**20:6.0f} MiB/s",
                    flush=True,
                )
        clean(target, out / ".cache")

        print(f"\ndownload of {args.size_mib} MiB, median of {args.rounds} (interleaved):")
        base_label = "curl" if "curl" in times else next(iter(times))
        base = statistics.median(times[base_label])
        for label, values in times.items():
            med = statistics.median(values)
            print(
                f"  {label:17s} {med:6.2f} s  {size / med / 2**20:6.0f} MiB/s  "
                f"{med / base:4.2f}x {base_label}  (min {min(values):.2f}, max {max(values):.2f})"
            )
        if "quantpick" in times and "quantpick-nofsync" in times:
            paired = [
                a - b for a, b in zip(times["quantpick"], times["quantpick-nofsync"], strict=True)
            ]
            print(
                f"  cost of fsync (same round, durable - not): median "
                f"{statistics.median(paired):+.2f} s, per round "
                + ", ".join(f"{d:+.2f}" for d in paired)
            )
        if args.skip_verify:
            return

        # Verification: 1 file and 4 hard links of it (page-cached after the first pass).
        vdir = work / "verify"
        vdir.mkdir()
        names = [f"f{i}.gguf" for i in range(4)]
        for name in names:
            os.link(source, vdir / name)
        sha256_of(source)  # warm the page cache
        print("\nverify (page-cached), median of", args.rounds)
        for count in (1, 4):
            sums = "".join(f"{sha}  {n}\n" for n in names[:count])
            (vdir / "SHA256SUMS").write_text(sums)
            qp, coreutils = [], []
            for _ in range(args.rounds):
                t = time.perf_counter()
                subprocess.run(
                    [
                        PY,
                        "-c",
                        "import sys; from quantpick.fetch.verify import verify_files, "
                        "parse_sha256sums; from pathlib import Path; d=Path(sys.argv[1]); "
                        "r=verify_files(d, parse_sha256sums((d/'SHA256SUMS').read_text())); "
                        "sys.exit(0 if r.ok else 4)",
                        str(vdir),
                    ],
                    check=True,
                )
                qp.append(time.perf_counter() - t)
                t = time.perf_counter()
                subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=vdir, check=True)
                coreutils.append(time.perf_counter() - t)
            q, c = statistics.median(qp), statistics.median(coreutils)
            total = count * size / 2**20
            print(
                f"  {count} file(s): quantpick verify {q:5.2f} s ({total / q:5.0f} MiB/s), "
                f"sha256sum -c {c:5.2f} s ({total / c:5.0f} MiB/s), ratio {q / c:4.2f}"
            )
    finally:
        hub.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
