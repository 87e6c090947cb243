"""kill -9 at random moments of a segmented download, each followed by a resume.

    python benchmarks/kill_resume.py [--kills 20] [--size-mib 128] [--per-connection-mbps 20]

A local hub (tests/fakehub.py) caps each connection like a CDN edge; the client is
quantpick.fetch.transfer.download_file with the default SegmentPolicy, in a subprocess. Each
trial starts a download into an empty directory, SIGKILLs it at a uniformly random moment of a
calibrated download's duration (a kill that comes after the process ended is drawn again), then
runs the download again to the end. Meanwhile a watcher polls the final name every few ms and
hashes every file it finds there (once per inode).

Pass: as many resumes as kills, each final file byte-exact (size and sha256), and no file at the
final name that was ever anything but the exact bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakehub import FakeHub  # noqa: E402

NAME = "model.gguf"
CHILD = r"""
import json, sys
from pathlib import Path
from quantpick.fetch.transfer import download_file
from quantpick.hub.base import RemoteFile
url, dest, size, sha = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
r = download_file(RemoteFile("model.gguf", size, sha, url, "hf", None), dest,
                  headers_for=lambda u: {"User-Agent": "kill-bench"})
print(json.dumps({"resumed_from": r.resumed_from, "fetched": r.bytes_fetched,
                  "connections": r.connections, "verified": r.verified}))
"""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class Watcher(threading.Thread):
    """Hashes every file that appears at the final name (once per inode and size)."""

    def __init__(self, path: Path, sha: str) -> None:
        super().__init__(daemon=True)
        self.path, self.sha = path, sha
        self.checked = 0
        self.bad: list[str] = []
        self.stop = threading.Event()
        self._seen: set[tuple[int, int, int]] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                st = self.path.stat()
            except FileNotFoundError:
                time.sleep(0.002)
                continue
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if key not in self._seen:
                self._seen.add(key)
                try:
                    digest = sha256_of(self.path)
                except FileNotFoundError:
                    continue
                self.checked += 1
                if digest != self.sha:
                    self.bad.append(f"{st.st_size} bytes, sha256 {digest[:16]}")
            time.sleep(0.002)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--per-connection-mbps", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    size = args.size_mib * 2**20
    work = Path(tempfile.mkdtemp(prefix="quantpick-kill-"))
    source = work / "source.gguf"
    with open(source, "wb") as handle:
        handle.write(b"GGUF")
        left = size - 4
        while left:
            n = min(left, 16 << 20)
            handle.write(os.urandom(n))
            left -= n
    hub = FakeHub(work / "hub").start()
    try:
        hub.per_connection_rate = args.per_connection_mbps * 1e6
        repo = hub.add_repo("bench/model", {NAME: source})
        sha = repo.files[NAME].sha256
        url = f"{hub.hf_endpoint}/bench/model/resolve/{repo.commit}/{NAME}"
        out = work / "out"
        out.mkdir()
        dest = out / NAME
        argv = [sys.executable, "-c", CHILD, url, str(dest), str(size), sha]
        env = dict(os.environ, NO_PROXY="127.0.0.1")

        def clean() -> None:
            for p in out.iterdir():
                p.unlink()

        t = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        duration = time.perf_counter() - t
        assert sha256_of(dest) == sha
        print(
            f"{args.size_mib} MiB at {args.per_connection_mbps:g} MB/s per connection: one "
            f"uninterrupted download takes {duration:.2f} s; kills drawn in [0, {duration:.2f}] s",
            flush=True,
        )
        watcher = Watcher(dest, sha)
        watcher.start()
        kills = resumes = exact = drawn_again = 0
        kept_fraction: list[float] = []
        while kills < args.kills:
            clean()
            when = rng.uniform(0, duration)
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            time.sleep(when)
            if proc.poll() is not None:
                drawn_again += 1  # it was done before the kill: not a kill
                proc.communicate()
                continue
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            kills += 1
            had = "final file" if dest.exists() else ("part" if (out / f"{NAME}.part").exists()
                                                      else "nothing")  # fmt: skip
            t = time.perf_counter()
            rerun = subprocess.run(argv, env=env, capture_output=True, text=True)
            took = time.perf_counter() - t
            if rerun.returncode != 0:
                print(f"kill {kills}: resume failed: {rerun.stderr.strip()[-500:]}", flush=True)
                continue
            resumes += 1
            doc = json.loads(rerun.stdout.strip().splitlines()[-1])
            ok = dest.stat().st_size == size and sha256_of(dest) == sha
            exact += ok
            kept = doc["resumed_from"] / size
            kept_fraction.append(kept)
            print(
                f"kill {kills:2d} at {when:5.2f} s ({had:10s}): resume kept "
                f"{doc['resumed_from'] / 2**20:6.1f} MiB ({kept:4.0%}), fetched "
                f"{doc['fetched'] / 2**20:6.1f} MiB over {doc['connections']:2d} conn in "
                f"{took:5.2f} s: {'byte-exact' if ok else 'WRONG'}",
                flush=True,
            )
        time.sleep(0.05)
        watcher.stop.set()
        watcher.join()
        kept_avg = sum(kept_fraction) / len(kept_fraction) if kept_fraction else 0
        print(
            f"\n{kills} kills, {resumes} resumes, {exact} byte-exact files, "
            f"{len(watcher.bad)} bad files ever at the final name ({watcher.checked} files "
            f"hashed there); resumes kept {kept_avg:.0%} of the file on average; "
            f"{drawn_again} kill times drawn again (the download had already ended)"
        )
        for bad in watcher.bad:
            print("  BAD at the final name:", bad)
        ok = kills == resumes == exact == args.kills and not watcher.bad
        print("PASS" if ok else "FAIL")
        sys.exit(0 if ok else 1)
    finally:
        hub.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
