"""The `serve` log is opened as quantpick.outputs.open_log opens a log (issue #26, "Writes"):
never truncated or written through a symlink planted at its path, never a FIFO (which hung the
start), a device or a hard link to another file."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from quantpick.errors import ExitCode, QuantpickError
from quantpick.serve import server as srv

SECRET = b"another file, not a log\n"


def _script(tmp_path: Path) -> list[str]:
    echo = tmp_path / "echo.sh"
    echo.write_text("#!/bin/sh\necho 'llama-server says hello'\n")
    echo.chmod(0o755)
    return [str(echo)]


def _launch_refused(argv: list[str], log: Path) -> QuantpickError:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["process"] = srv.launch(argv, {}, log, detach=False)
        except QuantpickError as exc:
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():  # open a reader so the blocked open returns, then fail
        os.close(os.open(log, os.O_RDONLY | os.O_NONBLOCK))
        pytest.fail("launch hung on the log path")
    assert "process" not in box, "llama-server was started with its log through a link"
    error = box["error"]
    assert isinstance(error, QuantpickError) and error.exit_code == ExitCode.ERROR
    assert "\n" not in error.message and str(log) in error.message
    return error


def test_a_symlink_at_the_log_path_is_never_truncated_or_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(SECRET)
    log = tmp_path / "tiny-8080.log"
    log.symlink_to(victim)
    error = _launch_refused(_script(tmp_path), log)
    assert "is a symbolic link" in error.message
    assert victim.read_bytes() == SECRET and log.is_symlink()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")
def test_a_fifo_at_the_log_path_is_refused_at_once(tmp_path: Path) -> None:
    log = tmp_path / "tiny-8080.log"
    os.mkfifo(log)
    error = _launch_refused(_script(tmp_path), log)
    assert "is a FIFO" in error.message


def test_a_hard_link_at_the_log_path_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(SECRET)
    log = tmp_path / "tiny-8080.log"
    os.link(victim, log)
    error = _launch_refused(_script(tmp_path), log)
    assert "a hard link" in error.message and victim.read_bytes() == SECRET


def test_an_old_log_of_its_own_is_truncated_and_written(tmp_path: Path) -> None:
    log = tmp_path / "tiny-8080.log"
    log.write_text("the previous run's lines\n" * 100)
    process = srv.launch(_script(tmp_path), {}, log, detach=False)
    assert process.wait(30) == 0
    assert log.read_text() == "llama-server says hello\n"
