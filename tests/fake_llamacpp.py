"""Fake llama.cpp tools for unit tests: executables that replay recorded real output.

    tool = fake_fit_params(tmp_path / "bin", routes=[(["-ts", "41,1"], DATA / "llama-fit-params-
        q4km-rpc-41-1.txt")])

A route matches when every one of its words is in the argv; its recording is printed on stdout
without the `#` header lines the recording script wrote. No match: llama.cpp's own error for a
bad argument and exit 1 (so a test that asks for flags nobody recorded fails visibly). Every call
is appended to `<dir>/calls.jsonl`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DATA = Path(__file__).parent / "data"

_SCRIPT = """\
#!{python}
import json, os, signal, sys, time
argv = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps(argv) + "\\n")
if {grandchild!r}:
    # a helper that inherits stdout/stderr and outlives the tool (writes its pid first)
    import subprocess
    helper = subprocess.Popen(["sleep", "300"])
    with open({grandchild!r}, "w") as f:
        f.write(str(helper.pid))
if {flood!r}:
    while True:
        sys.stdout.write("Host 1 2 3\\n" * 4096)
time.sleep({sleep!r})
if {reject_jsonl!r} and "--log-jsonl" in argv:
    sys.stderr.write("error: invalid argument: --log-jsonl\\n")
    sys.exit(1)
if {stdout_file!r}:
    with open({stdout_file!r}) as f:
        sys.stdout.write("".join(l for l in f if not l.startswith("#")))
    sys.stdout.flush()
if {stderr_file!r}:
    with open({stderr_file!r}) as f:
        sys.stderr.write("".join(l for l in f if not l.startswith("#")))
    if {exit_code!r} < 0:
        os.kill(os.getpid(), -{exit_code!r})
    sys.exit({exit_code!r})
if {version_text!r} and argv == ["--version"]:
    sys.stderr.write({version_text!r})
    sys.exit(0)
for words, path in {routes!r}:
    if all(w in argv for w in words):
        with open(path) as f:
            sys.stdout.write("".join(l for l in f if not l.startswith("#")))
        sys.exit(0)
sys.stderr.write("error: invalid argument: no recording for " + " ".join(argv) + "\\n")
sys.exit(1)
"""


def fake_tool(
    directory: Path,
    name: str,
    *,
    routes: list[tuple[list[str], Path]] = (),  # type: ignore[assignment]
    sleep: float = 0.0,
    stderr_file: Path | None = None,
    exit_code: int = 0,
    reject_jsonl: bool = False,
    version_text: str = "",
    stdout_file: Path | None = None,  # printed before stderr_file and its exit code
    flood: bool = False,  # print on stdout without end
    grandchild: Path | None = None,  # start a helper holding stdout; its pid is written here
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(
        _SCRIPT.format(
            python=sys.executable,
            log=str(directory / "calls.jsonl"),
            sleep=sleep,
            reject_jsonl=reject_jsonl,
            stderr_file=str(stderr_file) if stderr_file else "",
            stdout_file=str(stdout_file) if stdout_file else "",
            flood=flood,
            grandchild=str(grandchild) if grandchild else "",
            exit_code=exit_code,
            version_text=version_text,
            routes=[(list(w), str(p)) for w, p in routes],
        )
    )
    path.chmod(0o755)
    return path


def calls(directory: Path) -> list[list[str]]:
    log = directory / "calls.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def fixture(name: str) -> Path:
    return DATA / f"llama-fit-params-{name}.txt"


CURRENT_VERSION = "version: 0.5.0-dev (build 11312, commit 0c1e57098)\n"
