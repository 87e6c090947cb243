"""A process by its pid, as /proc shows it (proc(5)): its stat fields (state, group, session,
start time), executable, argv and memory. None wherever /proc cannot say (off Linux, a process
gone). Read by the server records (serve/server_records.py) and by `check`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# /proc/PID/cmdline is read up to this (ARG_MAX is 2 MiB by default on Linux).
MAX_CMDLINE_BYTES = 4 * 1024 * 1024


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
