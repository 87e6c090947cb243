"""`pick OWNER/REPO` on a hostile repository: one real quant and thousands of `.gguf` files whose
names carry no quant tag, each a ~3.5 MB header (a 100,000-token vocabulary) that quantpick would
read to name it by its general.file_type; a tenth of them cut short by the hub on every answer.
Time and peak memory of the command with quantpick's cap (from_repo.MAX_UNTAGGED_HEADERS, the
untagged files' two-attempt policy) beside the same command without them (every untagged file
read, a download's six attempts), in the same run, on the local fake hub (tests/fakehub.py).

    python benchmarks/hostile_repo.py [--files 3000] [--uncapped-files 300]

The uncapped run reads `--uncapped-files` of them (each costs memory and seconds; the issue that
asked for the cap measured 3,000 at 115 s and 11.7 GiB), so it is also shown scaled to `--files`
(linear: one header each). Each command is a subprocess (`python -m quantpick pick ... --json`,
a described machine) with its own QUANTPICK_HOME, its peak RSS from wait4(2).

Measured (2-core shared machine, loopback, the defaults; 4.1 MB headers, pauses cut to 0.2 s):

    run        files  seconds   peak RSS  reads  exit
    capped      3000      7.8     97 MiB     36     0
    uncapped     300    127.6    126 MiB    752     0
    uncapped, scaled to 3000 files: ~1276 s, ~7520 reads
"""

from __future__ import annotations

import argparse
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
from gguf_fixtures import TINY, write_gguf  # noqa: E402

REPO = "org/Hostile-GGUF"
MACHINE = ["--gpu", "3090", "--ram", "64G", "--cores", "8", "-c", "8192"]
# argv[1]: "capped" or "uncapped" (every untagged header, with a download's retries: as before)
PICK = (
    "import sys, time, quantpick.model.from_repo as r, quantpick.fetch.http as h\n"
    "if sys.argv[1] == 'uncapped':\n"
    "    r.MAX_UNTAGGED_HEADERS = 10**9; h.planning_policy = h.default_policy\n"
    "h.DEFAULT_POLICY = h.RetryPolicy(sleep=lambda s: time.sleep(min(s, 0.2)))\n"
    "from quantpick.cli import app; app(sys.argv[2:])"
)
# Pauses between retries are cut to 0.2 s in both runs (a real run waits 1, 2, 4, 8, 16 s): the
# difference shown is in requests and bytes, not in sleeping.


def run_pick(mode: str, home: Path, env: dict[str, str]) -> tuple[float, int, int, str]:
    env = dict(env, QUANTPICK_HOME=str(home))
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", PICK, mode, "pick", REPO, *MACHINE, "--json"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    return seconds, proc.returncode, usage.ru_maxrss * 1024, err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=3000, help="untagged .gguf files in the repo")
    ap.add_argument("--uncapped-files", type=int, default=300, help="for the run without a cap")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="quantpick-hostile-repo-"))
    try:
        (work / "repo").mkdir()
        real = work / "repo" / "Tiny-Q8_0.gguf"
        write_gguf(real, TINY, big="Q8_0")
        bait = work / "repo" / "bait.gguf"  # one file on disk, served under every name
        write_gguf(bait, dict(TINY, n_vocab=100_000), big="Q8_0")
        header_mb = min(bait.stat().st_blocks * 512, bait.stat().st_size) / 1e6  # on disk: header
        rows = []
        for mode, n in (("capped", args.files), ("uncapped", args.uncapped_files)):
            files = {real.name: real} | {f"part-{i:05d}.gguf": bait for i in range(n)}
            with FakeHub(work / f"hub-{mode}") as hub:
                hub.add_repo(REPO, files, unhashed=True)
                for i in range(0, n, 10):  # every tenth: cut short on every answer
                    hub.faults.add(f"part-{i:05d}.gguf", "short", after=4096, times=None)
                env = dict(os.environ)
                env.update(
                    HF_ENDPOINT=hub.hf_endpoint, HF_HUB_DISABLE_TELEMETRY="1",
                    HF_HUB_DISABLE_XET="1", HF_HOME=str(work / "hf-home"),
                    HOME=str(work / "home"), NO_PROXY="127.0.0.1,localhost",
                    PYTHONPATH=str(ROOT),
                )  # fmt: skip
                for name in ("HF_HUB_OFFLINE", "QUANTPICK_OFFLINE"):
                    env.pop(name, None)
                before = len(hub.requests)
                seconds, code, rss, err = run_pick(mode, work / f"qp-{mode}", env)
                reads = [
                    r for r in hub.requests[before:] if str(r.get("file", "")).endswith(".gguf")
                ]
                if code != 0:
                    print(err, file=sys.stderr)
                rows.append((mode, n, seconds, rss, len(reads), code))
        from quantpick.model.from_repo import MAX_UNTAGGED_HEADERS

        print(
            f"pick {REPO}: 1 tagged quant + N untagged .gguf files of {header_mb:.1f} MB "
            f"(every tenth cut short by the hub); cap MAX_UNTAGGED_HEADERS = {MAX_UNTAGGED_HEADERS}"
        )
        print(f"  {'run':<9} {'files':>6} {'seconds':>8} {'peak RSS':>10} {'reads':>6}  exit")
        for mode, n, seconds, rss, reads, code in rows:
            print(f"  {mode:<9} {n:>6} {seconds:8.1f} {rss / 2**20:7.0f} MiB {reads:>6}  {code:>4}")
        mode, n, seconds, rss, reads, code = rows[1]
        if n and n != args.files:
            scale = args.files / n
            print(
                f"  uncapped, scaled to {args.files} files: ~{seconds * scale:.0f} s, "
                f"~{reads * scale:.0f} reads (memory grows with the headers held: "
                f"{rss / 2**20:.0f} MiB at {n})"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
