"""`quantpick confirm`: llama.cpp's own projection of the plan for a file already on disk, per
device beside quantpick's estimate; re-planned with llama.cpp's figures when it overflows.

Usage:
    quantpick confirm qwen3.8-35b-a3b-distill --quant Q4_K_M -c 131072
    quantpick confirm --gguf ./Qwen3.8-35B-A3B-Q4_K_M.gguf -c 65536 --json

`get` and `command` run the same check before they write a command (off with --no-confirm).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.cli.core import app
from quantpick.cli.groups import LlamaCppOptions, MachineOptions, PlanOptions, notes
from quantpick.cli.option_blocks import takes

if TYPE_CHECKING:
    from quantpick.jobs.confirm import ConfirmReport
    from quantpick.jobs.dry_run import ConfigCheck
    from quantpick.machine.spec import Machine
    from quantpick.plan.confirm import DeviceCheck

MiB = 1024**2


def confirmation_to_dict(report: ConfirmReport | ConfigCheck | None) -> dict[str, Any] | None:
    """The confirmation as JSON (sizes in bytes; llama.cpp's own figures in MiB as it prints)."""
    if report is None:
        return None
    rounds = []
    for r in report.rounds:
        c = r.confirmation
        rounds.append(
            {
                "argv": list(r.argv),
                "seconds": round(r.seconds, 3),
                "flags": [w for w in r.argv[1:]],
                "fits": c.fits,
                "problem": c.problem,
                "devices": [
                    {
                        "device": d.device,
                        "llama_device": d.llama_device,
                        "kind": d.kind,
                        "predicted_model_bytes": d.predicted_model_bytes,
                        "predicted_context_bytes": d.predicted_context_bytes,
                        "predicted_compute_bytes": d.predicted_compute_bytes,
                        "llamacpp_mib": {
                            "model": d.model_mib,
                            "context": d.context_mib,
                            "compute": d.compute_mib,
                        },
                        "agrees": {k: d.agrees(k) for k in ("model", "context", "compute")},
                        # llama.cpp's MiB less quantpick's bytes floored the same way
                        "difference_mib": {
                            "model": d.model_mib - d.predicted_model_bytes // MiB,
                            "context": d.context_mib - d.predicted_context_bytes // MiB,
                            "compute": d.compute_mib - d.predicted_compute_bytes // MiB,
                        },
                        "adjust_bytes": d.adjust_bytes,
                        "projected_bytes": d.projected_bytes,
                        "estimate_total_bytes": d.estimate_total_bytes,
                        "free_bytes": d.free_bytes,
                        "free_from": d.free_from,
                        "budget_bytes": d.budget_bytes,
                        "headroom_bytes": d.headroom_bytes,
                        "fits": d.fits,
                        "correction_bytes": d.correction_bytes,
                    }
                    for d in c.checks
                ],
                "adjustments": [
                    {"device": a.device, "bytes": a.bytes, "why": a.why} for a in c.adjustments
                ],
                "notes": list(c.notes),
            }
        )
    return {
        "status": report.status,
        "message": report.message,
        "changes": list(report.changes),
        "seconds": round(report.seconds, 3),
        "rounds": rounds,
    }


def confirmation_table(report: ConfirmReport | ConfigCheck) -> Any:
    """The last round as a rich table: quantpick's estimate beside llama.cpp's, per device."""
    from rich.table import Table

    last = report.rounds[-1]
    table = Table(
        title=f"llama.cpp's projection ({Path(last.argv[0]).name}, "
        + (f"{last.seconds:.2f} s" if last.seconds else "from the cache")
        + ") beside "
        "quantpick's estimate  (MiB)",
        title_justify="left",
        pad_edge=False,
    )
    for col in ("device", "model", "context", "compute", "adjust", "projected", "free", "headroom"):
        table.add_column(col, justify="left" if col == "device" else "right")

    def pair(d: DeviceCheck, component: str) -> str:
        ours, theirs = {
            "model": (d.predicted_model_bytes, d.model_mib),
            "context": (d.predicted_context_bytes, d.context_mib),
            "compute": (d.predicted_compute_bytes, d.compute_mib),
        }[component]
        return f"{ours // MiB} {'=' if d.agrees(component) else 'vs'} {theirs}"

    for d in last.confirmation.checks:
        name = d.device if d.device == d.llama_device else f"{d.device} ({d.llama_device})"
        style = "" if d.fits else "[bold red]"
        table.add_row(
            name,
            pair(d, "model"),
            pair(d, "context"),
            pair(d, "compute"),
            f"{d.adjust_bytes / MiB:+.1f}" if d.adjust_bytes else "0",
            f"{d.projected_bytes / MiB:.0f}",
            f"{d.free_bytes // MiB}" + ("" if d.free_from == "llama.cpp" else "*"),
            f"{style}{d.headroom_bytes / MiB:.0f}",
        )
    return table


def _amount(n: int) -> str:
    return f"{n / MiB:+.0f} MiB" if abs(n) >= MiB else f"{n / 1024:+.0f} KiB"


def print_confirmation(report: ConfirmReport | ConfigCheck, *, stdout: bool) -> None:
    """The table, adjustments and the verdict (stdout for `confirm`, stderr otherwise)."""
    from quantpick.cli import output

    con = output.stdout() if stdout else output.stderr()
    if report.rounds:
        con.print(confirmation_table(report))
        last = report.rounds[-1].confirmation
        for a in last.adjustments:
            con.print(f"  adjust {a.device} {_amount(a.bytes)}: {a.why}")
        for note in last.notes:
            con.print(f"  note: {note}")
        if any(d.free_from == "probe" for d in last.checks):
            con.print("  * free memory from quantpick's probe (llama.cpp does not print it)")
        con.print(
            "  model, context, compute: quantpick = llama.cpp where they agree to the MiB "
            "(llama.cpp floors).\n  projected: llama-server's use by llama.cpp's figures; "
            "headroom = free - margin - projected."
        )
    for change in report.changes:
        con.print(f"  re-planned: {change}")
    con.print(report.message[:1].upper() + report.message[1:])


def report_confirmation(
    report: ConfirmReport | None, machine: Machine, no_confirm: bool, *, quiet: bool
) -> None:
    """What `get` and `command` say about the confirmation on stderr (one line when skipped)."""
    from quantpick.cli import output

    if report is None:
        if machine.described and not no_confirm and not quiet:
            output.note("Note: not confirmed by llama.cpp: planned for a described machine")
        return
    if report.status == "skipped":
        if not quiet:
            output.note(f"Note: {report.message}")
        return
    if report.status == "failed":
        output.warn(report.message)
        return
    if not quiet:
        print_confirmation(report, stdout=False)


@app.command("confirm")
@takes(
    "model quant gguf mmproj ctx_size parallel kv_unified prefer vision min_tps allow_q4_kv kv "
    "no_offload dir_ llama_server llama_bin gpu_overhead margin ram_bandwidth no_calibration "
    "timeout json_"
)
def confirm_cmd(**given: Any) -> None:
    """Ask llama.cpp (llama-fit-params) whether the plan for a file on disk fits this machine."""
    from quantpick.cli import output
    from quantpick.cli.local import local_model
    from quantpick.cli.render import plan_to_dict
    from quantpick.errors import QuantpickError
    from quantpick.jobs.on_disk import plan_file
    from quantpick.serve.command import placement_flags

    machine = MachineOptions.of(given).machine()
    local = local_model(given)
    inputs = PlanOptions.of(given, quant=local.quant).inputs(
        local.manifest, machine, local=local.layout
    )
    # `confirm` runs llama.cpp whatever --no-confirm elsewhere would say
    planned = plan_file(inputs, local.model_path, LlamaCppOptions.of(given).tools())
    notes(planned.result.notes)
    report = planned.confirmation
    assert report is not None  # asked for
    if report.status in ("skipped", "failed"):
        raise QuantpickError(report.message, hint="pass --llama-bin DIR (llama.cpp's build/bin)")
    block_count = report.plan.n_slots - 1
    if given["json_"]:
        output.print_json(
            {
                "plan": plan_to_dict(report.plan, machine, block_count),
                "confirmation": confirmation_to_dict(report),
            }
        )
        return
    print_confirmation(report, stdout=True)
    output.stdout().print(
        "llama-server flags: " + " ".join(placement_flags(report.plan.config, block_count))
    )
