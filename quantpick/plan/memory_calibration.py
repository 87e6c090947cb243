"""Memory calibration: llama.cpp's measured compute buffers of a running server, learned. Pure.

`quantpick check --learn` turns a server that runs as planned into one entry per scope (the
llama.cpp build, the devices, the model's size class, as the speed calibration: plan/
calibration.py): per device, the compute buffers llama.cpp allocated beside the plan's estimate.
Later plans for that build, those devices and a model of that size scale each device's compute
estimate by the measured ratio (plan/memory.py apply_compute_ratios, a step on the estimate's
output, outside the compute model) and name the basis in the estimate's notes.

Never stored (`entry_problems`): a ratio that is not a finite positive number or lies outside
`RATIO_BAND`; a run whose weights, KV or state differ from the plan (it ran something else), that
spilled to the host or into swap, or that could not be read. Stored entries are re-checked when
read (a file edited by hand is never taken on trust). Storage: serve/calibration.py; format:
docs/calibration.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quantpick.plan.calibration import size_class, size_matches
from quantpick.plan.check import CheckReport, FindingCode

MEMORY_KIND = "quantpick-memory-calibration"
MEMORY_SCHEMA = 1
# measured / estimated compute outside this band is not a calibration of the estimate but another
# configuration: the compute estimate's largest known error is the output device's logits
# reservation, 5x (llama-fit-params 537 MiB vs llama-server 108 MiB, tests/data/
# llama-server-logits-saving.json), and the tiny model's host buffer 0.29x (docs/check.md);
# 1/8-8 holds both with margin.
RATIO_BAND = (1 / 8, 8.0)
# A compute buffer is at least llama.cpp's graph metadata; a measured 0 is a device without a
# graph (nothing to learn), below 1 MiB of estimate the ratio is noise of the log's rounding.
MIN_COMPUTE_BYTES = 1024**2
# Findings that say the run was not the planned configuration, or not steady.
DISQUALIFYING = frozenset(
    {
        FindingCode.WEIGHTS_ON_CPU,
        FindingCode.KV_ON_CPU,
        FindingCode.SWAP_IN_USE,
        FindingCode.MEMORY_DIFFERS,
        FindingCode.DEVICE_UNPLANNED,
        FindingCode.CONTEXT_SMALLER,
    }
)


@dataclass(frozen=True)
class MemoryCalibration:
    ratios: tuple[tuple[str, float], ...]  # llama.cpp device name ("CUDA0", "CPU") -> ratio
    label: str  # the basis, in words


def learned_ratios(report: CheckReport) -> list[tuple[str, int, int]]:
    """(device, measured compute, the compute model's own estimate) for every device with both:
    a plan that already carried a memory calibration has it divided out, so a new entry is
    measured against the model, never against an earlier calibration."""
    applied = dict(report.planned.compute_ratios)
    out = []
    for c in report.devices:
        if c.planned is None or c.measured is None:
            continue
        estimate = round(c.planned.compute_bytes / applied.get(c.device, 1.0))
        out.append((c.device, c.measured.compute_bytes, estimate))
    return out


def report_problems(report: CheckReport) -> list[str]:
    """Why a check cannot teach anything about compute buffers; [] when it can."""
    problems = []
    if not report.planned.devices:
        problems.append("no plan to compare with (a server checked without --gguf)")
    if not report.observed.devices:
        problems.append("llama.cpp's buffer lines were not read (no log, or not -lv 4)")
    bad = sorted({f.code.value for f in report.findings if f.code in DISQUALIFYING})
    if bad:
        problems.append(f"the server did not run as planned ({', '.join(bad)})")
    return problems


def make_entry(
    report: CheckReport,
    *,
    build: str,
    devices: Sequence[str],
    model_bytes: int,
    date: str,
    model: str,
) -> dict[str, Any]:
    """The stored form of one learned check (docs/calibration.md)."""
    rows = []
    for device, measured, planned in learned_ratios(report):
        rows.append(
            {
                "device": device,
                "measured_compute_bytes": measured,
                "estimated_compute_bytes": planned,
                "ratio": measured / planned if planned > 0 else None,
            }
        )
    return {
        "build_id": build,
        "devices": list(devices),
        "model_bytes": model_bytes,
        "model": model,
        "date": date,
        "n_ctx": report.planned.n_ctx,
        "compute": rows,
    }


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return math.inf
    return number


def entry_problems(entry: object) -> list[str]:
    """Why an entry cannot calibrate compute; [] when it can."""
    if not isinstance(entry, dict):
        return ["the entry is not an object"]
    problems = []
    if not isinstance(entry.get("build_id"), str):
        problems.append("no build")
    devices = entry.get("devices")
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        problems.append("the devices it ran on are not recorded")
    size = _number(entry.get("model_bytes"))
    if size is None or not math.isfinite(size) or size <= 0:
        problems.append("the model's size is not recorded")
    rows = entry.get("compute")
    if not isinstance(rows, list) or not rows:
        return [*problems, "no compute figure"]
    lo, hi = RATIO_BAND
    usable = 0
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("device"), str):
            problems.append("a compute row without a device")
            continue
        measured = _number(row.get("measured_compute_bytes"))
        estimated = _number(row.get("estimated_compute_bytes"))
        ratio = _number(row.get("ratio"))
        device = row["device"]
        if measured is None or not math.isfinite(measured) or measured < 0:
            problems.append(f"{device}: measured compute {row.get('measured_compute_bytes')!r}")
            continue
        if estimated is None or not math.isfinite(estimated) or estimated < 0:
            problems.append(f"{device}: estimated compute {row.get('estimated_compute_bytes')!r}")
            continue
        if estimated < MIN_COMPUTE_BYTES or measured < MIN_COMPUTE_BYTES:
            continue  # nothing to learn on this device; not a fault
        if ratio is None or not math.isfinite(ratio) or not lo <= ratio <= hi:
            problems.append(
                f"{device}: measured / estimated compute is {ratio!r}: outside "
                f"{lo:.3g}-{hi:g}, not a calibration of this estimate"
            )
            continue
        if abs(ratio - measured / estimated) > 1e-6 * ratio:
            problems.append(f"{device}: the ratio does not match its figures")
            continue
        usable += 1
    if usable == 0 and not problems:
        problems.append("no device with compute buffers of 1 MiB or more to learn from")
    return problems


def usable_ratios(entry: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    lo, hi = RATIO_BAND
    out = []
    for row in entry.get("compute", []):
        ratio = _number(row.get("ratio"))
        measured = _number(row.get("measured_compute_bytes")) or 0
        estimated = _number(row.get("estimated_compute_bytes")) or 0
        if (
            ratio is not None
            and math.isfinite(ratio)
            and lo <= ratio <= hi
            and min(measured, estimated) >= MIN_COMPUTE_BYTES
        ):
            out.append((str(row["device"]), ratio))
    return tuple(out)


def same_scope(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def key(e: dict[str, Any]) -> tuple[Any, ...]:
        size = _number(e.get("model_bytes")) or 0
        return (e.get("build_id"), tuple(e.get("devices") or ()), size_class(int(size)))

    return key(a) == key(b)


def calibration_for(
    entries: Sequence[Any], build: str, devices: tuple[str, ...], sizes: Sequence[int]
) -> tuple[MemoryCalibration | None, str | None]:
    """The entry for this build, these devices and a model of these sizes, re-checked; (None,
    why) when none applies, (None, None) when nothing was learned."""
    valid = [e for e in entries if isinstance(e, dict) and not entry_problems(e)]
    if not entries:
        return None, None
    if not valid:
        return None, "the stored memory calibration is not valid; `quantpick calibration reset`"
    of_build = [e for e in valid if e.get("build_id") == build]
    if not of_build:
        return None, f"the memory calibration is for another llama.cpp build (installed: {build})"
    on_devices = [e for e in of_build if tuple(e.get("devices") or ()) == devices]
    if not on_devices:
        return None, "the memory calibration was measured on other devices"
    of_size = [e for e in on_devices if size_matches(int(e["model_bytes"]), sizes)]
    if not of_size:
        return None, "the memory calibration measured another size of model"
    entry = of_size[-1]
    ratios = usable_ratios(entry)
    what = ", ".join(f"{d} x{r:.2f}" for d, r in ratios)
    label = (
        f"calibrated on this machine (quantpick check --learn, {entry.get('date', '?')}, "
        f"{entry.get('model', '?')}, build {build}: {what})"
    )
    return MemoryCalibration(ratios, label), None
