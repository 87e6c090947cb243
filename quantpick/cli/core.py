"""The typer application and its error boundary; command modules register on `app`."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import typer
from typer.core import TyperGroup

from quantpick.errors import ExitCode, QuantpickError


def _debug() -> bool:
    return os.environ.get("QUANTPICK_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


class QuantpickGroup(TyperGroup):
    """Turns expected failures into `Error: ...` on stderr and the documented exit code.

    Done inside click's invoke so that CliRunner tests see the real exit codes.
    """

    def invoke(self, ctx: Any) -> Any:
        from quantpick.cli import output

        try:
            return super().invoke(ctx)
        except QuantpickError as exc:
            if _debug():
                traceback.print_exc()
            output.error(exc.message, exc.hint)
            raise typer.Exit(int(exc.exit_code)) from None
        except KeyboardInterrupt:
            sys.stderr.write("Interrupted.\n")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        except BrokenPipeError:
            # `quantpick ... | head`: stdout went away; nothing to report.
            try:
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the final flush
            except OSError:
                pass
            raise typer.Exit(int(ExitCode.ERROR)) from None


app = typer.Typer(
    cls=QuantpickGroup,
    name="quantpick",
    help=(
        "Pick the GGUF quant and llama.cpp placement that fits this machine and context, "
        "then download, verify and run it."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)


def version_callback(value: bool) -> None:
    if value:
        from quantpick import __version__

        typer.echo(f"quantpick {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """Pick the GGUF quant and llama.cpp placement that fits this machine and context."""
