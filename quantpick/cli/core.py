"""The typer application and its error boundary; command modules register on `app`.

The boundary (QuantpickGroup.invoke) turns every expected failure into one `Error: ...` line on
stderr (plus `Hint: ...`) and the documented exit code, never a traceback:

- QuantpickError: its message, hint and exit code; exit 2 instead of 1 when it carries the path
  and OS error it is about (`path`, `os_errno`) and that is a path the user gave that is plainly
  wrong, as for an OSError. A hint that names an option the running command does not have is
  replaced by "see `quantpick CMD --help`" (the hint was written for another command).
- click's own usage errors (an unknown option, `-np x`): the same one line and a hint, exit 2,
  never click's four lines of usage.
- OSError (a path that cannot be read or written): `Error: <strerror>: <path>`, exit 2 when the
  path is one the user gave on the command line and the error says it is plainly wrong
  (missing, not a directory, read-only, too long, ...), else exit 1.
- A closed stdout (`| head -1`): the rest of the output is dropped and the command ends with its
  own exit code (0 when it succeeded); a stdout that cannot be written (`> /dev/full`): one
  line, exit 1 (cli.output.GuardedStream).
- Ctrl-C: `Interrupted.`, exit 130.

With --json (or --format json) a failure also prints one JSON document on stdout, unless the
command already printed its result there: `{"schema_version": 1, "error": {"message", "hint",
"exit_code", "type"}}`. Usage errors found by click (a bad option value) get the same document.
QUANTPICK_DEBUG=1 adds the traceback on stderr.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import traceback
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from quantpick.errors import ExitCode, QuantpickError

try:  # recent typer carries its own copy of click: its exceptions are the ones raised here
    from typer._click import ClickException, Context
    from typer._click.exceptions import NoArgsIsHelpError
    from typer._click.exceptions import UsageError as ClickUsageError
    from typer._click.globals import get_current_context
except ImportError:  # pragma: no cover - older typer on the real click
    from click import (  # type: ignore[assignment,no-redef]
        ClickException,
        Context,
        get_current_context,
    )
    from click.exceptions import NoArgsIsHelpError  # type: ignore[assignment,no-redef]
    from click.exceptions import UsageError as ClickUsageError  # type: ignore[assignment]

# OSErrors that say a path given by the user is wrong (exit 2) rather than that something failed
# on the way (exit 1: ENOSPC, EIO, ...).
_USAGE_ERRNOS = frozenset(
    {
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ENAMETOOLONG,
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.EEXIST,
        errno.ELOOP,
    }
)


def _debug() -> bool:
    return os.environ.get("QUANTPICK_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def _wants_json(args: list[str]) -> bool:
    """--json or --format json among the command's arguments (before a lone `--`)."""
    words = args[: args.index("--")] if "--" in args else args
    for i, word in enumerate(words):
        if word == "--json" or word == "--format=json":
            return True
        if word == "--format" and i + 1 < len(words) and words[i + 1] == "json":
            return True
    return False


def _given_by_user(path: str, args: list[str]) -> bool:
    """Whether `path` is, or lies under, a path-like argument on the command line."""
    candidates = {a.split("=", 1)[1] if a.startswith("--") and "=" in a else a for a in args}
    target = os.path.normpath(os.path.abspath(path))
    for word in candidates:
        if not word or (word.startswith("-") and os.sep not in word):
            continue
        try:
            given = os.path.normpath(os.path.abspath(word))
        except (ValueError, OSError):
            continue
        if target == given or target.startswith(given.rstrip(os.sep) + os.sep):
            return True
    return False


# A long option named in prose: `--gguf PATH`, "(--dir)", `--rpc-device H:P=GPU`.
_FLAG_RE = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def flags_named(text: str | None) -> list[str]:
    """The long options a message or hint names, in order."""
    return _FLAG_RE.findall(text or "")


def command_options(command: Any) -> set[str]:
    """Every option spelling of a click command (--gguf, -c, --no-reuse, ..., --help)."""
    names: set[str] = {"-h", "--help"}  # the app's help_option_names, on every command
    for param in getattr(command, "params", ()):
        names.update(getattr(param, "opts", ()))
        names.update(getattr(param, "secondary_opts", ()))
    return names


def command_has_option(flag: str) -> bool:
    """Whether the command running now takes `flag` (True outside a command: a library call),
    for errors that offer an option only some commands have (`or --gguf PATH`)."""
    ctx = get_current_context(silent=True)
    if ctx is None:
        return True
    return flag in command_options(ctx.command)


# ctx.meta key (click shares meta with every nested context) of the command that is running.
_INVOKED = "quantpick.invoked"


def _invoked(ctx: Any) -> tuple[Any, str]:
    """The command that ran under the root `ctx` and its path ("quantpick pick"); the root
    itself when no command got as far as parsing its arguments."""
    inner = ctx.meta.get(_INVOKED, ctx)
    return inner.command, inner.command_path


def os_error_line(exc: OSError) -> tuple[str, str | None]:
    """`<strerror>: <path>` (and the second path of a rename) for an OSError."""
    what = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
    if exc.filename is None:
        return what, None
    path = os.fsdecode(exc.filename) if isinstance(exc.filename, bytes) else str(exc.filename)
    line = f"{what}: {path}"
    if exc.filename2 is not None:
        line += f" -> {exc.filename2}"
    return line, path


class QuantpickCommand(TyperCommand):
    """Usage lines in the usual UPPERCASE spelling (`quantpick show [OPTIONS] MODEL`), where typer
    writes `{model}` for a required argument and `[model]` for an optional one."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        ctx.meta[_INVOKED] = ctx  # the boundary checks its hints against this command
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = (param.metavar or param.name or "").strip("[]{}").upper()
                pieces.append(name if param.required else f"[{name}]")
        return pieces


class QuantpickTyper(typer.Typer):
    """typer.Typer whose commands use QuantpickCommand."""

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", QuantpickCommand)
        return super().command(*args, **kwargs)


class QuantpickGroup(TyperGroup):
    """Turns expected failures into `Error: ...` on stderr and the documented exit code.

    Done inside click's invoke so that CliRunner tests see the real exit codes.
    """

    def make_context(
        self, info_name: Any, args: list[str], parent: Any = None, **extra: Any
    ) -> Any:
        """The root's own parse (`quantpick --bogus`, `quantpick pikc`): one line, exit 2."""
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except NoArgsIsHelpError:
            raise
        except ClickUsageError as exc:
            from quantpick.cli import output

            message, hint = click_usage_line(exc)
            output.error(message, hint)
            if _wants_json(args):
                output.print_error_json(message, hint, exc.exit_code, type(exc).__name__)
            raise typer.Exit(exc.exit_code) from None

    def invoke(self, ctx: Any) -> Any:
        from quantpick.cli import output

        args = [*getattr(ctx, "_protected_args", []), *ctx.args]
        json_wanted = _wants_json(args)
        saved = sys.stdout, sys.stderr
        sys.stdout = output.GuardedStream(sys.stdout, "<stdout>", raise_errors=True)
        sys.stderr = output.GuardedStream(sys.stderr, "<stderr>", raise_errors=False)

        def fail(message: str, hint: str | None, code: int, kind: str) -> typer.Exit:
            if _debug():
                traceback.print_exc()
            command, path = _invoked(ctx)
            if any(flag not in command_options(command) for flag in flags_named(hint)):
                hint = f"see `{path} --help`"
            output.error(message, hint)
            if json_wanted:
                try:
                    output.print_error_json(message, hint, code, kind)
                except OSError:
                    pass  # stdout itself is what failed
            return typer.Exit(code)

        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a full disk shows here, inside the boundary, not at exit
            return result
        except QuantpickError as exc:
            code = int(exc.exit_code)
            if (
                code == ExitCode.ERROR
                and exc.path is not None
                and exc.os_errno in _USAGE_ERRNOS
                and _given_by_user(exc.path, args)
            ):
                code = int(ExitCode.USAGE)
            raise fail(exc.message, exc.hint, code, type(exc).__name__) from None
        except (typer.Exit, typer.Abort):
            raise
        except NoArgsIsHelpError:
            raise
        except ClickUsageError as exc:
            message, hint = click_usage_line(exc)
            raise fail(message, hint, exc.exit_code, type(exc).__name__) from None
        except ClickException as exc:
            # click prints its own message and usage; --json callers get the document as well
            if json_wanted:
                output.print_error_json(
                    exc.format_message(), None, exc.exit_code, type(exc).__name__
                )
            raise
        except KeyboardInterrupt:
            sys.stderr.write("Interrupted.\n")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        except output.OutputError as exc:
            line, _ = os_error_line(exc)
            if isinstance(sys.stdout, output.GuardedStream):
                sys.stdout.acknowledge()  # reported once, here
            raise fail(
                f"cannot write the output: {line}", None, int(ExitCode.ERROR), "OutputError"
            ) from None
        except OSError as exc:
            line, path = os_error_line(exc)
            code = ExitCode.ERROR
            if path is not None and exc.errno in _USAGE_ERRNOS and _given_by_user(path, args):
                code = ExitCode.USAGE
            raise fail(line, None, int(code), type(exc).__name__) from None
        finally:
            try:
                sys.stdout.flush()
            except OSError:
                pass
            sys.stdout, sys.stderr = saved


class HintedBadParameter(typer.BadParameter):
    """A value parser's error (options.context_value) with the hint of its UsageError."""

    def __init__(self, message: str, hint: str | None) -> None:
        super().__init__(message)
        self.hint = hint


def click_usage_line(exc: Any) -> tuple[str, str]:
    """click's usage error as one line and a hint (click prints usage, a blank line, the error
    and "Try ... for help": four lines)."""
    message = " ".join(exc.format_message().split())
    if isinstance(exc, HintedBadParameter) and exc.hint:
        return message, exc.hint
    path = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "quantpick"
    return message, f"see `{path} --help`"


app = QuantpickTyper(
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


def command_group(name: str, help: str) -> QuantpickTyper:
    """A command with subcommands (`quantpick calibration list`), added to `app`."""
    group = QuantpickTyper(help=help, no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(group, name=name)
    return group


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
