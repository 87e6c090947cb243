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

Hardware files (`--hardware FILE`, TOML or `probe --json`): machine/hardware_file.py. The
text of one device (`--gpu`, `--rpc-device`): machine/device_specs.py.

RPC workers: `--rpc` endpoints first, in the given order, then endpoints that only
`--rpc-device` names, in order of first mention; that is llama-server's `--rpc` order and
so its device order (RPC0, RPC1, ...). An endpoint given both ways is probed for its memory and
described for what its devices are (by position).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantpick.errors import UsageError
from quantpick.machine.backends import (
    backend,
)
from quantpick.machine.catalog import (
    find_gpu,
    gpu_assumption_notes,
    with_catalog_figures,
)
from quantpick.machine.device_specs import (
    bare_number_notes,
    gpu_backend,
    gpu_spec_notes,
    parse_bandwidth,
    parse_duration,
    parse_endpoint,
    parse_gpu_spec,
    parse_rpc_device_spec,
    size_notes,
    unified_ram,
)
from quantpick.machine.device_specs import describe_gpu as describe_gpu  # its old home: kept
from quantpick.machine.spec import (
    ASSUMED_HOST_BANDWIDTH_BYTES_PER_S,
    ASSUMED_HOST_CORES,
    ASSUMED_HOST_RAM_BYTES,
    ASSUMED_HOST_SOURCE,
    ASSUMED_HOST_THREADS,
    MAX_DEVICES,
    Gpu,
    Host,
    Machine,
    RpcWorker,
    TooManyDevices,
    check_machine,
    too_many_devices,
)
from quantpick.units import gib, parse_size

DEVICES_HINT = "describe the devices one llama-server is to use"

# The reference box the planner is tuned on: `--gpu 3090 --gpu t4`.
REFERENCE_GPUS: tuple[str, ...] = ("3090", "t4")


# --- RPC workers ------------------------------------------------------------------------------


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
    measure_disk: bool = True,
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
    measure_disk=False leaves the free space of a described machine's disk unmeasured (None):
    only `probe` shows it, and a plan is then a function of its inputs alone (quantpick/answers.py).

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
        raise UsageError(too_many_devices(n_described), hint=DEVICES_HINT)
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
        notes += gpu_spec_notes(spec)
    for spec in rpc_devices or ():
        notes += gpu_spec_notes(spec.partition("=")[2], f"--rpc-device {spec}")

    if hardware_file is not None:
        from quantpick.machine.hardware_file import load_hardware_file

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
        disk = hardware.disk_free(target) if measure_disk else None
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
            raise UsageError(too_many_devices(usable), hint=DEVICES_HINT)
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
        hint = DEVICES_HINT if isinstance(exc, TooManyDevices) else None
        raise UsageError(f"the machine to plan for: {exc}", hint=hint) from None
