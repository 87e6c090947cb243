"""`quantpick download` / `quantpick verify`, in-process (CliRunner) and as a real subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakehub import SMALL_ARCH_TOML, FakeHub, gguf_bytes, sha256sums
from typer.testing import CliRunner

import quantpick.cli.download  # noqa: F401 - registers the commands
from quantpick.cli import app

MODEL = "Tiny-Q4_K_M.gguf"
PROJ = "mmproj-F16.gguf"
DATA = gguf_bytes(400_000, seed=3)
PDATA = gguf_bytes(100_000, seed=4)


def write_manifest(directory: Path, hub: FakeHub, files: dict[str, bytes]) -> None:
    """A TOML manifest `tiny-test` for org/tiny, found through QUANTPICK_MANIFESTS."""
    directory.mkdir(parents=True, exist_ok=True)
    parts = [
        'schema = 1\nid = "tiny-test"\ndisplay_name = "Tiny"\nchecksums_file = "SHA256SUMS"\n',
        SMALL_ARCH_TOML,
        '[[sources]]\nkind = "hf"\nrepo = "org/tiny"\n',
        '[[sources]]\nkind = "modelscope"\nrepo = "org/tiny"\n',
        '[[sources]]\nkind = "mirror"\nname = "lan"\n'
        f'url_template = "{hub.mirror_base}/org/tiny/{{file}}"\n',
    ]
    for name, data in files.items():
        role = 'role = "mmproj"' if name.startswith("mmproj") else "quality_rank = 1"
        quant = "F16" if name.startswith("mmproj") else "Q4_K_M"
        parts.append(
            f'[[files]]\nname = "{name}"\nquant = "{quant}"\nsize_bytes = {len(data)}\n'
            f"size_exact = true\n{role}\n"
        )
    (directory / "tiny-test.toml").write_text("\n".join(parts))


@pytest.fixture
def tiny(fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    files = {MODEL: DATA, PROJ: PDATA}
    fake_hub.add_repo("org/tiny", {**files, "SHA256SUMS": sha256sums(files)})
    write_manifest(tmp_path / "manifests", fake_hub, files)
    monkeypatch.setenv("QUANTPICK_MANIFESTS", str(tmp_path / "manifests"))
    return fake_hub


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_download_json_with_vision(tiny: FakeHub, tmp_path: Path) -> None:
    code, out, err = run(
        "download",
        "tiny-test",
        "--quant",
        "Q4_K_M",
        "--vision",
        "--dir",
        str(tmp_path / "d"),
        "--json",
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"].startswith("hf:org/tiny@")
    assert {f["name"]: f["verified"] for f in doc["files"]} == {MODEL: True, PROJ: True}
    assert (tmp_path / "d" / MODEL).read_bytes() == DATA
    assert "Using hf:org/tiny@" in err  # non-TTY: plain lines on stderr
    code, out, _ = run("verify", str(tmp_path / "d"), "--json")
    assert code == 0 and json.loads(out)["ok"] is True


def test_default_dir_is_models_dir_slash_manifest_id(
    tiny: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUANTPICK_MODELS_DIR", str(tmp_path / "models"))
    code, out, err = run("download", "tiny-test", "--quant", "Q4_K_M", "--quiet")
    assert code == 0, err
    assert out.strip() == str(tmp_path / "models" / "tiny-test" / MODEL)
    assert err == ""


def test_dry_run_json_fetches_nothing(tiny: FakeHub, tmp_path: Path) -> None:
    code, out, err = run(
        "download",
        "tiny-test",
        "--quant",
        "Q4_K_M",
        "--dir",
        str(tmp_path / "d"),
        "--source",
        "modelscope",
        "--dry-run",
        "--json",
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["dry_run"] and doc["source"] == "modelscope:org/tiny@master"
    assert doc["bytes_to_fetch"] == len(DATA) and doc["enough_space"] is True
    assert doc["files"][0]["url"].startswith(tiny.ms_endpoint)
    assert not (tmp_path / "d").exists()
    assert tiny.requests_for(MODEL) == []


def test_flipped_byte_exits_4(tiny: FakeHub, tmp_path: Path) -> None:
    tiny.faults.add(MODEL, "flip", at=1000, times=None)
    code, _, err = run("download", "tiny-test", "--quant", "Q4_K_M", "--dir", str(tmp_path))
    assert code == 4
    assert "does not match" in err and "expected from" in err
    assert not (tmp_path / MODEL).exists()


def test_bad_source_is_usage_error(tiny: FakeHub) -> None:
    code, _, err = run("download", "tiny-test", "--quant", "Q4_K_M", "--source", "ftp")
    assert code == 2 and "--source" in err


def test_verify_reports_mismatch_with_exit_4(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"GGUF a")
    (tmp_path / "b.gguf").write_bytes(b"GGUF b")
    sums = sha256sums({"a.gguf": b"GGUF a", "b.gguf": b"GGUF other", "gone.gguf": b"x"})
    (tmp_path / "SHA256SUMS").write_bytes(sums)
    code, out, err = run("verify", str(tmp_path))
    assert code == 4
    assert out.splitlines() == ["a.gguf: OK", "b.gguf: FAILED"]
    assert "1 of 2" in err


def test_verify_without_checksums_or_files(tmp_path: Path) -> None:
    code, _, err = run("verify", str(tmp_path))
    assert code == 1 and "no SHA256SUMS" in err
    (tmp_path / "SHA256SUMS").write_text(f"{'a' * 64}  x.gguf\n")
    code, _, err = run("verify", str(tmp_path))
    assert code == 1 and "none of the files" in err


def test_verify_a_directory_that_is_not_there(tmp_path: Path) -> None:
    code, _, err = run("verify", str(tmp_path / "does-not-exist"))
    assert (
        code == 2
        and err.splitlines()[0] == f"Error: {tmp_path / 'does-not-exist'}: no such directory"
    )
    (tmp_path / "file").write_text("")
    code, _, err = run("verify", str(tmp_path / "file"))
    assert code == 2 and "is a file" in err  # click checks file_okay=False itself


def test_verify_refuses_hostile_checksums(tmp_path: Path) -> None:
    (tmp_path / "SHA256SUMS").write_text(f"{'a' * 64}  ../x.gguf\n")
    code, _, err = run("verify", str(tmp_path))
    assert code == 4 and "refusing" in err


def test_sigkill_mid_file_then_rerun_resumes(
    fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = gguf_bytes(12 * 1024 * 1024, seed=5)
    fake_hub.add_repo("org/tiny", {MODEL: big, "SHA256SUMS": sha256sums({MODEL: big})})
    write_manifest(tmp_path / "manifests", fake_hub, {MODEL: big})
    monkeypatch.setenv("QUANTPICK_MANIFESTS", str(tmp_path / "manifests"))
    fake_hub.faults.add(MODEL, "throttle", rate=4 * 1024 * 1024)
    dest = tmp_path / "d"
    part = dest / f"{MODEL}.part"
    # `python -m quantpick`, plus an explicit import of the command module (registration in
    # quantpick/cli/__init__.py is the lead's; harmless once it is there).
    bootstrap = "import quantpick.cli.download; from quantpick.cli import main; main()"
    argv = [
        sys.executable,
        "-c",
        bootstrap,
        "download",
        "tiny-test",
        "--quant",
        "Q4_K_M",
        "--dir",
        str(dest),
        "--quiet",
    ]
    kill_at = random.randint(2, 6) * 1024 * 1024
    proc = subprocess.Popen(
        argv, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while not (part.exists() and part.stat().st_size >= kill_at):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = part.stat().st_size
    assert 0 < kept < len(big) and not (dest / MODEL).exists()
    assert json.loads((dest / f"{MODEL}.part.json").read_text())["size"] == len(big)

    rerun = subprocess.run(argv, env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert (
        hashlib.sha256((dest / MODEL).read_bytes()).hexdigest() == hashlib.sha256(big).hexdigest()
    )
    ranges = [r["range"] for r in fake_hub.requests_for(MODEL) if r["server"] == "cdn"]
    assert ranges == [None, f"bytes={kept}-"]
    assert not part.exists()


def test_progress_bars_on_a_terminal_lines_elsewhere_nothing_when_quiet(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import io

    from quantpick.cli.download import LineProgress, RichProgress, transfer_progress
    from quantpick.fetch.progress import DownloadResult, NullProgress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    result = DownloadResult(
        "m.gguf", tmp_path / "m.gguf", 3 << 20, "ab" * 32, True, 3 << 20, 0, "hf:org/repo", False
    )

    def drive(stream: io.StringIO, quiet: bool) -> tuple[object, str]:
        monkeypatch.setattr(sys, "stderr", stream)
        sink, live = transfer_progress(quiet)
        with live:
            sink.total_started(1, 3 << 20)
            sink.file_started("m.gguf", 3 << 20, 0)
            sink.advance("m.gguf", 3 << 20)
            sink.file_finished("m.gguf", result)
        return sink, stream.getvalue()

    sink, shown = drive(Tty(), quiet=False)
    assert isinstance(sink, RichProgress)
    assert "m.gguf" in shown and "total (1 files)" in shown and "3.0/3.0 MiB" in shown
    sink, shown = drive(io.StringIO(), quiet=False)
    assert type(sink) is LineProgress
    assert shown.splitlines() == [
        "1 file(s), 3.00 MiB to fetch",
        "Downloading m.gguf (3.00 MiB)",
        "Done m.gguf: 3.00 MiB fetched, sha256 verified",
    ]
    sink, shown = drive(Tty(), quiet=True)
    assert isinstance(sink, NullProgress) and shown == ""


# -- reuse from other tools' stores, and --hf-cache --------------------------------------------


def ollama_blob(data: bytes) -> Path:
    """`ollama pull` leaves the GGUF as blobs/sha256-<hex> (OLLAMA_MODELS: tests/conftest.py)."""
    blob = (
        Path(os.environ["OLLAMA_MODELS"]) / "blobs" / f"sha256-{hashlib.sha256(data).hexdigest()}"
    )
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    return blob


def test_dry_run_json_reports_what_would_be_reused(tiny: FakeHub, tmp_path: Path) -> None:
    blob = ollama_blob(DATA)
    args = ["download", "tiny-test", "--quant", "Q4_K_M", "--dir", str(tmp_path / "d")]
    code, out, err = run(*args, "--dry-run", "--json")
    assert code == 0, err
    doc = json.loads(out)
    (entry,) = doc["files"]
    assert entry["reuse"] == {
        "store": "ollama",
        "path": str(blob),
        "match": "sha256",
        "verified": False,
        "action": "hardlink",
        "why": entry["reuse"]["why"],
    }
    # Not verified yet: counted as to fetch, and as to hash first (it said "0 B to fetch").
    size = len(DATA)
    assert (entry["bytes_to_fetch"], entry["bytes_to_verify"]) == (size, size)
    assert (doc["bytes_to_fetch"], doc["bytes_to_verify"]) == (size, size)
    assert doc["bytes_to_fetch_if_verified"] == 0
    assert doc["reuse_from"]["origin"] == "default" and "ollama" in doc["reuse_from"]["stores"]
    assert tiny.requests_for(MODEL) == []

    code, out, err = run(*args, "--dry-run")  # the human form says the same
    assert code == 0, err
    assert f"would reuse {blob} (ollama; not verified yet" in out
    assert "(0 B if the store copies verify:" in out and "to hash first)" in out


def test_download_reuses_and_reports_it(tiny: FakeHub, tmp_path: Path) -> None:
    blob = ollama_blob(DATA)
    dest = tmp_path / "d"
    code, out, err = run("download", "tiny-test", "--quant", "Q4_K_M", "--dir", str(dest), "--json")
    assert code == 0, err
    (entry,) = json.loads(out)["files"]
    assert entry["reuse"]["store"] == "ollama" and entry["reuse"]["action"] == "hardlink"
    assert entry["reuse"]["verified"] is True and entry["bytes_fetched"] == 0
    assert f"Reusing {MODEL} from ollama ({blob})" in err and f"Verifying {MODEL} in ollama" in err
    assert os.path.samefile(dest / MODEL, blob) and tiny.requests_for(MODEL) == []
    code, out, _ = run("verify", str(dest))
    assert code == 0 and out.strip() == f"{MODEL}: OK"


@pytest.mark.parametrize(
    ("flags", "env", "config"),
    [
        (["--no-reuse"], {}, None),
        (["--reuse-from", "hf,lmstudio"], {}, None),
        ([], {"QUANTPICK_REUSE": "none"}, None),
        ([], {}, 'reuse = ["hf"]\n'),
        (["--no-reuse"], {"QUANTPICK_REUSE": "ollama"}, None),  # flag > env
    ],
)
def test_reuse_off_or_elsewhere_downloads(
    tiny: FakeHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    env: dict[str, str],
    config: str | None,
) -> None:
    ollama_blob(DATA)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if config is not None:
        path = tmp_path / "config.toml"
        path.write_text(config)
        monkeypatch.setenv("QUANTPICK_CONFIG", str(path))
    dest = tmp_path / "d"
    code, out, err = run("download", "tiny-test", "--quant", "Q4_K_M", "--dir", str(dest), *flags)
    assert code == 0, err
    assert (
        "Reusing" not in err
        and len([r for r in tiny.requests_for(MODEL) if r["server"] == "cdn"]) == 1
    )


def test_reuse_flag_wins_over_env_none(
    tiny: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ollama_blob(DATA)
    monkeypatch.setenv("QUANTPICK_REUSE", "none")
    code, _, err = run(
        "download", "tiny-test", "--quant", "Q4_K_M", "--dir", str(tmp_path), "--reuse"
    )
    assert code == 0, err
    assert "Reusing" in err and tiny.requests_for(MODEL) == []


def test_bad_reuse_from_is_a_usage_error(tiny: FakeHub) -> None:
    code, _, err = run("download", "tiny-test", "--quant", "Q4_K_M", "--reuse-from", "vllm")
    assert code == 2 and "'vllm' is not a store" in err


def test_download_hf_cache(tiny: FakeHub, tmp_path: Path) -> None:
    from huggingface_hub import try_to_load_from_cache

    code, out, err = run("download", "tiny-test", "--quant", "Q4_K_M", "--hf-cache", "--json")
    assert code == 0, err
    doc = json.loads(out)
    hub_dir = Path(doc["hf_cache"]["cache_dir"])
    assert hub_dir == Path(os.environ["HF_HOME"]) / "hub"
    (entry,) = doc["files"]
    assert entry["path"] == try_to_load_from_cache("org/tiny", MODEL, cache_dir=hub_dir)
    assert Path(entry["path"]).read_bytes() == DATA
    code, _, err = run("download", "tiny-test", "--quant", "Q4_K_M", "--hf-cache", "--dir", "x")
    assert code == 2 and "--dir" in err


def test_hashing_a_candidate_shows_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from quantpick.cli.download import LineProgress, RichProgress, transfer_progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    def drive(stream: io.StringIO) -> tuple[object, str]:
        monkeypatch.setattr(sys, "stderr", stream)
        sink, live = transfer_progress(False)
        with live:
            sink.hash_started("m.gguf in ollama", 4 << 20)
            sink.hash_advance("m.gguf in ollama", 4 << 20)
            sink.hash_finished("m.gguf in ollama")
        return sink, stream.getvalue()

    sink, shown = drive(Tty())
    assert isinstance(sink, RichProgress) and "sha256 m.gguf in ollama" in shown
    sink, shown = drive(io.StringIO())
    assert type(sink) is LineProgress
    assert shown.splitlines() == ["Verifying m.gguf in ollama: hashing 4.00 MiB"]


def test_connections_is_checked_and_the_json_says_how_it_went(
    tiny: FakeHub, tmp_path: Path
) -> None:
    code, _, err = run("download", "tiny-test", "--quant", "Q4_K_M", "--connections", "0")
    assert code == 2
    assert err.splitlines()[0] == (
        "Error: --connections must be a whole number from 1 to 64, not 0"
    )
    code, out, err = run(
        "download", "tiny-test", "--quant", "Q4_K_M", "--dir", str(tmp_path / "d"),
        "--connections", "8", "--json",
    )  # fmt: skip
    assert code == 0, err
    (entry,) = json.loads(out)["files"]
    # 400 kB is below the segmented threshold: one connection, and its rate
    assert entry["connections"] == 1 and entry["bytes_fetched"] == len(DATA)
    assert entry["seconds"] > 0 and entry["rate_bytes_per_s"] > 0


def test_connection_count_on_a_terminal_nothing_on_a_pipe(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import io

    from quantpick.cli.download import LineProgress, transfer_progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    sink, live = transfer_progress(False)
    with live:
        sink.file_started("m.gguf", 8 << 20, 0)
        sink.connections("m.gguf", 4)  # type: ignore[attr-defined]
        sink.advance("m.gguf", 4 << 20)
    assert "m.gguf (4 connections)" in sys.stderr.getvalue()
    # On a pipe the sink has no connection count to show: the engine finds no method to call.
    assert not hasattr(LineProgress(), "connections")
