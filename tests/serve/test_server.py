"""serve/server.py: ports, starting and stopping llama-server (the fake of
tests/fake_llama_server.py), the log lines shown on a failure, and the records `serve --status` /
`--stop` read."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_llama_server import fake_llama_server

from quantpick.errors import ServerError
from quantpick.serve import ports as srv_ports
from quantpick.serve import processes as srv_procs
from quantpick.serve import server as srv
from quantpick.serve import server_records as srv_records


def _listener(*, reuseport: bool = False) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if reuseport:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


def _argv(binary: Path, *extra: str):  # type: ignore[no-untyped-def]
    def argv_for_port(port: int) -> tuple[list[str], dict[str, str]]:
        return [str(binary), "-m", "/m.gguf", "--host", "127.0.0.1", "--port", str(port),
                "--alias", "tiny", *extra], {}  # fmt: skip

    return argv_for_port


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return srv._zombie(pid)


# ---- ports -----------------------------------------------------------------------------------


def test_a_free_port_is_kept_and_port_0_picks_one() -> None:
    port = srv_ports.free_port("127.0.0.1")
    assert srv_ports.choose_port("127.0.0.1", port) == (port, None)
    chosen, note = srv_ports.choose_port("127.0.0.1", 0)
    assert chosen > 0 and note == f"--port 0: using free port {chosen}"


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="no SO_REUSEPORT here")
def test_a_port_held_by_a_reuseport_listener_is_busy() -> None:
    """llama-server's cpp-httplib binds with SO_REUSEPORT, so a second llama-server would share
    the port silently: the check must see the first one."""
    with _listener(reuseport=True) as held:
        port = held.getsockname()[1]
        assert not srv_ports.port_is_free("127.0.0.1", port)
        chosen, note = srv_ports.choose_port("127.0.0.1", port)
        assert chosen != port and note == (
            f"port {port} is in use on 127.0.0.1: using free port {chosen}"
        )


def test_unix_socket_hosts_are_refused() -> None:
    from quantpick.errors import UsageError

    with pytest.raises(UsageError, match="over TCP"):
        srv_ports.check_host("/tmp/llama.sock")


# ---- the log ---------------------------------------------------------------------------------


def test_failure_lines_are_llama_cpps_own_last_relevant_lines() -> None:
    log = ["main: loading model", "llama_model_loader: - kv 0", "print_info: n_vocab = 4",
           "llama_model_load: error loading model: unknown model architecture: 'qwen35moe'",
           "llama_model_load_from_file_impl: failed to load model", "srv load_model: done",
           "main: exiting due to model loading error"]  # fmt: skip
    assert srv.failure_lines(log) == (log[3], log[4], log[6])
    assert srv.failure_lines(["a", "b"]) == ("a", "b")  # nothing says why: the last lines


def test_log_tail_drops_a_cut_first_line(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("first line that is long\nsecond\nthird\n")
    assert srv.log_tail(log, max_bytes=14) == ["second", "third"]
    assert srv.log_tail(tmp_path / "missing.log") == []


# ---- start, wait, stop -----------------------------------------------------------------------


def test_start_waits_for_health_and_writes_a_record(tmp_path: Path) -> None:
    binary = fake_llama_server(tmp_path / "bin", load_s=0.6)
    seen: list[float] = []
    running = srv.start_server(_argv(binary), host="127.0.0.1", port=0, alias="tiny",
                               directory=tmp_path / "run", detach=False,
                               on_wait=lambda s, line: seen.append(s))  # fmt: skip
    try:
        assert running.ready_s >= 0.5 and seen  # it answered 503 while "loading"
        assert srv.health_status(f"{running.record.base_url}/health") == 200
        [record] = srv_records.list_records(tmp_path / "run")
        assert record.pid == running.process.pid and record.port == running.record.port
        assert srv_records.is_alive(record)
    finally:
        assert srv.stop_process(running.process.pid) == "stopped"
        running.process.wait()
    assert srv_records.list_records(tmp_path / "run") == []  # a stale record is pruned


def test_a_failed_load_shows_llama_cpps_lines_and_leaves_no_process(tmp_path: Path) -> None:
    binary = fake_llama_server(
        tmp_path / "bin", load_s=0.2, fail="unknown model architecture: 'qwen35moe'"
    )
    with pytest.raises(ServerError) as info:
        srv.start_server(_argv(binary), host="127.0.0.1", port=0, alias="tiny",
                         directory=tmp_path / "run", detach=False)  # fmt: skip
    err = info.value
    assert err.exit_code == 8 and "exited with code 1" in err.message
    assert any("unknown model architecture" in line for line in err.log_lines)
    assert err.log_lines[-1] == "main: exiting due to model loading error"
    assert srv_records.list_records(tmp_path / "run") == []


def test_a_port_taken_before_llama_server_binds_it_is_retried(tmp_path: Path) -> None:
    binary = fake_llama_server(tmp_path / "bin", load_s=0.0)
    notes: list[str] = []
    with _listener() as held:
        taken = held.getsockname()[1]
        ports = iter([taken])

        def argv_for_port(port: int):  # type: ignore[no-untyped-def]
            # the first launch goes to a port someone else took meanwhile
            return _argv(binary)(next(ports, port))

        running = srv.start_server(argv_for_port, host="127.0.0.1", port=0, alias="tiny",
                                   directory=tmp_path / "run", detach=False,
                                   notes=notes)  # fmt: skip
    try:
        assert running.record.port != taken
        assert any("was taken before llama-server bound it" in n for n in notes)
    finally:
        srv.stop_process(running.process.pid)
        running.process.wait()


def test_no_answer_in_time_stops_the_process(tmp_path: Path) -> None:
    binary = fake_llama_server(tmp_path / "bin", load_s=60)
    pids: list[int] = []

    def argv_for_port(port: int):  # type: ignore[no-untyped-def]
        return _argv(binary)(port)

    with pytest.raises(ServerError, match="did not report ready") as info:
        srv.start_server(argv_for_port, host="127.0.0.1", port=0, alias="tiny",
                         directory=tmp_path / "run", detach=False, timeout_s=0.5,
                         on_start=lambda p, log, note: pids.append(p))  # fmt: skip
    assert "--timeout" in (info.value.hint or "")
    out = subprocess.run(["pgrep", "-f", str(binary)], capture_output=True, text=True)
    assert out.stdout.strip() == ""


def test_sigterm_ignored_is_followed_by_sigkill(tmp_path: Path) -> None:
    stubborn = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True);"
         " time.sleep(60)"],
        start_new_session=True, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert stubborn.stdout is not None and stubborn.stdout.readline()  # the handler is set
    started = time.monotonic()
    assert srv.stop_process(stubborn.pid, grace_s=0.5, process=stubborn) == "killed"
    assert time.monotonic() - started < 5
    stubborn.wait(timeout=5)
    assert stubborn.returncode == -signal.SIGKILL


def test_run_until_stopped_returns_0_when_stopped_elsewhere(tmp_path: Path) -> None:
    binary = fake_llama_server(tmp_path / "bin", load_s=0.0)
    directory = tmp_path / "run"
    running = srv.start_server(_argv(binary), host="127.0.0.1", port=0, alias="tiny",
                               directory=directory, detach=True)  # fmt: skip
    [record] = srv_records.list_records(directory)
    os.killpg(record.pid, signal.SIGTERM)  # what `serve --stop` in another terminal does
    ended = srv.run_until_stopped(running, directory)
    assert ended.exit_code == 0 and ended.how == "exited"
    assert srv_records.list_records(directory) == []


def test_a_crash_after_start_is_an_error_with_its_lines(tmp_path: Path) -> None:
    crash = tmp_path / "crash.sh"
    crash.write_text("#!/bin/sh\necho 'ggml_abort: CUDA error: out of memory'\nexit 134\n")
    crash.chmod(0o755)
    log = tmp_path / "c.log"
    process = srv.launch([str(crash)], {}, log, detach=False)
    record = srv_records.ServerRecord(alias="x", pid=process.pid, host="127.0.0.1", port=1,
                                      log=str(log), argv=(str(crash),), started=0.0,
                                      detached=False, quantpick_pid=os.getpid())  # fmt: skip
    running = srv.RunningServer(process, record, log)
    with pytest.raises(ServerError, match="exited with code 134") as info:
        srv.run_until_stopped(running, tmp_path / "run")
    assert info.value.log_lines == ("ggml_abort: CUDA error: out of memory",)


def test_stop_signals_turn_sigterm_into_stop_requested() -> None:
    with pytest.raises(srv.StopRequested) as info, srv.stop_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    assert srv.exit_code_for(info.value) == 143
    assert srv.exit_code_for(KeyboardInterrupt()) == 130
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# ---- records ---------------------------------------------------------------------------------


def test_records_of_reused_pids_are_not_alive(tmp_path: Path) -> None:
    sleep = shutil.which("sleep") or "/bin/sleep"
    process = subprocess.Popen([sleep, "60"], start_new_session=True)  # as quantpick starts one
    try:
        me = srv_records.ServerRecord(alias="a b/c", pid=process.pid, host="0.0.0.0", port=9000,
                              log="l", argv=(sleep, "60"), started=0.0, detached=True,
                              quantpick_pid=1,
                              start_ticks=srv_procs.process_start_ticks(process.pid))  # fmt: skip
        assert srv_records.record_name(me.alias, me.port) == "a-b-c-9000"
        assert me.base_url == "http://127.0.0.1:9000"
        srv_records.write_record(tmp_path, me)
        if me.start_ticks is None:  # no /proc: nothing can be proven, so nothing is listed
            assert srv_records.list_records(tmp_path) == []
            return
        assert [r.alias for r in srv_records.list_records(tmp_path)] == ["a b/c"]
        # a pid now held by another process is not ours
        other = srv_records.ServerRecord(**{**me.to_dict(), "argv": ("x",), "alias": "other",
                                    "start_ticks": me.start_ticks + 1})  # fmt: skip
        srv_records.write_record(tmp_path, other)
        assert [r.alias for r in srv_records.list_records(tmp_path)] == ["a b/c"]
        assert not srv_records.record_path(tmp_path, "other", 9000).exists()
        assert srv_records.select_records(srv_records.list_records(tmp_path), "nope", None) == []
        assert len(srv_records.select_records(srv_records.list_records(tmp_path), None, 9000)) == 1
    finally:
        process.kill()
        process.wait()
