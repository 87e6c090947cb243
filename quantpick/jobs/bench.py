"""`quantpick bench`: measure the plan on this machine and derive its calibration profile."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine
    from quantpick.model.manifest import Manifest
    from quantpick.plan.calibration import SpeedFactors
    from quantpick.plan.memory import Overheads
    from quantpick.plan.plan_types import Plan
    from quantpick.serve.bench import BenchMeasurement, BenchModel, BenchSettings


@dataclass(frozen=True)
class GpuOverhead:
    device: str  # CUDA<i>
    index: int
    baseline_used_bytes: int
    peak_used_bytes: int
    accounted_bytes: int  # llama.cpp's buffers for the configuration that ran
    accounted_from: str  # "llama-fit-params" | "quantpick's estimate"
    driver_overhead_bytes: int


@dataclass(frozen=True)
class BenchReport:
    plan: Plan
    measurement: BenchMeasurement
    predicted: dict[str, float | None]  # decode_empty, decode_depth, prefill (uncalibrated)
    ratios: SpeedFactors
    gpus: tuple[GpuOverhead, ...]
    build_id: str
    build_label: str
    entry: dict[str, Any]  # the profile entry (docs/calibration.md)
    notes: tuple[str, ...] = ()


def bench_plan(
    p: Plan,
    manifest: Manifest,
    model_path: Path,
    machine: Machine,
    overheads: Overheads,
    *,
    settings: BenchSettings,
    llama_bin: Path | None,
    llama_server: Path | None,
    tool: str = "auto",
    date: str,
    progress: Callable[[str], None] | None = None,
    fit_params_extra: tuple[str, ...] = (),
) -> BenchReport:
    """Run `p` for real (llama-bench, else llama-server), compare with the uncalibrated
    prediction and build this machine's calibration profile entry for the tool's build."""
    from quantpick.errors import UsageError
    from quantpick.machine.backends import local_backend
    from quantpick.machine.llamacpp import inspect_llama_server
    from quantpick.model.local import local_layout
    from quantpick.plan.calibration import (
        build_id,
        driver_overhead,
        plan_devices,
        predicted_figures,
        speed_ratios,
    )
    from quantpick.plan.confirm import server_logits_saving
    from quantpick.plan.memory import estimate
    from quantpick.plan.placement import speed_params_for
    from quantpick.plan.speed import device_speeds, expected_speed
    from quantpick.serve.bench import (
        BENCH,
        SERVER,
        bench_config,
        run_llama_bench,
        run_llama_server,
    )
    from quantpick.serve.fitparams import (
        FIT_PARAMS,
        FitParamsError,
        find_tool,
        fit_params_argv,
        run_fit_params,
    )

    if tool not in ("auto", BENCH, SERVER):
        raise UsageError(f"--tool {tool}: use auto, {BENCH} or {SERVER}")
    bench_bin = (
        None if tool == SERVER else find_tool(BENCH, llama_bin=llama_bin, llama_server=llama_server)
    )
    server_bin = find_tool(SERVER, llama_bin=llama_bin, llama_server=llama_server)
    if bench_bin is None and (tool == BENCH or server_bin is None):
        where = f"in {llama_bin}" if llama_bin else "beside llama-server or on PATH"
        wanted = BENCH if tool == BENCH else f"{BENCH} or {SERVER}"
        raise UsageError(f"no {wanted} {where}", hint="install llama.cpp or pass --llama-bin DIR")
    layout = local_layout(model_path, p.quant)
    benched = _benched(p, manifest, model_path, machine, layout.architecture.vocab_size, progress)
    notes: list[str] = []
    if bench_bin is not None:
        binary = bench_bin
        measurement = run_llama_bench(bench_bin, p.config, benched, settings)
        ran = bench_config(p.config, settings)
    else:
        assert server_bin is not None
        binary = server_bin
        measurement = run_llama_server(server_bin, p.config, benched, settings)
        ran = p.config
    info = inspect_llama_server(binary)
    bid = build_id(info.build, info.commit, info.version)
    label = f"b{info.build}" + (f" ({info.commit})" if info.commit else "") if info.build else bid

    # Prediction at the same depth, from the uncalibrated expected-speed model; llama-bench has no
    # server loop (sampling, streaming), so its prediction leaves that cost out.
    depth = measurement.depth_tokens
    params = speed_params_for(machine)
    if bench_bin is not None:
        params = replace(params, server_ms=0.0)
    speed = expected_speed(
        layout, p.estimate, device_speeds(machine), target_context=depth, params=params
    )
    figures = predicted_figures(speed)
    predicted = {
        "decode_empty": figures["decode_empty"],
        "decode_depth": figures["decode_target"] if depth > 0 else None,
        "prefill": figures["prefill"],
    }
    measured = {
        "decode_empty": measurement.decode_tps_empty,
        "decode_depth": measurement.decode_tps_depth,
        "prefill": measurement.prefill_tps,
    }
    ratios = speed_ratios(measured, predicted, depth)
    if predicted["prefill"] is None:
        notes.append("no prefill prediction to compare with yet: prefill stored as measured")

    # What llama.cpp accounts for the configuration that ran, per GPU.
    est = estimate(layout, machine, ran, overheads=overheads)
    # keyed by the GPU's index: NVML's peaks and the plan's rows name the same card
    accounted = {d.gpu_index: d.weights_bytes + d.kv_bytes + d.recurrent_bytes + d.compute_bytes
                 for d in est.gpus}  # fmt: skip
    source = "quantpick's estimate"
    fit_bin = find_tool(FIT_PARAMS, llama_bin=llama_bin, llama_server=llama_server)
    if measurement.gpus and fit_bin is not None:
        argv, env = fit_params_argv(fit_bin, ran, model_path, benched.block_count,
                                    extra_args=fit_params_extra,
                                    backend=local_backend(machine.gpus))  # fmt: skip
        try:
            projection = run_fit_params(argv, env).projection
        except FitParamsError as exc:
            notes.append(f"GPU overhead from quantpick's estimate ({exc.message})")
        else:
            if len(projection.gpus) == len(est.gpus):
                saving = 0
                if measurement.tool == SERVER and p.compute_rule.capped:
                    saving = server_logits_saving(layout, ran, est.n_ctx)
                out_dev = next((d.device for d in est.gpus if layout.output_slot in d.layers), None)
                for d, row in zip(est.gpus, projection.gpus, strict=True):
                    mib = row.model_mib + row.context_mib + row.compute_mib
                    accounted[d.gpu_index] = mib * 2**20 - (saving if d.device == out_dev else 0)
                source = FIT_PARAMS
    gpus = tuple(
        GpuOverhead(
            device=g.device,
            index=g.index,
            baseline_used_bytes=g.baseline_used_bytes,
            peak_used_bytes=g.peak_used_bytes,
            accounted_bytes=accounted.get(g.index, 0),
            accounted_from=source,
            driver_overhead_bytes=driver_overhead(
                g.peak_used_bytes, g.baseline_used_bytes, accounted.get(g.index, 0)
            ),
        )
        for g in measurement.gpus
    )
    by_index = {g.index: g for g in machine.gpus}
    entry = {
        "build_id": bid,
        "build_label": label,
        "version": info.version,
        "date": date,
        "tool": measurement.tool,
        "argv": [Path(measurement.argv[0]).name, *measurement.argv[1:]],
        "model": manifest.id,
        "quant": p.quant,
        "compute_rule": p.compute_rule.name,
        "n_prompt": measurement.n_prompt,
        "n_gen": measurement.n_gen,
        "depth_tokens": depth,
        "ctx_size": measurement.ctx_size,
        "measured": {
            "decode_tps_empty": measurement.decode_tps_empty,
            "decode_tps_depth": measurement.decode_tps_depth,
            "prefill_tps": measurement.prefill_tps,
            "prefill_tps_depth": measurement.prefill_tps_depth,
        },
        "predicted": {
            "decode_tps_empty": predicted["decode_empty"],
            "decode_tps_depth": predicted["decode_depth"],
            "prefill_tps": predicted["prefill"],
            "model": speed.basis,
        },
        "ratios": {
            "decode_empty": ratios.decode_empty,
            "decode_depth": ratios.decode_depth,
            "prefill": ratios.prefill,
        },
        "gpus": [
            {
                "device": g.device,
                "index": g.index,
                "name": by_index[g.index].name if g.index in by_index else None,
                "uuid": by_index[g.index].uuid if g.index in by_index else None,
                "baseline_used_bytes": g.baseline_used_bytes,
                "peak_used_bytes": g.peak_used_bytes,
                "llamacpp_accounted_bytes": g.accounted_bytes,
                "accounted_from": g.accounted_from,
                "driver_overhead_bytes": g.driver_overhead_bytes,
            }
            for g in gpus
        ],
        "host_peak_rss_bytes": measurement.host_peak_rss_bytes,
        # the scope and the evidence plan/calibration.py checks before the entry is stored
        "model_bytes": sum(f.size_bytes for f in manifest.quant_files(p.quant))
        or measurement.model_bytes,
        "devices": list(plan_devices(machine, p.estimate.devices)),
        "samples": {k: list(v) for k, v in measurement.samples.items()},
    }
    return BenchReport(p, measurement, predicted, ratios, gpus, bid, label, entry, tuple(notes))


def _benched(
    p: Plan,
    manifest: Manifest,
    model_path: Path,
    machine: Machine,
    vocab_size: int,
    progress: Callable[[str], None] | None,
) -> BenchModel:
    """The plan's model as a bench run loads it, watching the plan's GPUs through this machine's
    backend."""
    from quantpick.machine.backends import local_backend
    from quantpick.serve.bench import BenchModel

    gpu_indices = [g.gpu_index for g in p.estimate.gpus if g.gpu_index is not None]
    return BenchModel(
        model_path,
        manifest.architecture.block_count,
        gpu_indices,
        vocab_size=vocab_size,
        progress=progress,
        backend=local_backend(machine.gpus),
    )


def plain_plan(p: Plan) -> Plan:
    """The plan without its speculation: what the calibration measures (the speed model's own
    figures); speculation is measured beside it (bench_speculation)."""
    if p.speculative is None or not p.speculative.enabled:
        return p
    from quantpick.plan.speculative import with_kind

    plain = next(c.estimate for c in p.candidates if c.reason.startswith("chosen"))
    assert plain is not None
    return replace(p, config=with_kind(p.config, None, 0), estimate=plain)


def bench_speculation(
    p: Plan,
    manifest: Manifest,
    model_path: Path,
    machine: Machine,
    settings: BenchSettings,
    *,
    asked: bool,
    llama_bin: Path | None,
    llama_server: Path | None,
    vocab_size: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any] | None:
    """The plan's speculation measured both ways through llama-server, beside its prediction;
    when the plan does not speculate, why (if --spec asked for it), else None. Not stored in the
    calibration: the speed factors calibrate the plain plan."""
    d = p.speculative
    if d is None or not d.enabled:
        return {"measured": False, "reason": d.reason} if asked and d is not None else None
    from quantpick.errors import UsageError
    from quantpick.plan.speculative import with_kind
    from quantpick.serve.bench import SERVER, measure_speculation
    from quantpick.serve.fitparams import find_tool

    server = find_tool(SERVER, llama_bin=llama_bin, llama_server=llama_server)
    if server is None:
        raise UsageError("bench --spec measures through llama-server: none found",
                         hint="pass --llama-server PATH or --llama-bin DIR")  # fmt: skip
    benched = _benched(p, manifest, model_path, machine, vocab_size, progress)
    m = measure_speculation(server, p.config, with_kind(p.config, None, 0), benched, settings)
    problems = m.problems()
    acc = m.acceptance
    measured = (
        f"measured {m.decode_tps_with:.1f} vs {m.decode_tps_without:.1f} tok/s without "
        f"(x{m.decode_tps_with / m.decode_tps_without:.2f}"
        + (f", acceptance {100 * acc:.0f}%" if acc is not None else "")
        + ")"
        if not problems
        else "not usable: " + "; ".join(problems)
    )
    kind = d.kind.value if d.kind else None
    return {
        "measured": not problems,
        "kind": kind,
        "draft_n_max": d.draft_n_max,
        "decode_tps_with": m.decode_tps_with,
        "decode_tps_without": m.decode_tps_without,
        "drafted": m.drafted,
        "accepted": m.accepted,
        "acceptance": acc,
        "predicted_decode_tps_with": round(d.tps, 2),
        "predicted_decode_tps_without": round(d.tps_without, 2),
        "argv": list(m.argv),
        "problems": problems,
        "reason": f"{kind or ''} with {d.draft_n_max} drafts: {measured}; "
        f"predicted {d.tps:.1f} vs {d.tps_without:.1f} (the prediction's depth; "
        + (
            "the acceptance is stored with the calibration for later plans)"
            if not problems and acc is not None and _storable(acc, d.draft_n_max)
            else "nothing stored)"
        ),
    }


def _storable(rate: float, n: int) -> bool:
    """Whether a measured acceptance rate gives a per-token acceptance to plan with: a run that
    accepted no draft, or every one, does not (0 or 1 would be a certainty, not a measurement)."""
    from quantpick.plan.speculative import acceptance_from_rate

    return 0 < round(acceptance_from_rate(rate, n), 4) < 1


def with_speculation(report: BenchReport, spec_doc: dict[str, Any] | None) -> BenchReport:
    """The report whose profile entry carries the per-token acceptance `bench --spec` measured
    (docs/calibration.md "speculation"), when it measured one: later plans on this machine and
    build decide speculation with it (plan/speculative.py SpecRequest.measured_acceptance).
    Speed factors stay the plain plan's; plausibility_problems checks the acceptance too."""
    if not spec_doc or not spec_doc.get("measured") or spec_doc.get("acceptance") is None:
        return report
    from quantpick.plan.speculative import acceptance_from_rate

    rate, n = float(spec_doc["acceptance"]), int(spec_doc["draft_n_max"])
    if not _storable(rate, n):
        return report
    a = round(acceptance_from_rate(rate, n), 4)
    measured = {
        "acceptance": a,  # per token, as plan/speculative.py uses it
        "rate": round(rate, 4),  # llama-server's accepted / drafted
        "draft_n_max": n,
        "decode_tps_with": spec_doc["decode_tps_with"],
        "decode_tps_without": spec_doc["decode_tps_without"],
    }
    entry = {**report.entry, "speculation": {str(spec_doc["kind"]): measured}}
    return replace(report, entry=entry)
