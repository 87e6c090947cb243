"""One record (a pid file) per server that `serve` started, which `serve --status/--stop` and
`check` read: written atomically, read bounded, pruned when their server is gone.

Stopping from another command (`serve --stop`) trusts nothing in the record until the process
proves it is the llama-server the record names (`verify`): a pid above 1 that is not quantpick's
own, the same start time (/proc/PID/stat field 22: a pid alone is reused), the leader of its own
session and process group (quantpick starts every server with setsid, so its group is its pid;
any other group is not one quantpick created), the recorded executable (/proc/PID/exe) and the
recorded argv (/proc/PID/cmdline). A record that cannot prove it (no start time, another
executable, a system without /proc) is refused with what to do instead, and nothing is signalled.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from quantpick.plan.check import PlannedServer
from quantpick.serve.ports import connect_host
from quantpick.serve.processes import proc_stat, process_argv, process_exe

_RECORD_SUFFIX = ".json"
# The largest pid Linux hands out: PID_MAX_LIMIT, 4 Mi on 64-bit (include/linux/threads.h);
# macOS and the BSDs stay far below (99999). A record naming another pid is not one of ours.
PID_MAX = 4 * 1024 * 1024
# A record is ~1 KB (an argv of ~40 flags); anything over this is not one quantpick wrote.
MAX_RECORD_BYTES = 256 * 1024


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
            scan.problems.append(RecordProblem(path, f"{verdict.reason}; {stop_by_hand(record)}"))
    if len(paths) > MAX_RECORDS:
        scan.problems.append(
            RecordProblem(directory, f"only the first {MAX_RECORDS} of {len(paths)} records read")
        )
    return scan


def stop_by_hand(record: ServerRecord) -> str:
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
