"""Probes for GPUs that NVML does not see: the installed llama.cpp's own device list
(`llama-server --list-devices`, every backend), Apple's `sysctl`, AMD's sysfs. Each source is
read bounded (size and time; a FIFO, a huge or malformed file, a slow tool is refused with a note
naming the source), and a device whose memory could not be read is never planned on.

The parsers are pure (text in, devices out) and tested on recorded real outputs
(tests/data/backends/README.md); the readers are thin.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quantpick.machine.backends import Backend, parse_device_name
from quantpick.machine.catalog import find_gpu, unified_share
from quantpick.machine.spec import Gpu
from quantpick.machine.vendor_smi import (
    Runner,
    SmiGpu,
    amd_smi_static,
    rocm_smi_gpus,
    xpu_smi_gpus,
)

MiB = 1024**2
# `--list-devices` of 16 devices is about 1.5 KB; its backends' init logs a few KB more.
MAX_TOOL_OUTPUT_BYTES = 256 * 1024
# A sysfs attribute is one number; sysctl's answer for three keys is under 200 bytes.
MAX_SYSFS_BYTES = 4096
# --list-devices initialises every backend: CUDA 1-3 s, Metal's library load up to ~5 s (the
# recorded M4 Max log: "loaded in 5.070 sec"); beyond this the tool is refused as slow.
LIST_DEVICES_TIMEOUT_S = 30.0

# "  CUDA0: NVIDIA GeForce RTX 3090 (24135 MiB, 23829 MiB free)" (common/arg.cpp:1159-1163)
_DEVICE_LINE = re.compile(r"^\s+(\S+): (.*) \((\d+) MiB, (\d+) MiB free\)\s*$")


@dataclass(frozen=True)
class ListedDevice:
    """One line of llama.cpp's device list."""

    name: str  # as llama.cpp prints it: "CUDA0", "MTL0", "Vulkan1", "RPC[host:port]"
    description: str
    total_bytes: int
    free_bytes: int
    backend: Backend | None  # None: a device quantpick does not model (BLAS, RPC)
    index: int | None


@dataclass(frozen=True)
class DeviceList:
    devices: tuple[ListedDevice, ...]
    notes: tuple[str, ...] = ()


def parse_list_devices(text: str) -> DeviceList:
    """The devices of `llama-server --list-devices` output (backend init lines are skipped).

    Raises ValueError when the text has no "Available devices:" header (not that tool's output).
    A Vulkan free figure above its total is a driver's nonsense (llama.cpp #15054 and kin): the
    total is kept and free set to it, with a note.
    """
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Available devices:")
    except StopIteration:
        raise ValueError("no 'Available devices:' line") from None
    devices: list[ListedDevice] = []
    notes: list[str] = []
    for line in lines[start + 1 :]:
        if line.strip() in ("", "(none)"):
            continue
        m = _DEVICE_LINE.match(line)
        if m is None:
            if line.startswith(" "):
                raise ValueError(f"cannot read device line {line.strip()!r}")
            break  # the list ended; later output is something else
        name, description = m.group(1), m.group(2)
        total, free = int(m.group(3)) * MiB, int(m.group(4)) * MiB
        parsed = parse_device_name(name)
        if free > total:
            notes.append(f"{name}: free {free // MiB} MiB above total; the total is used")
            free = total
        devices.append(
            ListedDevice(
                name,
                description,
                total,
                free,
                parsed[0] if parsed else None,
                parsed[1] if parsed else None,
            )  # fmt: skip
        )
    return DeviceList(tuple(devices), tuple(notes))


def gpus_from_list(listed: DeviceList) -> tuple[Gpu, ...]:
    """Planning devices from a device list: one Gpu per modelled backend device, with the
    catalogue's figures for its card. A device that reports no memory (BLAS: 0 MiB) is left out;
    so is one whose memory is 0, which is never planned on."""
    gpus: list[Gpu] = []
    for d in listed.devices:
        if d.backend is None or d.index is None or d.total_bytes <= 0:
            continue
        model = find_gpu(d.description, d.total_bytes)
        unified = d.backend.always_unified or bool(model and model.unified)
        gpu = Gpu(
            index=d.index,
            name=d.description,
            total_bytes=d.total_bytes,
            free_bytes=d.free_bytes,
            used_bytes=d.total_bytes - d.free_bytes,
            backend=d.backend.label,
            unified=unified,
        )
        if model is not None:
            gpu = dataclasses.replace(
                gpu,
                bandwidth_bytes_per_s=model.bandwidth_bytes_per_s,
                fp16_tflops=model.fp16_tflops,
                memory_bus_width_bits=model.bus_width_bits,
            )
        gpus.append(gpu)
    return tuple(gpus)


def build_backend(listed: DeviceList) -> Backend | None:
    """The backend the installed build drives its GPUs with (the first modelled device's)."""
    return next((d.backend for d in listed.devices if d.backend is not None), None)


# --- Apple: sysctl ------------------------------------------------------------------------------

SYSCTL_KEYS = ("hw.memsize", "iogpu.wired_limit_mb", "machdep.cpu.brand_string")


def parse_sysctl(text: str) -> dict[str, str]:
    """`sysctl hw.memsize iogpu.wired_limit_mb machdep.cpu.brand_string` -> key: value."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in SYSCTL_KEYS:
            out[key.strip()] = value.strip()
    return out


def apple_gpu(values: dict[str, str]) -> tuple[Gpu, str]:
    """The Apple GPU a Mac's sysctl values describe, and the note saying where its share came
    from: iogpu.wired_limit_mb when set (non-zero), else Metal's default working set of
    hw.memsize (catalog.unified_share). Raises ValueError on a missing or malformed value."""
    try:
        ram = int(values["hw.memsize"])
        wired_mb = int(values.get("iogpu.wired_limit_mb", "0") or "0")
    except (KeyError, ValueError) as exc:
        raise ValueError(f"sysctl: cannot read hw.memsize / iogpu.wired_limit_mb ({exc})") from None
    if ram <= 0 or wired_mb < 0:
        raise ValueError(f"sysctl: hw.memsize {ram}, iogpu.wired_limit_mb {wired_mb}")
    chip = values.get("machdep.cpu.brand_string", "Apple Silicon")
    model = find_gpu(chip)
    if wired_mb:
        share, why = min(wired_mb * MiB, ram), "sysctl iogpu.wired_limit_mb"
    elif model is not None:
        share, why = unified_share(model, ram)
    else:
        share, why = unified_share(_APPLE_ANY, ram)
    gpu = Gpu(
        index=0,
        name=chip,
        total_bytes=share,
        free_bytes=share,
        used_bytes=0,
        backend="Metal",
        unified=True,
        bandwidth_bytes_per_s=model.bandwidth_bytes_per_s if model else None,
        fp16_tflops=model.fp16_tflops if model else None,
    )
    return gpu, f"{chip}: the GPU may hold {share / 1024**3:.2f} GiB of {ram / 1024**3:.0f} ({why})"


_APPLE_ANY = next(m for m in (find_gpu("m4"),) if m is not None)
SYSCTL_TIMEOUT_S = 5.0


def read_sysctl(program: str = "sysctl", timeout_s: float = SYSCTL_TIMEOUT_S) -> dict[str, str]:
    """`sysctl` for SYSCTL_KEYS, bounded in time and output; ValueError naming the tool. A key
    the kernel lacks (iogpu.wired_limit_mb before macOS 14) is simply absent."""
    import subprocess

    try:
        done = subprocess.run(
            [program, *SYSCTL_KEYS], capture_output=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise ValueError(f"{program}: no answer in {timeout_s:g} s") from None
    except OSError as exc:
        raise ValueError(f"{program}: {exc.strerror or exc}") from None
    if len(done.stdout) > MAX_SYSFS_BYTES:
        raise ValueError(f"{program}: more than {MAX_SYSFS_BYTES} bytes")
    return parse_sysctl(done.stdout.decode("utf-8", "replace"))


def platform_gpus(
    platform: str,
    drm: Path = Path("/sys/class/drm"),
    sysctl: str = "sysctl",
    which: Callable[[str], str | None] | None = None,
    run: Runner | None = None,
) -> tuple[tuple[Gpu, ...], tuple[str, ...]]:
    """GPUs the OS itself reports when NVML and llama.cpp named none: an Apple GPU (sysctl) on
    macOS; on Linux AMD GPUs from rocm-smi where installed (it names the card), else amdgpu's
    sysfs, and without AMD GPUs Intel GPUs from xpu-smi where installed. A source that cannot be
    read gives a note naming it (and the next source is tried)."""
    if platform == "darwin":
        try:
            gpu, note = apple_gpu(read_sysctl(sysctl))
        except ValueError as exc:
            return (), (f"Apple GPU not read ({exc}); not planned on",)
        return (gpu,), (note,)
    if not platform.startswith("linux"):
        return (), ()
    import shutil

    from quantpick.machine.vendor_smi import run_smi

    find = which or shutil.which
    runner = run or run_smi
    notes: list[str] = []
    rocm_smi = find("rocm-smi")
    if rocm_smi:
        try:
            gpus = amd_smi_gpus(rocm_smi_gpus(rocm_smi, runner))
        except ValueError as exc:
            notes.append(f"rocm-smi could not be read ({exc}); AMD GPUs from sysfs")
        else:
            if gpus:
                return gpus, (*notes, "AMD GPUs from rocm-smi")
    names: dict[str, str] = {}
    amd_smi = None if rocm_smi else find("amd-smi")
    if amd_smi:
        try:
            names = {g.bdf: g.name for g in amd_smi_static(amd_smi, runner) if g.bdf}
        except ValueError as exc:
            notes.append(f"amd-smi could not be read ({exc}); AMD GPUs from sysfs, unnamed")
    if drm.is_dir():
        gpus, sysfs_notes = amd_sysfs_gpus(drm, names)
        notes.extend(sysfs_notes)
        if gpus:
            if any(g.name in names.values() for g in gpus):
                notes.append("AMD GPUs from sysfs, named by amd-smi")
            return gpus, tuple(notes)
    xpu_smi = find("xpu-smi")
    if xpu_smi:
        try:
            found = xpu_smi_gpus(xpu_smi, runner)
        except ValueError as exc:
            notes.append(f"xpu-smi could not be read ({exc}); Intel GPUs not planned on")
        else:
            if found:
                return intel_smi_gpus(found), (*notes, "Intel GPUs from xpu-smi")
    return (), tuple(notes)


def amd_smi_gpus(found: tuple[SmiGpu, ...]) -> tuple[Gpu, ...]:
    """rocm-smi's cards as GPUs, by amdgpu_sysfs_gpus' rule: an APU (small carve-out, GTT above
    it) is unified and its pool the GTT; a discrete card its VRAM."""
    gpus = []
    for i, s in enumerate(found):
        gtt = s.gtt_total_bytes or 0
        apu = s.total_bytes <= APU_CARVEOUT_MAX_BYTES and gtt > s.total_bytes
        total, used = (gtt, s.gtt_used_bytes) if apu else (s.total_bytes, s.used_bytes)
        model = find_gpu(s.name)
        gpus.append(
            Gpu(
                index=i,
                name=s.name,
                total_bytes=total,
                free_bytes=max(0, total - (used or 0)),
                used_bytes=used,
                bandwidth_bytes_per_s=model.bandwidth_bytes_per_s if model else None,
                fp16_tflops=model.fp16_tflops if model else None,
                backend="ROCm",
                unified=apu,
            )
        )
    return tuple(gpus)


def intel_smi_gpus(found: tuple[SmiGpu, ...]) -> tuple[Gpu, ...]:
    """xpu-smi's devices as SYCL GPUs: free is Level Zero sysman's figure where it gave one,
    else the total (what llama.cpp's SYCL backend itself reports without sysman)."""
    gpus = []
    for i, s in enumerate(found):
        model = find_gpu(s.name)
        free = s.free_bytes if s.free_bytes is not None else s.total_bytes
        gpus.append(
            Gpu(
                index=i,
                name=s.name,
                total_bytes=s.total_bytes,
                free_bytes=free,
                used_bytes=s.total_bytes - free,
                bandwidth_bytes_per_s=model.bandwidth_bytes_per_s if model else None,
                fp16_tflops=model.fp16_tflops if model else None,
                backend="SYCL",
                unified=bool(model and model.unified),
            )
        )
    return tuple(gpus)


# --- AMD: sysfs ---------------------------------------------------------------------------------


def read_bounded(path: Path, limit: int = MAX_SYSFS_BYTES) -> str:
    """A small regular file's text; a FIFO, a device, a huge file is refused (ValueError naming
    the path). Never blocks on a FIFO: the type is checked before opening, and the file is
    opened with O_NONBLOCK."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: not a regular file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path}: more than {limit} bytes")
    return data.decode("ascii", "replace")


def _int_file(path: Path) -> int:
    text = read_bounded(path).strip()
    if not text.isdigit():
        raise ValueError(f"{path}: not a number ({text[:40]!r})")
    return int(text)


# An APU's BIOS carve-out is small (Strix Halo: 512 MiB by default); with GTT larger than it the
# GPU's real pool is GTT (docs/backends.md).
APU_CARVEOUT_MAX_BYTES = 4 * 1024**3


def amd_sysfs_gpus(
    drm: Path = Path("/sys/class/drm"), names: dict[str, str] | None = None
) -> tuple[tuple[Gpu, ...], tuple[str, ...]]:
    """AMD GPUs from amdgpu's sysfs (card*/device/mem_info_vram_total|used, mem_info_gtt_*).
    A discrete card: VRAM. An APU (small carve-out, GTT above it): unified, its pool the GTT's
    total (what ROCm and RADV allocate from). A card whose files cannot be read is left out
    with a note naming the file. `names`: PCI address -> a tool's name for the card (card*/device
    links to the PCI device's directory, named by its address)."""
    gpus: list[Gpu] = []
    notes: list[str] = []
    cards = sorted(p for p in drm.glob("card[0-9]*") if re.fullmatch(r"card\d+", p.name))
    for card in cards:
        dev = card / "device"
        if not (dev / "mem_info_vram_total").exists():
            continue  # not amdgpu
        try:
            vram_total = _int_file(dev / "mem_info_vram_total")
            vram_used = _int_file(dev / "mem_info_vram_used")
            gtt_total = _int_file(dev / "mem_info_gtt_total")
            gtt_used = _int_file(dev / "mem_info_gtt_used")
        except (OSError, ValueError) as exc:
            notes.append(f"AMD GPU {card.name}: memory not read ({exc}); not planned on")
            continue
        apu = vram_total <= APU_CARVEOUT_MAX_BYTES and gtt_total > vram_total
        total, used = (gtt_total, gtt_used) if apu else (vram_total, vram_used)
        name = "AMD Radeon Graphics (APU)" if apu else "AMD Radeon GPU"
        name = (names or {}).get(dev.resolve().name.lower(), name)
        gpus.append(
            Gpu(
                index=len(gpus),
                name=name,
                total_bytes=total,
                free_bytes=max(0, total - used),
                used_bytes=used,
                backend="ROCm",
                unified=apu,
            )  # fmt: skip
        )
    return tuple(gpus), tuple(notes)


LIST_DEVICES_FLAG = "--list-devices"  # common/arg.cpp: prints the backend devices and exits


def read_list_devices(binary: Path, timeout_s: float = LIST_DEVICES_TIMEOUT_S) -> DeviceList:
    """Run `binary --list-devices`, bounded in time and output (process.run_tool: its own
    process group, stdout capped, killed at the deadline); ValueError naming the tool when it is
    slow, fails, or prints what is not a device list."""
    from quantpick.process import tool_stdout

    flag = LIST_DEVICES_FLAG  # llama-server's flag, not one of quantpick's
    text = tool_stdout(
        [str(binary), flag], timeout_s=timeout_s, stdout_cap=MAX_TOOL_OUTPUT_BYTES,
        shown=f"{binary} {flag}",
    )  # fmt: skip
    return parse_list_devices(text)
