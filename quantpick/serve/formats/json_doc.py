"""`--format json`: the command's argv and environment as data, with the RPC workers' lines (the
same `command` and `workers` keys every format adds to `--json`)."""

from __future__ import annotations

from typing import Any

from quantpick.serve.command import ServerCommand
from quantpick.serve.formats.base import Emission, Emitted, OutputFormat, Reporter
from quantpick.serve.formats.line import render_line


def render_json(cmd: ServerCommand) -> dict[str, Any]:
    """argv and env as data; `env_from` maps a variable to the one it must be copied from."""
    return {
        "argv": list(cmd.argv),
        "env": dict(cmd.env),
        "env_from": dict(cmd.env_from),
        "shell": render_line(cmd),
        "target": cmd.target,
        "warnings": list(cmd.warnings),
    }


class Json(OutputFormat):
    name = "json"

    def emit(self, job: Emission, say: Reporter) -> Emitted:
        from quantpick.serve.workers import render_worker_json

        workers = [render_worker_json(w) for w in job.workers]
        return Emitted(document={"command": render_json(job.cmd), "workers": workers})


FORMAT = Json()
