"""Where output goes: the result on stdout (a rich table, or one JSON document with --json);
progress, warnings and errors on stderr. rich is imported only when something is rendered.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

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


def stderr() -> Console:
    global _stderr
    if _stderr is None or _stderr.file is not sys.stderr:
        from rich.console import Console

        _stderr = Console(file=sys.stderr, highlight=False, soft_wrap=True)
    return _stderr


def print_json(document: dict[str, Any]) -> None:
    """Exactly one JSON document on stdout, with schema_version first."""
    doc = {"schema_version": SCHEMA_VERSION, **document}
    sys.stdout.write(json.dumps(doc, indent=2, default=_default) + "\n")
    sys.stdout.flush()


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


def error(message: str, hint: str | None = None) -> None:
    sys.stderr.write(f"Error: {message}\n")
    if hint:
        sys.stderr.write(f"Hint: {hint}\n")
    sys.stderr.flush()
