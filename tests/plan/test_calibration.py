"""A calibration profile's effect: speed factors through the adapter, measured GPU overheads in the
memory model, and which profiles apply to which machine and build."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.model.layout import synthesize_layout
from quantpick.model.registry import find_manifest
from quantpick.plan.calibration import (
    PROFILE_KIND,
    PROFILE_SCHEMA,
    Calibration,
    SpeedFactors,
    apply_overheads,
    build_id,
    calibrate_speed,
    calibration_from_profile,
    driver_overhead,
    factor_at,
    gpu_identity,
    machine_key,
    predicted_figures,
    speed_ratios,
)
from quantpick.plan.memory import Overheads, RunConfig, estimate
from quantpick.plan.planner import device_bandwidths
from quantpick.plan.speed import SpeedEstimate, decode_speed

GiB = 1024**3
MiB = 1024**2


def box(uuid0: str = "GPU-a", uuid1: str = "GPU-b") -> Machine:
    return Machine(
        gpus=(
            Gpu(0, "NVIDIA GeForce RTX 3090", 24 * GiB, 23 * GiB, uuid=uuid0),
            Gpu(1, "Tesla T4", 15 * GiB, 14 * GiB, uuid=uuid1),
        ),
        host=Host(64 * GiB, 60 * GiB, 8),
    )


CAL = Calibration(
    "2026-11-30",
    "b11312 (0c1e57098)",
    SpeedFactors(decode_empty=0.5, decode_depth=0.25, depth_tokens=8192, prefill=None),
    (("CUDA0", 700 * MiB),),
)


def test_ratios_and_interpolation() -> None:
    f = speed_ratios(
        {"decode_empty": 50.0, "decode_depth": 20.0, "prefill": 900.0},
        {"decode_empty": 100.0, "decode_depth": 80.0, "prefill": None},
        8192,
    )
    assert (f.decode_empty, f.decode_depth, f.prefill) == (0.5, 0.25, None)
    assert factor_at(f, 0) == 0.5
    assert factor_at(f, 4096) == pytest.approx(0.375)
    assert factor_at(f, 8192) == factor_at(f, 262144) == 0.25
    only_empty = SpeedFactors(0.7, None, 0, None)
    assert factor_at(only_empty, 100000) == 0.7


@given(st.floats(0.01, 3), st.floats(0.01, 3), st.integers(1, 300000), st.integers(0, 10**6))
def test_factor_lies_between_the_measured_ones(a: float, b: float, depth: int, ctx: int) -> None:
    f = factor_at(SpeedFactors(a, b, depth, None), ctx)
    assert f is not None and min(a, b) - 1e-9 <= f <= max(a, b) + 1e-9


def test_calibrate_scales_todays_bound() -> None:
    manifest = find_manifest("qwen3.8-35b-a3b-distill")
    layout = synthesize_layout(manifest.architecture, "Q4_K_M", 21 * 10**9)
    machine = box()
    est = estimate(layout, machine, RunConfig(ctx_size=65536, tensor_split=(27.0, 15.0)))
    speed = decode_speed(layout, est, device_bandwidths(machine), target_context=65536)
    cal = calibrate_speed(speed, CAL)
    assert isinstance(cal, SpeedEstimate)
    assert cal.tokens_per_s_empty == pytest.approx(speed.tokens_per_s_empty * 0.5)
    assert cal.tokens_per_s_target == pytest.approx(speed.tokens_per_s_target * 0.25)
    assert CAL.label in cal.bound
    assert predicted_figures(speed) == {
        "decode_empty": speed.tokens_per_s_empty,
        "decode_target": speed.tokens_per_s_target,
        "prefill": None,
    }


@dataclass(frozen=True)
class ExpectedSpeed:
    """The coming speed model's shape (another helper is writing it): the adapter reads both."""

    decode_tps_empty: float
    decode_tps_target: float
    prefill_tps: float
    target_context: int


def test_the_adapter_reads_the_coming_speed_model() -> None:
    cal = Calibration("d", "b", SpeedFactors(0.5, 0.25, 8192, 2.0))
    got = calibrate_speed(ExpectedSpeed(100.0, 80.0, 1000.0, 4096), cal)
    assert (got.decode_tps_empty, got.decode_tps_target, got.prefill_tps) == (
        50.0,
        pytest.approx(80.0 * 0.375),
        2000.0,
    )
    assert predicted_figures(ExpectedSpeed(1, 2, 3, 4)) == {
        "decode_empty": 1,
        "decode_target": 2,
        "prefill": 3,
    }
    assert {f.name for f in fields(got)} == {f.name for f in fields(ExpectedSpeed)}


def test_measured_overhead_replaces_the_default_on_that_gpu() -> None:
    manifest = find_manifest("qwen3.8-35b-a3b-distill")
    layout = synthesize_layout(manifest.architecture, "Q4_K_M", 21 * 10**9)
    config = RunConfig(ctx_size=32768, tensor_split=(27.0, 15.0))
    plain = estimate(layout, box(), config)
    tuned = estimate(layout, box(), config, overheads=apply_overheads(Overheads(), CAL))
    assert tuned.gpus[0].overhead_bytes == 700 * MiB
    assert tuned.gpus[1].overhead_bytes == Overheads().gpu_context_bytes
    assert tuned.gpus[0].total_bytes - plain.gpus[0].total_bytes == 700 * MiB - 384 * MiB


def test_driver_overhead() -> None:
    assert driver_overhead(10 * GiB, 1 * GiB, 8 * GiB) == 1 * GiB
    assert driver_overhead(5 * GiB, 1 * GiB, 8 * GiB) == 0


def stored(machine: Machine, builds: dict[str, dict]) -> dict:
    return {
        "schema_version": PROFILE_SCHEMA,
        "kind": PROFILE_KIND,
        "gpus": gpu_identity(machine),
        "profiles": builds,
    }


ENTRY = {
    "date": "2026-11-30",
    "build_label": "b11312 (0c1e57098)",
    "depth_tokens": 8192,
    "ratios": {"decode_empty": 0.5, "decode_depth": 0.25, "prefill": None},
    "gpus": [{"device": "CUDA0", "driver_overhead_bytes": 700 * MiB}],
}


def test_a_profile_applies_to_its_machine_and_build() -> None:
    machine = box()
    bid = build_id(11312, "0c1e57098", "0.5.0-dev")
    assert bid == "b11312-0c1e57098"
    cal, why = calibration_from_profile(stored(machine, {bid: ENTRY}), machine, bid)
    assert why is None and cal == CAL
    assert cal.label == "calibrated on this machine, 2026-11-30, build b11312 (0c1e57098)"


def test_another_build_or_other_gpus_is_not_applied_silently() -> None:
    machine = box()
    doc = stored(machine, {"b9000-abc": ENTRY})
    cal, why = calibration_from_profile(doc, machine, "b11312-0c1e57098")
    assert cal is None and why is not None
    assert "another llama.cpp build" in why and "b9000-abc" in why and "b11312" in why
    swapped = box(uuid1="GPU-other")
    cal, why = calibration_from_profile(doc, swapped, "b9000-abc")
    assert cal is None and why is not None and "other GPUs" in why
    cal, why = calibration_from_profile({"kind": "x"}, machine, "b9000-abc")
    assert cal is None and why is not None and "unknown format" in why


def test_machine_key_names_the_gpus_and_changes_with_them() -> None:
    key = machine_key(box())
    assert key.startswith("rtx-3090-tesla-t4-") and key == machine_key(box())
    assert machine_key(box(uuid1="GPU-c")) != key
    cpu = Machine(gpus=(), host=Host(64 * GiB, 60 * GiB, 8))
    assert machine_key(cpu).startswith("cpu-")
