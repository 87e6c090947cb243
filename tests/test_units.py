"""Sizes: one rule everywhere a size is read (`--ram 64` is 64 GiB, bytes need a B)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantpick.errors import UsageError
from quantpick.units import GiB, KiB, MiB, is_bare_number, parse_size, size_note


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("64", 64 * GiB),  # no unit: GiB, like the G a VRAM or RAM size is stated in
        ("0.5", GiB // 2),
        ("24G", 24 * GiB),
        ("24GiB", 24 * GiB),
        ("16GB", 16 * GiB),  # a memory size's GB is GiB: a "16 GB" card holds 16 GiB
        ("900MB", 900 * MiB),
        ("2TB", 2 * 1024**4),
        ("900MiB", 900 * MiB),
        ("900M", 900 * MiB),
        ("4k", 4 * KiB),
        ("1024B", 1024),
        ("1024b", 1024),
        (" 64 G ", 64 * GiB),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "G", "64 GiBs", "-1G", "1e9", "64X"])
def test_unreadable_sizes_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_size(text)
    assert info.value.hint is not None and "bare number is GiB" in info.value.hint


def test_a_byte_count_without_unit_is_refused_not_read_as_exabytes() -> None:
    with pytest.raises(UsageError) as info:
        parse_size("68719476736")
    assert info.value.hint is not None and "68719476736B" in info.value.hint


@given(st.integers(min_value=0, max_value=1024**2))
def test_bare_number_is_the_same_as_g(n: int) -> None:
    assert parse_size(str(n)) == parse_size(f"{n}G") == parse_size(f"{n}GiB") == n * GiB
    assert is_bare_number(str(n)) and not is_bare_number(f"{n}G")


@pytest.mark.parametrize(
    ("text", "note"),
    [
        ("64", "--ram 64 is read as 64 GiB (no unit"),
        ("64GB", "--ram 64GB is read as 64 GiB (memory sizes are binary"),
        ("512mb", "--ram 512mb is read as 512 MiB (memory sizes are binary"),
        ("64G", None),
        ("64GiB", None),
        ("1024B", None),
    ],
)
def test_every_size_read_two_ways_says_how(text: str, note: str | None) -> None:
    """`--ram 64GB` used to be 59.6 GiB without a word; bare numbers had a note. Now both say
    how they are read, and both mean GiB."""
    got = size_note(f"--ram {text}", text)
    assert got == note if note is None else got is not None and got.startswith(note)
