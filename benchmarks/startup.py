"""Startup time of the CLI: median wall time of a few commands, run interleaved.

Usage:
    python benchmarks/startup.py            # 15 rounds
    python benchmarks/startup.py -n 31
    python benchmarks/startup.py --reference /tmp/quantpick-main   # side by side with another tree

The goal row (`GOAL`: pick from the manifest for a described machine, offline) is also timed in
CPU time (user + system of the child) beside huggingface_hub's own CLI, `hf version`, run in the
same rounds: the ratio is the figure the start-up goal is stated in (0.5x or less). Beside it, the
floor: the interpreter importing typer and rich, which every command of this CLI pays first.

Each round runs every command once, in turn, so that a slow moment of the machine hits all of
them alike. A last pass re-runs each command inside a wrapper that reports which heavy modules
(hub SDKs, HTTP, NVML) got imported: a command that does not need them should not pay for them.
The first (untimed) pass writes the bytecode caches, as installing a wheel does.

A planning command run again with the same inputs replays its recorded answer
(quantpick/answers.py) without building the CLI: the goal row is timed that way, as a user
re-running it meets it, and beside it planned anew (QUANTPICK_NO_ANSWER_CACHE=1).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HEAVY = ("huggingface_hub", "modelscope", "httpx", "pynvml")

# None = the bare interpreter, as the floor; the rest are quantpick arguments.
COMMANDS: list[list[str] | None] = [
    None,
    ["--help"],
    ["probe", "--json"],
    ["probe", "--json", "--gpu", "3090", "--gpu", "t4"],
    # planning from the manifest alone (no header read over the network): the goal is <= 150 ms
    [
        "pick",
        "qwen3.8-35b-a3b-distill",
        "-c",
        "262144",
        "--gpu",
        "3090",
        "--gpu",
        "t4",
        "--json",
        "--offline",
    ],
    # the default also tries to read the chosen quant's GGUF header from the hub once (then it is
    # cached); with no route to the hub, as here, this row shows what that failed attempt costs
    ["pick", "qwen3.8-35b-a3b-distill", "-c", "262144", "--gpu", "3090", "--gpu", "t4", "--json"],
]

# The start-up goal: this command's CPU time against `hf version` (huggingface_hub's CLI, the
# field's reference for a Python CLI that talks to the hub), both measured in the same rounds.
GOAL = ["pick", "qwen3.8-35b-a3b-distill", "-c", "32768", "--gpu", "3090", "--gpu", "t4",
        "--ram", "64G", "--offline"]  # fmt: skip
COMMANDS.append(GOAL)
HF_VERSION = "hf version"
# What any command of a typer + rich CLI pays before its own code: the interpreter and the two
# frameworks' imports (a rendered table needs rich.table). Timed in the same rounds, it is the
# floor the goal ratio can reach while the pick path loads them.
FLOOR = "import typer, rich.console, rich.table"

# Runs the CLI like the console script, then reports sys.modules on the real stderr at exit.
_WRAPPER = """
import atexit, sys
heavy = {heavy!r}
atexit.register(lambda: sys.__stderr__.write(
    "IMPORTED=" + ",".join(m for m in heavy if m in sys.modules) + "\\n"))
sys.argv = ["quantpick", *{args!r}]
from quantpick.cli import main
main()
"""


def _label(args: list[str] | None) -> str:
    return "python -c pass" if args is None else shlex.join(["quantpick", *args])


def _argv(args: list[str] | None) -> list[str]:
    if args is None:
        return [sys.executable, "-c", "pass"]
    if args == [HF_VERSION]:
        hf = shutil.which("hf", path=os.path.dirname(sys.executable)) or shutil.which("hf")
        return [hf or "hf", "version"]
    # The console script is what users run; fall back to -m when it is not installed.
    script = shutil.which("quantpick", path=os.path.dirname(sys.executable))
    return [script, *args] if script else [sys.executable, "-m", "quantpick", *args]


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    elapsed, _, proc = _run_cpu(argv, env)
    return elapsed, proc


def _run_cpu(
    argv: list[str], env: dict[str, str]
) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall time and CPU time (user + system of the child and its children) of one run."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc


def _stored_inputs(path: str) -> str:
    """The inputs an answer in quantpick/answers.py's store was recorded for."""
    with open(path, encoding="utf-8") as file:
        return str(json.load(file)["inputs"])


def _goal_ratio(rounds: int, env: dict[str, str], ref_env: dict[str, str] | None = None) -> None:
    """The start-up goal: GOAL's median CPU time over `hf version`'s, interleaved (with
    --reference, the other tree's GOAL in the same rounds, so that both ratios share the same
    moments of a busy machine). GOAL is timed twice: as a user runs it again (the answer
    replayed, quantpick/answers.py) and planned anew (QUANTPICK_NO_ANSWER_CACHE=1)."""
    goal_cpu: list[float] = []
    cold_cpu: list[float] = []
    ref_cpu: list[float] = []
    hf_cpu: list[float] = []
    floor_cpu: list[float] = []
    hf_env = {**env, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "1"}
    cold_env = {**env, "QUANTPICK_NO_ANSWER_CACHE": "1"}
    _, _, probe = _run_cpu(_argv([HF_VERSION]), hf_env)
    if probe.returncode != 0:
        print(f"skip  {HF_VERSION}: exit {probe.returncode} (huggingface_hub's CLI not found)")
        return
    # The first runs remember the llama-server build and record the answer; say whether the
    # timed runs replay it (they do unless the run reads something live).
    for _ in range(2):
        _run_cpu(_argv(GOAL), env)
        if ref_env is not None:
            _run_cpu(_argv(GOAL), ref_env)
    store = os.path.join(env["QUANTPICK_HOME"], "cache", "answers")
    recorded = os.path.isdir(store) and any(
        json.dumps(GOAL) in _stored_inputs(os.path.join(store, name)) for name in os.listdir(store)
    )
    how = "its answer recorded" if recorded else "no answer recorded: planned anew each run"
    for _ in range(rounds):
        goal_cpu.append(_run_cpu(_argv(GOAL), env)[1])
        cold_cpu.append(_run_cpu(_argv(GOAL), cold_env)[1])
        hf_cpu.append(_run_cpu(_argv([HF_VERSION]), hf_env)[1])
        floor_cpu.append(_run_cpu([sys.executable, "-c", FLOOR], env)[1])
        if ref_env is not None:
            ref_cpu.append(_run_cpu(_argv(GOAL), ref_env)[1])
    goal, hf = statistics.median(goal_cpu), statistics.median(hf_cpu)
    cold = statistics.median(cold_cpu)
    print(
        f"start-up goal: {_label(GOAL)}: {goal * 1000:.0f} ms CPU; {HF_VERSION}: "
        f"{hf * 1000:.0f} ms CPU; ratio {goal / hf:.2f} (goal <= 0.5)"
        f" [{how}]"
    )
    print(
        f"  planned anew (QUANTPICK_NO_ANSWER_CACHE=1): {cold * 1000:.0f} ms CPU; "
        f"ratio {cold / hf:.2f}"
    )
    if ref_cpu:
        ref = statistics.median(ref_cpu)
        print(f"  reference tree: {ref * 1000:.0f} ms CPU; ratio {ref / hf:.2f}")
    floor = statistics.median(floor_cpu)
    print(
        f"  floor: python -c {FLOOR!r}: {floor * 1000:.0f} ms CPU; ratio {floor / hf:.2f} "
        "(what a command pays that builds the CLI)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--rounds", type=int, default=15)
    parser.add_argument(
        "--reference",
        metavar="DIR",
        help="another quantpick source tree (e.g. a `git worktree` of main), timed in the same "
        "interleaved rounds through PYTHONPATH",
    )
    opts = parser.parse_args()

    home = tempfile.mkdtemp(prefix="quantpick-bench-")
    env = {**os.environ, "QUANTPICK_HOME": home, "NO_COLOR": "1"}
    # An installed wheel has its bytecode compiled; a source checkout gets it on the first run
    # (the warm-up pass below) unless bytecode writing is off, which would time the compiler.
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    commands: list[tuple[str, list[str] | None]] = []
    for args in COMMANDS:
        label = _label(args)
        _, proc = _run(_argv(args), env)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"skip  {label}: exit {proc.returncode}: {tail}")
            continue
        commands.append((label, args))

    ref_env = None
    if opts.reference:
        # a home of its own: two trees sharing one would overwrite each other's llama-server
        # build memo and invalidate each other's recorded answers every round
        ref_home = tempfile.mkdtemp(prefix="quantpick-bench-ref-")
        ref_env = {
            **env,
            "PYTHONPATH": os.path.abspath(opts.reference),
            "QUANTPICK_HOME": ref_home,
        }
    times: dict[str, list[float]] = {label: [] for label, _ in commands}
    ref_times: dict[str, list[float]] = {label: [] for label, _ in commands}
    for _ in range(opts.rounds):
        for label, args in commands:
            elapsed, _ = _run(_argv(args), env)
            times[label].append(elapsed)
            if ref_env is not None:
                elapsed, _ = _run(_argv(args), ref_env)
                ref_times[label].append(elapsed)

    width = max(len(label) for label, _ in commands)
    ref_head = "  reference ms  ratio" if ref_env is not None else ""
    print(f"{'command':<{width}}  median ms    min ms{ref_head}  heavy modules imported")
    for label, args in commands:
        imported = "-"
        if args:
            code = _WRAPPER.format(heavy=HEAVY, args=args)
            _, proc = _run([sys.executable, "-c", code], env)
            lines = [line for line in proc.stderr.splitlines() if line.startswith("IMPORTED=")]
            imported = (lines[-1].removeprefix("IMPORTED=") or "none") if lines else "?"
        samples = times[label]
        median = statistics.median(samples)
        ref_cols = ""
        if ref_env is not None:
            ref_median = statistics.median(ref_times[label])
            ref_cols = f"  {ref_median * 1000:12.0f}  {median / ref_median:5.2f}"
        print(
            f"{label:<{width}}  {median * 1000:9.0f}  {min(samples) * 1000:8.0f}{ref_cols}"
            f"  {imported}"
        )
    _goal_ratio(opts.rounds, env, ref_env)
    ref_note = f"; reference: {opts.reference}" if opts.reference else ""
    print(f"({opts.rounds} interleaved rounds, {sys.executable}{ref_note})")
    shutil.rmtree(home, ignore_errors=True)
    if ref_env is not None:
        shutil.rmtree(ref_env["QUANTPICK_HOME"], ignore_errors=True)


if __name__ == "__main__":
    main()
