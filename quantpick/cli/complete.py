"""Shell completion of option values, answered before typer is imported.

Every Tab runs `quantpick` anew. Building the CLI (typer, click, the command's options) costs
~120 ms of CPU before anything is completed, so the values that follow an option (`--quant <Tab>`,
`--gpu`, `--prefer`, `--format`, `-ctk`, `--source`, ...) and MODEL right after its command are
answered here from plain tables, in the same output format as typer's completion classes; so
are command names for bash (zsh and fish show each command's help, which typer has). Anything
else (option names) falls through to typer.
tests/cli/test_completions.py checks that both give the same answers and that OPTION_VALUES
matches the commands' real options.

This module imports neither typer nor rich; the value lists are the ones the options use.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable

from quantpick.hub.kinds import REPOSITORY_KINDS, SOURCE_KINDS
from quantpick.serve import formats

Item = tuple[str, "str | None"]  # (value, help shown by zsh and fish)

PREFER_CHOICES = ("balanced", "quality", "speed")
FLASH_ATTN_CHOICES = ("on", "off", "auto")
SOURCE_CHOICES = ("auto", *SOURCE_KINDS)  # hub/kinds.py
MANIFEST_SOURCE_CHOICES = REPOSITORY_KINDS
FORMATS = formats.names  # serve/formats/__init__.py, the formats' registry
MODEL_SOURCES = ("local", "hf")
# --spec: the speculation modes a planning command takes (plan/speculative.py SpecMode, less
# those that need what the command cannot give), and the kinds `estimate --spec` sizes.
SPEC_CHOICES = ("auto", "off", "mtp", "draft", "ngram")
ESTIMATE_SPEC_CHOICES = ("off", "mtp", "ngram")

PLANNING = ("pick", "max-context", "command", "get", "confirm", "bench", "serve")


def kv_types() -> tuple[str, ...]:
    from quantpick.model.ggml import KV_CACHE_TYPES

    return KV_CACHE_TYPES


def gpu_items(incomplete: str) -> list[Item]:
    """--gpu: the catalogue's names (NAME, before any :VRAM), with the card's full name."""
    if ":" in incomplete:
        return []
    from quantpick.machine.catalog import find_gpu, known_names

    items: list[Item] = []
    for name in known_names():
        if name.startswith(incomplete.lower()):
            model = find_gpu(name)
            items.append((name, model.name if model is not None else None))
    return items


def quant_items(words: list[str], incomplete: str) -> list[Item]:
    """--quant: the quants of the MODEL typed so far (any word naming a known manifest by id,
    alias or repo), best first, with the quant's total size."""
    from quantpick.model.registry import list_manifests
    from quantpick.units import gb

    wanted = [w.lower() for w in words if w and not w.startswith("-")]
    for m in list_manifests(errors=[]):
        names = {m.id.lower(), *(a.lower() for a in m.aliases)}
        names |= {s.repo.lower() for s in m.sources if s.repo}
        if any(w in names for w in wanted):
            return [
                (q, gb(sum(f.size_bytes for f in m.quant_files(q))))
                for q in m.quants
                if q.lower().startswith(incomplete.lower())
            ]
    return []


def _fixed(values: Callable[[], tuple[str, ...]] | tuple[str, ...]) -> Callable[..., list[Item]]:
    def complete(words: list[str], incomplete: str) -> list[Item]:
        choices = values() if callable(values) else values
        return [(v, None) for v in choices if v.startswith(incomplete)]

    return complete


# option -> ((commands that take it, how to complete its value), ...)
OPTION_VALUES: dict[str, tuple[tuple[tuple[str, ...], Callable[..., list[Item]]], ...]] = {
    "--prefer": ((PLANNING, _fixed(PREFER_CHOICES)),),
    "-fa": ((("pick", "estimate"), _fixed(FLASH_ATTN_CHOICES)),),
    "--flash-attn": ((("pick", "estimate"), _fixed(FLASH_ATTN_CHOICES)),),
    "-ctk": ((("estimate",), _fixed(kv_types)),),
    "--cache-type-k": ((("estimate",), _fixed(kv_types)),),
    "-ctv": ((("estimate",), _fixed(kv_types)),),
    "--cache-type-v": ((("estimate",), _fixed(kv_types)),),
    "--kv": (((*PLANNING, "check"), _fixed(kv_types)),),
    "--format": ((("command", "get"), _fixed(FORMATS)),),
    "--model-source": ((("command", "get"), _fixed(MODEL_SOURCES)),),
    "--source": (
        (("download", "get", "serve"), _fixed(SOURCE_CHOICES)),
        (("manifest add",), _fixed(MANIFEST_SOURCE_CHOICES)),
    ),
    "--gpu": (
        (
            ("probe", "estimate", "pick", "max-context", "command", "get", "check"),
            lambda words, incomplete: gpu_items(incomplete),
        ),
    ),
    "--spec": (
        (("pick", "command", "get", "serve", "bench"), _fixed(SPEC_CHOICES)),
        (("estimate",), _fixed(ESTIMATE_SPEC_CHOICES)),
    ),
    "--quant": ((("estimate", "download", *PLANNING, "check"), quant_items),),
    "-q": ((("estimate", *PLANNING, "check"), quant_items),),
}


def completion_args(shell: str) -> tuple[list[str], str]:
    """(words before the one being completed, that word), as typer's completion classes read
    them from the environment the completion scripts set."""
    if shell == "bash":
        words = shlex.split(os.environ.get("COMP_WORDS", ""))
        cword = int(os.environ.get("COMP_CWORD", "0"))
        return words[1:cword], (words[cword] if cword < len(words) else "")
    line = os.environ.get("_TYPER_COMPLETE_ARGS", "")
    words = shlex.split(line)[1:]
    if shell == "powershell":
        incomplete = os.environ.get("_TYPER_COMPLETE_WORD_TO_COMPLETE", "")
        return (words[:-1] if incomplete else words), incomplete
    if words and not line.endswith(" "):
        return words[:-1], words[-1]
    return words, ""


def _command(args: list[str]) -> str | None:
    first = next((a for a in args if not a.startswith("-")), None)
    if first in ("manifest", "calibration"):
        rest = args[args.index(first) + 1 :]
        sub = next((a for a in rest if not a.startswith("-")), None)
        return f"{first} {sub}" if sub else None
    return first


# Commands whose first argument is MODEL (a manifest id).
MODEL_COMMANDS = (
    "show", "estimate", "pick", "max-context", "download", "command", "get", "serve", "confirm",
    "bench",
)  # fmt: skip


def model_items(incomplete: str) -> list[Item]:
    """MODEL: the ids of the manifests quantpick knows."""
    from quantpick.model.registry import list_manifests

    return [(m.id, None) for m in list_manifests(errors=[]) if m.id.startswith(incomplete)]


# In `quantpick --help` order (cli.MODULES / COMMAND_MODULE; a test compares with typer's list).
COMMANDS = ("probe", "models", "show", "estimate", "pick", "max-context", "download", "verify",
            "command", "get", "serve", "check", "confirm", "bench", "calibration",
            "manifest")  # fmt: skip
MANIFEST_COMMANDS = ("add", "check")
CALIBRATION_COMMANDS = ("list", "show", "reset")


def command_items(args: list[str], incomplete: str) -> list[Item] | None:
    """A command name (bash only: zsh and fish also show each command's help, which typer has)."""
    if incomplete.startswith("-") or any(a.startswith("-") for a in args):
        return None
    if not args:
        return [(c, None) for c in COMMANDS if c.startswith(incomplete)]
    if args == ["manifest"]:
        return [(c, None) for c in MANIFEST_COMMANDS if c.startswith(incomplete)]
    if args == ["calibration"]:
        return [(c, None) for c in CALIBRATION_COMMANDS if c.startswith(incomplete)]
    return None


def value_items(args: list[str], incomplete: str) -> list[Item] | None:
    """The values for the option just before the cursor, or MODEL right after its command, or
    None: not one answered here."""
    if incomplete.startswith("-"):
        return None
    if len(args) == 1 and args[0] in MODEL_COMMANDS:
        return model_items(incomplete)
    if not args or not args[-1].startswith("-"):
        return None
    command = _command(args[:-1])
    for commands, complete in OPTION_VALUES.get(args[-1], ()):
        if command in commands:
            return complete(args[:-1], incomplete)
    return None


def _zsh(items: list[Item]) -> str:
    def escape(s: str) -> str:  # typer's ZshComplete.format_completion
        return (
            s.replace('"', '""').replace("'", "''").replace("$", "\\$").replace("`", "\\`")
            .replace(":", r"\\:")
        )  # fmt: skip

    if not items:
        return "_files"
    lines = [f'"{escape(v)}":"{escape(h)}"' if h else f'"{escape(v)}"' for v, h in items]
    return "_arguments '*: :((" + "\n".join(lines) + "))'"


def fast_complete(shell: str) -> tuple[str, int] | None:
    """(text for stdout, exit code) when the answer is an option's value; None otherwise."""
    try:
        args, incomplete = completion_args(shell)
        items = value_items(args, incomplete)
        if items is None and shell == "bash":
            items = command_items(args, incomplete)
    except Exception:  # anything odd: let typer answer (it never prints a traceback either)
        return None
    if items is None:
        return None
    if shell == "bash":
        return "\n".join(v for v, _ in items) + "\n", 0
    if shell == "zsh":
        return _zsh(items) + "\n", 0
    if shell == "fish":
        if os.environ.get("_TYPER_COMPLETE_FISH_ACTION") == "is-args":
            return "", 0 if items else 1
        lines = [v + "\t" + re.sub(r"\s", " ", h) if h else v for v, h in items]
        return ("\n".join(lines) + "\n") if lines else "\n", 0
    if shell == "powershell":
        return "\n".join(f"{v}:::{h or ' '}" for v, h in items) + "\n", 0
    return None


def source_script(shell: str) -> str | None:
    """What `_QUANTPICK_COMPLETE=source_<shell> quantpick` prints: typer's completion script for
    that shell, as committed in completions/ (scripts/gen_completions.py). Not click's own
    `source` text, which starts with a blank line: zsh's compinit reads `#compdef` only on the
    first line, so a file written from it is ignored and Tab does nothing. None: not a shell
    typer knows (click then answers)."""
    from typer._completion_shared import _completion_scripts, get_completion_script

    if shell not in _completion_scripts:
        return None
    return get_completion_script(prog_name="quantpick", complete_var="_QUANTPICK_COMPLETE",
                                 shell=shell) + "\n"  # fmt: skip
