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

Stopping from another command (`serve --stop`) trusts nothing in the record until the process
proves it is the llama-server the record names (`verify`): a pid above 1 that is not quantpick's
own, the same start time (/proc/PID/stat field 22: a pid alone is reused), the leader of its own
session and process group (quantpick starts every server with setsid, so its group is its pid;
any other group is not one quantpick created), the recorded executable (/proc/PID/exe) and the
recorded argv (/proc/PID/cmdline). A record that cannot prove it (no start time, another
executable, a system without /proc) is refused with what to do instead, and nothing is signalled.

Stopping: SIGTERM to the server's process group (it runs in its own session, so a Ctrl-C in
the terminal reaches quantpick only and quantpick decides), then SIGKILL after the grace period.
In the foreground on Linux the child also gets PR_SET_PDEATHSIG, so even a quantpick killed with
SIGKILL leaves no llama-server behind.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from quantpick.errors import QuantpickError, ServerError, UsageError
from quantpick.plan.check import PlannedServer

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
_RECORD_SUFFIX = ".json"
# The largest pid Linux hands out: PID_MAX_LIMIT, 4 Mi on 64-bit (include/linux/threads.h);
# macOS and the BSDs stay far below (99999). A record naming another pid is not one of ours.
PID_MAX = 4 * 1024 * 1024
# A record is ~1 KB (an argv of ~40 flags); anything over this is not one quantpick wrote.
MAX_RECORD_BYTES = 256 * 1024
# /proc/PID/cmdline is read up to this (ARG_MAX is 2 MiB by default on Linux).
MAX_CMDLINE_BYTES = 4 * 1024 * 1024


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


# ---- ports -----------------------------------------------------------------------------------


def connect_host(host: str) -> str:
    """The address to reach a server listening on `host` from this machine."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "::1"
    return host.strip("[]")


def check_host(host: str) -> None:
    if host.endswith(".sock"):
        raise UsageError(
            f"--host {host}: quantpick serve waits for /health over TCP",
            hint="give an IP address (127.0.0.1 by default); run a socket with `quantpick get`",
        )


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET


def port_is_free(host: str, port: int) -> bool:
    """Whether a listener could bind host:port now. SO_REUSEADDR (a closed connection's
    TIME_WAIT must not count as busy) but not SO_REUSEPORT (which would share a live port)."""
    address = host.strip("[]") or "0.0.0.0"
    with socket.socket(_family(address), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise UsageError(f"--host {host}: cannot listen there ({exc.strerror})") from None
    return True


def free_port(host: str) -> int:
    """A port the kernel says is free on `host` now."""
    address = host.strip("[]") or "0.0.0.0"
    with socket.socket(_family(address), socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def choose_port(host: str, port: int) -> tuple[int, str | None]:
    """(the port to use, a note when it is not the one asked for)."""
    if port == 0:
        chosen = free_port(host)
        return chosen, f"--port 0: using free port {chosen}"
    if port_is_free(host, port):
        return port, None
    chosen = free_port(host)
    return chosen, f"port {port} is in use on {host}: using free port {chosen}"


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


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat that name a process (proc(5))."""

    state: str  # field 3: "R", "S", "Z" (zombie), ...
    pgrp: int  # field 5
    session: int  # field 6
    start_ticks: int  # field 22: clock ticks since boot


def proc_stat(pid: int) -> ProcStat | None:
    """/proc/PID/stat of `pid`; None when there is no such process or no /proc (off Linux)."""
    if pid <= 0:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the name (field 2) may hold spaces and ")"
    try:  # fields[0] is field 3 overall
        return ProcStat(fields[0], int(fields[2]), int(fields[3]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the
    pid, it names one process for good (a pid alone is reused). None off Linux."""
    stat = proc_stat(pid)
    return stat.start_ticks if stat is not None else None


def process_exe(pid: int) -> str | None:
    """The executable `pid` runs (/proc/PID/exe; " (deleted)" dropped); None when unreadable."""
    try:
        target = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    return target.removesuffix(" (deleted)")


def process_argv(pid: int) -> tuple[str, ...] | None:
    """`pid`'s argv (/proc/PID/cmdline); None when unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            data = f.read(MAX_CMDLINE_BYTES)
    except OSError:
        return None
    return tuple(os.fsdecode(part) for part in data.split(b"\0")[:-1])


class Identity(Enum):
    OURS = "ours"  # the llama-server the record names, running
    GONE = "gone"  # it ended (the pid is free, or held by a newer process)
    REFUSED = "refused"  # a process runs there that cannot be proven to be it


@dataclass(frozen=True)
class Verdict:
    identity: Identity
    reason: str = ""  # why, for REFUSED


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: someone else's process
    return True


def _runs_recorded_argv(actual: tuple[str, ...], recorded: tuple[str, ...]) -> bool:
    """The process's argv is the recorded one, or (a script: the kernel runs its `#!`
    interpreter with the script's path and arguments after the interpreter's own) ends with it."""
    if actual == recorded:
        return True
    extra = len(actual) - len(recorded)
    return 1 <= extra <= 2 and actual[extra:] == recorded


def verify(record: ServerRecord) -> Verdict:
    """Whether the record's process is the llama-server quantpick started (see the module's
    docstring): the one check before any signal to a process quantpick did not just start."""
    pid = record.pid
    if not 1 < pid <= PID_MAX:
        return Verdict(Identity.REFUSED, f"pid {pid} cannot be a server quantpick started")
    if pid in (os.getpid(), os.getpgrp(), os.getsid(0)):
        return Verdict(Identity.REFUSED, f"pid {pid} is this quantpick itself or its group")
    if record.start_ticks is None:
        if not _pid_exists(pid):
            return Verdict(Identity.GONE)
        return Verdict(
            Identity.REFUSED,
            "the record has no start time (an older quantpick wrote it, or this system has no "
            f"/proc), so pid {pid} cannot be proven to be its llama-server",
        )
    stat = proc_stat(pid)
    if stat is None:
        if not _pid_exists(pid):
            return Verdict(Identity.GONE)
        return Verdict(Identity.REFUSED, f"/proc/{pid}/stat cannot be read")
    if stat.state == "Z" or stat.start_ticks != record.start_ticks:
        return Verdict(Identity.GONE)  # it ended; the pid may now be someone else's
    if stat.pgrp != pid or stat.session != pid:
        return Verdict(
            Identity.REFUSED,
            f"pid {pid} is in process group {stat.pgrp}, session {stat.session}: not the "
            "session of its own that quantpick starts every llama-server in",
        )
    exe = process_exe(pid)
    expected = record.exe or os.path.realpath(record.argv[0])
    if exe is None or exe != expected:
        return Verdict(Identity.REFUSED, f"pid {pid} runs {exe or 'an unreadable executable'!s}, "
                       f"not the recorded {expected}")  # fmt: skip
    argv = process_argv(pid)
    if argv is None or not _runs_recorded_argv(argv, record.argv):
        return Verdict(Identity.REFUSED, f"pid {pid}'s command line is not the recorded one")
    return Verdict(Identity.OURS)


def process_memory(pid: int, proc: Path = Path("/proc")) -> tuple[int | None, int | None]:
    """(resident, swapped) bytes of the process (VmRSS and VmSwap of /proc/PID/status, kB);
    None where they cannot be read (off Linux, a process gone)."""
    try:
        with (proc / str(pid) / "status").open("rb") as f:
            text = f.read(64 * 1024).decode("ascii", "replace")
    except OSError:
        return None, None

    def field(name: str) -> int | None:
        m = re.search(rf"^{name}:\s+(\d+) kB", text, re.MULTILINE)
        return int(m.group(1)) * 1024 if m else None

    return field("VmRSS"), field("VmSwap")


def process_swap_bytes(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The process's memory in swap (VmSwap), None when unknown."""
    return process_memory(pid, proc)[1]


# ---- records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerRecord:
    """What `serve` writes for a running server (the pid file): enough to find, check and stop
    it from another command."""

    alias: str
    pid: int  # also its process group (it leads its own session)
    host: str
    port: int
    log: str
    argv: tuple[str, ...]
    started: float  # time.time() when it became ready
    detached: bool
    quantpick_pid: int  # the quantpick that started it (a foreground one waits on it)
    start_ticks: int | None = None
    model_path: str | None = None
    quant: str | None = None
    ctx_size: int = 0
    n_parallel: int = 1
    exe: str | None = None  # /proc/PID/exe when it started (the interpreter, for a script)
    # what the plan expects of this server, per device (`quantpick check` compares it)
    plan: PlannedServer | None = None

    @property
    def base_url(self) -> str:
        host = connect_host(self.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["argv"] = list(self.argv)
        data["plan"] = self.plan.to_dict() if self.plan is not None else None
        return data

    @staticmethod
    def from_dict(data: Any) -> ServerRecord:
        """The record in `data` (a JSON document); RecordError saying what is wrong with it
        (not an object, a pid that is not a whole number from 2 to PID_MAX, a missing key...)."""
        return parse_record(data)


class RecordError(ValueError):
    """A server record that is not one quantpick wrote: the reason, in a few words."""


_MAX_INT = 2**63 - 1  # what /proc and time_t hold; a larger number in a record is not ours


def _int_field(data: dict[str, Any], key: str, low: int, high: int, default: Any = ...) -> Any:
    if key not in data:
        if default is ...:
            raise RecordError(f"no {key!r}")
        return default
    value = data[key]
    if value is None and default is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise RecordError(f"{key} is {type(value).__name__}, not a whole number")
    if not low <= value <= high:
        raise RecordError(
            f"{key} {value if abs(value) < 10**12 else 'out of range'} is not {low}-{high}"
        )
    return value


def _str_field(data: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    if key not in data or (optional and data[key] is None):
        if optional:
            return None
        raise RecordError(f"no {key!r}")
    value = data[key]
    if not isinstance(value, str):
        raise RecordError(f"{key} is {type(value).__name__}, not text")
    return value


def parse_record(data: Any) -> ServerRecord:
    """Check every field's type and range (a record is a file anyone with write access to the
    state directory can edit); RecordError with the first problem."""
    if not isinstance(data, dict):
        raise RecordError(f"a JSON {type(data).__name__}, not an object")
    argv = data.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise RecordError("argv is not a list of text")
    started = data.get("started")
    if not isinstance(started, (int, float)) or isinstance(started, bool):
        raise RecordError("started is not a number")
    if not 0 <= started < 2**53:  # NaN fails both
        raise RecordError("started is out of range")
    detached = data.get("detached")
    if not isinstance(detached, bool):
        raise RecordError("detached is not true/false")
    return ServerRecord(
        alias=_str_field(data, "alias"),
        pid=_int_field(data, "pid", 2, PID_MAX),
        host=_str_field(data, "host"),
        port=_int_field(data, "port", 1, 65535),
        log=_str_field(data, "log"),
        argv=tuple(argv),
        started=float(started),
        detached=detached,
        quantpick_pid=_int_field(data, "quantpick_pid", 0, PID_MAX),
        start_ticks=_int_field(data, "start_ticks", 0, _MAX_INT, None),
        model_path=_str_field(data, "model_path", optional=True),
        quant=_str_field(data, "quant", optional=True),
        ctx_size=_int_field(data, "ctx_size", 0, _MAX_INT, 0),
        n_parallel=_int_field(data, "n_parallel", 1, 1 << 20, 1),
        exe=_str_field(data, "exe", optional=True),
        plan=_plan_field(data),
    )


def _plan_field(data: dict[str, Any]) -> PlannedServer | None:
    """The plan `serve` recorded; a plan that does not parse is no plan (the record stays usable
    for --status and --stop: `check` then plans without it)."""
    if data.get("plan") is None:
        return None
    try:
        return PlannedServer.from_dict(data["plan"])
    except (ValueError, TypeError):
        return None


def read_record(path: Path) -> ServerRecord:
    """The record in file `path`: a regular file (no link, FIFO or device) of at most
    MAX_RECORD_BYTES, valid JSON, valid fields. RecordError (or OSError) otherwise."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as f:
        import stat as stat_module

        if not stat_module.S_ISREG(os.fstat(fd).st_mode):
            raise RecordError("not a regular file")
        data = f.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"larger than {MAX_RECORD_BYTES // 1024} KiB")
    try:
        document = json.loads(data)
    except RecursionError:
        raise RecordError("nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a 5000-digit number
        raise RecordError(f"not JSON ({str(exc)[:80]})") from None
    return parse_record(document)


def record_name(alias: str, port: int) -> str:
    """`<alias>-<port>`, with anything but letters, digits, '.', '_' and '-' made '-'."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", alias).strip("-.") or "server"
    return f"{cleaned[:100]}-{port}"


def record_path(directory: Path, alias: str, port: int) -> Path:
    return directory / (record_name(alias, port) + _RECORD_SUFFIX)


def log_path_for(directory: Path, alias: str, port: int) -> Path:
    return directory / (record_name(alias, port) + ".log")


def write_record(directory: Path, record: ServerRecord) -> Path:
    from quantpick.fetch.atomic import write_atomic

    directory.mkdir(parents=True, exist_ok=True)
    path = record_path(directory, record.alias, record.port)
    write_atomic(path, (json.dumps(record.to_dict(), indent=2) + "\n").encode(), durable=False)
    return path


def remove_record(directory: Path, record: ServerRecord) -> None:
    path = record_path(directory, record.alias, record.port)
    try:
        current = read_record(path)
    except (OSError, ValueError):
        return
    if current.pid == record.pid:  # a newer server under the same name keeps its record
        path.unlink(missing_ok=True)


def is_alive(record: ServerRecord) -> bool:
    """The recorded process still runs and is proven to be the one that was started."""
    return verify(record).identity is Identity.OURS


@dataclass(frozen=True)
class RecordProblem:
    path: Path
    reason: str

    def line(self) -> str:
        from quantpick.process import escaped

        return f"skipping server record {escaped(str(self.path))}: {escaped(self.reason)}"


@dataclass(frozen=True)
class RecordScan:
    records: list[ServerRecord] = field(default_factory=list)  # running, proven ours
    problems: list[RecordProblem] = field(default_factory=list)  # one line each, then go on


# Records read per listing: far more servers than one machine runs (each holds a model).
MAX_RECORDS = 1000


def scan_records(directory: Path, *, prune: bool = True) -> RecordScan:
    """The servers recorded in `directory` that still run and are proven to be the ones started
    (`verify`), and a problem for each record that is not: unreadable or malformed (left on
    disk: remove it by hand), or naming a live process that cannot be proven to be its server.
    Records of servers that are gone are removed (`prune`)."""
    scan = RecordScan()
    try:
        paths = sorted(directory.glob("*" + _RECORD_SUFFIX))
    except OSError:
        return scan
    for path in paths[:MAX_RECORDS]:
        try:
            record = read_record(path)
        except RecordError as exc:
            scan.problems.append(RecordProblem(path, f"{exc}; remove the file"))
            continue
        except OSError as exc:
            scan.problems.append(RecordProblem(path, exc.strerror or str(exc)))
            continue
        verdict = verify(record)
        if verdict.identity is Identity.OURS:
            scan.records.append(record)
        elif verdict.identity is Identity.GONE:
            if prune:
                path.unlink(missing_ok=True)
        else:
            scan.problems.append(RecordProblem(path, f"{verdict.reason}; {_by_hand(record)}"))
    if len(paths) > MAX_RECORDS:
        scan.problems.append(
            RecordProblem(directory, f"only the first {MAX_RECORDS} of {len(paths)} records read")
        )
    return scan


def _by_hand(record: ServerRecord) -> str:
    return (
        f"if pid {record.pid} is that llama-server, stop it with `kill {record.pid}`; "
        "then remove the record"
    )


def list_records(directory: Path, *, prune: bool = True) -> list[ServerRecord]:
    """The servers recorded in `directory` that are still running (scan_records, without its
    problems)."""
    return scan_records(directory, prune=prune).records


def select_records(
    records: Sequence[ServerRecord], alias: str | None, port: int | None
) -> list[ServerRecord]:
    """The records `--stop [ALIAS] [--port N]` means."""
    chosen = [
        r
        for r in records
        if (alias is None or r.alias == alias) and (port is None or r.port == port)
    ]
    return chosen


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
            hint=_by_hand(record),
        )
    how = "stopped"
    if verdict.identity is Identity.OURS:
        how = stop_process(record.pid, grace_s=grace_s)
    remove_record(directory, record)
    return how
