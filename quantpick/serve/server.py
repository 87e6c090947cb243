"""Running llama-server: a free port, its own process group, waiting for `/health`, stopping it
cleanly, and one record (a pid file) per server that `quantpick serve --status/--stop` read.

What llama-server does, from the pinned tree (b11312, tools/server):
- server.cpp starts the HTTP server *before* loading the model, so `/health` answers while it
  loads: 503 `{"error": {"message": "Loading model"}}` (server-http.cpp middleware_server_state),
  then 200 once `ctx_http.is_ready` is set after the load. A failed load logs
  "exiting due to model loading error" and exits 1; a port it cannot bind logs "couldn't bind
  HTTP server socket, hostname: H, port: P" (server-http.cpp) and exits 1.
- It installs its SIGINT/SIGTERM handler only after the model loaded (server.cpp ~500): a
  signal during the load ends it at once, after it shuts down cleanly, and a second signal
  "terminating immediately".
- cpp-httplib binds with SO_REUSEPORT where the OS has it (httplib.cpp default_socket_options),
  so on Linux a second llama-server of the same user binds a port the first one listens on and
  the kernel splits connections between them: a busy port is never reported by llama-server
  itself. `port_is_free` binds without SO_REUSEPORT, which fails on any listener.

Records (`serve --status/--stop`) and the check that a recorded process is still the server:
serve/server_records.py.

Stopping: SIGTERM to the server's process group (it runs in its own session, so a Ctrl-C in
the terminal reaches quantpick only and quantpick decides), then SIGKILL after the grace period.
In the foreground on Linux the child also gets PR_SET_PDEATHSIG, so even a quantpick killed with
SIGKILL leaves no llama-server behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantpick.errors import QuantpickError, ServerError
from quantpick.serve.ports import check_host, choose_port, connect_host, free_port
from quantpick.serve.processes import process_exe, process_start_ticks
from quantpick.serve.server_records import (
    Identity,
    ServerRecord,
    log_path_for,
    remove_record,
    stop_by_hand,
    verify,
    write_record,
)

# Seconds to wait for /health: reading a 71 GB BF16 file from a 150 MB/s disk takes ~8 minutes;
# a cached or NVMe load is seconds. docker compose's start_period here is 15 min for the same
# reason (serve/command.py render_compose). `--timeout` changes it.
HEALTH_TIMEOUT_S = 600.0
# After SIGTERM: the router's own default for a model it unloads (`stop-timeout`, 10 s,
# tools/server/README.md "Model presets").
STOP_GRACE_S = 10.0
POLL_INTERVAL_S = 0.25
HEALTH_REQUEST_TIMEOUT_S = 2.0
# Bind retries: another process may take the free port between the check and llama-server's bind.
BIND_ATTEMPTS = 3
# Lines of llama-server's log that say why it failed (its own words: "error", "failed", ...).
RELEVANT_LOG = re.compile(
    r"error|failed|couldn't|could not|cannot|unable|unknown model architecture|out of memory|"
    r"abort|not enough|invalid",
    re.IGNORECASE,
)
BIND_FAILURE = "couldn't bind"
LOG_EXCERPT_LINES = 8
# PR_SET_PDEATHSIG from <linux/prctl.h>.
_PR_SET_PDEATHSIG = 1


class StopRequested(BaseException):
    """SIGTERM or SIGHUP arrived (SIGINT stays KeyboardInterrupt); a BaseException like
    KeyboardInterrupt, so that no `except Exception` swallows it on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into StopRequested for the duration (main thread only)."""

    def handler(signum: int, _frame: Any) -> None:
        raise StopRequested(signum)

    saved: dict[int, Any] = {}
    for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if signum is None:
            continue
        try:
            saved[signum] = signal.signal(signum, handler)
        except ValueError:  # not the main thread: leave the defaults alone
            break
    try:
        yield
    finally:
        for signum, previous in saved.items():
            signal.signal(signum, previous)


def exit_code_for(stop: BaseException) -> int:
    """130 for Ctrl-C, 128 + N for signal N."""
    if isinstance(stop, StopRequested):
        return 128 + stop.signum
    return 128 + int(signal.SIGINT)


# ---- the log -------------------------------------------------------------------------------


def log_tail(path: Path, max_bytes: int = 64 * 1024) -> list[str]:
    """The last lines of a log (at most `max_bytes` of it), without the trailing empty one."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    from quantpick.process import printable

    lines = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first one is cut
    # llama-server's lines reach the terminal (failures, the progress line): no escapes in them
    lines = [printable(line).rstrip() for line in lines]
    return [line for line in lines if line.strip()]


def failure_lines(lines: Sequence[str], limit: int = LOG_EXCERPT_LINES) -> tuple[str, ...]:
    """llama.cpp's own lines saying what went wrong: the last `limit` lines with "error",
    "failed", "couldn't", ...; the last few lines when none says so."""
    relevant = [line for line in lines if RELEVANT_LOG.search(line)]
    chosen = relevant[-limit:] if relevant else list(lines[-min(limit, 5) :])
    return tuple(chosen)


# ---- processes -----------------------------------------------------------------------------


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def launch(
    argv: Sequence[str], env: Mapping[str, str], log_path: Path, *, detach: bool
) -> subprocess.Popen[bytes]:
    """Start llama-server in its own session and process group, its output into `log_path`
    (truncated; quantpick.outputs.open_log: never through a symlink, never a FIFO, a device or a
    hard link). `detach`: it is meant to outlive quantpick (no parent-death signal)."""
    from quantpick.outputs import open_log

    log_path.parent.mkdir(parents=True, exist_ok=True)
    preexec = _die_with_parent if not detach and sys.platform.startswith("linux") else None
    with os.fdopen(open_log(log_path), "wb") as log:
        try:
            return subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                start_new_session=True,
                preexec_fn=preexec,  # noqa: PLW1509 - a prctl, no Python state touched
                close_fds=True,
            )
        except OSError as exc:
            raise ServerError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None


def health_status(url: str) -> int | None:
    """HTTP status of GET url, None when nothing answers."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=HEALTH_REQUEST_TIMEOUT_S) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


WaitCallback = Callable[[float, str | None], None]  # (seconds so far, latest log line)


def wait_healthy(
    process: subprocess.Popen[bytes],
    url: str,
    log_path: Path,
    *,
    timeout_s: float = HEALTH_TIMEOUT_S,
    on_wait: WaitCallback | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> float:
    """Poll `url` until it answers 200; the seconds it took. Raises ServerError (with the log's
    relevant lines) when the process exits first or nothing is healthy within `timeout_s`; the
    caller stops the process."""
    started = clock()
    while True:
        elapsed = clock() - started
        code = process.poll()
        if code is not None:
            lines = log_tail(log_path)
            raise ServerError(
                f"llama-server exited with code {code} before it was ready",
                hint=f"its whole log: {log_path}",
                log_lines=failure_lines(lines),
            )
        if health_status(url) == 200:
            return elapsed
        if elapsed > timeout_s:
            raise ServerError(
                f"llama-server did not report ready on {url} within {timeout_s:g} s",
                hint=f"its log: {log_path}; a slow disk needs more: --timeout SECONDS",
                log_lines=failure_lines(log_tail(log_path)),
            )
        if on_wait is not None:
            tail = log_tail(log_path, max_bytes=4096)
            on_wait(elapsed, tail[-1] if tail else None)
        time.sleep(POLL_INTERVAL_S)


def _reap(pid: int) -> bool:
    """True when `pid` is gone (reaping it if it is our child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
    except ChildProcessError:
        pass
    except OSError:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def _signal_group(pgid: int, signum: int) -> None:
    # killpg(0) is the caller's own group, killpg(1) (kill(-1)) every process it may signal:
    # never, whatever asked for it; nor quantpick's own group.
    if pgid <= 1 or pgid == os.getpgrp():
        raise QuantpickError(f"refusing to signal process group {pgid}")
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def stop_process(
    pid: int,
    *,
    grace_s: float = STOP_GRACE_S,
    process: subprocess.Popen[bytes] | None = None,
) -> str:
    """SIGTERM to the process group `pid` leads, SIGKILL after `grace_s`; returns how it ended
    ("stopped" or "killed"). A second Ctrl-C during the grace period kills at once. With the
    `process` handle of our own child it is reaped through it (its returncode stays readable)."""

    def gone() -> bool:
        return process.poll() is not None if process is not None else _reap(pid)

    if gone():
        return "stopped"
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    try:
        while time.monotonic() < deadline:
            if gone():
                return "stopped"
            time.sleep(0.05)
    except (KeyboardInterrupt, StopRequested):
        pass
    _signal_group(pid, signal.SIGKILL)
    for _ in range(500):  # SIGKILL cannot be ignored; the kernel needs a moment
        if gone():
            break
        time.sleep(0.01)
    return "killed"


# ---- records ---------------------------------------------------------------------------------


# ---- one server, start to end ------------------------------------------------------------------


@dataclass
class RunningServer:
    process: subprocess.Popen[bytes]
    record: ServerRecord
    log_path: Path
    record_path: Path | None = None
    ready_s: float = 0.0


def start_server(
    argv_for_port: Callable[[int], tuple[Sequence[str], Mapping[str, str]]],
    *,
    host: str,
    port: int,
    alias: str,
    directory: Path,
    detach: bool,
    timeout_s: float = HEALTH_TIMEOUT_S,
    on_start: Callable[[int, Path, str | None], None] | None = None,
    on_wait: WaitCallback | None = None,
    notes: list[str] | None = None,
    record_extra: Mapping[str, Any] | None = None,
) -> RunningServer:
    """Choose the port, start llama-server, wait for /health, write its record. On any failure
    or interruption before it is ready, the process is stopped and the exception propagates.
    `on_start(port, log, note)` is called at each launch; `note` says why the port is not the one
    asked for (None when it is)."""
    check_host(host)
    chosen, note = choose_port(host, port)
    for attempt in range(BIND_ATTEMPTS):
        if note and notes is not None:
            notes.append(note)
        argv, env = argv_for_port(chosen)
        log_path = log_path_for(directory, alias, chosen)
        if on_start is not None:
            on_start(chosen, log_path, note)
        process = launch(argv, env, log_path, detach=detach)
        bare = connect_host(host)
        url = (
            f"http://[{bare}]:{chosen}/health" if ":" in bare else f"http://{bare}:{chosen}/health"
        )
        try:
            ready = wait_healthy(process, url, log_path, timeout_s=timeout_s, on_wait=on_wait)
        except ServerError as exc:
            stop_process(process.pid, process=process)
            lost_port = any(BIND_FAILURE in line for line in exc.log_lines)
            if lost_port and attempt + 1 < BIND_ATTEMPTS:
                previous, chosen = chosen, free_port(host)
                note = f"port {previous} was taken before llama-server bound it: using {chosen}"
                continue
            raise
        except BaseException:
            stop_process(process.pid, process=process)
            raise
        record = ServerRecord(
            alias=alias,
            pid=process.pid,
            host=host,
            port=chosen,
            log=str(log_path),
            argv=tuple(argv),
            started=time.time(),
            detached=detach,
            quantpick_pid=os.getpid(),
            start_ticks=process_start_ticks(process.pid),
            exe=process_exe(process.pid),
            **dict(record_extra or {}),
        )
        try:
            path = write_record(directory, record)
        except BaseException:
            stop_process(process.pid, process=process)
            raise
        return RunningServer(process, record, log_path, path, ready)
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True)
class Ended:
    """How a foreground server ended."""

    exit_code: int  # quantpick's: 130 / 143 when stopped by a signal, 0 when stopped elsewhere
    how: str  # "stopped", "killed", or "exited"
    returncode: int | None  # llama-server's


def run_until_stopped(
    running: RunningServer, directory: Path, *, grace_s: float = STOP_GRACE_S
) -> Ended:
    """Wait in the foreground until Ctrl-C / SIGTERM (then stop llama-server: 130 / 143) or until
    llama-server ends by itself (stopped by `serve --stop`: 0; anything else raises ServerError
    with its log lines). The record is removed either way."""
    process = running.process
    try:
        try:
            returncode = process.wait()
        except (KeyboardInterrupt, StopRequested) as stop:
            how = stop_process(process.pid, grace_s=grace_s, process=process)
            return Ended(exit_code_for(stop), how, process.returncode)
        if returncode in (0, -int(signal.SIGTERM), -int(signal.SIGINT)):
            return Ended(0, "exited", returncode)
        raise ServerError(
            f"llama-server exited with code {returncode}",
            hint=f"its whole log: {running.log_path}",
            log_lines=failure_lines(log_tail(running.log_path)),
        )
    finally:
        remove_record(directory, running.record)


def stop_record(record: ServerRecord, directory: Path, *, grace_s: float = STOP_GRACE_S) -> str:
    """Stop a recorded server (from another command) and drop its record. Nothing is signalled
    unless `verify` proves the process is that server: QuantpickError (exit 1) otherwise. (The
    check and the first signal are microseconds apart; for another process to be signalled, the
    server would have to end, be reaped, and its pid be handed to a new session leader between.)"""
    verdict = verify(record)
    if verdict.identity is Identity.REFUSED:
        from quantpick.process import escaped

        raise QuantpickError(
            f"not stopping {escaped(record.alias)}: {escaped(verdict.reason)}",
            hint=stop_by_hand(record),
        )
    how = "stopped"
    if verdict.identity is Identity.OURS:
        how = stop_process(record.pid, grace_s=grace_s)
    remove_record(directory, record)
    return how
