"""`quantpick check`: bad input without a server, and (marker llamacpp) real llama-server
processes of the pinned CPU build on the tiny model: one `serve` started (as planned, weights, KV
and state equal to the plan's to the MiB), one started by hand with a smaller -c (context-smaller,
exit 9), and the same one checked against a plan that put the model on a GPU (the CPU build has
none: weights-on-cpu, exit 9, as a server started with -ngl 0 would show)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from quantpick.cli import app
from quantpick.config import load_settings
from quantpick.errors import ExitCode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_model import write_tiny_model  # noqa: E402

runner = CliRunner()
MiB = 1024**2
HEALTH_TIMEOUT_S = 120.0  # a loaded 2-core machine: the tiny model loads in ~1 s when idle


def check(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["check", *args])
    return result.exit_code, result.stdout, result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- without a server ---------------------------------------------------------------------------


def test_no_server_started_by_quantpick() -> None:
    code, _, err = check()
    assert code == ExitCode.ERROR and "Error: no server started by quantpick is running" in err


def test_unknown_alias() -> None:
    code, _, err = check("nope")
    assert code == ExitCode.ERROR and "no running server nope" in err


def test_unreachable_url_is_one_error_line() -> None:
    port = _free_port()
    code, _, err = check(f"http://127.0.0.1:{port}")
    assert code == ExitCode.SERVER
    assert err.count("Error:") == 1 and "Traceback" not in err


def test_bad_url_and_options_are_usage_errors() -> None:
    assert check("ftp://host")[0] == ExitCode.USAGE
    code, _, err = check("http://127.0.0.1:8080", "-c", "4096")
    assert code == ExitCode.USAGE and "give --gguf FILE too" in err


def test_not_a_llama_server(tmp_path: Path) -> None:
    # any HTTP server: python's own, answering 404 for /props
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                             "127.0.0.1", "--directory", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait(f"http://127.0.0.1:{port}/", proc, any_status=True)
        code, _, err = check(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert code == ExitCode.SERVER and "is not a llama-server: /props gave HTTP 404" in err


# ---- real llama-server ----------------------------------------------------------------------


def _wait(url: str, proc: subprocess.Popen[bytes], *, any_status: bool = False) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            if any_status:
                return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"no answer from {url}")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    write_tiny_model(path)
    return path


@pytest.fixture
def by_hand(llamacpp_bin: Path, model: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """llama-server started by hand: -c 1024 (and its default -np auto = 4 slots, -kvu)."""
    port = _free_port()
    log = tmp_path / "by-hand.log"
    argv = [str(llamacpp_bin / "llama-server"), "-m", str(model), "-c", "1024", "--host",
            "127.0.0.1", "--port", str(port), "-lv", "4"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.llamacpp
def test_server_started_by_serve_matches_its_plan(llamacpp_bin: Path, model: Path) -> None:
    serve = runner.invoke(app, ["serve", "--gguf", str(model), "-c", "4096", "--cpu-only",
                                "--detach", "--port", "0", "--llama-bin", str(llamacpp_bin),
                                "--json"])  # fmt: skip
    assert serve.exit_code == 0, serve.stderr
    doc = json.loads(serve.stdout)
    try:
        # serve's own report, once the model is loaded
        assert doc["check"]["as_planned"] is True and doc["check_error"] is None
        code, out, err = check("--json")
        assert code == 0, err
        report = json.loads(out)
        (cpu,) = report["devices"]
        planned, measured = cpu["planned"], cpu["measured"]
        for key in ("weights_bytes", "kv_bytes", "recurrent_bytes"):
            assert abs(planned[key] - measured[key]) < MiB, key
        assert measured["weights_bytes"] > 16 * MiB and measured["kv_bytes"] == 4 * MiB
        assert cpu["matches"] is True
        assert report["context"] == {"planned_per_slot": 4096, "measured_per_slot": 4096,
                                     "from": "llama.cpp's log", "n_parallel": 1}  # fmt: skip
        codes = {f["code"] for f in report["findings"]}
        assert codes <= {"compute-differs", "not-measured"}, report["findings"]
        # and in serve --status --json
        status = runner.invoke(app, ["serve", "--status", "--json"])
        (server,) = json.loads(status.stdout)["servers"]
        assert server["check"]["as_planned"] is True
        code, out, _ = check(doc["endpoint"]["model"])
        assert code == 0 and "As planned." in out and "KV" in out

        # learning: the measured compute becomes this machine's memory calibration, and the
        # next plan for this build carries it (named), weights/KV/state untouched
        code, out, err = check("--learn", "--json")
        learned = json.loads(out)
        assert code == 0 and learned["learned"], learned["not_learned"]
        plan = runner.invoke(app, ["command", "--gguf", str(model), "-c", "4096", "--cpu-only",
                                   "--llama-server", str(llamacpp_bin / "llama-server"),
                                   "--no-confirm", "--json"])  # fmt: skip
        assert plan.exit_code == 0, plan.stderr
        (host,) = json.loads(plan.stdout)["plan"]["devices"]
        assert abs(host["compute_bytes"] - measured["compute_bytes"]) <= 1
        assert host["kv_bytes"] == planned["kv_bytes"]
        assert "quantpick check --learn" in plan.stderr
        listed = runner.invoke(app, ["calibration", "list", "--json"])
        (row,) = json.loads(listed.stdout)["memory"]
        assert row["this_machine"] and "CPU" in row["entry"]["compute_ratios"]
        assert runner.invoke(app, ["calibration", "reset"]).exit_code == 0
        assert (
            json.loads(runner.invoke(app, ["calibration", "list", "--json"]).stdout)["memory"] == []
        )
    finally:
        runner.invoke(app, ["serve", "--stop", doc["endpoint"]["model"]])


@pytest.mark.llamacpp
def test_smaller_context_by_hand(by_hand: tuple[str, Path], model: Path) -> None:
    url, log = by_hand
    code, out, err = check(url, "--gguf", str(model), "-c", "4096", "--cpu-only", "--log",
                           str(log), "--json")  # fmt: skip
    assert code == ExitCode.DIFFERS, err
    report = json.loads(out)
    findings = {f["code"]: f for f in report["findings"]}
    assert findings["context-smaller"]["severity"] == "costs"
    assert report["context"]["measured_per_slot"] == 1024
    assert report["context"]["planned_per_slot"] == 4096
    # the same model, weights to the MiB
    (cpu,) = report["devices"]
    assert abs(cpu["difference"]["weights_bytes"]) < MiB
    code, out, _ = check(url, "--gguf", str(model), "-c", "4096", "--cpu-only")
    assert code == ExitCode.DIFFERS and "[context-smaller]" in out  # /props alone says it too


@pytest.mark.llamacpp
def test_weights_on_the_cpu_where_the_plan_said_gpu(by_hand: tuple[str, Path], model: Path) -> None:
    url, log = by_hand
    code, out, err = check(url, "--gguf", str(model), "-c", "1024", "-np", "4", "-kvu",
                           "--gpu", "3090:24G", "--ram", "64G", "--log", str(log))  # fmt: skip
    assert code == ExitCode.DIFFERS, err
    assert "[weights-on-cpu]" in out and "no buffer on CUDA0 at all" in out
    assert "[kv-on-cpu]" in out


@pytest.mark.llamacpp
def test_any_server_without_a_plan(by_hand: tuple[str, Path]) -> None:
    url, _ = by_hand
    code, out, err = check(url)
    assert code == 0, err
    assert "no plan: the server's own /props" in out and "Context per slot: 1024" in out
    assert os.path.basename(url)  # the URL was read, not a record


@pytest.mark.llamacpp
def test_a_gpu_fuller_than_planned(
    llamacpp_bin: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server `serve` started, checked against a plan for a 24 GB RTX 3090 while NVML (emulated
    # at the pynvml boundary) shows the server's process with 1 GiB and another with 6 GiB on it.
    from fake_nvml import FakeNvml, rtx_3090

    serve = runner.invoke(app, ["serve", "--gguf", str(model), "-c", "4096", "--cpu-only",
                                "--detach", "--port", "0", "--llama-bin", str(llamacpp_bin),
                                "--json"])  # fmt: skip
    assert serve.exit_code == 0, serve.stderr
    endpoint = json.loads(serve.stdout)["endpoint"]
    try:
        gib = 1024**3
        card = rtx_3090(total=24 * gib, free=17 * gib,
                        processes={endpoint["pid"]: 1 * gib, 99: 6 * gib})  # fmt: skip
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([card]))
        code, out, err = check(endpoint["base_url"], "--gguf", str(model), "-c", "4096",
                               "--gpu", "3090:24G", "--ram", "64G", "--json")  # fmt: skip
        assert code == ExitCode.DIFFERS, err
        report = json.loads(out)
        findings = {f["code"]: f for f in report["findings"]}
        assert findings["gpu-fuller"]["device"] == "CUDA0"
        assert "6.00 GiB" in findings["gpu-fuller"]["message"]
        assert report["gpus"] == [{"device": "CUDA0", "total_bytes": 24 * gib,
                                   "used_bytes": 7 * gib, "server_bytes": gib}]  # fmt: skip
        assert "weights-on-cpu" in findings  # and the CPU build holds everything in host memory
    finally:
        runner.invoke(app, ["serve", "--stop", endpoint["model"]])


def test_ctrl_c_during_serves_check_stops_the_server(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the server is ready but not reported yet: an interruption stops it, as during the load
    from fake_llama_server import fake_llama_server

    binary = fake_llama_server(tmp_path / "bin", load_s=0.2)
    seen: list[int] = []

    def interrupted(url: str, directory: Path, settings: object) -> None:
        [record] = [json.loads(p.read_text()) for p in directory.glob("*.json")]
        seen.append(record["pid"])
        raise KeyboardInterrupt

    monkeypatch.setattr("quantpick.pipeline.check_running", interrupted)
    result = runner.invoke(app, ["serve", "--gguf", str(model), "-c", "4096", "--port", "0",
                                 "--llama-server", str(binary), "--no-confirm"])  # fmt: skip
    assert result.exit_code == 130, result.stderr
    assert "no process left running" in result.stderr
    [pid] = seen
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("llama-server left running")
    assert not list(load_settings().servers_dir.glob("*.json"))
