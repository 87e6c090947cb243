"""Where output goes: the result on stdout (a rich table, or one JSON document with --json);
progress, warnings and errors on stderr. rich is imported only when something is rendered.

While a command runs, stdout and stderr are `GuardedStream`s (cli.core installs them):
- a reader that went away (`quantpick pick ... | head -1`) is not an error: the rest of the output
  is dropped and the command finishes with its own exit code;
- any other write error on stdout (ENOSPC with `> /dev/full`, EIO) is raised as
  `OutputError`, which the CLI boundary turns into one `Error:` line and exit 1;
- stderr only carries progress, notes and errors: a write error there is dropped (there is
  nowhere left to report it), and the exit code still says how the command ended.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA_VERSION = 1

_stdout: Console | None = None
_stderr: Console | None = None


def stdout() -> Console:
    global _stdout
    if _stdout is None or _stdout.file is not sys.stdout:
        from rich.console import Console

        # Piped output (scripts, `| less`) gets room for the tables instead of rich's 80 columns.
        width = None if sys.stdout.isatty() else 160
        _stdout = Console(file=sys.stdout, highlight=False, soft_wrap=False, width=width)
    return _stdout


# stderr that is not a terminal (piped, a log file, a CI job) has no reader's width to fit: it is
# drawn this wide, so tables (llama.cpp's projection) keep every column whole instead of rich's
# 80-column default, and lines are never wrapped; trailing blanks (a table's padding) are cut.
LOG_WIDTH = 240
_stderr_target: Any = None


class TrimmedLines:
    """A text stream that writes each line without its trailing blanks (a partial line waits for
    its end, or for flush)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._partial = ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self.inner.write(line.rstrip(" ") + "\n")
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self.inner.write(self._partial)
            self._partial = ""
        self.inner.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, ...
        return getattr(self.inner, name)


def stderr() -> Console:
    global _stderr, _stderr_target
    if _stderr is None or _stderr_target is not sys.stderr:
        from rich.console import Console

        _stderr_target = sys.stderr
        if sys.stderr.isatty():
            _stderr = Console(file=sys.stderr, highlight=False, soft_wrap=True)
        else:
            trimmed: Any = TrimmedLines(sys.stderr)  # a text stream, duck-typed
            _stderr = Console(file=trimmed, highlight=False, soft_wrap=True, width=LOG_WIDTH)
    return _stderr


class OutputError(OSError):
    """Writing the result to stdout failed (not a closed pipe): the result is lost."""


class GuardedStream:
    """A text stream proxy that absorbs a closed pipe and keeps reporting any other write error.

    The error is sticky: once a write failed, every later write and flush raises again, so a
    caller that swallows one exception (click probes streams with throwaway writes) cannot lose
    it, and the boundary's final flush reports it.
    """

    def __init__(self, inner: IO[str], name: str, *, raise_errors: bool) -> None:
        self._inner = inner
        self._name = name  # "<stdout>" / "<stderr>", the `path` of an error line
        self._raise = raise_errors
        self.closed_by_reader = False
        self.failure: tuple[int, str] | None = None  # (errno, strerror) of a failed write
        self.wrote = False  # anything written: the result has (at least partly) gone out

    @property
    def inner(self) -> IO[str]:
        return self._inner

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno, buffer, ...
        return getattr(self._inner, name)

    def acknowledge(self) -> None:
        """The failure was reported: from now on drop the output quietly (down the chain)."""
        self._raise = False
        if isinstance(self._inner, GuardedStream):
            self._inner.acknowledge()

    def _check(self) -> bool:
        """True when output is to be dropped; raises again for a stream that failed."""
        if self.failure is not None and self._raise:
            raise OutputError(self.failure[0], self.failure[1], self._name)
        return self.closed_by_reader or self.failure is not None

    def _failed(self, exc: OSError) -> None:
        if exc.errno == errno.EPIPE or isinstance(exc, BrokenPipeError):
            self.closed_by_reader = True
            self._silence()
            return
        self.failure = (exc.errno or errno.EIO, exc.strerror or str(exc))
        # Nothing more can reach this descriptor; the interpreter's own flush at exit must not
        # fail again on what is still buffered.
        self._silence()
        self._check()

    def _silence(self) -> None:
        # Point the descriptor at /dev/null (Python's documented SIGPIPE recipe).
        try:
            fd = self._inner.fileno()
        except (AttributeError, OSError, ValueError):
            return
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        except OSError:
            pass

    def write(self, text: str) -> int:
        if self._check():
            return len(text)
        self.wrote = self.wrote or bool(text)
        try:
            return self._inner.write(text)
        except OSError as exc:
            self._failed(exc)
            return len(text)

    def flush(self) -> None:
        if self._check():
            return
        try:
            self._inner.flush()
        except OSError as exc:
            self._failed(exc)


def guarded_stdout() -> GuardedStream | None:
    return sys.stdout if isinstance(sys.stdout, GuardedStream) else None


def print_json(document: dict[str, Any]) -> None:
    """Exactly one JSON document on stdout, with schema_version first. Strict JSON: a NaN or an
    infinity (which json.dumps would write bare, and no JSON parser reads) becomes null, with a
    warning naming where it was."""
    doc = {"schema_version": SCHEMA_VERSION, **document}
    try:
        text = json.dumps(doc, indent=2, default=_default, allow_nan=False)
    except ValueError:
        where: list[str] = []
        text = json.dumps(_finite(doc, "", where), indent=2, default=_default, allow_nan=False)
        warn(f"not a number in the output, written as null: {', '.join(where[:5])}")
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _finite(obj: Any, path: str, where: list[str]) -> Any:
    """`obj` with every NaN and infinity replaced by None (their paths appended to `where`)."""
    import math

    if isinstance(obj, float) and not math.isfinite(obj):
        where.append(path or "(top)")
        return None
    if isinstance(obj, dict):
        return {k: _finite(v, f"{path}.{k}" if path else str(k), where) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v, f"{path}[{i}]", where) for i, v in enumerate(obj)]
    return obj


def _default(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "__fspath__"):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def warn(message: str) -> None:
    """One warning line on stderr."""
    sys.stderr.write(f"Warning: {message}\n")
    sys.stderr.flush()


def note(message: str) -> None:
    """One informational line on stderr (never on stdout, which carries the result)."""
    sys.stderr.write(f"{message}\n")
    sys.stderr.flush()


def error_document(message: str, hint: str | None, exit_code: int, kind: str) -> dict[str, Any]:
    """The one JSON document a failed command prints on stdout with --json (README, --json)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "error": {"message": message, "hint": hint, "exit_code": exit_code, "type": kind},
    }


def print_error_json(message: str, hint: str | None, exit_code: int, kind: str) -> None:
    """The error object on stdout, unless the command already printed its result there (that
    document then says what went wrong, e.g. `"ok": false`)."""
    guarded = guarded_stdout()
    if guarded is not None and guarded.wrote:
        return
    sys.stdout.write(json.dumps(error_document(message, hint, exit_code, kind), indent=2) + "\n")
    sys.stdout.flush()


def error(message: str, hint: str | None = None) -> None:
    sys.stderr.write(f"Error: {message}\n")
    if hint:
        sys.stderr.write(f"Hint: {hint}\n")
    sys.stderr.flush()
