"""Byte sizes: parsing user input ("24G", "16GiB", "24GB", "64" = 64 GiB) and formatting for
people; context lengths ("128K" = 131072 tokens). Pure.

Every size quantpick reads is a memory size (VRAM, RAM, overheads, reserves), and memory is sold
in binary units under decimal names, so GB, MB, KB and TB are read as GiB, MiB, KiB and TiB, as G
and GiB are; `size_note` says so whenever a size could be read two ways (a unit that looks
decimal, or none at all).
"""

from __future__ import annotations

import re

from quantpick.errors import UsageError

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4
GB = 10**9
MB = 10**6

# A size with no unit is in GiB: `--ram 64`, `--gpu 3090:24`, `vram = 24` in a hardware file.
# Sizes are mostly GPU and RAM sizes, which are stated in GB and (for VRAM) mean GiB; bytes were
# never what a bare "64" meant. Bytes need a B: "1024B". The CLI notes each bare number it reads.
BARE_SIZE_UNIT = GiB
# A bare number above this (1 PiB when read as GiB) is refused: it is almost surely a byte count.
MAX_BARE_SIZE = 1024**2
# A memory size's "GB" is 2^30 bytes: a "24 GB" RTX 3090 has 24 GiB (NVML reports 25,769,803,776
# B), a "64 GB" DIMM kit 64 GiB, and JEDEC defines the G of memory capacity as 2^30 (JESD100B.01,
# "giga"). Read as 10^9, `--gpu 3090:24GB` would plan a 22.35 GiB card and change the pick.
_UNITS = {
    "b": 1,
    "k": KiB, "kib": KiB, "kb": KiB,
    "m": MiB, "mib": MiB, "mb": MiB,
    "g": GiB, "gib": GiB, "gb": GiB,
    "t": TiB, "tib": TiB, "tb": TiB,
}  # fmt: skip
# Units a reader might take for decimal: a note says how they are read.
_DECIMAL_LOOKING = {"kb": "KiB", "mb": "MiB", "gb": "GiB", "tb": "TiB"}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
SIZE_HINT = "write e.g. 24G, 24GiB or 900MiB (a bare number is GiB; bytes need a B: 1024B)"
SIZE_READING = "memory sizes are binary: a 24 GB card holds 24 GiB"
# The reading, stated in every --json machine summary.
SIZE_UNITS = f"binary: K/KB/KiB = 1024 B, G/GB/GiB = 2^30 B, no unit = GiB ({SIZE_READING})"


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
    """Parse a size: K/M/G/T, KiB... and KB/MB/GB/TB all binary (memory sizes); B bytes; no unit
    = GiB."""
    match = _SIZE_RE.match(text)
    if match is None:
        raise UsageError(f"cannot read size {text!r}", hint=SIZE_HINT)
    unit = match.group(2).lower()
    if unit == "":
        return bare_size(float(match.group(1)), match.group(1))
    if unit not in _UNITS:
        raise UsageError(f"cannot read size {text!r}", hint=SIZE_HINT)
    return int(float(match.group(1)) * _UNITS[unit])


def size_note(what: str, text: str | int | float) -> str | None:
    """How a size that could be read two ways is read, for a note on stderr: a bare number
    ("--ram 64 is read as 64 GiB ...") or a decimal-looking unit ("--ram 64GB is read as 64 GiB
    ..."); None for an unambiguous one (64G, 64GiB, 1024B)."""
    shown = str(text).strip()
    if is_bare_number(text):
        return f"{what} is read as {shown} GiB (no unit: sizes GiB, bandwidths GB/s)"
    match = _SIZE_RE.match(shown)
    if match is None or match.group(2).lower() not in _DECIMAL_LOOKING:
        return None
    unit = _DECIMAL_LOOKING[match.group(2).lower()]
    return f"{what} is read as {match.group(1)} {unit} ({SIZE_READING})"


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


# ---- context lengths (tokens) -------------------------------------------------------------------

# `-c 128K` is how llama.cpp users write a context (model cards say "128K context" for 131072):
# K = 1024 tokens, M = 1024 K.
_CONTEXT_RE = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)\s*([kKmM]?)\s*$")
_CONTEXT_UNITS = {"": 1, "k": 1024, "m": 1024**2}
# llama_context_params.n_ctx is a uint32_t (include/llama.h).
MAX_CONTEXT = 2**32 - 1
CONTEXT_HINT = "write e.g. 131072, 128K or 1M (K = 1024 tokens); 0 is the model's own context"


def parse_context(text: str | int) -> int:
    """A context length in tokens: 131072, "131072", "128K", "128k", "1M", "0.5M". A negative
    one is returned as it is, for the command's own bounds check (options.check_run_options)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value: float = text
    else:
        match = _CONTEXT_RE.match(str(text))
        if match is None:
            raise UsageError(f"cannot read {str(text)!r} as a context length", hint=CONTEXT_HINT)
        value = float(match.group(1)) * _CONTEXT_UNITS[match.group(2).lower()]
        if value != int(value):
            raise UsageError(f"{text!r} is not a whole number of tokens", hint=CONTEXT_HINT)
    if value > MAX_CONTEXT:
        raise UsageError(
            f"{text!r}: a context is 0 to {MAX_CONTEXT} tokens (llama.cpp's n_ctx is 32-bit)",
            hint=CONTEXT_HINT,
        )
    return int(value)
