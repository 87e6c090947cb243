"""Command-line interface: parse, call the core, render. Command modules register on `app`."""

from __future__ import annotations

import importlib
import sys

from quantpick.cli.app import app
from quantpick.errors import ExitCode

# Each module registers its commands on `app` when imported, in this order (the order of --help).
# Their top-level imports stay light: hub clients, NVML and rich are imported inside commands.
for _module in ("probe", "models", "plan", "download", "run", "manifests"):
    importlib.import_module(f"quantpick.cli.{_module}")

__all__ = ["app", "main"]


def main() -> None:
    try:
        app(prog_name="quantpick")
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        sys.exit(int(ExitCode.INTERRUPTED))
