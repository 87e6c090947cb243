"""Calibration profiles on disk: one file per machine, one entry per scope (build, devices, size
class); only plausible entries are stored; hostile files are not read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from quantpick.config import load_settings
from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.plan.calibration import PROFILE_KIND, machine_key
from quantpick.serve.calibration import (
    CalibrationRefused,
    list_profiles,
    load_calibration,
    profile_path,
    read_profile,
    remove_profiles,
    save_profile,
)

GiB = 1024**3
Q4 = 21 * 10**9
SIZES = (Q4,)


def box(uuid: str = "GPU-a") -> Machine:
    return Machine(
        gpus=(Gpu(0, "NVIDIA GeForce RTX 3090", 24 * GiB, 23 * GiB, uuid=uuid),),
        host=Host(64 * GiB, 60 * GiB, 8),
    )


def entry(build: str, ratio: float, *, model_bytes: int = Q4, devices: list | None = None) -> dict:
    return {
        "build_id": build,
        "build_label": build,
        "date": "2026-11-30",
        "depth_tokens": 4096,
        "measured": {"decode_tps_empty": 100 * ratio, "decode_tps_depth": 90 * ratio},
        "predicted": {"decode_tps_empty": 100.0, "decode_tps_depth": 100.0},
        "ratios": {"decode_empty": ratio, "decode_depth": ratio * 0.9, "prefill": None},
        "gpus": [{"device": "CUDA0", "driver_overhead_bytes": 500 * 2**20}],
        "model_bytes": model_bytes,
        "devices": ["GPU-a"] if devices is None else devices,
        "samples": {"decode_empty": [100 * ratio, 100 * ratio]},
    }


def test_round_trip_and_scopes_kept_side_by_side() -> None:
    machine = box()
    path = save_profile(machine, entry("b11312-0c1e57098", 0.6))
    assert (
        path
        == profile_path(machine)
        == (load_settings().config_dir / "calibration" / f"{machine_key(machine)}.json")
    )
    save_profile(machine, entry("b9000-abc", 0.8))
    save_profile(machine, entry("b11312-0c1e57098", 0.9, model_bytes=6 * GiB))  # other size class
    save_profile(machine, entry("b11312-0c1e57098", 0.7))  # a re-run replaces its own scope
    doc = json.loads(path.read_text())
    assert doc["kind"] == PROFILE_KIND and doc["schema_version"] == 2
    assert sorted((e["build_id"], e["model_bytes"]) for e in doc["profiles"]) == [
        ("b11312-0c1e57098", 6 * GiB), ("b11312-0c1e57098", Q4), ("b9000-abc", Q4),
    ]  # fmt: skip
    cal, why = load_calibration(machine, "b11312-0c1e57098", sizes=SIZES)
    assert why is None and cal is not None
    assert cal.speed.decode_empty == 0.7 and cal.gpu_overhead_bytes == (("CUDA0", 500 * 2**20),)
    assert not list(path.parent.glob(".*.tmp"))  # written atomically


@pytest.mark.parametrize(
    "bad",
    [
        {"ratios": {"decode_empty": float("nan"), "decode_depth": None, "prefill": None}},
        {"ratios": {"decode_empty": -5.6, "decode_depth": None, "prefill": None}},
        {"ratios": {"decode_empty": 1e303, "decode_depth": None, "prefill": None}},
        {"model_bytes": 16 * 2**20},
    ],
)
def test_an_implausible_entry_is_never_stored(bad: dict) -> None:
    # Before: stored as measured, and every later pick on this machine used it.
    machine = box()
    save_profile(machine, entry("b1-x", 0.5))
    before = profile_path(machine).read_bytes()
    with pytest.raises(CalibrationRefused) as exc:
        save_profile(machine, {**entry("b1-x", 0.5), **bad})
    assert exc.value.message.startswith("calibration not stored: ")
    assert profile_path(machine).read_bytes() == before
    assert b"NaN" not in before and b"Infinity" not in before


def test_never_measured_says_nothing() -> None:
    assert load_calibration(box(), "b11312-0c1e57098", sizes=SIZES) == (None, None)


def test_another_machines_profile_is_named_not_applied() -> None:
    save_profile(box("GPU-a"), entry("b11312-0c1e57098", 0.6))
    cal, why = load_calibration(box("GPU-z"), "b11312-0c1e57098", sizes=SIZES)
    assert cal is None and why is not None and "other GPUs" in why


def test_a_broken_file_is_reported(tmp_path: Path) -> None:
    path = profile_path(box())
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    cal, why = load_calibration(box(), "b1-x", sizes=SIZES)
    assert cal is None and why is not None and "not a readable calibration file" in why
    save_profile(box(), entry("b1-x", 0.5))  # and bench can write over it
    assert load_calibration(box(), "b1-x", sizes=SIZES)[0] is not None


def test_a_fifo_or_a_huge_file_is_not_read(tmp_path: Path) -> None:
    path = profile_path(box())
    path.parent.mkdir(parents=True)
    os.mkfifo(path)  # opened without O_NONBLOCK, this would wait for a writer for ever
    assert read_profile(path) is None
    path.unlink()
    path.write_bytes(b" " * (5 * 2**20))
    assert read_profile(path) is None


def test_list_and_remove() -> None:
    save_profile(box("GPU-a"), entry("b1-x", 0.5))
    save_profile(box("GPU-b"), entry("b1-x", 0.5, devices=["GPU-b"]))
    listed = list_profiles()
    assert [p.name for p, _ in listed] == sorted(
        f"{machine_key(box(u))}.json" for u in ("GPU-a", "GPU-b")
    )
    assert all(doc is not None for _, doc in listed)
    assert remove_profiles([profile_path(box("GPU-a"))]) == [profile_path(box("GPU-a"))]
    assert [p.name for p, _ in list_profiles()] == [f"{machine_key(box('GPU-b'))}.json"]
