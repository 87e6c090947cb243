"""A machine's measured calibration (quantpick bench) and how it changes predictions. Pure.

The profile stores ratios, measured / predicted, per speed figure (decode with an empty context,
decode at a filled context, prefill) and the bytes the GPU driver took beyond llama.cpp's own
buffers. Ratios keep it independent of the speed model's internals: whichever model predicts, its
figures are scaled by what this machine measured against the same model. `predicted_figures` and
`calibrate_speed` are the only places that know the speed model's field names (the adapter).

A profile is stored only from a run that can be true (`plausibility_problems`: finite positive
figures, ratios inside the band the speed model's own worst error allows, a model in the size
range it was fitted on, repetitions that agree) and applies only to what it measured
(`CalibrationScope`: the llama.cpp build, the devices the run used, a model of that size class).

Storage (JSON under the config dir) is `serve/calibration.py`; the format is in docs/calibration.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quantpick.machine.spec import Machine
from quantpick.model.manifest import Manifest
from quantpick.plan.memory import Overheads
from quantpick.units import GiB, human

PROFILE_KIND = "quantpick-calibration"
# 2: entries carry their scope (devices, model size) and a list replaces the per-build map;
# schema 1 files (no scope, no plausibility check) are never applied.
PROFILE_SCHEMA = 2

# ---- what a run must be to calibrate anything -------------------------------------------------
# The model files of the runs the speed model was fitted on
# (benchmarks/data/speed-measurements.json: 2.35 GiB, gemma-3-4b Q4_0, to 59.02 GiB, gpt-oss-120b;
# ten architectures). A calibration is a correction to that model; on a much smaller or larger
# file its terms weigh differently (a 16 MiB test model is all fixed costs), so a run is used only
# within a factor 2 of those files.
FITTED_MODEL_BYTES = (math.floor(2.35 * GiB), math.ceil(59.02 * GiB))
MODEL_BYTES_RANGE = (FITTED_MODEL_BYTES[0] // 2, FITTED_MODEL_BYTES[1] * 2)
# measured / predicted outside this band is not this machine: the speed model's worst error on a
# source it never saw is 1.64x decode and 1.87x prefill (benchmarks/speed_accuracy.py, leave one
# source out); 1.5 times that worst case either way, rounded, is [0.35, 2.8].
RATIO_BAND = (0.35, 2.8)
# Repetitions of one figure may spread by this much (max / min - 1): three times the speed
# model's median error (5-6%); a noisier run would add noise, not knowledge.
REPEAT_SPREAD_MAX = 0.15
# Decode at a filled context reads the KV cache on top of the weights: it is never faster than
# with an empty one. 5% slack for timing noise.
DEPTH_SLACK = 1.05
# A profile applies to a model one of whose files is within this factor of the measured file.
SIZE_MATCH_FACTOR = 2.0
# The filled context a bench measured decode at: 0 (none) up to 16 Mi tokens, above the longest
# context any model is trained for (Llama 4 Scout: 10 M) and inside llama.cpp's uint32 n_ctx.
MAX_DEPTH_TOKENS = 1 << 24

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
    measured_on: str = ""  # what the bench ran: "Q4_K_M, 19.7 GiB, on CUDA0"
    # speculation kind ("mtp") -> per-token acceptance `bench --spec` measured (entry
    # "speculation"); later plans decide speculation with it instead of the fitted figure
    acceptance: tuple[tuple[str, float], ...] = ()

    @property
    def label(self) -> str:
        base = f"calibrated on this machine, {self.date}, build {self.build}"
        return f"{base} (bench of {self.measured_on})" if self.measured_on else base


@dataclass(frozen=True)
class CalibrationScope:
    """What a bench measured, and so what its profile may be applied to."""

    build: str  # build_id(...) of the llama.cpp that ran
    devices: tuple[str, ...]  # device_identity of each device the run used; () = the host only
    model_bytes: int  # the model file(s) it ran

    @property
    def size_class(self) -> str:
        return size_class(self.model_bytes)


def device_identity(gpu_uuid: str | None, name: str, total_bytes: int) -> str:
    return gpu_uuid or f"{name}:{total_bytes}"


def machine_devices(machine: Machine) -> tuple[str, ...]:
    """Every device a plan on `machine` may use: its usable GPUs and its RPC workers' devices."""
    out = [device_identity(g.uuid, g.name, g.total_bytes) for g in machine.usable_gpus]
    for w in machine.rpc_workers:
        out += [f"rpc:{w.endpoint}/{d.index}" for d in w.devices]
    return tuple(out)


def plan_devices(machine: Machine, estimate_devices: Sequence[Any]) -> tuple[str, ...]:
    """The devices a plan's estimate used (GPU rows with layers or buffers), by identity."""
    by_index = {g.index: g for g in machine.gpus}
    out: list[str] = []
    for d in estimate_devices:
        if getattr(d, "kind", "") != "gpu":
            continue
        if d.endpoint is not None:
            out.append(f"rpc:{d.endpoint}/{d.gpu_index if d.gpu_index is not None else 0}")
        elif d.gpu_index in by_index:
            g = by_index[d.gpu_index]
            out.append(device_identity(g.uuid, g.name, g.total_bytes))
    return tuple(out)


def model_sizes(manifest: Manifest) -> tuple[int, ...]:
    """The size of each quant of a model (all its shards), as a calibration's scope reads it."""
    return tuple(sum(f.size_bytes for f in manifest.quant_files(q)) for q in manifest.quants)


def size_class(model_bytes: int) -> str:
    """Power-of-two GiB buckets: "16-32 GiB" (below 1 GiB: "<1 GiB")."""
    gib = model_bytes / GiB
    if gib < 1:
        return "<1 GiB"
    lo = 2 ** math.floor(math.log2(gib))
    return f"{lo}-{lo * 2} GiB"


def size_matches(measured_bytes: int, sizes: Sequence[int]) -> bool:
    return any(
        measured_bytes / SIZE_MATCH_FACTOR <= s <= measured_bytes * SIZE_MATCH_FACTOR
        for s in sizes
        if s > 0
    )


# ---- is a run plausible -----------------------------------------------------------------------


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int of 400 digits: a number, but no finite float
        return math.inf if value > 0 else -math.inf


def _shown(value: object) -> str:
    number = _number(value)
    return f"{number:.3g}" if number is not None else repr(value)[:40]


def shape_problems(entry: object) -> list[str]:
    """Why `entry` is not shaped like a bench entry at all (docs/calibration.md): an object whose
    `measured`, `predicted`, `ratios` and `samples` are objects, `depth_tokens` a whole number
    from 0 to MAX_DEPTH_TOKENS, `gpus` and `devices` lists. A file is edited by hand or written
    by another version: such an entry is listed as invalid and never applied, never a crash."""
    if not isinstance(entry, dict):
        return [f"the entry is a JSON {type(entry).__name__}, not an object"]
    problems = []
    for key in ("measured", "predicted", "ratios", "samples"):
        value = entry.get(key)
        if value is not None and not isinstance(value, dict):
            problems.append(f"{key} is a {type(value).__name__}, not an object")
    depth = entry.get("depth_tokens", 0)
    if isinstance(depth, bool) or not isinstance(depth, int):
        problems.append(f"depth_tokens is {_shown(depth)}, not a whole number")
    elif not 0 <= depth <= MAX_DEPTH_TOKENS:
        problems.append(f"depth_tokens is {_shown(depth)}: not 0-{MAX_DEPTH_TOKENS}")
    else:
        ratios = entry.get("ratios")
        if isinstance(ratios, dict) and ratios.get("decode_depth") is not None and depth == 0:
            problems.append("decode_depth is measured at depth_tokens 0")
    for key in ("gpus", "devices"):
        value = entry.get(key)
        if value is not None and not isinstance(value, list):
            problems.append(f"{key} is a {type(value).__name__}, not a list")
    spec = entry.get("speculation")
    if spec is not None and not isinstance(spec, dict):
        problems.append(f"speculation is a {type(spec).__name__}, not an object")
    elif spec:
        for kind, value in spec.items():
            why = _acceptance_problem(value.get("acceptance") if isinstance(value, dict) else None)
            if why is not None:
                problems.append(f"speculation {kind} acceptance {why}")
    return problems


def plausibility_problems(entry: dict[str, Any]) -> list[str]:
    """Why a bench entry (docs/calibration.md) cannot calibrate anything; [] when it can."""
    problems: list[str] = shape_problems(entry)
    if problems:
        return problems
    measured = entry.get("measured") or {}
    predicted = entry.get("predicted") or {}
    ratios = entry.get("ratios") or {}
    for where, figures in (("measured", measured), ("predicted", predicted)):
        for key, value in figures.items():
            if key == "model" or value is None:
                continue
            number = _number(value)
            if number is None or not math.isfinite(number) or number <= 0:
                problems.append(f"{where} {key} is {_shown(value)}, not a speed")
    lo, hi = RATIO_BAND
    usable = 0
    for key, value in ratios.items():
        if value is None:
            continue
        number = _number(value)
        if number is None or not math.isfinite(number) or not lo <= number <= hi:
            problems.append(
                f"{key} measured / predicted is {_shown(value)}: outside {lo:g}-{hi:g}, the "
                "band the speed model's own worst error allows"
            )
        elif key.startswith("decode"):
            usable += 1
    if usable == 0 and not any(p.startswith("decode") for p in problems):
        problems.append("no decode figure to compare with the prediction")
    empty = _number(measured.get("decode_tps_empty"))
    deep = _number(measured.get("decode_tps_depth"))
    if empty and deep and math.isfinite(empty) and math.isfinite(deep) and empty > 0:
        if deep > empty * DEPTH_SLACK:
            problems.append(
                f"decode at {entry.get('depth_tokens')} tokens ({deep:.1f} tok/s) is faster than "
                f"with an empty context ({empty:.1f}): the filled context cannot speed it up"
            )
    size = _number(entry.get("model_bytes"))
    if size is None or size <= 0:
        problems.append("the model's size is not recorded")
    elif not MODEL_BYTES_RANGE[0] <= size <= MODEL_BYTES_RANGE[1]:
        problems.append(
            f"the model ({human(size)}) is outside {human(MODEL_BYTES_RANGE[0])}-"
            f"{human(MODEL_BYTES_RANGE[1])}, the file sizes the speed model was fitted on "
            "(within a factor 2)"
        )
    samples = entry.get("samples") or {}
    repeated = False
    for key, values in samples.items():
        numbers = [_number(v) for v in values] if isinstance(values, list) else [None]
        if any(n is None or not math.isfinite(n) or n <= 0 for n in numbers):
            problems.append(f"a {key} repetition is not a speed")
            continue
        if len(numbers) < 2:
            continue
        repeated = True
        spread = max(numbers) / min(numbers) - 1  # type: ignore[type-var, operator]
        if spread > REPEAT_SPREAD_MAX:
            problems.append(
                f"the {key} repetitions disagree by {spread:.0%} (more than "
                f"{REPEAT_SPREAD_MAX:.0%}): the machine was not steady"
            )
    if not repeated:
        problems.append("one repetition cannot show the figures repeat (run with --reps 2 or more)")
    if not isinstance(entry.get("devices"), list):
        problems.append("the devices it ran on are not recorded")
    return problems


def entry_scope(entry: dict[str, Any]) -> CalibrationScope:
    if not isinstance(entry, dict):
        return CalibrationScope("unknown", (), 0)
    devices = entry.get("devices")
    size = _number(entry.get("model_bytes"))
    return CalibrationScope(
        build=str(entry.get("build_id", "unknown")),
        devices=tuple(str(d) for d in devices) if isinstance(devices, list) else (),
        model_bytes=int(size) if size and math.isfinite(size) else 0,
    )


def same_scope(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two entries a new bench replaces one with the other: same build, devices and size class."""
    sa, sb = entry_scope(a), entry_scope(b)
    return (sa.build, sa.devices, sa.size_class) == (sb.build, sb.devices, sb.size_class)


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
        if m is None or p is None or not (math.isfinite(m) and math.isfinite(p)) or p <= 0:
            return None
        r = m / p
        return r if math.isfinite(r) else None

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
    stored: dict[str, Any], machine: Machine, build: str, sizes: Sequence[int] = ()
) -> tuple[Calibration | None, str | None]:
    """(the calibration for this machine, build and model, or None with the reason it is not
    applied).

    `stored` is a profile file's JSON (docs/calibration.md); `build` is `build_id(...)` of the
    installed llama.cpp; `sizes` are the planned model's file sizes (`model_sizes`): a profile
    applies only to a model of the size it measured, run on the devices it measured, with the
    build it measured, and only when its figures are plausible (re-checked here: a file from an
    older quantpick, or edited by hand, is never taken on trust).
    """
    if stored.get("kind") != PROFILE_KIND:
        return None, "the calibration file has an unknown format; re-run quantpick bench"
    if stored.get("schema_version") != PROFILE_SCHEMA:
        return None, (
            "the calibration file was written by another quantpick version, without the scope "
            "and checks this one needs; re-run quantpick bench (`quantpick calibration reset` "
            "removes it)"
        )
    want = [(g["name"], g.get("uuid"), g["total_bytes"]) for g in gpu_identity(machine)]
    try:
        have = [(g["name"], g.get("uuid"), g["total_bytes"]) for g in stored.get("gpus", [])]
    except (TypeError, KeyError):
        return None, "the calibration file is damaged; `quantpick calibration reset` removes it"
    if want != have:
        names = ", ".join(str(n) for n, _, _ in have) or "no GPU"
        return None, f"the calibration was measured on other GPUs ({names}); re-run quantpick bench"
    profiles = stored.get("profiles")
    entries = [e for e in profiles if isinstance(e, dict)] if isinstance(profiles, list) else []
    invalid = [e for e in entries if shape_problems(e)]
    entries = [e for e in entries if not shape_problems(e)]
    if invalid and not entries:
        return None, (
            f"the stored calibration is not valid ({shape_problems(invalid[0])[0]}); "
            "`quantpick calibration reset` removes it"
        )
    of_build = [e for e in entries if e.get("build_id") == build]
    if not of_build:
        others = ", ".join(sorted({str(e.get("build_id")) for e in entries})) or "none"
        return None, (
            f"the calibration is for another llama.cpp build ({others}; installed: {build}); "
            "re-run quantpick bench"
        )
    devices = machine_devices(machine)
    on_devices = [e for e in of_build if entry_scope(e).devices == devices]
    if not on_devices:
        ran = "; ".join(_devices_text(entry_scope(e).devices) for e in of_build)
        return None, (
            f"the calibration was measured on {ran}, not on every device this machine plans "
            f"on ({_devices_text(devices)}); re-run quantpick bench with the same devices"
        )
    of_size = [e for e in on_devices if size_matches(entry_scope(e).model_bytes, sizes)]
    if not of_size:
        measured = ", ".join(_measured_on(e) for e in on_devices)
        planned = f"{human(min(sizes))}-{human(max(sizes))}" if sizes else "of unknown size"
        return None, (
            f"the calibration measured another size of model ({measured}); this model's files "
            f"are {planned}: bench a file of this model to calibrate it"
        )
    target = sorted(sizes)[len(sizes) // 2] if sizes else 0
    entry = min(
        of_size,
        key=lambda e: abs(math.log(max(1, entry_scope(e).model_bytes) / max(1, target))),
    )
    problems = plausibility_problems(entry)
    if problems:
        return None, (
            f"the stored calibration cannot be true ({problems[0]}); `quantpick calibration "
            "reset` removes it"
        )
    ratios = entry.get("ratios", {})
    factors = SpeedFactors(
        decode_empty=ratios.get("decode_empty"),
        decode_depth=ratios.get("decode_depth"),
        depth_tokens=entry.get("depth_tokens", 0),
        prefill=ratios.get("prefill"),
    )
    overhead = tuple(
        (str(g["device"]), int(g["driver_overhead_bytes"]))
        for g in entry.get("gpus", [])
        if isinstance(g, dict)
        and isinstance(g.get("driver_overhead_bytes"), int)
        and 0 <= g["driver_overhead_bytes"] <= MAX_DRIVER_OVERHEAD_BYTES
    )
    label = entry.get("build_label") or build
    return Calibration(str(entry.get("date", "?")), str(label), factors, overhead,
                       _measured_on(entry), speculation_acceptance(entry)), None  # fmt: skip


def speculation_acceptance(entry: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """The per-token acceptance by kind a `bench --spec` entry stored ("speculation":
    {"mtp": {"acceptance": a, ...}}); entries plausibility_problems refused never get here."""
    spec = entry.get("speculation")
    if not isinstance(spec, dict):
        return ()
    return tuple(
        (str(kind), float(v["acceptance"]))
        for kind, v in sorted(spec.items())
        if isinstance(v, dict) and _acceptance_problem(v.get("acceptance")) is None
    )


def _acceptance_problem(value: Any) -> str | None:
    number = _number(value)
    if number is None or not math.isfinite(number) or not 0 < number < 1:
        return f"is {_shown(value)}, not a probability between 0 and 1"
    return None


# A driver's own share of a GPU beyond llama.cpp's buffers is a few hundred MiB (CUDA context,
# cuBLAS workspaces: 384 MiB default, plan/memory.py); a stored figure above 8 GiB is not one.
MAX_DRIVER_OVERHEAD_BYTES = 8 * GiB


def _devices_text(devices: tuple[str, ...]) -> str:
    return ", ".join(devices) if devices else "the host only (no GPU)"


def _measured_on(entry: dict[str, Any]) -> str:
    scope = entry_scope(entry)
    what = " ".join(str(x) for x in (entry.get("model"), entry.get("quant")) if x)
    size = human(scope.model_bytes) if scope.model_bytes else "size unknown"
    n = len(scope.devices)
    where = f"{n} device{'s' if n != 1 else ''}" if n else "the host only"
    return f"{what + ', ' if what else ''}{size}, on {where}"
