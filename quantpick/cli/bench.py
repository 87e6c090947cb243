"""`quantpick bench`: run the planned configuration for real on this machine, measure it, and
store the calibration profile later plans use.

Usage:
    quantpick bench qwen3.8-35b-a3b-distill --quant Q4_K_M -c 131072
    quantpick bench --gguf ./Qwen3.8-35B-A3B-Q4_K_M.gguf -c 65536 --depth 16384 --compare
    quantpick bench --gguf ./model.gguf --json --no-save
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.cli.core import app
from quantpick.cli.groups import MachineOptions, PlanOptions, notes
from quantpick.cli.option_blocks import takes
from quantpick.cli.option_table import BENCH_TIMEOUT_S, DEFAULT_DEPTH, BenchTimeoutOpt
from quantpick.cli.options import tool_timeout

if TYPE_CHECKING:
    from quantpick.jobs.bench import BenchReport

MiB = 1024**2


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render_bench(
    report: BenchReport, *, compare: bool, saved: Path | None, refused: list[str] | None = None
) -> None:
    from rich.table import Table

    from quantpick.cli import output

    m = report.measurement
    con = output.stdout()
    table = Table(
        title=f"{report.plan.model} {report.plan.quant} with {m.tool} ({report.build_label})",
        title_justify="left",
        pad_edge=False,
    )
    table.add_column("figure")
    table.add_column("measured tok/s", justify="right")
    if compare:
        table.add_column("predicted", justify="right")
        table.add_column("measured / predicted", justify="right")
    depth = f"decode at {m.depth_tokens} tokens"
    rows: list[tuple[str, float | None, float | None, float | None]] = [
        (f"prefill ({m.n_prompt} tokens)", m.prefill_tps, report.predicted["prefill"],
         report.ratios.prefill),
        ("decode, empty context", m.decode_tps_empty, report.predicted["decode_empty"],
         report.ratios.decode_empty),
    ]  # fmt: skip
    if m.depth_tokens:
        predicted_depth = report.predicted["decode_depth"]
        rows.append((depth, m.decode_tps_depth, predicted_depth, report.ratios.decode_depth))
        rows.append((f"prefill at {m.depth_tokens} tokens", m.prefill_tps_depth, None, None))
    for label, measured, predicted, ratio in rows:
        cells = [label, _fmt(measured)]
        if compare:
            cells += [_fmt(predicted), "-" if ratio is None else f"{ratio:.3g}"]
        table.add_row(*cells)
    con.print(table)
    if report.gpus:
        gpus = Table(title="GPU memory while it ran (MiB)", title_justify="left", pad_edge=False)
        for col in ("device", "before", "peak", "llama.cpp buffers", "driver overhead"):
            gpus.add_column(col, justify="left" if col == "device" else "right")
        for g in report.gpus:
            gpus.add_row(
                g.device,
                str(g.baseline_used_bytes // MiB),
                str(g.peak_used_bytes // MiB),
                f"{g.accounted_bytes // MiB} ({g.accounted_from})",
                str(g.driver_overhead_bytes // MiB),
            )
        con.print(gpus)
    if m.host_peak_rss_bytes is not None:
        con.print(f"Host peak RSS of {m.tool}: {m.host_peak_rss_bytes / MiB:.0f} MiB")
    if compare:
        con.print(f"Predicted: {report.entry['predicted']['model']} (uncalibrated)")
    for note in report.notes:
        con.print(f"Note: {note}")
    if saved is not None:
        con.print(f"Calibration saved: {saved} (build {report.build_label}; applies to models of "
                  f"{_scope_text(report)})")  # fmt: skip
    if refused:
        output.warn("calibration not saved: this run cannot calibrate later answers:")
        for problem in refused:
            output.note(f"  - {problem}")


def _scope_text(report: BenchReport) -> str:
    from quantpick.plan.calibration import SIZE_MATCH_FACTOR
    from quantpick.units import human

    size = int(report.entry.get("model_bytes") or 0)
    devices = report.entry.get("devices") or []
    where = ", ".join(d.device for d in report.plan.estimate.gpus) if devices else "the host only"
    return f"{human(size / SIZE_MATCH_FACTOR)}-{human(size * SIZE_MATCH_FACTOR)} on {where}"


@app.command("bench")
@takes(
    "model quant gguf ctx_size parallel kv_unified prefer min_tps spec draft allow_q4_kv kv "
    "no_offload dir_ n_prompt n_gen depth reps tool compare no_save llama_server llama_bin "
    "gpu_overhead margin ram_bandwidth timeout json_",
    spec="off",
)
def bench_cmd(timeout: BenchTimeoutOpt = None, **given: Any) -> None:
    """Measure the planned configuration on this machine and store its calibration profile."""
    n_prompt, n_gen, depth, reps, tool, spec, llama_bin, llama_server, no_save = (
        given[k]
        for k in "n_prompt n_gen depth reps tool spec llama_bin llama_server no_save".split()
    )
    import datetime

    from quantpick.cli import output
    from quantpick.cli.local import local_model
    from quantpick.cli.render import plan_to_dict
    from quantpick.jobs.bench import bench_plan, bench_speculation, plain_plan, with_speculation
    from quantpick.jobs.on_disk import plan_file
    from quantpick.plan.calibration import plausibility_problems
    from quantpick.serve.bench import BenchSettings
    from quantpick.serve.calibration import save_profile

    _check_options(n_prompt, n_gen, reps, depth, llama_bin)
    machine = MachineOptions.of(given).machine()
    local = local_model(given)
    inputs = PlanOptions.of(given, quant=local.quant).inputs(
        local.manifest, machine, local=local.layout
    )
    planned = plan_file(inputs, local.model_path, None)
    notes(planned.result.notes)
    # the calibration measures the plan without speculation (the speed model's own figures);
    # speculation is measured beside it, both ways, and reported
    p, progress = plain_plan(planned.plan), _progress_lines()
    if depth is None:
        depth = min(p.config.ctx_size - n_gen - n_prompt, DEFAULT_DEPTH)
    settings = BenchSettings(n_prompt=n_prompt, n_gen=n_gen, depth=max(0, depth), reps=reps,
                             timeout_s=tool_timeout(timeout, BENCH_TIMEOUT_S))  # fmt: skip
    report = bench_plan(
        p, local.manifest, local.model_path, machine, planned.result.inputs.overheads,
        settings=settings, llama_bin=llama_bin, llama_server=llama_server, tool=tool,
        date=datetime.date.today().isoformat(), progress=progress,
    )  # fmt: skip
    spec_doc = bench_speculation(
        planned.plan, local.manifest, local.model_path, machine, settings, asked=spec != "off",
        llama_bin=llama_bin, llama_server=llama_server, progress=progress,
        vocab_size=local.layout.architecture.vocab_size if local.layout else 0,
    )  # fmt: skip
    # Only a run that can be true is stored (plan/calibration.py): the README's own bench of a
    # 16 MiB test model once turned the next CPU pick into "nothing reaches 5 tok/s".
    report = with_speculation(report, spec_doc)  # its acceptance, when it measured one
    refused = plausibility_problems(report.entry)
    saved = None if no_save or refused else save_profile(machine, report.entry)
    if given["json_"]:
        output.print_json({
            "plan": plan_to_dict(p, machine, p.n_slots - 1), "bench": report.entry,
            "notes": list(report.notes), "profile_path": str(saved) if saved else None,
            "saved": saved is not None, "not_saved_because": refused, "speculative": spec_doc,
        })  # fmt: skip
        if refused and not no_save:
            output.warn("calibration not saved: " + "; ".join(refused))
        return
    render_bench(
        report, compare=given["compare"], saved=saved, refused=None if no_save else refused
    )
    if spec_doc is not None:
        output.note("Speculation: " + str(spec_doc["reason"]))


def _check_options(
    n_prompt: int, n_gen: int, reps: int, depth: int | None, llama_bin: Path | None
) -> None:
    from quantpick.errors import UsageError

    if n_prompt < 1 or n_gen < 1 or reps < 1 or (depth is not None and depth < 0):
        raise UsageError("--n-prompt, --n-gen and --reps must be >= 1, --depth >= 0")
    if llama_bin is not None and not llama_bin.is_dir():
        raise UsageError(f"--llama-bin {llama_bin}: not a directory")


def _progress_lines() -> Callable[[str], None]:
    """The measuring tool's progress lines, on a terminal only (never on a pipe or a log)."""
    from quantpick.cli import output

    show = output.stderr().is_terminal

    def progress(line: str) -> None:
        if show and line.startswith(("llama-bench:", "starting", "prefill", "decode")):
            output.note(line)

    return progress
