"""The vendors' own management tools, where installed: AMD's `rocm-smi` (JSON) and Intel's
`xpu-smi` (JSON). They name the card ("Radeon RX 7900 XT", "Intel(R) Data Center GPU Max 1100"),
which amdgpu's sysfs does not, and give Intel's discrete memory, which no sysfs file does.

Each tool is run bounded (process.run_tool: its own process group, stdout capped, killed at the
deadline); a tool that is slow, fails, prints too much or prints what is not its JSON is named
in a note and its GPUs are not taken from it (the caller falls back to sysfs, or plans without
them). The parsers are pure and tested on recorded real outputs (tests/data/backends/README.md).

AMD's newer `amd-smi` (which replaces rocm-smi) is read for what a recorded real output shows:
`amd-smi static --json` names each GPU and its PCI address and states its VRAM (on an APU the
carve-out only), so it names the cards sysfs measures (devices.platform_gpus). No real
`amd-smi metric --json` output with memory use has been found, so amd-smi's figures never size
a GPU.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# `rocm-smi --json` for 8 cards is about 4 KB; `xpu-smi discovery -d N -j` about 2 KB.
MAX_SMI_OUTPUT_BYTES = 256 * 1024
# rocm-smi and xpu-smi answer in well under a second; xpu-smi starts its daemon's client.
SMI_TIMEOUT_S = 10.0
ROCM_SMI_ARGS = ("--showproductname", "--showmeminfo", "vram", "gtt", "--json")
XPU_SMI_LIST_ARGS = ("discovery", "-j")
AMD_SMI_STATIC_ARGS = ("static", "--asic", "--bus", "--vram", "--json")
# amd-smi's {"value", "unit"} sizes: "MB" is MiB (a Strix Halo's 32 GiB carve-out prints 32768 MB
# in the recorded output, tests/data/backends/amd-smi-static-strix-halo.json).
AMD_SMI_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}
MAX_AMD_SMI_GPUS = 64
MAX_XPU_DEVICES = 64


@dataclass(frozen=True)
class SmiGpu:
    """One GPU as a vendor tool reports it."""

    index: int  # the tool's own index (rocm-smi's cardN order, xpu-smi's device_id)
    name: str
    total_bytes: int
    used_bytes: int | None = None
    free_bytes: int | None = None
    gtt_total_bytes: int | None = None  # AMD: the GTT pool (an APU's real pool)
    gtt_used_bytes: int | None = None
    bdf: str | None = None  # the PCI address ("0000:c4:00.0"), where the tool states it


def _bytes(value: Any, where: str) -> int:
    """A byte count as the tools print it: a decimal string or an integer."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: not a byte count ({value!r})")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise ValueError(f"{where}: not a byte count ({str(value)[:40]!r})")


def _optional_bytes(doc: dict[str, Any], key: str, where: str) -> int | None:
    value = doc.get(key)
    if value is None or value == "N/A":
        return None
    return _bytes(value, f"{where} {key}")


def _json_value(text: str, tool: str) -> Any:
    """The JSON value in a tool's stdout, from its first bracket (rocm-smi may print a WARNING
    line before it)."""
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        raise ValueError(f"{tool}: no JSON in its output")
    try:
        return json.loads(text[start:])
    except json.JSONDecodeError as exc:
        raise ValueError(f"{tool}: not JSON ({exc.msg} at line {exc.lineno})") from None


def _json_object(text: str, tool: str) -> dict[str, Any]:
    """The JSON object in a tool's stdout."""
    doc = _json_value(text, tool)
    if not isinstance(doc, dict):
        raise ValueError(f"{tool}: not a JSON object")
    return doc


def _indexed(
    entries: Any, limit: int, index_key: str, not_a_list: str, no_index: str
) -> Iterator[dict[str, Any]]:
    """A tool's list of devices, its first `limit` entries, each an object whose `index_key` is
    an integer: a ValueError saying `not_a_list`, or `no_index` at the first entry without it."""
    if not isinstance(entries, list):
        raise ValueError(not_a_list)
    for entry in entries[:limit]:
        if not isinstance(entry, dict) or not isinstance(entry.get(index_key), int):
            raise ValueError(no_index)
        yield entry


_CARD = re.compile(r"card(\d+)")


def parse_rocm_smi_json(text: str) -> tuple[SmiGpu, ...]:
    """`rocm-smi --showproductname --showmeminfo vram [gtt] --json`: {"cardN": {...}} with
    "VRAM Total Memory (B)", "VRAM Total Used Memory (B)", "GTT Total Memory (B)", ... as decimal
    strings, and the product in "Card Series" (older releases: "Card series"). Entries that are
    not cards ("system") are skipped; a card without its VRAM total is a ValueError."""
    doc = _json_object(text, "rocm-smi")
    gpus = []
    for key in sorted(doc, key=lambda k: (len(k), k)):
        m = _CARD.fullmatch(key)
        if m is None:
            continue
        card = doc[key]
        if not isinstance(card, dict):
            raise ValueError(f"rocm-smi {key}: not an object")
        where = f"rocm-smi {key}"
        name = card.get("Card Series") or card.get("Card series") or "AMD GPU"
        gpus.append(
            SmiGpu(
                index=int(m.group(1)),
                name=str(name)[:120],
                total_bytes=_bytes(card.get("VRAM Total Memory (B)"), f"{where} VRAM total"),
                used_bytes=_optional_bytes(card, "VRAM Total Used Memory (B)", where),
                gtt_total_bytes=_optional_bytes(card, "GTT Total Memory (B)", where),
                gtt_used_bytes=_optional_bytes(card, "GTT Total Used Memory (B)", where),
            )
        )
    return tuple(gpus)


def _amd_smi_size(value: Any, where: str) -> int | None:
    """An amd-smi {"value": N, "unit": "MB"} size in bytes; "N/A" or absent: None."""
    if value is None or value == "N/A":
        return None
    if not isinstance(value, dict) or value.get("unit") not in AMD_SMI_UNITS:
        raise ValueError(f"{where}: not a size ({str(value)[:40]!r})")
    return _bytes(value.get("value"), where) * AMD_SMI_UNITS[value["unit"]]


def parse_amd_smi_static_json(text: str) -> tuple[SmiGpu, ...]:
    """`amd-smi static --asic --bus --vram --json`: a list of GPUs (ROCm 6.3's amd-smi, the
    recorded output) or {"gpu_data": [...]} (later releases), each with "gpu" (its index),
    asic.market_name, bus.bdf and vram.size as {"value", "unit"}. A GPU without an index or a
    VRAM size is a ValueError; its used and free memory are not in this output (None)."""
    doc = _json_value(text, "amd-smi static")
    entries = doc.get("gpu_data") if isinstance(doc, dict) else doc
    gpus = []
    for entry in _indexed(
        entries,
        MAX_AMD_SMI_GPUS,
        "gpu",
        "amd-smi static: neither a list of GPUs nor gpu_data",
        "amd-smi static: a GPU without its index",
    ):
        where = f"amd-smi static gpu {entry['gpu']}"
        asic, bus, vram = (entry.get(k) or {} for k in ("asic", "bus", "vram"))
        if not all(isinstance(x, dict) for x in (asic, bus, vram)):
            raise ValueError(f"{where}: asic, bus or vram not an object")
        total = _amd_smi_size(vram.get("size"), f"{where} vram size")
        if total is None:
            raise ValueError(f"{where}: no VRAM size")
        bdf = bus.get("bdf")
        gpus.append(
            SmiGpu(
                index=entry["gpu"],
                name=str(asic.get("market_name") or "AMD GPU")[:120],
                total_bytes=total,
                bdf=str(bdf).lower() if isinstance(bdf, str) and bdf != "N/A" else None,
            )
        )
    return tuple(gpus)


def parse_xpu_smi_list(text: str) -> tuple[int, ...]:
    """`xpu-smi discovery -j`: {"device_list": [{"device_id": 0, ...}, ...]} -> the GPU ids."""
    doc = _json_object(text, "xpu-smi discovery")
    ids = []
    for d in _indexed(
        doc.get("device_list"),
        MAX_XPU_DEVICES,
        "device_id",
        "xpu-smi discovery: no device_list",
        "xpu-smi discovery: a device without a device_id",
    ):
        if d.get("device_type", "GPU") == "GPU":
            ids.append(d["device_id"])
    return tuple(ids)


def parse_xpu_smi_device(text: str) -> SmiGpu:
    """`xpu-smi discovery -d N -j`: one device's properties, memory_physical_size_byte and
    memory_free_size_byte as decimal strings. Free is the driver's figure (Level Zero sysman);
    ValueError without the physical size."""
    doc = _json_object(text, "xpu-smi discovery -d")
    where = f"xpu-smi device {doc.get('device_id', '?')}"
    if not isinstance(doc.get("device_id"), int):
        raise ValueError(f"{where}: no device_id")
    total = _bytes(doc.get("memory_physical_size_byte"), f"{where} memory_physical_size_byte")
    free = _optional_bytes(doc, "memory_free_size_byte", where)
    return SmiGpu(
        index=doc["device_id"],
        name=str(doc.get("device_name") or "Intel GPU")[:120],
        total_bytes=total,
        free_bytes=free if free is not None and free <= total else None,
    )


# --- readers (I/O) ------------------------------------------------------------------------------


def run_smi(program: str, args: tuple[str, ...], timeout_s: float = SMI_TIMEOUT_S) -> str:
    """`program args`, bounded; ValueError naming the tool when it is slow, fails or floods."""
    from quantpick.process import tool_stdout

    shown = f"{program} {' '.join(args)}"
    return tool_stdout(
        [program, *args], timeout_s=timeout_s, stdout_cap=MAX_SMI_OUTPUT_BYTES, shown=shown
    )


Runner = Callable[[str, tuple[str, ...]], str]


def rocm_smi_gpus(program: str, run: Runner = run_smi) -> tuple[SmiGpu, ...]:
    return parse_rocm_smi_json(run(program, ROCM_SMI_ARGS))


def amd_smi_static(program: str, run: Runner = run_smi) -> tuple[SmiGpu, ...]:
    return parse_amd_smi_static_json(run(program, AMD_SMI_STATIC_ARGS))


def xpu_smi_gpus(program: str, run: Runner = run_smi) -> tuple[SmiGpu, ...]:
    ids = parse_xpu_smi_list(run(program, XPU_SMI_LIST_ARGS))
    return tuple(parse_xpu_smi_device(run(program, ("discovery", "-d", str(i), "-j"))) for i in ids)
