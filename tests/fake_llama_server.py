"""A fake llama-server for unit tests of `quantpick serve`: an executable that answers `--help` and
`--version` with the recorded b11312 output and otherwise behaves like llama-server's HTTP side.

    binary = fake_llama_server(tmp_path / "bin", load_s=0.5)
    binary = fake_llama_server(tmp_path / "bin", fail="unknown model architecture: 'qwen35moe'")

Serving: it binds --host/--port (like cpp-httplib, with SO_REUSEPORT), answers /health with 503
`Loading model` for `load_s` seconds and 200 afterwards, /v1/chat/completions with a fixed reply
naming --alias, and ends on SIGTERM/SIGINT. With `fail`, it prints llama.cpp's lines for a failed
load and exits 1 after `load_s`. A port it cannot bind: llama.cpp's "couldn't bind" line, exit 1.
`build` replaces the version line's build number (an old build). Every call's argv is appended to
`<dir>/calls.jsonl`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DATA = Path(__file__).parent / "data"

_SCRIPT = """\
#!{python}
import http.server, json, os, signal, socket, sys, threading, time
argv = sys.argv[1:]
with open({calls!r}, "a") as f:
    f.write(json.dumps(argv) + "\\n")

def recorded(name):
    with open(os.path.join({data!r}, name)) as f:
        return "".join(l for l in f if not l.startswith("#"))

if argv == ["--version"]:
    text = recorded("llama-server-version-current.txt")
    if {build!r}:
        text = "version: {build} (0c1e570)\\nbuilt with GNU 12.2.0 for Linux x86_64\\n"
    sys.stderr.write(text)
    sys.exit(0)
if argv == ["--help"]:
    sys.stdout.write(recorded("llama-server-help-current.txt"))
    sys.exit(0)

def value(flag, default=None):
    return argv[argv.index(flag) + 1] if flag in argv else default

host, port, alias = value("--host", "127.0.0.1"), int(value("--port", "8080")), value("--alias")
print("main: loading model", flush=True)
if {fail!r}:
    time.sleep({load_s!r})
    print("llama_model_load: error loading model: " + {fail!r}, flush=True)
    print("llama_model_load_from_file_impl: failed to load model", flush=True)
    print("srv    load_model: failed to load model, '" + str(value("-m")) + "'", flush=True)
    print("srv    operator(): operator(): cleaning up before exit...", flush=True)
    print("main: exiting due to model loading error", flush=True)
    sys.exit(1)

started = time.monotonic()

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if time.monotonic() - started < {load_s!r}:
            self.reply(503, {{"error": {{"message": "Loading model", "code": 503}}}})
        else:
            self.reply(200, {{"status": "ok"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        self.reply(200, {{"model": alias, "choices": [{{"message": {{"role": "assistant",
                   "content": "hi"}}}}]}})

class Server(http.server.ThreadingHTTPServer):
    allow_reuse_address = True
    address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    def server_bind(self):
        if hasattr(socket, "SO_REUSEPORT"):  # as cpp-httplib
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()

try:
    server = Server((host, port), Handler)
except OSError:
    print("srv          start: couldn't bind HTTP server socket, hostname: %s, port: %d"
          % (host, port), flush=True)
    print("srv           main: exiting due to HTTP server error", flush=True)
    sys.exit(1)

def stop(signum, frame):
    print("srv    operator(): operator(): cleaning up before exit...", flush=True)
    threading.Thread(target=server.shutdown).start()

signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
print("main: server is listening on http://%s:%d" % (host, port), flush=True)
server.serve_forever()
sys.exit(0)
"""


def fake_llama_server(
    directory: Path, *, load_s: float = 0.3, fail: str = "", build: int = 0
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "llama-server"
    path.write_text(
        _SCRIPT.format(
            python=sys.executable,
            calls=str(directory / "calls.jsonl"),
            data=str(DATA),
            load_s=load_s,
            fail=fail,
            build=build,
        )
    )
    path.chmod(0o755)
    return path


def calls(directory: Path) -> list[list[str]]:
    path = directory / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
