"""Download + verification throughput against tests/fakehub.py, on two local hubs in one run.

    python benchmarks/download.py [--rounds 3] [--capped-mib 256] [--per-connection-mbps 20]
                                  [--loopback-mib 512] [--hubs capped,loopback] [--verify]

Hubs:
  * capped   - the fake CDN caps every connection at --per-connection-mbps (a token bucket per
               connection, as a CDN edge caps one TCP stream: published Hugging Face figures run
               from 8.7 to ~60 MB/s per connection, see ../shared/notes/serving-ecosystem.md).
  * loopback - no cap: as fast as sendfile and the client's CPU go.
Methods, interleaved round-robin (one round = each method once), each client in a fresh
subprocess timed around the transfer only (imports excluded), output deleted and `sync` run
between runs outside the timing:
  * quantpick         - quantpick.fetch.transfer.download_file, default SegmentPolicy (adaptive
                        connections): hub 302 -> CDN, sha256 while downloading, verified, fsync of
                        the data, atomic rename, fsync of the directory.
  * quantpick-single  - the same over one connection (--connections 1).
  * quantpick-nofsync - segmented, durable=False (the cost of durability, paired per round).
  * quantpick-single-nofsync - one connection, durable=False.
  * curl              - `curl -s -o FILE` on the CDN URL (one connection, no verification).
  * curl+sync         - the same, then fsync of the file and its directory (timed).
  * hf_hub            - huggingface_hub.hf_hub_download(local_dir=...) (size check only).
Peak RSS is each client process's own (wait4's ru_maxrss).
Goals (issue 23): capped, quantpick-single / quantpick >= 4x; loopback, quantpick <= 1.1x
curl+sync. With --verify: `quantpick verify` vs `sha256sum -c` on 1 and 4 page-cached files.
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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakehub import FakeHub  # noqa: E402

PY = sys.executable
NAME = "model.gguf"

QUANTPICK = r"""
import json, resource, sys, time
from pathlib import Path
from quantpick.fetch.transfer import download_file
from quantpick.fetch.segments import SINGLE_STREAM, SegmentPolicy
from quantpick.hub.base import RemoteFile
url, dest, size, sha = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
durable, single = sys.argv[5] == "1", sys.argv[6] == "1"
remote = RemoteFile("model.gguf", size, sha, url, "hf", None)
t = time.perf_counter()
result = download_file(
    remote, dest, headers_for=lambda u: {"User-Agent": "bench"}, durable=durable,
    segments=SINGLE_STREAM if single else SegmentPolicy(),
)
elapsed = time.perf_counter() - t
assert result.verified and result.sha256 == sha
print(json.dumps({"seconds": elapsed, "connections": result.connections}))
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


@dataclass
class Run:
    seconds: float
    rss_mib: float  # peak resident set of the client process (VmHWM)
    connections: int | None = None


def _peak_rss(pid: int, peak: list[int]) -> None:
    """Poll /proc/<pid>/status for VmHWM (its own high-water mark: wait4's ru_maxrss would carry
    this process's, inherited through vfork) until the process is gone."""
    path = f"/proc/{pid}/status"
    while True:
        try:
            with open(path) as handle:
                text = handle.read()
        except OSError:
            return
        line = next((ln for ln in text.splitlines() if ln.startswith("VmHWM:")), None)
        if line is None:  # a zombie: its memory is gone
            return
        peak[0] = max(peak[0], int(line.split()[1]))
        time.sleep(0.02)


def spawn(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Run a command: (seconds around it, peak RSS MiB, stdout)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err)
        peak = [0]
        watcher = threading.Thread(target=_peak_rss, args=(proc.pid, peak), daemon=True)
        watcher.start()
        code = proc.wait()
        elapsed = time.perf_counter() - t
        watcher.join()
        out.seek(0)
        err.seek(0)
        if code != 0:
            raise SystemExit(f"{argv[:3]} failed ({code}): {err.read().decode()[-2000:]}")
        return elapsed, peak[0] / 1024, out.read().decode()


def run_child(argv: list[str], env: dict[str, str]) -> Run:
    """Run a Python client; its own JSON line gives the seconds (imports excluded)."""
    _, rss, out = spawn(argv, env)
    doc = json.loads(out.strip().splitlines()[-1])
    return Run(float(doc["seconds"]), rss, doc.get("connections"))


def fsync_file_and_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@dataclass
class HubResult:
    label: str
    size: int
    runs: dict[str, list[Run]] = field(default_factory=dict)

    def median(self, method: str) -> float:
        return statistics.median(r.seconds for r in self.runs[method])


def bench_hub(
    work: Path, label: str, size_mib: int, rate: float | None, methods: list[str], rounds: int
) -> HubResult:
    size = size_mib * 1024 * 1024
    root = work / label
    root.mkdir()
    source = root / "source.gguf"
    print(f"[{label}] creating {size_mib} MiB of random bytes ...", flush=True)
    make_file(source, size)
    hub = FakeHub(root / "hub").start()
    try:
        hub.per_connection_rate = rate
        repo = hub.add_repo("bench/model", {NAME: source})
        sha = repo.files[NAME].sha256
        resolve = f"{hub.hf_endpoint}/bench/model/resolve/{repo.commit}/{NAME}"
        cdn = f"{hub.cdn_url}/lfs/{sha}?name={NAME}&repo=bench/model"
        env = dict(
            os.environ,
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_XET="1",
            HF_HOME=str(root / "hf-home"),
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            NO_PROXY="127.0.0.1",
        )
        out = root / "out"
        out.mkdir()
        target = out / NAME

        def quantpick(durable: bool, single: bool) -> Callable[[], Run]:
            flags = ["1" if durable else "0", "1" if single else "0"]
            argv = [PY, "-c", QUANTPICK, resolve, str(target), str(size), sha, *flags]
            return lambda: run_child(argv, env)

        def curl(sync: bool) -> Callable[[], Run]:
            def go() -> Run:
                t = time.perf_counter()
                _, rss, _ = spawn(["curl", "-s", "-o", str(target), cdn])
                if sync:
                    fsync_file_and_dir(target)
                return Run(time.perf_counter() - t, rss, 1)

            return go

        def hf_hub() -> Run:
            run = run_child([PY, "-c", HF_HUB, hub.hf_endpoint, "bench/model", str(out)], env)
            run.connections = 1  # http_get: one stream per file (hf_xet is off: HF_HUB_DISABLE_XET)
            return run

        every: dict[str, Callable[[], Run]] = {
            "quantpick": quantpick(True, False),
            "quantpick-single": quantpick(True, True),
            "quantpick-nofsync": quantpick(False, False),
            "quantpick-single-nofsync": quantpick(False, True),
            "curl": curl(False),
            "curl+sync": curl(True),
            "hf_hub": hf_hub,
        }
        result = HubResult(label, size, {m: [] for m in methods})
        for round_no in range(rounds):
            for method in methods:
                clean(target, out / ".cache", out / f".{NAME}.lock")
                run = every[method]()
                result.runs[method].append(run)
                conns = f"  {run.connections} conn" if run.connections else ""
                print(
                    f"[{label}] round {round_no + 1} {method:24s} {run.seconds:6.2f} s  "
                    f"{size / run.seconds / 2**20:6.0f} MiB/s{conns}",
                    flush=True,
                )
        clean(target, out / ".cache")
        return result
    finally:
        hub.stop()


def report(result: HubResult, reference: str) -> None:
    if reference not in result.runs:
        reference = next(iter(result.runs))
    size = result.size
    base = result.median(reference)
    print(f"\n{result.label}: {size // 2**20} MiB, median of {len(result.runs[reference])}")
    for method, runs in result.runs.items():
        med = result.median(method)
        rss = max(r.rss_mib for r in runs)
        conns = {r.connections for r in runs if r.connections}
        used = (
            f"{min(conns)}-{max(conns)}"
            if len(conns) > 1
            else (f"{next(iter(conns))}" if conns else "?")
        )
        print(
            f"  {method:24s} {med:6.2f} s {size / med / 2**20:6.0f} MiB/s  "
            f"{med / base:5.2f}x {reference:16s} conn {used:5s} peak RSS {rss:5.0f} MiB"
        )


def ceiling_line(result: HubResult, cap: float) -> str:
    """The capped hub's figure against its ceiling: the most the default policy's connections
    carry when the server holds each to `cap` bytes/s (SegmentPolicy.capped_max_connections x
    cap; this loopback link has room for more). Whole file (ramp-up included) and the rate of
    the connections reached; the goal (issue 30): >= 90 %."""
    from quantpick.fetch.segments import SegmentPolicy

    policy = SegmentPolicy()
    ceiling = policy.capped_max_connections * cap
    runs = result.runs["quantpick"]
    whole = result.size / result.median("quantpick")
    reached = max(r.connections or 0 for r in runs)
    steady = min(reached * cap, ceiling)
    verdict = "met" if steady >= 0.9 * ceiling else "NOT met"
    return (
        f"capped at {cap / 1e6:g} MB/s per connection: quantpick reached {reached} connections "
        f"(past the {policy.max_connections} of an uncapped link), {steady / 1e6:.0f} MB/s = "
        f"{100 * steady / ceiling:.0f}% of the ceiling {ceiling / 1e6:.0f} MB/s "
        f"({policy.capped_max_connections} x {cap / 1e6:g} MB/s; goal >= 90%: {verdict}); "
        f"over the whole {result.size // 2**20} MiB file, ramp-up included: "
        f"{whole / 1e6:.0f} MB/s = {100 * whole / ceiling:.0f}%"
    )


def verify_bench(work: Path, size_mib: int, rounds: int) -> None:
    size = size_mib * 1024 * 1024
    vdir = work / "verify"
    vdir.mkdir()
    source = vdir / "source.gguf"
    make_file(source, size)
    sha = sha256_of(source)  # also warms the page cache
    names = [f"f{i}.gguf" for i in range(4)]
    for name in names:
        os.link(source, vdir / name)
    print("\nverify (page-cached), median of", rounds)
    for count in (1, 4):
        sums = "".join(f"{sha}  {n}\n" for n in names[:count])
        (vdir / "SHA256SUMS").write_text(sums)
        qp, coreutils = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            subprocess.run(
                [
                    PY,
                    "-c",
                    "import sys; from quantpick.hub.verify import verify_files, "
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hubs", default="capped,loopback")
    parser.add_argument("--capped-mib", type=int, default=256)
    parser.add_argument("--per-connection-mbps", type=float, default=20.0, help="MB/s (1e6 B/s)")
    parser.add_argument("--loopback-mib", type=int, default=512)
    parser.add_argument("--capped-methods", default="quantpick,quantpick-single,curl,hf_hub")
    parser.add_argument(
        "--loopback-methods",
        default="quantpick,quantpick-single,quantpick-nofsync,curl,curl+sync,hf_hub",
    )
    parser.add_argument("--verify", action="store_true", help="also time quantpick verify")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="quantpick-bench-"))
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, load average {load:.2f}; work dir {work}", flush=True)
    try:
        hubs = args.hubs.split(",")
        results: dict[str, HubResult] = {}
        if "capped" in hubs:
            results["capped"] = bench_hub(
                work,
                "capped",
                args.capped_mib,
                args.per_connection_mbps * 1e6,
                args.capped_methods.split(","),
                args.rounds,
            )
        if "loopback" in hubs:
            results["loopback"] = bench_hub(
                work, "loopback", args.loopback_mib, None, args.loopback_methods.split(","),
                args.rounds,
            )  # fmt: skip
        goals = []
        if "capped" in results:
            r = results["capped"]
            report(r, "quantpick-single")
            if {"quantpick", "quantpick-single"} <= set(r.runs):
                speedup = r.median("quantpick-single") / r.median("quantpick")
                verdict = "met" if speedup >= 4 else "NOT met"
                goals.append(
                    f"capped at {args.per_connection_mbps:g} MB/s per connection: segmented is "
                    f"{speedup:.2f}x faster than one stream (goal >= 4x: {verdict})"
                )
        if "capped" in results and "quantpick" in results["capped"].runs:
            goals.append(ceiling_line(results["capped"], args.per_connection_mbps * 1e6))
        if "loopback" in results:
            r = results["loopback"]
            report(r, "curl+sync" if "curl+sync" in r.runs else "quantpick")
            if {"quantpick", "curl+sync"} <= set(r.runs):
                ratio = r.median("quantpick") / r.median("curl+sync")
                verdict = "met" if ratio <= 1.1 else "NOT met"
                goals.append(
                    f"uncapped loopback: segmented takes {ratio:.2f}x the time of curl + sync "
                    f"(goal <= 1.1x: {verdict})"
                )
            for durable, light in (
                ("quantpick", "quantpick-nofsync"),
                ("quantpick-single", "quantpick-single-nofsync"),
            ):
                if {durable, light} <= set(r.runs):
                    paired = [
                        a.seconds - b.seconds
                        for a, b in zip(r.runs[durable], r.runs[light], strict=True)
                    ]
                    print(
                        f"  cost of fsync, {durable} (same round, durable - not): median "
                        f"{statistics.median(paired):+.2f} s, per round "
                        + ", ".join(f"{d:+.2f}" for d in paired)
                    )
        print()
        for line in goals:
            print("goal:", line)
        if args.verify:
            verify_bench(work, args.loopback_mib, args.rounds)
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
