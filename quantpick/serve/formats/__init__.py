"""The ways quantpick writes the llama-server command of a plan (`--format`), one module per
format, found through this registry (the way hub kinds are: quantpick/hub/kinds.py).

    names()                      # ("line", "script", ..., "lmstudio"): --format's choices
    output_format("systemd")     # the systemd module's FORMAT (an OutputFormat)

This module is data and imports nothing heavy: shell completion and --help read it before any
format module is loaded. Each entry names the module that defines `FORMAT`; adding a format (a
KoboldCpp or vLLM launch line) is that module and one entry below. A format that writes into a
file of its own (`--preset FILE`) also names that option here, and the CLI declares it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quantpick.serve.formats.base import OutputFormat


@dataclass(frozen=True)
class FormatEntry:
    name: str  # the --format value
    summary: str  # said after the name in --format's help ("" for none)
    module: str  # quantpick.serve.formats.<module> defines FORMAT
    file_option: str | None = None  # the option naming the file this format writes into


REGISTRY: tuple[FormatEntry, ...] = (
    FormatEntry("line", "default", "line"),
    FormatEntry("script", "", "script"),
    FormatEntry("json", "", "json_doc"),
    FormatEntry("env", "LLAMA_ARG_*", "env"),
    FormatEntry("systemd", "a user unit", "systemd"),
    FormatEntry("compose", "docker compose, official llama.cpp image", "compose"),
    FormatEntry("preset", "a llama.cpp router INI section, --preset FILE", "preset", "--preset"),
    FormatEntry("llama-swap", "a models entry", "llama_swap", "--swap-config"),
    FormatEntry("ollama", "a Modelfile", "ollama", "--modelfile"),
    FormatEntry("lmstudio", "links the file into LM Studio's models folder", "lmstudio"),
)
DEFAULT = "line"


def names() -> tuple[str, ...]:
    return tuple(e.name for e in REGISTRY)


def entry(name: str) -> FormatEntry:
    """The registry's entry for `name`; an unknown name is a UsageError listing the known ones."""
    for e in REGISTRY:
        if e.name == name:
            return e
    from quantpick.errors import UsageError

    raise UsageError(f"--format {name}: use one of " + ", ".join(names()))


def output_format(name: str) -> OutputFormat:
    """The format's module, loaded on first use."""
    import importlib

    found = entry(name)
    module = importlib.import_module(f"{__name__}.{found.module}")
    fmt: OutputFormat = module.FORMAT
    return fmt


def help_text() -> str:
    """--format's help: every format, with its summary, in registry order."""
    words = [f"{e.name} ({e.summary})" if e.summary else e.name for e in REGISTRY]
    return ", ".join(words[:-1]) + " or " + words[-1] + "."
