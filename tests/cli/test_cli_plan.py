"""`quantpick pick`, `estimate`, `max-context` and `command` through the CLI (CliRunner)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from conformance_model import write_conformance_gguf
from typer.testing import CliRunner

from quantpick.cli import app

runner = CliRunner()
MODEL = "qwen3.8-35b-a3b-distill"
BOX = ["--gpu", "3090", "--gpu", "t4", "--ram", "64G"]
MiB = 1024**2
DEVICE_KEYS = {
    "name",
    "kind",
    "weights_bytes",
    "kv_bytes",
    "recurrent_bytes",
    "compute_bytes",
    "overhead_bytes",
    "total_bytes",
    "budget_bytes",
    "layers",
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # No test touches the internet: the manifests' hub sources are never contacted here.
    monkeypatch.setenv("QUANTPICK_OFFLINE", "1")


@pytest.fixture(scope="module")
def q4km_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "Qwen3.8-35B-A3B-Q4_K_M.gguf"
    write_conformance_gguf(path)
    return path


@pytest.fixture
def current_server(tmp_path: Path) -> Path:
    """A stand-in llama-server of the pinned tree (b11312): its --version picks the compute rule
    (plan/build_class.py); without one the conservative rule applies."""
    data = Path(__file__).resolve().parents[1] / "data"
    fake = tmp_path / "current" / "llama-server"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\ncat "{data / "llama-server-version-current.txt"}" >&2\n')
    fake.chmod(0o755)
    return fake


def run_json(args: list[str]) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_pick_json_reference_box_262144(current_server: Path) -> None:
    doc = run_json(
        ["pick", MODEL, "-c", "262144", *BOX, "--prefer", "speed", "--llama-server",
         str(current_server)]
    )  # fmt: skip
    assert doc["schema_version"] == 1
    assert doc["compute_rule"]["class"] == "capped"
    assert doc["compute_rule"]["build"] == "b11312 (0c1e57098)"
    assert doc["quant"] == "Q6_K" and doc["placement"] == "gpu" and doc["fits"] is True
    assert doc["machine"]["described"] is True
    kinds = [d["kind"] for d in doc["devices"]]
    assert kinds == ["gpu", "gpu", "host"]
    for d in doc["devices"]:
        assert DEVICE_KEYS <= set(d)
        assert d["total_bytes"] <= d["budget_bytes"]
        assert isinstance(d["total_bytes"], int)
    assert doc["devices"][0]["layers"] and doc["devices"][1]["layers"]
    flags = " ".join(doc["flags"])
    assert "-c 262144" in flags and "-ts 27,15" in flags and "-ngl 42" in flags
    assert doc["speed"]["tokens_per_s_target"] < doc["speed"]["tokens_per_s_empty"]
    assert {c["quant"] for c in doc["candidates"]} == {
        "BF16",
        "Q8_0",
        "Q6_K",
        "Q5_K_M",
        "Q4_K_M",
        "IQ4_XS",
        "Q3_K_M",
        "IQ3_M",
        "Q2_K",
        "IQ2_M",
    }


def test_pick_human_table() -> None:
    result = runner.invoke(app, ["pick", MODEL, "-c", "32768", *BOX], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    assert "llama-server flags:" in result.stdout and "Candidates" in result.stdout
    assert "CUDA0" in result.stdout and "Tesla T4" in result.stdout


def test_pick_nothing_fits_exit_3() -> None:
    result = runner.invoke(app, ["pick", MODEL, "-c", "262144", "--gpu", "tiny:4G", "--ram", "6G"])
    assert result.exit_code == 3
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Error: nothing of") and lines[1].startswith("Hint:")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pick", MODEL, "-c", "400000", *BOX], "context length"),
        (["pick", MODEL, "--kv", "q9_9", *BOX], "not a KV cache type"),
        (
            ["estimate", MODEL, "-q", "Q4_K_M", "-ctv", "q8_0", "-fa", "off", *BOX],
            "flash attention",
        ),
        (["estimate", MODEL, "-q", "Q4_K_M", "-ts", "a,b", *BOX], "-ts"),
        (["estimate", MODEL, "-q", "Q7_K", *BOX], "no quant"),
        (["pick", "no-such-model", *BOX], "no-such-model"),
    ],
)
def test_bad_input_one_line_error(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code in (1, 2)
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert "Traceback" not in result.stderr


def test_estimate_json_devices_interface() -> None:
    doc = run_json(
        [
            "estimate",
            MODEL,
            "-q",
            "Q4_K_M",
            "-c",
            "131072",
            "-ts",
            "26,16",
            "-ctk",
            "q8_0",
            "-ctv",
            "q8_0",
            *BOX,
        ]
    )
    assert [d["kind"] for d in doc["devices"]] == ["gpu", "gpu", "host"]
    for d in doc["devices"]:
        assert DEVICE_KEYS <= set(d)
        assert d["total_bytes"] == (
            d["weights_bytes"]
            + d["kv_bytes"]
            + d["recurrent_bytes"]
            + d["compute_bytes"]
            + d["overhead_bytes"]
            + d["projector_bytes"]
        )
    assert doc["exact_weights"] is False and doc["basis"].startswith("synthesized")
    cuda0, cuda1, _ = doc["devices"]
    # -ts 26,16: blocks 0-25 (attention 3..23: six layers) on CUDA0, the other four on CUDA1;
    # q8_0 K + V = 2 x 544 bytes per cell per layer
    assert cuda0["kv_bytes"] == 6 * 131072 * 1088
    assert cuda1["kv_bytes"] == 4 * 131072 * 1088


def test_estimate_gguf_matches_llamacpp_through_the_cli(q4km_gguf: Path) -> None:
    """The conformance case `-c 32768 -np 1 -ts 24,16 --n-cpu-moe 10`, end to end."""
    doc = run_json(
        [
            "estimate",
            "--gguf",
            str(q4km_gguf),
            "-c",
            "32768",
            "-ts",
            "24,16",
            "--n-cpu-moe",
            "10",
            *BOX,
        ]
    )
    assert doc["exact_weights"] is True and doc["basis"].startswith("gguf:")
    cuda0, cuda1, _ = doc["devices"]
    assert (cuda0["weights_bytes"] // MiB, cuda1["weights_bytes"] // MiB) == (7897, 7289)
    assert (
        (cuda0["kv_bytes"] + cuda0["recurrent_bytes"]) // MiB,
        (cuda1["kv_bytes"] + cuda1["recurrent_bytes"]) // MiB,
    ) == (425, 276)


def test_estimate_bad_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTGGUF" + b"\0" * 100)
    result = runner.invoke(app, ["estimate", "--gguf", str(bad), *BOX])
    assert result.exit_code == 1 and result.stderr.startswith("Error: ")
    assert result.stdout == ""


def test_max_context_json() -> None:
    doc = run_json(["max-context", MODEL, "--gpu", "4090", "--ram", "8G", "--no-offload"])
    limits = {x["quant"]: x for x in doc["limits"]}
    assert limits["BF16"]["max_context"] == 0
    assert limits["IQ2_M"]["max_context"] == 262144
    assert 0 < limits["Q4_K_M"]["max_context"] < 262144
    assert doc["machine"]["described"] is True


def test_pick_max_context_flag_is_the_same_command() -> None:
    a = run_json(["max-context", MODEL, "--gpu", "4090", "--ram", "8G", "--quant", "Q4_K_M"])
    b = run_json(
        ["pick", MODEL, "--max-context", "--gpu", "4090", "--ram", "8G", "--quant", "Q4_K_M"]
    )
    assert a["limits"] == b["limits"]


def test_command_for_a_local_gguf(q4km_gguf: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["command", "--gguf", str(q4km_gguf), "-c", "65536", *BOX])
    assert result.exit_code == 0, result.stderr
    line = result.stdout.strip()
    assert str(q4km_gguf) in line and "-c 65536" in line and "-ngl 42" in line
    assert "targets current llama.cpp" in result.stderr  # no llama-server was checked
    script = tmp_path / "serve.sh"
    result = runner.invoke(
        app, ["command", "--gguf", str(q4km_gguf), "-c", "65536", *BOX, "--script", str(script)]
    )
    assert result.exit_code == 0, result.stderr
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o755
    text = script.read_text()
    assert "set -euo pipefail" in text and "exec " in text and "quantpick plan:" in text
    doc = run_json(["command", "--gguf", str(q4km_gguf), "-c", "65536", *BOX])
    argv = doc["command"]["argv"]
    assert argv[argv.index("-m") + 1] == str(q4km_gguf)
    assert doc["plan"]["quant"] == "Q4_K_M"


def test_command_needs_the_file(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["command", MODEL, "--quant", "Q4_K_M", "--dir", str(tmp_path), *BOX]
    )
    assert result.exit_code == 2
    assert "is not there" in result.stderr and "quantpick get" in result.stderr


def test_llama_server_runs_only_where_it_is_needed(
    q4km_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning never starts llama-server: it asks for --version (the build picks the compute
    rule); `command` also reads --help (and --version again) to check the command's flags."""
    data = Path(__file__).resolve().parents[1] / "data"
    log = tmp_path / "calls.log"
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> "{log}"\n'
        f'if [ "$1" = "--help" ]; then cat "{data / "llama-server-help-current.txt"}"; '
        f'else cat "{data / "llama-server-version-current.txt"}" >&2; fi\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    for args in (
        ["pick", MODEL, "-c", "32768"],
        ["estimate", MODEL, "-q", "Q4_K_M"],
        ["max-context", MODEL, "--quant", "IQ2_M"],
    ):
        result = runner.invoke(app, [*args, *BOX, "--json"])
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["compute_rule"]["class"] == "capped"
    assert log.read_text().split() == ["--version"] * 3
    log.unlink()
    result = runner.invoke(app, ["command", "--gguf", str(q4km_gguf), "-c", "8192", *BOX, "--json"])
    assert result.exit_code == 0, result.stderr
    assert log.read_text().split() == ["--version", "--help", "--version"]
    target = json.loads(result.stdout)["command"]
    assert target["argv"][0] == str(fake)
