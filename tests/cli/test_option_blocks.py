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
