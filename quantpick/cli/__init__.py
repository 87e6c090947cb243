"""Command-line interface: parse, call the core, render. Command modules register on `app`.

`from quantpick.cli import app` gives the application with every command. `main()`, the console
script, loads only the module of the command being run: shells and scripts call the CLI often,
and building every command's options costs more than the command itself (benchmarks/startup.py).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from quantpick.answers import Recorder

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
    "serve",
    "check",
    "confirm",
    "bench",
    "calibration",
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
    "serve": "serve",
    "check": "check",
    "confirm": "confirm",
    "bench": "bench",
    "calibration": "calibration",
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


def completion_args() -> list[str]:
    """The words before the one being completed (as typer's completion classes read them)."""
    import shlex

    if "COMP_WORDS" in os.environ:  # bash
        try:
            words = shlex.split(os.environ["COMP_WORDS"])
            return words[1 : int(os.environ.get("COMP_CWORD", "0"))]
        except ValueError:
            return []
    line = os.environ.get("_TYPER_COMPLETE_ARGS", "")  # zsh, fish, powershell
    try:
        words = shlex.split(line)[1:]
    except ValueError:
        return []
    return words if line.endswith(" ") else words[:-1]


def _modules_for(argv: list[str]) -> tuple[str, ...]:
    """The command modules a run needs: one for a known command, all for help and for completing
    a command name. Completing inside a command (its options, MODEL, --quant) loads only that
    command's module: each Tab is a new process, and building every command costs ~70 ms."""
    if any(v.endswith("_COMPLETE") for v in os.environ if v.startswith("_QUANTPICK")):
        argv = completion_args()
    first = next((a for a in argv if not a.startswith("-")), None)
    module = COMMAND_MODULE.get(first or "")
    return (module,) if module else MODULES


def main() -> None:
    shell = os.environ.get("_QUANTPICK_COMPLETE", "")
    if shell.startswith("source_"):
        from quantpick.cli.complete import source_script

        script = source_script(shell.removeprefix("source_"))
        if script is not None:
            sys.stdout.write(script)
            sys.stdout.flush()
            sys.exit(0)
    if shell.startswith("complete_"):
        # The value after an option (`--quant <Tab>`) is answered without building the CLI.
        from quantpick.cli.complete import fast_complete

        answer = fast_complete(shell.removeprefix("complete_"))
        if answer is not None:
            sys.stdout.write(answer[0])
            sys.stdout.flush()
            sys.exit(answer[1])
    argv = sys.argv[1:]
    recorder = recording(argv)
    try:
        guarded(lambda: load_commands(_modules_for(argv))(prog_name="quantpick"))
    except SystemExit as exc:
        if recorder is not None:
            store(recorder, exit_status(exc))
        raise
    if recorder is not None:
        store(recorder, 0)


# The command modules whose commands quantpick/answers.py may replay (pick, max-context,
# estimate): the other commands do not import it.
ANSWERING_MODULES = (("plan",), ("estimate",))


def recording(argv: list[str]) -> Recorder | None:
    """Replay the stored answer for `argv` and exit when every input it read is unchanged;
    else the recorder of this run (None: a command or a run whose answer is not kept)."""
    if _modules_for(argv) not in ANSWERING_MODULES:
        return None
    from quantpick import answers

    if not answers.enabled(argv, os.environ):
        return None
    stored = answers.lookup(argv, os.environ)
    if stored is not None:

        def replay() -> None:
            assert stored is not None
            code = stored.replay(sys.stdout, sys.stderr)
            debug("answer replayed: no input changed since it was recorded (answers.py)")
            sys.exit(code)

        guarded(replay)  # exits with the stored code
    recorder = answers.Recorder(argv, os.environ)
    recorder.start()
    return recorder


def debug(line: str) -> None:
    if os.environ.get("QUANTPICK_DEBUG", "").strip().lower() in ("1", "true", "yes", "on"):
        sys.stderr.write(f"debug: {line}\n")


def store(recorder: Recorder, exit_code: int) -> None:
    """Keep the run's answer for replay when its output went out whole."""
    from quantpick.cli.output import GuardedStream

    if any(
        isinstance(s, GuardedStream) and (s.closed_by_reader or s.failure is not None)
        for s in (sys.stdout, sys.stderr)
    ):
        recorder.stop()
        debug("answer not stored: the output did not go out whole")
        return
    path = recorder.save(exit_code)
    debug(f"answer stored at {path}" if path else f"answer not stored: {recorder.why_not}")


def exit_status(exc: SystemExit) -> int:
    """The process's exit status for `exc` (None: 0; a message: 1, as the interpreter does)."""
    return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1


def guarded(call: Callable[[], Any]) -> None:
    """`call` (the CLI, or a replayed answer) with stdout and stderr guarded: a reader that
    leaves early is absorbed, a failed write is one `Error:` line and exit 1."""
    from quantpick.cli.output import GuardedStream, OutputError

    # The commands run inside cli.core's boundary; these guards also cover what click prints
    # before a command starts (`quantpick --help | head -1`, `quantpick --version > /dev/full`).
    sys.stdout = GuardedStream(sys.stdout, "<stdout>", raise_errors=True)
    sys.stderr = GuardedStream(sys.stderr, "<stderr>", raise_errors=False)
    try:
        try:
            call()
        finally:
            sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        sys.exit(int(ExitCode.INTERRUPTED))
    except OutputError as exc:
        if isinstance(sys.stdout, GuardedStream):
            sys.stdout.acknowledge()
        sys.stderr.write(f"Error: cannot write the output: {exc.strerror}: {exc.filename}\n")
        sys.exit(int(ExitCode.ERROR))
