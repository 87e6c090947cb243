"""cli/option_blocks.py: options several commands take together, declared once and put into each
command's signature where the command names the block (so --help keeps its order)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from quantpick.cli.option_blocks import MACHINE, MACHINE_DETAILS, OptionBlock, with_blocks

runner = CliRunner()


def test_a_block_stands_where_its_placeholder_is() -> None:
    app = typer.Typer()
    seen: dict[str, Any] = {}

    @app.command()
    @with_blocks
    def cmd(first: int = 1, machine: OptionBlock = MACHINE, last: int = 2, **options: Any) -> None:
        seen.update(first=first, last=last, **options)

    names = list(inspect.signature(cmd).parameters)
    assert names == ["first", *(p.name for p in MACHINE.params), "last"]
    result = runner.invoke(app, ["--gpu", "3090", "--gpu", "t4", "--ram", "64G", "--last", "3"])
    assert result.exit_code == 0, result.output
    assert seen["gpu"] == ["3090", "t4"] and seen["ram"] == "64G" and seen["last"] == 3
    assert seen["hardware"] is None and seen["cpu_only"] is False
    assert "machine" not in seen  # the placeholder is not an option


def test_an_option_in_two_places_is_refused() -> None:
    def cmd(gpu: str = "", machine: OptionBlock = MACHINE, **options: Any) -> None: ...

    with pytest.raises(TypeError, match="given twice"):
        with_blocks(cmd)


@pytest.mark.parametrize(
    ("command", "blocks"),
    [
        ("pick", (MACHINE, MACHINE_DETAILS)),
        ("max-context", (MACHINE, MACHINE_DETAILS)),
        ("estimate", (MACHINE, MACHINE_DETAILS)),
        ("command", (MACHINE, MACHINE_DETAILS)),
        ("get", (MACHINE, MACHINE_DETAILS)),
        ("check", (MACHINE,)),
    ],
)
def test_the_commands_take_the_blocks_whole_and_in_order(
    command: str, blocks: tuple[OptionBlock, ...]
) -> None:
    from quantpick.cli import app

    root = typer.main.get_command(app)
    params = [p.name for p in root.commands[command].params]  # type: ignore[attr-defined]
    for block in blocks:
        names = [p.name for p in block.params]
        start = params.index(names[0])
        assert params[start : start + len(names)] == names


def test_takes_puts_own_and_shared_options_in_the_order_named() -> None:
    from quantpick.cli.option_blocks import SHARED, takes

    app = typer.Typer()
    seen: dict[str, Any] = {}

    @app.command()
    @takes("model own ctx_size", MACHINE, "json_", model="m")
    def cmd(own: int = 7, **given: Any) -> None:
        seen.update(own=own, **given)

    names = list(inspect.signature(cmd).parameters)
    assert names == ["model", "own", "ctx_size", *(p.name for p in MACHINE.params), "json_"]
    result = runner.invoke(app, ["-c", "8K", "--gpu", "t4", "--json"])
    assert result.exit_code == 0, result.output
    assert seen["own"] == 7 and seen["ctx_size"] == 8192 and seen["gpu"] == ["t4"]
    assert seen["json_"] is True and seen["model"] == "m"
    assert SHARED["ctx_size"].default == 0  # the shared default stands where not overridden


def test_takes_gives_a_shared_option_a_command_default() -> None:
    from quantpick.cli.option_blocks import SHARED, takes

    @takes("spec", spec="off")
    def cmd(**given: Any) -> None: ...

    assert inspect.signature(cmd).parameters["spec"].default == "off"
    assert SHARED["spec"].default == "auto"  # the registry is not changed


@pytest.mark.parametrize(
    ("spec", "defaults", "message"),
    [
        ("model", {"spec": "off"}, "not among"),  # a default for an option not taken
        ("model", {}, "not among"),  # the command's own parameter not named
        ("model own model", {}, "given twice"),
    ],
)
def test_takes_refuses_a_spec_that_does_not_add_up(
    spec: str, defaults: dict[str, Any], message: str
) -> None:
    from quantpick.cli.option_blocks import takes

    def cmd(own: int = 1, **given: Any) -> None: ...

    with pytest.raises(TypeError, match=message):
        takes(spec, **defaults)(cmd)


def test_every_shared_option_has_its_default_in_one_place() -> None:
    """No command module declares a shared option again: its flags and help are in
    cli/option_table.py, its default in option_blocks.SHARED."""
    import ast
    from pathlib import Path

    import quantpick.cli
    from quantpick.cli import option_table
    from quantpick.cli.option_blocks import SHARED

    cli = Path(quantpick.cli.__file__).parent
    for path in cli.glob("*.py"):
        if path.name in ("option_blocks.py", "option_table.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                "command" in ast.unparse(d) for d in node.decorator_list
            ):
                for arg in node.args.args:
                    annotation = ast.unparse(arg.annotation) if arg.annotation else ""
                    assert "typer." not in annotation, f"{path.name}: {node.name}({arg.arg})"
                    shared = getattr(SHARED.get(arg.arg), "annotation", None)
                    alias = getattr(option_table, annotation, None)
                    assert alias is None or alias is not shared, (
                        f"{path.name}: {node.name} declares --{arg.arg} again"
                    )
