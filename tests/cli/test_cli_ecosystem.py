"""`command --format preset | llama-swap | ollama | lmstudio` (cli/ecosystem.py): the files they
write, what they print, and the options they need. The router itself loads a written preset in
tests/serve/test_llama_server_e2e.py."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from quantpick.cli import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_model import write_tiny_model  # noqa: E402

runner = CliRunner()


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "Tiny-Q8_0.gguf"
    write_tiny_model(path)
    return path


def command(model: Path, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["command", "--gguf", str(model), "-c", "8192", "--no-confirm",
                                 *args])  # fmt: skip
    return result.exit_code, result.stdout, result.stderr


def test_preset_is_written_then_updated_with_a_backup(model: Path, tmp_path: Path) -> None:
    preset = tmp_path / "models.ini"
    preset.write_text("version = 1\n\n[mine]\nmodel = /m/mine.gguf   ; by hand\n")
    code, out, err = command(model, "--format", "preset", "--preset", str(preset))
    assert code == 0, err
    text = preset.read_text()
    assert text.startswith("version = 1\n\n[mine]\nmodel = /m/mine.gguf   ; by hand\n")
    assert "[Tiny-Q8_0]\n" in text and f"model = {model}\n" in text and "ctx-size = 8192" in text
    assert (tmp_path / "models.ini.bak").read_text().endswith("; by hand\n")
    words = shlex.split(out.strip())
    assert words[1:5] == ["--models-preset", str(preset), "--models-max", "1"]
    assert "Wrote [Tiny-Q8_0] (added) in" in err and "1 section(s) not written by quantpick" in err
    again = runner.invoke(app, ["command", "--gguf", str(model), "-c", "16384", "--no-confirm",
                                "--format", "preset", "--preset", str(preset)])  # fmt: skip
    assert again.exit_code == 0, again.stderr
    assert "Wrote [Tiny-Q8_0] (updated) in" in again.stderr
    text = preset.read_text()
    assert text.count("[Tiny-Q8_0]") == 1 and "ctx-size = 16384" in text


def test_a_file_name_with_a_space_gets_a_derived_section_name(tmp_path: Path) -> None:
    """Before: "--alias 'Tiny Q8_0': a preset section name is ..." (exit 2, "give --alias")."""
    spaced = tmp_path / "Tiny Q8_0 (copy).gguf"
    write_tiny_model(spaced)
    preset = tmp_path / "models.ini"
    code, out, err = command(spaced, "--format", "preset", "--preset", str(preset))
    assert code == 0, err
    assert "[Tiny-Q8_0-copy]\n" in preset.read_text()
    assert "Note: preset section [Tiny-Q8_0-copy], derived from the model name " in err
    # a name the user gives is still checked, not rewritten
    code, _, err = command(spaced, "--format", "preset", "--preset", str(preset), "--alias", "a b")
    assert code == 2 and "--alias 'a b'" in err


@pytest.mark.parametrize(
    ("name", "section"),
    [("Tiny-Q8_0", "Tiny-Q8_0"), ("my model", "my-model"), ("  ", "model"), ("-x y-", "x-y"),
     ("é", "model"), ("a;b#c", "a-b-c")],
)  # fmt: skip
def test_preset_section_names(name: str, section: str) -> None:
    from quantpick.serve.ecosystem import preset_section_name

    assert preset_section_name(name) == section


def test_preset_json_document(model: Path, tmp_path: Path) -> None:
    preset = tmp_path / "p.ini"
    code, out, err = command(model, "--format", "preset", "--preset", str(preset), "--json")
    assert code == 0, err
    doc = json.loads(out)
    rendered = doc["rendered"]
    assert rendered["format"] == "preset" and rendered["preset"]["file"] == str(preset)
    assert rendered["preset"]["models_max"] == 1
    assert "--models-max 1" in rendered["preset"]["router"]
    assert doc["plan"]["machine"]["host"]["cores"] >= 1


def test_format_options_are_checked_first(model: Path, tmp_path: Path) -> None:
    code, _, err = command(model, "--format", "preset")
    assert code == 2 and "--format preset needs --preset FILE" in err
    code, _, err = command(model, "--format", "ollama", "--preset", str(tmp_path / "x.ini"))
    assert code == 2 and "--preset goes with --format preset" in err
    code, _, err = command(model, "--format", "preset", "--preset", str(tmp_path / "no" / "x"))
    assert code == 2 and "no such directory" in err


def test_llama_swap_merges_into_a_config(model: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("models:\n  other:\n    cmd: llama-server --port ${PORT}\n")
    code, out, err = command(model, "--format", "llama-swap", "--swap-config", str(config),
                             "--ttl", "120")  # fmt: skip
    assert code == 0, err
    assert out == "" and f"Run: llama-swap --config {config}" in err
    doc = yaml.safe_load(config.read_text())
    assert doc["models"]["other"] == {"cmd": "llama-server --port ${PORT}"}
    entry = doc["models"]["Tiny-Q8_0"]
    assert entry["ttl"] == 120 and "--port ${PORT}" in entry["cmd"]
    printed = command(model, "--format", "llama-swap")[1]
    assert yaml.safe_load(printed)["models"]["Tiny-Q8_0"]["ttl"] == 900


def test_ollama_modelfile_and_create_line(model: Path, tmp_path: Path) -> None:
    modelfile = tmp_path / "Modelfile"
    code, out, err = command(model, "--format", "ollama", "--modelfile", str(modelfile))
    assert code == 0, err
    text = modelfile.read_text()
    assert f"FROM {model}\n" in text and "PARAMETER num_ctx 8192" in text
    assert "<|im_start|>" in text  # the tiny model's template is ChatML
    assert f"ollama create tiny-q8_0:q8_0 -f {modelfile}" in err and "copies the" in err


def test_lmstudio_links_into_its_models_folder(model: Path) -> None:
    code, out, err = command(model, "--format", "lmstudio")
    assert code == 0, err
    dest = Path(os.environ["HOME"]) / ".lmstudio/models/quantpick/Tiny-Q8_0/Tiny-Q8_0.gguf"
    assert out.strip() == str(dest) and os.path.samefile(dest, model) and model.is_file()
    assert "context length 8192" in err


def test_models_max_counts_the_sections_planned_for_this_machine(
    model: Path, tmp_path: Path
) -> None:
    preset = tmp_path / "models.ini"
    for alias in ("tiny-a", "tiny-b", "tiny-c"):
        code, out, err = command(model, "--alias", alias, "--format", "preset", "--preset",
                                 str(preset))  # fmt: skip
        assert code == 0, err
    # three 130 MiB plans fit this machine's RAM together
    assert "--models-max 3" in out and "all 3 models planned for this machine fit at once" in err
    # planned for another machine (described): not counted with these
    code, out, err = command(model, "--alias", "elsewhere", "--gpu", "3090", "--ram", "8G",
                             "--format", "preset", "--preset", str(preset))  # fmt: skip
    assert code == 0, err
    assert "--models-max 1" in out and "one model planned for this machine" in err
