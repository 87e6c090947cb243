"""quantpick.safe_names: the one rule for names that become paths, including length limits and
names that cannot coexist on one disk."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantpick.errors import VerificationError
from quantpick.safe_names import (
    MAX_COMPONENT_BYTES,
    MAX_NAME_BYTES,
    SUFFIX_ALLOWANCE_BYTES,
    name_problem,
    path_conflicts,
    safe_relative_name,
    shown,
)

LIMIT = MAX_COMPONENT_BYTES - SUFFIX_ALLOWANCE_BYTES


def test_component_length_is_measured_in_utf8_bytes() -> None:
    assert name_problem("a" * LIMIT) is None
    assert "component" in (name_problem("a" * (LIMIT + 1)) or "")
    # 'é' is two bytes: half as many characters reach the same limit
    assert name_problem("é" * (LIMIT // 2)) is None
    assert "component" in (name_problem("é" * (LIMIT // 2 + 1)) or "")
    # room for ".part.json", ".lock" and ".bad-<sha12>" beside the longest accepted name
    assert len(("a" * LIMIT + ".bad-0123456789ab").encode()) <= MAX_COMPONENT_BYTES


def test_whole_name_length() -> None:
    ok = "/".join(["d" * 100] * (MAX_NAME_BYTES // 101))
    assert name_problem(ok) is None
    too_long = "d/" * 2500 + "x.gguf"
    problem = name_problem(too_long)
    assert problem is not None and "PATH_MAX" in problem
    with pytest.raises(VerificationError) as info:
        safe_relative_name(too_long)
    assert len(info.value.message) < 400  # the name is shown cut, with its size


def test_lone_surrogates_are_refused() -> None:
    assert "surrogate" in (name_problem("a\udcff.gguf") or "")


def test_file_and_folder_conflicts_name_both_sides() -> None:
    conflicts = path_conflicts(["a.gguf", "a.gguf/b.gguf", "c/d.gguf", "c/e.gguf", "x/y/z"])
    assert set(conflicts) == {"a.gguf", "a.gguf/b.gguf"}
    assert path_conflicts(["x", "x/y/z"]) and path_conflicts(["x/y", "x/y/z"])
    assert path_conflicts(["BF16/a.gguf", "BF16/b.gguf", "BF16.gguf"]) == {}


@given(st.lists(st.from_regex(r"[a-c]{1,2}(/[a-c]{1,2}){0,2}", fullmatch=True), max_size=8))
def test_conflicts_are_exactly_the_names_that_cannot_coexist(names: list[str]) -> None:
    conflicts = path_conflicts(names)
    files = set(names)
    for name in files:
        prefixes = {"/".join(name.split("/")[:i]) for i in range(1, name.count("/") + 1)}
        is_prefix_of_other = any(other.startswith(name + "/") for other in files)
        assert (name in conflicts) == bool(prefixes & files or is_prefix_of_other)


def test_shown_cuts_long_names() -> None:
    assert shown("a.gguf") == "'a.gguf'"
    text = shown("x" * 5000)
    assert len(text) < 140 and "(5000 bytes)" in text
