"""Probe this machine: NVIDIA GPUs via NVML, host RAM and CPU, disk space, llama-server, and the
llama.cpp RPC workers it is told about (`--rpc HOST:PORT`, read over the network by machine.rpc).

The only module that imports pynvml, and only inside probe_gpus(): importing quantpick stays
cheap and works with no NVIDIA driver. Nothing here raises for missing hardware; a missing
driver gives a CPU-only Machine with a note, a failing GPU is listed with `error` set.

Usage:
    machine = probe()                       # GPUs + host + disk at the models dir + llama-server
    workers = probe_rpc_workers(["192.168.1.20:50052"])   # RpcWorkerError (exit 6) if unreadable
    host = probe_host(meminfo_path=tmp)     # paths are parameters so tests use tmp files
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from quantpick.machine.catalog import (
    find_gpu,
    gpu_assumption_notes,
    theoretical_bandwidth,
    with_catalog_figures,
)
from quantpick.machine.llamacpp import find_llama_server, inspect_llama_server
from quantpick.machine.spec import (
    MAX_BUS_WIDTH_BITS,
    MAX_MEMORY_BYTES,
    MAX_MEMORY_CLOCK_MHZ,
    MAX_PCIE_GENERATION,
    MAX_PCIE_WIDTH,
    Gpu,
    Host,
    LlamaServer,
    Machine,
    Network,
    RpcWorker,
)

MEMINFO = Path("/proc/meminfo")
CPUINFO = Path("/proc/cpuinfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")

NO_NVML_NOTE = "no NVIDIA driver/NVML: planning for CPU only"
NO_GPU_NOTE = "NVML found no NVIDIA GPU: planning for CPU only"

# cgroup v1 reports "unlimited" as a page-aligned LONG_MAX (9223372036854771712); anything this
# large is no limit at all.
_UNLIMITED = 1 << 60

T = TypeVar("T")


# --- GPUs -------------------------------------------------------------------------------------


def _optional(call: Callable[..., T], *args: Any) -> T | None:
    """One NVML query that may be unsupported on this board (NotSupported, vGPU, old binding)."""
    try:
        return call(*args)
    except Exception:  # NVMLError_NotSupported & co., or AttributeError from an old binding
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _positive(value: Any, high: int) -> int | None:
    # vGPUs and some boards answer 0 rather than NotSupported; 0 is as unknown as None, and so is
    # a figure past what any board has (spec.check_machine's ceilings).
    return int(value) if isinstance(value, int) and 0 < value <= high else None


def _probe_one(nv: Any, index: int, meminfo_path: Path | None = None) -> Gpu:
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        return Gpu(index=index, name=f"GPU {index}", total_bytes=0, free_bytes=0,
                   error=f"no handle: {exc}")  # fmt: skip
    name = _text(_optional(nv.nvmlDeviceGetName, handle)) or f"GPU {index}"
    uuid = _text(_optional(nv.nvmlDeviceGetUUID, handle))
    unified = False
    try:
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
        total, free, used = int(mem.total), int(mem.free), int(mem.used)
    except Exception as exc:
        # GB10 and Jetson: NVML has no memory to report ("Not Supported"); the GPU's memory is
        # the host's, and llama.cpp's CUDA backend reports MemTotal / MemAvailable for it
        # (ggml_backend_cuda_get_available_uma_memory). Any other card: not planned on.
        model = find_gpu(name)
        host_ram = read_meminfo(meminfo_path or MEMINFO) if model and model.unified else None
        if host_ram is None:
            return Gpu(index=index, name=name, total_bytes=0, free_bytes=0, uuid=uuid,
                       error=f"memory info: {exc}")  # fmt: skip
        total, free = host_ram
        used, unified = total - free, True
    if not 0 <= free <= total <= MAX_MEMORY_BYTES or used < 0:
        # Figures that cannot be true: the GPU is listed, with why, and not planned on.
        why = f"NVML reports {free:,} B free of {total:,} B total, which cannot be"
        return Gpu(index=index, name=name, total_bytes=0, free_bytes=0, uuid=uuid, error=why)
    bus = _positive(_optional(nv.nvmlDeviceGetMemoryBusWidth, handle), MAX_BUS_WIDTH_BITS)
    clock = _positive(
        _optional(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_MEM), MAX_MEMORY_CLOCK_MHZ
    )
    # Max link, not current: the current link drops to gen 1 when the GPU idles.
    pcie_gen = _positive(
        _optional(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle), MAX_PCIE_GENERATION
    )
    pcie_width = _positive(_optional(nv.nvmlDeviceGetMaxPcieLinkWidth, handle), MAX_PCIE_WIDTH)
    cc = _optional(nv.nvmlDeviceGetCudaComputeCapability, handle)
    # NVML has no compute-throughput query: the catalogue fills it (and a bandwidth NVML lacked).
    return with_catalog_figures(Gpu(
        index=index,
        name=name,
        total_bytes=total,
        free_bytes=free,
        used_bytes=used,
        uuid=uuid,
        memory_bus_width_bits=bus,
        memory_clock_mhz=clock,
        bandwidth_bytes_per_s=theoretical_bandwidth(clock, bus) if bus and clock else None,
        pcie_generation=pcie_gen,
        pcie_width=pcie_width,
        compute_capability=f"{cc[0]}.{cc[1]}" if isinstance(cc, tuple) and len(cc) == 2 else None,
        unified=unified,
    ))  # fmt: skip


def probe_gpus(
    meminfo_path: Path | None = None,
) -> tuple[tuple[Gpu, ...], str | None, tuple[str, ...]]:
    """(gpus, driver version, notes). Never raises: no NVML means no GPUs and a note."""
    try:
        import pynvml
    except ImportError:
        return (), None, (f"{NO_NVML_NOTE} (nvidia-ml-py is not installed)",)
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, any NVMLError
        return (), None, (f"{NO_NVML_NOTE} ({exc})",)
    try:
        driver = _text(_optional(pynvml.nvmlSystemGetDriverVersion))
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except Exception as exc:
            return (), driver, (f"NVML cannot count GPUs ({exc}): planning for CPU only",)
        gpus = tuple(_probe_one(pynvml, i, meminfo_path) for i in range(count))
        notes = [NO_GPU_NOTE] if not gpus else []
        notes += [f"GPU {g.index} ({g.name}) is not used: {g.error}" for g in gpus if g.error]
        notes += gpu_assumption_notes(gpus)
        return gpus, driver, tuple(notes)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass  # nothing useful to do; the process is about to move on


@dataclass(frozen=True)
class GpuMemoryUse:
    """One NVIDIA GPU's memory now, and what one process holds on it."""

    index: int  # NVML index (= CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID)
    total_bytes: int
    used_bytes: int
    process_bytes: int | None  # the process's own; None where NVML cannot tell


def gpu_memory_use(pid: int) -> tuple[tuple[GpuMemoryUse, ...], str | None]:
    """(per GPU: used memory and `pid`'s share via nvmlDeviceGetComputeRunningProcesses, a note
    when NVML cannot be read). Never raises. A pid NVML does not list holds 0 bytes there; a
    driver that cannot attribute memory (usedGpuMemory unavailable, WDDM) gives None."""
    try:
        import pynvml
    except ImportError:
        return (), "nvidia-ml-py is not installed: GPU memory not read"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return (), f"no NVML ({exc}): GPU memory not read"
    try:
        out = []
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            share: int | None = 0
            try:
                for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if int(proc.pid) == pid:
                        used = proc.usedGpuMemory
                        share = int(used) if isinstance(used, int) and used >= 0 else None
            except Exception:
                share = None
            out.append(GpuMemoryUse(index, int(mem.total), int(mem.used), share))
        return tuple(out), None
    except Exception as exc:
        return (), f"NVML failed ({exc}): GPU memory not read"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


# --- Host -------------------------------------------------------------------------------------


def read_meminfo(path: Path = MEMINFO) -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo, or None when unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            # The kernel writes "kB" and means KiB.
            values[key.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    if "MemTotal" not in values:
        return None
    total = values["MemTotal"]
    # MemAvailable exists since Linux 3.14; MemFree is a pessimistic stand-in before that.
    available = values.get("MemAvailable", values.get("MemFree", total))
    return total, available


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2 unlimited) -> None


def _read_stat(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return None


def read_cgroup_memory(root: Path = CGROUP_ROOT) -> tuple[int | None, int | None]:
    """(limit, usage) of this process's memory cgroup (v2, else v1); None where unknown/unlimited.

    usage excludes inactive file cache, which the kernel reclaims before it would OOM-kill
    (the same discount `docker stats` applies); otherwise a container that has read a 20 GB
    GGUF would look full.
    """
    v2_limit = root / "memory.max"
    if v2_limit.exists():
        limit = _read_int(v2_limit)
        usage = _read_int(root / "memory.current")
        inactive = _read_stat(root / "memory.stat", "inactive_file")
    else:
        v1 = root / "memory"
        limit = _read_int(v1 / "memory.limit_in_bytes")
        usage = _read_int(v1 / "memory.usage_in_bytes")
        inactive = _read_stat(v1 / "memory.stat", "total_inactive_file")
    if limit is not None and limit >= _UNLIMITED:
        limit = None
    if limit is None:
        return None, None
    if usage is not None and inactive is not None:
        usage = max(0, usage - inactive)
    return limit, usage


def physical_cores(path: Path = CPUINFO) -> int | None:
    """Unique (physical id, core id) pairs in /proc/cpuinfo; None when the file lacks them."""
    try:
        text = path.read_text()
    except OSError:
        return None
    cores: set[tuple[str, str]] = set()
    physical, core = "0", None
    for line in text.splitlines() + [""]:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            physical = value.strip()
        elif key == "core id":
            core = value.strip()
        elif not key:  # a blank line ends one processor's block
            if core is not None:
                cores.add((physical, core))
            physical, core = "0", None
    return len(cores) or None


def _sysconf_ram() -> tuple[int, int] | None:
    """Best effort without /proc (macOS, BSD): total from sysconf; available is then only free."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = page * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    try:
        available = page * os.sysconf("SC_AVPHYS_PAGES")  # free pages: an underestimate
    except (ValueError, OSError):
        available = total
    return total, available


def cpu_threads() -> int | None:
    """Logical CPUs of this machine (os.cpu_count); the one place the probe asks the OS."""
    return os.cpu_count()


def probe_host(
    *,
    meminfo_path: Path | None = None,
    cgroup_root: Path | None = None,
    cpuinfo_path: Path | None = None,
    notes: list[str] | None = None,
) -> Host:
    """Host RAM (min'd with the cgroup limit) and CPU cores. Notes about guesses go to `notes`.

    A path not given is this module's MEMINFO / CGROUP_ROOT / CPUINFO, read at call time, so a
    test suite can point the whole probe at recorded files (tests/conftest.py does).
    """
    meminfo_path = MEMINFO if meminfo_path is None else meminfo_path
    cgroup_root = CGROUP_ROOT if cgroup_root is None else cgroup_root
    cpuinfo_path = CPUINFO if cpuinfo_path is None else cpuinfo_path
    ram = read_meminfo(meminfo_path)
    if ram is None:
        ram = _sysconf_ram()
        if notes is not None:
            notes.append("no /proc/meminfo: RAM read from sysconf (available = free memory)")
    if ram is None:
        ram = (0, 0)
        if notes is not None:
            notes.append("cannot read the host RAM: describe it with --ram")
    total, available = ram
    limit, usage = read_cgroup_memory(cgroup_root)
    if limit is not None:
        total = min(total, limit) if total else limit
        headroom = limit - usage if usage is not None else limit
        available = max(0, min(available, headroom) if available else headroom)
    threads = cpu_threads()
    cores = physical_cores(cpuinfo_path) or threads or 1
    return Host(
        ram_total_bytes=total,
        ram_available_bytes=available,
        cpu_cores=cores,
        cpu_threads=threads,
        cgroup_limit_bytes=limit,
    )


# --- Disk and llama-server ---------------------------------------------------------------------


def disk_free(path: Path) -> tuple[Path, int] | None:
    """(nearest existing directory, free bytes there); the target may not exist yet."""
    probe_at = path.expanduser().absolute()
    while not probe_at.exists() and probe_at != probe_at.parent:
        probe_at = probe_at.parent
    try:
        return probe_at, shutil.disk_usage(probe_at).free
    except OSError:
        return None


def probe_llama_server(path: Path | None = None) -> LlamaServer | None:
    """The given binary (even if missing: the user asked for it), else PATH's; None if neither."""
    found = find_llama_server(path)
    if found is None:
        return LlamaServer(path=str(path), error="not found") if path is not None else None
    return inspect_llama_server(found)


def default_disk_path() -> Path:
    from quantpick.config import load_settings

    return load_settings().models_dir


# --- RPC workers ------------------------------------------------------------------------------


def worker_from_report(report: Any) -> RpcWorker:
    """A probed worker as machine data. The protocol names no device, so a device is called
    "HOST:PORT/i" (llama-server's own description of it is "HOST:PORT")."""
    devices = tuple(
        Gpu(
            index=i,
            name=f"{report.endpoint}/{i}",
            total_bytes=d.total_bytes,
            free_bytes=d.free_bytes,
            used_bytes=max(0, d.total_bytes - d.free_bytes),
        )
        for i, d in enumerate(report.devices)
    )
    n_trips = 1 + len(report.devices)
    network = Network(
        rtt_s=report.rtt_s,
        rtt_source=f"measured: quickest of {n_trips} request/response round trips to the worker",
    )
    return RpcWorker(
        host=report.host,
        port=report.port,
        devices=devices,
        network=network,
        probed=True,
        protocol=report.version_text,
        address=report.address,
        head_address=report.head_address,
    )


def probe_rpc_worker(
    host: str, port: int, *, timeout_s: float | None = None
) -> tuple[RpcWorker, tuple[str, ...]]:
    """One worker read now, and notes about it (machine.rpc.query_worker). Raises RpcWorkerError
    (exit 6) when it cannot be read: unreachable, busy, or another protocol."""
    from quantpick.machine import rpc

    report = rpc.query_worker(
        host, port, timeout_s=rpc.DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    )
    return worker_from_report(report), report.notes


def probe_rpc_workers(
    endpoints: list[tuple[str, int]], *, timeout_s: float | None = None
) -> list[tuple[RpcWorker, tuple[str, ...]]]:
    """Several workers read at once (machine.rpc.query_workers: the probe takes one exchange's
    deadline, not one per worker). Raises the first failing worker's RpcWorkerError, in the
    order given."""
    from quantpick.machine import rpc

    results = rpc.query_workers(
        endpoints, timeout_s=rpc.DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    )
    out = []
    for result in results:
        if isinstance(result, Exception):
            raise result
        out.append((worker_from_report(result), result.notes))
    return out


# --- Everything -------------------------------------------------------------------------------


def probe(
    *,
    disk_path: Path | None = None,
    llama_server: Path | None = None,
    meminfo_path: Path | None = None,
    cgroup_root: Path | None = None,
    cpuinfo_path: Path | None = None,
    inspect_server: bool = True,
    drm_path: Path = Path("/sys/class/drm"),
) -> Machine:
    """This machine as it is now. Never raises for missing hardware or tools.

    inspect_server=False skips running `llama-server --version`: planning does not need it, and
    the command builder inspects the binary it targets itself.
    """
    gpus, driver, gpu_notes = probe_gpus(meminfo_path)
    notes = list(gpu_notes)
    host = probe_host(
        meminfo_path=meminfo_path, cgroup_root=cgroup_root, cpuinfo_path=cpuinfo_path, notes=notes
    )
    target = disk_path if disk_path is not None else default_disk_path()
    disk = disk_free(target)
    server = probe_llama_server(llama_server) if inspect_server else None
    if server is None and inspect_server:
        notes.append("llama-server not found on PATH (give it with --llama-server)")
    elif server is not None and server.error:
        notes.append(f"llama-server {server.path}: {server.error}")
    listed_none = False
    if any(g.usable for g in gpus) and server is not None and not server.error:
        # NVIDIA GPUs, but the build may drive them with Vulkan: its device list says which
        # backend's names the command must use (memory stays NVML's).
        from quantpick.machine.backends import Vendor, all_backends
        from quantpick.machine.devices import build_backend, read_list_devices

        try:
            kind = build_backend(read_list_devices(Path(server.path)))
        except ValueError as exc:
            notes.append(f"no device list from llama-server ({exc})")
        else:
            if kind is None:
                nvidia_builds = " or ".join(
                    b.label for b in all_backends() if b.drives(Vendor.NVIDIA)
                )
                notes.append(
                    "the installed llama-server lists no GPU (a CPU build): its commands will "
                    f"not use the GPUs; install a {nvidia_builds} build"
                )
            elif any(g.backend != kind.label for g in gpus):
                gpus = tuple(dataclasses.replace(g, backend=kind.label) for g in gpus)
                notes.append(f"the installed llama-server drives the GPUs with {kind.label}")
    elif server is not None and not server.error:
        # No NVIDIA GPU: the installed build's own device list names what it drives (ROCm,
        # Metal, Vulkan, SYCL) with llama.cpp's memory figures (machine/devices.py).
        from quantpick.machine.devices import build_backend, gpus_from_list, read_list_devices

        try:
            listed = read_list_devices(Path(server.path))
        except ValueError as exc:
            notes.append(f"no device list from llama-server ({exc})")
        else:
            found = gpus_from_list(listed)
            notes.extend(listed.notes)
            listed_none = not found
            if found:
                kind = build_backend(listed)
                gpus = found
                notes = [n for n in notes if "planning for CPU only" not in n]
                notes.append(
                    f"GPUs from `llama-server --list-devices` ({kind.label if kind else '?'} build)"
                )
    if not any(g.usable for g in gpus):
        # The OS's own report (sysctl on macOS, amdgpu sysfs on Linux). When the installed
        # llama-server lists no device, its build cannot drive them: shown, not planned on.
        from quantpick.machine.devices import platform_gpus

        found, found_notes = platform_gpus(sys.platform, drm_path)
        notes.extend(found_notes)
        if found and listed_none:
            why = "the installed llama-server lists no GPU (a CPU build): build one for it"
            found = tuple(dataclasses.replace(g, error=why) for g in found)
        if found:
            gpus = found
            if not listed_none:
                notes = [n for n in notes if "planning for CPU only" not in n]
    return Machine(
        gpus=gpus,
        host=host,
        described=False,
        source="probe",
        disk_path=str(target),
        disk_free_bytes=disk[1] if disk else None,
        driver_version=driver,
        llama_server=server,
        notes=tuple(notes),
    )
