"""Rendering plans and estimates: JSON documents (sizes as integer bytes) and rich tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine
    from quantpick.model.layout import ModelLayout
    from quantpick.plan.memory import Estimate
    from quantpick.plan.planner import Plan
    from quantpick.plan.speed import SpeedEstimate

# ---- pieces -------------------------------------------------------------------------------


def _device_dict(d: Any) -> dict[str, Any]:
    return {
        "device": d.device,
        "name": d.name,
        "kind": d.kind,
        "gpu_index": d.gpu_index,
        "weights_bytes": d.weights_bytes,
        "kv_bytes": d.kv_bytes,
        "recurrent_bytes": d.recurrent_bytes,
        "compute_bytes": d.compute_bytes,
        "overhead_bytes": d.overhead_bytes,
        "projector_bytes": d.projector_bytes,
        "correction_bytes": d.correction_bytes,
        "total_bytes": d.total_bytes,
        "free_bytes": d.free_bytes,
        "budget_bytes": d.budget_bytes,
        "headroom_bytes": d.headroom_bytes,
        "fits": d.fits,
        "layers": list(d.layers),
        "attention_layers": list(d.attention_layers),
        "recurrent_layers": list(d.recurrent_layers),
        "expert_layers": list(d.expert_layers),
    }


def _config_dict(config: Any) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(config)
    data["override_tensors"] = [f"{p}={b}" for p, b in config.override_tensors]
    return data


def _speed_dict(speed: SpeedEstimate) -> dict[str, Any]:
    return {
        "tokens_per_s_empty": round(speed.tokens_per_s_empty, 2),
        "tokens_per_s_target": round(speed.tokens_per_s_target, 2),
        "target_context": speed.target_context,
        "efficiency": speed.efficiency,
        "kind": speed.bound,
        "devices": [
            {
                "device": t.device,
                "bandwidth_bytes_per_s": t.bandwidth_bytes_per_s,
                "weight_bytes_per_token": t.weight_bytes_per_token,
                "kv_bytes_per_token_at_target": t.kv_bytes_per_token_at_target,
                "state_bytes_per_token": t.state_bytes_per_token,
            }
            for t in speed.devices
        ],
    }


def _estimate_dict(est: Estimate) -> dict[str, Any]:
    return {
        "fits": est.fits,
        "basis": est.basis,
        "exact_weights": est.exact_weights,
        "n_ctx": est.n_ctx,
        "kv_size": est.kv_size,
        "n_stream": est.n_stream,
        "pipeline_parallel": est.pipeline_parallel,
        "estimated": ["compute_bytes", "overhead_bytes", "projector_bytes"],
        "devices": [_device_dict(d) for d in est.devices],
        "notes": list(est.notes),
    }


def rule_dict(rule: Any) -> dict[str, Any]:
    """The llama.cpp build class a compute estimate assumed (plan/build_class.py)."""
    return {"class": rule.name, "build": rule.build, "reason": rule.reason}


def calibration_dict(calibration: Any) -> dict[str, Any] | None:
    """The calibration applied to speeds and GPU overheads, or None (plan/calibration.py)."""
    if calibration is None:
        return None
    f = calibration.speed
    return {
        "label": calibration.label,
        "date": calibration.date,
        "build": calibration.build,
        "speed_factors": {
            "decode_empty": f.decode_empty,
            "decode_depth": f.decode_depth,
            "depth_tokens": f.depth_tokens,
            "prefill": f.prefill,
        },
        "gpu_overhead_bytes": dict(calibration.gpu_overhead_bytes),
    }


def tuning_lines(rule: Any, calibration: Any) -> list[str]:
    """What the answer assumed about this machine's llama.cpp, in words (human output)."""
    lines = [f"Compute: {rule.describe()}"]
    if calibration is not None:
        lines.append(f"Speed and GPU overhead: {calibration.label}")
    return lines


def _machine_summary(machine: Machine) -> dict[str, Any]:
    return {
        "described": machine.described,
        "source": machine.source,
        "gpus": [g.name for g in machine.usable_gpus],
    }


def _flags(config: Any, n_slots: int) -> list[str]:
    from quantpick.serve.command import placement_flags

    return placement_flags(config, n_slots - 1)


def _device_table(est: Estimate, title: str) -> Any:
    from rich.table import Table

    gib = 1024**3
    table = Table(title=title + "  (GiB)", title_justify="left", pad_edge=False)
    for col in (
        "device",
        "weights",
        "KV",
        "state",
        "compute*",
        "other*",
        "total",
        "budget",
        "free after",
        "layers",
    ):
        table.add_column(col, justify="left" if col == "device" else "right")
    for d in est.devices:
        name = d.name.replace("NVIDIA ", "").replace("GeForce ", "")
        style = "" if d.fits else "[bold red]"
        table.add_row(
            f"{d.device} {name}",
            f"{d.weights_bytes / gib:.2f}",
            f"{d.kv_bytes / gib:.2f}",
            f"{d.recurrent_bytes / gib:.2f}",
            f"{d.compute_bytes / gib:.2f}",
            f"{(d.overhead_bytes + d.projector_bytes) / gib:.2f}",
            f"{d.total_bytes / gib:.2f}",
            f"{d.budget_bytes / gib:.2f}",
            f"{style}{d.headroom_bytes / gib:.2f}",
            _ranges(d.layers),
        )
    return table


def _ranges(values: tuple[int, ...]) -> str:
    if not values:
        return "-"
    out, start, prev = [], values[0], values[0]
    for v in values[1:]:
        if v == prev + 1:
            prev = v
            continue
        out.append(f"{start}-{prev}" if start != prev else str(start))
        start = prev = v
    out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)


def _decode_label(speed: Any) -> str:
    """ "Decode upper bound" for the model's bound; "Decode (calibrated)" once measured here."""
    return "Decode upper bound" if speed.bound.startswith("upper bound") else "Decode (calibrated)"


def _print_footer(con: Any, est: Estimate, speed: SpeedEstimate, layout: ModelLayout) -> None:
    con.print(f"Basis: {est.basis}" + ("" if est.exact_weights else " (estimate)"))
    con.print(
        "* compute and overhead are estimates; weights, KV and state follow llama.cpp's accounting."
    )
    con.print(
        f"{_decode_label(speed)}: {speed.tokens_per_s_empty:.1f} tok/s empty, "
        f"{speed.tokens_per_s_target:.1f} tok/s at {speed.target_context} tokens"
    )
    con.print("Fits." if est.fits else "[bold red]Does not fit.[/]")
    for note in est.notes:
        con.print(f"Note: {note}")


def plan_to_dict(p: Plan, machine: Machine, block_count: int) -> dict[str, Any]:
    """The plan as JSON: the chosen configuration, per-device bytes, speed, the llama-server
    flags it implies and every candidate with the reason it lost."""
    return {
        "model": p.model,
        "quant": p.quant,
        "flags": _flags(p.config, block_count + 1),
        "files": [
            {"name": f.name, "size_bytes": f.size_bytes, "sha256": f.sha256} for f in p.files
        ],
        "projector": (
            {"name": p.projector.name, "size_bytes": p.projector.size_bytes}
            if p.projector
            else None
        ),
        "cache_type_k": p.config.cache_type_k,
        "cache_type_v": p.config.cache_type_v,
        "placement": p.placement,
        "policy": p.policy,
        "layout_basis": p.layout_basis,
        "machine": _machine_summary(machine),
        "compute_rule": rule_dict(p.compute_rule),
        "calibration": calibration_dict(p.calibration),
        "config": _config_dict(p.config),
        **_estimate_dict(p.estimate),
        "speed": _speed_dict(p.speed),
        "candidates": [
            {
                "quant": c.quant,
                "cache_type": c.cache_type,
                "placement": c.placement,
                "fits": c.fits,
                "feasible": c.feasible,
                "reason": c.reason,
                "tokens_per_s_target": round(c.speed.tokens_per_s_target, 2) if c.speed else None,
                "shortfall_bytes": c.shortfall_bytes,
                "shortfall_device": c.shortfall_device,
                "devices": (
                    [
                        {
                            "device": d.device,
                            "total_bytes": d.total_bytes,
                            "budget_bytes": d.budget_bytes,
                        }
                        for d in c.estimate.devices
                    ]
                    if c.estimate
                    else None
                ),
            }
            for c in p.candidates
        ],
        "notes": list(p.notes),
    }


def render_plan(p: Plan, machine: Machine, n_slots: int) -> None:
    from rich.table import Table

    from quantpick.cli import output
    from quantpick.units import gb, human

    con = output.stdout()
    size = sum(f.size_bytes for f in p.files)
    where = "described machine: " + machine.source if machine.described else "this machine"
    con.print(
        f"[bold]{p.model}[/] -> [bold green]{p.quant}[/] ({gb(size)}, {human(size)}), "
        f"KV {p.config.cache_type_k}, {p.placement}  [dim]({where})[/]"
    )
    con.print(
        _device_table(
            p.estimate, f"Per device at -c {p.config.ctx_size}, -np {p.config.n_parallel}"
        )
    )
    con.print(
        f"{_decode_label(p.speed)}: {p.speed.tokens_per_s_empty:.1f} tok/s empty, "
        f"{p.speed.tokens_per_s_target:.1f} tok/s at {p.speed.target_context} tokens"
    )
    con.print("llama-server flags: " + " ".join(_flags(p.config, n_slots)))
    con.print(f"Basis: {p.layout_basis}")
    for line in tuning_lines(p.compute_rule, p.calibration):
        con.print(line)
    table = Table(title="Candidates", title_justify="left")
    for col in ("quant", "KV", "placement", "tok/s", "result"):
        table.add_column(col)
    for c in p.candidates:
        tps = f"{c.speed.tokens_per_s_target:.1f}" if c.speed and c.fits else "-"
        table.add_row(c.quant, c.cache_type, c.placement, tps, c.reason)
    con.print(table)
    for note in p.notes:
        output.note(f"Note: {note}")
