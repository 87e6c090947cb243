"""`quantpick probe`: what this machine (or a described one) offers for planning.

Usage:
    quantpick probe
    quantpick probe --json > box.json        # later: quantpick pick MODEL --hardware box.json
    quantpick probe --gpu 3090 --gpu t4      # the reference box, described
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from quantpick.cli.core import app
from quantpick.cli.options import CpuOnlyOpt, GpuOpt, HardwareOpt, JsonOpt, LlamaServerOpt, RamOpt

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine

DirOpt = Annotated[
    Optional[Path],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--dir",
        help="Where models would go: free disk space is measured there (default: the models dir).",
        file_okay=False,
    ),
]

PROBE_EXAMPLES = [
    "quantpick probe",
    "quantpick probe --json > box.json",
    "quantpick probe --gpu 3090 --gpu t4 --ram 64G",
]


def _epilog(examples: list[str]) -> str:
    return "Examples:\n\n" + "\n\n".join(f"  $ {e}" for e in examples)


@app.command(epilog=_epilog(PROBE_EXAMPLES))
def probe(
    json_: JsonOpt = False,
    hardware: HardwareOpt = None,
    gpu: GpuOpt = None,
    ram: RamOpt = None,
    cpu_only: CpuOnlyOpt = False,
    llama_server: LlamaServerOpt = None,
    dir_: DirOpt = None,
) -> None:
    """Show the GPUs, RAM, CPU, disk and llama-server that planning will use."""
    from quantpick.cli import output
    from quantpick.cli.options import check_llama_server
    from quantpick.machine.describe import machine_from_options

    check_llama_server(llama_server)
    machine = machine_from_options(hardware, gpu, ram, cpu_only, llama_server, dir_)
    for line in machine.notes:
        output.note(f"Note: {line}")
    if json_:
        output.print_json({"machine": machine.to_dict()})
    else:
        render_machine(machine)


# (header, right-aligned): sizes in GiB, bandwidth in decimal GB/s, bus width x NVML max memory
# clock in MHz, PCIe max link generation x lanes, CUDA compute capability.
_COLUMNS = (
    ("#", False), ("GPU", False), ("VRAM GiB", True), ("free", True), ("used", True),
    ("GB/s", True), ("bus x MHz", False), ("PCIe", False), ("CC", False),
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
                *([g.error or ""] if with_errors else []),
            )
        console.print(table)
    else:
        console.print("GPUs: none (CPU only)")
    if machine.driver_version:
        console.print(f"Driver: {machine.driver_version}")
    host = machine.host
    ram = f"RAM: {human(host.ram_total_bytes)} total, {human(host.ram_available_bytes)} available"
    if host.cgroup_limit_bytes is not None:
        ram += f" (cgroup limit {human(host.cgroup_limit_bytes)})"
    if host.ram_bandwidth_bytes_per_s:
        ram += f", {host.ram_bandwidth_bytes_per_s / 1e9:.0f} GB/s"
    console.print(ram)
    threads = f" / {host.cpu_threads} threads" if host.cpu_threads else ""
    console.print(f"CPU: {host.cpu_cores} cores{threads}")
    if machine.disk_free_bytes is not None:
        console.print(f"Disk: {human(machine.disk_free_bytes)} free at {machine.disk_path}")
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
