"""`quantpick pick` and `max-context`: the planner.

Usage:
    quantpick pick qwen3.8-35b-a3b-distill -c 262144 --gpu 3090 --gpu t4
    quantpick max-context qwen3.8-35b-a3b-distill --gpu 4090
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from quantpick.cli.core import app
from quantpick.cli.options import (
    DEFAULT_MIN_TPS,
    AllowQ4Opt,
    BOpt,
    CoresOpt,
    CpuOnlyOpt,
    CtxOpt,
    ExactOpt,
    FaOpt,
    GpuOpt,
    GpuOverheadOpt,
    GpuReserveOpt,
    HardwareOpt,
    JsonOpt,
    KvOpt,
    KvuOpt,
    LlamaBinOpt,
    LlamaServerOpt,
    MarginOpt,
    MinTpsOpt,
    ModelArg,
    NoCalibrationOpt,
    NoConfirmOpt,
    NoNetworkOpt,
    NoOffloadOpt,
    NpOpt,
    PreferOpt,
    QuantOpt,
    RamBandwidthOpt,
    RamOpt,
    RamReserveOpt,
    RpcBandwidthOpt,
    RpcDeviceOpt,
    RpcLatencyOpt,
    RpcOpt,
    ThreadsOpt,
    TimeoutOpt,
    UbOpt,
    VisionOpt,
    confirm_options,
    load_manifest,
    machine_from_cli,
    overheads_from_cli,
    plan_request,
)
from quantpick.cli.render import (
    _machine_summary,
    calibration_dict,
    plan_to_dict,
    render_plan,
    rule_dict,
    tuning_lines,
)

if TYPE_CHECKING:
    pass


@app.command("pick")
def pick_cmd(
    model: ModelArg = None,
    ctx_size: CtxOpt = 0,
    parallel: NpOpt = 1,
    kv_unified: KvuOpt = False,
    prefer: PreferOpt = "balanced",
    quant: QuantOpt = None,
    vision: VisionOpt = False,
    min_tps: MinTpsOpt = DEFAULT_MIN_TPS,
    allow_q4_kv: AllowQ4Opt = False,
    kv: KvOpt = None,
    no_offload: NoOffloadOpt = False,
    ubatch: UbOpt = 512,
    batch: BOpt = 2048,
    flash_attn: FaOpt = "on",
    max_context: Annotated[
        bool,
        typer.Option(
            "--max-context", help="Print the largest context each quant supports instead."
        ),
    ] = False,
    hardware: HardwareOpt = None,
    gpu: GpuOpt = None,
    ram: RamOpt = None,
    cpu_only: CpuOnlyOpt = False,
    llama_server: LlamaServerOpt = None,
    gpu_overhead: GpuOverheadOpt = None,
    margin: MarginOpt = None,
    ram_reserve: RamReserveOpt = None,
    gpu_reserve: GpuReserveOpt = None,
    ram_bandwidth: RamBandwidthOpt = None,
    cores: CoresOpt = None,
    threads: ThreadsOpt = None,
    rpc: RpcOpt = None,
    rpc_device: RpcDeviceOpt = None,
    rpc_bandwidth: RpcBandwidthOpt = None,
    rpc_latency: RpcLatencyOpt = None,
    exact: ExactOpt = False,
    no_network: NoNetworkOpt = False,
    no_calibration: NoCalibrationOpt = False,
    llama_bin: LlamaBinOpt = None,
    no_confirm: NoConfirmOpt = False,
    timeout: TimeoutOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Pick the best quant, KV cache type and placement for a target context. With llama.cpp
    installed (beside llama-server, on PATH, --llama-bin, or quantpick's build cache), its own
    projection of the chosen file, before download, is shown beside the estimate."""
    if max_context:
        max_context_cmd(
            model=model,
            quant=quant,
            parallel=parallel,
            kv_unified=kv_unified,
            prefer=prefer,
            vision=vision,
            min_tps=min_tps,
            allow_q4_kv=allow_q4_kv,
            kv=kv,
            no_offload=no_offload,
            hardware=hardware,
            gpu=gpu,
            ram=ram,
            cpu_only=cpu_only,
            llama_server=llama_server,
            gpu_overhead=gpu_overhead,
            margin=margin,
            ram_reserve=ram_reserve,
            gpu_reserve=gpu_reserve,
            ram_bandwidth=ram_bandwidth,
            cores=cores,
            threads=threads,
            rpc=rpc,
            rpc_device=rpc_device,
            rpc_bandwidth=rpc_bandwidth,
            rpc_latency=rpc_latency,
            exact=exact,
            no_network=no_network,
            no_calibration=no_calibration,
            json_=json_,
        )
        return
    from quantpick.cli import output

    manifest = load_manifest(model, network=not no_network)
    machine = machine_from_cli(
        hardware,
        gpu,
        ram,
        cpu_only,
        llama_server,
        ram_bandwidth,
        rpc=rpc,
        rpc_device=rpc_device,
        rpc_bandwidth=rpc_bandwidth,
        rpc_latency=rpc_latency,
        cores=cores,
        threads=threads,
    )
    request = plan_request(
        ctx_size,
        parallel,
        kv_unified,
        prefer,
        quant,
        vision,
        min_tps,
        allow_q4_kv,
        kv,
        ubatch,
        batch,
        flash_attn,
        no_offload,
    )
    from quantpick.jobs.plan import PlanInputs, plan_for

    result = plan_for(
        PlanInputs(
            manifest, machine, request,
            overheads_from_cli(gpu_overhead, margin, ram_reserve, gpu_reserve),
            llama_server=llama_server, gpu_overhead_given=gpu_overhead is not None,
            calibration=not no_calibration,
            exact=exact, network=not no_network,
        )
    )  # fmt: skip
    for line in result.notes:
        output.note(f"Note: {line}")
    p = result.plan
    report = None
    options = confirm_options(no_confirm, llama_bin, llama_server, machine, timeout)
    if options is not None:
        from quantpick.config import load_settings
        from quantpick.jobs.dry_run import dry_run

        report = dry_run(result, options, settings=load_settings())
        if report is not None and report.status in ("confirmed", "replanned"):
            p = report.plan  # re-planned on llama.cpp's own figures when a device overflowed
    if json_:
        from quantpick.cli.confirm import confirmation_to_dict

        doc = plan_to_dict(p, machine, p.n_slots - 1)
        doc["header_problems"] = list(result.header_problems)
        doc["dry_run"] = confirmation_to_dict(report)
        output.print_json(doc)
        return
    render_plan(p, machine, p.n_slots)
    if report is not None or machine.described:
        from quantpick.cli.confirm import report_confirmation

        # a described machine: one note that llama.cpp did not project it (it sees this box)
        report_confirmation(report, machine, no_confirm, quiet=False)


# ---- max-context ------------------------------------------------------------------------------


@app.command("max-context")
def max_context_cmd(
    model: ModelArg = None,
    quant: QuantOpt = None,
    parallel: NpOpt = 1,
    kv_unified: KvuOpt = False,
    prefer: PreferOpt = "balanced",
    vision: VisionOpt = False,
    min_tps: MinTpsOpt = DEFAULT_MIN_TPS,
    allow_q4_kv: AllowQ4Opt = False,
    kv: KvOpt = None,
    no_offload: NoOffloadOpt = False,
    hardware: HardwareOpt = None,
    gpu: GpuOpt = None,
    ram: RamOpt = None,
    cpu_only: CpuOnlyOpt = False,
    llama_server: LlamaServerOpt = None,
    gpu_overhead: GpuOverheadOpt = None,
    margin: MarginOpt = None,
    ram_reserve: RamReserveOpt = None,
    gpu_reserve: GpuReserveOpt = None,
    ram_bandwidth: RamBandwidthOpt = None,
    cores: CoresOpt = None,
    threads: ThreadsOpt = None,
    rpc: RpcOpt = None,
    rpc_device: RpcDeviceOpt = None,
    rpc_bandwidth: RpcBandwidthOpt = None,
    rpc_latency: RpcLatencyOpt = None,
    exact: ExactOpt = False,
    no_network: NoNetworkOpt = False,
    no_calibration: NoCalibrationOpt = False,
    json_: JsonOpt = False,
) -> None:
    """The largest context each quant (or --quant) supports on this machine."""
    from quantpick.cli import output

    manifest = load_manifest(model, network=not no_network)
    machine = machine_from_cli(
        hardware,
        gpu,
        ram,
        cpu_only,
        llama_server,
        ram_bandwidth,
        rpc=rpc,
        rpc_device=rpc_device,
        rpc_bandwidth=rpc_bandwidth,
        rpc_latency=rpc_latency,
        cores=cores,
        threads=threads,
    )
    request = plan_request(
        0,
        parallel,
        kv_unified,
        prefer,
        quant,
        vision,
        min_tps,
        allow_q4_kv,
        kv,
        512,
        2048,
        "on",
        no_offload,
    )
    from quantpick.jobs.plan import PlanInputs, max_context_for

    found = max_context_for(
        PlanInputs(
            manifest, machine, request,
            overheads_from_cli(gpu_overhead, margin, ram_reserve, gpu_reserve),
            llama_server=llama_server, gpu_overhead_given=gpu_overhead is not None,
            calibration=not no_calibration,
            exact=exact, network=not no_network,
        )
    )  # fmt: skip
    limits, tuning = found.limits, found.tuning
    for line in tuning.notes:
        output.note(f"Note: {line}")
    if json_:
        output.print_json(
            {
                "model": manifest.id,
                "machine": _machine_summary(machine),
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
