"""What an installed llama-server accepts (read from its `--help`), and checking a command.

`parse_help` is pure. It reads the layout of llama.cpp `common/arg.cpp: common_arg::to_string`:
a flag line starts in column 0 with comma-separated spellings and an optional value hint, the help
text starts in column 40 (or on the next line when the flag field is longer than 37 characters),
and continuation lines are indented by 40 spaces. The help text carries `(env: NAME)` and, for
some options, `allowed values: a, b, c`.

Usage:
    caps = capabilities_for(Path("/usr/local/bin/llama-server"))
    problems = check_command(cmd.argv, caps)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from quantpick.errors import QuantpickError
from quantpick.machine.llamacpp import inspect_llama_server, parse_version_output

HELP_TIMEOUT_S = 10.0
# llama-server --help is 43 KB at b11312 (tests/data/llama-server-help-current.txt): 24x that.
HELP_CAP = 1024**2

# common_arg::to_string: n_leading_spaces = 40; a flag field over 37 characters moves the help
# text to the next line.
_HELP_COLUMN = 40
_FLAG_NAME = re.compile(r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*,?$")
_ENV = re.compile(r"\(env:\s*([A-Z_][A-Z0-9_]*)\)")
# "allowed values: f32, f16, ..." (current and old -ctk/-ctv) or "allowed values: `deepseek`,
# `none`; ..." (old --reasoning-format): up to a ';', ')' or the end of the line.
_ALLOWED = re.compile(r"allowed values:\s*([^;)\n]+)")
# Value hints that enumerate choices: [on|off|auto], <0|1>, {none,layer,row}. A comma list is a
# choice list only in braces: <dev1,dev2,..> and N0,N1,... are value lists, not choices.
_PIPE_CHOICES = re.compile(r"^[\[<{(]?([A-Za-z0-9_.+-]+(?:\|[A-Za-z0-9_.+-]+)+)[\]>})]?$")
_BRACE_CHOICES = re.compile(r"^\{([A-Za-z0-9_.+-]+(?:,[A-Za-z0-9_.+-]+)+)\}$")


@dataclass(frozen=True)
class FlagInfo:
    """One option as --help lists it."""

    names: tuple[str, ...]  # every spelling, positive and negative ("-kvu", ..., "--no-kv-unified")
    value_hint: str | None  # "N", "[on|off|auto]", ...; None: a flag that takes no value
    choices: tuple[str, ...] | None  # accepted values when the help enumerates them
    env: str | None  # "LLAMA_ARG_CTX_SIZE"
    help: str = ""

    @property
    def takes_value(self) -> bool:
        return self.value_hint is not None


@dataclass(frozen=True)
class ServerCapabilities:
    """The flags one llama-server build accepts (from --help) and, when known, its build."""

    flags: dict[str, FlagInfo] = field(default_factory=dict)  # every spelling -> its option
    path: str | None = None
    version: str | None = None  # semver of new builds ("0.5.0-dev"); None for old builds
    build: int | None = None  # the b-number; 1 for builds of a shallow clone
    commit: str | None = None
    version_error: str | None = None  # why the build could not be read

    def has(self, flag: str) -> bool:
        return flag in self.flags

    def info(self, flag: str) -> FlagInfo | None:
        return self.flags.get(flag)

    def takes_value(self, flag: str) -> bool | None:
        info = self.flags.get(flag)
        return None if info is None else info.takes_value

    def choices(self, flag: str) -> tuple[str, ...] | None:
        info = self.flags.get(flag)
        return None if info is None else info.choices

    def env_var(self, flag: str) -> str | None:
        info = self.flags.get(flag)
        return None if info is None else info.env

    def accepts(self, flag: str, value: str) -> bool:
        """Whether `flag value` is accepted as far as the help tells (unknown choices: yes)."""
        choices = self.choices(flag)
        if choices is None:
            return True
        # on|off|auto options also accept 1|0|-1 (notes section 4); only the words are listed.
        return value in choices

    def describe(self) -> str:
        if self.version:
            what = f"llama-server {self.version} (build {self.build}, commit {self.commit})"
        elif self.build is not None:
            what = f"llama-server build {self.build} ({self.commit})"
        else:
            what = "llama-server (build unknown)"
        return f"{what} at {self.path}" if self.path else what


def _split_spec(spec: str) -> tuple[tuple[str, ...], str | None]:
    """'-c,    --ctx-size N' -> (('-c', '--ctx-size'), 'N')."""
    tokens = spec.split()
    names: list[str] = []
    rest: list[str] = []
    for i, tok in enumerate(tokens):
        if not _FLAG_NAME.match(tok):
            rest = tokens[i:]
            break
        names.append(tok.rstrip(","))
        if not tok.endswith(","):
            rest = tokens[i + 1 :]
            break
    hint = " ".join(rest) or None
    return tuple(names), hint


def _choices(hint: str | None, help_text: str) -> tuple[str, ...] | None:
    if hint is not None and " " not in hint:
        m = _PIPE_CHOICES.match(hint)
        if m:
            return tuple(m.group(1).split("|"))
        m = _BRACE_CHOICES.match(hint)
        if m:
            return tuple(m.group(1).split(","))
    m = _ALLOWED.search(help_text)
    if m:
        values = [v.strip().strip("`'\"") for v in m.group(1).split(",")]
        values = [v for v in values if v]
        if values:
            return tuple(values)
    return None


def spec_types(caps: ServerCapabilities) -> frozenset[str] | None:
    """The --spec-type values this build lists (its value hint is the comma list: common/arg.cpp
    `--spec-type none,draft-simple,...,ngram-cache`); empty when it has no --spec-type, None
    when the hint names no values."""
    info = caps.info("--spec-type")
    if info is None:
        return frozenset()
    if not info.value_hint or "," not in info.value_hint:
        return None
    return frozenset(v.strip() for v in info.value_hint.strip("[]{}<>").split(",") if v.strip())


def parse_help(text: str) -> ServerCapabilities:
    """Every flag spelling in `llama-server --help` output, with value/choices/env per option.

    Lines that are not option lines (section headers, backend load messages on stderr, comment
    headers of recorded files) are ignored. An empty result means the text was not --help output.
    """
    entries: list[tuple[tuple[str, ...], str | None, list[str]]] = []
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if line.startswith(" ") and entries:
            entries[-1][2].append(line.strip())
            continue
        if not line.startswith("-") or not re.match(r"^-{1,2}[A-Za-z0-9]", line):
            continue
        # Short flag fields are padded to column 40 and the help follows on the same line.
        if len(line) > _HELP_COLUMN and line[_HELP_COLUMN - 3 : _HELP_COLUMN] == "   ":
            spec, first_help = line[:_HELP_COLUMN], line[_HELP_COLUMN:].strip()
        else:
            spec, first_help = line, ""
        names, hint = _split_spec(spec)
        if not names:
            continue
        entries.append((names, hint, [first_help] if first_help else []))

    flags: dict[str, FlagInfo] = {}
    for names, hint, help_lines in entries:
        help_text = "\n".join(help_lines)
        env = _ENV.search(help_text)
        info = FlagInfo(
            names=names,
            value_hint=hint,
            choices=_choices(hint, help_text),
            env=env.group(1) if env else None,
            help=help_text,
        )
        for name in names:
            flags.setdefault(name, info)
    return ServerCapabilities(flags=flags)


def with_version(caps: ServerCapabilities, version_text: str) -> ServerCapabilities:
    """`caps` with the build read from `llama-server --version` output (pure)."""
    version, build, commit = parse_version_output(version_text)
    error = None if build is not None else "no version line in --version output"
    return replace(caps, version=version, build=build, commit=commit, version_error=error)


def capabilities_for(path: Path, *, timeout_s: float = HELP_TIMEOUT_S) -> ServerCapabilities:
    """Run `path --help` (and `--version`) and parse them. Nothing is cached.

    Raises QuantpickError when the binary cannot be run, does not answer within `timeout_s`,
    floods its output, or its --help lists no options.
    """
    from quantpick.process import run_tool

    hint = "check that it is llama-server, or pass --llama-server PATH"
    try:
        proc = run_tool([str(path), "--help"], timeout_s=timeout_s, stdout_cap=HELP_CAP)
    except OSError as exc:
        raise QuantpickError(
            f"cannot run {path}: {exc.strerror or exc}",
            hint="check the path and that the file is executable",
        ) from exc
    if proc.timed_out:
        raise QuantpickError(f"{path} --help did not finish in {timeout_s:g} s", hint=hint)
    if proc.overflowed:
        raise QuantpickError(
            f"{path} --help printed more than {HELP_CAP // 1024**2} MiB: not llama-server's help",
            hint=hint,
        )
    # The help goes to stdout; backend load messages (and some builds' help) to stderr.
    caps = parse_help(f"{proc.stdout}\n{proc.stderr}")
    if not caps.flags:
        raise QuantpickError(
            f"{path} --help lists no options (exit {proc.returncode})",
            hint=hint,
        )
    server = inspect_llama_server(path, timeout_s=timeout_s)
    return ServerCapabilities(
        flags=caps.flags,
        path=str(path),
        version=server.version,
        build=server.build,
        commit=server.commit,
        version_error=server.error,
    )


# ----------------------------------------------------------------------------------------------
# Checking a command against a build.

# Flags without which the server would run a different placement or memory layout than the plan:
# they are never dropped. Everything else quantpick emits is a convenience (sampling defaults,
# template and reasoning handling, --fit off, the alias) and is dropped with a warning.
REQUIRED_FLAGS = frozenset(
    {
        "-m", "--model",
        "-c", "--ctx-size",
        "-np", "--parallel",
        "-ngl", "--n-gpu-layers", "--gpu-layers",
        "-ts", "--tensor-split",
        "-ncmoe", "--n-cpu-moe",
        "-cmoe", "--cpu-moe",
        "-ot", "--override-tensor",
        "-ctk", "--cache-type-k",
        "-ctv", "--cache-type-v",
        "-fa", "--flash-attn",
        "-ub", "--ubatch-size",
        "-b", "--batch-size",
        "-nkvo", "--no-kv-offload",
        "-dev", "--device",
        "-mm", "--mmproj",
        "--spec-type", "--spec-draft-n-max", "-ctkd", "-ctvd",
        "--spec-ngram-mod-n-min", "--spec-ngram-mod-n-max",
        "-md", "--model-draft", "-hfd", "--hf-repo-draft",
        "-ngld", "--gpu-layers-draft", "-devd", "--device-draft",
        "--host", "--port",
    }
)  # fmt: skip

# Flags quantpick itself emits that take a value: check_command uses this to step over values of
# flags the build does not know (it cannot ask the build how many tokens they take).
VALUE_FLAGS = frozenset(
    {
        "-m", "-c", "-np", "-ngl", "-ts", "--n-cpu-moe", "-ot", "-ctk", "-ctv", "-fa", "-ub", "-b",
        "--device", "--mmproj", "--spec-type", "--spec-draft-n-max", "-ctkd", "-ctvd",
        "--spec-ngram-mod-n-min", "--spec-ngram-mod-n-max", "-md", "-hfd", "-ngld", "-devd",
        "--fit", "--temp", "--top-p",
        "--top-k", "--min-p", "--reasoning-format", "--reasoning", "--host", "--port", "--alias",
        "--api-key-file",
    }
)  # fmt: skip

UPGRADE_HINT = (
    "upgrade llama.cpp (a release from after February 2026, b7988 or newer, has every flag "
    "quantpick uses), or point quantpick at a newer llama-server"
)


@dataclass(frozen=True)
class Problem:
    """One argument a build does not accept."""

    flag: str
    required: bool  # True: the plan cannot run without it (raise); False: drop it with a warning
    message: str
    value: str | None = None  # the value that went with the flag, if any


def check_command(argv: Sequence[str], caps: ServerCapabilities) -> list[Problem]:
    """Every argument of `argv` (program first) that `caps` does not accept (unknown flag, value,
    or choice)."""
    problems: list[Problem] = []
    argv = list(argv[1:])
    i = 0
    while i < len(argv):
        tok = argv[i]
        i += 1
        if not tok.startswith("-"):
            # llama-server has no positional arguments.
            problems.append(Problem(tok, True, f"unexpected argument {tok!r}"))
            continue
        info = caps.info(tok)
        required = tok in REQUIRED_FLAGS
        if info is None:
            value = None
            if tok in VALUE_FLAGS and i < len(argv):
                value = argv[i]
                i += 1
            problems.append(Problem(tok, required, f"{tok} is not an option of this build", value))
            continue
        if not info.takes_value:
            nxt = argv[i] if i < len(argv) else None
            if nxt is not None and not nxt.startswith("-"):
                i += 1
                problems.append(
                    Problem(tok, required, f"{tok} takes no value in this build (got {nxt!r})", nxt)
                )
            continue
        if i >= len(argv):
            problems.append(Problem(tok, required, f"{tok} needs a value"))
            continue
        value = argv[i]
        i += 1
        if not caps.accepts(tok, value):
            listed = ", ".join(info.choices or ())
            problems.append(
                Problem(tok, required, f"{tok} {value}: this build accepts {listed}", value)
            )
    return problems


def raise_for_required(problems: list[Problem], caps: ServerCapabilities) -> None:
    """Fail with an upgrade hint when any problem concerns a flag the plan cannot do without."""
    fatal = [p for p in problems if p.required]
    if fatal:
        listed = "; ".join(p.message for p in fatal)
        raise QuantpickError(f"{caps.describe()} cannot run this plan: {listed}", hint=UPGRADE_HINT)
