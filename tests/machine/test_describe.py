"""Described machines: the GPU catalog, --gpu specs, hardware files, resolve_machine precedence."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fake_nvml import FakeNvml, rtx_3090, tesla_t4

from quantpick.errors import HardwareError, UsageError
from quantpick.machine import probe as hardware
from quantpick.machine.catalog import CATALOG, find_gpu, lookup_gpu, theoretical_bandwidth
from quantpick.machine.describe import (
    REFERENCE_GPUS,
    load_hardware_file,
    machine_from_options,
    parse_bandwidth,
    parse_gpu_spec,
    resolve_machine,
)
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
    assert machine.host == fake_host
    assert machine.driver_version is None and machine.disk_free_bytes


def test_gpu_order_is_device_order(fake_host: Host) -> None:
    machine = resolve_machine(gpus=["t4", "3090"])
    names = [(g.index, g.name) for g in machine.gpus]
    assert names == [(0, "Tesla T4"), (1, "NVIDIA GeForce RTX 3090")]


def test_ram_and_cpu_only_override(fake_host: Host) -> None:
    machine = resolve_machine(gpus=["3090"], ram="64G", cpu_only=True)
    assert machine.gpus == ()
    assert machine.host.ram_total_bytes == machine.host.ram_available_bytes == 64 * GiB
    assert machine.host.cpu_cores == 8  # the rest of the probed host stays
    assert machine.source == "described: --gpu 3090 --ram 64G --cpu-only"


def test_plain_probe_is_not_described(nvml: FakeNvml, tmp_path: Path) -> None:
    machine = resolve_machine(disk_path=tmp_path)
    assert not machine.described and machine.source == "probe"
    assert len(machine.gpus) == 2


def test_probe_with_cpu_only_is_described(nvml: FakeNvml) -> None:
    machine = machine_from_options(None, None, None, True, None)
    assert machine.described and machine.gpus == ()
    assert machine.source == "described: probe --cpu-only"


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
    assert loaded == probed
    # A bare machine dict is accepted too.
    path.write_text(json.dumps(probed.to_dict()))
    assert load_hardware_file(path) == probed
    # Through resolve_machine it is the same machine, marked described.
    described = resolve_machine(hardware_file=path)
    assert described.gpus == probed.gpus and described.host == probed.host
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
        ram_total_bytes=64 * GiB, ram_available_bytes=64 * GiB, cpu_cores=16,
        ram_bandwidth_bytes_per_s=80 * 10**9,
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
