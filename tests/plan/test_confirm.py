"""The per-device comparison with llama.cpp's recorded projections (llama-fit-params, b11312,
full-size qwen35moe Q4_K_M header on two RPC workers): agreement to the MiB, llama.cpp's verdict,
the adjustments for what llama-fit-params cannot be asked, and the corrections a re-plan uses."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conformance_model import DATA, config_from_args, rpc_machine, write_conformance_gguf
from hypothesis import given
from hypothesis import strategies as st

from quantpick.model.gguf import layout_from_header, read_gguf_file
from quantpick.model.layout import ModelLayout
from quantpick.plan.confirm import (
    LOGITS_LIVE_BYTES_PER_ROW,
    LlamaDevice,
    MiB,
    Projection,
    _component,
    compare,
    fit_params_config,
    server_logits_saving,
)
from quantpick.plan.memory import Overheads, RunConfig, estimate
from quantpick.serve.fitparams import parse_output

GiB = 1024**3


@pytest.fixture(scope="module")
def q4km(tmp_path_factory: pytest.TempPathFactory) -> ModelLayout:
    path = tmp_path_factory.mktemp("gguf") / "q4km.gguf"
    size = write_conformance_gguf(path)
    return layout_from_header(read_gguf_file(path), basis=f"gguf:{path}", file_bytes=size)


def projection(name: str) -> Projection:
    return parse_output((DATA / f"llama-fit-params-{name}.txt").read_text())


def at(ts: tuple[float, float]) -> RunConfig:
    return RunConfig(ctx_size=262144, tensor_split=ts)


def test_weights_and_context_agree_to_the_mib(q4km: ModelLayout) -> None:
    c = compare(q4km, rpc_machine(2), at((30.0, 12.0)), projection("q4km-rpc-30-12"), capped=True)
    assert c.problem is None
    assert [d.device for d in c.checks] == ["CPU0", "CPU1", "CPU"]
    assert [d.llama_device for d in c.checks] == ["RPC0", "RPC1", "Host"]
    for d in c.checks:
        assert d.agrees("model") and d.agrees("context"), d.device


def test_llama_cpp_free_memory_and_margin_decide(q4km: ModelLayout) -> None:
    """The planner's machine says 64 GiB free; llama.cpp measured 24105 MiB: its view wins."""
    c = compare(q4km, rpc_machine(2), at((41.0, 1.0)), projection("q4km-rpc-41-1"), capped=True)
    cuda0 = c.checks[0]
    assert cuda0.free_from == "llama.cpp" and cuda0.free_bytes == 24105 * MiB
    assert cuda0.budget_bytes == 24105 * MiB - Overheads().gpu_margin_bytes
    assert not cuda0.fits and not c.fits
    assert [d.device for d in c.overflowing] == ["CPU0"]
    # the estimate itself (64 GiB free) thought it fitted
    est = estimate(q4km, rpc_machine(2), at((41.0, 1.0)))
    assert est.gpus[0].fits
    fits = compare(
        q4km, rpc_machine(2), at((30.0, 12.0)), projection("q4km-rpc-30-12"), capped=True
    )
    assert fits.fits


def test_a_correction_makes_the_estimate_overflow_where_llama_cpp_does(q4km: ModelLayout) -> None:
    machine, config = rpc_machine(2), at((41.0, 1.0))
    c = compare(q4km, machine, config, projection("q4km-rpc-41-1"), capped=True)
    corrected = Overheads(device_correction_bytes=c.corrections())
    est = estimate(q4km, machine, config, overheads=corrected)
    for check, dev in zip(c.checks, est.devices, strict=True):
        assert dev.correction_bytes == check.correction_bytes
        assert dev.total_bytes - dev.budget_bytes == check.projected_bytes - check.budget_bytes
    # and compared again on the corrected estimate, the correction is stable
    again = compare(q4km, machine, config, projection("q4km-rpc-41-1"), capped=True,
                    overheads=corrected)  # fmt: skip
    assert again.corrections() == c.corrections()


def test_the_servers_logits_cap_is_an_adjustment_on_the_output_device(q4km: ModelLayout) -> None:
    config = at((30.0, 12.0))
    capped = compare(q4km, rpc_machine(2), config, projection("q4km-rpc-30-12"), capped=True)
    uncapped = compare(q4km, rpc_machine(2), config, projection("q4km-rpc-30-12"), capped=False)
    saving = server_logits_saving(q4km, config, 262144)
    assert saving == (512 - 1) * (248320 * 4 - LOGITS_LIVE_BYTES_PER_ROW)
    cuda1_capped, cuda1_uncapped = capped.checks[1], uncapped.checks[1]  # holds the output layer
    assert cuda1_uncapped.projected_bytes - cuda1_capped.projected_bytes == saving
    assert capped.checks[0].projected_bytes == uncapped.checks[0].projected_bytes
    assert any("PR #23861" in a.why and a.device == "CPU1" for a in capped.adjustments)


def test_kv_unified_is_an_adjustment(q4km: ModelLayout) -> None:
    """llama-fit-params ran four streams of 16384; llama-server shares one pool of 65536."""
    config = RunConfig(ctx_size=65536, n_parallel=4, kv_unified=True, tensor_split=(24.0, 18.0))
    c = compare(q4km, rpc_machine(2), config, projection("q4km-rpc-np4-kvu"), capped=True)
    for d in c.checks:
        assert d.agrees("model") and d.agrees("context")
    kvu = [a for a in c.adjustments if "-kvu" in a.why]
    assert kvu  # the mask differs between one pool and four streams
    fp = estimate(q4km, rpc_machine(2), fit_params_config(config))
    plan = estimate(q4km, rpc_machine(2), replace(config, logits_rows="batch"))
    for a in kvu:
        i = [d.device for d in fp.devices].index(a.device)
        acc = [
            d.weights_bytes + d.kv_bytes + d.recurrent_bytes + d.compute_bytes
            for d in (plan.devices[i], fp.devices[i])
        ]
        assert a.bytes == acc[0] - acc[1]


def test_a_host_only_projection_counts_repacked_weights(q4km: ModelLayout) -> None:
    config = RunConfig(ctx_size=8192, devices=())
    c = compare(q4km, rpc_machine(0), config, projection("q4km-host"), capped=True)
    (host,) = c.checks
    assert host.model_mib == 5160 + 15015
    assert host.free_from == "probe"
    assert any("CPU_REPACK" in n for n in c.notes)


def test_a_device_mismatch_is_a_problem_not_a_verdict(q4km: ModelLayout) -> None:
    """A CPU-only llama.cpp build asked about a two-GPU plan."""
    c = compare(q4km, rpc_machine(2), at((30.0, 12.0)), projection("q4km-host"), capped=True)
    assert c.problem is not None and "CPU-only" in c.problem and not c.fits


def test_the_measured_saving_is_never_overstated() -> None:
    """LOGITS_LIVE_BYTES_PER_ROW against every recorded pair (llama-fit-params vs llama-server's
    own fit projection): the modelled saving is at most the measured one, and close to it."""
    doc = json.loads((DATA / "llama-server-logits-saving.json").read_text())
    arch_vocab = 248320
    for case in doc["cases"]:
        config, _ = config_from_args(case["llama_cpp_args"])
        compute = case["compute_mib"]
        measured = compute["RPC1"]["llama_fit_params"] - compute["RPC1"]["llama_server"]
        ub = min(config.ubatch, config.batch)
        rows = min(ub, config.batch, config.n_parallel)
        modelled = (ub - rows) * (arch_vocab * 4 - LOGITS_LIVE_BYTES_PER_ROW)
        # measured MiB are differences of floors: +-1 MiB
        assert modelled <= (measured + 1) * MiB, case["llama_cpp_args"]
        assert modelled >= (measured - 1) * MiB - 40 * MiB, case["llama_cpp_args"]
        for other in ("RPC0", "Host"):  # the cap touches only the output device
            assert compute[other]["llama_fit_params"] == compute[other]["llama_server"]


@given(st.integers(0, 64 * GiB), st.integers(0, 65536))
def test_flooring(ours: int, mib: int) -> None:
    """Exact bytes where they floor to llama.cpp's MiB, else llama.cpp's upper bound."""
    got = _component(ours, mib)
    if ours // MiB == mib:
        assert got == ours
    else:
        assert got // MiB == mib and got == (mib + 1) * MiB - 1


def test_without_free_figures_the_probe_and_the_context_overhead_apply(q4km: ModelLayout) -> None:
    p = projection("q4km-rpc-30-12")
    bare = Projection(
        tuple(LlamaDevice(d.name, d.model_mib, d.context_mib, d.compute_mib) for d in p.devices)
    )
    c = compare(q4km, rpc_machine(2), at((30.0, 12.0)), bare, capped=True)
    with_free = compare(q4km, rpc_machine(2), at((30.0, 12.0)), p, capped=True)
    for a, b in zip(c.checks[:2], with_free.checks[:2], strict=True):
        assert a.free_from == "probe" and a.free_bytes == 64 * GiB
        assert a.projected_bytes - b.projected_bytes == Overheads().gpu_context_bytes


def test_a_model_figure_summed_from_two_floored_buffers_agrees_within_a_mib() -> None:
    """llama-fit-params prints Host and CPU_REPACK each floored to the MiB: their sum may be a MiB
    below the floor of quantpick's byte-exact total, and no more."""
    from quantpick.plan.confirm import DeviceCheck

    def check(ours_bytes: int, theirs_mib: int, floors: int) -> bool:
        d = DeviceCheck(
            device="CPU", llama_device="Host", kind="host", predicted_model_bytes=ours_bytes,
            predicted_context_bytes=0, predicted_compute_bytes=0, model_mib=theirs_mib,
            context_mib=0, compute_mib=0, adjust_bytes=0, projected_bytes=0, free_bytes=0,
            free_from="probe", budget_bytes=0, estimate_total_bytes=0, correction_bytes=0,
            model_floors=floors,
        )  # fmt: skip
        return d.agrees("model")

    ours = 280 * 2**20 + 12345
    assert check(ours, 280, 1) and not check(ours, 279, 1)
    assert check(ours, 279, 2) and check(ours, 280, 2)
    assert not check(ours, 278, 2) and not check(ours, 281, 2)
