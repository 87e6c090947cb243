"""cli.output: strict JSON on stdout."""

from __future__ import annotations

import json

import pytest

from quantpick.cli import output


def test_json_never_carries_a_bare_nan(capsys: pytest.CaptureFixture[str]) -> None:
    # Before: json.dumps wrote NaN / Infinity bare, which no strict JSON parser reads.
    output.print_json({"speed": {"decode": float("nan"), "list": [1.0, float("inf")]}, "ok": 2.5})
    out, err = capsys.readouterr()

    def refuse(name: str) -> None:
        raise AssertionError(name)

    doc = json.loads(out, parse_constant=refuse)
    assert doc == {"schema_version": 1, "speed": {"decode": None, "list": [1.0, None]}, "ok": 2.5}
    assert err == (
        "Warning: not a number in the output, written as null: speed.decode, speed.list[1]\n"
    )


def test_finite_documents_are_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    output.print_json({"a": (1, 2), "b": 0.5})
    out, err = capsys.readouterr()
    assert json.loads(out) == {"schema_version": 1, "a": [1, 2], "b": 0.5} and err == ""
