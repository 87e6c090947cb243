"""The renderings of a llama-server command: one line, a launch script, JSON, an environment file,
a systemd user unit, a docker compose file."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quantpick.errors import UsageError
from quantpick.machine.backends import backend as backend_named
from quantpick.serve.command import (
    ENV_VARS,
    NEGATIVE_FLAGS,
    ServerCommand,
    check_env_name,
    comment_lines,
)
from quantpick.serve.script_file import WRITTEN_BY
from quantpick.serve.workers import WorkerCommand


def _assignments(cmd: ServerCommand) -> list[str]:
    parts = [f"{check_env_name(k, 'env')}={shlex.quote(v)}" for k, v in cmd.env.items()]
    # "$NAME" expands at run time; NAME is validated, so nothing else can be injected.
    parts += [
        f'{check_env_name(k, "env")}="${check_env_name(src, "env")}"' for k, src in cmd.env_from
    ]
    return parts


def render_line(cmd: ServerCommand) -> str:
    """One POSIX shell line: `VAR=value ... llama-server ...`."""
    return " ".join([*_assignments(cmd), shlex.join(cmd.argv)])


def _groups(argv: tuple[str, ...]) -> list[list[str]]:
    """Flag + value pairs, for one flag per line (cosmetic only: the words are unchanged)."""
    groups: list[list[str]] = []
    for tok in argv[1:]:
        if (
            groups
            and len(groups[-1]) == 1
            and groups[-1][0].startswith("-")
            and not tok.startswith("-")
        ):
            groups[-1].append(tok)
        else:
            groups.append([tok])
    return groups


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
    for part in _assignments(cmd):
        lines.append(f"export {part}")
    body = [shlex.quote(cmd.argv[0])] + [
        " ".join(shlex.quote(t) for t in g) for g in _groups(cmd.argv)
    ]
    lines.append("exec " + " \\\n  ".join(body))
    return "\n".join(lines) + "\n"


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
    exports = list(_assignments(cmd))
    rest: list[str] = []
    groups = _groups(cmd.argv)
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
        " ".join(systemd_quote(t) for t in g) for g in _groups(cmd.argv)
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


COMPOSE_IMAGE_CPU = "ghcr.io/ggml-org/llama.cpp:server"


_CONTAINER_HF_HOME = "/hf"


_PATH_FLAGS = ("-m", "--mmproj")


def yaml_str(text: str, *, interpolate: bool = False) -> str:
    """A double-quoted YAML scalar (JSON's escapes are YAML's), with the characters YAML 1.1
    treats as line breaks (NEL, LS, PS) and the C1 controls escaped too. Without `interpolate`,
    "$" is doubled so compose reads it literally."""
    import json

    if not interpolate:
        text = text.replace("$", "$$")
    quoted = json.dumps(text, ensure_ascii=False)
    return "".join(
        f"\\u{ord(ch):04x}" if 0x7F <= ord(ch) <= 0x9F or ch in "\u2028\u2029" else ch
        for ch in quoted
    )


def _published(host: str, port: int) -> str:
    """The `ports:` entry: the server listens on all interfaces inside the container, and the
    host side keeps the address --host asked for (loopback by default)."""
    if host.endswith(".sock"):
        raise UsageError("--format compose publishes a TCP port; --host cannot be a socket")
    if host in ("0.0.0.0", "::", "[::]", ""):
        return f"{port}:{port}"
    if host in ("localhost",):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}:{port}"


def _container_index(cmd: ServerCommand) -> dict[int, int]:
    """Device index in the argv -> inside the container, where only the reserved GPUs exist and,
    in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID), are numbered from 0."""
    if not cmd.devices:
        return {}
    order = sorted(cmd.devices)
    variable = backend_named(cmd.backend).visibility_env
    if cmd.selected_by_env and variable:  # the argv numbers GPUs by their place in that list
        listed = [int(i) for i in re.findall(r"\d+", cmd.env[variable])]
        return {pos: order.index(phys) for pos, phys in enumerate(listed)}
    return {phys: order.index(phys) for phys in cmd.devices}


def render_compose(
    cmd: ServerCommand, plan_comment: str, machine_gpus: Sequence[int] | None = None
) -> str:
    """A docker compose file running the plan in the official llama.cpp server image: the model
    directory mounted read-only (paths rewritten), the plan's GPUs reserved, the port published
    on the --host address, the API key and HF token by reference.

    `machine_gpus`: the NVML indices of the machine's GPUs, reserved when the plan uses them all
    (`cmd.devices` is None); without them the reservation is `count: all`.
    """
    local = backend_named(cmd.backend)
    gpus = cmd.devices is None or bool(cmd.devices)
    reserved = cmd.devices if cmd.devices is not None else (tuple(machine_gpus or ()) or None)
    # The image built for the backend (llama.cpp docs/docker.md: server-cuda, server-rocm,
    # server-vulkan, server-intel); Metal has none (macOS runs no GPU in containers).
    if gpus and not local.image_suffix:
        raise UsageError(
            f"--format compose: llama.cpp publishes no {local.label} image "
            "(containers on macOS get no GPU)",
            hint="use --format script or systemd",
        )
    image = f"{COMPOSE_IMAGE_CPU}-{local.image_suffix}" if gpus else COMPOSE_IMAGE_CPU
    renumber = _container_index(cmd)
    prefix = re.escape(local.device_prefix)

    def renamed(text: str) -> str:
        return re.sub(
            rf"{prefix}(\d+)",
            lambda m: local.device_name(renumber.get(int(m[1]), int(m[1]))),
            text,
        )

    mounts: dict[str, str] = {}  # host directory -> container directory
    args: list[str] = []
    argv = list(cmd.argv[1:])
    i = 0
    while i < len(argv):
        word = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        if word in _PATH_FLAGS and value is not None:
            host_path = Path(value)
            target = mounts.setdefault(
                str(host_path.parent), "/models" + (f"-{len(mounts) + 1}" if mounts else "")
            )
            args += [word, f"{target}/{host_path.name}"]
            i += 2
            continue
        if word == "--host" and value is not None:
            args += [word, "0.0.0.0"]  # inside the container; `ports:` decides who can reach it
            i += 2
            continue
        if renumber and word in ("--device", "-dev", "-ot", "--override-tensor") and value:
            args += [word, renamed(value)]
            i += 2
            continue
        args.append(word)
        i += 1

    env = {k: v for k, v in cmd.env.items() if k != local.visibility_env}
    lines = [f"{WRITTEN_BY} Plan:"]
    lines += comment_lines(plan_comment)
    lines += comment_lines(
        f"Flags checked against: {cmd.target}; the image runs its own llama.cpp build "
        "(pin a release tag of the image to keep them in step)"
    )
    for warning in cmd.warnings:
        lines += comment_lines(f"Warning: {warning}")
    lines.append("# Run: docker compose -f THIS_FILE up -d")
    if gpus and local.container_gpu_driver:
        lines.append(f"# GPUs need {local.container_runtime} on the host.")
    elif gpus:
        lines.append(f"# {local.label} reaches the GPUs through the host's device files.")
    for _, src in cmd.env_from:
        lines.append(f"# The API key comes from ${src} (in the shell or an .env file beside this).")
    lines += ["services:", "  llama-server:", f"    image: {yaml_str(image)}", "    command:"]
    lines += [f"      - {yaml_str(a)}" for a in args]
    environment = [f"      {k}: {yaml_str(v)}" for k, v in env.items()]
    for key, src in cmd.env_from:
        ref = f"${{{check_env_name(src, 'env')}:?set {src} to the API key}}"
        name = check_env_name(key, "env")
        environment.append(f"      {name}: {yaml_str(ref, interpolate=True)}")
    if cmd.hf is not None:
        environment.append(f"      HF_HOME: {yaml_str(_CONTAINER_HF_HOME)}")
        environment.append(f"      HF_TOKEN: {yaml_str('${HF_TOKEN:-}', interpolate=True)}")
    if environment:
        lines += ["    environment:", *environment]
    volumes = []
    for source, target in mounts.items():
        volumes += [
            "      - type: bind",
            f"        source: {yaml_str(source)}",
            f"        target: {yaml_str(target)}",
            "        read_only: true",
        ]
    if cmd.hf is not None:
        volumes += [
            "      - type: volume",
            '        source: "hf-cache"',
            f"        target: {yaml_str(_CONTAINER_HF_HOME)}",
        ]
    if volumes:
        lines += ["    volumes:", *volumes]
    health = f"http://localhost:{cmd.port}/health"
    lines += [
        "    ports:",
        f"      - {yaml_str(_published(cmd.host, cmd.port))}",
        "    healthcheck:",
        f'      test: ["CMD", "curl", "-f", {yaml_str(health)}]',
        "      interval: 30s",
        "      start_period: 15m  # loading tens of GB takes a while",
        "    restart: unless-stopped",
    ]
    if gpus and not local.container_gpu_driver:
        # the backend's device files (machine/backends: ROCm /dev/kfd and /dev/dri, ...)
        lines += ["    devices:", *(f"      - {yaml_str(n)}" for n in local.container_devices)]
    elif gpus:
        lines += [
            "    deploy:",
            "      resources:",
            "        reservations:",
            "          devices:",
            f"            - driver: {yaml_str(local.container_gpu_driver or '')}",
        ]
        if reserved is None:
            lines.append('              count: "all"')
        else:
            ids = ", ".join(yaml_str(str(d)) for d in sorted(reserved))
            lines.append(f"              device_ids: [{ids}]")
        lines.append('              capabilities: ["gpu"]')
    if cmd.hf is not None:
        lines += ["volumes:", "  hf-cache: {}"]
    return "\n".join(lines) + "\n"
