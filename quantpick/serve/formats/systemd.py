"""`--format systemd`: a systemd user unit that runs llama-server and restarts it on failure.

Quoting: systemd.service(5) "COMMAND LINES" and systemd.syntax(7) "QUOTING" (serve/command.py
says more)."""

from __future__ import annotations

import re

from quantpick.errors import UsageError
from quantpick.serve.command import ServerCommand, comment_lines
from quantpick.serve.formats.base import (
    Emission,
    Emitted,
    OutputFormat,
    Reporter,
    flag_groups,
    text_output,
)
from quantpick.serve.script_file import WRITTEN_BY

_SYSTEMD_SAFE = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


_SYSTEMD_ESCAPES = {
    "\\": "\\\\", '"': '\\"', "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
    "\t": "\\t", "\v": "\\v",
}  # fmt: skip


SYSTEMD_UNIT_DIR = "~/.config/systemd/user"


def systemd_quote(word: str, *, exec_line: bool = True) -> str:
    """One word for a unit file, read back by systemd as exactly `word`.

    `exec_line`: in ExecStart='s arguments a "$" expands variables, so it is doubled; in
    Environment= and in the executable path it is plain text. "%" is doubled everywhere
    (specifiers).
    """
    text = word.replace("%", "%%")
    if exec_line:
        text = text.replace("$", "$$")
    if text and _SYSTEMD_SAFE.match(text):
        return text
    out = []
    for ch in text:
        if ch in _SYSTEMD_ESCAPES:
            out.append(_SYSTEMD_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        elif 0x80 <= ord(ch) <= 0x9F or ch in "\u2028\u2029":
            out.append(f"\\u{ord(ch):04x}")  # C1 controls and Unicode line breaks, visibly
        else:
            out.append(ch)  # UTF-8 is accepted as is (systemd.syntax(7))
    return '"' + "".join(out) + '"'


def _systemd_executable(program: str) -> str:
    """The executable of ExecStart=: its path is not variable-expanded, argv[0] (the same word)
    is. With a "$" in the path, the "@" prefix gives both: the path as written, then argv[0] as
    an argument word (systemd.service(5): "@" passes the second word as argv[0])."""
    if "$" not in program:
        return systemd_quote(program, exec_line=False)
    # the prefix inside the quotes: systemd unquotes the word, then reads its prefixes
    return f"{systemd_quote('@' + program, exec_line=False)} {systemd_quote(program)}"


def systemd_unit_name(name: str) -> str:
    """A unit name from a model name: systemd allows ASCII letters, digits and ":-_.\\"."""
    cleaned = re.sub(r"[^A-Za-z0-9:_.-]+", "-", name).strip("-.") or "model"
    return f"llama-server-{cleaned}"


def render_systemd(cmd: ServerCommand, plan_comment: str, name: str) -> str:
    """A systemd user unit that runs the server and restarts it on failure, with the install
    steps as comments. The API key stays out of the unit: EnvironmentFile= names a file the user
    creates (mode 0600) holding LLAMA_API_KEY=..."""
    program = cmd.argv[0]
    if program[:1] in ("-", "@", ":", "+", "!") or any(c in program for c in "\\\"'"):
        raise UsageError(
            f"systemd cannot start {program!r}",
            hint="give the absolute path of llama-server (--llama-server PATH)",
        )
    unit = systemd_unit_name(name)
    env_file = f"%h/.config/quantpick/{unit}.env"
    lines = [f"{WRITTEN_BY} Plan:"]
    lines += comment_lines(plan_comment)
    lines += comment_lines(f"Target: {cmd.target}")
    for warning in cmd.warnings:
        lines += comment_lines(f"Warning: {warning}")
    lines += [
        "#",
        "# Install as a user service:",
        f"#   mkdir -p {SYSTEMD_UNIT_DIR}",
        f"#   (save this file as {SYSTEMD_UNIT_DIR}/{unit}.service)",
    ]
    for _, src in cmd.env_from:
        lines += [
            f"#   The API key: ~/.config/quantpick/{unit}.env, readable only by you, holds",
            "#   LLAMA_API_KEY=<key> (systemd does not see your shell's variables):",
            "#     mkdir -p ~/.config/quantpick && (umask 077 && printf 'LLAMA_API_KEY=%s\\n' "
            f'"${src}" > ~/.config/quantpick/{unit}.env)',
        ]
    lines += [
        f"#   systemctl --user daemon-reload && systemctl --user enable --now {unit}.service",
        f"#   journalctl --user -u {unit} -f          # its log",
        "#   loginctl enable-linger $USER            # optional: run it without a login session",
    ]
    if not program.startswith("/"):
        lines.append(
            f"# {program} is looked up in systemd's fixed PATH (/usr/local/bin, /usr/bin, ...)"
        )
    lines += [
        "",
        "[Unit]",
        # Description= is plain text with specifiers: only "%" needs escaping.
        "Description=llama-server {} (quantpick)".format(" ".join(name.split()).replace("%", "%%")),
        "After=network-online.target",
        "Wants=network-online.target",
        # Give up after 10 failed starts within 30 minutes instead of looping for ever.
        "StartLimitIntervalSec=30min",
        "StartLimitBurst=10",
        "",
        "[Service]",
        "Type=exec",
    ]
    for key, value in cmd.env.items():
        lines.append("Environment=" + systemd_quote(f"{key}={value}", exec_line=False))
    if cmd.env_from:
        # Without "-": a missing key file stops the start, rather than serving without a key.
        lines.append(f"EnvironmentFile={env_file}")
    body = [_systemd_executable(program)] + [
        " ".join(systemd_quote(t) for t in g) for g in flag_groups(cmd.argv)
    ]
    lines.append("ExecStart=" + " \\\n  ".join(body))
    lines += [
        "Restart=on-failure",
        # Back-off: 5 s, growing to 2 min over 5 restarts (RestartSteps= and
        # RestartMaxDelaySec= need systemd 254; older versions ignore them and keep 5 s).
        "RestartSec=5s",
        "RestartSteps=5",
        "RestartMaxDelaySec=2min",
        "",
        "[Install]",
        "WantedBy=default.target",
    ]
    return "\n".join(lines) + "\n"


class Systemd(OutputFormat):
    name = "systemd"

    def emit(self, job: Emission, say: Reporter) -> Emitted:
        text = render_systemd(job.cmd, job.comment, job.name)
        unit = systemd_unit_name(job.name)
        say.note(
            f"Install: save it as {SYSTEMD_UNIT_DIR}/{unit}.service (mkdir -p "
            f"{SYSTEMD_UNIT_DIR}), then: systemctl --user daemon-reload && "
            f"systemctl --user enable --now {unit}.service"
        )
        workers_run_elsewhere(job, say)
        return text_output(text)


def workers_run_elsewhere(job: Emission, say: Reporter) -> None:
    """A service file holds the head only: the RPC workers' lines go to stderr."""
    from quantpick.serve.workers import render_worker_lines

    if job.workers:
        say.note("The RPC workers run elsewhere; their lines:\n" + render_worker_lines(job.workers))


FORMAT = Systemd()
