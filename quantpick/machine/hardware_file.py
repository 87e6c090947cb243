"""Hardware files (`--hardware FILE`): a machine described in a file, read and checked.

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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantpick.errors import HardwareError, QuantpickError, RpcWorkerError, UsageError
from quantpick.machine.backends import names as backend_names
from quantpick.machine.device_specs import (
    bare_number_notes,
    describe_gpu,
    gpu_spec_notes,
    parse_bandwidth,
    parse_duration,
    parse_endpoint,
    parse_gpu_spec,
    size_notes,
)
from quantpick.machine.spec import (
    MAX_CPUS,
    MAX_DEVICES,
    Gpu,
    Host,
    Machine,
    RpcWorker,
    check_machine,
    machine_from_dict,
    too_many_devices,
)
from quantpick.units import gib, parse_size

HARDWARE_SCHEMA_VERSION = 1
# A `probe --json` file of 15 GPUs and workers is ~15 KB; a hand-written TOML a few hundred bytes.
MAX_HARDWARE_FILE_BYTES = 1024**2


def _check_endpoints(machine: Machine) -> None:
    for i, worker in enumerate(machine.rpc_workers):
        if not isinstance(worker.host, str) or not isinstance(worker.port, int):
            raise ValueError(f"rpc_workers[{i}] needs host and port")
        parse_endpoint(worker.endpoint)


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
        notes += gpu_spec_notes(spec)
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
        raise HardwareError.unreadable("hardware file", path, exc) from None
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
