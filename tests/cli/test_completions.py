"""Shell completions: the committed scripts are fresh, and completion answers from the CLI."""

from __future__ import annotations

import os
import shutil
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


# ---- values after an option: answered by quantpick.cli.complete before typer loads ------------

MODEL = "qwen3.8-35b-a3b-distill"
VALUE_CASES = [
    (["pick", MODEL, "--quant"], "", "Q4_K_M"),
    (["pick", "-c", "8192", MODEL, "-q"], "IQ", "IQ4_XS"),
    (["download", "qwen3.6-35b-a3b-unsloth", "--quant"], "UD-Q4", "UD-Q4_K_M"),
    (["pick", "--gpu"], "30", "3090"),
    (["get", MODEL, "--gpu"], "", "t4"),
    (["pick", "--prefer"], "", "speed"),
    (["get", "m", "--format"], "", "systemd"),
    (["command", "m", "--model-source"], "", "hf"),
    (["estimate", "m", "-ctk"], "q", "q8_0"),
    (["pick", MODEL, "--spec"], "", "auto"),
    (["serve", MODEL, "--spec"], "m", "mtp"),
    (["bench", "--spec"], "", "ngram"),
    (["estimate", MODEL, "--spec"], "", "ngram"),
    (["estimate", "m", "--cache-type-v"], "", "iq4_nl"),
    (["pick", "--kv"], "", "q5_1"),
    (["pick", "m", "-fa"], "", "auto"),
    (["download", "m", "--source"], "", "modelscope"),
    (["manifest", "add", "org/x", "--source"], "", "modelscope"),
    (["pick"], "", MODEL),
    (["show"], "qwen3.6", "qwen3.6-35b-a3b-unsloth"),
    (["get"], "qwen3.8", MODEL),
]


def _typer_answer(args: list[str], incomplete: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What typer's own completion (the autocompletion callbacks) answers, in-process."""
    import shlex

    import typer.main
    from typer._completion_classes import BashComplete

    from quantpick.cli import app

    monkeypatch.setenv("COMP_WORDS", shlex.join(["quantpick", *args, incomplete]))
    monkeypatch.setenv("COMP_CWORD", str(len(args) + 1))
    complete = BashComplete(typer.main.get_command(app), {}, "quantpick", "_QUANTPICK_COMPLETE")
    return [item.value for item in complete.get_completions(args, incomplete)]


@pytest.mark.parametrize(("args", "incomplete", "expected"), VALUE_CASES)
def test_fast_values_are_typers_values(
    args: list[str], incomplete: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quantpick.cli.complete import value_items

    fast = value_items(args, incomplete)
    assert fast is not None, "answered before typer loads"
    values = [v for v, _ in fast]
    assert expected in values
    assert values == _typer_answer(args, incomplete, monkeypatch)


def test_fast_value_table_matches_the_commands() -> None:
    """Every option in complete.OPTION_VALUES exists on the commands it lists, and every
    command that has one of those options is listed (so the fast path never guesses)."""
    import typer.main

    from quantpick.cli import app
    from quantpick.cli.complete import OPTION_VALUES

    root = typer.main.get_command(app)
    commands = {n: c for n, c in root.commands.items() if n != "manifest"}  # type: ignore[attr-defined]
    commands.update({f"manifest {n}": c for n, c in root.commands["manifest"].commands.items()})  # type: ignore[attr-defined]
    for option, entries in OPTION_VALUES.items():
        listed = {name for names, _ in entries for name in names}
        having = {n for n, c in commands.items() if any(option in p.opts for p in c.params)}
        assert listed == having, option


@pytest.mark.parametrize(("args", "incomplete"), [([], ""), ([], "ma"), (["manifest"], "")])
def test_fast_command_names_are_typers(
    args: list[str], incomplete: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quantpick.cli import COMMAND_MODULE
    from quantpick.cli.complete import COMMANDS, command_items

    items = command_items(args, incomplete)
    assert items is not None and items
    # typer lists commands in the order their modules were imported (tests import them in any
    # order); the console script imports them in --help order, which COMMANDS follows.
    assert sorted(v for v, _ in items) == sorted(_typer_answer(args, incomplete, monkeypatch))
    assert COMMANDS == tuple(COMMAND_MODULE)


def test_not_a_value_falls_through_to_typer() -> None:
    from quantpick.cli.complete import value_items

    assert value_items(["pick"], "--pre") is None  # an option name
    assert value_items(["pick", MODEL], "qwen") is None  # a second positional word
    assert value_items(["pick", "-c"], "") is None  # -c's value: not offered
    assert value_items(["verify"], "") is None  # a directory, not MODEL
    assert value_items(["probe", "--prefer"], "") is None  # not an option of probe
    assert value_items([], "pi") is None  # a command name


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"_QUANTPICK_COMPLETE": "complete_bash", "COMP_WORDS": f"quantpick pick {MODEL} -q IQ",
          "COMP_CWORD": "4"}, "IQ4_XS\nIQ3_M\nIQ2_M\n"),
        ({"_QUANTPICK_COMPLETE": "complete_zsh",
          "_TYPER_COMPLETE_ARGS": "quantpick pick --prefer s"}, "_arguments '*: :((\"speed\"))'\n"),
        ({"_QUANTPICK_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "get-args",
          "_TYPER_COMPLETE_ARGS": "quantpick pick --gpu 309"},
         "3090\tNVIDIA GeForce RTX 3090\n3090ti\tNVIDIA GeForce RTX 3090 Ti\n"),
    ],
)  # fmt: skip
def test_value_completion_in_each_shell(env: dict[str, str], expected: str) -> None:
    assert complete(env) == expected


# ---- the README's install steps work in a fresh home -------------------------------------------


def _readme_block(heading: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_completion_install_steps_work_in_a_fresh_home(tmp_path: Path) -> None:
    commands = _readme_block("Shell completions")
    assert any("mkdir -p" in c for c in commands)
    home = tmp_path / "home"
    home.mkdir()
    # `quantpick` as installed (the venv's console script), run from elsewhere than the repo
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = {**os.environ, "HOME": str(home), "PATH": path}
    env.pop("XDG_DATA_HOME", None)
    env.pop("XDG_CONFIG_HOME", None)
    for command in commands:
        done = subprocess.run(["sh", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, f"{command}: {done.stderr}"
    installed = {
        "bash": home / ".local/share/bash-completion/completions/quantpick",
        "zsh": home / ".zfunc/_quantpick",
        "fish": home / ".config/fish/completions/quantpick.fish",
    }
    for shell, file in installed.items():
        committed = (ROOT / "completions" / f"quantpick.{shell}").read_text()
        assert file.read_text() == committed  # byte for byte: no blank first line
    # compinit reads `#compdef` on the first line only (it began with a blank line)
    assert installed["zsh"].read_text().startswith("#compdef quantpick\n")
    if shutil.which("bash"):  # bash really registers it
        check = f"source {installed['bash']} && complete -p quantpick"
        done = subprocess.run(["bash", "-c", check], env=env, capture_output=True, text=True)
        assert done.returncode == 0 and "_quantpick_completion" in done.stdout, done.stderr


def test_spec_values_are_the_modes_the_commands_take() -> None:
    """--spec's completions are exactly what the commands accept: every value passes
    PlanOptions.request() (estimate: its own kinds), and a mode left out is refused."""
    from quantpick.cli.complete import ESTIMATE_SPEC_CHOICES, SPEC_CHOICES
    from quantpick.cli.groups import PlanOptions
    from quantpick.errors import UsageError
    from quantpick.plan.speculative import SpecMode

    accepted = set()
    for mode in SpecMode:
        try:
            PlanOptions(model="m", spec=mode.value).request()
        except UsageError:
            continue
        accepted.add(mode.value)
    assert set(SPEC_CHOICES) == accepted
    assert set(ESTIMATE_SPEC_CHOICES) <= accepted and "auto" not in ESTIMATE_SPEC_CHOICES
