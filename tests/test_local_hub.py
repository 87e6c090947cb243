"""scripts/local_hub.py: serves a loadable tiny model (the README's get session replays against
it), says in --help all it does, takes --port 0, and leaves no files behind."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from quantpick.cli import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import local_hub  # noqa: E402


def test_help_is_the_whole_description(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        local_hub.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--tiny" in out and "removed when it stops" in out and "--port PORT" in out


def test_port_0_is_accepted_and_a_bad_port_refused() -> None:
    assert local_hub.parse_args(["--port", "0"]).port == 0
    with pytest.raises(SystemExit):
        local_hub.parse_args(["--port", "70000"])


def test_the_tiny_model_is_served_downloadable_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=local_hub.main, args=(["--tiny", "--port", "0"],),
        kwargs={"ready": ready, "stop": stop}, daemon=True,
    )  # fmt: skip
    thread.start()
    try:
        assert ready.wait(60)
        out = capsys.readouterr().out
        export = next(ln for ln in out.splitlines() if ln.startswith("export HF_ENDPOINT="))
        endpoint = export.split()[1].removeprefix("HF_ENDPOINT=")
        assert "serving org/Tiny-GGUF: Tiny-Qwen35MoE-Q8_0.gguf (loadable)" in out
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        runner = CliRunner()
        added = runner.invoke(app, ["manifest", "add", "org/Tiny-GGUF", "--id", "tiny"])
        assert added.exit_code == 0, added.stderr
        got = runner.invoke(app, ["get", "tiny", "-c", "8192", "--cpu-only", "--no-confirm",
                                  "--dir", str(tmp_path / "models")])  # fmt: skip
        assert got.exit_code == 0, got.stderr
        assert "sha256 verified" in got.stderr
        assert (tmp_path / "models" / "Tiny-Qwen35MoE-Q8_0.gguf").stat().st_size > 1 << 20
        assert any(scratch.iterdir())  # its files, while it serves
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert list(scratch.iterdir()) == []  # no sparse files left behind
