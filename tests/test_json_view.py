"""quantpick/json_view.py: the keys of a JSON document that are an attribute's own name."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from quantpick.json_view import attrs


@dataclass
class Thing:
    zeta: int = 1
    alpha: str = "a"
    mid: list[int] | None = None


def test_the_keys_keep_the_order_named_not_the_class_order() -> None:
    doc = attrs(Thing(mid=[2]), "mid zeta alpha")
    assert list(doc) == ["mid", "zeta", "alpha"]
    assert doc == {"mid": [2], "zeta": 1, "alpha": "a"}


@given(st.permutations(["zeta", "alpha", "mid"]), st.integers())
def test_every_named_attribute_is_read_as_it_is(order: list[str], value: int) -> None:
    thing = Thing(zeta=value)
    doc = attrs(thing, "  ".join(order))
    assert list(doc) == order
    assert all(doc[name] is getattr(thing, name) for name in order)
