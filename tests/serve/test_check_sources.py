"""What `check` reads besides llama.cpp's log: the plan in serve's record, the server process's
swap, and NVML's per-process GPU memory (emulated at the pynvml boundary)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fake_nvml import FakeNvml, NVMLError_NotSupported, rtx_3090

from quantpick.machine.probe import gpu_memory_use
from quantpick.plan.check import Figures, PlannedServer
from quantpick.serve import processes as srv_procs
from quantpick.serve import server_records as srv_records

GiB = 1024**3
PLAN = PlannedServer(
    (Figures("CUDA0", "gpu", weights_bytes=GiB, free_bytes=23 * GiB),
     Figures("CPU", "host", weights_bytes=1, output_bytes=4096)),
    8192, 2, 4096, 41.5, "the plan `quantpick serve` started it with", (("CUDA0", 0.8),),
    "b11312-0c1e57098",
)  # fmt: skip


def _record(**changes: object) -> dict:
    record = srv_records.ServerRecord(
        alias="m", pid=4242, host="127.0.0.1", port=8080, log="/x.log", argv=("llama-server",),
        started=1.0, detached=True, quantpick_pid=4241, start_ticks=1, plan=PLAN,
    )  # fmt: skip
    return {**json.loads(json.dumps(record.to_dict())), **changes}


def test_the_plan_round_trips_through_the_record() -> None:
    assert srv_records.parse_record(_record()).plan == PLAN


@pytest.mark.parametrize(
    "plan",
    [
        "x", [1], {"devices": "x"}, {**PLAN.to_dict(), "n_ctx_seq": 10**9},
        {**PLAN.to_dict(), "devices": [1, None]},
        {**PLAN.to_dict(), "devices": [{"device": "CUDA0", "weights_bytes": -1}]},
        {**PLAN.to_dict(), "compute_ratios": [["CUDA0", float("nan")]]},
    ],
)  # fmt: skip
def test_a_bad_plan_is_no_plan_and_the_record_stays(plan: object) -> None:
    record = srv_records.parse_record(_record(plan=plan))
    assert record.plan is None and record.pid == 4242


def test_a_record_without_a_plan(tmp_path: Path) -> None:
    data = _record()
    del data["plan"]
    assert srv_records.parse_record(data).plan is None


def test_swap_of_the_process(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "status").write_text(
        "Name:\tllama-server\nVmRSS:\t  100 kB\nVmSwap:\t  2048 kB\n"
    )
    assert srv_procs.process_swap_bytes(77, tmp_path) == 2048 * 1024
    assert srv_procs.process_memory(77, tmp_path) == (100 * 1024, 2048 * 1024)
    assert srv_procs.process_memory(78, tmp_path) == (None, None)


def test_nvml_per_process_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    a = rtx_3090(total=24 * GiB, free=4 * GiB, processes={4242: 18 * GiB, 99: 2 * GiB})
    b = rtx_3090(total=24 * GiB, free=24 * GiB)
    fake = FakeNvml([a, b])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    use, note = gpu_memory_use(4242)
    assert note is None
    assert [(g.index, g.used_bytes, g.process_bytes) for g in use] == [
        (0, 20 * GiB, 18 * GiB), (1, 0, 0)]  # fmt: skip
    assert fake.shutdown_calls == 1


def test_nvml_without_per_process_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    # Windows WDDM: usedGpuMemory unavailable; a driver that refuses the call
    a = rtx_3090(total=24 * GiB, free=4 * GiB, processes={4242: None})  # type: ignore[dict-item]
    b = rtx_3090(fail={"nvmlDeviceGetComputeRunningProcesses": NVMLError_NotSupported})
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([a, b]))
    use, _ = gpu_memory_use(4242)
    assert [g.process_bytes for g in use] == [None, None]


def test_no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    from fake_nvml import NVMLError_LibraryNotFound

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error=NVMLError_LibraryNotFound))
    use, note = gpu_memory_use(1)
    assert use == () and note is not None and "no NVML" in note
