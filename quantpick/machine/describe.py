"""Described machines: plan for a machine that is not (exactly) this one.

Precedence (resolve_machine), strongest last:
1. the base: `--hardware FILE` if given, else this machine's host (with `--gpu`), else the probe;
2. `--gpu NAME[:VRAM[:BANDWIDTH]]` (repeatable) replaces the base's GPUs, in the given order;
3. `--ram SIZE` replaces host RAM (total and available);
4. `--cpu-only` drops every GPU.
Anything but the plain probe is `described=True`, with `source` saying how it was described.

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
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from quantpick.errors import HardwareError, QuantpickError, UsageError
from quantpick.machine.catalog import lookup_gpu
from quantpick.machine.spec import Gpu, Host, Machine, machine_from_dict
from quantpick.units import parse_size

# The reference box the planner is tuned on: `--gpu 3090 --gpu t4`.
REFERENCE_GPUS: tuple[str, ...] = ("3090", "t4")

HARDWARE_SCHEMA_VERSION = 1

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
        return int(value * BARE_BANDWIDTH_UNIT)
    return int(value * _BANDWIDTH_UNITS[unit])


def bare_number_notes(what: str, text: str, unit: str) -> list[str]:
    """The note the CLI prints for a unit-less size or bandwidth: never a silent guess."""
    from quantpick.units import is_bare_number

    if not is_bare_number(text):
        return []
    return [f"{what} is read as {str(text).strip()} {unit} (no unit: sizes GiB, bandwidths GB/s)"]


def _gpu_spec_notes(spec: str) -> list[str]:
    parts = spec.split(":")
    notes: list[str] = []
    if len(parts) > 1 and parts[1].strip():
        notes += bare_number_notes(f"--gpu {spec}: VRAM {parts[1].strip()}", parts[1], "GiB")
    if len(parts) > 2 and parts[2].strip():
        notes += bare_number_notes(f"--gpu {spec}: bandwidth {parts[2]}", parts[2], "GB/s")
    return notes


def describe_gpu(
    name: str, *, vram_bytes: int | None = None, bandwidth: int | None = None, index: int = 0
) -> Gpu:
    """A described GPU: a catalog NAME fills in everything (VRAM and bandwidth then override
    it); any other NAME needs VRAM. free = total: the planner's per-device overhead covers the
    driver's share.
    """
    if vram_bytes is not None and vram_bytes <= 0:
        raise UsageError(f"GPU {name!r}: VRAM must be more than 0")
    try:
        model = lookup_gpu(name)
    except UsageError:
        if vram_bytes is None:
            raise
        # A card the catalog does not know, fully described by the user.
        return Gpu(index=index, name=name, total_bytes=vram_bytes, free_bytes=vram_bytes,
                   used_bytes=0, bandwidth_bytes_per_s=bandwidth)  # fmt: skip
    total = vram_bytes if vram_bytes is not None else model.total_bytes
    return Gpu(
        index=index,
        name=model.name,
        total_bytes=total,
        free_bytes=total,
        used_bytes=0,
        memory_bus_width_bits=model.bus_width_bits,
        # A given bandwidth no longer follows from the catalog clock; drop the clock, not the bus.
        memory_clock_mhz=model.memory_clock_mhz if bandwidth is None else None,
        bandwidth_bytes_per_s=bandwidth if bandwidth is not None else model.bandwidth_bytes_per_s,
        pcie_generation=model.pcie_generation,
        pcie_width=model.pcie_width,
        compute_capability=model.compute_capability,
    )


def parse_gpu_spec(spec: str, *, index: int = 0) -> Gpu:
    """A described GPU from NAME[:VRAM[:BANDWIDTH]] (VRAM binary like --ram, BANDWIDTH decimal)."""
    parts = spec.split(":")
    if len(parts) > 3 or not parts[0].strip():
        raise UsageError(
            f"cannot read GPU {spec!r}", hint="write NAME[:VRAM[:BANDWIDTH]], e.g. 3090 or 4090:24G"
        )
    vram = parse_size(parts[1]) if len(parts) > 1 and parts[1].strip() else None
    bandwidth = parse_bandwidth(parts[2]) if len(parts) > 2 and parts[2].strip() else None
    return describe_gpu(parts[0].strip(), vram_bytes=vram, bandwidth=bandwidth, index=index)


# --- Hardware files ---------------------------------------------------------------------------


def _check_types(machine: Machine) -> None:
    """machine_from_dict trusts its input; a hand-edited JSON file deserves a clear message."""
    for gpu in machine.gpus:
        for field in ("index", "total_bytes", "free_bytes"):
            value = getattr(gpu, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"gpus[{gpu.index}].{field} must be a whole number of bytes")
        if not isinstance(gpu.name, str):
            raise ValueError("every GPU needs a name")
    for field in ("ram_total_bytes", "ram_available_bytes", "cpu_cores"):
        value = getattr(machine.host, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"host.{field} must be a whole number")


def _machine_from_json(data: Any) -> Machine:
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
    try:
        machine = machine_from_dict(data)
    except (TypeError, AttributeError) as exc:
        raise ValueError(f"unexpected value ({exc})") from exc
    _check_types(machine)
    return machine


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
            unit = "GiB" if parse is parse_size else "GB/s"
            notes.extend(bare_number_notes(f"{where}.{key} = {value}", value, unit))
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


def _machine_from_toml(data: dict[str, Any], default_host: Callable[[], Host] | None) -> Machine:
    _only(data, {"gpu", "gpus", "host", "disk_free", "schema_version"}, "the file")
    specs: list[Gpu] = []
    notes: list[str] = []
    for spec in data.get("gpus", []):
        if not isinstance(spec, str):
            raise ValueError('gpus must be a list of names, e.g. gpus = ["3090", "t4"]')
        notes += _gpu_spec_notes(spec)
        specs.append(parse_gpu_spec(spec))
    for i, table in enumerate(data.get("gpu", [])):
        where = f"[[gpu]] #{i + 1}"
        table = _only(table, {"name", "vram", "bandwidth", "free"}, where)
        if not isinstance(table.get("name"), str):
            raise ValueError(f'{where}: needs name = "..."')
        gpu = describe_gpu(
            table["name"],
            vram_bytes=_toml_size(table, "vram", where, notes),
            bandwidth=_toml_bandwidth(table, "bandwidth", where, notes),
        )
        free = _toml_size(table, "free", where, notes)
        if free is not None:
            gpu = dataclasses.replace(gpu, free_bytes=min(free, gpu.total_bytes))
        specs.append(gpu)
    gpus = tuple(dataclasses.replace(g, index=i) for i, g in enumerate(specs))

    if "host" in data:
        host_t = _only(
            data["host"], {"ram", "ram_available", "cores", "threads", "ram_bandwidth"}, "[host]"
        )
        ram = _toml_size(host_t, "ram", "[host]", notes)
        cores = host_t.get("cores")
        if ram is None or not isinstance(cores, int) or cores < 1:
            raise ValueError('[host] needs ram = "64G" and cores = N')
        if ram <= 0:
            raise ValueError("[host].ram must be more than 0")
        available = _toml_size(host_t, "ram_available", "[host]", notes)
        threads = host_t.get("threads")
        if threads is not None and not isinstance(threads, int):
            raise ValueError("[host].threads must be a number")
        host = Host(
            ram_total_bytes=ram,
            ram_available_bytes=min(available, ram) if available is not None else ram,
            cpu_cores=cores,
            cpu_threads=threads,
            ram_bandwidth_bytes_per_s=_toml_bandwidth(host_t, "ram_bandwidth", "[host]", notes),
        )
    elif default_host is not None:
        host = default_host()
    else:
        raise ValueError('no [host] table (add [host] ram = "64G" cores = 16)')
    return Machine(
        gpus=gpus,
        host=host,
        disk_free_bytes=_toml_size(data, "disk_free", "the file", notes),
        notes=tuple(notes),
    )


def load_hardware_file(path: Path, *, default_host: Callable[[], Host] | None = None) -> Machine:
    """A described machine from JSON (`probe --json`) or TOML; any problem is one HardwareError.

    default_host supplies the host when a TOML file has no [host] table.
    The result keeps the file's fields; resolve_machine marks it described.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise HardwareError(f"cannot read hardware file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise HardwareError(f"hardware file {path} is not text (expected JSON or TOML)") from None
    as_json = path.suffix.lower() == ".json" or (
        path.suffix.lower() != ".toml" and text.lstrip().startswith("{")
    )
    try:
        if as_json:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not valid JSON (line {exc.lineno}: {exc.msg})") from None
            return _machine_from_json(data)
        # Imported here: only hand-written TOML files need it, and it costs ~2 ms at startup.
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover
            import tomli as tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"not valid TOML ({exc})") from None
        return _machine_from_toml(data, default_host)
    except (ValueError, KeyError, QuantpickError) as exc:
        message = exc.message if isinstance(exc, QuantpickError) else str(exc)
        hint = exc.hint if isinstance(exc, QuantpickError) else None
        if isinstance(exc, KeyError):
            message = f"missing {exc}"
        raise HardwareError(f"hardware file {path}: {message}", hint=hint) from None


# --- Resolution -------------------------------------------------------------------------------


def _with_ram(host: Host, ram_bytes: int) -> Host:
    return dataclasses.replace(
        host, ram_total_bytes=ram_bytes, ram_available_bytes=ram_bytes, cgroup_limit_bytes=None
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
) -> Machine:
    """The machine to plan for, from the options every planning command shares (see module doc).

    inspect_server=False leaves llama-server alone (no `--version` run): only `probe` reports it.

    --gpu without --hardware keeps this machine's host, disk and llama-server but does not touch
    NVML. With --hardware, the file's llama-server and disk stand unless --llama-server / --dir
    are given, which are then inspected here.
    """
    from quantpick.machine import probe as hardware

    ram_bytes = parse_size(ram) if ram is not None else None  # bad input fails before probing
    if ram_bytes is not None and ram_bytes <= 0:
        raise UsageError(f"--ram {ram}: RAM must be more than 0", hint="e.g. --ram 64G")
    described_gpus = tuple(parse_gpu_spec(spec, index=i) for i, spec in enumerate(gpus or ()))
    how: list[str] = []
    # Unit-less sizes are GiB: say so, so that `--ram 64` is never a silent guess.
    notes: list[str] = bare_number_notes(f"--ram {ram}", ram, "GiB") if ram else []
    for spec in gpus or ():
        notes += _gpu_spec_notes(spec)

    if hardware_file is not None:
        machine = load_hardware_file(hardware_file, default_host=hardware.probe_host)
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
        # Only the GPUs are described: the rest is this machine, without the (slow) NVML init.
        host = hardware.probe_host(notes=notes)
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
    if ram_bytes is not None:
        machine = dataclasses.replace(machine, host=_with_ram(machine.host, ram_bytes))
        how.append(f"--ram {ram}")
    if cpu_only:
        machine = dataclasses.replace(machine, gpus=())
        how.append("--cpu-only")
        # A "no NVML" note is moot once the user asked for CPU only.
        notes = [n for n in notes if "planning for CPU only" not in n]

    if how == ["probe"]:
        return machine
    return dataclasses.replace(
        machine,
        described=True,
        source="described: " + " ".join(how),
        notes=tuple(dict.fromkeys(notes)),
    )


def machine_from_options(
    hardware: Path | None,
    gpu: Sequence[str] | None,
    ram: str | None,
    cpu_only: bool,
    llama_server: Path | None,
    disk_path: Path | None = None,
    *,
    inspect_server: bool = True,
) -> Machine:
    """resolve_machine with the CLI's option names, for pick/estimate/get/probe."""
    return resolve_machine(
        inspect_server=inspect_server,
        hardware_file=hardware,
        gpus=gpu,
        ram=ram,
        cpu_only=cpu_only,
        llama_server=llama_server,
        disk_path=disk_path,
    )
