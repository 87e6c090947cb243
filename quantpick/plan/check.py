"""A running llama-server beside its plan, per device, and what the differences mean. Pure.

The plan's device rows (plan/memory.py `DeviceEstimate`) and llama.cpp's own buffer lines of the
running server (serve/server_log.py) use the same keys: weights, KV, recurrent state, compute and
the host's output (logits) buffer. Weights, KV and state are exact in the plan (the conformance
grid, tests/plan/test_memory.py: equal to llama.cpp's MiB), so any difference beyond the log's own
rounding (`MEMORY_TOLERANCE_BYTES`) means the server runs something else than planned: other flags,
another file, or llama.cpp's `--fit` moving things. Compute buffers are estimates: a difference is
information (and what a memory calibration learns from), not a fault.

Findings that cost speed or memory (`Severity.COSTS`) make `quantpick check` exit with
ExitCode.DIFFERS; the others are said and exit 0.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quantpick.units import MiB, human

# llama.cpp prints each buffer in MiB with two decimals (src/llama-kv-cache.cpp:291 "%8.2f"):
# within 5 KiB per buffer; a device sums up to a handful of buffers per component. 1 MiB is
# "to the MiB", the unit llama.cpp itself reports memory in.
MEMORY_TOLERANCE_BYTES = 1 * MiB
# Weights that leave a planned GPU and show up in host memory: weights are exact per device
# (the conformance grid), so anything beyond the log's rounding that moved is a spill.
SPILL_MIN_BYTES = MEMORY_TOLERANCE_BYTES
# Another process's memory on a GPU, beyond what was in use when the plan was made: a desktop's
# fluctuation is 0.1-0.3 GiB (real-cuda.md); below 256 MiB is noise.
OTHER_PROCESS_MIN_BYTES = 256 * MiB
# Decode far below the expected figure: the speed model's worst error on hardware it never saw
# is 1.64x (plan/calibration.py RATIO_BAND, benchmarks/speed_accuracy.py); below half of the
# expected speed is beyond that error with a margin.
SLOW_DECODE_RATIO = 0.5
# Minimum decoded tokens before /metrics' average is taken as a speed.
MIN_DECODE_TOKENS = 16


class Severity(enum.Enum):
    COSTS = "costs"  # costs speed or memory: exit code DIFFERS
    INFO = "info"


class FindingCode(enum.Enum):
    WEIGHTS_ON_CPU = "weights-on-cpu"
    KV_ON_CPU = "kv-on-cpu"
    CONTEXT_SMALLER = "context-smaller"
    SWAP_IN_USE = "swap-in-use"
    GPU_FULLER = "gpu-fuller"
    DECODE_SLOW = "decode-slow"
    MEMORY_DIFFERS = "memory-differs"
    COMPUTE_DIFFERS = "compute-differs"
    DEVICE_UNPLANNED = "device-unplanned"
    NOT_MEASURED = "not-measured"


SEVERITY = {
    FindingCode.WEIGHTS_ON_CPU: Severity.COSTS,
    FindingCode.KV_ON_CPU: Severity.COSTS,
    FindingCode.CONTEXT_SMALLER: Severity.COSTS,
    FindingCode.SWAP_IN_USE: Severity.COSTS,
    FindingCode.GPU_FULLER: Severity.COSTS,
    FindingCode.DECODE_SLOW: Severity.COSTS,
    FindingCode.MEMORY_DIFFERS: Severity.INFO,
    FindingCode.COMPUTE_DIFFERS: Severity.INFO,
    FindingCode.DEVICE_UNPLANNED: Severity.INFO,
    FindingCode.NOT_MEASURED: Severity.INFO,
}

COMPONENTS = ("weights_bytes", "kv_bytes", "recurrent_bytes", "compute_bytes", "output_bytes")
EXACT_COMPONENTS = ("weights_bytes", "kv_bytes", "recurrent_bytes")
HOST = "CPU"


@dataclass(frozen=True)
class Figures:
    """One device's memory, with the keys of `estimate --json`'s device rows."""

    device: str  # CUDA0, RPC0, ... or CPU (host memory)
    kind: str = "gpu"  # "gpu" | "host"
    weights_bytes: int = 0
    kv_bytes: int = 0
    recurrent_bytes: int = 0
    compute_bytes: int = 0
    output_bytes: int = 0  # the logits buffer (host)
    endpoint: str | None = None  # an RPC device's worker
    free_bytes: int | None = None  # the free memory the plan counted on (planned rows only)

    @property
    def total_bytes(self) -> int:
        return sum(getattr(self, c) for c in COMPONENTS)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"device": self.device, "kind": self.kind}
        out.update({c: getattr(self, c) for c in COMPONENTS})
        out["total_bytes"] = self.total_bytes
        if self.endpoint is not None:
            out["endpoint"] = self.endpoint
        if self.free_bytes is not None:
            out["free_bytes"] = self.free_bytes
        return out

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Figures:
        """From a record (serve's own file, but read back defensively): ValueError if bad."""
        if not isinstance(data, Mapping):
            raise ValueError("a device row is not an object")

        def count(key: str, required: bool = False) -> int | None:
            value = data.get(key)
            if value is None and not required:
                return None
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**62:
                raise ValueError(f"{key}: {value!r} is not a byte count")
            return value

        device, kind = data.get("device"), data.get("kind", "gpu")
        if not isinstance(device, str) or not device or len(device) > 200:
            raise ValueError("device: missing")
        if kind not in ("gpu", "host"):
            raise ValueError(f"kind: {kind!r}")
        endpoint = data.get("endpoint")
        return Figures(
            device=device,
            kind=kind,
            endpoint=endpoint if isinstance(endpoint, str) else None,
            free_bytes=count("free_bytes"),
            **{c: count(c) or 0 for c in COMPONENTS},
        )


@dataclass(frozen=True)
class PlannedServer:
    """What the plan expects of a running server."""

    devices: tuple[Figures, ...]  # llama.cpp's device order, the host last; () = no plan
    n_ctx: int  # the whole context (after llama.cpp's padding)
    n_parallel: int
    n_ctx_seq: int  # one slot's context: n_ctx, or n_ctx / n_parallel without -kvu
    decode_tps: float | None  # expected decode tok/s at the target context
    basis: str  # where the plan comes from, in words
    # memory calibration ratios the plan's compute figures already carry (device -> ratio)
    compute_ratios: tuple[tuple[str, float], ...] = ()
    build: str = ""  # the llama.cpp build the compute estimate is for (build_id), "" unknown

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute_ratios": [[d, r] for d, r in self.compute_ratios],
            "build": self.build,
            "devices": [d.to_dict() for d in self.devices],
            "n_ctx": self.n_ctx,
            "n_parallel": self.n_parallel,
            "n_ctx_seq": self.n_ctx_seq,
            "decode_tps": self.decode_tps,
            "basis": self.basis,
        }

    @staticmethod
    def from_dict(data: Any) -> PlannedServer:
        if not isinstance(data, dict):
            raise ValueError("not an object")
        devices = data.get("devices")
        if not isinstance(devices, list) or len(devices) > 256:
            raise ValueError("devices: not a list")
        n_ctx, n_parallel = data.get("n_ctx"), data.get("n_parallel")
        if not isinstance(n_ctx, int) or not 0 <= n_ctx < 2**40:
            raise ValueError("n_ctx")
        if not isinstance(n_parallel, int) or not 1 <= n_parallel < 2**20:
            raise ValueError("n_parallel")
        n_ctx_seq = data.get("n_ctx_seq")
        if not isinstance(n_ctx_seq, int) or not 0 <= n_ctx_seq <= n_ctx:
            raise ValueError("n_ctx_seq")
        tps = data.get("decode_tps")
        if tps is not None and (not isinstance(tps, (int, float)) or not math.isfinite(tps)):
            raise ValueError("decode_tps")
        basis = data.get("basis")
        ratios = data.get("compute_ratios") or []
        if not isinstance(ratios, list) or len(ratios) > 256:
            raise ValueError("compute_ratios")
        for item in ratios:
            if (
                not isinstance(item, list)
                or len(item) != 2
                or not isinstance(item[0], str)
                or not isinstance(item[1], (int, float))
                or isinstance(item[1], bool)
                or not math.isfinite(item[1])
                or item[1] <= 0
            ):
                raise ValueError("compute_ratios")
        return PlannedServer(
            devices=tuple(Figures.from_dict(d) for d in devices),
            n_ctx=n_ctx,
            n_parallel=n_parallel,
            n_ctx_seq=n_ctx_seq,
            decode_tps=float(tps) if tps is not None and tps > 0 else None,
            basis=basis[:500] if isinstance(basis, str) else "a recorded plan",
            compute_ratios=tuple((str(d), float(r)) for d, r in ratios),
            build=data["build"][:100] if isinstance(data.get("build"), str) else "",
        )


def planned_from_estimate(
    estimate: Any,
    *,
    decode_tps: float | None,
    basis: str,
    compute_ratios: tuple[tuple[str, float], ...] = (),
    build: str = "",
) -> PlannedServer:
    """From plan/memory.py's Estimate: the host's overhead is its output (logits) buffer; a
    GPU's overhead (CUDA context) is no llama.cpp buffer and is left out."""
    rows = []
    for d in estimate.devices:
        host = d.kind == "host"
        rows.append(
            Figures(
                device=HOST if host else d.device,
                kind=d.kind,
                weights_bytes=d.weights_bytes,
                kv_bytes=d.kv_bytes,
                recurrent_bytes=d.recurrent_bytes,
                compute_bytes=d.compute_bytes,
                output_bytes=d.overhead_bytes if host else 0,
                endpoint=d.endpoint,
                free_bytes=d.free_bytes,
            )
        )
    config = estimate.config
    n_parallel = max(1, config.n_parallel)
    return PlannedServer(
        devices=tuple(rows),
        n_ctx=estimate.n_ctx,
        n_parallel=n_parallel,
        n_ctx_seq=estimate.n_ctx if config.kv_unified else estimate.n_ctx // n_parallel,
        decode_tps=decode_tps,
        basis=basis,
        compute_ratios=compute_ratios,
        build=build,
    )


@dataclass(frozen=True)
class GpuUse:
    """One GPU as NVML sees it now."""

    device: str  # CUDA0 (NVML index order = CUDA order with CUDA_DEVICE_ORDER=PCI_BUS_ID)
    total_bytes: int
    used_bytes: int
    server_bytes: int | None  # this server's process (NVML per-process), None where unknown


@dataclass(frozen=True)
class Observed:
    """What the running server shows."""

    devices: tuple[Figures, ...] = ()  # from llama.cpp's buffer lines; () = no log read
    n_ctx_seq: int | None = None  # one slot's context
    n_ctx_from: str = ""
    offloaded: tuple[int, int] | None = None  # llama.cpp's "offloaded N/M layers to GPU"
    swap_bytes: int | None = None  # the server process's memory in swap (VmSwap)
    rss_bytes: int | None = None  # the server process's resident memory (VmRSS)
    gpus: tuple[GpuUse, ...] = ()
    decode_tps: float | None = None
    decode_from: str | None = None
    decode_tokens: int = 0
    problems: tuple[str, ...] = ()  # what could not be read


@dataclass(frozen=True)
class Finding:
    code: FindingCode
    message: str
    action: str
    device: str | None = None

    @property
    def severity(self) -> Severity:
        return SEVERITY[self.code]

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code.value,
            "severity": self.severity.value,
            "device": self.device,
            "message": self.message,
            "action": self.action,
        }


@dataclass(frozen=True)
class DeviceComparison:
    device: str
    planned: Figures | None
    measured: Figures | None

    def difference(self) -> dict[str, int] | None:
        """measured - planned, per component; None when either side is missing."""
        if self.planned is None or self.measured is None:
            return None
        return {c: getattr(self.measured, c) - getattr(self.planned, c) for c in COMPONENTS}

    def matches(self, components: Sequence[str] = EXACT_COMPONENTS) -> bool:
        diff = self.difference()
        return diff is not None and all(abs(diff[c]) <= MEMORY_TOLERANCE_BYTES for c in components)


@dataclass(frozen=True)
class CheckReport:
    planned: PlannedServer
    observed: Observed
    devices: tuple[DeviceComparison, ...]
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def as_planned(self) -> bool:
        """No finding that costs speed or memory."""
        return not any(f.severity is Severity.COSTS for f in self.findings)

    @property
    def spilled(self) -> bool:
        codes = {f.code for f in self.findings}
        return bool(
            codes & {FindingCode.WEIGHTS_ON_CPU, FindingCode.KV_ON_CPU, FindingCode.SWAP_IN_USE}
        )


_RPC = re.compile(r"^RPC\d+\[(?P<endpoint>.+)\]$")


def _key(fig: Figures, seen: dict[str, int]) -> str:
    """Matching planned and measured rows: local devices by name; an RPC device by its worker
    (llama.cpp's buffer says `RPC<device on the worker>[host:port]`, ggml-rpc.cpp:1092), the
    n-th device of one worker with the n-th."""
    m = _RPC.match(fig.device)
    endpoint = m.group("endpoint") if m else fig.endpoint
    if endpoint is None:
        return fig.device
    n = seen.get(endpoint, 0)
    seen[endpoint] = n + 1
    return f"rpc:{endpoint}:{n}"


def pair_devices(
    planned: Sequence[Figures], measured: Sequence[Figures]
) -> tuple[DeviceComparison, ...]:
    seen_p: dict[str, int] = {}
    seen_m: dict[str, int] = {}
    by_key = {_key(m, seen_m): m for m in measured}
    out = []
    used = set()
    for p in planned:
        key = _key(p, seen_p)
        m = by_key.get(key)
        used.add(key)
        out.append(DeviceComparison(p.device, p, m))
    for key, m in by_key.items():
        if key not in used:
            out.append(DeviceComparison(m.device, None, m))
    # the host last, as in the plan
    return tuple(sorted(out, key=lambda c: (c.planned or c.measured).kind == "host"))  # type: ignore[union-attr]


def _gib(n: int) -> str:
    return human(abs(n))


def _spill_findings(
    pairs: Sequence[DeviceComparison], offloaded: tuple[int, int] | None
) -> list[Finding]:
    out: list[Finding] = []
    host = next((c for c in pairs if c.planned is not None and c.planned.kind == "host"), None)
    host_m = host.measured if host else None
    host_p = host.planned if host else None
    extra_w = (host_m.weights_bytes - host_p.weights_bytes) if host_m and host_p else 0
    extra_kv = (host_m.kv_bytes - host_p.kv_bytes) if host_m and host_p else 0
    layers = (
        f" (llama.cpp offloaded {offloaded[0]}/{offloaded[1]} layers)"
        if offloaded and offloaded[0] < offloaded[1]
        else ""
    )
    for c in pairs:
        p = c.planned
        if p is None or p.kind != "gpu":
            continue
        m_w = c.measured.weights_bytes if c.measured else 0
        m_kv = c.measured.kv_bytes if c.measured else 0
        absent = (
            f": the server has no buffer on {p.device} at all (-ngl 0, --device none, a "
            "CPU-only build, or the GPU is not visible to it)"
            if c.measured is None
            else ""
        )
        lost_w = p.weights_bytes - m_w
        if lost_w >= SPILL_MIN_BYTES and extra_w >= SPILL_MIN_BYTES:
            out.append(
                Finding(
                    FindingCode.WEIGHTS_ON_CPU,
                    f"{_gib(min(lost_w, extra_w))} of weights the plan put on {p.device} are in "
                    f"host memory{layers}{absent}: those layers run at the speed of system RAM",
                    f"give {p.device} the memory the plan counted on, then restart with the "
                    "plan's flags (`quantpick command` prints them); llama.cpp's --fit moves "
                    "layers off a GPU that is fuller than it was",
                    p.device,
                )
            )
        lost_kv = p.kv_bytes - m_kv
        if p.kv_bytes and lost_kv >= SPILL_MIN_BYTES and extra_kv >= SPILL_MIN_BYTES:
            out.append(
                Finding(
                    FindingCode.KV_ON_CPU,
                    f"{_gib(min(lost_kv, extra_kv))} of KV cache the plan put on {p.device} is "
                    "in host memory: attention reads it over PCIe at every token",
                    "restart without -nkvo / --no-kv-offload and with the plan's -ngl",
                    p.device,
                )
            )
    return out


def _memory_findings(pairs: Sequence[DeviceComparison], spilled: bool) -> list[Finding]:
    out: list[Finding] = []
    for c in pairs:
        diff = c.difference()
        if c.planned is None and c.measured is not None and c.measured.total_bytes:
            out.append(
                Finding(
                    FindingCode.DEVICE_UNPLANNED,
                    f"the server uses {c.device} ({_gib(c.measured.total_bytes)}), which the plan "
                    "does not",
                    "check the server's --device and device-visibility variable against the plan",
                    c.device,
                )
            )
            continue
        if diff is None:
            continue
        off = [k for k in EXACT_COMPONENTS if abs(diff[k]) > MEMORY_TOLERANCE_BYTES]
        if off and not spilled:
            words = ", ".join(
                f"{k.removesuffix('_bytes')} {'+' if diff[k] > 0 else '-'}{_gib(diff[k])}"
                for k in off
            )
            out.append(
                Finding(
                    FindingCode.MEMORY_DIFFERS,
                    f"{c.device}: {words} against the plan (exact to the MiB when the server "
                    "runs the planned file and flags)",
                    "the server runs another file or other flags than planned: compare its "
                    "command line with the plan's",
                    c.device,
                )
            )
        if (
            abs(diff["compute_bytes"]) > MEMORY_TOLERANCE_BYTES
            and c.planned
            and c.planned.compute_bytes
        ):
            sign = "+" if diff["compute_bytes"] > 0 else "-"
            out.append(
                Finding(
                    FindingCode.COMPUTE_DIFFERS,
                    f"{c.device}: compute buffers {_gib(c.measured.compute_bytes)} "  # type: ignore[union-attr]
                    f"({sign}{_gib(diff['compute_bytes'])} against the estimate of "
                    f"{_gib(c.planned.compute_bytes)})",
                    "nothing to do: compute is an estimate; this measurement can calibrate "
                    "later plans (quantpick check --learn)",
                    c.device,
                )
            )
    return out


def _gpu_findings(planned: PlannedServer, gpus: Sequence[GpuUse]) -> list[Finding]:
    out: list[Finding] = []
    plan_by = {d.device: d for d in planned.devices if d.kind == "gpu"}
    for g in gpus:
        p = plan_by.get(g.device)
        if p is None or p.free_bytes is None or g.server_bytes is None:
            continue
        others_now = max(0, g.used_bytes - g.server_bytes)
        others_then = max(0, g.total_bytes - p.free_bytes)
        grown = others_now - others_then
        if grown >= OTHER_PROCESS_MIN_BYTES:
            out.append(
                Finding(
                    FindingCode.GPU_FULLER,
                    f"other processes use {_gib(others_now)} of {g.device} now, "
                    f"{_gib(grown)} more than when the plan was made",
                    "close what took it (nvidia-smi lists the processes), or plan again for "
                    "the memory that is free now",
                    g.device,
                )
            )
    return out


def compare(planned: PlannedServer, observed: Observed) -> CheckReport:
    """The running server beside its plan, and the findings."""
    pairs = (
        pair_devices(planned.devices, observed.devices)
        if observed.devices
        else tuple(DeviceComparison(p.device, p, None) for p in planned.devices)
    )
    findings: list[Finding] = []
    if observed.devices and planned.devices:
        findings += _spill_findings(pairs, observed.offloaded)
    spilled = bool(findings)
    if observed.n_ctx_seq is not None and observed.n_ctx_seq < planned.n_ctx_seq:
        findings.append(
            Finding(
                FindingCode.CONTEXT_SMALLER,
                f"a slot of the server holds {observed.n_ctx_seq} tokens "
                f"({observed.n_ctx_from}), the plan {planned.n_ctx_seq}: longer conversations "
                "are cut or refused",
                "start it with the plan's -c and -np; llama.cpp's --fit shrinks the context "
                "when memory is short: free the memory the plan counted on, or start it with "
                "--fit off to see why it does not fit",
            )
        )
    if observed.swap_bytes:
        findings.append(
            Finding(
                FindingCode.SWAP_IN_USE,
                f"{_gib(observed.swap_bytes)} of the server's memory is in swap: tokens wait "
                "on the disk",
                "free RAM (close programs, or plan with a larger --ram-reserve), or use a "
                "smaller quant; mlock (--mlock) keeps the weights in RAM",
            )
        )
    findings += _gpu_findings(planned, observed.gpus)
    if (
        observed.decode_tps is not None
        and planned.decode_tps
        and observed.decode_tps < SLOW_DECODE_RATIO * planned.decode_tps
    ):
        findings.append(
            Finding(
                FindingCode.DECODE_SLOW,
                f"decode runs at {observed.decode_tps:.1f} tok/s ({observed.decode_from}), the "
                f"plan expected ~{planned.decode_tps:.0f}",
                "look at the other findings (a spill, swap, a busy GPU); a server busy with "
                "other requests also decodes slower per request",
            )
        )
    if observed.devices and planned.devices:
        findings += _memory_findings(pairs, spilled)
    for problem in observed.problems:
        findings.append(
            Finding(FindingCode.NOT_MEASURED, problem, "nothing: said for completeness")
        )
    return CheckReport(planned, observed, pairs, tuple(findings))
