"""`--format env`: `export LLAMA_ARG_*=...` lines, which llama-server reads before its command
line (common/arg.cpp, common_arg::get_env); what has no variable stays an argument."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from quantpick.serve.command import ENV_VARS, NEGATIVE_FLAGS, ServerCommand, comment_lines
from quantpick.serve.formats.base import (
    Emission,
    Emitted,
    OutputFormat,
    Reporter,
    assignments,
    flag_groups,
    text_output,
)


def _env_value(flag: str, value: str | None, name: str) -> str:
    if value is not None:
        return value
    # A switch through its env var: "1" turns it on; a negative switch through the positive
    # variable is "0" (common_arg::get_env, is_truthy / is_falsey).
    if flag in NEGATIVE_FLAGS and "_NO_" not in name:
        return "0"
    return "1"


def render_env(cmd: ServerCommand) -> str:
    """`export` lines: LLAMA_ARG_* for every flag that has one, then the rest as a run comment.

    Flags without an env var (and repeated -ot whose patterns cannot be comma-joined) stay
    arguments, listed in the final comment line. llama-server reads the env first and lets the
    command line override it.
    """
    names: Mapping[str, str] = cmd.env_names or ENV_VARS
    exports = list(assignments(cmd))
    rest: list[str] = []
    groups = flag_groups(cmd.argv)
    ot_values = [g[1] for g in groups if g[0] == "-ot" and len(g) == 2]
    ot_joinable = "-ot" in names and all("," not in v for v in ot_values)
    if ot_values and ot_joinable:
        exports.append(f"{names['-ot']}={shlex.quote(','.join(ot_values))}")
    for g in groups:
        flag, value = g[0], (g[1] if len(g) == 2 else None)
        if flag == "-ot" and ot_joinable:
            continue
        name = names.get(flag)
        if name is None or not flag.startswith("-"):
            rest.extend(g)
            continue
        exports.append(f"{name}={shlex.quote(_env_value(flag, value, name))}")
    lines = comment_lines(f"llama-server environment written by quantpick; target: {cmd.target}")
    lines += [f"export {e}" for e in exports]
    run = shlex.join([cmd.argv[0], *rest])
    # shlex.quote keeps newlines inside quotes; a comment cannot hold them, so show them escaped.
    lines.append("# then run: " + run.replace("\r", "\\r").replace("\n", "\\n"))
    return "\n".join(lines) + "\n"


class Env(OutputFormat):
    name = "env"

    def emit(self, job: Emission, say: Reporter) -> Emitted:
        from quantpick.serve.workers import render_worker_lines

        # Environment files hold the head's settings; the workers' lines stay comments.
        lines = render_worker_lines(job.workers).splitlines()
        text = "".join((x if x.startswith("#") else f"# {x}") + "\n" for x in lines)
        return text_output(text + render_env(job.cmd))


FORMAT = Env()
