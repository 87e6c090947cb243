"""What every output format shares: its input (`Emission`), its result (`Emitted`), how it speaks
to the user (`Reporter`: warnings and notes on stderr, in order, as it goes), the options of the
formats that write into another tool's files (`EcosystemOptions`), and the quoting and word
helpers that more than one format uses. Pure: a format that writes a file does so through
serve/formats/config_file.py or serve/script_file.py."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.serve.command import ServerCommand, check_env_name

if TYPE_CHECKING:
    from quantpick.outputs import Written
    from quantpick.serve.formats.target import Target
    from quantpick.serve.workers import WorkerCommand

# Flags build_command writes without a value (everything else it writes takes exactly one).
VALUELESS = frozenset({"-kvu", "-nkvo", "--cpu-moe", "--jinja", "--no-mmproj", "--no-jinja"})


@dataclass(frozen=True)
class Reporter:
    """Where a format's lines for the user go (the CLI: stderr), as it goes, so that what it
    said before a failure stays said."""

    warn: Callable[[str], None]
    note: Callable[[str], None]

    def written(self, what: str, written: Written) -> None:
        """`Wrote ...` or `Unchanged: ...` for a file a format wrote (config_file.ConfigFile)."""
        if not written.changed:
            self.note(f"Unchanged: {what} {written.path} already says this")
            return
        kept = f" (the previous version: {written.backup})" if written.backup else ""
        self.note(f"Wrote {what} {written.path}{kept}")


@dataclass(frozen=True)
class EcosystemOptions:
    """The options of the formats that hand the plan to another tool."""

    file: Path | None = None  # the format's own file (--preset, --swap-config, --modelfile)
    ttl: int = 900  # serve.formats.llama_swap.SWAP_TTL_S
    dry_run: bool = False  # show what would be written, write nothing
    host: str = "127.0.0.1"
    port: int = 8080
    force: bool = False  # replace a file, section or entry quantpick did not write


@dataclass(frozen=True)
class Emission:
    """What a format writes from: the checked command and what else the user asked for."""

    cmd: ServerCommand
    comment: str  # the plan, in one paragraph
    name: str  # the model's name (--alias, else its id)
    workers: tuple[WorkerCommand, ...] = ()  # the RPC workers' lines, started first elsewhere
    machine_gpus: tuple[int, ...] = ()  # the machine's usable GPUs (compose reserves them)
    script: Path | None = None  # --script: the launcher written beside the output
    options: EcosystemOptions = field(default_factory=EcosystemOptions)
    target_of: Callable[[ServerCommand], Target] | None = None  # for formats that use a Target

    def target(self) -> Target:
        assert self.target_of is not None, "a format that uses a Target is given one"
        return self.target_of(self.cmd)


@dataclass(frozen=True)
class Emitted:
    """What a format produced: `stdout` (or, for `json`, a `document` printed as JSON) when the
    command runs without --json, and `rendered`, its part of the --json document."""

    stdout: str = ""
    document: dict[str, Any] | None = None
    rendered: dict[str, Any] | None = None


class OutputFormat:
    """One --format. Its module defines `FORMAT`, an instance; the registry
    (serve/formats/__init__.py) names the module."""

    name = ""
    uses_target = False  # hands the plan to another tool: emit reads `Emission.target()`
    needs_file = False  # the model file on disk (not --model-source hf)
    reads_template = False  # the Target carries the GGUF's chat template

    def check(self, options: EcosystemOptions) -> None:
        """The format's own options, before any planning or download."""

    def target_name(self, model_id: str, alias: str | None, say: Reporter) -> str:
        """The name the other tool knows the model by."""
        return alias or model_id

    def emit(self, job: Emission, say: Reporter) -> Emitted:
        raise NotImplementedError


def text_output(text: str) -> Emitted:
    """A format whose output is one text: on stdout, and as `rendered.text` with --json."""
    return Emitted(stdout=text, rendered={"text": text})


def assignments(cmd: ServerCommand) -> list[str]:
    parts = [f"{check_env_name(k, 'env')}={shlex.quote(v)}" for k, v in cmd.env.items()]
    # "$NAME" expands at run time; NAME is validated, so nothing else can be injected.
    parts += [
        f'{check_env_name(k, "env")}="${check_env_name(src, "env")}"' for k, src in cmd.env_from
    ]
    return parts


def flag_groups(argv: tuple[str, ...]) -> list[list[str]]:
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


def flag_pairs(cmd: ServerCommand) -> list[tuple[str, str | None]]:
    """The command's (flag, value) pairs, in order, without the program."""
    words = list(cmd.argv[1:])
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        flag = words[i]
        if flag in VALUELESS or i + 1 >= len(words):
            out.append((flag, None))
            i += 1
        else:
            out.append((flag, words[i + 1]))
            i += 2
    return out


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
