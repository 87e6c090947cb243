#!/usr/bin/env python3
"""Record real llama-server logs and endpoint answers of the pinned CPU build serving the tiny
model, the fixtures tests/serve/test_server_log.py and tests/serve/test_live.py read:

- tests/data/server-logs/cpu-tiny-serve.log: a server started by `quantpick serve --gguf tiny
  -c 4096 --cpu-only --detach`, stopped by `serve --stop` (so the log ends with llama.cpp's
  memory breakdown table);
- tests/data/server-logs/cpu-tiny-c1024.log: the same model started by hand with `-c 1024
  -lv 4` (llama.cpp's --fit on by default: its projection precedes the load);
- tests/data/server-endpoints/cpu-tiny-{props,slots}.json: /props and /slots of the first one
  after one short completion; cpu-tiny-metrics.txt: /metrics of the second (started with
  --metrics: `serve` does not turn it on) after one.

    QUANTPICK_TEST_LLAMA_BIN="$(scripts/build-llamacpp.sh | tail -1)" scripts/record_server_logs.py

Paths of the recording machine (the temporary model, the binaries) are replaced by <tmp> and
<bin> in what is written.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "data" / "server-logs"
ENDPOINTS = ROOT / "tests" / "data" / "server-endpoints"
sys.path.insert(0, str(ROOT / "tests"))

from tiny_model import write_tiny_model  # noqa: E402

HEALTH_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, data: bytes | None = None) -> bytes:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return bytes(r.read())


def _wait(url: str) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            _get(url)
            return
        except OSError:
            time.sleep(0.25)
    raise SystemExit(f"no answer from {url}")


def _scrub(text: str, tmp: Path, bin_dir: Path) -> str:
    text = text.replace(str(bin_dir), "<bin>").replace(str(tmp), "<tmp>")
    return re.sub(r"/(?:work|root|home)/[^\s'\"]*", "<path>", text)


def main() -> None:
    bin_dir = Path(os.environ["QUANTPICK_TEST_LLAMA_BIN"]).resolve()
    LOGS.mkdir(parents=True, exist_ok=True)
    ENDPOINTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        model = tmp / "tiny.gguf"
        write_tiny_model(model)
        env = {**os.environ, "QUANTPICK_HOME": str(tmp / "home")}
        qp = [sys.executable, "-m", "quantpick"]
        port = _free_port()
        serve = [*qp, "serve", "--gguf", str(model), "-c", "4096", "--cpu-only", "--detach",
                 "--port", str(port), "--llama-bin", str(bin_dir), "--json"]  # fmt: skip
        out = subprocess.run(serve, env=env, capture_output=True, text=True, check=True)
        doc = json.loads(out.stdout)["endpoint"]
        base = doc["base_url"]
        try:
            _get(base + "/completion", json.dumps({"prompt": "Hello", "n_predict": 16}).encode())
            for name, path in (("props", "/props"), ("slots", "/slots")):
                body = json.loads(_get(base + path))
                (ENDPOINTS / f"cpu-tiny-{name}.json").write_text(
                    _scrub(json.dumps(body, indent=1), tmp, bin_dir) + "\n"
                )
        finally:
            subprocess.run([*qp, "serve", "--stop", doc["model"]], env=env, check=True)
        (LOGS / "cpu-tiny-serve.log").write_text(_scrub(Path(doc["log"]).read_text(), tmp, bin_dir))

        # by hand, with a smaller context than planned
        port = _free_port()
        log = tmp / "by-hand.log"
        argv = [str(bin_dir / "llama-server"), "-m", str(model), "-c", "1024", "--port",
                str(port), "--host", "127.0.0.1", "--metrics", "-lv", "4"]  # fmt: skip
        with log.open("wb") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            _wait(base + "/health")
            _get(base + "/completion", json.dumps({"prompt": "Hello", "n_predict": 16}).encode())
            (ENDPOINTS / "cpu-tiny-metrics.txt").write_text(_get(base + "/metrics").decode())
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        (LOGS / "cpu-tiny-c1024.log").write_text(_scrub(log.read_text(), tmp, bin_dir))
    print(f"wrote {LOGS} and {ENDPOINTS}")


if __name__ == "__main__":
    main()
