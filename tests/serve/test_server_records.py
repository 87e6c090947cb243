"""serve/server.py records against hostile input: `serve --stop` signals nothing it cannot prove
is the llama-server the record names (pid 0, 1, quantpick's own, a live stranger, a process in
another group, another executable, a record without a start time), and `serve --status/--stop`
say one line per malformed record (a JSON array, a string pid, huge numbers, missing keys, a
FIFO) and go on, printing aliases and log lines with terminal escapes escaped. Every process
here is a real child (`sleep`) that is asserted alive afterwards."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from quantpick.cli import app
from quantpick.config import load_settings
from quantpick.errors import QuantpickError
from quantpick.serve import processes as srv_procs
from quantpick.serve import server as srv
from quantpick.serve import server_records as srv_records

linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
SLEEP = shutil.which("sleep") or "/bin/sleep"
runner = CliRunner()


def _alive(process: subprocess.Popen[bytes]) -> bool:
    return process.poll() is None


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process that looks like one quantpick started: its own session, a recorded argv."""
    process = subprocess.Popen([SLEEP, "60"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def no_signals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """os.kill/os.killpg with a real signal are recorded and not sent (signal 0 is): a bug here
    must not take down the test run (killpg(0) is our own group, killpg(1) every process)."""
    sent: list[tuple[str, int, int]] = []
    real_kill = os.kill

    def kill(pid: int, signum: int) -> None:
        if signum == 0:
            real_kill(pid, 0)
        else:
            sent.append(("kill", pid, signum))

    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(os, "killpg", lambda pgid, signum: sent.append(("killpg", pgid, signum)))
    return sent


def _record(pid: int, argv: tuple[str, ...], **extra: Any) -> srv_records.ServerRecord:
    values: dict[str, Any] = {
        "alias": "tiny", "pid": pid, "host": "127.0.0.1", "port": 8080, "log": "l",
        "argv": argv, "started": 0.0, "detached": True, "quantpick_pid": 1,
        "start_ticks": srv_procs.process_start_ticks(pid) if pid > 0 else None,
    }  # fmt: skip
    values.update(extra)
    return srv_records.ServerRecord(**values)


def _own_argv() -> tuple[str, ...]:
    return tuple(Path("/proc/self/cmdline").read_bytes().decode().split("\0")[:-1])


@linux_only
@pytest.mark.parametrize("pid", [1, 0, -1, -os.getpgrp()])
def test_pid_1_0_and_negative_are_never_signalled(
    pid: int, tmp_path: Path, no_signals: list[tuple[str, int, int]]
) -> None:
    record = _record(pid, (SLEEP, "60"), start_ticks=srv_procs.process_start_ticks(1))
    with pytest.raises(QuantpickError, match=f"pid {pid} cannot be a server"):
        srv.stop_record(record, tmp_path)
    assert no_signals == []
    with pytest.raises(QuantpickError, match="refusing to signal process group"):
        srv._signal_group(min(pid, 1) if pid >= 0 else 0, signal.SIGTERM)


@linux_only
def test_quantpick_itself_is_never_signalled(
    tmp_path: Path, no_signals: list[tuple[str, int, int]]
) -> None:
    exact = _record(os.getpid(), _own_argv(), exe=os.path.realpath(sys.executable))
    with pytest.raises(QuantpickError, match="this quantpick itself"):
        srv.stop_record(exact, tmp_path)
    assert no_signals == []


@linux_only
def test_a_record_without_a_start_time_is_refused_with_what_to_do(
    sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    record = _record(sleeper.pid, (SLEEP, "60"), start_ticks=None)
    with pytest.raises(QuantpickError, match="no start time") as info:
        srv.stop_record(record, tmp_path)
    assert f"kill {sleeper.pid}" in (info.value.hint or "")
    assert _alive(sleeper)
    srv_records.write_record(tmp_path, record)
    scan = srv_records.scan_records(tmp_path)
    assert scan.records == [] and len(scan.problems) == 1
    assert "no start time" in scan.problems[0].line()
    assert srv_records.record_path(tmp_path, "tiny", 8080).exists()


@linux_only
def test_a_live_stranger_is_never_signalled(tmp_path: Path) -> None:
    # another executable at the recorded pid, with the right start time and its own session
    stranger = subprocess.Popen([SLEEP, "60"], start_new_session=True)
    try:
        fake = tmp_path / "llama-server"
        fake.write_text("#!/bin/sh\n")
        record = _record(stranger.pid, (str(fake), "-m", "x.gguf"))
        with pytest.raises(QuantpickError, match="not the recorded"):
            srv.stop_record(record, tmp_path)
        assert _alive(stranger)
        # the right executable, another command line
        other_argv = _record(stranger.pid, (SLEEP, "61"))
        with pytest.raises(QuantpickError, match="command line is not the recorded one"):
            srv.stop_record(other_argv, tmp_path)
        assert _alive(stranger)
    finally:
        stranger.kill()
        stranger.wait()


@linux_only
def test_a_process_in_a_group_quantpick_did_not_create_is_never_signalled(tmp_path: Path) -> None:
    # in the test's own group (no setsid): killpg(pid) would be a stranger's group, if any
    same_group = subprocess.Popen([SLEEP, "60"])
    # in a new session led by a shell: the sleep is a member, not the leader, of its group
    shell = subprocess.Popen(["sh", "-c", f"{SLEEP} 60 & echo $!; wait"], start_new_session=True,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert shell.stdout is not None
        member = int(shell.stdout.readline())
        for pid in (same_group.pid, member):
            record = _record(pid, (SLEEP, "60"))
            with pytest.raises(QuantpickError, match="not the session of its own"):
                srv.stop_record(record, tmp_path)
            assert srv_procs.proc_stat(pid) is not None and srv_procs.proc_stat(pid).state != "Z"  # type: ignore[union-attr]
        assert _alive(same_group) and _alive(shell)
    finally:
        for process in (same_group, shell):
            os.killpg(shell.pid, signal.SIGKILL) if process is shell else process.kill()
            process.wait()


@linux_only
def test_the_server_the_record_names_is_stopped(
    sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    record = _record(sleeper.pid, (SLEEP, "60"))
    srv_records.write_record(tmp_path, record)
    assert srv_records.list_records(tmp_path) == [record]
    assert srv.stop_record(record, tmp_path, grace_s=5) == "stopped"
    assert srv_procs.proc_stat(sleeper.pid) is None  # ended (and reaped by stop_process)
    assert srv_records.list_records(tmp_path) == [] and not any(tmp_path.iterdir())


# ---- malformed records -------------------------------------------------------------------------

GOOD = {"alias": "a", "pid": 4242, "host": "127.0.0.1", "port": 9, "log": "l", "argv": ["x"],
        "started": 0.0, "detached": True, "quantpick_pid": 1, "start_ticks": 5}  # fmt: skip
BAD = {
    "array": [GOOD],
    "string-pid": {**GOOD, "pid": "4242"},
    "float-pid": {**GOOD, "pid": 4242.0},
    "bool-pid": {**GOOD, "pid": True},
    "huge-pid": {**GOOD, "pid": 10**30},
    "pid-1": {**GOOD, "pid": 1},
    "pid-0": {**GOOD, "pid": 0},
    "negative-pid": {**GOOD, "pid": -1},
    "no-pid": {k: v for k, v in GOOD.items() if k != "pid"},
    "no-argv": {k: v for k, v in GOOD.items() if k != "argv"},
    "string-argv": {**GOOD, "argv": "llama-server"},
    "huge-port": {**GOOD, "port": 2**70},
    "nan-started": {**GOOD, "started": float("nan")},
    "string-ticks": {**GOOD, "start_ticks": "5"},
    "null": None,
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_records_are_refused_by_the_parser(name: str) -> None:
    with pytest.raises(srv_records.RecordError):
        srv_records.parse_record(BAD[name])


def _write_hostile_records(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, doc in BAD.items():
        (directory / f"{name}.json").write_text(json.dumps(doc))
    (directory / "deep.json").write_text("[" * 50_000 + "]" * 50_000)
    (directory / "digits.json").write_text('{"pid": ' + "9" * 5000 + "}")
    (directory / "binary.json").write_bytes(b"\xff\xfe\x00junk")
    (directory / "big.json").write_bytes(b" " * (srv_records.MAX_RECORD_BYTES + 10))
    os.mkfifo(directory / "fifo.json")
    (directory / "dir.json").mkdir()


def test_status_and_stop_say_one_line_per_bad_record_and_go_on(
    sleeper: subprocess.Popen[bytes],
) -> None:
    directory = load_settings().servers_dir
    _write_hostile_records(directory)
    count = len(list(directory.glob("*.json")))
    result = runner.invoke(app, ["serve", "--status"])
    assert result.exit_code == 0 and result.exception is None, result.exception
    skipped = [x for x in result.stderr.splitlines() if x.startswith("skipping server record")]
    assert len(skipped) == count, result.stderr
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["serve", "--stop", "--json"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    skipped = [x for x in result.stderr.splitlines() if x.startswith("skipping server record")]
    assert len(skipped) == count
    assert _alive(sleeper)
    assert len(list(directory.glob("*.json"))) == count  # nothing the user may want is deleted


@linux_only
def test_aliases_and_log_lines_with_terminal_escapes_are_shown_escaped(
    sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    directory = load_settings().servers_dir
    alias = "x\x1b]0;pwned\x07\x1b[2J\x9b31m\u202eevil"
    srv_records.write_record(
        directory, _record(sleeper.pid, (SLEEP, "60"), alias=alias, log="l\x1b[1A")
    )
    result = runner.invoke(app, ["serve", "--status"])
    assert result.exit_code == 0, result.output
    for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert raw not in result.stdout
    assert "x\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202eevil" in result.stdout
    log = tmp_path / "server.log"
    log.write_text("load: \x1b]8;;http://x\x07error\x1b]8;;\x07 \x1b[31mfailed\u202e\n")
    lines = srv.failure_lines(srv.log_tail(log))
    assert lines == ("load: error failed",)
