"""What a machine is, as plain data: GPUs, host memory and CPU, disk, llama-server.

Pure: the probe (`hardware.py`) and described machines (`describe.py`) build these; the
planner reads them. `to_dict`/`machine_from_dict` make `probe --json` round-trip into
`--hardware FILE`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Figures the speed model uses when a machine does not tell them; whoever fills a machine notes
# when one is used (describe.gpu_assumption_notes, probe). Each is on the slow side on purpose.
# A GPU that is neither in the catalogue nor reports bus width and clock: a GTX 1660 / T4-class
# card (300 GB/s); data sheets put current cards at 270-1800 GB/s.
ASSUMED_GPU_BANDWIDTH_BYTES_PER_S = 300 * 10**9
# A GPU not in the catalogue: dense FP16 tensor TFLOPS below every current card's (catalogue:
# 47 for a P40's dp4a, 51 for an RTX 3060, 65 for a T4, 330 for an RTX 4090).
ASSUMED_GPU_FP16_TFLOPS = 25.0
# A PCIe link NVML did not report: gen 3 x16 (what every card since 2012 supports).
ASSUMED_PCIE = (3, 16)
# Dual-channel DDR4-3200 (51.2 GB/s) when the host's bandwidth is neither probed nor described.
ASSUMED_HOST_BANDWIDTH_BYTES_PER_S = 50 * 10**9


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML / CUDA index
    name: str
    total_bytes: int
    free_bytes: int
    used_bytes: int | None = None
    uuid: str | None = None
    memory_bus_width_bits: int | None = None
    memory_clock_mhz: int | None = None  # max memory clock as NVML reports it
    bandwidth_bytes_per_s: int | None = None  # theoretical: 2 x clock x bus width / 8
    pcie_generation: int | None = None
    pcie_width: int | None = None
    compute_capability: str | None = None  # "8.6"
    # dense FP16 tensor TFLOPS (catalog.GpuModel.fp16_tflops), from the catalogue by name; None:
    # not a catalogue card (the speed model then assumes ASSUMED_GPU_FP16_TFLOPS and says so)
    fp16_tflops: float | None = None
    error: str | None = None  # a query that failed; the GPU is then not planned on

    @property
    def usable(self) -> bool:
        return self.error is None and self.total_bytes > 0


@dataclass(frozen=True)
class Host:
    ram_total_bytes: int
    ram_available_bytes: int
    cpu_cores: int  # physical cores when known, else logical CPUs
    cpu_threads: int | None = None
    cgroup_limit_bytes: int | None = None  # already applied to the two RAM figures
    ram_bandwidth_bytes_per_s: int | None = None  # None: the planner uses its default


@dataclass(frozen=True)
class LlamaServer:
    path: str
    version: str | None = None  # "0.5.0-dev" or None for old "version: N (hash)" builds
    build: int | None = None  # the b-number
    commit: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Machine:
    gpus: tuple[Gpu, ...]
    host: Host
    described: bool = False  # True: not probed here, planned for as described
    source: str = "probe"  # "probe", "file:PATH", "presets", ...
    disk_path: str | None = None
    disk_free_bytes: int | None = None
    driver_version: str | None = None
    llama_server: LlamaServer | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def usable_gpus(self) -> tuple[Gpu, ...]:
        return tuple(g for g in self.gpus if g.usable)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = [asdict(g) for g in self.gpus]
        data["notes"] = list(self.notes)
        return data


def _only_known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def machine_from_dict(data: dict[str, Any]) -> Machine:
    """Inverse of Machine.to_dict (unknown keys ignored; bad types raise TypeError/KeyError)."""
    gpus = tuple(Gpu(**_only_known(Gpu, g)) for g in data.get("gpus", []))
    host = Host(**_only_known(Host, data["host"]))
    llama = data.get("llama_server")
    rest = _only_known(Machine, data)
    rest.pop("gpus", None)
    rest.pop("host", None)
    rest.pop("llama_server", None)
    rest["notes"] = tuple(rest.get("notes", ()))
    return Machine(
        gpus=gpus,
        host=host,
        llama_server=LlamaServer(**_only_known(LlamaServer, llama)) if llama else None,
        **rest,
    )
