"""cli.output: strict JSON on stdout."""

from __future__ import annotations

import json
import sys

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


def test_piped_stderr_is_drawn_wide_unwrapped_and_without_trailing_blanks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 30: a piped/logged stderr drew llama.cpp's projection table 80 columns wide
    ("projec…", "CPU" / "(Host)" split over two lines), broke long lines mid-word, and padded
    lines with blanks."""
    import io

    from rich.table import Table

    from quantpick.cli import output

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    table = Table(title="llama.cpp's projection")
    for col in ("device", "model MiB", "context MiB", "compute MiB", "projected MiB",
                "free MiB", "headroom MiB", "agrees"):  # fmt: skip
        table.add_column(col)
    table.add_row("CPU (Host)", "20480", "4096", "512", "25088", "30000", "4912", "yes")
    table.add_row("CUDA0 (NVIDIA GeForce RTX 3090)", "1", "2", "3", "4", "5", "6", "no")
    con = output.stderr()
    con.print(table)
    why = "Why: " + "Q5_K_M (near-lossless, KLD 0.0070), experts partly in RAM; " * 3
    con.print(why.strip())
    con.file.flush()
    text = log.getvalue()
    lines = text.splitlines()
    assert "…" not in text and "CPU (Host)" in text and "projected MiB" in text
    assert why.strip() in lines  # one line, not broken at 80 columns
    assert max(len(line) for line in lines) > 80
    assert all(line == line.rstrip() for line in lines)
