"""Probes beyond NVML on recorded real outputs (tests/data/backends/README.md names each source):
llama.cpp's device list of every backend, Apple's sysctl, AMD's sysfs; bounded reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quantpick.machine.backends import BackendKind
from quantpick.machine.devices import (
    amd_sysfs_gpus,
    apple_gpu,
    build_backend,
    gpus_from_list,
    parse_list_devices,
    parse_sysctl,
    read_bounded,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "backends"
MiB = 1024**2
GiB = 1024**3


def listed(name: str):  # type: ignore[no-untyped-def]
    return parse_list_devices((DATA / name).read_text())


def test_pinned_cpu_build_lists_no_device() -> None:
    d = listed("list-devices-cpu-b11312.txt")
    assert d.devices == () and gpus_from_list(d) == () and build_backend(d) is None


def test_m4_max_metal_list_is_one_unified_device_of_the_working_set() -> None:
    d = listed("list-devices-metal-m4-max.txt")
    assert [x.name for x in d.devices] == ["Metal", "BLAS"]
    (gpu,) = gpus_from_list(d)  # BLAS: no memory, not a device to plan on
    assert (gpu.backend, gpu.index, gpu.unified) == ("Metal", 0, True)
    assert gpu.total_bytes == 98304 * MiB == 96 * GiB  # 3/4 of 128 GiB
    assert gpu.free_bytes == 98303 * MiB
    assert gpu.bandwidth_bytes_per_s == 546 * 10**9  # the catalogue's M4 Max
    assert build_backend(d) is not None and build_backend(d).kind is BackendKind.METAL  # type: ignore[union-attr]


def test_wired_limit_shows_in_the_metal_list() -> None:
    (gpu,) = gpus_from_list(listed("list-devices-metal-m1-max-wired.txt"))
    assert gpu.total_bytes == 26000 * MiB and gpu.name == "Apple M1 Max"


def test_vulkan_list_on_an_nvidia_card() -> None:
    d = listed("list-devices-vulkan-rtx2060.txt")
    (gpu,) = gpus_from_list(d)
    assert (gpu.backend, gpu.total_bytes, gpu.free_bytes) == ("Vulkan", 6144 * MiB, 5136 * MiB)
    assert not gpu.unified


def test_vulkan_free_above_total_is_ignored() -> None:
    text = (
        "Available devices:\n"
        "  Vulkan0: AMD Radeon Graphics (RADV GFX1151) (1024 MiB, 9000 MiB free)\n"
    )
    d = parse_list_devices(text)
    assert d.devices[0].free_bytes == d.devices[0].total_bytes and d.notes


@pytest.mark.parametrize(
    "text",
    ["garbage", "Available devices:\n  CUDA0: card (lots MiB, 1 MiB free)\n"],
)
def test_malformed_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_list_devices(text)


def test_rpc_and_rocm_lines() -> None:
    text = (
        "Available devices:\n"
        "  ROCm0: AMD Radeon RX 7900 XTX (24560 MiB, 24450 MiB free)\n"
        "  RPC[10.0.0.2:50052]: RPC[10.0.0.2:50052] (24000 MiB, 23000 MiB free)\n"
    )
    d = parse_list_devices(text)
    (gpu,) = gpus_from_list(d)
    assert gpu.backend == "ROCm" and gpu.bandwidth_bytes_per_s == 960 * 10**9
    assert d.devices[1].backend is None


# --- Apple sysctl -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ram_gib", "logged_mb"),
    [tuple(float(v) if "." in v else int(v) for v in line.split())
     for line in (DATA / "metal-working-set.txt").read_text().splitlines()],
)  # fmt: skip
def test_sysctl_default_share_is_metals_recorded_working_set(
    ram_gib: int, logged_mb: float
) -> None:
    values = parse_sysctl(
        f"hw.memsize: {ram_gib * GiB}\niogpu.wired_limit_mb: 0\n"
        "machdep.cpu.brand_string: Apple M2 Max\n"
    )
    gpu, note = apple_gpu(values)
    assert abs(gpu.total_bytes / 1e6 - logged_mb) < 0.01 and gpu.unified
    assert "working set" in note


def test_sysctl_wired_limit_overrides() -> None:
    gpu, note = apple_gpu(
        parse_sysctl(
            "hw.memsize: 34359738368\niogpu.wired_limit_mb: 26000\n"
            "machdep.cpu.brand_string: Apple M1 Max\n"
        )  # fmt: skip
    )
    assert gpu.total_bytes == 26000 * MiB and "iogpu.wired_limit_mb" in note
    with pytest.raises(ValueError, match="sysctl"):
        apple_gpu(parse_sysctl("hw.memsize: lots\n"))


# --- AMD sysfs ----------------------------------------------------------------------------------


def _card(root: Path, n: int, vram: int, vram_used: int, gtt: int, gtt_used: int) -> None:
    dev = root / f"card{n}" / "device"
    dev.mkdir(parents=True)
    for name, value in (("vram_total", vram), ("vram_used", vram_used),
                        ("gtt_total", gtt), ("gtt_used", gtt_used)):  # fmt: skip
        (dev / f"mem_info_{name}").write_text(f"{value}\n")


def test_sysfs_discrete_card_and_strix_halo_apu(tmp_path: Path) -> None:
    _card(tmp_path, 0, 24 * GiB, 1 * GiB, 16 * GiB, 0)  # 7900 XTX
    # Strix Halo: 512 MiB carve-out (rocm-smi in lemonade-sdk/llamacpp-rocm #9: 536870912 B
    # total, 368111616 used), GTT 124 GiB (amdgpu.gttsize=126976, kyuz0's toolbox setting)
    _card(tmp_path, 1, 536870912, 368111616, 126976 * MiB, 2 * GiB)
    gpus, notes = amd_sysfs_gpus(tmp_path)
    assert notes == ()
    dgpu, apu = gpus
    assert (dgpu.total_bytes, dgpu.free_bytes, dgpu.unified) == (24 * GiB, 23 * GiB, False)
    assert (apu.total_bytes, apu.unified, apu.backend) == (126976 * MiB, True, "ROCm")


def test_sysfs_unreadable_card_is_not_planned_on(tmp_path: Path) -> None:
    _card(tmp_path, 0, 24 * GiB, 0, 16 * GiB, 0)
    f = tmp_path / "card0" / "device" / "mem_info_vram_used"
    f.unlink()
    os.mkfifo(f)  # a FIFO must not block the probe
    gpus, notes = amd_sysfs_gpus(tmp_path)
    assert gpus == () and "not a regular file" in notes[0] and "not planned on" in notes[0]


def test_huge_or_malformed_sysfs_file_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_text("1" * 10_000)
    with pytest.raises(ValueError, match="more than"):
        read_bounded(big)
    _card(tmp_path / "d", 0, 24 * GiB, 0, 16 * GiB, 0)
    (tmp_path / "d" / "card0" / "device" / "mem_info_vram_total").write_text("n/a\n")
    gpus, notes = amd_sysfs_gpus(tmp_path / "d")
    assert gpus == () and "not a number" in notes[0]


# --- probe(): GB10 through NVML + meminfo, the OS's report when nothing else names a GPU ----------


def test_gb10_memory_comes_from_meminfo_when_nvml_has_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys

    from fake_nvml import FakeGpu, FakeNvml, NVMLError_NotSupported

    from quantpick.machine import probe as hardware

    # nvidia-smi on a DGX Spark: "Memory-Usage: Not Supported"; the memory is the host's.
    gb10 = FakeGpu("NVIDIA GB10", 0, 0, None, None, cc=(12, 1),
                   fail={"nvmlDeviceGetMemoryInfo": NVMLError_NotSupported})  # fmt: skip
    t4 = FakeGpu(
        "Tesla T4", 0, 0, 256, 5001, fail={"nvmlDeviceGetMemoryInfo": NVMLError_NotSupported}
    )
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([gb10, t4]))
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       128452000 kB\nMemAvailable:   120000000 kB\n")
    machine = hardware.probe(
        meminfo_path=meminfo, cgroup_root=tmp_path, cpuinfo_path=tmp_path / "x",
        inspect_server=False, drm_path=tmp_path / "nodrm",
    )  # fmt: skip
    spark, card = machine.gpus
    assert spark.usable and spark.unified and spark.total_bytes == 128452000 * 1024
    assert spark.free_bytes == 120000000 * 1024
    assert spark.bandwidth_bytes_per_s == 273_024_000_000  # the catalogue's GB10
    # A discrete card without memory figures is still never planned on.
    assert not card.usable and "memory info" in (card.error or "")


def test_amd_sysfs_is_read_when_nvml_and_llama_cpp_name_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys

    from quantpick.machine import probe as hardware

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(sys, "platform", "linux")
    _card(tmp_path / "drm", 0, 24 * GiB, 1 * GiB, 16 * GiB, 0)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       65536000 kB\nMemAvailable:   60000000 kB\n")
    machine = hardware.probe(
        meminfo_path=meminfo, cgroup_root=tmp_path, cpuinfo_path=tmp_path / "x",
        inspect_server=False, drm_path=tmp_path / "drm",
    )  # fmt: skip
    (gpu,) = machine.gpus
    assert gpu.usable and gpu.backend == "ROCm" and gpu.total_bytes == 24 * GiB
    assert not any("planning for CPU only" in n for n in machine.notes)


def _fake_server(tmp_path: Path, listing: str) -> Path:
    """A llama-server stand-in answering --version and --list-devices with recorded text."""
    (tmp_path / "list.txt").write_text(listing)
    exe = tmp_path / "llama-server"
    exe.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--list-devices" ]; then cat "$(dirname "$0")/list.txt"; exit 0; fi\n'
        'echo "version: 0.5.0-dev (build 11312, commit 0c1e57098)"\n'
    )
    exe.chmod(0o755)
    return exe


def test_nvidia_gpus_under_a_vulkan_build_are_named_by_vulkan(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys

    from fake_nvml import FakeGpu, FakeNvml

    from quantpick.machine import probe as hardware

    card = FakeGpu("NVIDIA GeForce RTX 2060", 6 * GiB, 5 * GiB, 192, 7001, cc=(7, 5))
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([card]))
    server = _fake_server(tmp_path, (DATA / "list-devices-vulkan-rtx2060.txt").read_text())
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32768000 kB\nMemAvailable:   30000000 kB\n")
    machine = hardware.probe(
        meminfo_path=meminfo, cgroup_root=tmp_path, cpuinfo_path=tmp_path / "x",
        llama_server=server, drm_path=tmp_path / "nodrm",
    )  # fmt: skip
    (gpu,) = machine.gpus
    assert gpu.backend == "Vulkan" and gpu.total_bytes == 6 * GiB  # NVML's memory stands
    assert any("drives the GPUs with Vulkan" in n for n in machine.notes)


def test_metal_build_is_found_through_its_device_list(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys

    from quantpick.machine import probe as hardware

    monkeypatch.setitem(sys.modules, "pynvml", None)
    server = _fake_server(tmp_path, (DATA / "list-devices-metal-m4-max.txt").read_text())
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       134217728 kB\nMemAvailable:   120000000 kB\n")
    machine = hardware.probe(
        meminfo_path=meminfo, cgroup_root=tmp_path, cpuinfo_path=tmp_path / "x",
        llama_server=server, drm_path=tmp_path / "nodrm",
    )  # fmt: skip
    (gpu,) = machine.gpus
    assert (gpu.backend, gpu.unified, gpu.total_bytes) == ("Metal", True, 96 * GiB)
