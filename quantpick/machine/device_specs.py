"""The text of a described device: `--gpu NAME[:VRAM[:BANDWIDTH]]`, `--rpc-device
HOST:PORT=GPU[:VRAM[:BANDWIDTH]]`, bandwidths ("936GB/s", a bare number in GB/s), durations
("0.3ms"), and the notes that say what a bare number was read as. Pure parsing against the GPU
catalogue (machine/catalog.py); machine/describe.py puts the parsed devices together.

    parse_gpu_spec("4090:24G:1008GB/s")
    parse_rpc_device_spec("192.168.1.20:50052=t4")
"""

from __future__ import annotations

import re

from quantpick.errors import UsageError
from quantpick.machine.backends import (
    Backend,
    BackendKind,
    backend,
    default_backend,
    default_gpu_backend,
)
from quantpick.machine.catalog import (
    GpuModel,
    find_gpu,
    lookup_gpu,
    unified_share,
)
from quantpick.machine.spec import (
    MAX_BANDWIDTH_BYTES_PER_S,
    Gpu,
)
from quantpick.units import parse_size, size_note

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


def gpu_spec_notes(spec: str, label: str | None = None) -> list[str]:
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
