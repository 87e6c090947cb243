"""`quantpick probe`: what this machine (or a described one) offers for planning.

Usage:
    quantpick probe
    quantpick probe --json > box.json        # later: quantpick pick MODEL --hardware box.json
    quantpick probe --gpu 3090 --gpu t4      # the reference box, described
    quantpick probe --rpc 192.168.1.20:50052 # and the devices of an llama.cpp RPC worker
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quantpick.cli.core import app
from quantpick.cli.option_blocks import takes
from quantpick.cli.option_table import ProbeDirOpt

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine

PROBE_EXAMPLES = [
    "quantpick probe",
    "quantpick probe --json > box.json",
    "quantpick probe --gpu 3090 --gpu t4 --ram 64G",
    "quantpick probe --rpc 192.168.1.20:50052 --json > cluster.json",
    "quantpick probe --rpc-device 192.168.1.20:50052=t4 --rpc-bandwidth 1.1GB/s",
]


def _epilog(examples: list[str]) -> str:
    return "Examples:\n\n" + "\n\n".join(f"  $ {e}" for e in examples)


@app.command(epilog=_epilog(PROBE_EXAMPLES))
@takes(
    "json_ hardware gpu ram cpu_only llama_server dir_ rpc rpc_device rpc_bandwidth rpc_latency "
    "cores threads ram_bandwidth backend"
)
def probe(dir_: ProbeDirOpt = None, **given: Any) -> None:
    """Show the GPUs, RAM, CPU, disk, llama-server and RPC workers that planning will use."""
    from quantpick.cli import output
    from quantpick.cli.groups import MachineOptions

    machine = MachineOptions.of(given).machine(disk=dir_, show_disk=True, inspect_server=True)
    if given["json_"]:
        output.print_json({"machine": machine.to_dict()})
    else:
        render_machine(machine)


# (header, right-aligned): sizes in GiB, bandwidth in decimal GB/s, bus width x NVML max memory
# clock in MHz, PCIe max link generation x lanes, CUDA compute capability.
_COLUMNS = (
    ("#", False), ("GPU", False), ("VRAM GiB", True), ("free", True), ("used", True),
    ("GB/s", True), ("bus x MHz", False), ("PCIe", False), ("CC", False), ("device", False),
)  # fmt: skip


def _short_name(name: str) -> str:
    # "NVIDIA GeForce RTX 3090" -> "RTX 3090": the vendor words only cost table width.
    for prefix in ("NVIDIA ", "GeForce "):
        name = name.removeprefix(prefix)
    return name


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024**3:.2f}"


def render_machine(machine: Machine) -> None:
    """The human view: a GPU table, then host, disk and llama-server lines (stdout)."""
    from rich import box
    from rich.table import Table

    from quantpick.cli import output
    from quantpick.machine.backends import backend_of
    from quantpick.units import human

    console = output.stdout()
    if machine.described:
        console.print(f"Described machine ({machine.source.removeprefix('described: ')})")
    else:
        console.print(f"This machine ({machine.source})")
    if machine.gpus:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        with_errors = any(g.error for g in machine.gpus)
        for column, right in _COLUMNS + ((("error", False),) if with_errors else ()):
            table.add_column(
                column, justify="right" if right else "left", no_wrap=column != "error"
            )
        for g in machine.gpus:
            bandwidth = g.bandwidth_bytes_per_s
            bus_clock = (
                f"{g.memory_bus_width_bits or '?'}x{g.memory_clock_mhz or '?'}"
                if g.memory_bus_width_bits or g.memory_clock_mhz
                else "-"
            )
            pcie = f"{g.pcie_generation} x{g.pcie_width or '?'}" if g.pcie_generation else "-"
            table.add_row(
                str(g.index),
                _short_name(g.name),
                _gib(g.total_bytes),
                _gib(g.free_bytes),
                _gib(g.used_bytes),
                f"{bandwidth / 1e9:.0f}" if bandwidth else "-",
                bus_clock,
                pcie,
                g.compute_capability or "-",
                # llama.cpp's name for it (its backend's), and whether its memory is the host's
                backend_of(g.backend).device_name(g.index) + (" unified" if g.unified else ""),
                *([g.error or ""] if with_errors else []),
            )
        console.print(table)
    else:
        console.print("GPUs: none here" if machine.rpc_workers else "GPUs: none (CPU only)")
    if machine.driver_version:
        console.print(f"Driver: {machine.driver_version}")
    host = machine.host
    ram = f"RAM: {human(host.ram_total_bytes)} total, {human(host.ram_available_bytes)} available"
    if host.cgroup_limit_bytes is not None:
        ram += f" (cgroup limit {human(host.cgroup_limit_bytes)})"
    if host.ram_bandwidth_bytes_per_s:
        ram += f", {host.ram_bandwidth_bytes_per_s / 1e9:.0f} GB/s"
    if "ram" in host.assumed:
        ram += " (assumed)"
    console.print(ram)
    threads = f" / {host.cpu_threads} threads" if host.cpu_threads else ""
    assumed = (
        " (assumed)"
        if "cores" in host.assumed
        else " (threads assumed)"
        if "threads" in host.assumed
        else ""
    )
    console.print(f"CPU: {host.cpu_cores} cores{threads}{assumed}")
    if machine.disk_free_bytes is not None:
        console.print(f"Disk: {human(machine.disk_free_bytes)} free at {machine.disk_path}")
    if machine.rpc_workers:
        console.print(_worker_table(machine))
    server = machine.llama_server
    if server is None:
        console.print("llama-server: not found")
    elif server.error:
        console.print(f"llama-server: {server.path}: {server.error}")
    else:
        parts = [f"version {server.version}"] if server.version else []
        parts += [f"build {server.build}"] if server.build is not None else []
        parts += [f"commit {server.commit}"] if server.commit else []
        console.print(f"llama-server: {server.path} ({', '.join(parts)})")


def _worker_table(machine: Machine) -> object:
    """The RPC workers' devices under the names llama-server gives them (RPC0, RPC1, ...)."""
    from rich import box
    from rich.table import Table

    table = Table(
        title="RPC workers (llama-server --rpc "
        + ",".join(w.endpoint for w in machine.rpc_workers)
        + ")",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    for column, right in (
        ("device", False), ("worker", False), ("how", False), ("GPU", False),
        ("VRAM GiB", True), ("free", True), ("GB/s", True), ("link", False),
    ):  # fmt: skip
        table.add_column(column, justify="right" if right else "left", no_wrap=True)
    n = 0
    for w in machine.rpc_workers:
        net = w.network
        link = f"{net.bandwidth_bytes_per_s / 1e6:.0f} MB/s, {net.rtt_s * 1e3:.2f} ms RTT"
        how = f"probed (protocol {w.protocol})" if w.probed else "described"
        for g in w.devices:
            bandwidth = g.bandwidth_bytes_per_s
            table.add_row(
                f"RPC{n}",
                w.endpoint,
                how,
                _short_name(g.name),
                _gib(g.total_bytes),
                _gib(g.free_bytes),
                f"{bandwidth / 1e9:.0f}" if bandwidth else "-",
                link,
            )
            n += 1
    return table
