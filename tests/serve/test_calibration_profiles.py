"""Calibration profiles on disk: one file per machine, one entry per llama.cpp build."""

from __future__ import annotations

import json
from pathlib import Path

from quantpick.config import load_settings
from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.plan.calibration import PROFILE_KIND, machine_key
from quantpick.serve.calibration import load_calibration, profile_path, save_profile

GiB = 1024**3


def box(uuid: str = "GPU-a") -> Machine:
    return Machine(
        gpus=(Gpu(0, "NVIDIA GeForce RTX 3090", 24 * GiB, 23 * GiB, uuid=uuid),),
        host=Host(64 * GiB, 60 * GiB, 8),
    )


def entry(build: str, ratio: float) -> dict:
    return {
        "build_id": build,
        "build_label": build,
        "date": "2026-11-30",
        "depth_tokens": 4096,
        "ratios": {"decode_empty": ratio, "decode_depth": ratio / 2, "prefill": None},
        "gpus": [{"device": "CUDA0", "driver_overhead_bytes": 500 * 2**20}],
    }


def test_round_trip_and_builds_kept_side_by_side() -> None:
    machine = box()
    path = save_profile(machine, entry("b11312-0c1e57098", 0.6))
    assert (
        path
        == profile_path(machine)
        == (load_settings().config_dir / "calibration" / f"{machine_key(machine)}.json")
    )
    save_profile(machine, entry("b9000-abc", 0.4))
    save_profile(machine, entry("b11312-0c1e57098", 0.7))  # a re-run replaces its own build
    doc = json.loads(path.read_text())
    assert doc["kind"] == PROFILE_KIND and set(doc["profiles"]) == {"b11312-0c1e57098", "b9000-abc"}
    cal, why = load_calibration(machine, "b11312-0c1e57098")
    assert why is None and cal is not None
    assert cal.speed.decode_empty == 0.7 and cal.gpu_overhead_bytes == (("CUDA0", 500 * 2**20),)
    assert not list(path.parent.glob(".*.tmp"))  # written atomically


def test_never_measured_says_nothing() -> None:
    assert load_calibration(box(), "b11312-0c1e57098") == (None, None)


def test_another_machines_profile_is_named_not_applied() -> None:
    save_profile(box("GPU-a"), entry("b11312-0c1e57098", 0.6))
    cal, why = load_calibration(box("GPU-z"), "b11312-0c1e57098")
    assert cal is None and why is not None and "other GPUs" in why


def test_a_broken_file_is_reported(tmp_path: Path) -> None:
    path = profile_path(box())
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    cal, why = load_calibration(box(), "b1-x")
    assert cal is None and why is not None and "not readable" in why
    save_profile(box(), entry("b1-x", 0.5))  # and bench can write over it
    assert load_calibration(box(), "b1-x")[0] is not None
