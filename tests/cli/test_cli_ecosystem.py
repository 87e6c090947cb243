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
    from quantpick.serve.formats.preset import preset_section_name

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


# ---- one output policy (issue #26, "Writes"): never over a device or FIFO, never through a link,
# never a file or a section the user wrote without --force, backups no later run destroys ------


def _fifo(path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this OS")
    os.mkfifo(path)
    return path


def _null_device(path: Path) -> Path:
    """A character device like /dev/null (1, 3), made in the test's own directory."""
    import stat

    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (OSError, AttributeError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    return path


@pytest.mark.parametrize(
    ("fmt", "flag"),
    [("ollama", "--modelfile"), ("preset", "--preset"), ("llama-swap", "--swap-config")],
)
def test_a_fifo_or_device_is_never_written_over_or_read(
    model: Path, tmp_path: Path, fmt: str, flag: str
) -> None:
    """As root, `--modelfile /dev/null` used to replace the node with a 0666 regular file, and
    reading a FIFO as the existing preset hung."""
    import stat

    for special in (_fifo(tmp_path / "fifo"), _null_device(tmp_path / "null")):
        kind = os.lstat(special).st_mode
        for force in ([], ["--force"]):
            code, _, err = command(model, "--format", fmt, flag, str(special), *force)
            assert code == 2, err
            assert "not a regular file: quantpick never writes over it" in err
            assert os.lstat(special).st_mode == kind  # still the FIFO / the device
            assert stat.S_IFMT(kind) in (stat.S_IFIFO, stat.S_IFCHR)
        assert sorted(p.name for p in tmp_path.iterdir() if "bak" in p.name) == []


@pytest.mark.parametrize(
    ("fmt", "flag"),
    [("ollama", "--modelfile"), ("preset", "--preset"), ("llama-swap", "--swap-config")],
)
def test_a_symlink_at_the_output_is_never_written_through(
    model: Path, tmp_path: Path, fmt: str, flag: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "root-only.conf"
    victim.write_text("not quantpick's\n")
    zero = tmp_path / "zero.ini"
    zero.symlink_to("/dev/zero")  # read or backed up, it would fill memory or the disk
    for link_target in (victim, Path("/dev/zero")):
        link = tmp_path / f"out-{link_target.name}"
        link.symlink_to(link_target)
        code, _, err = command(model, "--format", fmt, flag, str(link))
        assert code == 2 and "is a symbolic link" in err and "Hint: pass --force" in err, err
        assert link.is_symlink()
        code, _, err = command(model, "--format", fmt, flag, str(link), "--force")
        assert code == 0, err
        assert not link.is_symlink() and link.is_file()  # the link itself was replaced
    assert victim.read_text() == "not quantpick's\n"
    assert sorted(p.name for p in outside.iterdir()) == ["root-only.conf"]
    assert not [p for p in tmp_path.iterdir() if ".bak" in p.name]


def test_a_planted_bak_link_is_never_written_through(model: Path, tmp_path: Path) -> None:
    preset = tmp_path / "models.ini"
    original = "version = 1\n\n[mine]\nmodel = /m/mine.gguf\n"
    preset.write_text(original)  # the user's file: quantpick's first write into it keeps a backup
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (tmp_path / "models.ini.bak").symlink_to(victim)
    code, _, err = command(model, "-c", "4096", "--format", "preset", "--preset", str(preset))
    assert code == 0, err
    assert victim.read_text() == "keep me\n"
    backup = tmp_path / "models.ini.bak.1"
    assert backup.read_text() == original and "ctx-size = 4096" in preset.read_text()
    assert f"(the previous version: {backup})" in err


HAND_SECTION = "[Tiny-Q8_0]\n; my own settings\nmodel = /models/tiny.gguf\ntemp = 0.2\n"


def test_a_hand_written_preset_section_is_refused_then_replaced_with_force(
    model: Path, tmp_path: Path
) -> None:
    preset = tmp_path / "models.ini"
    original = "version = 1\n\n" + HAND_SECTION
    preset.write_text(original)
    code, _, err = command(model, "--format", "preset", "--preset", str(preset))
    assert code == 2
    assert f"Error: --preset {preset}: the section [Tiny-Q8_0] was not written by quantpick" in err
    assert "Hint: pass --force" in err and preset.read_text() == original
    assert not list(tmp_path.glob("models.ini.bak*"))
    # --force: replaced, the hand-written version kept; a second --force run keeps both backups
    assert command(model, "--format", "preset", "--preset", str(preset), "--force")[0] == 0
    assert "temp = 0.2" not in preset.read_text()
    assert (tmp_path / "models.ini.bak").read_text() == original
    # quantpick's section, edited by the user, is theirs now
    edited = preset.read_text().replace("ctx-size = 8192", "ctx-size = 8192\ntemp = 0.3")
    preset.write_text(edited)
    code, _, err = command(model, "-c", "4096", "--format", "preset", "--preset", str(preset))
    assert code == 2 and "was edited since quantpick wrote it" in err
    assert preset.read_text() == edited
    code, _, err = command(model, "-c", "4096", "--format", "preset", "--preset", str(preset),
                           "--force")  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "models.ini.bak").read_text() == original  # never overwritten
    assert (tmp_path / "models.ini.bak.1").read_text() == edited


def test_a_hand_written_llama_swap_entry_is_refused(model: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    original = (
        "models:\n  # mine\n  Tiny-Q8_0:\n    cmd: llama-server -m /m.gguf --port ${PORT}\n"
        "    aliases: [tiny]\n"
    )
    config.write_text(original)
    code, _, err = command(model, "--format", "llama-swap", "--swap-config", str(config))
    assert code == 2 and "the entry models.Tiny-Q8_0 was not written by quantpick" in err
    assert config.read_text() == original and not list(tmp_path.glob("config.yaml.bak*"))
    code, _, err = command(model, "--format", "llama-swap", "--swap-config", str(config),
                           "--force")  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "config.yaml.bak").read_text() == original
    assert "aliases" not in yaml.safe_load(config.read_text())["models"]["Tiny-Q8_0"]
    # quantpick's own entry is updated without --force, and the same bytes write nothing
    code, _, err = command(model, "--format", "llama-swap", "--swap-config", str(config))
    assert code == 0 and "Unchanged:" in err, err
    assert not (tmp_path / "config.yaml.bak.1").exists()


def test_an_existing_user_modelfile_is_refused(model: Path, tmp_path: Path) -> None:
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text("FROM llama3\nPARAMETER temperature 0.1\n")
    code, _, err = command(model, "--format", "ollama", "--modelfile", str(modelfile))
    assert code == 2 and "was not written by quantpick" in err and "Hint: pass --force" in err
    assert modelfile.read_text() == "FROM llama3\nPARAMETER temperature 0.1\n"
    assert command(model, "--format", "ollama", "--modelfile", str(modelfile), "--force")[0] == 0
    assert (tmp_path / "Modelfile.bak").read_text().startswith("FROM llama3")
    # quantpick's own Modelfile is replaced without --force
    code, _, err = command(model, "-c", "4096", "--format", "ollama", "--modelfile",
                           str(modelfile))  # fmt: skip
    assert code == 0, err
    assert "PARAMETER num_ctx 4096" in modelfile.read_text()


@pytest.mark.parametrize(
    ("fmt", "flag", "name", "text", "says"),
    [
        ("preset", "--preset", "p.ini", "version = 1\n[unclosed\nmodel = /m.gguf\n",
         "line 2 is not INI"),
        ("preset", "--preset", "p.ini", "version = 1\n  indented = key\n", "line 2 is not INI"),
        ("llama-swap", "--swap-config", "c.yaml", "models:\n  a: [unclosed\n", "not valid YAML"),
        ("llama-swap", "--swap-config", "c.yaml", "- a list\n", "is not a llama-swap config"),
    ],
)  # fmt: skip
def test_a_malformed_config_is_refused_not_merged(
    model: Path, tmp_path: Path, fmt: str, flag: str, name: str, text: str, says: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    for force in ([], ["--force"]):
        code, _, err = command(model, "--format", fmt, flag, str(path), *force)
        assert code == 2 and says in err and "nothing merged" in err, err
        assert path.read_text() == text
    assert [p.name for p in tmp_path.iterdir() if p.name != model.name] == [name]


def test_rerunning_a_preset_keeps_one_backup_not_one_per_run(model: Path, tmp_path: Path) -> None:
    """Each run rewrites quantpick's own section (its plan, its budgets): only the user's original
    is kept as a backup, so a preset regenerated from cron does not pile up .bak files."""
    preset = tmp_path / "models.ini"
    original = "version = 1\n\n[mine]\nmodel = /m/mine.gguf\n"
    preset.write_text(original)
    for ctx in ("4096", "8192", "16384", "4096"):
        code, _, err = command(model, "-c", ctx, "--format", "preset", "--preset", str(preset))
        assert code == 0, err
    assert "ctx-size = 4096" in preset.read_text() and "[mine]" in preset.read_text()
    assert sorted(p.name for p in tmp_path.glob("models.ini.bak*")) == ["models.ini.bak"]
    assert (tmp_path / "models.ini.bak").read_text() == original
