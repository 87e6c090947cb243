"""Confirm rounds (jobs.confirm.confirm_plan): llama-fit-params (a fake replaying recorded real
output) confirms, or projects an overflow and the plan is re-planned with its figures; bounded
rounds; a missing, failing or hung tool never blocks the command."""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance_model import rpc_machine, write_conformance_gguf
from fake_llamacpp import calls, fake_tool, fixture

from quantpick.errors import ModelRejectedError, NoFitError
from quantpick.jobs.confirm import ConfirmOptions, confirm_plan, replan_for_file
from quantpick.machine.spec import Machine
from quantpick.model.gguf import layout_from_header, read_gguf_file
from quantpick.model.layout import ModelLayout
from quantpick.model.local import manifest_for_gguf
from quantpick.plan.bandwidth_bound import decode_speed
from quantpick.plan.build_class import compute_rule
from quantpick.plan.memory import Overheads, RunConfig, estimate
from quantpick.plan.placement import device_bandwidths
from quantpick.plan.plan_types import Plan, PlanRequest

CURRENT = compute_rule("0.5.0-dev", 11312, "0c1e57098")
OVERFLOWS = RunConfig(ctx_size=262144, tensor_split=(41.0, 1.0))
FITS = RunConfig(ctx_size=262144, tensor_split=(30.0, 12.0))


@pytest.fixture(scope="module")
def q4km(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ModelLayout]:
    path = tmp_path_factory.mktemp("gguf") / "q4km.gguf"
    size = write_conformance_gguf(path)
    layout = layout_from_header(read_gguf_file(path), basis=f"gguf:{path}", file_bytes=size)
    return path, layout


def make_plan(layout: ModelLayout, machine: Machine, config: RunConfig, **kw: object) -> Plan:
    est = estimate(layout, machine, config, **kw)  # type: ignore[arg-type]
    return Plan(
        model="q4km",
        quant="Q4_K_M",
        files=(),
        projector=None,
        config=config,
        estimate=est,
        speed=decode_speed(layout, est, device_bandwidths(machine)),
        placement="gpu",
        policy="quality",
        layout_basis=layout.basis,
        candidates=(),
        compute_rule=CURRENT,
    )


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    fake_tool(
        bin_dir,
        "llama-fit-params",
        routes=[
            (["-ts", "41,1"], fixture("q4km-rpc-41-1")),
            (["-ts", "30,12"], fixture("q4km-rpc-30-12")),
        ],
    )
    return bin_dir


def run(
    q4km: tuple[Path, ModelLayout], first: RunConfig, replan: object, bin_dir: Path, **kw: object
):  # noqa: ANN201
    path, layout = q4km
    machine = rpc_machine(2)
    return confirm_plan(
        make_plan(layout, machine, first),
        layout=layout,
        machine=machine,
        overheads=Overheads(),
        model_path=path,
        block_count=41,
        replan=replan,  # type: ignore[arg-type]
        options=ConfirmOptions(llama_bin=bin_dir, **kw),  # type: ignore[arg-type]
    )


def never(_: Overheads) -> Plan:
    raise AssertionError("a fitting plan is not re-planned")


def test_a_fitting_plan_is_confirmed_in_one_run(q4km, tools: Path) -> None:  # noqa: ANN001
    report = run(q4km, FITS, never, tools)
    assert report.status == "confirmed" and report.plan.config == FITS
    assert len(report.rounds) == 1 and report.changes == ()
    assert "MiB to spare" in report.message
    assert len(calls(tools)) == 1


def test_an_overflow_is_replanned_with_llama_cpps_figures(q4km, tools: Path) -> None:  # noqa: ANN001
    """The estimate (64 GiB free per GPU) fits -ts 41,1; llama.cpp (24105 MiB free) projects
    RPC0 over budget. The re-plan gets llama.cpp's excess as a correction on CPU0."""
    path, layout = q4km
    seen: list[Overheads] = []

    def replan(overheads: Overheads) -> Plan:
        seen.append(overheads)
        return make_plan(layout, rpc_machine(2), FITS, overheads=overheads)

    report = run(q4km, OVERFLOWS, replan, tools)
    assert report.status == "replanned" and report.plan.config == FITS
    assert [r.confirmation.fits for r in report.rounds] == [False, True]
    assert report.changes == ("-ts 41,1 -> 30,12",)
    (corrected,) = seen
    corrections = dict(corrected.device_correction_bytes)
    first = report.rounds[0].confirmation.checks[0]
    assert corrections["CPU0"] == first.correction_bytes > 0
    # with the correction, the estimate of the old plan overflows exactly as llama.cpp said
    est = estimate(layout, rpc_machine(2), OVERFLOWS, overheads=corrected)
    assert est.gpus[0].total_bytes - est.gpus[0].budget_bytes == (
        first.projected_bytes - first.budget_bytes
    )
    assert not est.gpus[0].fits


def test_rounds_are_bounded_and_no_overflowing_plan_comes_back(q4km, tools: Path) -> None:  # noqa: ANN001
    path, layout = q4km

    def stubborn(overheads: Overheads) -> Plan:
        return make_plan(layout, rpc_machine(2), OVERFLOWS, overheads=overheads)

    with pytest.raises(NoFitError, match=r"over budget on CPU0 by \d+ MiB, also after 1 re-plan"):
        run(q4km, OVERFLOWS, stubborn, tools, max_rounds=2)
    assert len(calls(tools)) == 2


def test_no_tool_is_a_one_line_skip(q4km, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    report = run(q4km, OVERFLOWS, never, tmp_path / "empty")
    assert report.status == "skipped" and report.plan.config == OVERFLOWS
    assert "no llama-fit-params in" in report.message and "\n" not in report.message


def test_a_failing_tool_leaves_the_plan_and_says_why(q4km, tmp_path: Path) -> None:  # noqa: ANN001
    stderr = tmp_path / "stderr.txt"
    stderr.write_text("ggml_backend_cuda_init: failed to initialize CUDA: unknown error\n")
    fake_tool(tmp_path, "llama-fit-params", stderr_file=stderr, exit_code=-6)
    report = run(q4km, FITS, never, tmp_path)
    assert report.status == "failed" and report.plan.config == FITS
    assert "killed by SIGABRT): ggml_backend_cuda_init: failed to initialize CUDA" in report.message


def test_a_model_llama_cpp_cannot_load_ends_the_command(q4km, tmp_path: Path) -> None:  # noqa: ANN001
    # Before: "could not confirm" and the plan came back (get wrote the script, exit 0).
    fake_tool(tmp_path, "llama-fit-params", stderr_file=fixture("missing-model"), exit_code=-6)
    with pytest.raises(ModelRejectedError, match="cannot load .*q4km.gguf: failed to load model"):
        run(q4km, FITS, never, tmp_path)


def test_an_overflow_printed_before_a_failure_is_an_overflow(q4km, tmp_path: Path) -> None:  # noqa: ANN001
    # Before: the non-zero exit hid the projection: "could not confirm", plan returned.
    stderr = tmp_path / "stderr.txt"
    stderr.write_text("llama_fit_params: error: out of memory\n")
    fake_tool(tmp_path, "llama-fit-params", stdout_file=fixture("q4km-rpc-41-1"),
              stderr_file=stderr, exit_code=1)  # fmt: skip

    def nothing(_: Overheads) -> Plan:
        raise NoFitError("nothing of q4km fits at -c 262144")

    with pytest.raises(NoFitError, match=r"will not fit \(CPU0 by \d+ MiB\)"):
        run(q4km, OVERFLOWS, nothing, tmp_path)


def test_a_fitting_projection_then_a_failure_is_not_confirmed(q4km, tmp_path: Path) -> None:  # noqa: ANN001
    stderr = tmp_path / "stderr.txt"
    stderr.write_text("llama_fit_params: error: something after the table\n")
    fake_tool(tmp_path, "llama-fit-params", stdout_file=fixture("q4km-rpc-30-12"),
              stderr_file=stderr, exit_code=1)  # fmt: skip
    report = run(q4km, FITS, never, tmp_path)
    assert report.status == "failed" and report.plan.config == FITS
    assert "exit 1): llama_fit_params: error: something after the table" in report.message
    assert "after printing a projection" in report.message


@pytest.mark.parametrize(
    ("stdout", "why"),
    [
        # the record says one thing, the table another
        (
            '{"type":"fit_memory_breakdown","data":{"unit":"MiB","rows":[{"kind":"device",'
            '"name":"RPC0","free":24105,"total":24105,"model":14495,"context":1,"compute":1},'
            '{"kind":"device","name":"RPC1","free":24105,"total":24105,"model":5407,'
            '"context":1,"compute":1},{"kind":"host","name":"Host","model":272,"context":0,'
            '"compute":1}]}}\nRPC0 1 1 1\nRPC1 5407 1 1\nHost 272 0 1\n',
            "record and its table disagree",
        ),
        # weights that are not this file's
        ("RPC0 10 1 1\nRPC1 10 1 1\nHost 1 0 1\n", "MiB of model weights, the file holds"),
    ],
)
def test_a_projection_that_cannot_be_this_plans_is_not_confirmed(
    q4km,
    tmp_path: Path,
    stdout: str,
    why: str,  # noqa: ANN001
) -> None:
    out = tmp_path / "out.txt"
    out.write_text(stdout)
    fake_tool(tmp_path, "llama-fit-params", routes=[([], out)])
    report = run(q4km, FITS, never, tmp_path)
    assert report.status == "failed", report.message
    assert why in report.message


def test_a_hung_tool_is_cut_off(q4km, tmp_path: Path) -> None:  # noqa: ANN001
    fake_tool(tmp_path, "llama-fit-params", sleep=30, routes=[([], fixture("q4km-rpc-30-12"))])
    report = run(q4km, FITS, never, tmp_path, timeout_s=0.5)
    assert report.status == "failed" and "did not answer in 0.5 s" in report.message


def test_replan_for_file_steps_the_context_down_when_nothing_fits(q4km) -> None:  # noqa: ANN001
    """With llama.cpp's correction nothing fits at 262144: the largest context that does."""
    path, layout = q4km
    manifest = manifest_for_gguf(path, layout)
    machine = rpc_machine(2)
    request = PlanRequest(ctx_size=262144, kv_types=("f16",), allow_offload=False,
                          compute_rule=CURRENT)  # fmt: skip
    replan = replan_for_file(manifest, manifest.files[0].quant, layout, machine, request)
    assert replan(Overheads()).config.ctx_size == 262144
    heavy = Overheads(device_correction_bytes=(("CPU0", 52 * 2**30), ("CPU1", 52 * 2**30)))
    smaller = replan(heavy)
    assert 4096 <= smaller.config.ctx_size < 262144
    assert smaller.estimate.fits
    with pytest.raises(NoFitError):
        replan(Overheads(device_correction_bytes=(("CPU0", 80 * 2**30), ("CPU1", 80 * 2**30))))


def test_nothing_fitting_with_llama_cpps_figures_says_so(q4km, tools: Path) -> None:  # noqa: ANN001
    def nothing(_: Overheads) -> Plan:
        raise NoFitError("nothing of q4km fits at -c 262144")

    with pytest.raises(
        NoFitError, match=r"CPU0 by \d+ MiB\); re-planned with its figures: nothing"
    ):
        run(q4km, OVERFLOWS, nothing, tools)
