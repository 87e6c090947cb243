"""Described machines: the GPU catalog, --gpu specs, hardware files, resolve_machine precedence."""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fake_nvml import FakeNvml, rtx_3090, tesla_t4

from quantpick.errors import HardwareError, UsageError
from quantpick.machine import probe as hardware
from quantpick.machine.catalog import CATALOG, find_gpu, lookup_gpu, theoretical_bandwidth
from quantpick.machine.describe import REFERENCE_GPUS, resolve_machine
from quantpick.machine.device_specs import parse_bandwidth, parse_gpu_spec
from quantpick.machine.hardware_file import load_hardware_file
from quantpick.machine.spec import Host, Machine, machine_from_dict

GiB = 1024**3


@pytest.fixture
def fake_host(monkeypatch: pytest.MonkeyPatch) -> Host:
    """A fixed probed host (so --gpu tests do not depend on this machine's RAM)."""
    host = Host(ram_total_bytes=32 * GiB, ram_available_bytes=30 * GiB, cpu_cores=8, cpu_threads=16)
    monkeypatch.setattr(hardware, "probe_host", lambda **kwargs: host)
    monkeypatch.setattr("shutil.which", lambda name: None)
    return host


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml([rtx_3090(), tesla_t4()])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


# --- catalog ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("3090", "3090"), ("rtx3090", "3090"), ("RTX 3090", "3090"),
        ("NVIDIA GeForce RTX 3090", "3090"), ("3090-24g", "3090"), ("3090 Ti", "3090ti"),
        ("t4", "t4"), ("tesla-t4", "t4"), ("Tesla T4", "t4"),
        ("a100-80g", "a100-80g"), ("A100 80GB", "a100-80g"), ("NVIDIA A100-SXM4-80GB", "a100-80g"),
        ("a100", "a100-40g"), ("NVIDIA A100 80GB PCIe", "a100-80g-pcie"),
        ("4060ti-16g", "4060ti-16g"), ("RTX 4060 Ti 16GB", "4060ti-16g"),
        ("4070 Ti Super", "4070tis"), ("h100", "h100"), ("H100 PCIe", "h100-pcie"),
        ("v100-32g", "v100-32g"), ("V100", "v100-16g"), ("p40", "p40"), ("RTX A6000", "a6000"),
    ],
)  # fmt: skip
def test_catalog_aliases(name: str, key: str) -> None:
    model = find_gpu(name)
    assert model is not None and model.key == key


def test_catalog_is_consistent() -> None:
    assert len({m.key for m in CATALOG}) == len(CATALOG)
    for model in CATALOG:
        assert model.total_bytes % GiB == 0, model.key  # marketing GiB, as NVML reports
        assert find_gpu(model.key) is model and find_gpu(model.name) is not None
    assert lookup_gpu("3090").total_bytes == 25_769_803_776
    assert round(lookup_gpu("3090").bandwidth_bytes_per_s / 1e9) == 936
    assert round(lookup_gpu("t4").bandwidth_bytes_per_s / 1e9) == 320
    assert round(lookup_gpu("4090").bandwidth_bytes_per_s / 1e9) == 1008
    assert round(lookup_gpu("h100").bandwidth_bytes_per_s / 1e9) == 3352


# Issue 12's common cards, each with (VRAM GiB, bandwidth GB/s, FP16 tensor TFLOPS) from the data
# sheets (bandwidth = bus width x data rate / 8; the H200's as its NVML reports it, 4814 GB/s where
# the sheet says 4.8 TB/s).
@pytest.mark.parametrize(
    ("name", "vram_gib", "gbs", "tflops"),
    [
        ("RTX 2080 Ti", 11, 616, 107.6), ("3060 Ti", 8, 448, 64.8), ("3070", 8, 448, 81.3),
        ("3070 Ti", 8, 608, 87.0), ("3080", 10, 760, 119.0), ("3080-12g", 12, 912, 122.6),
        ("RTX 3080 12GB", 12, 912, 122.6), ("3080 Ti", 12, 912, 136.4), ("4060", 8, 272, 60.5),
        ("4060 Ti", 8, 288, 88.3), ("4060 Ti 8GB", 8, 288, 88.3), ("4070", 12, 504, 116.6),
        ("4070 Super", 12, 504, 142.0), ("4070 Ti", 12, 504, 160.3),
        ("4080 Super", 16, 736, 209.0), ("5060 Ti", 16, 448, 94.9), ("5060ti-8g", 8, 448, 94.9),
        ("5070", 12, 672, 123.5), ("5070 Ti", 16, 896, 175.8), ("L40S", 48, 864, 362.0),
        ("A10", 24, 600, 125.0), ("A40", 48, 696, 149.7), ("H200", 140, 4814, 989.4),
        ("RTX 4000 Ada Generation", 20, 360, 106.9), ("Tesla P40", 24, 347, 47.0),
        ("GTX 1060", 6, 192, 17.5), ("RTX 2080", 8, 448, 80.5), ("5090", 32, 1792, 419.0),
        ("NVIDIA GB10", 128, 273, 125.0),
    ],
)  # fmt: skip
def test_catalog_common_cards(name: str, vram_gib: int, gbs: int, tflops: float) -> None:
    model = lookup_gpu(name)
    assert model.total_bytes == vram_gib * GiB
    assert round(model.bandwidth_bytes_per_s / 1e9) == gbs
    assert model.fp16_tflops == tflops
    gpu = parse_gpu_spec(name)
    assert gpu.fp16_tflops == tflops and gpu.bandwidth_bytes_per_s == model.bandwidth_bytes_per_s


def test_nvml_name_shared_by_two_sizes_picks_by_memory() -> None:
    name = "NVIDIA GeForce RTX 3080"
    assert find_gpu(name).key == "3080"  # type: ignore[union-attr]
    assert find_gpu(name, 12 * GiB - 200 * 1024**2).key == "3080-12g"  # type: ignore[union-attr]
    assert find_gpu("NVIDIA GeForce RTX 4060 Ti", 16 * GiB).key == "4060ti-16g"  # type: ignore[union-attr]


def test_every_catalog_card_has_compute() -> None:
    for model in CATALOG:
        assert model.fp16_tflops is not None and 2 < model.fp16_tflops < 2000, model.key


def test_unknown_card_speed_figures_are_assumed_with_a_note(fake_host: Host) -> None:
    machine = resolve_machine(gpus=["myboard:20G", "3090", "other:8G:400GB/s"])
    board, known, other = machine.gpus
    assert board.bandwidth_bytes_per_s is None and board.fp16_tflops is None
    assert known.fp16_tflops == 142.3 and other.bandwidth_bytes_per_s == 400 * 10**9
    notes = [n for n in machine.notes if "catalogue" in n]
    assert len(notes) == 2
    assert "GPU 0 (myboard)" in notes[0] and "300 GB/s" in notes[0] and "25 FP16 TFLOPS" in notes[0]
    assert "GPU 2 (other)" in notes[1] and "GB/s" not in notes[1]  # its bandwidth was given


def test_unknown_gpu_lists_known_names() -> None:
    assert find_gpu("4090-48g") is None  # a memory suffix must agree with the card
    with pytest.raises(UsageError) as info:
        lookup_gpu("nonsense")
    assert "nonsense" in info.value.message
    assert info.value.hint and "3090" in info.value.hint and "t4" in info.value.hint


# --- --gpu specs --------------------------------------------------------------------------------


def test_gpu_spec_from_catalog() -> None:
    gpu = parse_gpu_spec("3090", index=3)
    assert (gpu.index, gpu.name, gpu.total_bytes, gpu.free_bytes) == (
        3, "NVIDIA GeForce RTX 3090", 24 * GiB, 24 * GiB,
    )  # fmt: skip
    assert gpu.bandwidth_bytes_per_s == theoretical_bandwidth(9751, 384)
    assert gpu.compute_capability == "8.6" and gpu.usable


def test_gpu_spec_overrides() -> None:
    gpu = parse_gpu_spec("4090:48G:1.2TB/s")
    assert gpu.total_bytes == gpu.free_bytes == 48 * GiB
    assert gpu.bandwidth_bytes_per_s == 1_200_000_000_000
    assert gpu.memory_clock_mhz is None  # no longer consistent with the given bandwidth
    assert parse_gpu_spec("t4::300G").total_bytes == 15 * GiB


def test_gpu_spec_unknown_card_needs_vram() -> None:
    gpu = parse_gpu_spec("myboard:20G:500GB/s")
    assert (gpu.name, gpu.total_bytes, gpu.bandwidth_bytes_per_s) == (
        "myboard", 20 * GiB, 500 * 10**9,
    )  # fmt: skip
    with pytest.raises(UsageError):
        parse_gpu_spec("myboard")


@pytest.mark.parametrize("spec", ["", ":24G", "3090:lots", "3090:24G:fast", "a:1G:1G:1G", "3090:0"])
def test_bad_gpu_specs(spec: str) -> None:
    with pytest.raises(UsageError):
        parse_gpu_spec(spec)


@pytest.mark.parametrize(
    ("text", "value"),
    [("936GB/s", 936 * 10**9), ("936G", 936 * 10**9), ("936 GB/s", 936 * 10**9),
     ("1.5TB/s", 1_500 * 10**9), ("100GiB/s", 100 * GiB), ("12345B/s", 12345),
     ("936", 936 * 10**9)],
)  # fmt: skip
def test_parse_bandwidth_is_decimal(text: str, value: int) -> None:
    assert parse_bandwidth(text) == value


# --- resolve_machine ----------------------------------------------------------------------------


def test_reference_box(fake_host: Host, tmp_path: Path) -> None:
    machine = resolve_machine(gpus=list(REFERENCE_GPUS), disk_path=tmp_path)
    assert machine.described and machine.source == "described: --gpu 3090 --gpu t4"
    assert [(g.index, g.name) for g in machine.gpus] == [
        (0, "NVIDIA GeForce RTX 3090"), (1, "Tesla T4"),
    ]  # fmt: skip
    # The GPUs are elsewhere: the host is a typical desktop, never this box's (fake_host).
    assert machine.host == Host(
        ram_total_bytes=32 * GiB, ram_available_bytes=32 * GiB, cpu_cores=6, cpu_threads=12,
        assumed=("cores", "threads", "ram", "ram_bandwidth"),
    )  # fmt: skip
    assert machine.host != fake_host
    [note] = [n for n in machine.notes if n.startswith("described machine: assumed")]
    assert "6 CPU cores (--cores), 12 threads (--threads), 32 GiB RAM (--ram)" in note
    assert "Steam's hardware survey" in note and "not this box's" in note
    assert machine.driver_version is None and machine.disk_free_bytes


def test_gpu_order_is_device_order(fake_host: Host) -> None:
    machine = resolve_machine(gpus=["t4", "3090"])
    names = [(g.index, g.name) for g in machine.gpus]
    assert names == [(0, "Tesla T4"), (1, "NVIDIA GeForce RTX 3090")]


def test_ram_and_cpu_only_override(fake_host: Host) -> None:
    machine = resolve_machine(gpus=["3090"], ram="64G", cpu_only=True)
    assert machine.gpus == ()
    assert machine.host.ram_total_bytes == machine.host.ram_available_bytes == 64 * GiB
    assert machine.host.cpu_cores == 6  # a typical desktop's, not this box's 8
    assert machine.host.assumed == ("cores", "threads", "ram_bandwidth")
    assert machine.source == "described: --gpu 3090 --ram 64G --cpu-only"


def test_cores_threads_and_bandwidth_describe_the_host(fake_host: Host) -> None:
    machine = resolve_machine(gpus=["3060"], ram="32G", cores=8, threads=16,
                              ram_bandwidth="80GB/s")  # fmt: skip
    assert (machine.host.cpu_cores, machine.host.cpu_threads) == (8, 16)
    assert machine.host.ram_bandwidth_bytes_per_s == 80 * 10**9 and machine.host.assumed == ()
    assert not any("assumed" in n for n in machine.notes)
    only_cores = resolve_machine(gpus=["3060"], ram="32G", cores=8)
    assert only_cores.host.cpu_threads == 16 and only_cores.host.assumed == (
        "threads", "ram_bandwidth",
    )  # fmt: skip
    # on this box (probed) --cores replaces what the probe read; nothing else is assumed
    here = resolve_machine(cores=4)
    assert here.host.cpu_cores == 4 and "cores" not in here.host.assumed
    with pytest.raises(UsageError, match="fewer than --cores"):
        resolve_machine(gpus=["3060"], cores=8, threads=4)
    with pytest.raises(UsageError, match="at least 1"):
        resolve_machine(gpus=["3060"], cores=0)


def test_plain_probe_is_not_described(nvml: FakeNvml, tmp_path: Path) -> None:
    machine = resolve_machine(disk_path=tmp_path)
    assert not machine.described and machine.source == "probe"
    assert len(machine.gpus) == 2


def test_probe_with_cpu_only_is_still_this_machine(nvml: FakeNvml) -> None:
    """--cpu-only hides this box's GPUs; it does not describe another machine (so llama.cpp can
    still confirm the plan here, with --device none)."""
    machine = resolve_machine(cpu_only=True)
    assert not machine.described and machine.gpus == () and machine.gpus_hidden
    assert machine.source == "probe --cpu-only"
    # Anything else described on top makes it a described machine again.
    other = resolve_machine(ram="16G", cpu_only=True)
    assert other.described and not other.gpus_hidden


def test_bad_ram_is_a_usage_error(fake_host: Host) -> None:
    with pytest.raises(UsageError):
        resolve_machine(ram="lots")


# --- hardware files -----------------------------------------------------------------------------


def test_probe_json_round_trips(nvml: FakeNvml, tmp_path: Path) -> None:
    probed = hardware.probe(disk_path=tmp_path)
    doc = {"schema_version": 1, "machine": probed.to_dict()}
    path = tmp_path / "box.json"
    path.write_text(json.dumps(doc))
    loaded = load_hardware_file(path)
    # The probe's own notes were about the machine it ran on: read back, they say where from.
    assert probed.notes and loaded.notes == tuple(
        f"hardware file box.json records: {n}" for n in probed.notes
    )
    assert dataclasses.replace(loaded, notes=()) == dataclasses.replace(probed, notes=())
    # A bare machine dict is accepted too.
    path.write_text(json.dumps(probed.to_dict()))
    assert load_hardware_file(path) == loaded
    # Written out and read again, a note is not prefixed twice.
    path.write_text(json.dumps(loaded.to_dict()))
    assert load_hardware_file(path).notes == loaded.notes
    # Through resolve_machine it is the same machine, marked described.
    described = resolve_machine(hardware_file=path)
    assert described.gpus == probed.gpus
    # the file's host as probed; its bandwidth was never measured, which `assumed` now says
    assert described.host == replace(probed.host, assumed=("ram_bandwidth",))
    assert described.described and described.source == f"described: --hardware {path}"


def test_hardware_file_with_gpu_and_ram_overrides(nvml: FakeNvml, tmp_path: Path) -> None:
    path = tmp_path / "box.json"
    path.write_text(json.dumps({"machine": hardware.probe(disk_path=tmp_path).to_dict()}))
    machine = resolve_machine(hardware_file=path, gpus=["a100-80g"], ram="128G")
    assert [g.name for g in machine.gpus] == ["NVIDIA A100-SXM4-80GB"]
    assert machine.host.ram_total_bytes == 128 * GiB
    assert machine.source == f"described: --hardware {path} --gpu a100-80g --ram 128G"


def test_toml_hardware_file(tmp_path: Path) -> None:
    path = tmp_path / "box.toml"
    path.write_text(
        """
[[gpu]]
name = "3090"

[[gpu]]
name = "my card"
vram = "20G"
bandwidth = "500GB/s"

[host]
ram = "64G"
cores = 16
ram_bandwidth = "80GB/s"
"""
    )
    machine = load_hardware_file(path)
    assert [(g.index, g.name) for g in machine.gpus] == [
        (0, "NVIDIA GeForce RTX 3090"), (1, "my card"),
    ]  # fmt: skip
    assert machine.gpus[1].total_bytes == 20 * GiB
    assert machine.gpus[1].bandwidth_bytes_per_s == 500 * 10**9
    assert machine.host == Host(
        ram_total_bytes=64 * GiB, ram_available_bytes=64 * GiB, cpu_cores=16, cpu_threads=32,
        ram_bandwidth_bytes_per_s=80 * 10**9, assumed=("threads",),
    )  # fmt: skip


def test_toml_shorthand_and_default_host(tmp_path: Path) -> None:
    path = tmp_path / "box.toml"
    path.write_text('gpus = ["3090", "t4"]\n')
    host = Host(ram_total_bytes=GiB, ram_available_bytes=GiB, cpu_cores=1)
    machine = load_hardware_file(path, default_host=lambda: host)
    assert len(machine.gpus) == 2 and machine.host is host
    with pytest.raises(HardwareError, match="no \\[host\\]"):
        load_hardware_file(path)


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("bad.json", "{not json", "not valid JSON"),
        ("bad.json", "[1, 2]", "expected a JSON object"),
        ("bad.json", '{"machine": {"gpus": []}}', "no 'host'"),
        ("bad.json", '{"schema_version": 9, "machine": {}}', "schema_version 9"),
        ("bad.json", '{"gpus": [{"index": 0}], "host": {}}', "unexpected value"),
        ("bad.json", '{"gpus": [], "host": {"ram_total_bytes": "lots", "ram_available_bytes": 1,'
                     ' "cpu_cores": 1}}', "host.ram_total_bytes"),
        ("bad.toml", "gpus = [", "not valid TOML"),
        ("bad.toml", 'gpus = ["nonsense"]\n[host]\nram="1G"\ncores=1', "unknown GPU 'nonsense'"),
        ("bad.toml", '[[gpu]]\nname="3090"\nvrm="24G"', "unknown key 'vrm'"),
        ("bad.toml", '[host]\nram="1G"', "needs ram"),
    ],
)  # fmt: skip
def test_bad_hardware_files_name_file_and_problem(
    tmp_path: Path, name: str, content: str, problem: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(HardwareError) as info:
        load_hardware_file(path)
    message = info.value.message
    assert str(path) in message and problem in message and "\n" not in message


def test_missing_hardware_file(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="cannot read hardware file"):
        load_hardware_file(tmp_path / "nope.json")


def test_machine_from_dict_round_trip_of_described_machine(fake_host: Host) -> None:
    machine = resolve_machine(gpus=["3090", "t4"])
    assert machine_from_dict(json.loads(json.dumps(machine.to_dict()))) == machine
    assert isinstance(machine, Machine)


# --- RPC workers ---------------------------------------------------------------------------------


def test_rpc_device_spec() -> None:
    from quantpick.machine.device_specs import parse_rpc_device_spec

    host, port, gpu = parse_rpc_device_spec("192.168.1.20:50052=t4")
    assert (host, port, gpu.name, gpu.total_bytes) == ("192.168.1.20", 50052, "Tesla T4", 15 * GiB)
    _, _, custom = parse_rpc_device_spec("box.lan:50100=mi50:32G:1TB/s")
    assert (custom.name, custom.total_bytes, custom.bandwidth_bytes_per_s) == (
        "mi50",
        32 * GiB,
        10**12,
    )
    for bad in ("192.168.1.20:50052", "192.168.1.20=t4", "192.168.1.20:50052=", "h:1=nope"):
        with pytest.raises(UsageError):
            parse_rpc_device_spec(bad)


@pytest.mark.parametrize(
    ("text", "seconds"), [("0.3ms", 0.0003), ("300us", 0.0003), ("2 s", 2.0), ("150µs", 0.00015)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    from quantpick.machine.device_specs import parse_duration

    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0.3", "ms", "-1ms", "3 minutes"])
def test_parse_duration_needs_a_unit(text: str) -> None:
    from quantpick.machine.device_specs import parse_duration

    with pytest.raises(UsageError, match="duration"):
        parse_duration(text)


def test_rpc_workers_probed_and_described_in_rpc_order(fake_host: Host) -> None:
    from fake_rpc import FakeWorker

    with FakeWorker([(10 * GiB, 12 * GiB), (3 * GiB, 4 * GiB)]) as two, FakeWorker() as one:
        m = resolve_machine(
            gpus=["3090"],
            rpc=[one.endpoint, two.endpoint],
            rpc_devices=["10.0.0.7:50052=t4", f"{two.endpoint}=3090", f"{two.endpoint}=t4"],
            inspect_server=False,
        )
    # --rpc first, then endpoints only --rpc-device names: llama-server's --rpc order.
    assert [w.endpoint for w in m.rpc_workers] == [one.endpoint, two.endpoint, "10.0.0.7:50052"]
    probed, merged, described = m.rpc_workers
    assert probed.probed and probed.protocol == "7.0.0" and probed.address == "127.0.0.1"
    assert probed.devices[0].name == f"{one.endpoint}/0"
    assert probed.network.rtt_source.startswith("measured")
    assert not described.probed and described.devices[0].name == "Tesla T4"
    assert described.network.bandwidth_bytes_per_s == 117_000_000
    # probed for memory, described for what the devices are (by position)
    assert merged.probed
    assert [(g.index, g.name, g.total_bytes, g.free_bytes) for g in merged.devices] == [
        (0, "NVIDIA GeForce RTX 3090", 12 * GiB, 10 * GiB),
        (1, "Tesla T4", 4 * GiB, 3 * GiB),
    ]
    assert m.described and "--rpc-device" in m.source
    assert [g.name for g in m.gpus] == ["NVIDIA GeForce RTX 3090"]  # local GPUs untouched


def test_rpc_network_overrides_and_conflicts(fake_host: Host) -> None:
    m = resolve_machine(
        rpc_devices=["10.0.0.7:50052=t4"],
        rpc_bandwidth="1.1GB/s",
        rpc_latency="0.5ms",
        inspect_server=False,
        gpus=["3090"],
    )
    net = m.rpc_workers[0].network
    assert (net.bandwidth_bytes_per_s, net.rtt_s) == (1_100_000_000, 0.0005)
    assert (net.bandwidth_source, net.rtt_source) == ("--rpc-bandwidth", "--rpc-latency")
    with pytest.raises(UsageError, match="cpu-only"):
        resolve_machine(rpc_devices=["10.0.0.7:50052=t4"], cpu_only=True, gpus=["3090"])
    with pytest.raises(UsageError, match="given twice"):
        resolve_machine(rpc=["127.0.0.1:1", "127.0.0.1:1"], gpus=["3090"], inspect_server=False)
    with pytest.raises(UsageError, match="bandwidth"):
        resolve_machine(rpc_bandwidth="fast", gpus=["3090"], inspect_server=False)


def test_described_count_must_match_the_probed_worker(fake_host: Host) -> None:
    from fake_rpc import FakeWorker

    with FakeWorker([(GiB, GiB)]) as w, pytest.raises(UsageError, match="serves 1 device"):
        resolve_machine(
            rpc=[w.endpoint],
            rpc_devices=[f"{w.endpoint}=t4", f"{w.endpoint}=t4"],
            gpus=["3090"],
            inspect_server=False,
        )


def test_the_same_worker_under_two_names_is_refused(fake_host: Host) -> None:
    from fake_rpc import FakeWorker

    with FakeWorker() as w, pytest.raises(UsageError, match="are the same worker"):
        resolve_machine(
            rpc=[w.endpoint, f"localhost:{w.port}"], gpus=["3090"], inspect_server=False
        )


def test_unreachable_worker_is_exit_6(fake_host: Host) -> None:
    import socket

    from quantpick.errors import RpcWorkerError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        with pytest.raises(RpcWorkerError, match="refused") as err:
            resolve_machine(rpc=[f"127.0.0.1:{s.getsockname()[1]}"], gpus=["3090"])
    assert err.value.exit_code == 6


def test_workers_round_trip_through_probe_json(fake_host: Host, tmp_path: Path) -> None:
    from fake_rpc import FakeWorker

    with FakeWorker([(5 * GiB, 8 * GiB)]) as w:
        m = resolve_machine(
            gpus=["3090"], rpc=[w.endpoint], rpc_devices=["10.0.0.7:50052=t4"], inspect_server=False
        )
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"schema_version": 1, "machine": m.to_dict()}))
    back = load_hardware_file(path)
    assert back.rpc_workers == m.rpc_workers
    # read from the file: no worker is contacted (the fake is gone)
    again = resolve_machine(hardware_file=path, inspect_server=False)
    assert again.rpc_workers == m.rpc_workers


def test_toml_rpc_workers(tmp_path: Path) -> None:
    from fake_rpc import FakeWorker

    with FakeWorker([(6 * GiB, 8 * GiB)]) as w:
        path = tmp_path / "cluster.toml"
        path.write_text(
            f"""
gpus = ["3090"]
[host]
ram = "64G"
cores = 16
[[rpc]]
endpoint = "192.168.1.20:50052"
gpus = ["t4"]
bandwidth = "1.1GB/s"
latency = "0.2ms"
[[rpc]]
endpoint = "{w.endpoint}"
[[rpc]]
endpoint = "192.168.1.21:50052"
[[rpc.gpu]]
name = "mystery"
vram = "20G"
"""
        )
        m = load_hardware_file(path)
    described, probed, custom = m.rpc_workers
    assert described.devices[0].name == "Tesla T4"
    assert (described.network.bandwidth_bytes_per_s, described.network.rtt_s) == (1.1e9, 0.0002)
    assert described.network.bandwidth_source == "hardware file"
    assert probed.probed and probed.devices[0].free_bytes == 6 * GiB
    assert (custom.devices[0].name, custom.devices[0].total_bytes) == ("mystery", 20 * GiB)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[rpc]]\nendpoint = "box"\ngpus = ["t4"]\n[host]\nram="8G"\ncores=2', "cannot read RPC"),
        ('[[rpc]]\ngpus = ["t4"]\n[host]\nram="8G"\ncores=2', "needs endpoint"),
        ('[[rpc]]\nendpoint = "h:1"\ncolour = 1\n[host]\nram="8G"\ncores=2', "unknown key"),
        ('[[rpc]]\nendpoint = "h:1"\ngpus=["t4"]\nlatency=3\n[host]\nram="8G"\ncores=2', "0.3ms"),
    ],
)
def test_bad_rpc_tables(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(HardwareError, match=message):
        load_hardware_file(path)


def test_bad_rpc_workers_in_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    worker = {"host": "h", "port": 1, "devices": [{"index": 0, "name": "x", "total_bytes": -1,
                                                   "free_bytes": 0}]}  # fmt: skip
    machine = {"gpus": [], "host": {"ram_total_bytes": 1, "ram_available_bytes": 1,
                                    "cpu_cores": 1}, "rpc_workers": [worker]}  # fmt: skip
    path.write_text(json.dumps(machine))
    with pytest.raises(HardwareError, match=r"rpc_workers\[0\]\.devices\[0\]\.total_bytes is -1"):
        load_hardware_file(path)


# --- unit-less sizes: GiB (and GB/s), everywhere, with a note -----------------------------------


def test_bare_ram_and_vram_are_gib_and_noted() -> None:
    machine = resolve_machine(gpus=["3090:24", "mycard:20:500"], ram="64")
    assert machine.host.ram_total_bytes == 64 * GiB
    assert machine.gpus[0].total_bytes == 24 * GiB
    assert machine.gpus[1].total_bytes == 20 * GiB
    assert machine.gpus[1].bandwidth_bytes_per_s == 500 * 10**9
    notes = "\n".join(machine.notes)
    assert "--ram 64 is read as 64 GiB" in notes
    assert "--gpu 3090:24: VRAM 24 is read as 24 GiB" in notes
    assert "bandwidth 500 is read as 500 GB/s" in notes


def test_sizes_with_units_get_no_note() -> None:
    machine = resolve_machine(gpus=["3090:24G"], ram="64G")
    assert not any("is read as" in n for n in machine.notes)


@pytest.mark.parametrize("ram", ["0", "0G", "0B"])
def test_zero_ram_is_refused(ram: str) -> None:
    with pytest.raises(UsageError, match="more than 0"):
        resolve_machine(gpus=["3090"], ram=ram)


def test_toml_bare_numbers_follow_the_same_rule(tmp_path: Path) -> None:
    path = tmp_path / "box.toml"
    path.write_text(
        '[[gpu]]\nname = "x"\nvram = 24\nbandwidth = 500\n[host]\nram = 64\ncores = 8\n'
    )
    machine = load_hardware_file(path)
    assert machine.gpus[0].total_bytes == 24 * GiB
    assert machine.gpus[0].bandwidth_bytes_per_s == 500 * 10**9
    assert machine.host.ram_total_bytes == 64 * GiB
    assert any("[host].ram = 64 is read as 64 GiB" in n for n in machine.notes)
    path.write_text("[host]\nram = 68719476736\ncores = 8\n")  # bytes, as an old file had them
    with pytest.raises(HardwareError) as info:
        load_hardware_file(path)
    assert info.value.hint is not None and "68719476736B" in info.value.hint


# --- values that cannot be true (issue 21) -------------------------------------------------------


def _probe_file(tmp_path: Path, **changes: object) -> Path:
    """A `probe --json` file of a described RTX 3090 box, with `changes` applied by dotted path
    ("gpus.0.free_bytes")."""
    machine = resolve_machine(gpus=["3090"], ram="64G").to_dict()
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        target: Any = machine
        for key in parents:
            target = target[int(key)] if key.isdigit() else target[key]
        target[last] = value
    path = tmp_path / "box.json"
    path.write_text(json.dumps({"schema_version": 1, "machine": machine}))
    return path


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"gpus.0.total_bytes": GiB, "gpus.0.free_bytes": int(34.65 * GiB)},
         "gpus[0].free_bytes (34.65 GiB) is more than its total_bytes (1.00 GiB)"),
        ({"gpus.0.bandwidth_bytes_per_s": -444 * 10**9}, "gpus[0].bandwidth_bytes_per_s is "),
        ({"gpus.0.bandwidth_bytes_per_s": 0}, "gpus[0].bandwidth_bytes_per_s is 0"),
        ({"gpus.0.bandwidth_bytes_per_s": "936GB/s"}, "gpus[0].bandwidth_bytes_per_s is '936"),
        ({"gpus.0.fp16_tflops": -71.0}, "gpus[0].fp16_tflops is -71.0"),
        ({"gpus.0.total_bytes": 2**63, "gpus.0.free_bytes": 2**63}, "gpus[0].total_bytes is"),
        ({"host.cpu_threads": -5}, "host.cpu_threads is -5"),
        ({"host.cpu_cores": 10**21}, "host.cpu_cores is 1,000,000,000,000,000,000,000"),
        ({"host.ram_available_bytes": 2**40}, "host.ram_available_bytes (1024.00 GiB) is more"),
        ({"host.ram_bandwidth_bytes_per_s": 10**18}, "host.ram_bandwidth_bytes_per_s is"),
        ({"gpus.0.pcie_width": -16}, "gpus[0].pcie_width is -16"),
    ],
)  # fmt: skip
def test_probe_json_values_that_cannot_be_true_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, object], problem: str
) -> None:
    path = _probe_file(tmp_path, **changes)
    with pytest.raises(HardwareError) as info:
        load_hardware_file(path)
    assert problem in info.value.message and "\n" not in info.value.message
    assert info.value.exit_code == 1


def test_nan_in_a_probe_json_file_is_not_json(tmp_path: Path) -> None:
    path = _probe_file(tmp_path)
    path.write_text(path.read_text().replace('"fp16_tflops": 142.3', '"fp16_tflops": NaN'))
    with pytest.raises(HardwareError, match="NaN is not a JSON number"):
        load_hardware_file(path)


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ('ram = "64G"\ncores = 8\nthreads = -5', "[host].threads = -5"),
        ('ram = "64G"\ncores = 1000000000000000000000', "[host].cores = 10000"),
        ('ram = "64G"\ncores = 0', "[host].cores = 0"),
        ('ram = "64G"\nram_available = "80G"\ncores = 8', "[host].ram_available (80.00 GiB)"),
        ('ram = "64G"\ncores = 8\nram_bandwidth = "0GB/s"', "more than 0"),
    ],
)
def test_toml_values_that_cannot_be_true(tmp_path: Path, host: str, problem: str) -> None:
    path = tmp_path / "box.toml"
    path.write_text(f"[host]\n{host}\n")
    with pytest.raises(HardwareError) as info:
        load_hardware_file(path)
    assert problem in info.value.message


def test_toml_free_above_the_card_is_refused_not_clamped(tmp_path: Path) -> None:
    path = tmp_path / "box.toml"
    path.write_text('[[gpu]]\nname = "3090"\nfree = "30G"\n[host]\nram = "64G"\ncores = 8\n')
    with pytest.raises(HardwareError, match=r"free \(30.00 GiB\) is more than the card's 24.00"):
        load_hardware_file(path)


@pytest.mark.parametrize("spec", ["3090:24G:0GB/s", "3090:24G:0", "mycard:8G:200TB/s"])
def test_gpu_bandwidth_zero_or_absurd_is_refused(spec: str) -> None:
    """`0GB/s` used to mean "the catalogue's figure" without a word."""
    with pytest.raises(UsageError, match="bandwidth"):
        parse_gpu_spec(spec)


def test_absurd_flag_values_are_usage_errors_naming_the_field(fake_host: Host) -> None:
    with pytest.raises(UsageError, match=r"host.ram_total_bytes is"):
        resolve_machine(gpus=["3090"], ram="2048T")
    with pytest.raises(UsageError, match=r"gpus\[0\].total_bytes is"):
        resolve_machine(gpus=["mycard:2048T"])


# --- the device count is capped before anything is built (issue 21) ------------------------------


def test_more_devices_than_llama_server_drives_is_one_error_at_once(tmp_path: Path) -> None:
    """100 GPUs took 27 s to plan and 1000 never ended; llama.cpp drives 15 (+ the CPU)."""
    import time

    toml = tmp_path / "many.toml"
    toml.write_text("gpus = [" + ",".join(['"3090"'] * 1000) + ']\n[host]\nram="64G"\ncores=8\n')
    started = time.perf_counter()
    with pytest.raises(HardwareError, match="1000 GPUs and RPC devices: .* at most 15"):
        load_hardware_file(toml)
    probe_json = _probe_file(tmp_path)
    data = json.loads(probe_json.read_text())
    data["machine"]["gpus"] = data["machine"]["gpus"] * 1000
    probe_json.write_text(json.dumps(data))
    with pytest.raises(HardwareError, match="1000 GPUs"):
        load_hardware_file(probe_json)
    assert time.perf_counter() - started < 10  # generous: both fail before building anything
    with pytest.raises(UsageError, match="16 GPUs and RPC devices"):
        resolve_machine(gpus=["3090"] * 12, rpc_devices=["10.0.0.1:50052=t4"] * 4)
    # 15 is fine.
    assert len(resolve_machine(gpus=["t4"] * 15, ram="64G").gpus) == 15


def test_a_file_of_more_rpc_workers_than_devices_is_refused_before_any_is_contacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker was contacted")

    monkeypatch.setattr(hardware, "probe_rpc_worker", never)
    path = tmp_path / "rpc.toml"
    workers = "".join(f'[[rpc]]\nendpoint = "10.0.0.{i}:50052"\n' for i in range(1, 20))
    path.write_text('[host]\nram = "64G"\ncores = 8\n' + workers)
    with pytest.raises(HardwareError, match="19 GPUs and RPC devices"):
        load_hardware_file(path)


def test_deeply_nested_hardware_files_are_one_line(tmp_path: Path) -> None:
    for name, text in (
        ("deep.json", "[" * 5000 + "]" * 5000),
        ("deep.toml", "a = " + "[" * 5000 + "]" * 5000),
    ):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(HardwareError, match="nested deeper than 64"):
            load_hardware_file(path)


def test_a_hardware_file_is_read_bounded(tmp_path: Path) -> None:
    path = tmp_path / "huge.toml"
    path.write_text("# " + "x" * (2 * 1024**2))
    with pytest.raises(HardwareError, match="larger than 1048576 bytes"):
        load_hardware_file(path)


# --- GB on a memory size is GiB, and said every time (issue 21) ----------------------------------


def test_gb_on_vram_and_ram_is_gib_with_a_note() -> None:
    """`--gpu 3090:24GB --ram 64GB` planned 22.35 GiB and 59.6 GiB without a word."""
    machine = resolve_machine(gpus=["3090:24GB"], ram="64GB")
    assert machine.gpus[0].total_bytes == 24 * GiB == lookup_gpu("3090").total_bytes
    assert machine.host.ram_total_bytes == 64 * GiB
    notes = "\n".join(machine.notes)
    assert "--ram 64GB is read as 64 GiB (memory sizes are binary" in notes
    assert "--gpu 3090:24GB: VRAM 24GB is read as 24 GiB" in notes


def test_gb_in_a_toml_file_is_gib_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "box.toml"
    path.write_text('[[gpu]]\nname = "x"\nvram = "24GB"\n[host]\nram = "64GB"\ncores = 8\n')
    machine = load_hardware_file(path)
    assert machine.gpus[0].total_bytes == 24 * GiB and machine.host.ram_total_bytes == 64 * GiB
    assert any("[host].ram = 64GB is read as 64 GiB" in n for n in machine.notes)


def test_rpc_device_sizes_say_how_they_are_read(fake_host: Host) -> None:
    machine = resolve_machine(gpus=["3090"], rpc_devices=["10.0.0.2:50052=mycard:16GB:300"])
    assert machine.rpc_workers[0].devices[0].total_bytes == 16 * GiB
    notes = "\n".join(machine.notes)
    assert "--rpc-device 10.0.0.2:50052=mycard:16GB:300: VRAM 16GB is read as 16 GiB" in notes
    assert "bandwidth 300 is read as 300 GB/s" in notes


# --- a pipe as --hardware, and values a hardware file must not carry (issue 26) ----------------

BOX_TOML = '[[gpu]]\nname = "3090"\n[host]\nram = "64G"\ncores = 16\n'


def test_a_process_substitution_pipe_is_read(tmp_path: Path) -> None:
    """`--hardware <(cat box.toml)`: before, refused as "a FIFO, not a regular file"."""
    import os
    import threading

    read_end, write_end = os.pipe()
    try:

        def writer() -> None:
            os.write(write_end, BOX_TOML.encode())
            os.close(write_end)

        thread = threading.Thread(target=writer)
        thread.start()
        machine = load_hardware_file(Path(f"/dev/fd/{read_end}"))
        thread.join()
    finally:
        os.close(read_end)
    assert machine.gpus[0].name == "NVIDIA GeForce RTX 3090" and machine.host.cpu_cores == 16


def test_a_named_fifo_is_read_bounded_in_size_and_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import threading

    import quantpick.local_files as local_files

    fifo = tmp_path / "box.toml"
    os.mkfifo(fifo)

    def write(data: bytes) -> threading.Thread:
        def run() -> None:
            with open(fifo, "wb") as f:  # blocks until the reader opened it
                try:
                    f.write(data)
                except BrokenPipeError:
                    pass

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    writer = write(BOX_TOML.encode())  # the writer opens after the reader: waited for
    assert load_hardware_file(fifo).host.cpu_cores == 16
    writer.join(5)
    flood = write(b"# " + b"x" * (4 * 1024**2))  # endless-looking: stopped at the size cap
    with pytest.raises(HardwareError, match="larger than 1048576 bytes"):
        load_hardware_file(fifo)
    # gone (its write broke on the closed pipe) before the next reader opens the FIFO: on a busy
    # machine it could still be writing and hand that reader its remaining bytes
    flood.join(30)
    assert not flood.is_alive()
    monkeypatch.setattr(local_files, "PIPE_TIMEOUT_S", 0.3)
    with pytest.raises(HardwareError, match="no end of input within 0.3 s"):
        load_hardware_file(fifo)  # nobody writes: a deadline, not a hang


@pytest.mark.parametrize("value", ["eight", "", "8", "8.6.1", "sm_86", "8.6; rm -rf /"])
def test_a_compute_capability_that_is_not_one_is_refused(tmp_path: Path, value: str) -> None:
    """Before: accepted and taken as an unknown (current) card."""
    doc = {"gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 3090", "total_bytes": 24 * GiB,
                     "free_bytes": 24 * GiB, "compute_capability": value}],
           "host": {"ram_total_bytes": 64 * GiB, "ram_available_bytes": 64 * GiB,
                    "cpu_cores": 16}}  # fmt: skip
    path = tmp_path / "box.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(HardwareError, match="compute_capability is") as info:
        load_hardware_file(path)
    assert "\n" not in info.value.message and "MAJOR.MINOR" in info.value.message
    doc["gpus"][0]["compute_capability"] = "8.6"  # type: ignore[index]
    path.write_text(json.dumps(doc))
    assert load_hardware_file(path).gpus[0].compute_capability == "8.6"
