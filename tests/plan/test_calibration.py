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
from quantpick.plan.bandwidth_bound import SpeedEstimate, decode_speed
from quantpick.plan.calibration import (
    FITTED_MODEL_BYTES,
    MODEL_BYTES_RANGE,
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
    plausibility_problems,
    predicted_figures,
    speed_ratios,
)
from quantpick.plan.memory import Overheads, RunConfig, estimate
from quantpick.plan.placement import device_bandwidths

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


def stored(machine: Machine, entries: list[dict]) -> dict:
    return {
        "schema_version": PROFILE_SCHEMA,
        "kind": PROFILE_KIND,
        "gpus": gpu_identity(machine),
        "profiles": entries,
    }


BID = "b11312-0c1e57098"
Q4_BYTES = 21 * 10**9


def good_entry(**overrides: object) -> dict:
    """A bench entry that can be true: a 35B-A3B Q4_K_M on both GPUs of `box()`, two reps."""
    entry = {
        "build_id": BID,
        "build_label": "b11312 (0c1e57098)",
        "date": "2026-11-30",
        "model": "qwen3.8-35b-a3b-distill",
        "quant": "Q4_K_M",
        "depth_tokens": 8192,
        "measured": {"decode_tps_empty": 60.0, "decode_tps_depth": 30.0, "prefill_tps": 900.0,
                     "prefill_tps_depth": 800.0},
        "predicted": {"decode_tps_empty": 120.0, "decode_tps_depth": 120.0, "prefill_tps": 1000.0,
                      "model": "fitted"},
        "ratios": {"decode_empty": 0.5, "decode_depth": 0.25 * 2, "prefill": 0.9},
        "gpus": [{"device": "CUDA0", "driver_overhead_bytes": 700 * MiB}],
        "model_bytes": Q4_BYTES,
        "devices": ["GPU-a", "GPU-b"],
        "samples": {"decode_empty": [60.5, 59.5], "prefill": [905.0, 895.0]},
    }  # fmt: skip
    entry.update(overrides)
    return entry


SIZES = (12 * 10**9, Q4_BYTES, 37 * 10**9)  # the family's Q2..Q8 files


def test_a_profile_applies_to_its_machine_build_devices_and_model_size() -> None:
    machine = box()
    bid = build_id(11312, "0c1e57098", "0.5.0-dev")
    assert bid == BID
    cal, why = calibration_from_profile(stored(machine, [good_entry()]), machine, bid, SIZES)
    assert why is None and cal is not None
    assert cal.speed == SpeedFactors(0.5, 0.5, 8192, 0.9)
    assert cal.gpu_overhead_bytes == (("CUDA0", 700 * MiB),)
    assert cal.label == (
        "calibrated on this machine, 2026-11-30, build b11312 (0c1e57098) (bench of "
        "qwen3.8-35b-a3b-distill Q4_K_M, 19.56 GiB, on 2 devices)"
    )


def test_another_build_or_other_gpus_is_not_applied_silently() -> None:
    machine = box()
    doc = stored(machine, [good_entry(build_id="b9000-abc")])
    cal, why = calibration_from_profile(doc, machine, BID, SIZES)
    assert cal is None and why is not None
    assert "another llama.cpp build" in why and "b9000-abc" in why and "b11312" in why
    swapped = box(uuid1="GPU-other")
    cal, why = calibration_from_profile(doc, swapped, "b9000-abc", SIZES)
    assert cal is None and why is not None and "other GPUs" in why
    cal, why = calibration_from_profile({"kind": "x"}, machine, "b9000-abc", SIZES)
    assert cal is None and why is not None and "unknown format" in why


def test_a_profile_is_scoped_to_the_devices_it_ran_on() -> None:
    # a CPU-only run (or one GPU of two) says nothing about plans on every GPU
    machine = box()
    for devices in ([], ["GPU-a"]):
        doc = stored(machine, [good_entry(devices=devices)])
        cal, why = calibration_from_profile(doc, machine, BID, SIZES)
        assert cal is None and why is not None and "not on every device" in why


def test_a_profile_is_scoped_to_its_model_size() -> None:
    # Before: the README's bench of the 16 MiB tiny model calibrated every later CPU pick.
    machine = box()
    doc = stored(machine, [good_entry()])
    cal, why = calibration_from_profile(doc, machine, BID, (16 * MiB,))
    assert cal is None and why is not None and "another size of model" in why
    cal, why = calibration_from_profile(doc, machine, BID, (120 * GiB, 240 * GiB))
    assert cal is None and why is not None
    assert calibration_from_profile(doc, machine, BID, (40 * 10**9,))[0] is not None


def test_the_nearest_size_class_wins() -> None:
    machine = box()
    small = good_entry(model_bytes=12 * 10**9, ratios={"decode_empty": 0.6, "decode_depth": 0.6,
                                                        "prefill": None})  # fmt: skip
    doc = stored(machine, [small, good_entry()])
    cal, _ = calibration_from_profile(doc, machine, BID, (Q4_BYTES,))
    assert cal is not None and cal.speed.decode_empty == 0.5
    cal, _ = calibration_from_profile(doc, machine, BID, (11 * 10**9,))
    assert cal is not None and cal.speed.decode_empty == 0.6


@pytest.mark.parametrize(
    ("ratios", "why"),
    [
        ({"decode_empty": float("nan")}, "decode_empty measured / predicted is nan"),
        ({"decode_empty": -0.7}, "decode_empty measured / predicted is -0.7"),
        ({"decode_empty": float("inf")}, "is inf"),
        ({"decode_empty": 1e303}, "is 1e+303"),
        ({"prefill": 0.015}, "prefill measured / predicted is 0.015: outside 0.35-2.8"),
        ({"decode_empty": "0.5"}, "is '0.5'"),
    ],
)
def test_a_stored_implausible_profile_is_not_applied(ratios: dict, why: str) -> None:
    # Before: applied as stored; every pick then exited 3 ("~-565 tok/s") or printed inf/nan.
    machine = box()
    entry = good_entry()
    entry["ratios"] = {**entry["ratios"], **ratios}
    cal, reason = calibration_from_profile(stored(machine, [entry]), machine, BID, SIZES)
    assert cal is None and reason is not None
    assert why in reason and "calibration reset" in reason


def test_a_schema_1_profile_is_not_applied() -> None:
    machine = box()
    doc = {**stored(machine, []), "schema_version": 1, "profiles": {BID: good_entry()}}
    cal, why = calibration_from_profile(doc, machine, BID, SIZES)
    assert cal is None and why is not None and "another quantpick version" in why


def test_a_good_entry_is_plausible() -> None:
    assert plausibility_problems(good_entry()) == []


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"measured": {"decode_tps_empty": float("nan")}}, "measured decode_tps_empty is nan"),
        ({"measured": {"decode_tps_empty": -565.0}}, "measured decode_tps_empty is -565,"),
        ({"predicted": {"decode_tps_empty": 0.0}}, "predicted decode_tps_empty is 0,"),
        ({"ratios": {"decode_empty": 1e303, "decode_depth": None}}, "is 1e+303: outside"),
        ({"ratios": {"decode_empty": None, "decode_depth": None, "prefill": 1.0}},
         "no decode figure"),
        ({"model_bytes": 16 * MiB}, "the model (16.00 MiB) is outside 1.17 GiB-118.04 GiB"),
        ({"model_bytes": None}, "size is not recorded"),
        ({"measured": {"decode_tps_empty": 30.0, "decode_tps_depth": 60.0}},
         "faster than with an empty context"),
        ({"samples": {"decode_empty": [60.0, 80.0]}}, "repetitions disagree by 33%"),
        ({"samples": {"decode_empty": [60.0]}}, "one repetition cannot show"),
        ({"samples": {"decode_empty": [60.0, float("nan")]}}, "repetition is not a speed"),
        ({"devices": None}, "devices it ran on are not recorded"),
    ],
)  # fmt: skip
def test_an_implausible_run_is_refused(overrides: dict, why: str) -> None:
    assert any(why in p for p in plausibility_problems(good_entry(**overrides))), (
        plausibility_problems(good_entry(**overrides))
    )


def test_the_fitted_size_range_covers_the_fitted_files() -> None:
    """The constants bracket the files of benchmarks/data/speed-measurements.json that state
    their size in GiB (the rest say GB, MiB or bytes in words)."""
    import json
    import re
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "benchmarks/data/speed-measurements.json"
    sizes = [
        float(m[1]) * GiB
        for r in json.loads(data.read_text())
        if (m := re.fullmatch(r"([0-9.]+) GiB", str(r.get("file_size"))))
    ]
    lo, hi = MODEL_BYTES_RANGE
    assert sizes and lo < min(sizes) and max(sizes) <= FITTED_MODEL_BYTES[1] < hi


def test_ratios_of_figures_that_are_not_speeds_are_none() -> None:
    f = speed_ratios(
        {"decode_empty": float("nan"), "decode_depth": -5.0, "prefill": 900.0},
        {"decode_empty": 100.0, "decode_depth": 80.0, "prefill": float("inf")},
        8192,
    )
    assert (f.decode_empty, f.prefill) == (None, None)
    assert f.decode_depth == -5.0 / 80.0  # negative: left to plausibility_problems to refuse


def test_machine_key_names_the_gpus_and_changes_with_them() -> None:
    key = machine_key(box())
    assert key.startswith("rtx-3090-tesla-t4-") and key == machine_key(box())
    assert machine_key(box(uuid1="GPU-c")) != key
    cpu = Machine(gpus=(), host=Host(64 * GiB, 60 * GiB, 8))
    assert machine_key(cpu).startswith("cpu-")


def test_a_measured_speculation_acceptance_is_read_back() -> None:
    """`bench --spec` stores its acceptance per kind (docs/calibration.md "speculation"): the
    calibration carries it for the planner (before: measured, printed and forgotten)."""
    machine = box()
    entry = good_entry(speculation={"mtp": {"acceptance": 0.42, "rate": 0.3, "draft_n_max": 4}})
    cal, why = calibration_from_profile(stored(machine, [entry]), machine, BID, SIZES)
    assert cal is not None, why
    assert cal.acceptance == (("mtp", 0.42),)
    cal, _ = calibration_from_profile(stored(machine, [good_entry()]), machine, BID, SIZES)
    assert cal is not None and cal.acceptance == ()


@pytest.mark.parametrize("value", [0.0, 1.0, -0.2, float("nan"), "0.5", None, 7])
def test_an_impossible_speculation_acceptance_refuses_the_entry(value: object) -> None:
    entry = good_entry(speculation={"mtp": {"acceptance": value}})
    assert any("speculation mtp acceptance" in p for p in plausibility_problems(entry))


def test_a_speculation_that_is_not_an_object_refuses_the_entry() -> None:
    problems = plausibility_problems(good_entry(speculation=[0.5]))
    assert any("speculation is a list, not an object" in p for p in problems)
