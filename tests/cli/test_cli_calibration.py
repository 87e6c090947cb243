"""`bench` stores only a calibration that can be true; `calibration list|show|reset`;
`--no-calibration`; JSON never carries a bare NaN."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_llamacpp import CURRENT_VERSION, DATA, fake_tool
from gguf_fixtures import TINY, write_gguf
from typer.testing import CliRunner

from quantpick.cli import app

runner = CliRunner()


def strict_json(text: str) -> dict:
    def refuse(name: str) -> None:
        raise AssertionError(f"bare {name} in the JSON output")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "Tiny-Q8_0.gguf"
    write_gguf(path, TINY, big="Q8_0", data="random")
    return path


@pytest.fixture
def bench_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "llama-bin"
    fake_tool(bin_dir, "llama-bench", routes=[(["-o", "json"], DATA / "llama-bench-tiny.txt")],
              version_text=CURRENT_VERSION)  # fmt: skip
    return bin_dir


def test_bench_of_a_tiny_model_is_not_stored(tiny: Path, bench_bin: Path) -> None:
    """Before: the README's own bench of the 16 MiB model (decode faster at depth than empty,
    prefill 0.015x predicted) was stored and ruined the next CPU pick."""
    args = ["bench", "--gguf", str(tiny), "-c", "4096", "--depth", "64", "--llama-bin",
            str(bench_bin)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert "Warning: calibration not saved: this run cannot calibrate later answers:" in (
        result.stderr
    )
    assert "the model (" in result.stderr and "is outside 1.17 GiB-118.04 GiB" in result.stderr
    assert "faster than with an empty context" in result.stderr
    assert "Calibration saved" not in result.stdout
    listed = runner.invoke(app, ["calibration", "list", "--json"])
    assert strict_json(listed.stdout)["entries"] == []
    doc = strict_json(runner.invoke(app, [*args, "--json"]).stdout)
    assert doc["saved"] is False and doc["profile_path"] is None
    assert any("outside" in why for why in doc["not_saved_because"])
    # and the next answer on this machine is uncalibrated
    est = runner.invoke(app, ["estimate", "--gguf", str(tiny), "-c", "4096", "--json"])
    assert est.exit_code == 0, est.stderr
    assert strict_json(est.stdout)["calibration"] is None


def test_bench_timeout_is_an_option(tiny: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "slow"
    fake_tool(bin_dir, "llama-bench", sleep=30, version_text=CURRENT_VERSION)
    result = runner.invoke(app, ["bench", "--gguf", str(tiny), "-c", "4096", "--llama-bin",
                                 str(bin_dir), "--timeout", "1"])  # fmt: skip
    assert result.exit_code == 1
    assert "Error: llama-bench did not finish in 1 s" in result.stderr
    bad = runner.invoke(app, ["bench", "--gguf", str(tiny), "--timeout", "0"])
    assert bad.exit_code == 2 and "--timeout 0: give a number of seconds above 0" in bad.stderr


def _store_one(build: str = "unknown") -> Path:
    """A plausible profile for this (test) machine; "unknown": no llama-server installed."""
    from quantpick.machine.probe import probe
    from quantpick.plan.calibration import machine_devices
    from quantpick.serve.calibration import save_profile

    machine = probe(inspect_server=False)
    return save_profile(
        machine,
        {
            "build_id": build,
            "build_label": build,
            "date": "2026-11-30",
            "model": "qwen3.8-35b-a3b-distill",
            "quant": "Q4_K_M",
            "depth_tokens": 8192,
            "measured": {"decode_tps_empty": 9.0, "decode_tps_depth": 8.0},
            "predicted": {"decode_tps_empty": 10.0, "decode_tps_depth": 10.0},
            "ratios": {"decode_empty": 0.9, "decode_depth": 0.8, "prefill": None},
            "gpus": [],
            "model_bytes": 21 * 10**9,
            "devices": list(machine_devices(machine)),
            "samples": {"decode_empty": [9.0, 9.1]},
        },
    )


def test_calibration_list_show_reset() -> None:
    path = _store_one()
    listed = strict_json(runner.invoke(app, ["calibration", "list", "--json"]).stdout)
    (row,) = listed["entries"]
    assert row["this_machine"] and row["problem"] is None and row["path"] == str(path)
    assert row["entry"]["quant"] == "Q4_K_M" and row["entry"]["size_class"] == "16-32 GiB"
    human = runner.invoke(app, ["calibration", "list"], env={"COLUMNS": "200"})
    assert human.exit_code == 0 and "(this one)" in human.stdout and "0.9/0.8" in human.stdout
    shown = strict_json(runner.invoke(app, ["calibration", "show", "--json"]).stdout)
    assert shown["path"] == str(path) and shown["profile"]["schema_version"] == 2
    reset = runner.invoke(app, ["calibration", "reset"])
    assert reset.exit_code == 0 and f"Removed {path}" in reset.stderr
    assert not path.exists()
    again = runner.invoke(app, ["calibration", "show"])
    assert again.exit_code == 1 and "no calibration for this machine" in again.stderr


def test_a_stored_poisoned_profile_is_listed_and_never_applied(tiny: Path) -> None:
    """A profile written before the checks (or by hand) with a NaN ratio: listed with its
    problem, not applied, and no JSON answer carries a bare NaN."""
    path = _store_one()
    doc = json.loads(path.read_text())
    doc["profiles"][0]["ratios"]["decode_empty"] = float("nan")
    path.write_text(json.dumps(doc))  # json.dumps writes NaN bare
    listed = strict_json(runner.invoke(app, ["calibration", "list", "--json"]).stdout)
    assert "decode_empty measured / predicted is nan" in listed["entries"][0]["problem"]
    pick = runner.invoke(app, ["pick", "qwen3.8-35b-a3b-distill", "-c", "4096", "--json",
                               "--no-network"])  # fmt: skip
    assert pick.exit_code in (0, 3), pick.stderr
    assert strict_json(pick.stdout).get("calibration") is None
    assert "calibration not applied: the stored calibration cannot be true" in pick.stderr
    # a good one is applied, and the answer says so
    path.unlink()
    _store_one()
    pick = runner.invoke(app, ["pick", "qwen3.8-35b-a3b-distill", "-c", "4096", "--json",
                               "--no-network"])  # fmt: skip
    assert "Note: calibrated on this machine, 2026-11-30, build unknown (bench of" in pick.stderr
    assert strict_json(pick.stdout)["calibration"]["build"] == "unknown"


def test_no_calibration_on_the_planning_commands(tiny: Path) -> None:
    _store_one()
    for args in (
        ["pick", "qwen3.8-35b-a3b-distill", "-c", "4096", "--no-network"],
        ["max-context", "qwen3.8-35b-a3b-distill", "--no-network"],
        ["estimate", "--gguf", str(tiny), "-c", "4096"],
        ["command", "--gguf", str(tiny), "-c", "4096", "--no-confirm"],
    ):
        with_it = runner.invoke(app, [*args, "--json"])
        without = runner.invoke(app, [*args, "--json", "--no-calibration"])
        assert without.exit_code in (0, 3), without.stderr
        assert "calibration off (--no-calibration)" in without.stderr, args
        assert "calibration off" not in with_it.stderr


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("ratios", [0.5, 0.5], "ratios is a list, not an object"),
        ("measured", [60.0], "measured is a list, not an object"),
        ("depth_tokens", "8192", "depth_tokens is '8192', not a whole number"),
        ("depth_tokens", -5, "depth_tokens is -5: not 0-16777216"),
        pytest.param("depth_tokens", 10**400, "depth_tokens is inf: not 0-16777216", id="huge"),
        ("depth_tokens", 8192.5, "depth_tokens is 8.19e+03, not a whole number"),
        ("depth_tokens", float("nan"), "depth_tokens is nan, not a whole number"),
        ("devices", "GPU-a", "devices is a str, not a list"),
        pytest.param("ratios", {"decode_empty": 10**400}, "is inf: outside", id="huge-ratio"),
    ],
)
def test_a_malformed_stored_entry_is_listed_invalid_and_never_applied(
    field: str, value: object, why: str
) -> None:
    """Before: `ratios` as a list or `depth_tokens` as a string crashed every pick (traceback);
    `depth_tokens: -5` was applied."""
    path = _store_one()
    doc = json.loads(path.read_text())
    doc["profiles"][0][field] = value
    path.write_text(json.dumps(doc))
    listed = runner.invoke(app, ["calibration", "list", "--json"])
    assert listed.exit_code == 0 and listed.exception is None, listed.exception
    (row,) = json.loads(listed.stdout)["entries"]
    assert why in (row["problem"] or ""), row["problem"]
    assert runner.invoke(app, ["calibration", "list"]).exception is None
    pick = runner.invoke(app, ["pick", "qwen3.8-35b-a3b-distill", "-c", "4096", "--json",
                               "--no-network"])  # fmt: skip
    assert pick.exit_code in (0, 3) and pick.exception is None, pick.exception
    assert json.loads(pick.stdout).get("calibration") is None
    assert "calibration not applied:" in pick.stderr and why in pick.stderr
