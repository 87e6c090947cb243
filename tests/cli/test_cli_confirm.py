"""`get` and `command` confirm the plan with llama-fit-params before writing the command (a fake
replaying recorded real output), `--no-confirm` turns it off, and no tool means a one-line note."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from fake_llamacpp import calls, fake_tool, fixture
from fakehub import FakeHub
from gguf_fixtures import TINY, write_gguf
from typer.testing import CliRunner

from quantpick.cli import app

runner = CliRunner()
REPO = "org/Tiny-GGUF"


@pytest.fixture
def tiny(fake_hub: FakeHub, tmp_path: Path) -> str:
    root = tmp_path / "repo"
    root.mkdir()
    path = root / "Tiny-Q8_0.gguf"
    write_gguf(path, TINY, big="Q8_0", data="random")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    (root / "SHA256SUMS").write_text(f"{digest}  {path.name}\n")
    fake_hub.add_repo(REPO, {path.name: path, "SHA256SUMS": root / "SHA256SUMS"})
    added = runner.invoke(app, ["manifest", "add", REPO, "--id", "tiny", "--json"])
    assert added.exit_code == 0, added.stderr
    return "tiny"


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "llama-bin"
    fake_tool(bin_dir, "llama-fit-params", routes=[([], fixture("tiny-host"))])
    return bin_dir


def test_get_confirms_with_the_downloaded_file(tiny: str, tools: Path, tmp_path: Path) -> None:
    dest = tmp_path / "models"
    result = runner.invoke(
        app, ["get", tiny, "-c", "4096", "--dir", str(dest), "--llama-bin", str(tools), "--json"]
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    confirmation = doc["confirmation"]
    assert confirmation["status"] == "confirmed"
    # pick's dry run on a stand-in of the hub's header before the download, then the file
    before, argv = calls(tools)
    assert Path(before[before.index("-m") + 1]).parent.parent.name == "standins"
    assert argv[argv.index("-m") + 1] == str(dest / "Tiny-Q8_0.gguf")
    assert argv[argv.index("-c") + 1] == "4096" and argv[argv.index("--device") + 1] == "none"
    assert doc["command"]["argv"][doc["command"]["argv"].index("-c") + 1] == "4096"


def test_cpu_only_on_this_machine_is_still_confirmed(
    tiny: str, tools: Path, tmp_path: Path
) -> None:
    """Issue 21: --cpu-only skipped the confirmation ("planned for a described machine"); it is
    this machine with its GPUs hidden, which llama.cpp projects with --device none."""
    dest = tmp_path / "models"
    result = runner.invoke(
        app,
        ["get", tiny, "-c", "4096", "--dir", str(dest), "--llama-bin", str(tools), "--cpu-only",
         "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["confirmation"]["status"] == "confirmed"
    assert "described machine" not in result.stderr
    for argv in calls(tools):  # the stand-in before the download, then the file
        assert argv[argv.index("--device") + 1] == "none"


def test_get_no_confirm_does_not_ask_and_dry_run_asks_like_pick(
    tiny: str, tools: Path, tmp_path: Path
) -> None:
    args = ["get", tiny, "-c", "4096", "--dir", str(tmp_path / "m"), "--llama-bin", str(tools),
            "--json"]  # fmt: skip
    result = runner.invoke(app, [*args, "--no-confirm"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["confirmation"] is None
    assert calls(tools) == []
    # --dry-run: pick's dry run on the hub's header (a stand-in), nothing downloaded
    result = runner.invoke(app, [*args, "--dry-run", "--dir", str(tmp_path / "d")])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["confirmation"]["status"] == "confirmed"
    assert "before download" in doc["confirmation"]["message"]
    (argv,) = calls(tools)
    assert Path(argv[argv.index("-m") + 1]).parent.parent.name == "standins"
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())
    pick = runner.invoke(app, ["pick", tiny, "-c", "4096", "--llama-bin", str(tools), "--json"])
    assert pick.exit_code == 0, pick.stderr
    # the same plan, the same flags
    assert doc["plan"]["flags"] == json.loads(pick.stdout)["flags"]


def test_no_tool_is_one_line(tiny: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(
        app, ["get", tiny, "-c", "4096", "--dir", str(tmp_path / "m"), "--llama-bin", str(empty)]
    )
    assert result.exit_code == 0, result.stderr
    notes = [ln for ln in result.stderr.splitlines() if "llama-fit-params" in ln]
    assert notes == [
        f"Note: no llama-fit-params in {empty}: the plan is not confirmed by llama.cpp"
    ]


def test_get_on_a_file_llama_cpp_cannot_load_writes_nothing(tiny: str, tmp_path: Path) -> None:
    """Before: "could not confirm: llama-fit-params failed (exit -6)", the script written, exit 0,
    llama.cpp's reason dropped. Now: llama.cpp's line, exit 7, no script."""
    stderr = tmp_path / "stderr.txt"
    stderr.write_text(
        "llama_model_load: error loading model: check_tensor_dims: tensor 'output_norm.weight' "
        "has wrong shape; expected   256, got   512\n"
        "llama_model_load_from_file_impl: failed to load model\n"
        "terminate called after throwing an instance of 'std::runtime_error'\n"
        "  what():  failed to load model\n"
    )
    bin_dir = tmp_path / "llama-bin"
    fake_tool(bin_dir, "llama-fit-params", stderr_file=stderr, exit_code=-6)
    script = tmp_path / "serve.sh"
    dest = tmp_path / "models"
    result = runner.invoke(
        app,
        ["get", tiny, "-c", "4096", "--dir", str(dest), "--llama-bin", str(bin_dir), "--script",
         str(script)],
    )  # fmt: skip
    assert result.exit_code == 7, result.stderr
    # refused by pick's dry run on the hub's header, before any download (it downloaded the
    # whole file first, then refused it and blamed a damaged file)
    assert (
        "Error: llama.cpp cannot load Tiny-Q8_0.gguf: check_tensor_dims: tensor "
        "'output_norm.weight' has wrong shape; expected 256, got 512 (its header, read from the "
        "hub before download)"
    ) in result.stderr
    hint = result.stderr.splitlines()[-1]
    assert hint == (
        "Hint: nothing was downloaded: this llama.cpp build does not load this file (a newer "
        "build may)"
    )
    assert "damaged" not in result.stderr and "standin" not in result.stderr
    assert not script.exists() and result.stdout == ""
    assert not dest.exists() or not any(dest.rglob("*.gguf*"))


def test_command_human_output_shows_the_comparison(tiny: str, tools: Path, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    got = runner.invoke(app, ["get", tiny, "-c", "4096", "--dir", str(dest), "--no-confirm"])
    assert got.exit_code == 0, got.stderr
    result = runner.invoke(
        app,
        ["command", tiny, "--quant", "Q8_0", "--dir", str(dest), "-c", "4096", "--llama-bin",
         str(tools)],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "llama.cpp's projection" in result.stderr and "Confirmed by llama.cpp" in result.stderr
    assert result.stdout.startswith("llama-server ") and " -c 4096 " in result.stdout


def test_confirm_without_a_tool_is_an_error(tiny: str, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    dest = tmp_path / "m"
    assert runner.invoke(app, ["get", tiny, "-c", "4096", "--dir", str(dest)]).exit_code == 0
    result = runner.invoke(app, ["confirm", tiny, "--quant", "Q8_0", "--dir", str(dest)])
    assert result.exit_code == 1
    assert "no llama-fit-params" in result.stderr


def test_a_profile_changes_the_next_answer_unless_overridden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a probed GPU machine with a stored profile for the installed build: the measured driver
    overhead replaces the default on that GPU, the speeds are scaled, the answer says so; an
    explicit --gpu-overhead still wins."""
    import sys

    from conformance_model import write_conformance_gguf
    from fake_llamacpp import CURRENT_VERSION
    from fake_nvml import FakeNvml, rtx_3090

    from quantpick.machine.probe import probe
    from quantpick.plan.calibration import machine_devices
    from quantpick.serve.calibration import save_profile

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([rtx_3090()]))
    server = fake_tool(tmp_path / "srv", "llama-server", version_text=CURRENT_VERSION)
    model = tmp_path / "q4km.gguf"
    size = write_conformance_gguf(model)
    args = ["estimate", "--gguf", str(model), "-c", "8192", "--cpu-moe", "--llama-server",
            str(server), "--json"]  # fmt: skip
    before = runner.invoke(app, args)
    assert before.exit_code == 0, before.stderr
    save_profile(
        probe(),
        {
            "build_id": "b11312-0c1e57098",
            "build_label": "b11312 (0c1e57098)",
            "date": "2026-11-30",
            "depth_tokens": 8192,
            "measured": {"decode_tps_empty": 50.0, "decode_tps_depth": 40.0},
            "predicted": {"decode_tps_empty": 100.0, "decode_tps_depth": 100.0},
            "ratios": {"decode_empty": 0.5, "decode_depth": 0.4, "prefill": None},
            "gpus": [{"device": "CUDA0", "driver_overhead_bytes": 600 * 2**20}],
            "model_bytes": size,
            "devices": list(machine_devices(probe())),
            "samples": {"decode_empty": [50.0, 50.5]},
        },
    )
    after = runner.invoke(app, args)
    assert after.exit_code == 0, after.stderr
    assert "Note: calibrated on this machine, 2026-11-30, build b11312 (0c1e57098)" in after.stderr
    # --no-calibration: the figures of before, and the answer says why
    off = runner.invoke(app, [*args, "--no-calibration"])
    assert off.exit_code == 0, off.stderr
    assert "Note: calibration off (--no-calibration): uncalibrated" in off.stderr
    assert json.loads(off.stdout)["calibration"] is None
    b, a = json.loads(before.stdout), json.loads(after.stdout)
    assert b["calibration"] is None and a["calibration"]["build"] == "b11312 (0c1e57098)"
    assert a["devices"][0]["overhead_bytes"] == 600 * 2**20
    assert b["devices"][0]["overhead_bytes"] == 384 * 2**20
    # the measured ratio scales the expected figure; the bound stays the bound
    assert a["speed"]["expected"]["decode_tps_empty"] == pytest.approx(
        b["speed"]["expected"]["decode_tps_empty"] * 0.5, rel=1e-2
    )
    assert a["speed"]["bound"] == b["speed"]["bound"]
    explicit = runner.invoke(app, [*args, "--gpu-overhead", "100MiB"])
    assert json.loads(explicit.stdout)["devices"][0]["overhead_bytes"] == 100 * 2**20
