"""The CLI boundary (quantpick/cli/core.py): OS errors, closed pipes, full disks and --json
failures become one line and a documented exit code, never a traceback."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from quantpick.cli import app

runner = CliRunner()
MODEL = "qwen3.8-35b-a3b-distill"
PICK = ["pick", MODEL, "-c", "8192", "--gpu", "3090", "--offline"]


def _raise(exc: BaseException):  # type: ignore[no-untyped-def]
    def boom(*_args: object, **_kwargs: object) -> None:
        raise exc

    return boom


@pytest.mark.parametrize(
    ("err", "strerror"),
    [
        (errno.ENAMETOOLONG, "File name too long"),
        (errno.EROFS, "Read-only file system"),
        (errno.ENOSPC, "No space left on device"),
        (errno.EISDIR, "Is a directory"),
    ],
)
def test_os_error_is_one_line(monkeypatch: pytest.MonkeyPatch, err: int, strerror: str) -> None:
    """An OSError from deep inside a command: `Error: <strerror>: <path>`, exit 1 (the path did
    not come from the command line)."""
    path = "/models/" + "x" * 300 + ".gguf"
    monkeypatch.setattr(
        "quantpick.model.registry.find_manifest", _raise(OSError(err, strerror, path))
    )
    result = runner.invoke(app, ["show", MODEL])
    assert result.exit_code == 1
    assert result.stderr == f"Error: {strerror}: {path}\n"
    assert "Traceback" not in result.output


def test_os_error_on_a_path_the_user_gave_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`--script /read-only/dir/serve.sh` (EROFS on a path from a flag): exit 2."""
    target = tmp_path / "ro" / "serve.sh"
    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(
        "quantpick.serve.command.write_script",
        _raise(OSError(errno.EROFS, "Read-only file system", str(target))),
    )
    gguf = tmp_path / "m.gguf"
    from conformance_model import write_conformance_gguf

    write_conformance_gguf(gguf)
    result = runner.invoke(
        app, ["command", "--gguf", str(gguf), "-c", "4096", "--cpu-only", "--script", str(target)]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == f"Error: Read-only file system: {target}"


def test_os_error_with_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTPICK_DEBUG", "1")
    monkeypatch.setattr(
        "quantpick.model.registry.find_manifest",
        _raise(OSError(errno.EIO, "Input/output error", "/dev/sdz")),
    )
    result = runner.invoke(app, ["show", MODEL])
    assert result.exit_code == 1
    assert "Traceback" in result.stderr
    assert result.stderr.splitlines()[-1] == "Error: Input/output error: /dev/sdz"


def test_json_failure_prints_an_error_document(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "quantpick.model.registry.find_manifest",
        _raise(OSError(errno.ENOSPC, "No space left on device", "/x")),
    )
    result = runner.invoke(app, ["show", MODEL, "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc == {
        "schema_version": 1,
        "error": {
            "message": "No space left on device: /x",
            "hint": None,
            "exit_code": 1,
            "type": "OSError",
        },
    }


def test_click_usage_errors_get_the_json_document_too() -> None:
    result = runner.invoke(app, ["pick", MODEL, "--no-such-flag", "--json"])
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["error"]["exit_code"] == 2 and "--no-such-flag" in doc["error"]["message"]


def test_wants_json() -> None:
    from quantpick.cli.core import _wants_json

    assert _wants_json(["pick", "m", "--json"])
    assert _wants_json(["get", "m", "--format", "json"]) and _wants_json(["--format=json"])
    assert not _wants_json(["get", "m", "--format", "line"])
    assert not _wants_json(["get", "m", "--", "--json"])


def test_given_by_user(tmp_path: Path) -> None:
    from quantpick.cli.core import _given_by_user

    assert _given_by_user(str(tmp_path / "a" / "b.gguf"), ["get", "--dir", str(tmp_path / "a")])
    assert _given_by_user(str(tmp_path / "s.sh"), [f"--script={tmp_path / 's.sh'}"])
    assert not _given_by_user("/etc/passwd", ["get", "--dir", str(tmp_path)])


# ---- real processes: closed pipes and full disks are properties of file descriptors ----------


def _cli(args: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, "QUANTPICK_OFFLINE": "1", "NO_COLOR": "1"}
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        [sys.executable, "-m", "quantpick", *args], env=env, **kwargs
    )


# A command's result, its JSON, and what click prints before any command runs.
OUTPUTS = [PICK, [*PICK, "--json"], ["--help"], ["--version"], ["pick", "--help"]]


@pytest.mark.parametrize("args", OUTPUTS, ids=" ".join)
def test_closed_stdout_ends_quietly_with_the_commands_code(args: list[str]) -> None:
    """`quantpick pick ... | head -1`: the reader leaves early; exit 0, nothing on stderr but the
    command's own notes."""
    proc = _cli(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the child writes anything: every write sees EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "Error" not in err and "Exception ignored" not in err


def test_closed_stdout_keeps_a_failing_code() -> None:
    """A closed pipe does not hide a failure: nothing fits -> still exit 3."""
    proc = _cli([*PICK[:-1], "--ram", "1G", "--cpu-only", "--offline"], stdout=subprocess.PIPE,
                stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.read()
    assert proc.wait(timeout=120) == 3


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", OUTPUTS, ids=" ".join)
def test_full_disk_on_stdout_is_one_line(args: list[str]) -> None:
    with open("/dev/full", "wb") as full:
        proc = _cli(args, stdout=full, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "Exception ignored" not in err
    errors = [line for line in err.splitlines() if line.startswith("Error")]
    assert errors == ["Error: cannot write the output: No space left on device: <stdout>"]


# Every command, failing, with --json: stdout is exactly one JSON document with the exit code.
FAILING = {
    "probe": ["probe", "--hardware", "/no/such/box.json"],
    "models": ["models", "--no-such-flag"],
    "show": ["show", "no-such-model"],
    "estimate": ["estimate", MODEL],  # no --quant
    "pick": ["pick", MODEL, "-c", "1"],
    "max-context": ["max-context", "no-such-model"],
    "download": ["download", "no-such-model", "--quant", "Q4_K_M"],
    "verify": ["verify", "/no/such/dir"],
    "command": ["command", MODEL, "-c", "8192"],  # no --quant
    "get": ["get", MODEL, "-c", "8192", "--gpu", "3090", "--script", "/no/such/dir/s.sh"],
    "manifest": ["manifest", "check", "/no/such/manifest.toml"],
    "confirm": ["confirm", "--gguf", "/no/such/model.gguf", "-c", "8192"],
    "bench": ["bench", "--gguf", "/no/such/model.gguf", "-c", "8192"],
    "serve": ["serve", "--gguf", "/no/such/model.gguf", "-c", "8192"],
}


def test_every_command_failing_with_json_prints_one_error_document() -> None:
    from quantpick.cli import COMMAND_MODULE

    assert set(FAILING) == set(COMMAND_MODULE), "add a failing case for each command"
    for name, args in FAILING.items():
        result = runner.invoke(app, [*args, "--json"])
        assert result.exit_code != 0, name
        doc = json.loads(result.stdout)  # exactly one document: json.loads refuses trailing data
        error = doc["error"]
        assert doc["schema_version"] == 1 and error["exit_code"] == result.exit_code, name
        assert error["message"] and error["type"], name
        assert f"Error: {error['message']}" in result.stderr, name


def test_manifest_add_failing_with_json() -> None:
    result = runner.invoke(app, ["manifest", "add", "org/x", "--source", "gitlab", "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"]["exit_code"] == 2
