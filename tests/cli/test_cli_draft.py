"""`--draft PATH|OWNER/REPO[:QUANT]` on the command line: a local file or a hub repository (fake
hub on 127.0.0.1), planned beside the model and written into the command (-md / -hfd)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakehub import FakeHub
from tiny_model import TINY_DRAFT, write_tiny_model
from typer.testing import CliRunner

from quantpick.cli import app

runner = CliRunner()
BOX = ["--gpu", "3090", "--ram", "64G", "--cores", "8", "--no-confirm"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("pair")
    write_tiny_model(d / "tiny.gguf")
    write_tiny_model(d / "Tiny-Draft-Q8_0.gguf", hparams=TINY_DRAFT, seed=1)
    write_tiny_model(d / "Tiny-Draft-Q4_0.gguf", hparams=TINY_DRAFT, seed=1)
    write_tiny_model(d / "Odd-Q8_0.gguf", hparams=dict(TINY_DRAFT, n_vocab=2048), seed=2)
    return d / "tiny.gguf", d / "Tiny-Draft-Q8_0.gguf", d / "Odd-Q8_0.gguf"


def command(*args: str) -> tuple[int, dict, str]:
    result = runner.invoke(app, ["command", *args, *BOX, "--json"])
    doc = json.loads(result.stdout) if result.stdout.strip() else {}
    return result.exit_code, doc, result.stderr


def test_a_local_draft_goes_into_the_command(pair: tuple[Path, Path, Path]) -> None:
    model, draft, _ = pair
    code, doc, err = command("--gguf", str(model), "-c", "4096", "--spec", "draft",
                             "--draft", str(draft))  # fmt: skip
    assert code == 0, err
    spec = doc["plan"]["speculative"]
    assert spec["kind"] == "draft" and spec["draft_model"]["on"] == "CUDA0"
    argv = doc["command"]["argv"]
    i = argv.index("-md")
    assert argv[i + 1] == str(draft.resolve())
    assert argv[argv.index("-devd") + 1] == "CUDA0" and argv[argv.index("-ngld") + 1] == "all"
    assert "15 published" in spec["reason"]


def test_a_hub_draft_is_read_from_its_header_and_fetched_by_llama_server(
    fake_hub: FakeHub, pair: tuple[Path, Path, Path]
) -> None:
    model, draft, _ = pair
    fake_hub.add_repo(
        "org/Tiny-Draft-GGUF",
        {draft.name: draft, "Tiny-Draft-Q4_0.gguf": draft.with_name("Tiny-Draft-Q4_0.gguf")},
    )
    code, doc, err = command("--gguf", str(model), "-c", "4096", "--spec", "draft",
                             "--draft", "org/Tiny-Draft-GGUF")  # fmt: skip
    assert code == 0, err
    argv = doc["command"]["argv"]
    assert argv[argv.index("-hfd") + 1] == "org/Tiny-Draft-GGUF:Q8_0"  # Q8_0 preferred
    assert "-md" not in argv
    code, doc, err = command("--gguf", str(model), "-c", "4096", "--spec", "draft",
                             "--draft", "org/Tiny-Draft-GGUF:q4_0")  # fmt: skip
    assert code == 0, err
    argv = doc["command"]["argv"]
    assert argv[argv.index("-hfd") + 1] == "org/Tiny-Draft-GGUF:Q4_0"
    code, _, err = command("--gguf", str(model), "--spec", "draft",
                           "--draft", "org/Tiny-Draft-GGUF:Q2_K")  # fmt: skip
    assert code == 2 and "no quant Q2_K" in err


def test_an_incompatible_draft_is_one_line_and_the_plan_runs_without(
    pair: tuple[Path, Path, Path],
) -> None:
    model, _, odd = pair
    code, doc, err = command("--gguf", str(model), "-c", "4096", "--spec", "draft",
                             "--draft", str(odd))  # fmt: skip
    assert code == 0, err
    spec = doc["plan"]["speculative"]
    assert not spec["enabled"] and "by more than 128" in spec["reason"]
    assert "-md" not in doc["command"]["argv"] and "--spec-type" not in doc["command"]["argv"]


def test_a_draft_that_is_neither_file_nor_repository_is_a_usage_error(
    pair: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    model, _, _ = pair
    code, _, err = command("--gguf", str(model), "--spec", "draft", "--draft", "nope")
    assert code == 2 and err.count("Error:") == 1 and "--draft nope" in err
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf")
    code, _, err = command("--gguf", str(model), "--spec", "draft", "--draft", str(broken))
    assert code == 2 and "--draft" in err and "Traceback" not in err
