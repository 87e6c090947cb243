"""A launch script on disk: written atomically, mode 0755, and only over a file quantpick wrote
itself (its marker line), never a device, FIFO or directory."""

from __future__ import annotations

from pathlib import Path

from quantpick.errors import QuantpickError, UsageError
from quantpick.outputs import Existing

# The marker line of every file quantpick renders (script, systemd unit, compose file): a file
# holding it in its first bytes is one quantpick wrote, and may replace.
WRITTEN_BY = "# Written by quantpick."


_MARKER_SCAN_BYTES = 4096


def check_script_target(path: Path, *, force: bool = False) -> Existing:
    """What is at `path`, when quantpick may write the script there (quantpick.outputs' policy):
    absent, a regular file quantpick wrote (its marker line), or, with `force`, any regular file
    or a symbolic link (the link is replaced, never its target). A device, FIFO, socket or
    directory is never written over, even with `force` (as root, writing over /dev/null would
    turn it into a regular file). UsageError (exit 2) otherwise."""
    from quantpick.outputs import check_output

    existing = check_output(path, "--script", force=force)
    data = existing.data
    if data is not None and not force and WRITTEN_BY.encode() not in data[:_MARKER_SCAN_BYTES]:
        raise UsageError(
            f"--script {path}: exists and was not written by quantpick (no {WRITTEN_BY!r} line "
            "at its start); it is left as it is",
            hint="pass --force to replace it (the old file is kept as a backup), or choose "
            "another path",
        )
    return existing


def write_script(path: Path, text: str, *, force: bool = False) -> None:
    """Write `text` to `path` atomically with mode 0755, only where `check_script_target`
    allows (checked again here, just before the write). A file quantpick did not write, replaced
    with `force`, is kept as a backup first (FILE.bak, .bak.1, ...)."""
    from quantpick.outputs import write_output

    existing = check_script_target(path, force=force)
    theirs = existing.data is not None and WRITTEN_BY.encode() not in existing.data
    try:
        # surrogateescape: a path that is not UTF-8 (a model directory named in Latin-1) reaches
        # the script as the bytes it is on disk, which bash then opens as they are.
        data = text.encode("utf-8", "surrogateescape")
        write_output(path, data, existing, "the launch script", backup=theirs, mode=0o755)
    except QuantpickError as exc:
        if exc.hint is None or "choose a file" in exc.hint:
            exc.hint = "choose a --script path in a directory you can write to"
        raise
