"""`--format line` (the default): one POSIX shell line, `VAR=value ... llama-server ...`; the RPC
workers' lines first, to run on their machines."""

from __future__ import annotations

import shlex

from quantpick.serve.command import ServerCommand
from quantpick.serve.formats.base import Emission, Emitted, OutputFormat, Reporter, assignments


def render_line(cmd: ServerCommand) -> str:
    """One POSIX shell line: `VAR=value ... llama-server ...`."""
    return " ".join([*assignments(cmd), shlex.join(cmd.argv)])


class Line(OutputFormat):
    name = "line"

    def emit(self, job: Emission, say: Reporter) -> Emitted:
        from quantpick.serve.workers import render_worker_lines

        workers = render_worker_lines(job.workers)
        if job.script is not None:
            # --script wrote the head's launcher; the workers' lines run elsewhere.
            return Emitted(stdout=workers)
        head = workers + "# then, on this machine:\n" if job.workers else ""
        return Emitted(stdout=head + render_line(job.cmd) + "\n")


FORMAT = Line()
