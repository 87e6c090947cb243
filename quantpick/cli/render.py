"""Rendering plans and estimates: JSON documents (sizes as integer bytes) and rich tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quantpick.json_view import attrs

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine
    from quantpick.model.layout import ModelLayout
    from quantpick.plan.bandwidth_bound import SpeedEstimate
    from quantpick.plan.memory import Estimate
    from quantpick.plan.plan_types import Plan

# ---- pieces -------------------------------------------------------------------------------


def _device_dict(d: Any) -> dict[str, Any]:
    return {
        **attrs(d, "device name kind gpu_index weights_bytes kv_bytes recurrent_bytes "
                   "compute_bytes overhead_bytes projector_bytes correction_bytes"),
        "compute_estimated": d.compute_accuracy.estimated,
        "compute_expected_error": d.compute_accuracy.relative,
        "compute_expected_error_floor_bytes": d.compute_accuracy.floor_bytes,
        **attrs(d, "total_bytes free_bytes budget_bytes headroom_bytes fits"),
        **{k: list(v) for k, v in attrs(d, "layers attention_layers recurrent_layers "
                                           "expert_layers").items()},
        **attrs(d, "endpoint backend unified"),
    }  # fmt: skip


def config_dict(config: Any) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(config)
    data["override_tensors"] = [f"{p}={b}" for p, b in config.override_tensors]
    return data


def speed_dict(speed: SpeedEstimate) -> dict[str, Any]:
    """`expected` (what to expect from llama-server) and `bound` (bandwidth upper bound) are the
    interface; the flat tokens_per_s_* keys repeat the bound and are deprecated (README)."""
    expected = speed.expected
    return {
        "expected": (
            {
                "decode_tps_empty": round(expected.decode_tps_empty, 2),
                "decode_tps_target": round(expected.decode_tps_target, 2),
                "prefill_tps": round(expected.prefill_tps, 1),
                "target_context": expected.target_context,
                "basis": expected.basis,
                "assumed": list(expected.assumed),
                # RPC workers: the network's share of a token at the target fill, and the
                # one-time transfer of the workers' weights at load (a cold tensor cache)
                "network_ms_target": round(expected.network_ms_target, 3),
                "load_seconds": round(expected.load_seconds, 1),
            }
            if expected is not None
            else None
        ),
        "bound": {
            "decode_tps_empty": round(speed.tokens_per_s_empty, 2),
            "decode_tps_target": round(speed.tokens_per_s_target, 2),
        },
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


def estimate_dict(est: Estimate) -> dict[str, Any]:
    return {
        **attrs(est, "fits basis exact_weights n_ctx kv_size n_stream pipeline_parallel"),
        "estimated": ["compute_bytes", "overhead_bytes", "projector_bytes"],
        "devices": [_device_dict(d) for d in est.devices],
        "notes": list(est.notes),
    }


def machine_label(machine: Machine) -> str:
    """'described machine: --gpu 3090 --ram 64G' or 'this machine' (the source says how)."""
    if not machine.described:
        return "this machine, GPUs hidden (--cpu-only)" if machine.gpus_hidden else "this machine"
    return "described machine: " + machine.source.removeprefix("described: ")


def rule_dict(rule: Any) -> dict[str, Any]:
    """The llama.cpp build class a compute estimate assumed (plan/build_class.py)."""
    return {"class": rule.name, "build": rule.build, "reason": rule.reason}


def calibration_dict(calibration: Any) -> dict[str, Any] | None:
    """The calibration applied to speeds and GPU overheads, or None (plan/calibration.py)."""
    if calibration is None:
        return None
    return {
        **attrs(calibration, "label date build"),
        "speed_factors": attrs(calibration.speed, "decode_empty decode_depth depth_tokens prefill"),
        "gpu_overhead_bytes": dict(calibration.gpu_overhead_bytes),
    }


def tuning_lines(rule: Any, calibration: Any) -> list[str]:
    """What the answer assumed about this machine's llama.cpp, in words (human output)."""
    lines = [f"Compute: {rule.describe()}"]
    if calibration is not None:
        lines.append(f"Speed and GPU overhead: {calibration.label}")
    return lines


def host_dict(machine: Machine) -> dict[str, Any]:
    """The host the plan assumed: cores, threads, RAM, bandwidth, and which of them were
    assumptions (Host.assumed: a typical desktop for a described machine, the planner's default
    bandwidth when none was given)."""
    from quantpick.machine.spec import ASSUMED_HOST_BANDWIDTH_BYTES_PER_S

    h = machine.host
    return {
        "cores": h.cpu_cores,
        "threads": h.cpu_threads,
        "ram_total_bytes": h.ram_total_bytes,
        "ram_available_bytes": h.ram_available_bytes,
        "ram_bandwidth_bytes_per_s": h.ram_bandwidth_bytes_per_s
        or ASSUMED_HOST_BANDWIDTH_BYTES_PER_S,
        "assumed": list(h.assumed),
    }


def machine_summary(machine: Machine) -> dict[str, Any]:
    from quantpick.units import SIZE_UNITS

    return {
        "described": machine.described,
        "gpus_hidden": machine.gpus_hidden,
        "source": machine.source,
        "host": host_dict(machine),
        # How sizes given to quantpick were read (units.py): GB is GiB on a memory size.
        "size_units": SIZE_UNITS,
        "notes": list(machine.notes),
        "gpus": [g.name for g in machine.usable_gpus],
        "rpc_workers": [
            {"endpoint": w.endpoint, "devices": [g.name for g in w.devices], "probed": w.probed}
            for w in machine.rpc_workers
        ],
    }


def config_flags(config: Any, n_slots: int) -> list[str]:
    """The placement flags of `config` for a model of `n_slots` layer slots."""
    from quantpick.serve.command import placement_flags

    return placement_flags(config, n_slots - 1)


def device_table(est: Estimate, title: str) -> Any:
    from rich.table import Table

    from quantpick.plan.compute import accuracy_legend

    gib = 1024**3
    legend = accuracy_legend([d.compute_accuracy for d in est.devices])
    table = Table(
        title=title + "  (GiB)",
        title_justify="left",
        pad_edge=False,
        caption=legend,
        caption_justify="left",
    )
    for col in (
        "device",
        "weights",
        "KV",
        "state",
        "compute",
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
            f"{d.compute_bytes / gib:.2f}" + ("*" if d.compute_accuracy.estimated else " "),
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


def speed_line(speed: SpeedEstimate) -> str:
    """'Expected: ~N tok/s decode (M at T tokens), P tok/s prefill; bound: ...' (expected first)."""
    bound = (
        f"bound: {speed.tokens_per_s_empty:.0f} tok/s decode "
        f"({speed.tokens_per_s_target:.0f} at {speed.target_context} tokens)"
    )
    e = speed.expected
    if e is None:
        return "Decode " + bound
    line = (
        f"Expected: ~{e.decode_tps_empty:.0f} tok/s decode ({e.decode_tps_target:.0f} at "
        f"{e.target_context} tokens), {e.prefill_tps:.0f} tok/s prefill; {bound}"
    )
    if e.load_seconds:
        line += (
            f"\nRPC: {e.network_ms_target:.1f} ms of each token on the network at "
            f"{e.target_context} tokens; loading sends the workers' weights once "
            f"(~{e.load_seconds:.0f} s; ggml-rpc-server -c caches them for the next start)"
        )
    return line


def _speed_tps(speed: SpeedEstimate | None) -> float | None:
    """The figure a table shows: expected decode at the target context (else the bound)."""
    if speed is None:
        return None
    return (
        speed.expected.decode_tps_target
        if speed.expected is not None
        else speed.tokens_per_s_target
    )


def _print_speed_notes(con: Any, speed: SpeedEstimate) -> None:
    e = speed.expected
    if e is not None:
        con.print(f"[dim]Speed: {e.basis}[/]")


def print_footer(con: Any, est: Estimate, speed: SpeedEstimate, layout: ModelLayout) -> None:
    con.print(f"Basis: {est.basis}" + ("" if est.exact_weights else " (estimate)"))
    con.print(
        "* other (the GPU runtime, the output buffer's rows) is an estimate; weights, KV and state"
        " follow llama.cpp's accounting; compute as the line under the table says."
    )
    con.print(speed_line(speed))
    _print_speed_notes(con, speed)
    con.print("Fits." if est.fits else "[bold red]Does not fit.[/]")
    for note in est.notes:
        con.print(f"Note: {note}")


def quality_dict(q: Any) -> dict[str, Any] | None:
    """A Quality as JSON (plan/quality.py): mean KLD vs BF16 on the family scale, with its basis."""
    if q is None:
        return None
    return {
        "quant": q.quant,
        "bits_per_weight": q.bpw,
        "mean_kld": q.mean_kld,
        "ppl_ratio": q.ppl_ratio,
        "basis": q.basis,
        "scope": q.scope,
        "source": q.source,
        "tier": q.tier,
        "verdict": q.verdict,
        "also_measured": list(q.also_measured),
        "note": q.note,
    }


def speculative_dict(p: Plan) -> dict[str, Any] | None:
    """The speculative-decoding decision: on or off, the kind and draft count, the expected
    decode with and without, why, and what it adds on each device (the NextN weights, the draft
    context's KV and output, the main context's extra state), keyed as `devices`."""
    d = p.speculative
    if d is None:
        return None
    devices: list[dict[str, Any]] = []
    if d.enabled and d.estimate is not None:
        from dataclasses import replace

        base = next(
            (c.estimate for c in p.candidates if c.reason.startswith("chosen") and c.estimate),
            None,
        )
        before = {x.device: x for x in base.devices} if base is not None else {}
        for dev in d.estimate.devices:
            b = before.get(dev.device)
            if b is None:
                devices.append(_device_dict(dev))
                continue
            delta = replace(
                dev,
                weights_bytes=dev.weights_bytes - b.weights_bytes,
                kv_bytes=dev.kv_bytes - b.kv_bytes,
                recurrent_bytes=dev.recurrent_bytes - b.recurrent_bytes,
                compute_bytes=dev.compute_bytes - b.compute_bytes,
                overhead_bytes=dev.overhead_bytes - b.overhead_bytes,
                projector_bytes=0,
                correction_bytes=0,
                total_bytes=dev.total_bytes - b.total_bytes,
                layers=tuple(x for x in dev.layers if x not in b.layers),
                attention_layers=(),
                recurrent_layers=(),
                expert_layers=tuple(x for x in dev.expert_layers if x not in b.expert_layers),
            )
            devices.append(_device_dict(delta))
    return {
        "enabled": d.enabled,
        "kind": d.kind.value if d.kind else None,
        "spec_type": d.kind.spec_type if d.kind else None,
        "draft_n_max": d.draft_n_max if d.enabled else 0,
        "expected_decode_tps": round(d.tps, 2),
        "expected_decode_tps_without": round(d.tps_without, 2),
        "reason": d.reason,
        "options": [
            {
                "kind": o.kind.value,
                "draft_n_max": o.draft_n_max,
                "acceptance": round(o.acceptance, 3),
                "expected_decode_tps": round(o.tps, 2),
            }
            for o in d.options
        ],
        "devices": devices,
        "draft_model": _draft_dict(d.draft),
    }


def _draft_dict(placed: Any) -> dict[str, Any] | None:
    """A draft model's file, where it goes (-devd/-ngld) and its own buffers per device (the
    second llama_context's: plan/draft.py), keyed as `devices`; None without one."""
    if placed is None:
        return None
    from quantpick.model.speculative import SpecKind
    from quantpick.plan.speculative import SPEED_ERROR_TEXT

    run = placed.run
    return {
        "path": run.path,
        "on": placed.where,
        "n_gpu_layers": "all" if run.n_gpu_layers is None else run.n_gpu_layers,
        "devices": [_device_dict(x) for x in placed.own.devices if x.total_bytes],
        "speed_error": SPEED_ERROR_TEXT[SpecKind.DRAFT],
    }


def plan_to_dict(p: Plan, machine: Machine, block_count: int) -> dict[str, Any]:
    """The plan as JSON: the chosen configuration, per-device bytes, speed, the llama-server
    flags it implies and every candidate with the reason it lost."""
    return {
        "model": p.model,
        "quant": p.quant,
        "flags": config_flags(p.config, block_count + 1),
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
        "why": p.why,
        "quality": quality_dict(p.quality),
        "layout_basis": p.layout_basis,
        "machine": machine_summary(machine),
        "compute_rule": rule_dict(p.compute_rule),
        "calibration": calibration_dict(p.calibration),
        "config": config_dict(p.config),
        **estimate_dict(p.estimate),
        "speed": speed_dict(p.speed),
        "speculative": speculative_dict(p),
        "candidates": [
            {
                **attrs(c, "quant cache_type placement fits feasible reason"),
                "mean_kld": c.quality.mean_kld if c.quality else None,
                "quality_tier": c.quality.tier if c.quality else None,
                "tokens_per_s_target": round(c.speed.tokens_per_s_target, 2) if c.speed else None,
                "expected_decode_tps_target": (
                    round(c.speed.expected.decode_tps_target, 2)
                    if c.speed and c.speed.expected
                    else None
                ),
                **attrs(c, "shortfall_bytes shortfall_device"),
                "devices": (
                    [attrs(d, "device total_bytes budget_bytes") for d in c.estimate.devices]
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
    where = machine_label(machine)
    con.print(
        f"[bold]{p.model}[/] -> [bold green]{p.quant}[/] ({gb(size)}, {human(size)}), "
        f"KV {p.config.cache_type_k}, {p.placement}  [dim]({where})[/]"
    )
    con.print(f"Why: {p.why}  [dim](policy {p.policy})[/]", soft_wrap=True)
    if p.quality is not None:
        q = p.quality
        ppl = f", PPL x{q.ppl_ratio:.4f}" if q.ppl_ratio else ""
        basis = f", {q.scope}, {q.basis}" if q.scope else f" ({q.basis})"
        con.print(
            f"Quality: mean KLD {q.mean_kld:.4f} vs BF16{ppl}{basis}: {q.verdict}",
            soft_wrap=True,
        )
    con.print(
        device_table(p.estimate, f"Per device at -c {p.config.ctx_size}, -np {p.config.n_parallel}")
    )
    con.print(speed_line(p.speed))
    if p.speculative is not None:
        con.print(f"Speculation: {p.speculative.reason}", soft_wrap=True)
    con.print("llama-server flags: " + " ".join(config_flags(p.config, n_slots)))
    con.print(f"Basis: {p.layout_basis}")
    for line in tuning_lines(p.compute_rule, p.calibration):
        con.print(line)
    table = Table(title="Candidates", title_justify="left")
    # tok/s: the expected decode at the target context
    for col in ("quant", "KLD", "KV", "placement", "tok/s", "result"):
        table.add_column(col)
    for c in p.candidates:
        shown = _speed_tps(c.speed)
        tps = f"{shown:.1f}" if shown is not None and c.fits else "-"
        spec = p.speculative
        if spec is not None and spec.enabled and c.reason.startswith("chosen"):
            tps = (
                f"{spec.tps_without:.1f} -> {spec.tps:.1f} ({spec.kind.value if spec.kind else ''})"
            )
        kld = f"{c.quality.mean_kld:.4f}" if c.quality else "-"
        table.add_row(c.quant, kld, c.cache_type, c.placement, tps, c.reason)
    con.print(table)
    _print_speed_notes(con, p.speed)
    # the plan's own Speculation line above says it; the note is for commands that show no plan
    said = f"Speculation: {p.speculative.reason}" if p.speculative is not None else None
    for note in p.notes:
        if note != said:
            output.note(f"Note: {note}")
