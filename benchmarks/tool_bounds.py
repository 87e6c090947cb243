"""The time and memory bounds on llama.cpp's tools (quantpick.process, machine.rpc), measured
beside what the unbounded reading did (issue 21):

- a tool flooding stdout: quantpick's peak RSS and the time to stop it, against the cap (4 MiB)
  (before: read whole, MemoryError);
- a tool that hangs with a child: the time to the deadline, and whether the child is gone
  (before: the child was left running);
- a tool whose grandchild holds its stdout after it exits: the time to return (before: no
  deadline);
- an RPC worker trickling one byte every 0.5 s: the time to give up with a 3 s deadline, and 8
  such workers read at once (before: 3 s per read, ~36 s for one worker, ~5 min for 8).

Usage:
    python benchmarks/tool_bounds.py
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PY = sys.executable


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def main() -> None:
    import tempfile

    from quantpick.machine.rpc import query_worker, query_workers
    from quantpick.process import STDOUT_CAP_BYTES, run_tool

    print(f"{'case':52} {'figure':>14}   reference")
    before = rss_mib()
    start = time.monotonic()
    flood = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
    result = run_tool([PY, "-c", flood], timeout_s=60)
    took = time.monotonic() - start
    grew = rss_mib() - before
    print(f"{'stdout flood: time to stop':52} {took:>12.2f} s   timeout 60 s")
    print(f"{'stdout flood: kept / peak RSS growth':52} {len(result.stdout) / 2**20:>6.0f}/"
          f"{grew:>5.0f} MiB   cap {STDOUT_CAP_BYTES // 2**20} MiB")  # fmt: skip

    with tempfile.TemporaryDirectory() as tmp:
        pidfile = Path(tmp) / "pid"
        hang = (
            "import subprocess, time\n"
            f"p = subprocess.Popen(['sleep', '300']); open({str(pidfile)!r}, 'w').write("
            "str(p.pid))\ntime.sleep(300)\n"
        )
        start = time.monotonic()
        run_tool([PY, "-c", hang], timeout_s=2)
        took = time.monotonic() - start
        time.sleep(0.2)
        gone = not alive(int(pidfile.read_text()))
        print(f"{'hung tool with a child: time / child gone':52} {took:>9.2f} s {gone!s:>4}"
              "   deadline 2 s")  # fmt: skip

        held = (
            "import subprocess\n"
            f"p = subprocess.Popen(['sleep', '300']); open({str(pidfile)!r}, 'w').write("
            "str(p.pid))\nprint('[]')\n"
        )
        start = time.monotonic()
        run_tool([PY, "-c", held], timeout_s=600)
        took = time.monotonic() - start
        time.sleep(0.2)
        gone = not alive(int(pidfile.read_text()))
        print(f"{'grandchild holding stdout: time / helper gone':52} {took:>9.2f} s {gone!s:>4}"
              "   pipe grace 1 s")  # fmt: skip

    from fake_rpc import FakeWorker

    with FakeWorker(behaviour="trickle", trickle_s=0.5) as w:
        start = time.monotonic()
        try:
            query_worker("127.0.0.1", w.port, timeout_s=3)
        except Exception:
            pass
        took = time.monotonic() - start
    print(f"{'RPC worker trickling 1 B / 0.5 s: time to give up':52} {took:>12.2f} s   "
          "deadline 3 s (per read: ~36 s)")  # fmt: skip
    workers = [FakeWorker(behaviour="trickle", trickle_s=0.5) for _ in range(8)]
    for w in workers:
        w.__enter__()
    try:
        start = time.monotonic()
        query_workers([("127.0.0.1", w.port) for w in workers], timeout_s=3)
        took = time.monotonic() - start
    finally:
        for w in workers:
            w.__exit__(None, None, None)
    print(f"{'8 trickling RPC workers read at once':52} {took:>12.2f} s   "
          "deadline 3 s (one after the other: 24 s)")  # fmt: skip


if __name__ == "__main__":
    main()
