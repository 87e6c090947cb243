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
        "quantpick.serve.script_file.write_script",
        _raise(OSError(errno.EROFS, "Read-only file system", str(target))),
    )
    gguf = tmp_path / "m.gguf"
    from conformance_model import write_conformance_gguf

    write_conformance_gguf(gguf)
    result = runner.invoke(
        app,
        ["command", "--gguf", str(gguf), "-c", "4096", "--cpu-only", "--ram", "64GB",
         "--script", str(target)],
    )  # fmt: skip
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
    "calibration": ["calibration", "show"],  # nothing stored in the test home
    "serve": ["serve", "--gguf", "/no/such/model.gguf", "-c", "8192"],
    "check": ["check", "ftp://not-a-llama-server"],
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


# ---- click's own usage errors: one line and a hint (issue 21) ---------------------------------


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (["pick", MODEL, "-np", "x"], "Invalid value for '-np' / '--parallel': 'x' is not a valid",
         "see `quantpick pick --help`"),
        (["pick", MODEL, "--gguf", "x.gguf"], "No such option: --gguf",
         "see `quantpick pick --help`"),
        (["pikc"], "No such command 'pikc'. Did you mean 'pick'?", "see `quantpick --help`"),
        (["--bogus"], "No such option: --bogus", "see `quantpick --help`"),
        (["manifest", "add"], "Missing argument", "see `quantpick manifest add --help`"),
        (["pick", MODEL, "-c", "1e6"], "Invalid value for '-c' / '--ctx-size': cannot read '1e6'",
         "write e.g. 131072, 128K or 1M (K = 1024 tokens)"),
        (["bench", "--depth", "64.3K"], "Invalid value for '--depth': '64.3K' is not a whole",
         "128K"),
    ],
)  # fmt: skip
def test_click_usage_errors_are_one_line_with_a_hint(
    args: list[str], message: str, hint: str
) -> None:
    """click printed usage, a blank line, the error and "Try ..." (four lines), no hint."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("Error: ") and message in lines[0]
    assert lines[1].startswith("Hint: ") and hint in lines[1]


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("64K", 65536), ("128k", 131072), ("1M", 1048576), ("131072", 131072), ("0", 0),
     ("1.5K", 1536), (" 32K ", 32768)],
)  # fmt: skip
def test_contexts_are_read_as_llamacpp_users_write_them(text: str, tokens: int) -> None:
    from quantpick.units import parse_context

    assert parse_context(text) == tokens


def test_every_command_taking_a_context_accepts_128k() -> None:
    """-c 128K is 131072 wherever a context is taken (same plan as -c 131072)."""
    a = runner.invoke(app, ["pick", MODEL, "-c", "128K", "--gpu", "3090", "--json"])
    b = runner.invoke(app, ["pick", MODEL, "-c", "131072", "--gpu", "3090", "--json"])
    assert a.exit_code == b.exit_code == 0, a.stderr
    assert json.loads(a.stdout)["config"] == json.loads(b.stdout)["config"]
    from quantpick.cli.option_table import CtxOpt

    walked = _all_commands()
    takes_c = [name for name, cmd in walked.items() if "-c" in _options(cmd)]
    assert takes_c, "no command takes -c?"
    for name in takes_c:
        (param,) = [p for p in walked[name].params if "-c" in getattr(p, "opts", ())]
        assert param.type.convert("128K", param, None) == 131072, name
    assert CtxOpt  # the shared declaration every one of them uses


# ---- hints name only options the command has (issue 21) ---------------------------------------


def _all_commands() -> dict[str, object]:
    """'pick' -> its click command, 'manifest add' -> ..., for every command of the app."""
    import typer.main

    root = typer.main.get_command(app)
    found: dict[str, object] = {}

    def walk(group: object, prefix: str) -> None:
        for name, cmd in getattr(group, "commands", {}).items():
            if getattr(cmd, "commands", None):
                walk(cmd, f"{prefix}{name} ")
            else:
                found[f"{prefix}{name}"] = cmd

    walk(root, "")
    return found


def _options(cmd: object) -> set[str]:
    from quantpick.cli.core import command_options

    return command_options(cmd)


def _error_texts() -> list[tuple[str, str]]:
    """(where, text) of every string literal in quantpick/ that is a hint or the message of an
    error being raised (f-strings by their literal parts)."""
    import ast

    root = Path(__file__).resolve().parents[2] / "quantpick"
    texts: list[tuple[str, str]] = []

    def literal(node: ast.AST) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(literal(v) for v in node.values)
        if isinstance(node, ast.BinOp):
            return literal(node.left) + literal(node.right)
        return " "

    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            parts = [k.value for k in node.keywords if k.arg == "hint"]
            if name.endswith("Error") and node.args:
                parts.append(node.args[0])
            for part in parts:
                texts.append((f"{path.relative_to(root.parent)}:{node.lineno}", literal(part)))
    return texts


def test_every_option_an_error_or_hint_names_exists() -> None:
    """Walks typer's commands and every hint and error text in the source: a flag named there
    must be an option of some command (a renamed or invented flag fails here)."""
    from quantpick.cli.core import flags_named

    every = set().union(*(_options(cmd) for cmd in _all_commands().values()))
    texts = _error_texts()
    assert len(texts) > 100  # the walk sees the source's errors
    missing = [
        (where, flag) for where, text in texts for flag in flags_named(text) if flag not in every
    ]
    assert not missing


def test_a_hint_naming_an_option_the_command_lacks_is_not_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--offline` was offered on `download`, which has no such option."""
    from quantpick.hub.http import UnreachableError

    monkeypatch.setattr(
        "quantpick.model.registry.find_manifest", _raise(UnreachableError("huggingface.co"))
    )
    download = runner.invoke(app, ["download", MODEL, "--quant", "Q4_K_M"])
    assert download.exit_code == 5
    assert "--offline" not in download.stderr
    assert download.stderr.splitlines()[-1] == "Hint: see `quantpick download --help`"
    pick = runner.invoke(app, ["pick", MODEL, "-c", "8192", "--gpu", "3090"])
    assert pick.exit_code == 5 and "Hint: --offline plans from the manifest" in pick.stderr


@pytest.mark.parametrize(("command", "offers_gguf"), [("pick", False), ("estimate", True)])
def test_give_a_model_offers_gguf_only_where_it_exists(command: str, offers_gguf: bool) -> None:
    """`pick` said "give a MODEL ... or --gguf PATH"; pick has no --gguf."""
    result = runner.invoke(app, [command, "--gpu", "3090"])
    assert result.exit_code == 2
    error = next(line for line in result.stderr.splitlines() if line.startswith("Error:"))
    assert error.startswith("Error: give a MODEL")
    assert ("--gguf" in result.stderr) is offers_gguf


# ---- a path the user gave that is plainly wrong: exit 2, as README's table says (issue 21) ----


@pytest.mark.parametrize(
    "args",
    [
        ["estimate", "--gguf", "/no/such/model.gguf", "-c", "8192", "--gpu", "3090"],
        ["command", "--gguf", "/no/such/model.gguf", "-c", "8192", "--gpu", "3090"],
        ["confirm", "--gguf", "/no/such/model.gguf", "-c", "8192"],
        ["pick", MODEL, "-c", "8192", "--hardware", "/no/such/box.toml"],
        ["probe", "--hardware", "/no/such/box.json"],
    ],
    ids=lambda a: f"{a[0]} {a[1] if a[1].startswith('-') else a[-2]}",
)
def test_a_missing_file_given_on_the_command_line_is_exit_2(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.splitlines()[-1].startswith("Error: ")


def test_a_read_only_dir_is_exit_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`get --dir /read-only` exited 1: the directory error did not say which path it was."""
    from quantpick.fetch import download_dir

    target = tmp_path / "ro"
    target.mkdir()
    real_access = os.access
    with monkeypatch.context() as patch, pytest.raises(download_dir.LocalFileError) as info:
        # root writes anywhere: play a read-only mount (os.access says no, statvfs says ro)
        patch.setattr(download_dir, "_read_only", lambda directory: True)
        patch.setattr(
            download_dir.os, "access", lambda p, m: Path(p) != target and real_access(p, m)
        )
        download_dir.make_dir(target)
    assert info.value.path == str(target) and info.value.os_errno == errno.EROFS

    monkeypatch.setattr(
        "quantpick.model.registry.find_manifest", _raise(info.value)
    )  # the same error, raised where download meets it first
    result = runner.invoke(app, ["download", MODEL, "--quant", "Q4_K_M", "--dir", str(target)])
    assert result.exit_code == 2, result.stderr
    assert "Read-only file system" in result.stderr
    # The same error about a path the user did not give stays exit 1.
    elsewhere = runner.invoke(app, ["download", MODEL, "--quant", "Q4_K_M"])
    assert elsewhere.exit_code == 1


def test_a_config_nested_5000_deep_or_with_a_nul_path_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setenv("QUANTPICK_CONFIG", str(config))
    for text, problem in (
        ("a = " + "[" * 5000 + "]" * 5000, "nested deeper than 64 levels"),
        ('[stores]\nollama = "/srv/a\\u0000b"\n', "cannot contain a NUL byte"),
    ):
        config.write_text(text)
        result = runner.invoke(app, ["download", MODEL, "--quant", "Q4_K_M", "--dry-run"])
        assert result.exit_code == 1, result.stderr
        (line, *_) = result.stderr.splitlines()
        assert line.startswith(f"Error: {config}") and problem in line
        assert "Traceback" not in result.stderr


def test_a_string_bandwidth_in_a_probe_json_file_is_one_line(tmp_path: Path) -> None:
    box = tmp_path / "box.json"
    probed = runner.invoke(app, ["probe", "--gpu", "3090", "--ram", "64G", "--json"])
    doc = json.loads(probed.stdout)
    doc["machine"]["gpus"][0]["bandwidth_bytes_per_s"] = "936GB/s"
    box.write_text(json.dumps(doc))
    result = runner.invoke(app, ["pick", MODEL, "-c", "8192", "--hardware", str(box)])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"Error: hardware file {box}: gpus[0].bandwidth_bytes_per_s is '936GB/s': a bandwidth "
        "is a whole number of bytes/s, more than 0 and at most 1e+14 (100 TB/s)"
    ]
