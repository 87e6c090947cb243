"""Byte sizes: parsing user input ("24G", "16GiB", "900MB", "64" = 64 GiB) and formatting for
people. Pure."""

from __future__ import annotations

import re

from quantpick.errors import UsageError

KiB = 1024
MiB = 1024**2
GiB = 1024**3
GB = 10**9
MB = 10**6

# A size with no unit is in GiB: `--ram 64`, `--gpu 3090:24`, `vram = 24` in a hardware file.
# Sizes are mostly GPU and RAM sizes, which are stated in GB and (for VRAM) mean GiB; bytes were
# never what a bare "64" meant. Bytes need a B: "1024B". The CLI notes each bare number it reads.
BARE_SIZE_UNIT = GiB
# A bare number above this (1 PiB when read as GiB) is refused: it is almost surely a byte count.
MAX_BARE_SIZE = 1024**2
_UNITS = {
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
SIZE_HINT = "write e.g. 24G, 24GiB, 16GB or 900MiB (a bare number is GiB; bytes need a B: 1024B)"


def is_bare_number(text: str | int | float) -> bool:
    """A size or bandwidth written without a unit ("64", 64): read as GiB / GB/s."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return True
    match = _SIZE_RE.match(str(text))
    return match is not None and match.group(2) == ""


def bare_size(value: float, text: str) -> int:
    """A unit-less size, in GiB; a number too big to be GiB is refused (it looks like bytes)."""
    if value > MAX_BARE_SIZE:
        raise UsageError(
            f"size {text!r}: a number without a unit is GiB, and {text} GiB is not a machine",
            hint=f"for bytes write {text}B; or a unit, e.g. 64G",
        )
    return int(value * BARE_SIZE_UNIT)


def parse_size(text: str) -> int:
    """Parse a size: K/M/G/T and KiB... binary; KB/MB/GB decimal; B bytes; no unit = GiB."""
    match = _SIZE_RE.match(text)
    if match is None:
        raise UsageError(f"cannot read size {text!r}", hint=SIZE_HINT)
    unit = match.group(2).lower()
    if unit == "":
        return bare_size(float(match.group(1)), match.group(1))
    if unit not in _UNITS:
        raise UsageError(f"cannot read size {text!r}", hint=SIZE_HINT)
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
