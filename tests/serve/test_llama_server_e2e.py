"""End to end: a real llama-server runs the command quantpick writes, on a tiny qwen35moe model.

Run with: QUANTPICK_TEST_LLAMA_BIN="$(scripts/build-llamacpp.sh | tail -1)" pytest -m llamacpp
(CI builds the tools and runs these tests; see .ci/run).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from quantpick.plan.memory import RunConfig
from quantpick.serve.command import ServerOptions, build_command
from quantpick.serve.flags import capabilities_for, check_command

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_model import TINY, write_tiny_model  # noqa: E402

pytestmark = pytest.mark.llamacpp

HEALTH_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_server_runs_the_generated_command(tmp_path: Path, llamacpp_bin: Path) -> None:
    binary = llamacpp_bin / "llama-server"
    caps = capabilities_for(binary)
    model = tmp_path / "tiny qwen35moe.gguf"  # a space: the argv must survive as one argument
    write_tiny_model(model)
    port = _free_port()
    cmd = build_command(
        RunConfig(ctx_size=2048, n_parallel=1, n_gpu_layers=0, devices=()),
        model_path=model, mmproj_path=None, manifest=None, block_count=TINY["n_layer"],
        server=ServerOptions(host="127.0.0.1", port=port, alias="tiny"), capabilities=caps,
    )  # fmt: skip
    assert check_command(cmd.argv, caps) == []
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(cmd.argv), env={**os.environ, **cmd.env}, stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + HEALTH_TIMEOUT_S
            status = 0
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    pytest.fail(
                        f"llama-server exited {proc.returncode}:\n{log.read_text()[-3000:]}"
                    )
                try:
                    status = _get(f"http://127.0.0.1:{port}/health")
                except OSError:
                    status = 0
                if status == 200:
                    break
                time.sleep(0.25)
            assert status == 200, f"/health never returned 200:\n{log.read_text()[-3000:]}"
            # the tiny model has random weights: it may sample its end-of-text token early
            body = json.dumps({"prompt": "hello", "n_predict": 4, "ignore_eos": True}).encode()
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/completion", data=body,
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            with urllib.request.urlopen(req, timeout=60) as r:
                result = json.load(r)
            assert result["tokens_predicted"] == 4
            assert result["tokens_evaluated"] > 0
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_healthy(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    status = 0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"llama-server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            status = _get(f"http://127.0.0.1:{port}/health")
        except OSError:
            status = 0
        if status == 200:
            return
        time.sleep(0.25)
    pytest.fail(f"/health never returned 200:\n{log.read_text()[-3000:]}")


def test_head_and_worker_lines_run_across_two_rpc_workers(
    tmp_path: Path, llamacpp_bin: Path
) -> None:
    """quantpick probes two real ggml-rpc-server workers, plans the tiny model across them and
    writes every host's line; the workers restarted from their generated lines and the head's
    generated line answer a completion."""
    from rpc_workers import rpc_workers, start_worker, stop
    from typer.testing import CliRunner

    from quantpick.cli import app

    model = tmp_path / "tiny.gguf"
    write_tiny_model(model)
    port = _free_port()
    with rpc_workers(llamacpp_bin, 2, log_dir=tmp_path) as endpoints:
        # The workers are CPUs of this very machine, no faster than it: left to itself the plan
        # would leave them out (this machine alone is as fast). A head with 16 MiB of RAM to
        # spare (the model alone needs ~30 MiB on one host: weights 16.5, compute ~12) must use
        # them.
        args = ["command", "--gguf", str(model), "-c", "2048", "--port", str(port),
                "--ram", "16M", "--ram-reserve", "0",
                "--llama-server", str(llamacpp_bin / "llama-server"), "--json"]  # fmt: skip
        for endpoint in endpoints:
            args += ["--rpc", endpoint]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.stderr
        doc = json.loads(result.stdout)
        plan_devices = [d for d in doc["plan"]["devices"] if d["kind"] == "gpu"]
        used = [d["endpoint"] for d in plan_devices]
        assert plan_devices and all(d["layers"] for d in plan_devices), plan_devices
        argv = doc["command"]["argv"]
        assert argv[argv.index("--rpc") + 1] == ",".join(used)
        workers = doc["workers"]
        assert [w["endpoint"] for w in workers] == used
        if len(used) < len(endpoints):
            # the tiny model fits one worker: a second would only add a network hop per token,
            # so the plan leaves it out of --rpc and says so
            assert any("left out of --rpc" in n for n in doc["plan"]["notes"])
        assert workers[0]["argv"][1:] == ["-H", "127.0.0.1", "-p", used[0].split(":")[1], "-c"]
        assert workers[0]["warnings"] == [] and workers[0]["firewall"] == []

    # The workers as quantpick wrote them (the program is on PATH on a worker; here, the build).
    procs = []
    log = tmp_path / "server.log"
    try:
        for w in workers:
            w_port = int(w["endpoint"].split(":")[1])
            procs.append(
                start_worker(
                    [str(llamacpp_bin / "ggml-rpc-server"), *w["argv"][1:]],
                    w_port,
                    log=tmp_path / f"worker-{w_port}.log",
                    env={**os.environ, "LLAMA_CACHE": str(tmp_path / "rpc-cache")},
                )
            )
        with log.open("wb") as out:
            server = subprocess.Popen(
                argv, env={**os.environ, **doc["command"]["env"]}, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                _wait_healthy(server, port, log)
                # the tiny model has random weights: it may sample its end-of-text token early
                body = json.dumps({"prompt": "hello", "n_predict": 4, "ignore_eos": True}).encode()
                req = urllib.request.Request(
                    f"http://127.0.0.1:{port}/completion", data=body,
                    headers={"Content-Type": "application/json"},
                )  # fmt: skip
                with urllib.request.urlopen(req, timeout=120) as r:
                    completion = json.load(r)
                assert completion["tokens_predicted"] == 4
            finally:
                server.terminate()
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
        # The workers served the head, and -c filled their tensor caches (tensors > 10 MiB
        # only: the tiny model has none, so the cache directory exists and may be empty).
        for w in workers:
            text = (tmp_path / f"worker-{w['endpoint'].split(':')[1]}.log").read_text()
            assert "local cache    : " + str(tmp_path / "rpc-cache" / "rpc") in text
            assert text.count("Accepted client connection") >= 2  # our probe, then the head
    finally:
        for proc in procs:
            stop(proc)


def _tiny_repo(tmp_path: Path, fake_hub: object) -> str:
    """The tiny model as a hub repository (with its SHA256SUMS) and its manifest: `tiny`."""
    import hashlib

    from typer.testing import CliRunner

    from quantpick.cli import app

    repo = tmp_path / "repo"
    repo.mkdir()
    model = repo / "Tiny-Q8_0.gguf"
    write_tiny_model(model)
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    (repo / "SHA256SUMS").write_text(f"{digest}  {model.name}\n")
    fake_hub.add_repo("org/Tiny-GGUF", {p.name: p for p in repo.iterdir()})  # type: ignore[attr-defined]
    added = CliRunner().invoke(app, ["manifest", "add", "org/Tiny-GGUF", "--id", "tiny"])
    assert added.exit_code == 0, added.stderr
    return "tiny"


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z"


def test_quantpick_serve_answers_a_chat_and_ctrl_c_leaves_no_process(
    tmp_path: Path, llamacpp_bin: Path, fake_hub: object
) -> None:
    """`quantpick serve tiny`: plan, download + verify from the hub, confirm with the real
    llama-fit-params, start the real llama-server; /v1/chat/completions answers under the model's
    alias; SIGINT to quantpick (a terminal's Ctrl-C) stops it and leaves no llama-server."""
    name = _tiny_repo(tmp_path, fake_hub)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "quantpick", "serve", name, "-c", "2048", "--port", "0",
         "--llama-bin", str(llamacpp_bin), "--dir", str(tmp_path / "models")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        first = proc.stdout.readline()
        assert first.startswith("Serving tiny (Q8_0"), first + proc.stderr.read()
        base = proc.stdout.readline().split("OpenAI base URL:", 1)[1].strip()
        message = {"role": "user", "content": "hello"}
        body = json.dumps({"model": name, "max_tokens": 4, "messages": [message]}).encode()
        req = urllib.request.Request(f"{base}/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as r:
            answer = json.load(r)
        assert answer["model"] == name
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert answer["usage"]["completion_tokens"] >= 1
        found = subprocess.run(["pgrep", "-f", f"{llamacpp_bin}/llama-server -m"],
                               capture_output=True, text=True).stdout.split()  # fmt: skip
        [server_pid] = [int(p) for p in found]
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Confirmed by llama.cpp" in err and f"Stopped llama-server (pid {server_pid})." in err
    assert _pid_gone(server_pid)


def test_router_loads_the_model_from_the_written_preset(tmp_path: Path, llamacpp_bin: Path) -> None:
    """`command --format preset` writes a section the real router accepts: it lists the model,
    loads it on the first request and answers under its name, with the plan's flags."""
    from typer.testing import CliRunner

    from quantpick.cli import app

    model = tmp_path / "Tiny-Q8_0.gguf"
    write_tiny_model(model)
    preset = tmp_path / "models.ini"
    preset.write_text("version = 1\n\n[*]\nthreads = 2\n")
    result = CliRunner().invoke(app, ["command", "--gguf", str(model), "-c", "2048",
                                      "--llama-bin", str(llamacpp_bin), "--llama-server",
                                      str(llamacpp_bin / "llama-server"), "--format", "preset",
                                      "--preset", str(preset)])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    argv = shlex.split(result.stdout.strip())
    port = _free_port()
    argv[argv.index("--port") + 1] = str(port)
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        router = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            _wait_healthy(router, port, log)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/models", timeout=10) as r:
                [listed] = json.load(r)["data"]
            assert listed["id"] == "Tiny-Q8_0"
            message = {"role": "user", "content": "hello"}
            body = json.dumps({"model": "Tiny-Q8_0", "max_tokens": 4, "messages": [message]})
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                         data=body.encode(),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=120) as r:
                answer = json.load(r)
            assert answer["model"] == "Tiny-Q8_0" and answer["usage"]["completion_tokens"] >= 1
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/models", timeout=10) as r:
                [loaded] = json.load(r)["data"]
            assert loaded["status"]["value"] == "loaded"
            child = loaded["status"]["args"]
            assert child[child.index("--ctx-size") + 1] == "2048"
            assert child[child.index("--model") + 1] == str(model)
            assert child[child.index("--fit") + 1] == "off"
            assert child[child.index("--threads") + 1] == "2"  # the [*] section still applies
        finally:
            router.terminate()
            try:
                router.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(router.pid, signal.SIGKILL)
                router.wait()
