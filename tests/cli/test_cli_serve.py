"""`quantpick serve`: a fake llama-server (tests/fake_llama_server.py) behind the real command:
the endpoint, --detach with --status/--stop, a busy port, load failures (exit 8 with llama.cpp's
lines), a build too old for the architecture, no llama-server at all, and SIGTERM / Ctrl-C in the
foreground (exit 143 / 130, no process left). The real llama-server does the same in
tests/serve/test_llama_server_e2e.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from fake_llama_server import calls, fake_llama_server
from typer.testing import CliRunner

from quantpick.cli import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_model import write_tiny_model  # noqa: E402

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "Tiny-Q8_0.gguf"
    write_tiny_model(path)
    return path


def serve(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["serve", *args])
    return result.exit_code, result.stdout, result.stderr


def _running(alias: str | None = None) -> list[dict]:
    code, out, err = serve(*([alias] if alias else []), "--status", "--json")
    assert code == 0, err
    return json.loads(out)["servers"]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def test_detach_status_stop(model: Path, tmp_path: Path) -> None:
    binary = fake_llama_server(tmp_path / "bin", load_s=0.3)
    code, out, err = serve("--gguf", str(model), "-c", "8192", "--port", "0", "--detach",
                           "--llama-server", str(binary), "--no-confirm")  # fmt: skip
    assert code == 0, err
    [server] = _running()
    url = server["openai_base_url"]
    assert f"OpenAI base URL: {url}" in out and "model:           Tiny-Q8_0" in out
    assert "context:         8192 tokens, 1 slot" in out
    assert "--port 0: using free port" in err and "serve --stop Tiny-Q8_0" in err
    argv = server["argv"]
    assert argv[argv.index("--alias") + 1] == "Tiny-Q8_0" and argv[argv.index("-c") + 1] == "8192"
    body = json.dumps({"model": "Tiny-Q8_0", "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(f"{url}/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.load(response)["model"] == "Tiny-Q8_0"
    code, out, err = serve("--status")
    assert code == 0 and "Tiny-Q8_0: " + url in out and "detached" in out
    code, out, err = serve("--stop", "nosuch")
    assert code == 1 and "no running server nosuch" in err
    code, out, err = serve("--stop", "Tiny-Q8_0")
    assert code == 0, err
    assert f"Stopped Tiny-Q8_0 (pid {server['pid']}" in err
    assert _gone(server["pid"]) and _running() == []
    code, _, err = serve("--stop")
    assert code == 1 and "no server started by quantpick is running" in err


def test_a_busy_port_picks_a_free_one_and_says_so(model: Path, tmp_path: Path) -> None:
    binary = fake_llama_server(tmp_path / "bin", load_s=0.0)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        busy = held.getsockname()[1]
        code, out, err = serve("--gguf", str(model), "-c", "4096", "--port", str(busy),
                               "--detach", "--llama-server", str(binary), "--json")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)["endpoint"]
    try:
        assert doc["port"] != busy
        assert f"port {busy} is in use on 127.0.0.1: using free port {doc['port']}" in err
        assert any("is in use" in n for n in doc["notes"])
        assert doc["openai_base_url"] == f"http://127.0.0.1:{doc['port']}/v1"
        assert doc["model"] == "Tiny-Q8_0" and doc["ctx_size"] == 4096
    finally:
        assert serve("--stop", "--port", str(doc["port"]))[0] == 0


def test_a_failed_load_exits_8_with_llama_cpps_lines(model: Path, tmp_path: Path) -> None:
    binary = fake_llama_server(tmp_path / "bin", fail="tensor 'blk.0.attn_q.weight' is corrupted")
    code, out, err = serve("--gguf", str(model), "-c", "4096", "--port", "0",
                           "--llama-server", str(binary))  # fmt: skip
    assert code == 8 and out == ""
    lines = err.splitlines()
    at = lines.index("llama-server's own lines (the last that say what went wrong):")
    assert lines[at + 1] == (
        "  llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' is corrupted"
    )
    assert "  main: exiting due to model loading error" in lines
    assert "Error: llama-server exited with code 1 before it was ready" in lines
    assert _running() == []


def test_a_build_too_old_for_the_architecture_is_refused_up_front(
    model: Path, tmp_path: Path
) -> None:
    binary = fake_llama_server(tmp_path / "bin", build=7000)
    code, _, err = serve("--gguf", str(model), "-c", "4096", "--llama-server", str(binary))
    assert code == 8
    assert "too old for qwen35moe: that architecture needs llama.cpp b7988 or newer" in err
    assert all(c in (["--help"], ["--version"]) for c in calls(tmp_path / "bin"))  # never started


def test_no_llama_server_anywhere(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    code, _, err = serve("--gguf", str(model), "-c", "4096")
    assert code == 8
    assert "Error: no llama-server found (not given with --llama-server or --llama-bin" in err
    assert "scripts/build-llamacpp.sh" in err


def test_serve_a_manifest_fetches_then_serves(
    fake_hub: object, tmp_path: Path, model: Path
) -> None:
    """MODEL: the get recipe (plan, download + verify), then the server on the verified file."""
    import hashlib

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / model.name).write_bytes(model.read_bytes())
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    (repo / "SHA256SUMS").write_text(f"{digest}  {model.name}\n")
    fake_hub.add_repo("org/Tiny-GGUF", {p.name: p for p in repo.iterdir()})  # type: ignore[attr-defined]
    added = runner.invoke(app, ["manifest", "add", "org/Tiny-GGUF", "--id", "tiny"])
    assert added.exit_code == 0, added.stderr
    binary = fake_llama_server(tmp_path / "bin", load_s=0.0)
    code, out, err = serve("tiny", "-c", "8192", "--port", "0", "--detach", "--quiet",
                           "--dir", str(tmp_path / "models"), "--llama-server", str(binary),
                           "--json")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    try:
        argv = doc["endpoint"]["argv"]
        served = Path(argv[argv.index("-m") + 1])
        assert served == tmp_path / "models" / model.name
        assert served.read_bytes() == model.read_bytes()
        assert doc["plan"]["quant"] == "Q8_0" and doc["endpoint"]["model"] == "tiny"
    finally:
        assert serve("--stop", "tiny")[0] == 0


def _foreground(model: Path, binary: Path, home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "QUANTPICK_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "quantpick", "serve", "--gguf", str(model), "-c", "4096",
         "--port", "0", "--llama-server", str(binary), "--no-confirm"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_foreground_stops_on_a_signal_and_leaves_no_process(
    model: Path, tmp_path: Path, signum: int, code: int
) -> None:
    binary = fake_llama_server(tmp_path / "bin", load_s=0.2)
    proc = _foreground(model, binary, tmp_path / "home")
    assert proc.stdout is not None
    first = proc.stdout.readline()  # "Serving ... at URL": it is ready
    assert first.startswith("Serving Tiny-Q8_0"), proc.stderr.read() if proc.stderr else ""
    records = list((tmp_path / "home" / "state" / "servers").glob("*.json"))
    [record] = [json.loads(p.read_text()) for p in records]
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert f"Stopped llama-server (pid {record['pid']})." in err
    assert _gone(record["pid"])
    assert not list((tmp_path / "home" / "state" / "servers").glob("*.json"))


def test_ctrl_c_while_loading_stops_it_too(model: Path, tmp_path: Path) -> None:
    binary = fake_llama_server(tmp_path / "bin", load_s=60)
    proc = _foreground(model, binary, tmp_path / "home")
    deadline = time.monotonic() + 20
    while not calls(tmp_path / "bin")[2:] and time.monotonic() < deadline:  # --help, --version
        time.sleep(0.1)
    time.sleep(0.5)
    out = subprocess.run(["pgrep", "-f", f"{binary} -m"], capture_output=True, text=True).stdout
    [pid] = [int(p) for p in out.split()]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Stopped before llama-server was ready (no process left running)." in err
    assert _gone(pid)
