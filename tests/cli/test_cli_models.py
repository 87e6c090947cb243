"""`quantpick models` and `quantpick show` through typer's CliRunner (stdout and stderr apart)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakehub import FakeHub
from typer.testing import CliRunner

from quantpick.cli import app
from quantpick.config import load_settings

runner = CliRunner()

Q4_SHA = "196103269085bc54c9b8f49ed21e9f53e1b56b465e8b796c6d8e31e06f63cfa5"


def test_models_json() -> None:
    result = runner.invoke(app, ["models", "--json"])
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1
    assert doc["errors"] == []
    models = {m["id"]: m for m in doc["models"]}
    assert list(models) == ["qwen3.6-35b-a3b-unsloth", "qwen3.8-35b-a3b-distill"]
    distill = models["qwen3.8-35b-a3b-distill"]
    assert distill["quant_count"] == 10
    assert distill["quants"][0] == "BF16" and distill["quants"][-1] == "IQ2_M"
    assert distill["min_size_bytes"] == 12_558_000_000
    assert distill["max_size_bytes"] == 71_067_000_000
    assert distill["has_projector"] is True
    assert distill["origin"] == "bundled"
    assert [s["kind"] for s in distill["sources"]] == ["hf", "mirror"]
    assert models["qwen3.6-35b-a3b-unsloth"]["quant_count"] == 23


def test_models_table() -> None:
    result = runner.invoke(app, ["models"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.stderr
    assert "qwen3.8-35b-a3b-distill" in result.stdout
    assert "qwen3.6-35b-a3b-unsloth" in result.stdout
    assert "12.6-71.1 GB" in result.stdout
    assert result.stderr == ""


def test_show_json() -> None:
    result = runner.invoke(app, ["show", "qwen3.8-35b-a3b-distill", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1
    assert doc["id"] == "qwen3.8-35b-a3b-distill"
    assert len(doc["files"]) == 11
    (q4,) = [f for f in doc["files"] if f["quant"] == "Q4_K_M"]
    assert q4["size_bytes"] == 21_713_462_944 and isinstance(q4["size_bytes"], int)
    assert q4["sha256"] == Q4_SHA  # full hash in JSON
    assert q4["size_exact"] is True and q4["role"] == "model"
    (proj,) = [f for f in doc["files"] if f["role"] == "mmproj"]
    assert proj["name"] == "mmproj-Qwen3.8-35B-A3B-F16.gguf" and proj["quality_rank"] is None
    assert doc["architecture"]["block_count"] == 41
    assert doc["architecture"]["nextn_predict_layers"] == 1
    assert doc["sampling"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
    assert doc["sources"][0]["revision"] == "b1f9d1dcc3de8aa867669b0ab919384aeeb9b8d5"
    assert doc["checksums_file"] == "SHA256SUMS"


def test_show_by_hf_repo_id() -> None:
    result = runner.invoke(app, ["show", "unsloth/Qwen3.6-35B-A3B-GGUF", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["id"] == "qwen3.6-35b-a3b-unsloth"
    assert doc["checksums_file"] is None
    assert len(doc["files"]) == 25


def test_show_table() -> None:
    result = runner.invoke(app, ["show", "qwen3.8-35b-a3b-distill"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "Qwen3.8-35B-A3B-Q4_K_M.gguf" in out
    assert "21.713" in out and "20.22" in out  # GB and GiB
    assert "~71.067" in out  # a card size is marked
    assert "1961032690" in out and Q4_SHA not in out  # short hash in the table
    assert "b1f9d1dcc3de8aa867669b0ab919384aeeb9b8d5" in out
    assert "--temp 0.6 --top-p 0.95 --top-k 20 --min-p 0" in out
    assert "40 layers + 1 NextN/MTP (10 with KV, 30 recurrent)" in out
    assert "qwen35 rules, checked against llama.cpp" in out
    assert result.stderr == ""


@pytest.mark.parametrize("args", [["show", "no-such-model"], ["show", "no-such-model", "--json"]])
def test_show_unknown_model(args: list[str]) -> None:
    """An unknown model is a bad argument (exit 2, like an unknown quant); with --json the
    stdout is the error document."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    if "--json" in args:
        assert json.loads(result.stdout)["error"]["message"] == "unknown model 'no-such-model'"
    else:
        assert result.stdout == ""
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert error_lines == ["Error: unknown model 'no-such-model'"]
    assert "qwen3.8-35b-a3b-distill" in result.stderr  # the hint lists the known ids
    assert "Traceback" not in result.stderr


def test_a_repo_id_nothing_describes_is_looked_up_on_the_hub(fake_hub: FakeHub) -> None:
    """OWNER/REPO with no manifest is read from the hub (tests/cli/test_cli_repos.py); one the
    hub does not have is a hub error (exit 5), and offline it says what is missing (exit 2)."""
    result = runner.invoke(app, ["pick", "org/Repo-GGUF", "-c", "8192"])
    assert result.exit_code == 5
    assert "Error: org/Repo-GGUF was not found on" in result.stderr
    result = runner.invoke(app, ["pick", "org/Repo-GGUF", "-c", "8192", "--offline"])
    assert result.exit_code == 2
    assert "`quantpick manifest add org/Repo-GGUF`" in result.stderr


def _write_broken_user_manifest() -> Path:
    user_dir = load_settings().user_manifest_dir
    user_dir.mkdir(parents=True)
    path = user_dir / "broken.toml"
    path.write_text(
        (Path(__file__).resolve().parents[2] / "manifests" / "qwen3.8-35b-a3b-distill.toml")
        .read_text(encoding="utf-8")
        .replace('id = "qwen3.8-35b-a3b-distill"', 'id = "broken"')
        .replace("size_bytes = 12558000000", "size_bytes = -1"),
        encoding="utf-8",
    )
    return path


def test_models_still_lists_the_others_when_one_is_broken() -> None:
    path = _write_broken_user_manifest()
    result = runner.invoke(app, ["models", "--json"])
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert [m["id"] for m in doc["models"]] == [
        "qwen3.6-35b-a3b-unsloth",
        "qwen3.8-35b-a3b-distill",
    ]
    assert doc["errors"][0]["message"] == f"{path}: files[0].size_bytes: must be >= 1, got -1"
    assert result.stderr.startswith(f"Warning: skipped {path}: files[0].size_bytes")


def test_show_fails_on_a_broken_manifest_naming_it() -> None:
    path = _write_broken_user_manifest()
    result = runner.invoke(app, ["show", "broken"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines()[0] == (
        f"Error: {path}: files[0].size_bytes: must be >= 1, got -1"
    )
    # another model: the broken file is skipped with a note (before: every command failed)
    result = runner.invoke(app, ["show", "qwen3.8-35b-a3b-distill"])
    assert result.exit_code == 0 and result.stdout
    assert result.stderr.splitlines()[0] == (
        f"Note: skipped a manifest that does not load: {path}: files[0].size_bytes: must be >= 1,"
        " got -1"
    )


def test_user_manifest_overrides_and_is_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    src = Path(__file__).resolve().parents[2] / "manifests" / "qwen3.8-35b-a3b-distill.toml"
    text = src.read_text(encoding="utf-8").replace(
        'display_name = "Qwen3.8-35B-A3B-Distill (empero-ai)"', 'display_name = "Mine"'
    )
    (env_dir / "mine.toml").write_text(text, encoding="utf-8")
    monkeypatch.setenv("QUANTPICK_MANIFESTS", str(env_dir))
    result = runner.invoke(app, ["models", "--json"])
    (distill,) = [m for m in json.loads(result.stdout)["models"] if m["id"].startswith("qwen3.8")]
    assert distill["display_name"] == "Mine"
    assert distill["origin"] == "QUANTPICK_MANIFESTS"
    assert distill["path"] == str(env_dir / "mine.toml")


GLM_AIR_TOML = """
schema = 1
id = "glm-air-test"
display_name = "GLM test"
checksums_file = ""

[architecture]
name = "glm4moe"
block_count = 47
nextn_predict_layers = 1
context_length = 131072
embedding_length = 4096
feed_forward_length = 10944
head_count = 96
head_count_kv = 8
key_length = 128
value_length = 128
expert_count = 128
expert_used_count = 8
expert_feed_forward_length = 1408
expert_shared_count = 1
leading_dense_block_count = 1
vocab_size = 151552

[[sources]]
kind = "hf"
repo = "REPO"
revision = "0000000000000000000000000000000000000000"

[[files]]
name = "GLM-4.5-Air-Q4_K_M.gguf"
quant = "Q4_K_M"
size_bytes = 73000000000
size_exact = false
bits_per_weight = 5.29
quality_rank = 1
"""


@pytest.mark.parametrize(
    ("repo", "scope"),
    [
        ("bartowski/zai-org_GLM-4.5-Air-GGUF", "measured for this model (Thireus/GGUF-Tool-Suite)"),
        ("someone/GLM-4.5-Air-Derestricted-GGUF", "same family (glm4moe, 4 models)"),
    ],
)
def test_show_says_what_a_quality_figure_rests_on(
    repo: str, scope: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "glm.toml").write_text(GLM_AIR_TOML.replace("REPO", repo), encoding="utf-8")
    monkeypatch.setenv("QUANTPICK_MANIFESTS", str(tmp_path))
    table = runner.invoke(app, ["show", "glm-air-test"], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.stderr
    assert f"source: {scope}; each figure" in table.stdout
    doc = json.loads(runner.invoke(app, ["show", "glm-air-test", "--json"]).stdout)
    (q4,) = doc["files"]
    assert q4["quality"]["scope"] == scope and q4["quality"]["basis"] == "interpolated"
