"""Command-line interface: parse, call the core, render. Command modules register on `app`.

`from quantpick.cli import app` gives the application with every command. `main()`, the console
script, loads only the module of the command being run: shells and scripts call the CLI often,
and building every command's options costs more than the command itself (benchmarks/startup.py).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from quantpick.errors import ExitCode

# In --help order. Each module registers its commands on quantpick.cli.core.app when imported;
# their top-level imports stay light (hub clients, NVML and rich load inside the commands).
MODULES = (
    "probe",
    "models",
    "estimate",
    "plan",
    "download",
    "run",
    "confirm",
    "bench",
    "manifests",
)
COMMAND_MODULE = {
    "probe": "probe",
    "models": "models",
    "show": "models",
    "estimate": "estimate",
    "pick": "plan",
    "max-context": "plan",
    "download": "download",
    "verify": "download",
    "command": "run",
    "get": "run",
    "confirm": "confirm",
    "bench": "bench",
    "manifest": "manifests",
}

__all__ = ["app", "main", "load_commands"]


def load_commands(modules: tuple[str, ...] = MODULES) -> Any:
    for module in modules:
        importlib.import_module(f"quantpick.cli.{module}")
    from quantpick.cli.core import app

    return app


def __getattr__(name: str) -> Any:
    if name == "app":
        return load_commands()
    raise AttributeError(name)


def _modules_for(argv: list[str]) -> tuple[str, ...]:
    """The command modules a run needs: one for a known command, all for help and completion."""
    if any(v.endswith("_COMPLETE") for v in os.environ if v.startswith("_QUANTPICK")):
        return MODULES
    first = next((a for a in argv if not a.startswith("-")), None)
    module = COMMAND_MODULE.get(first or "")
    return (module,) if module else MODULES


def main() -> None:
    try:
        load_commands(_modules_for(sys.argv[1:]))(prog_name="quantpick")
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        sys.exit(int(ExitCode.INTERRUPTED))
