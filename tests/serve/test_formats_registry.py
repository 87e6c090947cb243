"""serve/formats/: the output formats as a registry, one module per format. Every entry loads,
the CLI's --format choices, help and completions come from the registry, and a format added as
one module plus one entry is served by `command --format` with nothing else changed."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from quantpick.cli import app
from quantpick.serve import formats
from quantpick.serve.formats.base import Emission, Emitted, OutputFormat, Reporter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_model import write_tiny_model  # noqa: E402

runner = CliRunner()
PACKAGE = Path(formats.__file__).parent


@pytest.mark.parametrize("entry", formats.REGISTRY, ids=lambda e: e.name)
def test_every_entry_loads_its_module(entry: formats.FormatEntry) -> None:
    fmt = formats.output_format(entry.name)
    assert isinstance(fmt, OutputFormat)
    assert fmt.name == entry.name
    assert (PACKAGE / f"{entry.module}.py").is_file()


def test_every_format_module_is_registered() -> None:
    """A module in serve/formats/ that defines FORMAT but has no entry would be dead code."""
    shared = {"__init__", "base", "target", "config_file"}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - shared
    assert modules == {e.module for e in formats.REGISTRY}


def test_an_unknown_format_names_the_known_ones() -> None:
    from quantpick.errors import UsageError

    with pytest.raises(UsageError, match="--format kobold: use one of line, script, json"):
        formats.output_format("kobold")


def test_the_registry_module_imports_nothing_heavy() -> None:
    """Shell completion and --help read it before anything else loads."""
    source = (PACKAGE / "__init__.py").read_text()
    assert "quantpick.serve.command" not in source and "typer" not in source


def test_the_cli_offers_the_registrys_formats() -> None:
    from quantpick.cli.complete import value_items

    values = [v for v, _ in value_items(["command", "--format"], "") or []]
    assert tuple(values) == formats.names()
    help_text = runner.invoke(app, ["command", "--help"], env={"COLUMNS": "400"}).stdout
    assert " ".join(formats.help_text().split()) in " ".join(help_text.split())


class _Kobold(OutputFormat):
    """A format written as a test would add one: a KoboldCpp-style launch line."""

    name = "kobold"

    def emit(self, job: Emission, say: Reporter) -> Emitted:
        say.note("Run it with koboldcpp")
        text = "koboldcpp --model " + job.cmd.argv[job.cmd.argv.index("-m") + 1] + "\n"
        return Emitted(stdout=text, rendered={"text": text})


@pytest.fixture
def kobold(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("quantpick.serve.formats.kobold")
    module.FORMAT = _Kobold()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    entry = formats.FormatEntry("kobold", "a KoboldCpp line", "kobold")
    monkeypatch.setattr(formats, "REGISTRY", (*formats.REGISTRY, entry))


def test_a_new_format_is_one_module_and_one_entry(kobold: None, tmp_path: Path) -> None:
    model = tmp_path / "Tiny-Q8_0.gguf"
    write_tiny_model(model)
    args = ["command", "--gguf", str(model), "-c", "8192", "--ram", "32G", "--no-confirm",
            "--format", "kobold"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"koboldcpp --model {model}\n"
    assert "Run it with koboldcpp" in result.stderr
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert doc["rendered"] == {"format": "kobold", "text": f"koboldcpp --model {model}\n"}
    assert doc["command"]["argv"][0] == "llama-server"

    from quantpick.cli.complete import value_items

    assert "kobold" in [v for v, _ in value_items(["get", "--format"], "k") or []]


def test_a_file_option_belongs_to_its_format(tmp_path: Path) -> None:
    """The owner of --preset / --swap-config / --modelfile is the registry's entry."""
    model = tmp_path / "Tiny-Q8_0.gguf"
    write_tiny_model(model)
    for entry in formats.REGISTRY:
        if entry.file_option is None:
            continue
        other = next(e.name for e in formats.REGISTRY if e.file_option is None)
        result = runner.invoke(app, ["command", "--gguf", str(model), "-c", "8192", "--format",
                                     other, entry.file_option, str(tmp_path / "f")])  # fmt: skip
        assert result.exit_code == 2
        assert f"{entry.file_option} goes with --format {entry.name}" in result.stderr


def test_ecosystem_formats_need_a_target() -> None:
    """A format that hands the plan to another tool reads the Target; one that does not never
    asks for it (the GGUF's template is read only for the format that wants it)."""
    from quantpick.plan.memory import RunConfig
    from quantpick.serve.command import ServerOptions, build_command

    cmd = build_command(RunConfig(ctx_size=4096, devices=()), model_path=Path("/m/x.gguf"),
                        mmproj_path=None, manifest=None, block_count=4, server=ServerOptions(),
                        capabilities=None)  # fmt: skip
    job = Emission(cmd, "plan", "x")
    say = Reporter(warn=lambda _: None, note=lambda _: None)
    for entry in formats.REGISTRY:
        fmt = formats.output_format(entry.name)
        if fmt.uses_target:
            with pytest.raises(AssertionError, match="given one"):
                fmt.emit(job, say)
        else:
            assert isinstance(fmt.emit(job, say), Emitted)
    assert [e.name for e in formats.REGISTRY if formats.output_format(e.name).reads_template] == [
        "ollama"
    ]
