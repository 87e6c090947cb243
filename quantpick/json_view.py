"""JSON documents built from typed state: the keys that are an attribute's own name, listed once."""

from __future__ import annotations

from typing import Any


def attrs(obj: Any, names: str) -> dict[str, Any]:
    """`{name: obj.name}` for the space-separated `names`, in that order (the order of the
    document's keys: `--json` output keeps it)."""
    return {name: getattr(obj, name) for name in names.split()}
