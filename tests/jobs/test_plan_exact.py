"""Planning from the exact GGUF header read over HTTP, on both fake hubs: `pick --exact`, and a
manifest made by `manifest add` plans like the bundled one for the same file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conformance_model import write_conformance_gguf
from fakehub import FakeHub
from typer.testing import CliRunner

from quantpick.cli import app
from quantpick.config import load_settings
from quantpick.model.gguf import read_gguf_file
from quantpick.model.headers import sha256_key, store_cached_header
from quantpick.model.registry import find_manifest

runner = CliRunner()
REPO = "empero-ai/Qwen3.8-35B-A3B-Distill-GGUF"
NAME = "Qwen3.8-35B-A3B-Q4_K_M.gguf"
BOX = ["--gpu", "3090", "--gpu", "t4", "--ram", "64G"]
MiB = 1024**2


@pytest.fixture(scope="module")
def header_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The full-size Q4_K_M architecture (753 tensors, llama.cpp's types) cut after its header:
    what a hub serves at the start of the real file, without 21 GB behind it."""
    path = tmp_path_factory.mktemp("exact") / NAME
    write_conformance_gguf(path)
    data_offset = read_gguf_file(path).data_offset
    os.truncate(path, data_offset)
    return path


def pick_json(args: list[str]) -> dict:
    result = runner.invoke(app, ["pick", *args, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("kind", ["hf", "modelscope"])
def test_pick_exact_from_a_remote_header(fake_hub: FakeHub, header_only: Path, kind: str) -> None:
    fake_hub.add_repo(REPO, {NAME: header_only})
    added = runner.invoke(
        app, ["manifest", "add", REPO, "--source", kind, "--id", "distill-" + kind, "--json"]
    )
    assert added.exit_code == 0, added.stderr
    # forget what `manifest add` cached: --exact must read the header over HTTP now
    for entry in (load_settings().cache_dir / "headers").glob("*.json"):
        entry.unlink()
    fake_hub.requests.clear()
    doc = pick_json(["distill-" + kind, "-c", "262144", "--exact", *BOX])
    assert doc["layout_basis"].startswith("gguf-remote:"), doc["layout_basis"]
    assert doc["exact_weights"] is True and doc["quant"] == "Q4_K_M"
    ranged = [r for r in fake_hub.requests if str(r.get("file", "")).endswith(".gguf")]
    assert ranged, "the header was read from the fake hub"
    # and the weights on each GPU are the exact header's: -ts from the plan, bytes from llama.cpp's
    # rules over the 753 real tensor sizes (the synthesized table would differ by a few MiB)
    synthesized = pick_json(
        ["qwen3.8-35b-a3b-distill", "-c", "262144", "--quant", "Q4_K_M", "--no-network", *BOX]
    )
    assert synthesized["layout_basis"].startswith("synthesized")
    exact_gpu = [d["weights_bytes"] for d in doc["devices"] if d["kind"] == "gpu"]
    assert sum(exact_gpu) != sum(
        d["weights_bytes"] for d in synthesized["devices"] if d["kind"] == "gpu"
    )


def test_added_manifest_plans_like_the_bundled_one(fake_hub: FakeHub, header_only: Path) -> None:
    fake_hub.add_repo(REPO, {NAME: header_only})
    added = runner.invoke(app, ["manifest", "add", REPO, "--id", "distill-added", "--json"])
    assert added.exit_code == 0, added.stderr
    # The bundled manifest pins the real file's sha256; give its cache slot the same header, as a
    # header read of the real file would.
    bundled = find_manifest("qwen3.8-35b-a3b-distill")
    sha = bundled.quant_files("Q4_K_M")[0].sha256
    assert sha
    store_cached_header(
        load_settings(), [sha256_key(sha)], read_gguf_file(header_only, check_size=False)
    )
    args = ["-c", "131072", "--quant", "Q4_K_M", "--exact", *BOX]
    a = pick_json(["distill-added", *args])
    b = pick_json(["qwen3.8-35b-a3b-distill", *args])
    assert a["layout_basis"].startswith("gguf-") and b["layout_basis"].startswith("gguf-cache:")
    for key in ("config", "placement", "flags"):
        assert a[key] == b[key], key
    assert [d["weights_bytes"] for d in a["devices"]] == [d["weights_bytes"] for d in b["devices"]]
    assert [d["kv_bytes"] for d in a["devices"]] == [d["kv_bytes"] for d in b["devices"]]
    # llama.cpp's own figures for this file and split (conformance case -ts 24,16 at 32768):
    c = pick_json(["distill-added", "-c", "32768", "--quant", "Q4_K_M", "--exact", *BOX])
    assert c["exact_weights"] is True
    est = runner.invoke(
        app,
        [
            "estimate",
            "distill-added",
            "-q",
            "Q4_K_M",
            "-c",
            "32768",
            "-ts",
            "24,16",
            "--exact",
            *BOX,
            "--json",
        ],
    )
    assert est.exit_code == 0, est.stderr
    gpus = [d for d in json.loads(est.stdout)["devices"] if d["kind"] == "gpu"]
    assert [d["weights_bytes"] // MiB for d in gpus] == [12613, 7289]
