"""`quantpick pick` and `max-context`: the planner.

Usage:
    quantpick pick qwen3.8-35b-a3b-distill -c 262144 --gpu 3090 --gpu t4
    quantpick max-context qwen3.8-35b-a3b-distill --gpu 4090
"""

from __future__ import annotations

from typing import Any

from quantpick.cli.core import app
from quantpick.cli.groups import LlamaCppOptions, MachineOptions, PlanOptions, notes
from quantpick.cli.option_blocks import MACHINE, MACHINE_DETAILS, takes
from quantpick.cli.render import (
    calibration_dict,
    machine_summary,
    plan_to_dict,
    render_plan,
    rule_dict,
    tuning_lines,
)


@app.command("pick")
@takes(
    "model ctx_size parallel kv_unified prefer quant vision min_tps spec draft allow_q4_kv kv "
    "no_offload ubatch batch flash_attn max_context",
    MACHINE,
    MACHINE_DETAILS,
    "exact no_network no_calibration llama_bin no_confirm timeout json_",
)
def pick_cmd(**given: Any) -> None:
    """Pick the best quant, KV cache type and placement for a target context. With llama.cpp
    installed (beside llama-server, on PATH, --llama-bin, or quantpick's build cache), its own
    projection of the chosen file, before download, is shown beside the estimate."""
    if given["max_context"]:
        _show_limits(given)
        return
    from quantpick.cli import output
    from quantpick.jobs.pick import pick

    plan = PlanOptions.of(given)
    manifest = plan.manifest()
    machine = MachineOptions.of(given).machine()
    picked = pick(plan.inputs(manifest, machine), LlamaCppOptions.of(given).confirm(machine))
    notes(picked.result.notes)
    p, report = picked.plan, picked.dry_run
    if given["json_"]:
        from quantpick.cli.confirm import confirmation_to_dict

        doc = plan_to_dict(p, machine, p.n_slots - 1)
        doc["header_problems"] = list(picked.result.header_problems)
        doc["dry_run"] = confirmation_to_dict(report)
        output.print_json(doc)
        return
    render_plan(p, machine, p.n_slots)
    if report is not None or machine.described:
        from quantpick.cli.confirm import report_confirmation

        # a described machine: one note that llama.cpp did not project it (it sees this box)
        report_confirmation(report, machine, given["no_confirm"], quiet=False)


# ---- max-context ------------------------------------------------------------------------------


@app.command("max-context")
@takes(
    "model quant parallel kv_unified prefer vision min_tps allow_q4_kv kv no_offload",
    MACHINE,
    MACHINE_DETAILS,
    "exact no_network no_calibration json_",
)
def max_context_cmd(**given: Any) -> None:
    """The largest context each quant (or --quant) supports on this machine."""
    _show_limits(given)


def _show_limits(given: dict[str, Any]) -> None:
    """max-context (and pick --max-context): the largest context per quant, as a table or JSON."""
    from quantpick.cli import output
    from quantpick.jobs.plan import max_context_for

    # -c, -ub, -b and -fa are left at llama-server's defaults: the context is what is searched
    plan = PlanOptions.of(given, ctx_size=0, ubatch=None, batch=None, flash_attn=None, spec="off")
    manifest = plan.manifest()
    machine = MachineOptions.of(given).machine()
    found = max_context_for(plan.inputs(manifest, machine))
    limits, tuning = found.limits, found.tuning
    notes(tuning.notes)
    if given["json_"]:
        output.print_json(
            {
                "model": manifest.id,
                "machine": machine_summary(machine),
                "compute_rule": rule_dict(tuning.rule),
                "calibration": calibration_dict(tuning.calibration),
                "limits": [
                    {
                        "quant": lim.quant,
                        "max_context": lim.max_context,
                        "cache_type": lim.cache_type,
                        "placement": lim.placement,
                        # as `pick --json`: expected decode at max_context, and the bound
                        "expected_decode_tps_target": _rounded(lim.expected_tps_target),
                        "bound_decode_tps_target": _rounded(lim.tokens_per_s_target),
                        # deprecated (README, JSON): the bound, under the old name
                        "tokens_per_s_target": _rounded(lim.tokens_per_s_target),
                    }
                    for lim in limits
                ],
            }
        )
        return
    from rich.table import Table

    table = Table(title=f"{manifest.id}: largest context per quant", title_justify="left")
    # The figure pick shows (expected decode at that context), then the bandwidth bound.
    for col in ("quant", "max context", "KV", "placement", "expected tok/s at max", "bound"):
        table.add_column(col)
    for lim in limits:
        table.add_row(
            lim.quant,
            str(lim.max_context) if lim.max_context else "does not fit",
            lim.cache_type or "-",
            lim.placement or "-",
            f"~{lim.expected_tps_target:.1f}" if lim.expected_tps_target else "-",
            f"{lim.tokens_per_s_target:.0f}" if lim.tokens_per_s_target else "-",
        )
    output.stdout().print(table)
    for line in tuning_lines(tuning.rule, tuning.calibration):
        output.stdout().print(line)


def _rounded(tps: float | None) -> float | None:
    return round(tps, 2) if tps else None
