"""The vendors' tools (rocm-smi, amd-smi, xpu-smi) parsed from recorded real outputs
(tests/data/backends/README.md), and emulated at the process boundary: a tool that fails, is
slow, floods or prints nonsense is named in a note and the next source is used."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from quantpick.machine.devices import platform_gpus
from quantpick.machine.vendor_smi import (
    AMD_SMI_STATIC_ARGS,
    parse_amd_smi_static_json,
    parse_rocm_smi_json,
    parse_xpu_smi_device,
    parse_xpu_smi_list,
    run_smi,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "backends"
GiB = 1024**3


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def test_rocm_smi_json_of_a_radeon_rx_7900_xt() -> None:
    (card,) = parse_rocm_smi_json(recorded("rocm-smi-rx7900xt.json"))
    assert card.index == 0 and card.name == "Radeon RX 7900 XT"
    assert card.total_bytes == 21458059264 and card.used_bytes == 27856896
    assert card.gtt_total_bytes is None


def test_xpu_smi_discovery_of_two_max_1100() -> None:
    assert parse_xpu_smi_list(recorded("xpu-smi-max1100-list.json")) == (0, 1)
    dev = parse_xpu_smi_device(recorded("xpu-smi-max1100-device0.json"))
    assert dev.name == "Intel(R) Data Center GPU Max 1100"
    assert (dev.total_bytes, dev.free_bytes) == (51522830336, 51493543936)


def runner(outputs: dict[tuple[str, ...], str]):  # noqa: ANN201
    calls: list[tuple[str, ...]] = []

    def run(program: str, args: tuple[str, ...]) -> str:
        calls.append(args)
        if args not in outputs:
            raise ValueError(f"{program}: exit status 1")
        return outputs[args]

    run.calls = calls  # type: ignore[attr-defined]
    return run


def only(*tools: str):  # noqa: ANN201
    return lambda name: f"/usr/bin/{name}" if name in tools else None


def test_rocm_smi_names_the_card_where_installed(tmp_path: Path) -> None:
    from quantpick.machine.vendor_smi import ROCM_SMI_ARGS

    run = runner({ROCM_SMI_ARGS: "WARNING: AMD GPU device(s) is/are in a low-power state\n"
                  + recorded("rocm-smi-rx7900xt.json")})  # fmt: skip
    gpus, notes = platform_gpus("linux", tmp_path / "none", which=only("rocm-smi"), run=run)
    (g,) = gpus
    assert (g.name, g.backend, g.total_bytes, g.unified) == (
        "Radeon RX 7900 XT", "ROCm", 21458059264, False,
    )  # fmt: skip
    assert g.free_bytes == 21458059264 - 27856896
    assert notes == ("AMD GPUs from rocm-smi",)


def test_an_apu_reported_by_rocm_smi_is_unified_on_its_gtt(tmp_path: Path) -> None:
    from quantpick.machine.vendor_smi import ROCM_SMI_ARGS

    doc = json.loads(recorded("rocm-smi-rx7900xt.json"))
    card = doc["card0"]
    card["Card Series"] = "AMD Radeon Graphics"
    card["VRAM Total Memory (B)"] = str(512 * 1024**2)  # Strix Halo's default carve-out
    card["GTT Total Memory (B)"] = str(96 * GiB)
    card["GTT Total Used Memory (B)"] = str(GiB)
    run = runner({ROCM_SMI_ARGS: json.dumps(doc)})
    (g,), _ = platform_gpus("linux", tmp_path, which=only("rocm-smi"), run=run)
    assert (g.unified, g.total_bytes, g.free_bytes) == (True, 96 * GiB, 95 * GiB)


@pytest.mark.parametrize(
    "output",
    [
        "",
        "not json",
        '{"card0": {"Card Series": "x"}}',
        '{"card0": {"VRAM Total Memory (B)": "-1"}}',
        '{"card0": "N/A"}',
        "[1, 2]",
    ],  # fmt: skip
)
def test_a_bad_rocm_smi_is_named_and_sysfs_used(tmp_path: Path, output: str) -> None:
    from quantpick.machine.vendor_smi import ROCM_SMI_ARGS

    dev = tmp_path / "card0" / "device"
    dev.mkdir(parents=True)
    for f, v in (("mem_info_vram_total", 24 * GiB), ("mem_info_vram_used", GiB),
                 ("mem_info_gtt_total", 16 * GiB), ("mem_info_gtt_used", 0)):  # fmt: skip
        (dev / f).write_text(f"{v}\n")
    run = runner({ROCM_SMI_ARGS: output})
    (g,), notes = platform_gpus("linux", tmp_path, which=only("rocm-smi"), run=run)
    assert g.total_bytes == 24 * GiB and g.name == "AMD Radeon GPU"
    assert notes[0].startswith("rocm-smi could not be read (") and "sysfs" in notes[0]


def test_xpu_smi_gives_intel_gpus_without_amd_ones(tmp_path: Path) -> None:
    run = runner({
        ("discovery", "-j"): recorded("xpu-smi-max1100-list.json"),
        ("discovery", "-d", "0", "-j"): recorded("xpu-smi-max1100-device0.json"),
        ("discovery", "-d", "1", "-j"): recorded("xpu-smi-max1100-device0.json").replace(
            '"device_id": 0', '"device_id": 1'),
    })  # fmt: skip
    gpus, notes = platform_gpus("linux", tmp_path, which=only("xpu-smi"), run=run)
    assert [(g.index, g.backend, g.total_bytes, g.free_bytes) for g in gpus] == [
        (0, "SYCL", 51522830336, 51493543936), (1, "SYCL", 51522830336, 51493543936),
    ]  # fmt: skip
    assert notes == ("Intel GPUs from xpu-smi",)


def test_an_xpu_smi_that_fails_on_a_device_is_named(tmp_path: Path) -> None:
    run = runner({("discovery", "-j"): recorded("xpu-smi-max1100-list.json")})
    gpus, notes = platform_gpus("linux", tmp_path, which=only("xpu-smi"), run=run)
    assert gpus == ()
    assert notes == (
        "xpu-smi could not be read (/usr/bin/xpu-smi: exit status 1); Intel GPUs not planned on",
    )


def test_no_tool_no_sysfs_nothing(tmp_path: Path) -> None:
    assert platform_gpus("linux", tmp_path / "absent", which=only()) == ((), ())


def fake_tool(tmp_path: Path, body: str) -> str:
    path = tmp_path / "rocm-smi"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_reader_bounds_time_output_and_exit(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no answer in 0\.5 s"):
        run_smi(fake_tool(tmp_path, "sleep 30"), ("--json",), timeout_s=0.5)
    with pytest.raises(ValueError, match="more than 262144 bytes"):
        run_smi(fake_tool(tmp_path, "yes {"), ("--json",), timeout_s=20)
    with pytest.raises(ValueError, match="exit status 3"):
        run_smi(fake_tool(tmp_path, "exit 3"), ("--json",), timeout_s=20)
    with pytest.raises(ValueError, match="rocm-smi-absent"):
        run_smi(os.fspath(tmp_path / "rocm-smi-absent"), ("--json",), timeout_s=20)
    assert run_smi(fake_tool(tmp_path, "echo '{}'"), ("--json",), timeout_s=20).strip() == "{}"


# --- amd-smi: names the cards sysfs measures ------------------------------------------------------

STRIX_NAME = "Strix Halo [Radeon Graphics / Radeon 8050S Graphics / Radeon 8060S Graphics]"


def test_amd_smi_static_of_a_strix_halo() -> None:
    """The recorded `amd-smi static --json` (a list, ROCm 6.3's shape): the GPU's index, name,
    PCI address and VRAM (the 32 GiB carve-out, printed as 32768 MB); no use figures; the same
    GPU under {"gpu_data": [...]} (later releases) reads the same."""
    (gpu,) = parse_amd_smi_static_json(recorded("amd-smi-static-strix-halo.json"))
    assert (gpu.index, gpu.name, gpu.bdf) == (0, STRIX_NAME, "0000:c4:00.0")
    assert gpu.total_bytes == 32 * GiB and gpu.used_bytes is None and gpu.free_bytes is None
    wrapped = json.dumps({"gpu_data": json.loads(recorded("amd-smi-static-strix-halo.json"))})
    assert parse_amd_smi_static_json(wrapped) == (gpu,)
    listed = json.loads(recorded("amd-smi-list-strix-halo.json"))
    assert listed[0]["bdf"] == gpu.bdf  # `amd-smi list --json` of the same machine


@pytest.mark.parametrize(
    "output",
    [
        "",
        "not json",
        "{}",
        '[{"asic": {}}]',
        '[{"gpu": 0, "vram": {"size": {"value": 1, "unit": "parsecs"}}}]',
        '[{"gpu": 0, "vram": {"size": "N/A"}}]',
        '[{"gpu": 0, "vram": {"size": {"value": -1, "unit": "MB"}}}]',
        '[{"gpu": 0, "vram": "big"}]',
    ],  # fmt: skip
)
def test_a_malformed_amd_smi_static_is_refused(output: str) -> None:
    with pytest.raises(ValueError, match="amd-smi static"):
        parse_amd_smi_static_json(output)


def _strix_sysfs(root: Path) -> None:
    """card0/device linking to the PCI device's directory, as sysfs lays it out: the recorded
    machine's address, a 32 GiB carve-out (amd-smi's figure) and a GTT above it."""
    pci = root / "devices" / "0000:c4:00.0"
    pci.mkdir(parents=True)
    for f, v in (("mem_info_vram_total", 32 * GiB), ("mem_info_vram_used", GiB),
                 ("mem_info_gtt_total", 64 * GiB), ("mem_info_gtt_used", 0)):  # fmt: skip
        (pci / f).write_text(f"{v}\n")
    (root / "drm" / "card0").mkdir(parents=True)
    (root / "drm" / "card0" / "device").symlink_to(pci)


def test_amd_smi_names_the_card_sysfs_measures(tmp_path: Path) -> None:
    """Without rocm-smi, amd-smi's static output names the GPU at the sysfs card's PCI address;
    the memory stays sysfs's (a 32 GiB carve-out is not an APU's small one: the card's VRAM)."""
    _strix_sysfs(tmp_path)
    run = runner({AMD_SMI_STATIC_ARGS: recorded("amd-smi-static-strix-halo.json")})
    (g,), notes = platform_gpus("linux", tmp_path / "drm", which=only("amd-smi"), run=run)
    assert g.name == STRIX_NAME and g.total_bytes == 32 * GiB and g.free_bytes == 31 * GiB
    assert notes == ("AMD GPUs from sysfs, named by amd-smi",)


def test_a_failing_amd_smi_is_named_and_sysfs_still_measures(tmp_path: Path) -> None:
    _strix_sysfs(tmp_path)
    run = runner({AMD_SMI_STATIC_ARGS: "[{]"})
    (g,), notes = platform_gpus("linux", tmp_path / "drm", which=only("amd-smi"), run=run)
    assert g.name == "AMD Radeon GPU" and g.total_bytes == 32 * GiB
    assert notes[0].startswith("amd-smi could not be read (amd-smi static: not JSON")
