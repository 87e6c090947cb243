"""A machine's measured calibration (quantpick bench) and how it changes predictions. Pure.

The profile stores ratios, measured / predicted, per speed figure (decode with an empty context,
decode at a filled context, prefill) and the bytes the GPU driver took beyond llama.cpp's own
buffers. Ratios keep it independent of the speed model's internals: whichever model predicts, its
figures are scaled by what this machine measured against the same model. `predicted_figures` and
`calibrate_speed` are the only places that know the speed model's field names (the adapter).

Storage (JSON under the config dir) is `serve/calibration.py`; the format is in docs/calibration.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from quantpick.machine.spec import Machine
from quantpick.plan.memory import Overheads

PROFILE_KIND = "quantpick-calibration"
PROFILE_SCHEMA = 1

# Figure -> attribute names on the speed model's result: today's SpeedEstimate (bandwidth bound)
# and the coming ExpectedSpeed. The first name present wins.
FIGURE_FIELDS: dict[str, tuple[str, ...]] = {
    "decode_empty": ("decode_tps_empty", "tokens_per_s_empty"),
    "decode_target": ("decode_tps_target", "tokens_per_s_target"),
    "prefill": ("prefill_tps",),
}


@dataclass(frozen=True)
class SpeedFactors:
    """measured / predicted, per figure; None where there was nothing to compare."""

    decode_empty: float | None
    decode_depth: float | None
    depth_tokens: int  # the filled context decode_depth was measured at
    prefill: float | None


@dataclass(frozen=True)
class Calibration:
    """What one stored profile changes: speed factors and measured GPU driver overhead."""

    date: str  # "2026-11-30"
    build: str  # "b11312 (0c1e57098)"
    speed: SpeedFactors
    gpu_overhead_bytes: tuple[tuple[str, int], ...] = ()  # device ("CUDA0") -> bytes

    @property
    def label(self) -> str:
        return f"calibrated on this machine, {self.date}, build {self.build}"


# ---- the adapter to the speed model -----------------------------------------------------------


def _field(speed: Any, figure: str) -> str | None:
    names = {f.name for f in dataclasses.fields(speed)}
    return next((n for n in FIGURE_FIELDS[figure] if n in names), None)


def predicted_figures(speed: Any) -> dict[str, float | None]:
    """The speed model's figures by name (decode_empty, decode_target, prefill)."""
    out: dict[str, float | None] = {}
    for figure in FIGURE_FIELDS:
        name = _field(speed, figure)
        out[figure] = float(getattr(speed, name)) if name is not None else None
    return out


def factor_at(factors: SpeedFactors, context: int) -> float | None:
    """The decode factor at `context` tokens: linear from the empty to the measured depth, then
    held (one factor where only one was measured)."""
    empty, depth = factors.decode_empty, factors.decode_depth
    if empty is None or depth is None or factors.depth_tokens <= 0:
        return depth if depth is not None else empty
    share = min(max(context, 0) / factors.depth_tokens, 1.0)
    return empty + (depth - empty) * share


def calibrate_speed(speed: Any, calibration: Calibration) -> Any:
    """The same speed result with every figure scaled by this machine's measured factor."""
    changes: dict[str, Any] = {}
    factors = calibration.speed
    target = getattr(speed, "target_context", None)
    scale = {
        "decode_empty": factors.decode_empty,
        "decode_target": factor_at(factors, target) if target is not None else factors.decode_depth,
        "prefill": factors.prefill,
    }
    for figure, factor in scale.items():
        name = _field(speed, figure)
        if name is not None and factor is not None and getattr(speed, name) is not None:
            changes[name] = getattr(speed, name) * factor
    if "bound" in {f.name for f in dataclasses.fields(speed)}:
        changes["bound"] = f"{calibration.label} (measured / predicted applied to the bound)"
    return dataclasses.replace(speed, **changes)


def speed_ratios(
    measured: dict[str, float | None], predicted: dict[str, float | None], depth_tokens: int
) -> SpeedFactors:
    """Factors from measured and predicted figures (keys decode_empty, decode_depth, prefill)."""

    def ratio(key: str) -> float | None:
        m, p = measured.get(key), predicted.get(key)
        return m / p if m and p else None

    return SpeedFactors(
        ratio("decode_empty"), ratio("decode_depth"), depth_tokens, ratio("prefill")
    )


def apply_overheads(overheads: Overheads, calibration: Calibration) -> Overheads:
    """`overheads` with the measured driver overhead per GPU in place of the default."""
    if not calibration.gpu_overhead_bytes:
        return overheads
    return dataclasses.replace(overheads, gpu_context_by_device=calibration.gpu_overhead_bytes)


def driver_overhead(peak_used_bytes: int, baseline_used_bytes: int, accounted_bytes: int) -> int:
    """What the driver took on a GPU beyond llama.cpp's buffers while the benchmark ran: the
    peak of NVML's used memory, less what was used before, less llama.cpp's accounted buffers
    (model + context + compute). Never negative (another process freeing memory meanwhile)."""
    return max(0, peak_used_bytes - baseline_used_bytes - accounted_bytes)


# ---- which machine a profile belongs to ------------------------------------------------------


def gpu_identity(machine: Machine) -> list[dict[str, Any]]:
    return [
        {"index": g.index, "name": g.name, "uuid": g.uuid, "total_bytes": g.total_bytes}
        for g in machine.usable_gpus
    ]


def machine_key(machine: Machine) -> str:
    """A file-name-safe key for this machine's GPUs (by UUID where NVML gives one) and host."""
    parts = [g.uuid or f"{g.name}:{g.total_bytes}" for g in machine.usable_gpus]
    parts.append(f"host:{machine.host.ram_total_bytes // 1024**3}G:{machine.host.cpu_cores}")
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:10]
    names = [g.name.replace("NVIDIA ", "").replace("GeForce ", "") for g in machine.usable_gpus]
    slug = re.sub(r"[^a-z0-9]+", "-", "-".join(names).lower()).strip("-") or "cpu"
    return f"{slug[:40]}-{digest}"


def build_id(build: int | None, commit: str | None, version: str | None) -> str:
    """The key a profile is stored under: b<N>-<commit> (shallow clones report build 1, so the
    commit is part of it)."""
    if build is None and commit is None:
        return f"v{version}" if version else "unknown"
    return f"b{build if build is not None else '?'}-{commit or 'unknown'}"


def calibration_from_profile(
    stored: dict[str, Any], machine: Machine, build: str
) -> tuple[Calibration | None, str | None]:
    """(the calibration for this machine and build, or None with the reason it is not applied).

    `stored` is a profile file's JSON (docs/calibration.md); `build` is `build_id(...)` of the
    installed llama.cpp.
    """
    if stored.get("kind") != PROFILE_KIND or stored.get("schema_version") != PROFILE_SCHEMA:
        return None, "the calibration file has an unknown format; re-run quantpick bench"
    want = [(g["name"], g.get("uuid"), g["total_bytes"]) for g in gpu_identity(machine)]
    have = [(g["name"], g.get("uuid"), g["total_bytes"]) for g in stored.get("gpus", [])]
    if want != have:
        names = ", ".join(n for n, _, _ in have) or "no GPU"
        return None, f"the calibration was measured on other GPUs ({names}); re-run quantpick bench"
    profiles: dict[str, Any] = stored.get("profiles", {})
    entry = profiles.get(build)
    if entry is None:
        others = ", ".join(sorted(profiles)) or "none"
        return None, (
            f"the calibration is for another llama.cpp build ({others}; installed: {build}); "
            "re-run quantpick bench"
        )
    ratios = entry.get("ratios", {})
    factors = SpeedFactors(
        decode_empty=ratios.get("decode_empty"),
        decode_depth=ratios.get("decode_depth"),
        depth_tokens=int(entry.get("depth_tokens", 0)),
        prefill=ratios.get("prefill"),
    )
    overhead = tuple(
        (g["device"], int(g["driver_overhead_bytes"]))
        for g in entry.get("gpus", [])
        if g.get("driver_overhead_bytes") is not None
    )
    label = entry.get("build_label") or build
    return Calibration(str(entry.get("date", "?")), label, factors, overhead), None
