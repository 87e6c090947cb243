"""`quantpick check [ALIAS | URL]`: a running llama-server beside its plan.

Usage:
    quantpick check                                   # the one server `serve` started
    quantpick check tiny                              # by alias
    quantpick check http://127.0.0.1:8080 --gguf F.gguf -c 32768   # any llama-server, planned now
    quantpick check http://127.0.0.1:8080 --log server.log          # with its log (-lv 4)
    quantpick check --measure-speed --json
    quantpick check --learn                           # store the measured compute buffers

Exit codes: 0 as planned; 9 (ExitCode.DIFFERS) when the server runs but a finding costs speed or
memory (a spill to the CPU, a smaller context, swap, a GPU fuller than planned, slow decode);
8 when the URL does not answer or is not a llama-server; 2 for bad input.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

from quantpick.cli.core import app
from quantpick.cli.groups import MachineOptions, PlanOptions
from quantpick.cli.option_blocks import MACHINE, takes

if TYPE_CHECKING:
    from quantpick.jobs.check import CheckResult
    from quantpick.plan.check import CheckReport


@app.command("check")
@takes(
    "target gguf quant ctx_size parallel kv_unified kv", MACHINE, "log measure_speed learn json_"
)
def check_cmd(**given: Any) -> None:
    """Check a running llama-server against its plan: per device, llama.cpp's own buffers
    beside the plan's, the context it was given, swap, other processes on its GPUs, decode
    speed; findings in plain words with what to do."""
    target, gguf, quant, ctx_size, parallel, kv, log, measure_speed, learn, json_ = (
        given[k]
        for k in "target gguf quant ctx_size parallel kv log measure_speed learn json_".split()
    )
    from quantpick.cli import output
    from quantpick.config import load_settings
    from quantpick.errors import ExitCode, UsageError
    from quantpick.jobs.check import CheckRequest, check_server

    inputs = None
    basis = ""
    if gguf is not None:
        from quantpick.cli.local import local_model

        local = local_model(given)
        machine = MachineOptions.of(given).machine()
        plan = PlanOptions.of(given, quant=local.quant, min_tps=0.0)
        inputs = plan.inputs(local.manifest, machine, local=local.layout)
        basis = f"--gguf {gguf.name}" + (f" -c {ctx_size}" if ctx_size else "")
        basis += f" -np {parallel}" if parallel != 1 else ""
    elif ctx_size or kv or quant or any(given[k] for k in ("gpu", "ram", "hardware", "cpu_only")):
        raise UsageError("planning options need the file: give --gguf FILE too")
    result = check_server(
        CheckRequest(target, inputs, basis, log, measure_speed, learn=learn),
        settings=load_settings(),
    )
    if json_:
        output.print_json(check_doc(result))
    else:
        sys.stdout.write(render_text(result))
        if result.learned is not None:
            output.note(f"Memory calibration stored: {result.learned} (later plans for this "
                        "build, these devices and this size of model use it)")  # fmt: skip
        elif learn:
            output.note("Memory calibration not stored: " + "; ".join(result.not_learned))
    if not result.report.as_planned:
        raise typer.Exit(int(ExitCode.DIFFERS))


# ---- rendering -------------------------------------------------------------------------------


def report_doc(report: CheckReport) -> dict[str, Any]:
    """The comparison as JSON: per device `planned` and `measured` (estimate's keys), the
    difference, the context, decode speed, findings with a code each."""
    devices = []
    for c in report.devices:
        devices.append(
            {
                "device": c.device,
                "planned": c.planned.to_dict() if c.planned else None,
                "measured": c.measured.to_dict() if c.measured else None,
                "difference": c.difference(),
                "matches": c.matches() if c.planned and c.measured else None,
            }
        )
    o, p = report.observed, report.planned
    return {
        "as_planned": report.as_planned,
        "basis": p.basis,
        "devices": devices,
        "context": {
            "planned_per_slot": p.n_ctx_seq if p.devices else None,
            "measured_per_slot": o.n_ctx_seq,
            "from": o.n_ctx_from,
            "n_parallel": p.n_parallel,
        },
        "offloaded_layers": list(o.offloaded) if o.offloaded else None,
        "swap_bytes": o.swap_bytes,
        "rss_bytes": o.rss_bytes,
        "gpus": [
            {
                "device": g.device,
                "total_bytes": g.total_bytes,
                "used_bytes": g.used_bytes,
                "server_bytes": g.server_bytes,
            }
            for g in o.gpus
        ],  # fmt: skip
        "decode": {
            "expected_tps": p.decode_tps,
            "measured_tps": round(o.decode_tps, 2) if o.decode_tps else None,
            "from": o.decode_from,
        },
        "findings": [f.to_dict() for f in report.findings],
    }


def check_doc(result: CheckResult) -> dict[str, Any]:
    props = result.live.props
    return {
        "url": result.base_url,
        "alias": result.record.alias if result.record is not None else props.model_alias,
        "model_path": props.model_path,
        "build_info": props.build_info,
        "log": str(result.log_path) if result.log_path else None,
        **report_doc(result.report),
        "learned": str(result.learned) if result.learned else None,
        "not_learned": list(result.not_learned),
    }


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024**2:,.2f}"


_LABELS = (("weights_bytes", "weights"), ("kv_bytes", "KV"), ("recurrent_bytes", "state"),
           ("compute_bytes", "compute"), ("output_bytes", "output"))  # fmt: skip


def _signed(n: int) -> str:
    text = f"{n / 1024**2:+,.2f}"
    return "0" if text in ("+0.00", "-0.00") else text


def report_lines(report: CheckReport) -> list[str]:
    o, p = report.observed, report.planned
    lines = [f"Plan: {p.basis}"]
    rows = [("device", "buffer", "planned MiB", "measured MiB", "difference")]
    for c in report.devices:
        first = True
        for key, label in _LABELS:
            planned = getattr(c.planned, key) if c.planned else None
            measured = getattr(c.measured, key) if c.measured else None
            if not planned and not measured:
                continue
            diff = "" if planned is None or measured is None else _signed(measured - planned)
            rows.append((c.device if first else "", label, _mib(planned), _mib(measured), diff))
            first = False
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            lines.append(
                "  " + "  ".join(v.ljust(w) if i < 2 else v.rjust(w)
                                 for i, (v, w) in enumerate(zip(r, widths, strict=True)))
            )  # fmt: skip
    ctx = f"Context per slot: {o.n_ctx_seq} tokens ({o.n_ctx_from})"
    if p.devices:
        ctx += f", planned {p.n_ctx_seq}"
    lines.append(ctx)
    if o.offloaded:
        lines.append(f"Layers on GPUs: {o.offloaded[0]}/{o.offloaded[1]} (llama.cpp's count)")
    if o.decode_tps:
        expected = f", expected ~{p.decode_tps:.0f}" if p.decode_tps else ""
        lines.append(f"Decode: {o.decode_tps:.1f} tok/s ({o.decode_from}){expected}")
    if o.swap_bytes is not None or o.rss_bytes is not None:
        lines.append(
            f"Server process: {_mib(o.rss_bytes)} MiB resident, {_mib(o.swap_bytes)} MiB in swap"
        )
    costs = [f for f in report.findings if f.severity.value == "costs"]
    info = [f for f in report.findings if f.severity.value != "costs"]
    lines.append("As planned." if not costs else f"Not as planned ({len(costs)}):")
    for f in costs:
        lines.append(f"  [{f.code.value}] {f.message}")
        lines.append(f"    what to do: {f.action}")
    for f in info:
        lines.append(f"  note [{f.code.value}] {f.message}")
    return lines


def render_text(result: CheckResult) -> str:
    name = result.record.alias if result.record is not None else result.live.props.model_alias
    head = f"Checked {name or 'llama-server'} at {result.base_url}"
    return "\n".join([head, *report_lines(result.report)]) + "\n"
