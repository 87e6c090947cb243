"""Described machines: plan for a machine that is not (exactly) this one.

Precedence (resolve_machine), strongest last:
1. the base: `--hardware FILE` if given, else this machine's host (with `--gpu`), else the probe;
2. `--gpu NAME[:VRAM[:BANDWIDTH]]` (repeatable) replaces the base's GPUs, in the given order;
3. `--ram SIZE` replaces host RAM (total and available);
4. `--cpu-only` drops every GPU (and the file's RPC workers);
5. `--rpc HOST:PORT` (probed now) and `--rpc-device HOST:PORT=GPU[:VRAM[:BANDWIDTH]]` (described)
   replace the base's RPC workers; `--rpc-bandwidth` / `--rpc-latency` set every worker's link.
Anything but the plain probe is `described=True`, with `source` saying how it was described;
workers probed with `--rpc` keep a probed machine probed.

Usage:
    resolve_machine(gpus=["3090", "t4"])          # the reference box: RTX 3090 + Tesla T4
    resolve_machine(hardware_file=Path("box.json"), ram="64G")
    parse_gpu_spec("4090:24G:1008GB/s")

Hardware files: the JSON `quantpick probe --json` prints (`{"schema_version": 1, "machine":
{...}}`, or a bare machine dict), or hand-written TOML:

    gpus = ["3090", "t4"]          # shorthand, or tables:
    [[gpu]]
    name = "3090"                  # catalog name, or any name when vram is given
    vram = "24G"                   # optional for catalog cards (binary units, as --ram)
    bandwidth = "936GB/s"          # optional (decimal units, as data sheets)
    [host]
    ram = "64G"
    ram_available = "60G"          # optional, default = ram
    cores = 16
    threads = 32                   # optional
    ram_bandwidth = "80GB/s"       # optional
    [[rpc]]                        # an llama.cpp RPC worker (ggml-rpc-server), in --rpc order
    endpoint = "192.168.1.20:50052"
    gpus = ["t4"]                  # described devices ([[rpc.gpu]] tables as above also work);
                                   # none: the worker is probed when the file is read
    bandwidth = "117MB/s"          # optional: the link to it (default 1 GbE goodput)
    latency = "0.3ms"              # optional: request/response round trip

RPC workers: `--rpc` endpoints first, in the given order, then endpoints that only
`--rpc-device` names, in order of first mention; that is llama-server's `--rpc` order and
so its device order (RPC0, RPC1, ...). An endpoint given both ways is probed for its memory and
described for what its devices are (by position).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from quantpick.errors import HardwareError, QuantpickError, RpcWorkerError, UsageError
from quantpick.machine.backends import (
    Backend,
    BackendKind,
    backend,
    default_backend,
    default_gpu_backend,
)
from quantpick.machine.backends import names as backend_names
from quantpick.machine.catalog import (
    GpuModel,
    find_gpu,
    gpu_assumption_notes,
    lookup_gpu,
    unified_share,
    with_catalog_figures,
)
from quantpick.machine.spec import (
    ASSUMED_HOST_BANDWIDTH_BYTES_PER_S,
    ASSUMED_HOST_CORES,
    ASSUMED_HOST_RAM_BYTES,
    ASSUMED_HOST_SOURCE,
    ASSUMED_HOST_THREADS,
    MAX_BANDWIDTH_BYTES_PER_S,
    MAX_CPUS,
    MAX_DEVICES,
    Gpu,
    Host,
    Machine,
    RpcWorker,
    TooManyDevices,
    check_machine,
    machine_from_dict,
    too_many_devices,
)
from quantpick.units import gib, parse_size, size_note

# The reference box the planner is tuned on: `--gpu 3090 --gpu t4`.
REFERENCE_GPUS: tuple[str, ...] = ("3090", "t4")

HARDWARE_SCHEMA_VERSION = 1
# A `probe --json` file of 15 GPUs and workers is ~15 KB; a hand-written TOML a few hundred bytes.
MAX_HARDWARE_FILE_BYTES = 1024**2

_BANDWIDTH_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*(?:/\s*s)?\s*$")
# A bandwidth with no unit is in GB/s, as data sheets state it ("936" = 936 GB/s), the way a bare
# size is GiB (units.BARE_SIZE_UNIT); above 1 PB/s a bare number is refused as a likely B/s count.
BARE_BANDWIDTH_UNIT = 10**9
MAX_BARE_BANDWIDTH = 10**6
# Decimal, as data sheets state bandwidth ("936 GB/s" = 936e9 B/s); explicit GiB/s is binary.
_BANDWIDTH_UNITS = {
    "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6,
    "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}  # fmt: skip


def parse_bandwidth(text: str) -> int:
    """'936GB/s', '936G', '1.8TB/s', '936' -> bytes/s. Decimal units (G = 1e9), except GiB/s;
    no unit = GB/s."""
    match = _BANDWIDTH_RE.match(text)
    unit = match.group(2).lower() if match else None
    hint = "write e.g. 936GB/s or 936G (a bare number is GB/s; bytes/s need a B: 5000B/s)"
    if match is None or (unit != "" and unit not in _BANDWIDTH_UNITS):
        raise UsageError(f"cannot read bandwidth {text!r}", hint=hint)
    value = float(match.group(1))
    if unit == "":
        if value > MAX_BARE_BANDWIDTH:
            raise UsageError(
                f"bandwidth {text!r}: a number without a unit is GB/s, and {match.group(1)} GB/s "
                "is not a memory bus",
                hint=f"for bytes/s write {match.group(1)}B/s; or a unit, e.g. 936GB/s",
            )
        result = int(value * BARE_BANDWIDTH_UNIT)
    else:
        result = int(value * _BANDWIDTH_UNITS[unit])
    # 0 is no bandwidth, not "the catalogue's figure": a device that moves nothing is a typo.
    if result <= 0:
        raise UsageError(f"bandwidth {text!r}: a bandwidth must be more than 0", hint=hint)
    if result > MAX_BANDWIDTH_BYTES_PER_S:
        raise UsageError(
            f"bandwidth {text!r} is more than 100 TB/s, 20x the fastest GPU's memory", hint=hint
        )
    return result


def bare_number_notes(what: str, text: str, unit: str) -> list[str]:
    """The note the CLI prints for a unit-less size or bandwidth: never a silent guess."""
    from quantpick.units import is_bare_number

    if not is_bare_number(text):
        return []
    return [f"{what} is read as {str(text).strip()} {unit} (no unit: sizes GiB, bandwidths GB/s)"]


def size_notes(what: str, text: str | int | float) -> list[str]:
    """The note for a size that could be read two ways (units.size_note): bare or "GB"."""
    note = size_note(what, text)
    return [note] if note is not None else []


def _gpu_spec_notes(spec: str, label: str | None = None) -> list[str]:
    """How NAME:VRAM:BANDWIDTH's numbers are read; `label` is what the user wrote (default
    `--gpu SPEC`)."""
    label = label or f"--gpu {spec}"
    parts = spec.split(":")
    notes: list[str] = []
    if len(parts) > 1 and parts[1].strip():
        notes += size_notes(f"{label}: VRAM {parts[1].strip()}", parts[1])
    if len(parts) > 2 and parts[2].strip():
        notes += bare_number_notes(f"{label}: bandwidth {parts[2]}", parts[2], "GB/s")
    return notes


def gpu_backend(model: GpuModel | None, name: str, backend_name: str | None) -> Backend:
    """The backend that drives a described GPU: --backend if given (refused when it cannot drive
    the card's vendor: Metal on a Radeon), else the vendor's usual one; an unknown card: the
    default GPU backend unless --backend says otherwise."""
    if backend_name is None:
        return default_backend(model.vendor) if model is not None else default_gpu_backend()
    chosen = backend(backend_name)
    if chosen.kind is BackendKind.CPU:
        raise UsageError(f"--backend cpu drives no GPU: drop --gpu {name}, or plan with --cpu-only")
    if model is not None and not chosen.drives(model.vendor):
        usual = default_backend(model.vendor)
        raise UsageError(
            f"--backend {chosen.key} cannot drive {model.name} ({chosen.label} drives "
            f"{', '.join(v.value for v in chosen.vendors)} GPUs)",
            hint=f"use --backend {usual.key} or vulkan",
        )
    return chosen


def describe_gpu(
    name: str,
    *,
    vram_bytes: int | None = None,
    bandwidth: int | None = None,
    index: int = 0,
    backend_name: str | None = None,
) -> Gpu:
    """A described GPU: a catalog NAME fills in everything (VRAM and bandwidth then override
    it); any other NAME needs VRAM. free = total: the planner's per-device overhead covers the
    driver's share. A unified GPU's VRAM is the machine's RAM; the GPU gets the OS's share of it
    (catalog.unified_share).
    """
    if vram_bytes is not None and vram_bytes <= 0:
        raise UsageError(f"GPU {name!r}: VRAM must be more than 0")
    try:
        model = lookup_gpu(name)
    except UsageError:
        if vram_bytes is None:
            raise
        # A card the catalog does not know, fully described by the user.
        chosen = gpu_backend(None, name, backend_name)
        return Gpu(index=index, name=name, total_bytes=vram_bytes, free_bytes=vram_bytes,
                   used_bytes=0, bandwidth_bytes_per_s=bandwidth, backend=chosen.label)  # fmt: skip
    chosen = gpu_backend(model, name, backend_name)
    total = vram_bytes if vram_bytes is not None else model.total_bytes
    if model.unified:
        total = unified_share(model, total)[0]
    return Gpu(
        index=index,
        name=model.name,
        total_bytes=total,
        free_bytes=total,
        used_bytes=0,
        memory_bus_width_bits=model.bus_width_bits,
        # A given bandwidth no longer follows from the catalog clock; drop the clock, not the bus.
        memory_clock_mhz=model.memory_clock_mhz or None if bandwidth is None else None,
        bandwidth_bytes_per_s=bandwidth if bandwidth is not None else model.bandwidth_bytes_per_s,
        pcie_generation=model.pcie_generation,
        pcie_width=model.pcie_width,
        compute_capability=model.compute_capability or None,
        fp16_tflops=model.fp16_tflops,
        backend=chosen.label,
        unified=model.unified or chosen.always_unified,
    )


def unified_ram(spec: str) -> tuple[int, str] | None:
    """For a unified GPU's spec (m4-max:128G), the machine's RAM it names and the GPU share's
    rule; None for a discrete card."""
    parts = spec.split(":")
    model = find_gpu(parts[0].strip())
    if model is None or not model.unified:
        return None
    ram = parse_size(parts[1]) if len(parts) > 1 and parts[1].strip() else model.total_bytes
    return ram, unified_share(model, ram)[1]


def parse_gpu_spec(spec: str, *, index: int = 0, backend_name: str | None = None) -> Gpu:
    """A described GPU from NAME[:VRAM[:BANDWIDTH]] (VRAM binary like --ram, BANDWIDTH decimal)."""
    parts = spec.split(":")
    if len(parts) > 3 or not parts[0].strip():
        raise UsageError(
            f"cannot read GPU {spec!r}", hint="write NAME[:VRAM[:BANDWIDTH]], e.g. 3090 or 4090:24G"
        )
    vram = parse_size(parts[1]) if len(parts) > 1 and parts[1].strip() else None
    bandwidth = parse_bandwidth(parts[2]) if len(parts) > 2 and parts[2].strip() else None
    return describe_gpu(
        parts[0].strip(), vram_bytes=vram, bandwidth=bandwidth, index=index,
        backend_name=backend_name,
    )  # fmt: skip


# --- RPC workers ------------------------------------------------------------------------------


def parse_endpoint(text: str) -> tuple[str, int]:
    """machine.rpc.parse_endpoint, imported on use (socket costs start-up time)."""
    from quantpick.machine.rpc import parse_endpoint as parse

    return parse(text)


_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|ms|us|µs)\s*$")
_DURATION_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


def parse_duration(text: str) -> float:
    """'0.3ms', '300us', '0.002s' -> seconds (a unit is required: '0.3' alone is ambiguous)."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise UsageError(f"cannot read duration {text!r}", hint="write e.g. 0.3ms or 300us")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def parse_rpc_device_spec(spec: str, *, index: int = 0) -> tuple[str, int, Gpu]:
    """HOST:PORT=GPU[:VRAM[:BANDWIDTH]] -> (host, port, the described device)."""
    endpoint, sep, gpu = spec.partition("=")
    if not sep or not gpu.strip():
        raise UsageError(
            f"cannot read RPC device {spec!r}",
            hint="write HOST:PORT=GPU[:VRAM[:BANDWIDTH]], e.g. 192.168.1.20:50052=t4",
        )
    host, port = parse_endpoint(endpoint)
    return host, port, parse_gpu_spec(gpu, index=index)


def _described_onto_probed(worker: RpcWorker, described: list[Gpu]) -> RpcWorker:
    """What the devices are (catalogue) from the description, their memory from the probe."""
    if len(described) != len(worker.devices):
        raise UsageError(
            f"RPC worker {worker.endpoint} serves {len(worker.devices)} device(s), "
            f"--rpc-device describes {len(described)}",
            hint="describe each of its devices, in its -d order",
        )
    merged = tuple(
        dataclasses.replace(
            desc,
            index=probed.index,
            total_bytes=probed.total_bytes,
            free_bytes=probed.free_bytes,
            used_bytes=probed.used_bytes,
        )
        for desc, probed in zip(described, worker.devices, strict=True)
    )
    return dataclasses.replace(worker, devices=merged)


def resolve_rpc_workers(
    rpc: Sequence[str] = (),
    rpc_devices: Sequence[str] = (),
    *,
    timeout_s: float | None = None,
    notes: list[str] | None = None,
) -> tuple[RpcWorker, ...]:
    """The workers of `--rpc` (probed now) and `--rpc-device` (described), in --rpc order.

    Every spec is parsed before any worker is contacted, so bad input fails fast.
    """
    from quantpick.machine import probe as hardware
    from quantpick.machine.rpc import resolve_ipv4

    probed = [parse_endpoint(e) for e in rpc]
    described: dict[tuple[str, int], list[Gpu]] = {}
    for spec in rpc_devices:
        host, port, gpu = parse_rpc_device_spec(spec)
        devices = described.setdefault((host, port), [])
        devices.append(dataclasses.replace(gpu, index=len(devices)))
    order = list(dict.fromkeys([*probed, *described]))
    if len(set(probed)) != len(probed):
        twice = next(e for e in probed if probed.count(e) > 1)
        raise UsageError(f"--rpc {twice[0]}:{twice[1]} is given twice")
    # "localhost:50052" and "127.0.0.1:50052" are one worker: refused before either is read
    # (both read at once, the second would wait behind the first).
    by_address: dict[tuple[str, int], str] = {}
    for host, port in probed:
        address = resolve_ipv4(host)
        if address is None:
            continue
        if (address, port) in by_address:
            raise UsageError(f"--rpc {by_address[(address, port)]} and {host}:{port} are the "
                             "same worker")  # fmt: skip
        by_address[(address, port)] = f"{host}:{port}"
    # Every probed worker at once: the whole probe is bounded by one exchange's deadline.
    read = dict(zip(probed, hardware.probe_rpc_workers(probed, timeout_s=timeout_s), strict=True))
    workers: list[RpcWorker] = []
    for host, port in order:
        if (host, port) in probed:
            worker, worker_notes = read[(host, port)]
            if notes is not None:
                notes.extend(worker_notes)
            if (host, port) in described:
                worker = _described_onto_probed(worker, described[(host, port)])
        else:
            worker = RpcWorker(host=host, port=port, devices=tuple(described[(host, port)]))
        workers.append(worker)
    # "localhost:50052" and "127.0.0.1:50052" are one worker to the kernel but two to
    # llama-server, whose second connection would wait forever behind the first.
    seen: dict[tuple[str, int], str] = {}
    for w in workers:
        if w.address is None:
            continue
        key = (w.address, w.port)
        if key in seen:
            raise UsageError(f"--rpc {seen[key]} and {w.endpoint} are the same worker")
        seen[key] = w.endpoint
    return tuple(workers)


def with_network(
    workers: Sequence[RpcWorker], *, bandwidth: str | None = None, latency: str | None = None
) -> tuple[RpcWorker, ...]:
    """Every worker's link set from --rpc-bandwidth / --rpc-latency (None: kept)."""
    bw = parse_bandwidth(bandwidth) if bandwidth is not None else None
    rtt = parse_duration(latency) if latency is not None else None
    if bw is not None and bw <= 0:
        raise UsageError("--rpc-bandwidth must be more than 0")
    out = []
    for w in workers:
        net = w.network
        if bw is not None:
            net = dataclasses.replace(
                net, bandwidth_bytes_per_s=bw, bandwidth_source="--rpc-bandwidth"
            )
        if rtt is not None:
            net = dataclasses.replace(net, rtt_s=rtt, rtt_source="--rpc-latency")
        out.append(dataclasses.replace(w, network=net))
    return tuple(out)


# --- Hardware files ---------------------------------------------------------------------------


def _check_endpoints(machine: Machine) -> None:
    for i, worker in enumerate(machine.rpc_workers):
        if not isinstance(worker.host, str) or not isinstance(worker.port, int):
            raise ValueError(f"rpc_workers[{i}] needs host and port")
        parse_endpoint(worker.endpoint)


_DEVICES_HINT = "describe the devices one llama-server is to use"


def _machine_from_json(data: Any, path: Path) -> Machine:
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    version = data.get("schema_version", HARDWARE_SCHEMA_VERSION)
    if version != HARDWARE_SCHEMA_VERSION:
        raise ValueError(f"schema_version {version} is not supported (this quantpick reads 1)")
    if "machine" in data:
        data = data["machine"]
        if not isinstance(data, dict):
            raise ValueError("'machine' must be an object")
    if "host" not in data:
        raise ValueError("no 'host' (is this a `quantpick probe --json` file?)")
    # Counted before anything is built: a file of a million GPUs fails here, at once.
    gpus, workers = data.get("gpus") or [], data.get("rpc_workers") or []
    if isinstance(gpus, list) and isinstance(workers, list):
        count = len(gpus) + sum(
            len(w.get("devices") or []) for w in workers if isinstance(w, dict)
            and isinstance(w.get("devices") or [], list)
        )  # fmt: skip
        if count > MAX_DEVICES:
            raise ValueError(too_many_devices(count))
    try:
        machine = machine_from_dict(data)
    except (TypeError, AttributeError) as exc:
        raise ValueError(f"unexpected value ({exc})") from exc
    check_machine(machine)
    _check_endpoints(machine)
    # The notes its probe wrote are about the machine it was written on, as it was then: say so.
    return dataclasses.replace(
        machine, notes=tuple(_from_file(path, note) for note in machine.notes)
    )


def _from_file(path: Path, note: str) -> str:
    prefix = "hardware file "
    return note if note.startswith(prefix) else f"{prefix}{path.name} records: {note}"


def _toml_amount(
    table: dict[str, Any],
    key: str,
    where: str,
    parse: Callable[[str], int],
    example: str,
    notes: list[str] | None,
) -> int | None:
    """A string for `parse` ("24G", "936GB/s"), or a bare number read as `parse` reads one
    without a unit (GiB, GB/s: the same rule as the flags); None when absent."""
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = repr(value)
    if isinstance(value, str):
        if notes is not None:
            what = f"{where}.{key} = {value}"
            notes.extend(
                size_notes(what, value)
                if parse is parse_size
                else bare_number_notes(what, value, "GB/s")
            )
        return parse(value)
    raise ValueError(f"{where}.{key} must be like {example!r}")


def _toml_size(
    table: dict[str, Any], key: str, where: str, notes: list[str] | None = None
) -> int | None:
    return _toml_amount(table, key, where, parse_size, "24G", notes)


def _toml_bandwidth(
    table: dict[str, Any], key: str, where: str, notes: list[str] | None = None
) -> int | None:
    return _toml_amount(table, key, where, parse_bandwidth, "936GB/s", notes)


def _only(table: Any, keys: set[str], where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table")
    unknown = sorted(set(table) - keys)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(keys))})")
    return table


def _toml_gpus(data: dict[str, Any], notes: list[str], prefix: str = "") -> tuple[Gpu, ...]:
    """`gpus = ["3090", ...]` then `[[gpu]]` tables, indexed in that order."""
    specs: list[Gpu] = []
    names = data.get("gpus", [])
    if not isinstance(names, list):
        raise ValueError(f'{prefix}gpus must be a list of names, e.g. gpus = ["3090", "t4"]')
    for spec in names:
        if not isinstance(spec, str):
            raise ValueError(f'{prefix}gpus must be a list of names, e.g. gpus = ["3090", "t4"]')
        notes += _gpu_spec_notes(spec)
        specs.append(parse_gpu_spec(spec))
    tables = data.get("gpu", [])
    if not isinstance(tables, list):
        raise ValueError(f"[[{prefix}gpu]] must be an array of tables")
    if len(names) + len(tables) > MAX_DEVICES:
        raise ValueError(too_many_devices(len(names) + len(tables)))
    for i, table in enumerate(tables):
        where = f"[[{prefix}gpu]] #{i + 1}"
        table = _only(table, {"name", "vram", "bandwidth", "free", "backend"}, where)
        if not isinstance(table.get("name"), str):
            raise ValueError(f'{where}: needs name = "..."')
        chosen = table.get("backend")
        if chosen is not None and not isinstance(chosen, str):
            raise ValueError(f'{where}: backend = "rocm" ({", ".join(backend_names())})')
        try:
            gpu = describe_gpu(
                table["name"],
                vram_bytes=_toml_size(table, "vram", where, notes),
                bandwidth=_toml_bandwidth(table, "bandwidth", where, notes),
                backend_name=chosen,
            )
        except UsageError as exc:
            if chosen is None:
                raise
            raise ValueError(f"{where}: {exc.message}") from None
        free = _toml_size(table, "free", where, notes)
        if free is not None:
            if free > gpu.total_bytes:
                raise ValueError(
                    f"{where}: free ({gib(free)}) is more than the card's {gib(gpu.total_bytes)}"
                )
            gpu = dataclasses.replace(gpu, free_bytes=free)
        specs.append(gpu)
    return tuple(dataclasses.replace(g, index=i) for i, g in enumerate(specs))


def _toml_workers(data: dict[str, Any], notes: list[str]) -> tuple[RpcWorker, ...]:
    """`[[rpc]]` tables: described when they list devices, else probed now."""
    from quantpick.machine import probe as hardware

    tables = data.get("rpc", [])
    if not isinstance(tables, list):
        raise ValueError("[[rpc]] must be an array of tables")
    if len(tables) > MAX_DEVICES:  # before any worker is contacted
        raise ValueError(too_many_devices(len(tables)))
    workers = []
    for i, table in enumerate(tables):
        where = f"[[rpc]] #{i + 1}"
        table = _only(table, {"endpoint", "gpus", "gpu", "bandwidth", "latency"}, where)
        if not isinstance(table.get("endpoint"), str):
            raise ValueError(f'{where}: needs endpoint = "HOST:PORT"')
        host, port = parse_endpoint(table["endpoint"])
        devices = _toml_gpus(table, notes, prefix="rpc.")
        if devices:
            worker = RpcWorker(host=host, port=port, devices=devices)
        else:
            worker, worker_notes = hardware.probe_rpc_worker(host, port)
            notes.extend(worker_notes)
        net = worker.network
        bandwidth = _toml_bandwidth(table, "bandwidth", where, notes)
        if bandwidth is not None:
            net = dataclasses.replace(
                net, bandwidth_bytes_per_s=bandwidth, bandwidth_source="hardware file"
            )
        latency = table.get("latency")
        if latency is not None:
            if not isinstance(latency, str):
                raise ValueError(f'{where}.latency must be like "0.3ms"')
            net = dataclasses.replace(
                net, rtt_s=parse_duration(latency), rtt_source="hardware file"
            )
        workers.append(dataclasses.replace(worker, network=net))
    return tuple(workers)


def _machine_from_toml(data: dict[str, Any], default_host: Callable[[], Host] | None) -> Machine:
    _only(data, {"gpu", "gpus", "host", "disk_free", "rpc", "schema_version"}, "the file")
    notes: list[str] = []
    gpus = _toml_gpus(data, notes)

    if "host" in data:
        host_t = _only(
            data["host"], {"ram", "ram_available", "cores", "threads", "ram_bandwidth"}, "[host]"
        )
        ram = _toml_size(host_t, "ram", "[host]", notes)
        cores = host_t.get("cores")
        if ram is None or not isinstance(cores, int) or isinstance(cores, bool):
            raise ValueError('[host] needs ram = "64G" and cores = N')
        if ram <= 0:
            raise ValueError("[host].ram must be more than 0")
        threads = host_t.get("threads")
        for key, count in (("cores", cores), ("threads", threads)):
            if count is not None and (
                not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_CPUS
            ):
                raise ValueError(
                    f"[host].{key} = {count!r}: a CPU count is a whole number from 1 to {MAX_CPUS}"
                )
        available = _toml_size(host_t, "ram_available", "[host]", notes)
        if available is not None and available > ram:
            raise ValueError(
                f"[host].ram_available ({gib(available)}) is more than [host].ram ({gib(ram)})"
            )
        host = Host(
            ram_total_bytes=ram,
            ram_available_bytes=available if available is not None else ram,
            cpu_cores=cores,
            cpu_threads=threads if threads is not None else 2 * cores,
            ram_bandwidth_bytes_per_s=_toml_bandwidth(host_t, "ram_bandwidth", "[host]", notes),
            assumed=("threads",) if threads is None else (),
        )
    elif default_host is not None:
        host = default_host()
    else:
        raise ValueError('no [host] table (add [host] ram = "64G" cores = 16)')
    workers = _toml_workers(data, notes)
    count = len(gpus) + sum(len(w.devices) for w in workers)
    if count > MAX_DEVICES:
        raise ValueError(too_many_devices(count))
    machine = Machine(
        gpus=gpus,
        host=host,
        disk_free_bytes=_toml_size(data, "disk_free", "the file", notes),
        rpc_workers=workers,
        notes=tuple(notes),
    )
    check_machine(machine)
    return machine


def load_hardware_file(path: Path, *, default_host: Callable[[], Host] | None = None) -> Machine:
    """A described machine from JSON (`probe --json`) or TOML; any problem is one HardwareError.

    default_host supplies the host when a TOML file has no [host] table.
    The result keeps the file's fields; resolve_machine marks it described.
    """
    from quantpick.config import read_bounded_text
    from quantpick.local_files import PIPE_TIMEOUT_S

    try:
        # `--hardware <(ssh box quantpick probe --json)`: a pipe is read too, bounded
        text = read_bounded_text(path, MAX_HARDWARE_FILE_BYTES, pipe_timeout_s=PIPE_TIMEOUT_S)
    except OSError as exc:
        raise HardwareError(
            f"cannot read hardware file {path}: {exc.strerror or exc}",
            path=str(path),
            os_errno=exc.errno,
        ) from None
    except UnicodeDecodeError:
        raise HardwareError(f"hardware file {path} is not text (expected JSON or TOML)") from None
    as_json = path.suffix.lower() == ".json" or (
        path.suffix.lower() != ".toml" and text.lstrip().startswith("{")
    )
    try:
        if as_json:
            from quantpick.config import load_json_text

            return _machine_from_json(load_json_text(text), path)
        from quantpick.config import load_toml_text

        return _machine_from_toml(load_toml_text(text), default_host)
    except RpcWorkerError:
        raise  # a worker the file names is unreachable or busy: exit 6, as with --rpc
    except (ValueError, KeyError, QuantpickError) as exc:
        message = exc.message if isinstance(exc, QuantpickError) else str(exc)
        hint = exc.hint if isinstance(exc, QuantpickError) else None
        if isinstance(exc, KeyError):
            message = f"missing {exc}"
        raise HardwareError(f"hardware file {path}: {message}", hint=hint) from None


# --- Resolution -------------------------------------------------------------------------------


def _with_ram(host: Host, ram_bytes: int) -> Host:
    return dataclasses.replace(
        host,
        ram_total_bytes=ram_bytes,
        ram_available_bytes=ram_bytes,
        cgroup_limit_bytes=None,
        assumed=tuple(a for a in host.assumed if a != "ram"),
    )


def typical_host() -> Host:
    """A described machine's host when nothing describes it: the most common desktop
    (machine.spec ASSUMED_HOST_*), never the box quantpick runs on."""
    return Host(
        ram_total_bytes=ASSUMED_HOST_RAM_BYTES,
        ram_available_bytes=ASSUMED_HOST_RAM_BYTES,
        cpu_cores=ASSUMED_HOST_CORES,
        cpu_threads=ASSUMED_HOST_THREADS,
        assumed=("cores", "threads", "ram"),
    )


def check_cpu(cores: int | None, threads: int | None) -> None:
    if cores is not None and cores < 1:
        raise UsageError(f"--cores {cores}: at least 1")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads {threads}: at least 1")
    if cores is not None and threads is not None and threads < cores:
        raise UsageError(f"--threads {threads} is fewer than --cores {cores}")


def with_cpu(host: Host, *, cores: int | None, threads: int | None, bandwidth: int | None) -> Host:
    """`host` with --cores / --threads / --ram-bandwidth applied, and `assumed` saying which
    figures are still assumptions (a bandwidth nobody gave is the planner's default)."""
    assumed = set(host.assumed)
    changes: dict[str, Any] = {}
    if cores is not None:
        changes["cpu_cores"] = cores
        assumed.discard("cores")
        if threads is None and ("threads" in assumed or (host.cpu_threads or 0) < cores):
            # two threads per core, as on the usual desktop CPU, until told otherwise
            changes["cpu_threads"] = 2 * cores
            assumed.add("threads")
    if threads is not None:
        changes["cpu_threads"] = threads
        assumed.discard("threads")
        if cores is None and threads < host.cpu_cores:
            raise UsageError(f"--threads {threads} is fewer than the {host.cpu_cores} cores")
    if bandwidth is not None:
        changes["ram_bandwidth_bytes_per_s"] = bandwidth
    if (bandwidth or host.ram_bandwidth_bytes_per_s) is None:
        assumed.add("ram_bandwidth")
    else:
        assumed.discard("ram_bandwidth")
    order = ("cores", "threads", "ram", "ram_bandwidth")
    changes["assumed"] = tuple(a for a in order if a in assumed)
    return dataclasses.replace(host, **changes)


def assumed_host_note(host: Host) -> str | None:
    """The note naming a described host's assumed figures (None when nothing is assumed but
    the bandwidth, whose assumption the speed basis names)."""
    parts = []
    if "cores" in host.assumed:
        parts.append(f"{host.cpu_cores} CPU cores (--cores)")
    if "threads" in host.assumed:
        parts.append(f"{host.cpu_threads} threads (--threads)")
    if "ram" in host.assumed:
        parts.append(f"{host.ram_total_bytes / 1024**3:g} GiB RAM (--ram)")
    if not parts:
        return None
    if "ram_bandwidth" in host.assumed:
        parts.append(
            f"{ASSUMED_HOST_BANDWIDTH_BYTES_PER_S / 1e9:g} GB/s RAM bandwidth (--ram-bandwidth; "
            "dual-channel DDR4-3200)"
        )
    why = ASSUMED_HOST_SOURCE if {"cores", "ram"} & set(host.assumed) else "two per core"
    return (
        "described machine: assumed " + ", ".join(parts) + f": {why}, not this box's; "
        "give the options in parentheses to describe it"
    )


def resolve_machine(
    *,
    hardware_file: Path | None = None,
    gpus: Sequence[str] | None = None,
    ram: str | None = None,
    cpu_only: bool = False,
    llama_server: Path | None = None,
    disk_path: Path | None = None,
    inspect_server: bool = True,
    rpc: Sequence[str] | None = None,
    rpc_devices: Sequence[str] | None = None,
    rpc_bandwidth: str | None = None,
    rpc_latency: str | None = None,
    rpc_timeout_s: float | None = None,
    cores: int | None = None,
    threads: int | None = None,
    ram_bandwidth: str | None = None,
    backend_name: str | None = None,
) -> Machine:
    """The machine to plan for, from the options every planning command shares (see module doc).

    `backend_name` (--backend) chooses llama.cpp's backend for the described GPUs (default: each
    vendor's usual one). A unified GPU (--gpu m4-max:128G) names the machine's RAM: the host gets
    that RAM unless --ram says otherwise, and the GPU the OS's share of it.

    The host of a described machine (`--gpu`, a TOML file without [host]) is the most common
    desktop (typical_host), not this box, unless --ram / --cores / --threads say otherwise; what
    is still assumed is listed in Host.assumed and named in a note.

    inspect_server=False leaves llama-server alone (no `--version` run): only `probe` reports it.

    --gpu without --hardware keeps this machine's host, disk and llama-server but does not touch
    NVML. With --hardware, the file's llama-server and disk stand unless --llama-server / --dir
    are given, which are then inspected here.
    """
    from quantpick.machine import probe as hardware

    ram_bytes = parse_size(ram) if ram is not None else None  # bad input fails before probing
    if ram_bytes is not None and ram_bytes <= 0:
        raise UsageError(f"--ram {ram}: RAM must be more than 0", hint="e.g. --ram 64G")
    n_described = len(gpus or ()) + len(rpc_devices or ())
    if n_described > MAX_DEVICES:  # counted before any is parsed, probed or planned for
        raise UsageError(too_many_devices(n_described), hint=_DEVICES_HINT)
    check_cpu(cores, threads)
    bandwidth = parse_bandwidth(ram_bandwidth) if ram_bandwidth is not None else None
    if backend_name is not None:
        backend(backend_name)  # an unknown name fails before anything is probed
    described_gpus = tuple(
        parse_gpu_spec(spec, index=i, backend_name=backend_name)
        for i, spec in enumerate(gpus or ())
    )
    pools = [p for p in (unified_ram(spec) for spec in gpus or ()) if p is not None]
    for spec in rpc or ():
        parse_endpoint(spec)
    for spec in rpc_devices or ():
        parse_rpc_device_spec(spec)
    with_network((), bandwidth=rpc_bandwidth, latency=rpc_latency)  # parses both
    if cpu_only and (rpc or rpc_devices):
        raise UsageError("--cpu-only plans without any device: drop it to use RPC workers")
    how: list[str] = []
    # How a size was read (a bare number is GiB, a "GB" is GiB): never a silent guess.
    notes: list[str] = size_notes(f"--ram {ram}", ram) if ram else []
    if ram_bandwidth:
        notes += bare_number_notes(f"--ram-bandwidth {ram_bandwidth}", ram_bandwidth, "GB/s")
    for spec in gpus or ():
        notes += _gpu_spec_notes(spec)
    for spec in rpc_devices or ():
        notes += _gpu_spec_notes(spec.partition("=")[2], f"--rpc-device {spec}")

    if hardware_file is not None:
        machine = load_hardware_file(hardware_file, default_host=typical_host)
        how.append(f"--hardware {hardware_file}")
        notes.extend(machine.notes)
        if llama_server is not None and inspect_server:
            machine = dataclasses.replace(
                machine, llama_server=hardware.probe_llama_server(llama_server)
            )
        if disk_path is not None:
            disk = hardware.disk_free(disk_path)
            machine = dataclasses.replace(
                machine, disk_path=str(disk_path), disk_free_bytes=disk[1] if disk else None
            )
    elif described_gpus:
        # Only the GPUs are described: the machine is elsewhere, so its host is a typical
        # desktop (not this box's, which says nothing about it); disk and llama-server are
        # this machine's, where the files go. No NVML init.
        host = typical_host()
        target = disk_path if disk_path is not None else hardware.default_disk_path()
        disk = hardware.disk_free(target)
        machine = Machine(
            gpus=(),
            host=host,
            disk_path=str(target),
            disk_free_bytes=disk[1] if disk else None,
            llama_server=hardware.probe_llama_server(llama_server) if inspect_server else None,
        )
    else:
        machine = hardware.probe(
            disk_path=disk_path, llama_server=llama_server, inspect_server=inspect_server
        )
        notes.extend(machine.notes)
        how.append("probe")

    if described_gpus:
        machine = dataclasses.replace(machine, gpus=described_gpus, driver_version=None)
        how.append(" ".join(f"--gpu {shlex.quote(spec)}" for spec in gpus or ()))
        if backend_name is not None:
            how.append(f"--backend {backend(backend_name).key}")
        if pools and ram_bytes is None:
            # One pool: the unified GPU's memory is the machine's RAM.
            ram_pool = max(p[0] for p in pools)
            machine = dataclasses.replace(machine, host=_with_ram(machine.host, ram_pool))
        if pools and bandwidth is None:
            # ... and the CPU reads it over the same bus (the data sheet's figure; the CPU
            # cores alone may reach less of it).
            bandwidth = max(g.bandwidth_bytes_per_s or 0 for g in described_gpus if g.unified)
        for gpu, (_, rule) in zip((g for g in described_gpus if g.unified), pools, strict=False):
            notes.append(
                f"{gpu.name}: unified memory; the GPU may hold {gib(gpu.total_bytes)} "
                f"({rule}), the rest of RAM is the host's"
            )
    if backend_name is not None and not described_gpus:
        machine = dataclasses.replace(
            machine,
            gpus=tuple(
                dataclasses.replace(
                    g,
                    backend=gpu_backend(
                        find_gpu(g.name, g.total_bytes or None), g.name, backend_name
                    ).label,
                )
                for g in machine.gpus
            ),
        )
        how.append(f"--backend {backend(backend_name).key}")
    if ram_bytes is not None:
        machine = dataclasses.replace(machine, host=_with_ram(machine.host, ram_bytes))
        how.append(f"--ram {ram}")
    if cpu_only:
        machine = dataclasses.replace(machine, gpus=(), rpc_workers=(), gpus_hidden=True)
        how.append("--cpu-only")
        # A "no NVML" note is moot once the user asked for CPU only.
        notes = [n for n in notes if "planning for CPU only" not in n]
    if rpc or rpc_devices:
        workers = resolve_rpc_workers(
            rpc or (), rpc_devices or (), timeout_s=rpc_timeout_s, notes=notes
        )
        machine = dataclasses.replace(machine, rpc_workers=workers)
        # Probed workers are part of "this machine as it is"; described ones are not.
        how.extend(f"--rpc-device {shlex.quote(spec)}" for spec in rpc_devices or ())
    if machine.rpc_workers:
        # The local GPUs may be none, but the plan is not CPU-only: the workers have devices.
        notes = [n.replace(": planning for CPU only", ": no local GPU") for n in notes]
    if rpc_bandwidth is not None or rpc_latency is not None:
        machine = dataclasses.replace(
            machine,
            rpc_workers=with_network(
                machine.rpc_workers, bandwidth=rpc_bandwidth, latency=rpc_latency
            ),
        )
        if rpc_bandwidth is not None:
            how.append(f"--rpc-bandwidth {shlex.quote(rpc_bandwidth)}")
        if rpc_latency is not None:
            how.append(f"--rpc-latency {shlex.quote(rpc_latency)}")

    machine = dataclasses.replace(
        machine, host=with_cpu(machine.host, cores=cores, threads=threads, bandwidth=bandwidth)
    )
    if how in (["probe"], ["probe", "--cpu-only"]):
        # This machine as probed (its GPUs hidden with --cpu-only: still this box, which
        # llama.cpp can confirm a plan on). probe() completed its GPUs and wrote its own notes;
        # the workers' ones are added here.
        usable = len(machine.usable_gpus) + sum(len(w.devices) for w in machine.rpc_workers)
        if machine.rpc_workers and usable > MAX_DEVICES:
            raise UsageError(too_many_devices(usable), hint=_DEVICES_HINT)
        if usable > MAX_DEVICES:
            notes.append(too_many_devices(usable) + ": plan for some with --gpu")
        machine = dataclasses.replace(
            machine,
            source=" ".join(how),
            notes=tuple(dict.fromkeys(notes)),
        )
        _check_resolved(machine, count_devices=False)
        return machine
    note = assumed_host_note(machine.host)
    if note is not None:
        notes.append(note)
    machine = dataclasses.replace(
        machine,
        gpus=tuple(with_catalog_figures(g) for g in machine.gpus),
        rpc_workers=tuple(
            dataclasses.replace(w, devices=tuple(with_catalog_figures(d) for d in w.devices))
            for w in machine.rpc_workers
        ),
    )
    notes.extend(gpu_assumption_notes(machine.gpus))
    machine = dataclasses.replace(
        machine,
        described=True,
        gpus_hidden=False,
        source="described: " + " ".join(how),
        notes=tuple(dict.fromkeys(notes)),
    )
    _check_resolved(machine)
    return machine


def _check_resolved(machine: Machine, *, count_devices: bool = True) -> None:
    """spec.check_machine on the machine the flags made: a value that cannot be true is a usage
    error naming the field (files are checked as they are read, naming the file)."""
    try:
        check_machine(machine, count_devices=count_devices)
    except ValueError as exc:
        hint = _DEVICES_HINT if isinstance(exc, TooManyDevices) else None
        raise UsageError(f"the machine to plan for: {exc}", hint=hint) from None


def machine_from_options(
    hardware: Path | None,
    gpu: Sequence[str] | None,
    ram: str | None,
    cpu_only: bool,
    llama_server: Path | None,
    disk_path: Path | None = None,
    *,
    inspect_server: bool = True,
    rpc: Sequence[str] | None = None,
    rpc_device: Sequence[str] | None = None,
    rpc_bandwidth: str | None = None,
    rpc_latency: str | None = None,
    cores: int | None = None,
    threads: int | None = None,
    ram_bandwidth: str | None = None,
    backend_name: str | None = None,
) -> Machine:
    """resolve_machine with the CLI's option names, for pick/estimate/get/probe."""
    return resolve_machine(
        backend_name=backend_name,
        cores=cores,
        threads=threads,
        ram_bandwidth=ram_bandwidth,
        inspect_server=inspect_server,
        hardware_file=hardware,
        gpus=gpu,
        ram=ram,
        cpu_only=cpu_only,
        llama_server=llama_server,
        disk_path=disk_path,
        rpc=rpc,
        rpc_devices=rpc_device,
        rpc_bandwidth=rpc_bandwidth,
        rpc_latency=rpc_latency,
    )
