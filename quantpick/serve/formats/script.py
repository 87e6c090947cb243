"""`--format script`: a bash script that execs llama-server (also what `--script FILE` writes,
serve/script_file.py)."""

from __future__ import annotations

import shlex

from quantpick.serve.command import ServerCommand, comment_lines
from quantpick.serve.formats.base import (
    Emission,
    Emitted,
    OutputFormat,
    Reporter,
    assignments,
    flag_groups,
    text_output,
)
from quantpick.serve.script_file import WRITTEN_BY
from quantpick.serve.workers import WorkerCommand


def render_script(
    cmd: ServerCommand, plan_comment: str, workers: tuple[WorkerCommand, ...] = ()
) -> str:
    """A bash script that execs the server; the plan, warnings and the RPC workers' own lines
    (to run on those machines first) are comments."""
    lines = ["#!/usr/bin/env bash", f"{WRITTEN_BY} Plan:"]
    lines += comment_lines(plan_comment)
    lines += comment_lines(f"Target: {cmd.target}")
    for warning in cmd.warnings:
        lines += comment_lines(f"Warning: {warning}")
    if workers:
        lines += comment_lines("Start these RPC workers first, each on its own machine:")
        for w in workers:
            lines += comment_lines(f"  on {w.endpoint}: {shlex.join(w.argv)}")
            for warning in w.warnings:
                lines += comment_lines(f"    Warning: {warning}")
            for rule in w.firewall:
                lines += comment_lines(f"    firewall: {rule}")
    lines.append("set -euo pipefail")
    program = cmd.argv[0]
    if "/" not in program:
        # No binary was found when this was written: say so plainly instead of bash's
        # "exec: llama-server: not found".
        lines.append(
            f"command -v {shlex.quote(program)} >/dev/null 2>&1 || {{ printf '%s\\n' "
            + shlex.quote(
                f"{program} is not on PATH: install llama.cpp (or run quantpick's "
                "scripts/build-llamacpp.sh) and put it on PATH, or write this script again "
                "with quantpick get --llama-server PATH"
            )
            + " >&2; exit 127; }"
        )
    for _, src in cmd.env_from:
        # Fail with a clear message instead of starting a server without its key.
        lines.append(f': "${{{src}:?set {src} to the API key before running this script}}"')
    for part in assignments(cmd):
        lines.append(f"export {part}")
    body = [shlex.quote(cmd.argv[0])] + [
        " ".join(shlex.quote(t) for t in g) for g in flag_groups(cmd.argv)
    ]
    lines.append("exec " + " \\\n  ".join(body))
    return "\n".join(lines) + "\n"


class Script(OutputFormat):
    name = "script"

    def emit(self, job: Emission, say: Reporter) -> Emitted:
        return text_output(render_script(job.cmd, job.comment, job.workers))


FORMAT = Script()
