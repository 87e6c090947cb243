"""What a machine is, as plain data: GPUs, host memory and CPU, disk, llama-server, and the
llama.cpp RPC workers (other machines' devices that llama-server reaches with `--rpc`).

Pure: the probe (`hardware.py`) and described machines (`describe.py`) build these; the
planner reads them. `to_dict`/`machine_from_dict` make `probe --json` round-trip into
`--hardware FILE`.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from quantpick.machine.backends import default_gpu_backend

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
# A described machine's CPU and RAM when not given: the most common desktop, not the box quantpick
# runs on. Steam Hardware & Software Survey, February 2025: six physical cores is the largest group
# (35.5% of PCs; eight cores 20.5%), 32 GB the most common RAM (46.9%; 16 GB 36.7%). Both six-core
# lines of that survey's era (Ryzen 5, Core i5) run two threads per core.
ASSUMED_HOST_CORES = 6
ASSUMED_HOST_THREADS = 12
ASSUMED_HOST_RAM_BYTES = 32 * 1024**3
ASSUMED_HOST_SOURCE = (
    "the most common desktop in Steam's hardware survey (Feb 2025: 35.5% six-core CPUs, "
    "46.9% with 32 GB)"
)
# Host fields a description can leave to an assumption (Host.assumed names them).
HOST_FIELDS = ("cores", "threads", "ram", "ram_bandwidth")

# How many GPUs and RPC devices one llama-server drives. llama.cpp b11312's scheduler takes at most
# 16 backends, the last of them the CPU (GGML_SCHED_MAX_BACKENDS 16, ggml/src/ggml-backend.cpp:764,
# asserted at :1872-1873), and `-ts` takes fewer values than llama_max_devices() = 16
# (src/llama.cpp:86-88; common/arg.cpp:2840 throws at `>=`). So 15, locally and over RPC together.
# (ggml/include/ggml-rpc.h:17's GGML_RPC_MAX_SERVERS 16 is defined but not enforced in this build.)
MAX_DEVICES = 15

# Ceilings on figures no real machine reaches; beyond one, a value is a typo or a broken source.
# Memory: 1 PiB per device or host (units.MAX_BARE_SIZE GiB); the largest single-system-image
# servers hold tens of TiB (HPE Superdome Flex: up to 48 TB), the largest GPUs 141-288 GB.
MAX_MEMORY_BYTES = 1024**5
# Bandwidth: 100 TB/s, 20x the fastest card in the catalogue (H200: 4.8 TB/s HBM3e).
MAX_BANDWIDTH_BYTES_PER_S = 100 * 10**12
# Dense FP16 tensor TFLOPS: 100x the catalogue's fastest (H100 SXM: 989).
MAX_FP16_TFLOPS = 100_000.0
# CPU cores and threads: Linux's largest NR_CPUS (8192, x86-64 with MAXSMP, arch/x86/Kconfig).
MAX_CPUS = 8192
# Memory bus: 8x the widest there is (H200/B200: HBM stacks of 1024 bits, 6144-8192 bits in all);
# memory clock as NVML reports it: 7x GDDR7's (RTX 5090: 14001 MHz for 28 Gbps).
MAX_BUS_WIDTH_BITS = 65536
MAX_MEMORY_CLOCK_MHZ = 100_000
# PCIe: generation 7 is the newest specification (PCI-SIG, 2025); x32 the widest link it defines.
MAX_PCIE_GENERATION = 7
MAX_PCIE_WIDTH = 32
# A request/response round trip: a geostationary satellite hop is ~0.6 s; 10 s is no working link.
MAX_RTT_S = 10.0


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
    # The ggml backend behind the device (machine/backends: its names, buffer rule, variables),
    # by label: "CUDA", "ROCm", "Metal", "Vulkan", "SYCL"; "CPU" for an RPC worker serving its CPU.
    # Default: the backend of a GPU that names none (NVML's GPUs).
    backend: str = field(default_factory=lambda: default_gpu_backend().label)
    # True: the GPU's memory is the host's RAM (Apple Silicon, Strix Halo, GB10, Jetson, iGPUs);
    # total/free are then the share the OS lets the GPU take, and the host's RAM is one pool
    # with it (plan/memory.py budgets it once).
    unified: bool = False
    # The driver's buffer alignment where it is known and differs from the backend's assumed one
    # (Vulkan: minStorageBufferOffsetAlignment, 4 on RADV, 64 assumed): tensors are padded to it.
    buffer_alignment: int | None = None
    # The largest tensor the device's kernels take, where its driver's is known (Vulkan:
    # maxStorageBufferRange without 64-bit indexing; lavapipe 128 MiB): llama.cpp keeps a larger
    # weight in host memory (ggml-vulkan supports_op refuses it; the loader takes the CPU buffer).
    max_tensor_bytes: int | None = None

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
    # Which of HOST_FIELDS are assumptions rather than probed or described values.
    assumed: tuple[str, ...] = ()


@dataclass(frozen=True)
class LlamaServer:
    path: str
    version: str | None = None  # "0.5.0-dev" or None for old "version: N (hash)" builds
    build: int | None = None  # the b-number
    commit: str | None = None
    error: str | None = None


# The link between the head (the machine running llama-server) and an RPC worker, when neither
# measured nor given. Bandwidth: 1 GbE TCP goodput. A 1000 Mb/s line carries a 1500-byte-MTU frame
# as 1538 bytes on the wire (preamble 8 + Ethernet header 14 + FCS 4 + inter-frame gap 12) of
# which 1448 are TCP payload (IP 20 + TCP 20 + timestamps option 12), so 1e9/8 x 1448/1538 =
# 117.7 MB/s (941 Mbit/s, the figure iperf3 reports on a clean gigabit link).
DEFAULT_RPC_BANDWIDTH = 117_000_000
DEFAULT_RPC_BANDWIDTH_SOURCE = "default: 1 GbE TCP goodput (941 Mbit/s)"
# Round trip of one small request on a switched gigabit LAN: `ping` typically shows 0.1-0.5 ms.
# Estimate; a probed worker's own round trip replaces it (RpcWorker.network.rtt_source).
DEFAULT_RPC_RTT_S = 0.0003
DEFAULT_RPC_RTT_SOURCE = "default: switched gigabit LAN (estimate)"


@dataclass(frozen=True)
class Network:
    """The link between the head and one RPC worker: what moves activations and weights."""

    bandwidth_bytes_per_s: int = DEFAULT_RPC_BANDWIDTH
    rtt_s: float = DEFAULT_RPC_RTT_S  # one request/response round trip, in seconds
    bandwidth_source: str = DEFAULT_RPC_BANDWIDTH_SOURCE
    rtt_source: str = DEFAULT_RPC_RTT_SOURCE


@dataclass(frozen=True)
class RpcWorker:
    """One `ggml-rpc-server` (llama.cpp's RPC worker) and the devices it serves.

    `devices` are in the worker's own order (its `-d` list; the index RPC_CMD_GET_DEVICE_MEMORY
    takes), each a Gpu whose `index` is that position. llama-server names them RPC0, RPC1, ...
    with one counter over all workers in `--rpc` order (plan.memory.llama_devices).
    """

    host: str  # as llama-server's --rpc names it (IPv4 address or host name)
    port: int
    devices: tuple[Gpu, ...]
    network: Network = field(default_factory=Network)
    probed: bool = False  # True: memory read from the worker (free is after its own context)
    protocol: str | None = None  # "7.0.0" as the worker answered HELLO
    address: str | None = None  # the worker's IPv4 address as the head reaches it
    head_address: str | None = None  # the head's address on that link (firewall rules)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


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
    rpc_workers: tuple[RpcWorker, ...] = ()  # in llama-server --rpc order
    # True: this machine as probed, with its GPUs left out (--cpu-only). Still this machine
    # (described=False): llama.cpp can confirm a plan here, with the GPUs hidden (--device none).
    gpus_hidden: bool = False

    @property
    def usable_gpus(self) -> tuple[Gpu, ...]:
        return tuple(g for g in self.gpus if g.usable)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = [asdict(g) for g in self.gpus]
        data["notes"] = list(self.notes)
        data["rpc_workers"] = [_worker_dict(w) for w in self.rpc_workers]
        return data


def _worker_dict(worker: RpcWorker) -> dict[str, Any]:
    data = asdict(worker)
    data["devices"] = [asdict(g) for g in worker.devices]
    data["endpoint"] = worker.endpoint  # for readers; machine_from_dict ignores it
    return data


def _only_known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def machine_from_dict(data: dict[str, Any]) -> Machine:
    """Inverse of Machine.to_dict (unknown keys ignored; bad types raise TypeError/KeyError)."""
    gpus = tuple(Gpu(**_only_known(Gpu, g)) for g in data.get("gpus", []))
    host_data = _only_known(Host, data["host"])
    host_data["assumed"] = tuple(host_data.get("assumed") or ())
    host = Host(**host_data)
    llama = data.get("llama_server")
    rest = _only_known(Machine, data)
    rest.pop("gpus", None)
    rest.pop("host", None)
    rest.pop("llama_server", None)
    rest.pop("rpc_workers", None)
    rest["notes"] = tuple(rest.get("notes", ()))
    return Machine(
        gpus=gpus,
        host=host,
        llama_server=LlamaServer(**_only_known(LlamaServer, llama)) if llama else None,
        rpc_workers=tuple(worker_from_dict(w) for w in data.get("rpc_workers") or ()),
        **rest,
    )


def worker_from_dict(data: dict[str, Any]) -> RpcWorker:
    """Inverse of the `rpc_workers` entries of Machine.to_dict (unknown keys ignored)."""
    rest = _only_known(RpcWorker, data)
    rest["devices"] = tuple(Gpu(**_only_known(Gpu, g)) for g in data.get("devices", []))
    network = data.get("network")
    rest["network"] = Network(**_only_known(Network, network)) if network else Network()
    return RpcWorker(**rest)


# --- Values that cannot be true ---------------------------------------------------------------


class TooManyDevices(ValueError):
    """More GPUs and RPC devices than one llama-server drives (MAX_DEVICES)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _whole(value: Any, where: str, low: int, high: int, unit: str = "") -> None:
    if not _is_int(value) or not low <= value <= high:
        shown = f"{value!r}" if not _is_int(value) else f"{value:,}{unit}"
        raise ValueError(f"{where} is {shown}: it must be a whole number from {low:,} to {high:,}")


def _optional_whole(value: Any, where: str, low: int, high: int) -> None:
    if value is not None:
        _whole(value, where, low, high)


def _optional_text(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where} must be text, not {value!r}")


# CUDA's MAJOR.MINOR as NVML reports it ("8.6", "12.0"; nvmlDeviceGetCudaComputeCapability) or an
# AMD LLVM target ("gfx1100", "gfx90a": ROCm's gcnArchName).
_COMPUTE_CAPABILITY = re.compile(r"\d{1,2}\.\d{1,2}|gfx[0-9a-f]{3,4}")


def _compute_capability(value: Any, where: str) -> None:
    _optional_text(value, where)
    if value is not None and not _COMPUTE_CAPABILITY.fullmatch(value):
        raise ValueError(
            f'{where} is {value[:40]!r}: give it as NVML reports it, MAJOR.MINOR ("8.6"), '
            'or as an AMD target ("gfx1100")'
        )


def _bandwidth(value: Any, where: str) -> None:
    """None (not known) or 1 B/s .. MAX_BANDWIDTH_BYTES_PER_S; 0 is not "unknown" here."""
    if value is None:
        return
    if not _is_int(value) or not 0 < value <= MAX_BANDWIDTH_BYTES_PER_S:
        raise ValueError(
            f"{where} is {value!r}: a bandwidth is a whole number of bytes/s, more than 0 and at "
            f"most {MAX_BANDWIDTH_BYTES_PER_S:.0e} (100 TB/s)"
        )


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


def _check_gpu(gpu: Gpu, where: str) -> None:
    _whole(gpu.index, f"{where}.index", 0, 2**31 - 1)
    if not isinstance(gpu.name, str) or not gpu.name.strip():
        raise ValueError(f"{where}.name must be the GPU's name")
    _optional_text(gpu.error, f"{where}.error")
    _optional_text(gpu.uuid, f"{where}.uuid")
    _compute_capability(gpu.compute_capability, f"{where}.compute_capability")
    _whole(gpu.total_bytes, f"{where}.total_bytes", 0, MAX_MEMORY_BYTES, " B")
    _whole(gpu.free_bytes, f"{where}.free_bytes", 0, MAX_MEMORY_BYTES, " B")
    _optional_whole(gpu.used_bytes, f"{where}.used_bytes", 0, MAX_MEMORY_BYTES)
    if gpu.free_bytes > gpu.total_bytes:
        raise ValueError(
            f"{where}.free_bytes ({_gib(gpu.free_bytes)}) is more than its total_bytes "
            f"({_gib(gpu.total_bytes)})"
        )
    _bandwidth(gpu.bandwidth_bytes_per_s, f"{where}.bandwidth_bytes_per_s")
    _optional_whole(
        gpu.memory_bus_width_bits, f"{where}.memory_bus_width_bits", 1, MAX_BUS_WIDTH_BITS
    )
    _optional_whole(gpu.memory_clock_mhz, f"{where}.memory_clock_mhz", 1, MAX_MEMORY_CLOCK_MHZ)
    _optional_whole(gpu.pcie_generation, f"{where}.pcie_generation", 1, MAX_PCIE_GENERATION)
    _optional_whole(gpu.pcie_width, f"{where}.pcie_width", 1, MAX_PCIE_WIDTH)
    tflops = gpu.fp16_tflops
    if tflops is not None and (
        isinstance(tflops, bool)
        or not isinstance(tflops, (int, float))
        or not math.isfinite(tflops)
        or not 0 < tflops <= MAX_FP16_TFLOPS
    ):
        raise ValueError(
            f"{where}.fp16_tflops is {tflops!r}: it must be more than 0 and at most "
            f"{MAX_FP16_TFLOPS:g}"
        )


def too_many_devices(count: int) -> str:
    return (
        f"{count} GPUs and RPC devices: one llama-server drives at most {MAX_DEVICES} "
        "(llama.cpp's scheduler takes 16 backends, one of them the CPU: GGML_SCHED_MAX_BACKENDS)"
    )


def check_machine(machine: Machine, *, count_devices: bool = True) -> None:
    """Refuse a machine with a value that cannot be true: a ValueError naming the field as
    `probe --json` spells it (free memory above total, a negative, NaN or absurd bandwidth,
    -5 threads, 10^21 cores, a 2^63-byte device), or more devices than llama-server drives
    (MAX_DEVICES; unless count_devices is False). machine_from_dict checks nothing; this does."""
    n_devices = len(machine.gpus) + sum(len(w.devices) for w in machine.rpc_workers)
    if count_devices and n_devices > MAX_DEVICES:
        raise TooManyDevices(too_many_devices(n_devices))
    indices = set()
    for i, gpu in enumerate(machine.gpus):
        _check_gpu(gpu, f"gpus[{i}]")
        if gpu.index in indices:
            raise ValueError(f"gpus[{i}].index {gpu.index} is given twice")
        indices.add(gpu.index)
    host = machine.host
    _whole(host.ram_total_bytes, "host.ram_total_bytes", 0, MAX_MEMORY_BYTES, " B")
    _whole(host.ram_available_bytes, "host.ram_available_bytes", 0, MAX_MEMORY_BYTES, " B")
    if host.ram_available_bytes > host.ram_total_bytes:
        raise ValueError(
            f"host.ram_available_bytes ({_gib(host.ram_available_bytes)}) is more than "
            f"host.ram_total_bytes ({_gib(host.ram_total_bytes)})"
        )
    _whole(host.cpu_cores, "host.cpu_cores", 1, MAX_CPUS)
    _optional_whole(host.cpu_threads, "host.cpu_threads", 1, MAX_CPUS)
    _optional_whole(host.cgroup_limit_bytes, "host.cgroup_limit_bytes", 0, 2**64)
    _bandwidth(host.ram_bandwidth_bytes_per_s, "host.ram_bandwidth_bytes_per_s")
    _optional_whole(machine.disk_free_bytes, "disk_free_bytes", 0, 2**64)
    if not isinstance(machine.notes, tuple) or not all(isinstance(n, str) for n in machine.notes):
        raise ValueError("notes must be a list of text lines")
    for i, worker in enumerate(machine.rpc_workers):
        where = f"rpc_workers[{i}]"
        if not isinstance(worker.host, str) or not worker.host:
            raise ValueError(f"{where}.host must be a host name or IPv4 address")
        _whole(worker.port, f"{where}.port", 1, 65535)
        if not worker.devices:
            raise ValueError(f"{where} has no devices")
        for j, gpu in enumerate(worker.devices):
            _check_gpu(gpu, f"{where}.devices[{j}]")
        net = worker.network
        if net.bandwidth_bytes_per_s is None:
            raise ValueError(f"{where}.network.bandwidth_bytes_per_s is missing")
        _bandwidth(net.bandwidth_bytes_per_s, f"{where}.network.bandwidth_bytes_per_s")
        rtt = net.rtt_s
        if (
            isinstance(rtt, bool)
            or not isinstance(rtt, (int, float))
            or not math.isfinite(rtt)
            or not 0 <= rtt <= MAX_RTT_S
        ):
            raise ValueError(
                f"{where}.network.rtt_s is {rtt!r}: a round trip is 0 to {MAX_RTT_S:g} seconds"
            )
