"""hardware.probe with a fake NVML and tmp /proc and cgroup files; llama-server version parsing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from fake_nvml import (
    FakeNvml,
    NVMLError_DriverNotLoaded,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    NVMLError_NotSupported,
    nvidia_h200,
    rtx_3090,
    tesla_t4,
)

from quantpick.machine import probe as hardware
from quantpick.machine.catalog import theoretical_bandwidth
from quantpick.machine.llamacpp import (
    inspect_llama_server,
    parse_version_output,
)
from quantpick.machine.spec import LlamaServer

GiB = 1024**3
KiB = 1024

MEMINFO = """MemTotal:       65536000 kB
MemFree:         1000000 kB
MemAvailable:   60000000 kB
Buffers:          200000 kB
"""


@pytest.fixture
def host_files(tmp_path: Path) -> dict[str, Path]:
    """A meminfo with 62.5 GiB total and no cgroup limit (empty cgroup root)."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    return {"meminfo_path": meminfo, "cgroup_root": cgroup, "cpuinfo_path": tmp_path / "none"}


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml) -> FakeNvml:
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


# --- GPUs ---------------------------------------------------------------------------------------


def test_bandwidth_formula_gives_data_sheet_figures() -> None:
    assert theoretical_bandwidth(9751, 384) == 936_096_000_000  # RTX 3090: 936 GB/s
    assert theoretical_bandwidth(5001, 256) == 320_064_000_000  # T4: 320 GB/s


def test_3090_and_t4_bandwidth_comes_from_bus_and_clock(
    monkeypatch: pytest.MonkeyPatch, host_files: dict[str, Path], tmp_path: Path
) -> None:
    fake = install(monkeypatch, FakeNvml([rtx_3090(), tesla_t4()]))
    machine = hardware.probe(disk_path=tmp_path, **host_files)

    assert [g.name for g in machine.gpus] == ["NVIDIA GeForce RTX 3090", "Tesla T4"]
    g3090, t4 = machine.gpus
    assert round(g3090.bandwidth_bytes_per_s / 1e9) == 936
    assert round(t4.bandwidth_bytes_per_s / 1e9) == 320
    # Change the inputs: the answer follows the formula, not a table.
    fake.gpus[0].mem_clock = 10501
    again = hardware.probe(disk_path=tmp_path, **host_files)
    assert again.gpus[0].bandwidth_bytes_per_s == 2 * 10501 * 10**6 * 384 // 8

    assert (g3090.index, g3090.uuid, g3090.total_bytes) == (0, "GPU-3090", 24 * GiB)
    assert (g3090.free_bytes, g3090.used_bytes) == (23 * GiB, 1 * GiB)
    assert (g3090.memory_bus_width_bits, g3090.memory_clock_mhz) == (384, 9751)
    assert (g3090.pcie_generation, g3090.pcie_width, g3090.compute_capability) == (4, 16, "8.6")
    assert (t4.index, t4.compute_capability, t4.pcie_generation) == (1, "7.5", 3)
    assert machine.driver_version == "550.54.14"
    assert not machine.described and machine.source == "probe"
    assert fake.shutdown_calls == fake.init_calls == 2


def test_no_gpu(monkeypatch: pytest.MonkeyPatch, host_files: dict[str, Path]) -> None:
    fake = install(monkeypatch, FakeNvml([]))
    machine = hardware.probe(**host_files)
    assert machine.gpus == ()
    assert any("found no NVIDIA GPU" in n for n in machine.notes)
    assert fake.shutdown_calls == 1


@pytest.mark.parametrize("error", [NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded])
def test_no_library_or_driver_is_cpu_only_with_a_note(
    monkeypatch: pytest.MonkeyPatch, host_files: dict[str, Path], error: type
) -> None:
    install(monkeypatch, FakeNvml([rtx_3090()], init_error=error))
    machine = hardware.probe(**host_files)
    assert machine.gpus == ()
    assert machine.driver_version is None
    gpu_notes = [n for n in machine.notes if "NVML" in n]
    assert len(gpu_notes) == 1
    assert gpu_notes[0].startswith("no NVIDIA driver/NVML: planning for CPU only")
    assert "\n" not in gpu_notes[0]
    assert machine.host.ram_total_bytes == 65536000 * KiB  # the rest is still probed


def test_pynvml_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    gpus, driver, notes = hardware.probe_gpus()
    assert (gpus, driver) == ((), None)
    assert notes[0].startswith("no NVIDIA driver/NVML")


def test_failing_memory_query_marks_that_gpu_only(
    monkeypatch: pytest.MonkeyPatch, host_files: dict[str, Path]
) -> None:
    bad = rtx_3090(fail={"nvmlDeviceGetMemoryInfo": NVMLError_GpuIsLost})
    fake = install(monkeypatch, FakeNvml([bad, tesla_t4()]))
    machine = hardware.probe(**host_files)

    assert len(machine.gpus) == 2
    broken, fine = machine.gpus
    assert broken.error is not None and "GPU is lost" in broken.error
    assert broken.name == "NVIDIA GeForce RTX 3090" and not broken.usable
    assert fine.error is None and fine.usable and fine.total_bytes == 15360 * 1024**2
    assert machine.usable_gpus == (fine,)
    assert any("GPU 0" in n and "GPU is lost" in n for n in machine.notes)
    assert fake.shutdown_calls == 1


def test_failing_handle_is_listed_with_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    lost = tesla_t4(fail={"nvmlDeviceGetHandleByIndex": NVMLError_GpuIsLost})
    install(monkeypatch, FakeNvml([lost]))
    (gpu,), _, _ = hardware.probe_gpus()
    assert gpu.index == 0 and gpu.error and "no handle" in gpu.error and gpu.total_bytes == 0


def test_unsupported_fields_are_none(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = rtx_3090(
        bus_width=None,
        cc=None,
        fail={"nvmlDeviceGetUUID": NVMLError_NotSupported,
              "nvmlDeviceGetMaxPcieLinkWidth": NVMLError_NotSupported},
    )  # fmt: skip
    install(monkeypatch, FakeNvml([gpu]))
    (g,), _, notes = hardware.probe_gpus()
    assert g.error is None and g.usable
    assert g.memory_bus_width_bits is None
    assert g.memory_clock_mhz == 9751
    assert g.uuid is None and g.pcie_width is None and g.compute_capability is None
    assert g.pcie_generation == 4
    # NVML could not tell the bus width: a catalogue card takes the data sheet's bandwidth
    assert g.bandwidth_bytes_per_s == 936_096_000_000 and g.fp16_tflops == 142.3
    assert notes == ()


def test_card_not_in_catalogue_gets_a_note_naming_assumed_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu = rtx_3090(name="NVIDIA Mystery Accelerator", bus_width=None)
    install(monkeypatch, FakeNvml([gpu]))
    (g,), _, notes = hardware.probe_gpus()
    assert g.bandwidth_bytes_per_s is None and g.fp16_tflops is None
    (note,) = notes
    assert "Mystery Accelerator" in note and "300 GB/s" in note and "25 FP16 TFLOPS" in note


def test_probed_card_gets_compute_from_the_catalogue(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeNvml([rtx_3090(), tesla_t4()]))
    gpus, _, notes = hardware.probe_gpus()
    assert [g.fp16_tflops for g in gpus] == [142.3, 65.0]
    assert notes == ()


def test_count_failure_is_cpu_only_and_shuts_down(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakeNvml([rtx_3090()], count_error=NVMLError_DriverNotLoaded))
    gpus, _, notes = hardware.probe_gpus()
    assert gpus == () and "planning for CPU only" in notes[0]
    assert fake.shutdown_calls == 1


# --- Host ---------------------------------------------------------------------------------------


@pytest.mark.real_host  # asks this machine's OS for its CPU count
def test_meminfo_without_cgroup(host_files: dict[str, Path]) -> None:
    host = hardware.probe_host(**host_files)
    assert host.ram_total_bytes == 65536000 * KiB
    assert host.ram_available_bytes == 60000000 * KiB
    assert host.cgroup_limit_bytes is None
    assert host.cpu_threads == os.cpu_count()


def test_cgroup_v2_limit_and_usage(host_files: dict[str, Path]) -> None:
    cg = host_files["cgroup_root"]
    (cg / "memory.max").write_text(f"{16 * GiB}\n")
    (cg / "memory.current").write_text(f"{6 * GiB}\n")
    (cg / "memory.stat").write_text(f"anon 1\ninactive_file {2 * GiB}\nactive_file 5\n")
    host = hardware.probe_host(**host_files)
    assert host.cgroup_limit_bytes == 16 * GiB
    assert host.ram_total_bytes == 16 * GiB
    # limit - (usage - reclaimable inactive file cache) = 16 - (6 - 2)
    assert host.ram_available_bytes == 12 * GiB


def test_cgroup_v2_max_is_no_limit(host_files: dict[str, Path]) -> None:
    (host_files["cgroup_root"] / "memory.max").write_text("max\n")
    host = hardware.probe_host(**host_files)
    assert host.cgroup_limit_bytes is None
    assert host.ram_total_bytes == 65536000 * KiB


def test_cgroup_v1_limit(host_files: dict[str, Path]) -> None:
    v1 = host_files["cgroup_root"] / "memory"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text(f"{8 * GiB}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{1 * GiB}\n")
    host = hardware.probe_host(**host_files)
    assert (host.ram_total_bytes, host.ram_available_bytes) == (8 * GiB, 7 * GiB)


def test_cgroup_v1_unlimited_is_ignored(host_files: dict[str, Path]) -> None:
    v1 = host_files["cgroup_root"] / "memory"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{1 * GiB}\n")
    host = hardware.probe_host(**host_files)
    assert host.cgroup_limit_bytes is None
    assert host.ram_available_bytes == 60000000 * KiB


def test_cgroup_limit_above_available_keeps_available(host_files: dict[str, Path]) -> None:
    (host_files["cgroup_root"] / "memory.max").write_text(f"{100 * GiB}\n")
    host = hardware.probe_host(**host_files)
    assert host.ram_total_bytes == 65536000 * KiB
    assert host.ram_available_bytes == 60000000 * KiB


def test_physical_cores_from_cpuinfo(tmp_path: Path) -> None:
    # 2 sockets x 2 cores x 2 hyperthreads = 8 processors, 4 physical cores.
    blocks = []
    for cpu, (phys, core) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)] * 2):
        blocks.append(f"processor\t: {cpu}\nphysical id\t: {phys}\ncore id\t\t: {core}\n")
    path = tmp_path / "cpuinfo"
    path.write_text("\n".join(blocks))
    assert hardware.physical_cores(path) == 4
    (tmp_path / "arm").write_text("processor\t: 0\nBogoMIPS\t: 50\n\nprocessor\t: 1\n")
    assert hardware.physical_cores(tmp_path / "arm") is None


def test_the_suite_probes_the_recorded_host_not_this_one(tmp_path: Path) -> None:
    """tests/conftest.py points the probe at tests/data/host/: a test that plans on the probed
    machine sees the recorded 2-core, 24 GiB box, whatever this machine holds or runs now."""
    host = hardware.probe(disk_path=tmp_path, inspect_server=False).host
    assert host.ram_total_bytes == 24683792 * KiB
    assert host.ram_available_bytes == 23634784 * KiB
    assert (host.cpu_cores, host.cpu_threads, host.cgroup_limit_bytes) == (2, 2, None)


@pytest.mark.real_host
def test_a_real_host_test_reads_this_machine(tmp_path: Path) -> None:
    host = hardware.probe(disk_path=tmp_path, inspect_server=False).host
    assert host.cpu_threads == os.cpu_count()
    assert host.ram_total_bytes > 0


def test_missing_meminfo_falls_back_with_a_note(tmp_path: Path) -> None:
    notes: list[str] = []
    host = hardware.probe_host(
        meminfo_path=tmp_path / "nope",
        cgroup_root=tmp_path,
        cpuinfo_path=tmp_path / "x",
        notes=notes,
    )
    assert host.ram_total_bytes > 0  # sysconf on Linux
    assert notes and "sysconf" in notes[0]


def test_disk_free_walks_up_to_an_existing_parent(tmp_path: Path) -> None:
    where, free = hardware.disk_free(tmp_path / "not" / "yet" / "there")
    assert where == tmp_path and free > 0


# --- llama-server -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 13.3.0 for x86_64\n",
         ("0.5.0-dev", 1, "0c1e570")),
        ("version: 7988 (7f5f5119b)\nbuilt with cc for Linux x86_64\n", (None, 7988, "7f5f5119b")),
        ("found 1 CUDA devices\nversion: 4520 (ABCDEF12)\n", (None, 4520, "abcdef12")),
        ("llama-cpp/b10864-1a2b3c4d", (None, 10864, "1a2b3c4d")),
        ("error: unknown argument --version", (None, None, None)),
        ("", (None, None, None)),
    ],
)  # fmt: skip
def test_parse_version_output(text: str, expected: tuple[object, ...]) -> None:
    assert parse_version_output(text) == expected


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "llama-server"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.mark.skipif(sys.platform == "win32", reason="shell scripts")
def test_inspect_reads_stderr(tmp_path: Path) -> None:
    path = _script(tmp_path, 'echo "version: 0.5.0-dev (build 1, commit 0c1e570)" >&2')
    assert inspect_llama_server(path) == LlamaServer(
        path=str(path), version="0.5.0-dev", build=1, commit="0c1e570"
    )


@pytest.mark.skipif(sys.platform == "win32", reason="shell scripts")
def test_inspect_failures_are_reported_not_raised(tmp_path: Path) -> None:
    bad = _script(tmp_path, "echo 'boom' >&2; exit 3")
    assert "exit 3" in (inspect_llama_server(bad).error or "")
    slow = _script(tmp_path, "exec sleep 5")
    assert "did not finish" in (inspect_llama_server(slow, timeout_s=0.2).error or "")
    assert inspect_llama_server(tmp_path / "missing").error == "not found"
    not_exec = tmp_path / "plain"
    not_exec.write_text("x")
    assert inspect_llama_server(not_exec).error == "not executable"


@pytest.mark.skipif(sys.platform == "win32", reason="shell scripts")
def test_inspect_is_bounded_and_shows_no_escapes(tmp_path: Path) -> None:
    # Before: read whole (a flood ran into MemoryError); a tool's escapes reached the terminal.
    flood = _script(tmp_path, "exec yes")
    assert "more than 64 KiB" in (inspect_llama_server(flood, timeout_s=30).error or "")
    ansi = _script(tmp_path, "printf '\\033]0;owned\\007\\033[31mboom\\033[0m\\n' >&2; exit 2")
    assert inspect_llama_server(ansi).error == "cannot read --version (exit 2): 'boom'"


def test_probe_reports_missing_llama_server(
    monkeypatch: pytest.MonkeyPatch, host_files: dict[str, Path], tmp_path: Path
) -> None:
    install(monkeypatch, FakeNvml([]))
    machine = hardware.probe(llama_server=tmp_path / "nope", **host_files)
    assert machine.llama_server == LlamaServer(path=str(tmp_path / "nope"), error="not found")
    monkeypatch.setattr("shutil.which", lambda name: None)
    machine = hardware.probe(**host_files)
    assert machine.llama_server is None
    assert any("llama-server not found" in n for n in machine.notes)


@pytest.mark.gpu
def test_real_nvml_smoke(tmp_path: Path) -> None:
    """On a machine with an NVIDIA GPU: the real probe sees it with sane numbers."""
    machine = hardware.probe(disk_path=tmp_path)
    if not machine.gpus:
        pytest.skip("NVML cannot initialise or sees no GPU here")
    gpu = machine.gpus[0]
    assert gpu.error is None and gpu.total_bytes > 0 and gpu.free_bytes <= gpu.total_bytes
    if gpu.bandwidth_bytes_per_s is not None:
        assert 50e9 < gpu.bandwidth_bytes_per_s < 10e12


def test_a_recorded_real_h200_probes_as_the_catalog_describes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What NVML said on a real H200: the probe reads its data-sheet figures, and `--gpu h200`
    describes the same card (the catalog stores figures the way NVML reports them)."""
    from quantpick.machine.catalog import find_gpu, lookup_gpu

    install(monkeypatch, FakeNvml([nvidia_h200()]))
    (gpu,), _, _ = hardware.probe_gpus()
    assert gpu.usable and gpu.name == "NVIDIA H200"
    assert gpu.bandwidth_bytes_per_s == 4_814_304_000_000  # 6016 bit x 3201 MHz x 2 / 8
    assert (gpu.pcie_generation, gpu.pcie_width, gpu.compute_capability) == (5, 16, "9.0")
    model = find_gpu(gpu.name, total_bytes=gpu.total_bytes)
    assert model is not None and model.key == "h200"
    assert model.bandwidth_bytes_per_s == gpu.bandwidth_bytes_per_s
    assert lookup_gpu("h200").total_bytes <= gpu.total_bytes  # 140 GiB of the 140.4 it reports


def test_worker_from_report_names_devices_by_endpoint() -> None:
    from quantpick.machine.probe import worker_from_report
    from quantpick.machine.rpc import DeviceMemory, WorkerReport

    report = WorkerReport(
        host="box.lan",
        port=50052,
        version=(7, 0, 0),
        devices=(DeviceMemory(3, 10), DeviceMemory(7, 8)),
        address="192.168.1.20",
        head_address="192.168.1.10",
        rtt_s=0.00025,
    )
    worker = worker_from_report(report)
    assert worker.endpoint == "box.lan:50052" and worker.probed and worker.protocol == "7.0.0"
    assert [(g.index, g.name, g.free_bytes, g.used_bytes) for g in worker.devices] == [
        (0, "box.lan:50052/0", 3, 7),
        (1, "box.lan:50052/1", 7, 1),
    ]
    assert worker.network.rtt_s == 0.00025 and "3 request/response" in worker.network.rtt_source
    assert (worker.address, worker.head_address) == ("192.168.1.20", "192.168.1.10")


def test_nvml_memory_that_cannot_be_true_is_not_planned_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """free above total (or a size no board has) lists the GPU with why, and leaves it out."""
    install(monkeypatch, FakeNvml([rtx_3090(free=40 * GiB), tesla_t4(pcie_gen=99)]))
    (bad, t4), _, notes = hardware.probe_gpus()
    assert not bad.usable and bad.error is not None and "cannot be" in bad.error
    assert any("GPU 0" in n and "cannot be" in n for n in notes)
    # An optional figure past any board's (PCIe gen 99) is as unknown as NotSupported.
    assert t4.usable and t4.pcie_generation is None
