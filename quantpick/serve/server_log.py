"""Reading llama-server's own memory lines from its log, bounded.

Every line read here is printed by the pinned tree (b11312, commit 0c1e57098) while the server
loads; the format strings, with their source lines:

- src/llama.cpp:306 `llama_model_load_from_file_impl: using device %s (%s) (%s) - %zu MiB free`:
  the devices the model is placed on (the CPU is never one of them);
- src/llama-model.cpp:1924 `load_tensors: offloaded %d/%d layers to GPU`;
- src/llama-model.cpp:1930 `load_tensors: %12s model buffer size = %8.2f MiB`: weights, one line
  per buffer (CPU_Mapped, CPU_REPACK, CUDA_Host, CUDA0, RPC0[host:port], ...);
- src/llama-context.cpp:309-310 `llama_context: n_ctx = %u`, `n_ctx_seq = %u` (and n_seq_max,
  n_batch, n_ubatch, flash_attn, kv_unified beside them): the context actually given;
- src/llama-context.cpp:381 `llama_context: %10s  output buffer size = %8.2f MiB`: the logits;
- src/llama-kv-cache.cpp:291 `llama_kv_cache: %10s KV buffer size = %8.2f MiB`;
- src/llama-memory-recurrent.cpp:124 `llama_memory_recurrent: %10s RS buffer size = %8.2f MiB`;
- src/llama-context.cpp:740 `sched_reserve: %10s compute buffer size = %8.2f MiB` (older builds
  print it under `llama_context:` / `llama_init_from_model:`; the function name is not required);
- common/fit.cpp:906 `common_memory_breakdown_print`: the table llama-server prints when it stops
  (tools/server/server.cpp:552): per device total, free, self = model + context + compute, and
  unaccounted (MiB, floored); the host row and other host buffer types (CPU_REPACK) without the
  device columns.

In b11312 llama-server shows these lines (they are the library's INFO logs) only from verbosity 4
on (`-lv 4`; its default, 3, shows its own `srv` lines only): `quantpick serve` starts it so. A
server started without it has no buffer lines in its log, and `check` says so.

llama-server with `--fit on` (its default) first projects the load with `no_alloc`; that dry run
prints the same buffer lines, then `common_params_fit...` / `common_fit...` lines. Buffers read
before the last such line are the projection's and are dropped: only the real load counts.

Bounds: a log is read from its start (the load is there) up to `HEAD_BYTES`, plus its last
`TAIL_BYTES` (the breakdown printed at exit); lines longer than `MAX_LINE` are skipped; anything
but a regular file (a FIFO, a device) is not opened for reading at all: a `ServerLog` with a
problem saying so. A log cut in the middle of a line yields only whole lines. The parsing is by
hand: these are llama.cpp's own ad-hoc lines, no library reads them.
"""

from __future__ import annotations

import enum
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

MiB = 1024**2
# The load section of a llama-server log is 30-300 KiB (a 733-tensor model with -v prints ~1
# MiB); 8 MiB leaves room for verbose logs without reading a server's week of request lines.
HEAD_BYTES = 8 * MiB
# common_memory_breakdown_print's table is a few lines at the very end.
TAIL_BYTES = 256 * 1024
# Longest line of interest: ~200 characters (a breakdown row with a long GPU description).
MAX_LINE = 4096
HOST = "CPU"  # quantpick's name for host memory (plan/memory.py DeviceEstimate.device)


class BufferKind(enum.Enum):
    MODEL = "model"
    KV = "kv"
    RECURRENT = "recurrent"
    COMPUTE = "compute"
    OUTPUT = "output"


_BUFFER = re.compile(
    r"(?P<func>[A-Za-z_]+): +(?P<buf>\S+) +(?P<what>model|KV|RS|compute| output) buffer size = +"
    + r"(?P<mib>\d+(?:\.\d+)?) MiB\s*$"
)
_KIND = {
    "model": BufferKind.MODEL,
    "KV": BufferKind.KV,
    "RS": BufferKind.RECURRENT,
    "compute": BufferKind.COMPUTE,
    " output": BufferKind.OUTPUT,
}
_OFFLOADED = re.compile(r"load_tensors: offloaded (\d+)/(\d+) layers to GPU")
_USING = re.compile(r"using device (\S+) \((.*)\) \((.*)\) - (\d+) MiB free")
_CPARAM = re.compile(
    r"llama_context: (n_seq_max|n_ctx|n_ctx_seq|n_ctx_per_seq|n_batch|n_ubatch|flash_attn|"
    r"kv_unified) +=\s+(\S+)\s*$"
)
_FIT_MARK = re.compile(r"common_params_fit|common_fit_")
_BUILD = re.compile(r"\bbuild:? (\d+) \(([0-9a-f]+)\)")
_BREAKDOWN = re.compile(r"common_memory_breakdown_print: \|(.*)\|\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Buffer:
    """One `... buffer size = X MiB` line."""

    kind: BufferKind
    buffer: str  # llama.cpp's buffer name: CUDA0, CUDA_Host, CPU_Mapped, RPC0[host:port]
    bytes: int  # X MiB as printed (2 decimals: within 5 KiB of the allocation)

    @property
    def device(self) -> str:
        return device_of(self.buffer)


@dataclass(frozen=True)
class UsedDevice:
    name: str  # CUDA0, Vulkan1, RPC0
    description: str  # "NVIDIA GeForce RTX 4090"
    free_mib: int  # free when the model was placed


@dataclass(frozen=True)
class BreakdownRow:
    """A row of common_memory_breakdown_print's table (MiB, floored)."""

    name: str  # "CUDA0", "Host", "CPU_REPACK"
    description: str
    self_mib: int
    model_mib: int
    context_mib: int
    compute_mib: int
    total_mib: int | None = None  # devices only
    free_mib: int | None = None
    unaccounted_mib: int | None = None


@dataclass(frozen=True)
class MeasuredDevice:
    """llama.cpp's own buffers on one device, summed over its buffers (bytes)."""

    device: str  # quantpick's name: CUDA0, RPC0[host:port], CPU (every host buffer)
    weights_bytes: int = 0
    kv_bytes: int = 0
    recurrent_bytes: int = 0
    compute_bytes: int = 0
    output_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.kv_bytes
            + self.recurrent_bytes
            + self.compute_bytes
            + self.output_bytes
        )


@dataclass(frozen=True)
class ServerLog:
    """What a llama-server log says about its memory and context."""

    buffers: tuple[Buffer, ...] = ()
    devices: tuple[UsedDevice, ...] = ()  # the devices the model was placed on, in order
    offloaded: tuple[int, int] | None = None  # (layers on GPUs, layers in all)
    context: tuple[tuple[str, str], ...] = ()  # llama_context's n_ctx, n_ctx_seq, ... as printed
    breakdown: tuple[BreakdownRow, ...] = ()
    build: tuple[int, str] | None = None  # (build number, commit)
    problems: tuple[str, ...] = ()  # what could not be read, in words
    dropped_projection: bool = False  # lines of a --fit dry run were read and dropped

    def param(self, name: str) -> str | None:
        return dict(self.context).get(name)

    def int_param(self, name: str) -> int | None:
        value = self.param(name)
        return int(value) if value is not None and value.isdigit() else None

    @property
    def n_ctx(self) -> int | None:
        return self.int_param("n_ctx")

    @property
    def n_ctx_seq(self) -> int | None:
        return self.int_param("n_ctx_seq") or self.int_param("n_ctx_per_seq")

    @property
    def loaded(self) -> bool:
        """The model's buffers were read (the load got that far)."""
        return any(b.kind is BufferKind.MODEL for b in self.buffers)

    def measured(self) -> tuple[MeasuredDevice, ...]:
        """Per device, in the order met (the host last)."""
        return measured_devices(self.buffers)


def device_of(buffer: str) -> str:
    """The device a buffer lives on: every host buffer type (CPU, CPU_Mapped, CPU_REPACK,
    CUDA_Host, Vulkan_Host, ...) is host memory; RPC buffers keep their worker
    ("RPC0[127.0.0.1:50052]", ggml-rpc.cpp:1092); the rest are device names (CUDA0, Vulkan1)."""
    if buffer.startswith("CPU") or buffer.endswith("_Host") or buffer == "Host":
        return HOST
    return buffer


_FIELD = {
    BufferKind.MODEL: "weights_bytes",
    BufferKind.KV: "kv_bytes",
    BufferKind.RECURRENT: "recurrent_bytes",
    BufferKind.COMPUTE: "compute_bytes",
    BufferKind.OUTPUT: "output_bytes",
}


def measured_devices(buffers: Iterable[Buffer]) -> tuple[MeasuredDevice, ...]:
    sums: dict[str, dict[str, int]] = {}
    for b in buffers:
        row = sums.setdefault(b.device, {})
        row[_FIELD[b.kind]] = row.get(_FIELD[b.kind], 0) + b.bytes
    order = sorted(sums, key=lambda d: d == HOST)  # stable: devices as met, host last
    return tuple(MeasuredDevice(d, **sums[d]) for d in order)


def _mib_bytes(text: str) -> int:
    return round(float(text) * MiB)


def _breakdown_row(cells: str) -> BreakdownRow | None:
    """One row: `  - CUDA0 (RTX 4090) | 24080 = 23604 + (19875 = 8445 + 9932 + 1497) + -19398`
    or `  - Host |  1505 = 515 + 0 + 990`."""
    if "|" not in cells:
        return None
    label, _, numbers = cells.partition("|")
    label = label.strip()
    if not label.startswith("- "):
        return None  # the header
    label = label[2:].strip()
    name, _, desc = label.partition(" (")
    desc = desc[:-1] if desc.endswith(")") else desc
    values = [int(v) for v in re.findall(r"-?\d+", numbers)]
    if len(values) == 7:  # total = free + (self = model + context + compute) + unaccounted
        total, free, self_, model, context, compute, unaccounted = values
        return BreakdownRow(name, desc, self_, model, context, compute, total, free, unaccounted)
    if len(values) == 4:
        self_, model, context, compute = values
        return BreakdownRow(name, desc, self_, model, context, compute)  # self = m + c + c
    return None


def parse_lines(lines: Iterable[str]) -> ServerLog:
    """Read a log's lines (any prefix: timestamps, pids, colours)."""
    buffers: list[Buffer] = []
    devices: list[UsedDevice] = []
    context: dict[str, str] = {}
    breakdown: list[BreakdownRow] = []
    offloaded: tuple[int, int] | None = None
    build: tuple[int, str] | None = None
    dropped = False
    for raw in lines:
        if len(raw) > MAX_LINE:
            continue
        line = _ANSI.sub("", raw).rstrip("\r\n")
        m = _BUFFER.search(line)
        if m:
            buffers.append(
                Buffer(_KIND[m.group("what")], m.group("buf"), _mib_bytes(m.group("mib")))
            )
            continue
        if _FIT_MARK.search(line):
            # the end of a --fit projection (no_alloc): its buffers are not the server's
            if buffers or devices or offloaded or breakdown:
                dropped = True
            buffers, devices, context, offloaded, breakdown = [], [], {}, None, []
            continue
        m = _USING.search(line)
        if m:
            if buffers:  # a new load (a router's next model, a restart into the same log)
                buffers, context, offloaded, devices = [], {}, None, []
            devices.append(UsedDevice(m.group(1), m.group(2), int(m.group(4))))
            continue
        m = _OFFLOADED.search(line)
        if m:
            offloaded = (int(m.group(1)), int(m.group(2)))
            continue
        m = _CPARAM.search(line)
        if m:
            context.setdefault(m.group(1), m.group(2))  # a draft context prints its own later
            continue
        m = _BREAKDOWN.search(line)
        if m:
            row = _breakdown_row(m.group(1))
            if row is not None:
                breakdown.append(row)
            continue
        if build is None:
            m = _BUILD.search(line)
            if m:
                build = (int(m.group(1)), m.group(2))
    return ServerLog(
        buffers=tuple(buffers),
        devices=tuple(devices),
        offloaded=offloaded,
        context=tuple(context.items()),
        breakdown=tuple(breakdown),
        build=build,
        dropped_projection=dropped,
    )


def parse_text(text: str) -> ServerLog:
    return parse_lines(text.splitlines())


def _whole_lines(data: bytes, *, cut_start: bool, cut_end: bool) -> list[str]:
    lines = data.decode("utf-8", "replace").split("\n")
    if cut_start and lines:
        lines = lines[1:]
    if cut_end and lines:
        lines = lines[:-1]
    return lines


def read_log(
    path: Path, *, head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES
) -> ServerLog:
    """Read a llama-server log, bounded (module docstring). Never raises for what the file is:
    a missing, unreadable or special file gives a ServerLog with `problems`."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        return ServerLog(problems=(f"cannot read the log {path}: {exc.strerror or exc}",))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ServerLog(problems=(f"the log {path} is not a regular file: not read",))
        size = info.st_size
        head = os.pread(fd, head_bytes, 0) if size else b""
        problems: list[str] = []
        # a line still being written (or a log cut off) ends without a newline: not a whole line
        cut_end = len(head) == head_bytes or not head.endswith(b"\n")
        lines = _whole_lines(head, cut_start=False, cut_end=cut_end)
        if size > head_bytes:
            problems.append(
                f"the log is {size / MiB:.0f} MiB: read its first {head_bytes // MiB} MiB and "
                f"last {tail_bytes // 1024} KiB"
            )
            start = max(head_bytes, size - tail_bytes)
            tail = os.pread(fd, size - start, start)
            lines += _whole_lines(tail, cut_start=True, cut_end=not tail.endswith(b"\n"))
    except OSError as exc:
        return ServerLog(problems=(f"cannot read the log {path}: {exc.strerror or exc}",))
    finally:
        os.close(fd)
    parsed = parse_lines(lines)
    if not parsed.loaded:
        problems.append(
            f"the log {path} has no model buffer lines (not loaded yet, or not llama-server's)"
        )
    return replace(parsed, problems=tuple(problems))


__all__ = [
    "Buffer",
    "BufferKind",
    "BreakdownRow",
    "MeasuredDevice",
    "ServerLog",
    "UsedDevice",
    "device_of",
    "measured_devices",
    "parse_lines",
    "parse_text",
    "read_log",
]
