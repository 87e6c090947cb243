"""Shell completion latency: each Tab runs `quantpick` once with _QUANTPICK_COMPLETE set.

Usage:
    python benchmarks/completion.py          # 15 rounds
    python benchmarks/completion.py -n 31

Goal: every answer well under 200 ms (a Tab that takes longer feels broken). Each row is the
median wall time and the slowest of the interleaved rounds, and the median CPU time (user + sys of
the process, which a busy machine inflates much less than wall time), beside `python -c pass` as
the floor; the answer's first words show that it completes what it should. The first (untimed)
pass writes the bytecode caches, as installing a wheel does.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

GOAL_MS = 200
MODEL = "qwen3.8-35b-a3b-distill"

# (label, COMP_WORDS, COMP_CWORD): what bash passes for a Tab at the end of the line.
CASES: list[tuple[str, str, int] | None] = [
    None,  # python -c pass
    ("command name", "quantpick pi", 1),
    ("option name", "quantpick pick --pre", 2),
    ("MODEL", "quantpick pick qwen", 2),
    ("--quant of MODEL", f"quantpick pick {MODEL} --quant ", 4),
    ("--gpu", "quantpick pick --gpu 30", 3),
    ("--prefer", "quantpick pick --prefer ", 3),
    ("--format", "quantpick get m --format ", 4),
    ("-ctk", "quantpick estimate m -ctk ", 4),
    ("--source", "quantpick download m --source ", 4),
    ("manifest subcommand", "quantpick manifest ", 2),
]


def _argv(case: tuple[str, str, int] | None) -> list[str]:
    if case is None:
        return [sys.executable, "-c", "pass"]
    script = shutil.which("quantpick", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "quantpick"]


def _env(case: tuple[str, str, int] | None, base: dict[str, str]) -> dict[str, str]:
    if case is None:
        return base
    _, words, cword = case
    return {**base, "_QUANTPICK_COMPLETE": "complete_bash", "COMP_WORDS": words,
            "COMP_CWORD": str(cword)}  # fmt: skip


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(case: tuple[str, str, int] | None, base: dict[str, str]) -> tuple[float, float, str]:
    cpu, start = _cpu(), time.perf_counter()
    proc = subprocess.run(_argv(case), env=_env(case, base), capture_output=True, text=True)
    return time.perf_counter() - start, _cpu() - cpu, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--rounds", type=int, default=15)
    opts = parser.parse_args()

    home = tempfile.mkdtemp(prefix="quantpick-bench-")
    base = {**os.environ, "QUANTPICK_HOME": home, "NO_COLOR": "1"}
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    answers = {id(case): _run(case, base)[2] for case in CASES}  # warm-up: bytecode, answers
    times: dict[int, list[float]] = {id(case): [] for case in CASES}
    cpus: dict[int, list[float]] = {id(case): [] for case in CASES}
    for _ in range(opts.rounds):
        for case in CASES:
            wall, cpu, _ = _run(case, base)
            times[id(case)].append(wall)
            cpus[id(case)].append(cpu)

    print(f"{'Tab on':<22} {'median ms':>9} {'max ms':>7} {'cpu ms':>7}  answer")
    worst = 0.0
    for case in CASES:
        label = "python -c pass" if case is None else case[0]
        samples = times[id(case)]
        median = statistics.median(samples) * 1000
        if case is not None:
            worst = max(worst, median)
        words = answers[id(case)].split()
        shown = " ".join(words[:5]) + (f" ... ({len(words)})" if len(words) > 5 else "")
        cpu = statistics.median(cpus[id(case)]) * 1000
        print(f"{label:<22} {median:9.0f} {max(samples) * 1000:7.0f} {cpu:7.0f}  {shown}")
    verdict = "within" if worst < GOAL_MS else "OVER"
    print(f"slowest median {worst:.0f} ms: {verdict} the {GOAL_MS} ms goal "
          f"({opts.rounds} interleaved rounds, {sys.executable})")  # fmt: skip
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
