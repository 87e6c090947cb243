"""`quantpick probe` through typer's CliRunner (stdout and stderr are captured separately)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fake_nvml import FakeNvml, NVMLError_LibraryNotFound, rtx_3090, tesla_t4
from typer.testing import CliRunner

from quantpick.cli import app
from quantpick.machine.spec import machine_from_dict

runner = CliRunner()
GiB = 1024**3


@pytest.fixture(autouse=True)
def _no_llama_server(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whatever is on this machine's PATH must not change the output.
    monkeypatch.setattr("shutil.which", lambda name: None)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml([rtx_3090(), tesla_t4()])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_probe_json_with_fake_nvml(nvml: FakeNvml, tmp_path: Path) -> None:
    result = runner.invoke(app, ["probe", "--json", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1
    machine = doc["machine"]
    assert machine["described"] is False and machine["source"] == "probe"
    assert [g["name"] for g in machine["gpus"]] == ["NVIDIA GeForce RTX 3090", "Tesla T4"]
    assert [round(g["bandwidth_bytes_per_s"] / 1e9) for g in machine["gpus"]] == [936, 320]
    assert machine["driver_version"] == "550.54.14"
    assert machine["disk_path"] == str(tmp_path) and machine["disk_free_bytes"] > 0
    assert machine["llama_server"] is None
    assert "llama-server not found" in result.stderr  # notes go to stderr, never stdout
    assert nvml.shutdown_calls == 1


def test_probe_without_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error=NVMLError_LibraryNotFound))
    result = runner.invoke(app, ["probe", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["machine"]["gpus"] == []
    assert "no NVIDIA driver/NVML: planning for CPU only" in result.stderr
    assert "Traceback" not in result.output


def test_probe_described_reference_box(nvml: FakeNvml) -> None:
    result = runner.invoke(app, ["probe", "--gpu", "3090", "--gpu", "t4", "--json"])
    assert result.exit_code == 0, result.stderr
    assert nvml.init_calls == 0  # --gpu describes the GPUs: NVML is not even initialised
    machine = json.loads(result.stdout)["machine"]
    assert machine["described"] is True
    assert machine["source"] == "described: --gpu 3090 --gpu t4"
    assert [(g["index"], g["total_bytes"]) for g in machine["gpus"]] == [
        (0, 24 * GiB),
        (1, 15 * GiB),  # 15360 MiB: a T4 with ECC on, as NVML reports it
    ]


def test_probe_human_table(nvml: FakeNvml) -> None:
    result = runner.invoke(app, ["probe"])
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "This machine (probe)" in out
    assert "RTX 3090" in out and "Tesla T4" in out
    assert "936" in out and "320" in out and "384x9751" in out
    assert "RAM:" in out and "CPU:" in out and "llama-server: not found" in out
    assert "Note:" not in out


def test_probe_json_feeds_hardware(nvml: FakeNvml, tmp_path: Path) -> None:
    first = runner.invoke(app, ["probe", "--json", "--dir", str(tmp_path)])
    box = tmp_path / "box.json"
    box.write_text(first.stdout)
    second = runner.invoke(app, ["probe", "--json", "--hardware", str(box)])
    assert second.exit_code == 0, second.stderr
    a = machine_from_dict(json.loads(first.stdout)["machine"])
    b = machine_from_dict(json.loads(second.stdout)["machine"])
    assert (b.gpus, b.host, b.driver_version, b.disk_free_bytes) == (
        a.gpus, a.host, a.driver_version, a.disk_free_bytes,
    )  # fmt: skip
    assert b.described and b.source == f"described: --hardware {box}"


def test_bad_hardware_file_is_one_error_line(tmp_path: Path) -> None:
    box = tmp_path / "box.json"
    box.write_text("{broken")
    result = runner.invoke(app, ["probe", "--hardware", str(box)])
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and str(box) in lines[0]


def test_unknown_gpu_is_a_usage_error() -> None:
    result = runner.invoke(app, ["probe", "--gpu", "nonsense"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "Error: unknown GPU 'nonsense'" in result.stderr
    assert "Hint: known: " in result.stderr


def test_bad_ram_is_a_usage_error() -> None:
    result = runner.invoke(app, ["probe", "--gpu", "3090", "--ram", "lots"])
    assert result.exit_code == 2 and "cannot read size" in result.stderr


# ---- RPC workers ---------------------------------------------------------------------------------


def test_probe_rpc_json_round_trips_into_hardware(tmp_path: Path) -> None:
    from fake_rpc import FakeWorker

    with FakeWorker([(14 * GiB, 15 * GiB)]) as w:
        first = runner.invoke(
            app,
            ["probe", "--json", "--gpu", "3090", "--rpc", w.endpoint,
             "--rpc-device", "10.0.0.7:50052=t4", "--rpc-bandwidth", "1.1GB/s"],
        )  # fmt: skip
    assert first.exit_code == 0, first.stderr
    workers = json.loads(first.stdout)["machine"]["rpc_workers"]
    assert [x["endpoint"] for x in workers] == [w.endpoint, "10.0.0.7:50052"]
    assert workers[0]["probed"] is True and workers[0]["protocol"] == "7.0.0"
    assert (workers[0]["devices"][0]["free_bytes"], workers[0]["devices"][0]["total_bytes"]) == (
        14 * GiB,
        15 * GiB,
    )
    assert workers[1]["devices"][0]["name"] == "Tesla T4"
    assert {x["network"]["bandwidth_bytes_per_s"] for x in workers} == {1_100_000_000}
    box = tmp_path / "cluster.json"
    box.write_text(first.stdout)
    second = runner.invoke(app, ["probe", "--json", "--hardware", str(box)])  # the fake is gone
    assert second.exit_code == 0, second.stderr
    assert json.loads(second.stdout)["machine"]["rpc_workers"] == workers


def test_probe_rpc_human_table() -> None:
    from fake_rpc import FakeWorker

    with FakeWorker([(14 * GiB, 15 * GiB)]) as w:
        result = runner.invoke(app, ["probe", "--gpu", "3090", "--rpc", w.endpoint,
                                     "--rpc-device", f"{w.endpoint}=t4"])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert f"RPC workers (llama-server --rpc {w.endpoint})" in out
    assert "RPC0" in out and "Tesla T4" in out and "probed (protocol 7.0.0)" in out
    assert "117 MB/s" in out


def test_unreachable_or_busy_worker_is_exit_6_and_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    from fake_rpc import FakeWorker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        result = runner.invoke(app, ["probe", "--rpc", f"127.0.0.1:{s.getsockname()[1]}"])
    assert result.exit_code == 6 and result.stdout == ""
    assert result.stderr.splitlines()[-2].startswith("Error: RPC worker 127.0.0.1:")
    assert "connection refused" in result.stderr and "Traceback" not in result.stderr
    monkeypatch.setattr("quantpick.machine.rpc.DEFAULT_TIMEOUT_S", 0.5)
    with FakeWorker(behaviour="busy") as w:
        result = runner.invoke(app, ["probe", "--rpc", w.endpoint, "--gpu", "3090"])
    assert result.exit_code == 6 and "is busy" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rpc", "box"], "cannot read RPC worker 'box'"),
        (["--rpc", "[::1]:50052"], "IPv4 only"),
        (["--rpc-device", "10.0.0.7:50052"], "cannot read RPC device"),
        (["--rpc-device", "10.0.0.7:50052=t4", "--rpc-latency", "3"], "cannot read duration"),
    ],
)
def test_bad_rpc_options_are_usage_errors(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["probe", "--gpu", "3090", *args])
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
