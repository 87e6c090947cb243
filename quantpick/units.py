"""Byte sizes: parsing user input ("24G", "16GiB", "900MB") and formatting for people. Pure."""

from __future__ import annotations

import re

from quantpick.errors import UsageError

KiB = 1024
MiB = 1024**2
GiB = 1024**3
GB = 10**9
MB = 10**6

_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "kb": 1000,
    "m": MiB,
    "mib": MiB,
    "mb": MB,
    "g": GiB,
    "gib": GiB,
    "gb": GB,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 10**12,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse a size: bare number = bytes; K/M/G/T and KiB... binary; KB/MB/GB decimal."""
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise UsageError(f"cannot read size {text!r}", hint="write e.g. 24G, 24GiB, 16GB or 900MiB")
    return int(float(match.group(1)) * _UNITS[unit])


def gib(n_bytes: int | float) -> str:
    """'21.3 GiB'."""
    return f"{n_bytes / GiB:.2f} GiB"


def gb(n_bytes: int | float) -> str:
    """'21.713 GB' (decimal, as hub cards state sizes)."""
    return f"{n_bytes / GB:.3f} GB"


def mib(n_bytes: int | float) -> str:
    return f"{n_bytes / MiB:.0f} MiB"


def human(n_bytes: int | float) -> str:
    """Binary units picked by magnitude, for tables."""
    value = float(n_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value >= size:
            return f"{sign}{value / size:.2f} {unit}"
    return f"{sign}{int(value)} B"
