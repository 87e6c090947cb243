"""plan/check.py: a running server's buffers beside its plan, and the findings. Pure."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantpick.plan.check import (
    Figures,
    FindingCode,
    GpuUse,
    Observed,
    PlannedServer,
    Severity,
    compare,
    pair_devices,
)
from quantpick.serve.server_log import read_log

MiB = 1024**2
GiB = 1024**3
DATA = Path(__file__).resolve().parents[1] / "data" / "server-logs"


def _plan(
    *devices: Figures, n_ctx: int = 4096, np_: int = 1, tps: float | None = 50.0
) -> PlannedServer:
    return PlannedServer(devices, n_ctx, np_, n_ctx // np_, tps, "test plan")


GPU = Figures("CUDA0", "gpu", weights_bytes=17 * GiB, kv_bytes=2 * GiB, recurrent_bytes=63 * MiB,
              compute_bytes=500 * MiB, free_bytes=23 * GiB)  # fmt: skip
HOST = Figures("CPU", "host", weights_bytes=300 * MiB, compute_bytes=20 * MiB, output_bytes=1 * MiB)


def _codes(report: object) -> set[FindingCode]:
    return {f.code for f in report.findings}  # type: ignore[attr-defined]


def test_as_planned_when_every_exact_component_matches() -> None:
    measured = (replace(GPU, free_bytes=None, compute_bytes=512 * MiB), replace(HOST))
    report = compare(_plan(GPU, HOST), Observed(devices=measured, n_ctx_seq=4096))
    assert report.as_planned and not report.spilled
    assert all(c.matches() for c in report.devices)
    # compute is an estimate: a difference is information, not a fault
    assert _codes(report) == {FindingCode.COMPUTE_DIFFERS}


def test_rounding_of_the_log_is_within_tolerance() -> None:
    measured = (replace(GPU, weights_bytes=GPU.weights_bytes + 5 * 1024), HOST)
    report = compare(_plan(GPU, HOST), Observed(devices=measured))
    assert FindingCode.MEMORY_DIFFERS not in _codes(report)


def test_partial_offload_public_cuda_log_is_a_spill() -> None:
    # llama.cpp issue #13729: 30/49 layers on CUDA0, 6940 MiB of weights in host memory; a plan
    # that put all but the 300 MiB input layer on the GPU.
    log = read_log(DATA / "cuda-qwen3-30b-a3b-partial-issue13729.log")
    total = sum(m.weights_bytes for m in log.measured())
    gpu = replace(GPU, weights_bytes=total - 300 * MiB, kv_bytes=0, recurrent_bytes=0)
    measured = tuple(
        Figures(m.device, "host" if m.device == "CPU" else "gpu", weights_bytes=m.weights_bytes)
        for m in log.measured()
    )
    report = compare(_plan(gpu, HOST), Observed(devices=measured, offloaded=log.offloaded))
    (spill,) = [f for f in report.findings if f.code is FindingCode.WEIGHTS_ON_CPU]
    assert spill.device == "CUDA0" and spill.severity is Severity.COSTS
    assert "offloaded 30/49 layers" in spill.message
    assert not report.as_planned and report.spilled
    # the moved bytes are the spill's, not "another file"
    assert FindingCode.MEMORY_DIFFERS not in _codes(report)


def test_no_gpu_buffer_at_all() -> None:
    host = replace(HOST, weights_bytes=HOST.weights_bytes + GPU.weights_bytes,
                   kv_bytes=GPU.kv_bytes)  # fmt: skip
    report = compare(_plan(GPU, HOST), Observed(devices=(host,)))
    assert {FindingCode.WEIGHTS_ON_CPU, FindingCode.KV_ON_CPU} <= _codes(report)
    assert "no buffer on CUDA0 at all" in report.findings[0].message


def test_kv_on_cpu_alone() -> None:
    gpu = replace(GPU, kv_bytes=0, free_bytes=None)
    host = replace(HOST, kv_bytes=GPU.kv_bytes)
    report = compare(_plan(GPU, HOST), Observed(devices=(gpu, host)))
    assert _codes(report) & {FindingCode.WEIGHTS_ON_CPU, FindingCode.KV_ON_CPU} == {
        FindingCode.KV_ON_CPU
    }


def test_context_smaller_than_planned() -> None:
    report = compare(
        _plan(GPU, HOST, n_ctx=32768, np_=4), Observed(n_ctx_seq=4096, n_ctx_from="/props")
    )
    (f,) = [f for f in report.findings if f.code is FindingCode.CONTEXT_SMALLER]
    assert "4096" in f.message and "8192" in f.message and not report.as_planned
    assert compare(_plan(GPU, HOST), Observed(n_ctx_seq=4096)).as_planned


def test_swap_in_use() -> None:
    report = compare(_plan(GPU, HOST), Observed(swap_bytes=300 * MiB))
    assert _codes(report) == {FindingCode.SWAP_IN_USE} and not report.as_planned
    assert compare(_plan(GPU, HOST), Observed(swap_bytes=0)).as_planned


def test_gpu_fuller_than_planned() -> None:
    # planned with 23 GiB free of 24 GiB; now others hold 3 GiB beside the server's 20 GiB
    busy = GpuUse("CUDA0", 24 * GiB, 23 * GiB, 20 * GiB)
    report = compare(_plan(GPU, HOST), Observed(gpus=(busy,)))
    (f,) = report.findings
    assert f.code is FindingCode.GPU_FULLER and "2.00 GiB more" in f.message
    calm = GpuUse("CUDA0", 24 * GiB, 21 * GiB, 20 * GiB)
    assert compare(_plan(GPU, HOST), Observed(gpus=(calm,))).as_planned
    unknown = GpuUse("CUDA0", 24 * GiB, 23 * GiB, None)  # WDDM: no per-process figure
    assert compare(_plan(GPU, HOST), Observed(gpus=(unknown,))).as_planned


@pytest.mark.parametrize(("measured", "slow"), [(20.0, True), (30.0, False), (None, False)])
def test_decode_far_below_expected(measured: float | None, slow: bool) -> None:
    report = compare(_plan(GPU, HOST, tps=50.0), Observed(decode_tps=measured, decode_from="x"))
    assert (FindingCode.DECODE_SLOW in _codes(report)) is slow


def test_unplanned_device_and_problems_are_notes() -> None:
    extra = Figures("CUDA1", "gpu", weights_bytes=1 * GiB)
    report = compare(_plan(GPU, HOST), Observed(devices=(GPU, extra, HOST), problems=("x",)))
    assert {FindingCode.DEVICE_UNPLANNED, FindingCode.NOT_MEASURED} <= _codes(report)
    assert report.as_planned
    assert [c.device for c in report.devices] == ["CUDA0", "CUDA1", "CPU"]


def test_rpc_devices_pair_by_worker() -> None:
    a, b = "10.0.0.2:50052", "10.0.0.3:50052"
    planned = (Figures("RPC0", "gpu", weights_bytes=1, endpoint=a),
               Figures("RPC1", "gpu", weights_bytes=2, endpoint=b), HOST)  # fmt: skip
    # each worker's device is RPC0 on its worker (ggml-rpc.cpp:1092)
    measured = (Figures(f"RPC0[{b}]", weights_bytes=2), Figures(f"RPC0[{a}]", weights_bytes=1),
                HOST)  # fmt: skip
    pairs = pair_devices(planned, measured)
    got = [(c.planned.device, c.measured.device) for c in pairs]  # type: ignore[union-attr]
    assert got == [("RPC0", f"RPC0[{a}]"), ("RPC1", f"RPC0[{b}]"), ("CPU", "CPU")]


def test_planned_server_round_trip() -> None:
    planned = _plan(GPU, HOST)
    assert PlannedServer.from_dict(planned.to_dict()) == planned


_KEYS = st.sampled_from(["devices", "n_ctx", "n_parallel", "n_ctx_seq", "decode_tps", "basis"])
_ROWS = st.lists(
    st.one_of(st.integers(), st.dictionaries(st.text(max_size=8), st.integers())), max_size=3
)
_VALUES = st.one_of(st.none(), st.integers(-5, 2**70), st.text(max_size=5), st.floats(), _ROWS)


@settings(deadline=None)  # a shared machine: no timing in tests
@given(st.dictionaries(_KEYS, _VALUES))
def test_planned_server_from_garbage_is_a_value_error(data: dict[str, object]) -> None:
    try:
        planned = PlannedServer.from_dict(data)
    except ValueError:
        return
    assert planned.n_ctx_seq <= planned.n_ctx and planned.n_parallel >= 1
