"""Shell completions: the committed scripts are fresh, and completion answers from the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_committed_completions_are_fresh() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    from gen_completions import SHELLS, completion_script

    for shell in SHELLS:
        committed = (ROOT / "completions" / f"quantpick.{shell}").read_text()
        assert committed == completion_script(shell), (
            f"completions/quantpick.{shell} is stale: run python scripts/gen_completions.py"
        )


def complete(env: dict[str, str]) -> str:
    return subprocess.run(
        [sys.executable, "-m", "quantpick"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


@pytest.mark.parametrize(
    ("words", "cword", "expected"),
    [
        ("quantpick pi", "1", "pick"),
        ("quantpick pick --pre", "2", "--prefer"),
        ("quantpick show qwen3.8", "2", "qwen3.8-35b-a3b-distill"),
        ("quantpick manifest ch", "2", "check"),
    ],
)
def test_bash_completion_answers(words: str, cword: str, expected: str) -> None:
    out = complete(
        {
            "_QUANTPICK_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": cword,
            "QUANTPICK_OFFLINE": "1",
        }
    )
    assert expected in out.split()


def test_fish_and_zsh_completion_answer() -> None:
    fish = complete(
        {
            "_QUANTPICK_COMPLETE": "complete_fish",
            "_TYPER_COMPLETE_ARGS": "quantpick ma",
            "_TYPER_COMPLETE_FISH_ACTION": "get-args",
        }
    )
    assert "max-context" in fish and "manifest" in fish
    zsh = complete({"_QUANTPICK_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "quantpick pro"})
    assert "probe" in zsh


def test_main_loads_only_the_command_it_runs() -> None:
    """The console script builds just the invoked command's module (start-up), yet help and
    completion see every command."""
    from quantpick.cli import COMMAND_MODULE, MODULES, _modules_for

    assert _modules_for(["pick", "m", "-c", "4096"]) == ("plan",)
    assert _modules_for(["--help"]) == MODULES and _modules_for([]) == MODULES
    assert _modules_for(["no-such-command"]) == MODULES
    assert set(COMMAND_MODULE.values()) == set(MODULES)
    out = subprocess.run(
        [sys.executable, "-m", "quantpick", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in COMMAND_MODULE:
        assert f"  {command} " in out, command
