"""`quantpick get`: the whole pipeline against the fake hubs (probe/described machine -> pick ->
download + verify -> command), its dry run, re-runs, script output and Ctrl-C."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakehub import FakeHub
from gguf_fixtures import TINY, write_gguf
from typer.testing import CliRunner

from quantpick.cli import app

runner = CliRunner()
REPO = "org/Tiny-GGUF"
BOX = ["--gpu", "3090", "--gpu", "t4", "--ram", "64G"]
LONG = dict(TINY, ctx=262144)  # the tiny architecture with the real model's context length


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def repo_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tinyrepo")
    files: dict[str, Path] = {}
    for big in ("Q8_0", "BF16"):
        path = root / f"Tiny-{big}.gguf"
        write_gguf(path, LONG, big=big, mtp=True, data="random")
        files[path.name] = path
    mmproj = root / "mmproj-Tiny-F16.gguf"
    mmproj.write_bytes(b"GGUF" + os.urandom(200_000))
    files[mmproj.name] = mmproj
    (root / "SHA256SUMS").write_text("".join(f"{sha(p)}  {n}\n" for n, p in files.items()))
    files["SHA256SUMS"] = root / "SHA256SUMS"
    return files


@pytest.fixture
def tiny(fake_hub: FakeHub, repo_files: dict[str, Path]) -> str:
    fake_hub.add_repo(REPO, dict(repo_files))
    added = runner.invoke(app, ["manifest", "add", REPO, "--id", "tiny", "--json"])
    assert added.exit_code == 0, added.stderr
    return "tiny"


def get_json(args: list[str]) -> dict:
    result = runner.invoke(app, ["get", *args, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def byte_gets(hub: FakeHub) -> list[dict]:
    """Transfers of file bodies: GETs without Range or with an open-ended resume range. (GGUF
    header reads for planning ask for a closed window, `bytes=0-4194303`.)"""
    return [
        r
        for r in hub.requests
        if str(r.get("file", "")).endswith(".gguf")
        and r.get("method") == "GET"
        and (r.get("range") is None or str(r["range"]).endswith("-"))
    ]


def test_get_reference_box_262144(
    tiny: str, fake_hub: FakeHub, repo_files: dict[str, Path], tmp_path: Path
) -> None:
    dest = tmp_path / "models"
    doc = get_json([tiny, "-c", "262144", *BOX, "--dir", str(dest)])
    plan = doc["plan"]
    # BF16 is the reference, never the default pick: Q8_0 is near-lossless and fits
    assert plan["quant"] == "Q8_0" and plan["placement"] == "gpu" and plan["fits"] is True
    assert plan["machine"]["source"] == "described: --gpu 3090 --gpu t4 --ram 64G"
    # verified files at their final names, with the repository's hashes
    (entry,) = doc["files"]
    path = Path(entry["path"])
    assert entry["verified"] is True and path == dest / "Tiny-Q8_0.gguf"
    assert sha(path) == sha(repo_files["Tiny-Q8_0.gguf"]) == entry["sha256"]
    assert not list(dest.glob("*.part")) and (dest / "SHA256SUMS").exists()
    # the command carries exactly the plan's placement flags
    argv = doc["command"]["argv"]
    assert argv[argv.index("-m") + 1] == str(path)
    flags = plan["flags"]
    env_words = [w for w in flags if "=" in w and not w.startswith("-")]
    placement = [w for w in flags if w not in env_words]
    joined = " ".join(argv)
    assert " ".join(placement) in joined
    for word in env_words:
        key, value = word.split("=", 1)
        assert doc["command"]["env"][key] == value
    assert "-c 262144" in joined and "--fit off" in joined and "--jinja" in joined
    assert plan["layout_basis"].startswith("gguf:")  # re-planned on the downloaded file's header

    # a second run verifies what is there and downloads nothing
    before = len(byte_gets(fake_hub))
    again = get_json([tiny, "-c", "262144", *BOX, "--dir", str(dest)])
    assert len(byte_gets(fake_hub)) == before
    assert again["files"][0]["verified"] is True and again["files"][0]["reused"] is True
    assert again["command"]["argv"] == argv


def test_get_dry_run_writes_nothing(tiny: str, fake_hub: FakeHub, tmp_path: Path) -> None:
    dest = tmp_path / "models"
    doc = get_json([tiny, "-c", "32768", *BOX, "--dir", str(dest), "--dry-run", "--vision"])
    assert doc["dry_run"] is True and doc["files"] == []
    fetch = doc["fetch"]
    assert fetch["bytes_to_fetch"] > 0 and fetch["enough_space"] is True
    assert {f["name"] for f in fetch["files"]} == {"Tiny-Q8_0.gguf", "mmproj-Tiny-F16.gguf"}
    assert fetch["source"].startswith("hf:")
    assert "--mmproj" in doc["command"]["argv"]
    assert not dest.exists() or not any(dest.iterdir())
    assert byte_gets(fake_hub) == []


def test_get_script_and_fixed_quant(tiny: str, tmp_path: Path) -> None:
    script = tmp_path / "serve-tiny"
    result = runner.invoke(
        app,
        [
            "get",
            tiny,
            "-c",
            "65536",
            "--quant",
            "Q8_0",
            *BOX,
            "--dir",
            str(tmp_path / "m"),
            "--script",
            str(script),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.stderr
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    text = script.read_text()
    assert text.startswith("#!") and "set -euo pipefail" in text and "Tiny-Q8_0.gguf" in text
    assert "quantpick plan: tiny Q8_0" in text


def test_get_nothing_fits_downloads_nothing(tiny: str, fake_hub: FakeHub, tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "get",
            "qwen3.8-35b-a3b-distill",
            "-c",
            "262144",
            "--gpu",
            "tiny:2G",
            "--ram",
            "4G",
            "--offline",
            "--dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 3 and result.stdout == ""
    assert byte_gets(fake_hub) == []


def test_ctrl_c_exits_130_and_the_rerun_resumes(
    tiny: str, fake_hub: FakeHub, tmp_path: Path
) -> None:
    dest = tmp_path / "models"
    # Throttled for the whole first run (header reads, the pre-download dry run, the download),
    # however many reads planning takes: else the download can finish before the SIGINT lands
    # (then the rerun has nothing to resume). The rerun is not throttled.
    fake_hub.faults.add("Tiny-BF16.gguf", "throttle", rate=2_000_000, times=None)
    args = [
        sys.executable,
        "-m",
        "quantpick",
        "get",
        tiny,
        "-c",
        "32768",
        *BOX,
        "--dir",
        str(dest),
        "--quant",
        "BF16",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    part = dest / "Tiny-BF16.gguf.part"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (part.exists() and part.stat().st_size > 1_000_000):
        time.sleep(0.05)
    assert part.exists(), proc.stderr.read() if proc.poll() is not None else "no .part"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=90)  # generous: a loaded CI box
    assert proc.returncode == 130, err
    assert part.exists() and not (dest / "Tiny-BF16.gguf").exists()
    kept = part.stat().st_size
    fake_hub.faults.clear()
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert rerun.returncode == 0, rerun.stderr
    assert (dest / "Tiny-BF16.gguf").exists() and not part.exists()
    resumed = [r["range"] for r in byte_gets(fake_hub) if r["range"]]
    assert resumed and int(resumed[-1][len("bytes=") : -1]) >= kept, "the rerun resumed"


def test_get_offline_uses_verified_local_files(
    tiny: str, fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "models"
    first = get_json([tiny, "-c", "32768", *BOX, "--dir", str(dest)])
    fake_hub.stop()  # the hub is gone: the files in place still serve, once verified
    monkeypatch.setenv("QUANTPICK_OFFLINE", "1")
    result = runner.invoke(app, ["get", tiny, "-c", "32768", *BOX, "--dir", str(dest), "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert "verified against their pinned sha256" in result.stderr
    assert doc["files"][0]["verified"] is True and doc["files"][0]["bytes_fetched"] == 0
    assert doc["command"]["argv"] == first["command"]["argv"]
    # an altered file is never used
    path = Path(doc["files"][0]["path"])
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    result = runner.invoke(app, ["get", tiny, "-c", "32768", *BOX, "--dir", str(dest)])
    assert result.exit_code == 4 and result.stdout == ""
    assert "does not match" in result.stderr


# -- reuse and --hf-cache ----------------------------------------------------------------------


def lmstudio_copy(repo_files: dict[str, Path], name: str) -> Path:
    """LM Studio's downloader keeps models/<publisher>/<repo>/<file> under ~/.lmstudio."""
    path = Path(os.environ["HOME"]) / ".lmstudio" / "models" / "org" / "Tiny-GGUF" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(repo_files[name].read_bytes())
    return path


def test_get_dry_run_then_run_reuse_an_lmstudio_copy(
    tiny: str, fake_hub: FakeHub, repo_files: dict[str, Path], tmp_path: Path
) -> None:
    source = lmstudio_copy(repo_files, "Tiny-Q8_0.gguf")
    dest = tmp_path / "models"
    args = [tiny, "-c", "32768", "--quant", "Q8_0", *BOX, "--dir", str(dest)]
    doc = get_json([*args, "--dry-run"])
    (entry,) = doc["fetch"]["files"]
    assert entry["reuse"]["store"] == "lmstudio" and entry["reuse"]["path"] == str(source)
    assert entry["reuse"]["verified"] is False
    # Not verified yet: to fetch unless it matches, and to hash first (issue 21: it said 0 B).
    size = repo_files["Tiny-Q8_0.gguf"].stat().st_size
    assert (doc["fetch"]["bytes_to_fetch"], doc["fetch"]["bytes_to_verify"]) == (size, size)
    assert doc["fetch"]["bytes_to_fetch_if_verified"] == 0
    result = runner.invoke(app, ["get", *args, "--dry-run"])
    assert f"would reuse {source} (lmstudio; not verified yet" in result.stderr

    result = runner.invoke(app, ["get", *args])
    assert result.exit_code == 0, result.stderr
    assert f"Reusing Tiny-Q8_0.gguf from lmstudio ({source})" in result.stderr
    assert f"-m {dest / 'Tiny-Q8_0.gguf'}" in result.stdout
    doc = get_json(args)  # the rerun: verified from the sha256 cache, reported in --json
    (entry,) = doc["files"]
    assert entry["reused"] is True and os.path.samefile(entry["path"], source)
    assert byte_gets(fake_hub) == []


def test_get_hf_cache_command_points_into_the_snapshot_and_works_offline(
    tiny: str, fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = [tiny, "-c", "32768", "--quant", "Q8_0", *BOX, "--hf-cache"]
    doc = get_json(args)
    commit = fake_hub.repos[REPO].commit
    snapshot = Path(os.environ["HF_HOME"]) / "hub" / "models--org--Tiny-GGUF" / "snapshots"
    argv = doc["command"]["argv"]
    assert argv[argv.index("-m") + 1] == str(snapshot / commit / "Tiny-Q8_0.gguf")
    fake_hub.stop()
    monkeypatch.setenv("QUANTPICK_OFFLINE", "1")
    result = runner.invoke(app, ["get", *args, "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["command"]["argv"] == argv
    assert "using the files in the Hugging Face cache" in result.stderr


# ---- rough edges (issue 12) -------------------------------------------------------------------


def test_offline_dry_run_never_contacts_a_hub(tiny: str, fake_hub: FakeHub, tmp_path: Path) -> None:
    """`get ... --offline --dry-run` plans from the manifest and what is on disk: no request."""
    before = len(fake_hub.requests)
    result = runner.invoke(
        app, ["get", tiny, "-c", "8192", *BOX, "--dir", str(tmp_path / "m"), "--offline",
              "--dry-run"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert fake_hub.requests[before:] == []
    assert "offline" in result.stderr and "not in" in result.stderr
    assert "llama-server" in result.stdout


def test_script_into_a_missing_directory_fails_before_any_transfer(
    tiny: str, fake_hub: FakeHub, tmp_path: Path
) -> None:
    script = tmp_path / "nodir" / "serve.sh"
    result = runner.invoke(
        app, ["get", tiny, "-c", "8192", *BOX, "--dir", str(tmp_path / "m"), "--script",
              str(script)],
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == f"Error: --script {script}: no such directory " + (
        f"{script.parent}"
    )
    assert byte_gets(fake_hub) == [] and not (tmp_path / "m").exists()
    assert "Traceback" not in result.output


def test_script_over_a_file_quantpick_did_not_write_fails_before_any_transfer(
    tiny: str, fake_hub: FakeHub, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    result = runner.invoke(
        app, ["get", tiny, "-c", "8192", *BOX, "--dir", str(tmp_path / "m"), "--script",
              str(notes)],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "exists and was not written by quantpick" in result.stderr
    assert byte_gets(fake_hub) == [] and not (tmp_path / "m").exists()
    assert notes.read_text() == "mine\n"


def test_get_model_source_hf_downloads_nothing(
    tiny: str, fake_hub: FakeHub, tmp_path: Path
) -> None:
    """llama-server fetches the file itself (-hf): quantpick plans and prints, no transfer."""
    result = runner.invoke(app, ["get", tiny, "-c", "8192", *BOX, "--model-source", "hf"])
    assert result.exit_code == 0, result.stderr
    assert f"-hf {REPO}:" in result.stdout and " -m " not in result.stdout
    assert byte_gets(fake_hub) == []
    assert "llama-server downloads it on first start" in result.stderr


def test_get_says_plainly_when_no_llama_server_is_found(
    tiny: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No llama-server anywhere: a warning says where quantpick looked, and the script says so
    itself when run, instead of bash's `exec: llama-server: not found`."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no llama-server here (checked below)
    assert shutil.which("llama-server") is None
    script = tmp_path / "serve-tiny"
    result = runner.invoke(app, ["get", tiny, "-c", "8192", *BOX, "--dir", str(tmp_path / "m"),
                                 "--script", str(script), "--quiet"])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "no llama-server found" in result.stderr and "build cache" in result.stderr
    clean = {"PATH": "/usr/bin:/bin"}
    run = subprocess.run([str(script)], capture_output=True, text=True, env=clean)
    assert run.returncode == 127
    assert "llama-server is not on PATH" in run.stderr and "exec:" not in run.stderr


def test_get_uses_llama_server_from_quantpicks_build_cache(
    tiny: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fake_llama_server import fake_llama_server

    from quantpick.machine.llamacpp import build_cache_root

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    bin_dir = build_cache_root() / "0.3.36-b11312-7fa9b96e2626" / "bin"
    server = fake_llama_server(bin_dir)
    (bin_dir / ".complete").touch()
    doc = get_json([tiny, "-c", "8192", *BOX, "--dir", str(tmp_path / "m")])
    assert doc["command"]["argv"][0] == str(server)
    assert "build 11312" in doc["command"]["target"]


def test_get_takes_connections_and_reports_them(tiny: str, tmp_path: Path) -> None:
    dest = tmp_path / "models"
    refused = runner.invoke(app, ["get", tiny, "-c", "32768", *BOX, "--connections", "99"])
    assert refused.exit_code == 2
    assert refused.stderr.splitlines()[0].startswith("Error: --connections must be a whole")
    doc = get_json([tiny, "-c", "32768", *BOX, "--dir", str(dest), "--connections", "1"])
    assert {f["connections"] for f in doc["files"]} == {1}
    assert all(f["rate_bytes_per_s"] > 0 for f in doc["files"])
