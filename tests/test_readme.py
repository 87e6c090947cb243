"""The README's examples are real: hardware files load, the --json error document has the shape
the CLI prints."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from quantpick.machine.describe import resolve_machine
from quantpick.machine.hardware_file import load_hardware_file
from quantpick.units import GiB

README = Path(__file__).resolve().parents[1] / "README.md"


def section(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.DOTALL)


@pytest.mark.parametrize("lang", ["json", "toml"])
def test_hardware_file_examples_load(lang: str, tmp_path: Path) -> None:
    [example] = blocks(section("Hardware files"), lang)
    path = tmp_path / f"box.{lang}"
    path.write_text(example)
    machine = load_hardware_file(path, default_host=None)
    assert [g.index for g in machine.gpus] == [0, 1]
    assert [g.name for g in machine.gpus] == ["NVIDIA GeForce RTX 3090", "Tesla T4"]
    assert machine.host.ram_total_bytes == 64 * GiB and machine.host.cpu_cores == 16
    # and through the same path as --hardware, with --ram on top
    described = resolve_machine(hardware_file=path, ram="32G")
    assert described.described and described.host.ram_total_bytes == 32 * GiB


def test_probe_json_example_has_the_probe_shape() -> None:
    """The JSON example is `probe --json` trimmed: every key it has, probe writes too."""
    from quantpick.machine.spec import Gpu, Host

    [example] = blocks(section("Hardware files"), "json")
    doc = json.loads(example)
    gpu_fields = set(Gpu.__dataclass_fields__)
    host_fields = set(Host.__dataclass_fields__)
    for gpu in doc["machine"]["gpus"]:
        assert set(gpu) <= gpu_fields
    assert set(doc["machine"]["host"]) <= host_fields


def test_json_error_example_is_the_cli_document() -> None:
    from quantpick.cli.output import error_document

    [example] = blocks(section("Commands"), "json")
    doc = json.loads(example)
    error = doc["error"]
    assert doc == error_document(error["message"], error["hint"], error["exit_code"],
                                 error["type"])  # fmt: skip


def test_the_exit_code_table_lists_every_exit_code() -> None:
    from quantpick.errors import ExitCode

    table = {int(m) for m in re.findall(r"^\| (\d+) \|", section("Exit codes"), flags=re.M)}
    assert table == {int(c) for c in ExitCode}


def _recorder():  # the script that records the sessions
    from script_module import load_script

    return load_script("record_readme_sessions")


@pytest.mark.llamacpp
def test_the_offline_sessions_print_what_the_readme_shows(
    llamacpp_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every offline `$ quantpick ...` session (bundled manifest, described machine) prints what
    the README shows, as the README shows it; re-record with scripts/record_readme_sessions.py.
    The sessions were recorded with the pinned llama.cpp on PATH (their compute rule is its)."""
    import os

    monkeypatch.setenv("PATH", f"{llamacpp_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    rec = _recorder()
    lines = README.read_text(encoding="utf-8").split("\n")
    found = rec.sessions(lines)
    assert len(found) >= 10
    moved = []
    for start, end in found:
        old = lines[start + 1 : end]
        if rec.rerecorded(old, rec.run(lines[start][2:])) != old:
            moved.append(f"README.md:{start + 1}: {lines[start]}")
    assert moved == [], "run scripts/record_readme_sessions.py:\n" + "\n".join(moved)
