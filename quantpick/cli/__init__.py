"""Command-line interface: parse, call the core, render. Command modules register on `app`."""

from __future__ import annotations

import sys

# Each module registers its commands on `app` when imported. Keep their top-level imports light:
# hub clients, NVML and rich progress are imported inside the commands that use them.
from quantpick.cli import models as _models  # noqa: E402,F401  (models, show)
from quantpick.cli import plan as _plan  # noqa: E402,F401  (estimate, pick, max-context)
from quantpick.cli import probe as _probe  # noqa: E402,F401  (probe)
from quantpick.cli.app import app
from quantpick.errors import ExitCode

__all__ = ["app", "main"]


def main() -> None:
    try:
        app(prog_name="quantpick")
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        sys.exit(int(ExitCode.INTERRUPTED))
