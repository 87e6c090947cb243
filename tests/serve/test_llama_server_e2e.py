"""End to end: a real llama-server runs the command quantpick writes, on a tiny qwen35moe model.

Run with: QUANTPICK_TEST_LLAMA_BIN="$(scripts/build-llamacpp.sh | tail -1)" pytest -m llamacpp
(CI builds the tools and runs these tests; see .ci/run).
"""

from __future__ import annotations

import json
import os
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
            body = json.dumps({"prompt": "hello", "n_predict": 4}).encode()
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
