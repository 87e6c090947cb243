"""Memory calibration (quantpick check --learn): what is learned, what is refused, and that a
stored one moves the next plan's compute for that build and those devices and nothing else."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fake_llama_server import fake_llama_server

from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.model.local import local_layout, manifest_for_gguf
from quantpick.pipeline import PlanInputs, plan_for
from quantpick.plan.check import Figures, Observed, PlannedServer, compare
from quantpick.plan.memory import Overheads, apply_compute_ratios
from quantpick.plan.memory_calibration import (
    calibration_for,
    entry_problems,
    learned_ratios,
    make_entry,
    report_problems,
)
from quantpick.plan.planner import PlanRequest
from quantpick.serve.calibration import (
    CalibrationRefused,
    load_memory_calibration,
    memory_path,
    save_memory_entry,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_model import write_tiny_model  # noqa: E402

MiB = 1024**2
GiB = 1024**3
BUILD = "b11312-0c1e570"  # what the fake llama-server's --version names (build, commit)

GPU = Figures("CUDA0", "gpu", weights_bytes=10 * GiB, kv_bytes=GiB, compute_bytes=400 * MiB)
HOST = Figures("CPU", "host", weights_bytes=300 * MiB, compute_bytes=40 * MiB)


def _report(gpu_compute: int, host_compute: int, *, ratios: tuple = (), spill: bool = False):
    planned = PlannedServer((GPU, HOST), 8192, 1, 8192, None, "test", ratios)
    gpu = replace(GPU, compute_bytes=gpu_compute)
    host = replace(HOST, compute_bytes=host_compute)
    if spill:
        gpu = replace(gpu, weights_bytes=GPU.weights_bytes - GiB)
        host = replace(host, weights_bytes=HOST.weights_bytes + GiB)
    return compare(planned, Observed(devices=(gpu, host), n_ctx_seq=8192))


def _entry(report, build: str = BUILD, devices: tuple = ()) -> dict:
    return make_entry(report, build=build, devices=devices, model_bytes=10 * GiB,
                      date="2026-12-03", model="m")  # fmt: skip


def test_a_run_as_planned_is_learned_per_device() -> None:
    report = _report(600 * MiB, 20 * MiB)
    assert report_problems(report) == []
    entry = _entry(report)
    assert entry_problems(entry) == []
    assert {r["device"]: r["ratio"] for r in entry["compute"]} == {"CUDA0": 1.5, "CPU": 0.5}


def test_a_spilled_run_is_never_learned() -> None:
    report = _report(600 * MiB, 20 * MiB, spill=True)
    assert "did not run as planned (weights-on-cpu)" in report_problems(report)[0]


def test_an_earlier_calibration_is_divided_out() -> None:
    # the plan already carried CUDA0 x1.5: 600 MiB planned, 600 measured -> still 1.5 vs the model
    planned_gpu = replace(GPU, compute_bytes=600 * MiB)
    planned = PlannedServer((planned_gpu, HOST), 8192, 1, 8192, None, "t", (("CUDA0", 1.5),))
    report = compare(planned, Observed(devices=(planned_gpu, HOST)))
    assert learned_ratios(report) == [("CUDA0", 600 * MiB, 400 * MiB), ("CPU", 40 * MiB, 40 * MiB)]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"measured_compute_bytes": -5}, "measured compute -5"),
        ({"ratio": 100.0, "measured_compute_bytes": 40000 * MiB}, "outside"),
        ({"ratio": math.nan}, "outside"),
        ({"ratio": 0.9}, "does not match"),
        ({"estimated_compute_bytes": "x"}, "estimated compute"),
    ],
)
def test_implausible_entries_are_refused(change: dict, problem: str) -> None:
    entry = _entry(_report(600 * MiB, 20 * MiB))
    entry["compute"][0].update(change)
    problems = entry_problems(entry)
    assert problems and problem in problems[0]
    with pytest.raises(CalibrationRefused):
        save_memory_entry(Machine(gpus=(), host=Host(64 * GiB, 60 * GiB, 8)), entry)


def test_scope_build_devices_size() -> None:
    entry = _entry(_report(600 * MiB, 20 * MiB), devices=("GPU-a",))
    cal, why = calibration_for([entry], BUILD, ("GPU-a",), (10 * GiB,))
    assert why is None and cal is not None and dict(cal.ratios) == {"CUDA0": 1.5, "CPU": 0.5}
    assert "quantpick check --learn" in cal.label
    assert calibration_for([entry], "b9000-abc", ("GPU-a",), (10 * GiB,))[0] is None
    assert calibration_for([entry], BUILD, ("GPU-b",), (10 * GiB,))[0] is None
    assert calibration_for([entry], BUILD, ("GPU-a",), (100 * GiB,))[0] is None
    assert calibration_for([], BUILD, ("GPU-a",), (10 * GiB,)) == (None, None)


def test_apply_scales_compute_only() -> None:
    from quantpick.plan.memory import DeviceEstimate, Estimate
    from quantpick.plan.memory import RunConfig as RC

    def row(device: str, kind: str) -> DeviceEstimate:
        return DeviceEstimate(device, kind, device, None, 100, 10, 1, 1000, 5, 0, 1116, 10**9,
                              10**9, (), (), (), ())  # fmt: skip

    est = Estimate((row("CUDA0", "gpu"), row("CPU", "host")), RC(), "b", True, 1, 1, 1, False)
    out = apply_compute_ratios(est, Overheads(compute_ratio_by_device=(("CUDA0", 1.5),),
                                              compute_basis="learned"))  # fmt: skip
    gpu, host = out.devices
    assert (gpu.compute_bytes, gpu.total_bytes) == (1500, 1616)
    assert (gpu.weights_bytes, gpu.kv_bytes, gpu.recurrent_bytes) == (100, 10, 1)
    assert host == est.devices[1]
    assert out.notes == ("compute CUDA0 x1.50: learned",)


def test_a_stored_calibration_moves_the_next_plan_for_that_build_only(tmp_path: Path) -> None:
    # this machine (probed, CPU only), the tiny model on disk, llama-server of build 11312
    machine = Machine(gpus=(), host=Host(64 * GiB, 60 * GiB, 8))
    model = tmp_path / "tiny.gguf"
    write_tiny_model(model)
    layout = local_layout(model, None)
    manifest = manifest_for_gguf(model, layout)
    server = fake_llama_server(tmp_path / "b11312", build=11312)

    def cpu_row(llama_server: Path):
        request = PlanRequest(ctx_size=4096, quant=manifest.files[0].quant)
        result = plan_for(PlanInputs(manifest, machine, request, Overheads(),
                                     llama_server=llama_server, local=layout))  # fmt: skip
        return result.plan.estimate.host, (*result.plan.estimate.notes, *result.notes)

    before, notes = cpu_row(server)
    assert not any("check --learn" in n for n in notes)
    measured = before.compute_bytes // 2  # llama.cpp allocated half the estimate
    report = compare(
        PlannedServer((Figures("CPU", "host", before.weights_bytes, before.kv_bytes,
                               before.recurrent_bytes, before.compute_bytes),),
                      4096, 1, 4096, None, "t"),
        Observed(devices=(Figures("CPU", "host", before.weights_bytes, before.kv_bytes,
                                  before.recurrent_bytes, measured),)),
    )  # fmt: skip
    entry = make_entry(report, build=BUILD, devices=(), model_bytes=before.weights_bytes,
                       date="2026-12-03", model="tiny")  # fmt: skip
    path = save_memory_entry(machine, entry)
    assert path == memory_path(machine)
    assert load_memory_calibration(machine, BUILD, sizes=(before.weights_bytes,))[0] is not None

    after, notes = cpu_row(server)
    assert abs(after.compute_bytes - measured) <= 1
    assert (after.weights_bytes, after.kv_bytes, after.recurrent_bytes) == (
        before.weights_bytes, before.kv_bytes, before.recurrent_bytes)  # fmt: skip
    assert any("quantpick check --learn" in n for n in notes)

    # another build of llama.cpp: the calibration does not apply
    other = fake_llama_server(tmp_path / "b9000", build=9000)
    _, notes = cpu_row(other)
    assert not any(n.startswith("compute CPU x") for n in notes)
    assert any("memory calibration not applied: " in n and "another llama.cpp build" in n
               for n in notes)  # fmt: skip

    # another machine (a GPU added): not its calibration
    gpu_box = replace(machine, gpus=(Gpu(0, "NVIDIA GeForce RTX 3090", 24 * GiB, 23 * GiB,
                                         uuid="GPU-a"),))  # fmt: skip
    assert load_memory_calibration(gpu_box, BUILD, sizes=(before.weights_bytes,))[0] is None
