"""`quantpick command` and `quantpick get`: the ready-to-run llama-server command, and the whole
pipeline (probe -> pick -> download + verify -> command) in one step.

Usage:
    quantpick get qwen3.8-35b-a3b-distill -c 262144
    quantpick get qwen3.8-35b-a3b-distill -c 131072 --gpu 3090 --gpu t4 --dry-run --json
    quantpick get qwen3.8-35b-a3b-distill -c 65536 --script ~/bin/serve-qwen
    quantpick command --gguf ./Qwen3.8-35B-A3B-Q4_K_M.gguf -c 65536
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from quantpick.cli.core import app
from quantpick.cli.options import (
    AllowQ4Opt,
    CpuOnlyOpt,
    CtxOpt,
    ExactOpt,
    GgufOpt,
    GpuOpt,
    GpuOverheadOpt,
    HardwareOpt,
    JsonOpt,
    KvOpt,
    KvuOpt,
    LlamaBinOpt,
    LlamaServerOpt,
    MarginOpt,
    MinTpsOpt,
    ModelArg,
    NoConfirmOpt,
    NoNetworkOpt,
    NoOffloadOpt,
    NpOpt,
    PreferOpt,
    QuantOpt,
    RamBandwidthOpt,
    RamOpt,
    VisionOpt,
    apply_local_tuning,
    confirm_options,
    load_manifest,
    machine_from_cli,
    overheads_from_cli,
    plan_request,
)

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine
    from quantpick.plan.planner import Plan
    from quantpick.serve.command import ServerCommand, ServerOptions
    from quantpick.serve.flags import ServerCapabilities

FORMATS = ("line", "script", "json", "env")

FormatOpt = Annotated[
    str, typer.Option("--format", help="line (default), script, json or env (LLAMA_ARG_*).")
]
ScriptOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--script",
        help="Write an executable launch script here (atomic, mode 0755).",
        dir_okay=False,
    ),
]
HostOpt = Annotated[str, typer.Option("--host", help="llama-server --host.")]
PortOpt = Annotated[int, typer.Option("--port", help="llama-server --port.")]
AliasOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--alias", help="Model name the server reports (default: the model id)."),
]
ApiKeyEnvOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--api-key-env",
        help="NAME of an environment variable holding the API key "
        "(the key itself is never written).",
    ),
]
DirOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--dir",
        help="Model directory (default: QUANTPICK_MODELS_DIR or the data dir).",
        file_okay=False,
    ),
]


def _server_options(
    host: str, port: int, alias: str | None, api_key_env: str | None
) -> ServerOptions:
    from quantpick.serve.command import ServerOptions

    return ServerOptions(host=host, port=port, alias=alias, api_key_env=api_key_env)


def _capabilities(machine: Machine, llama_server: Path | None) -> ServerCapabilities | None:
    """The installed llama-server's flags (PATH or --llama-server), or None: target current."""
    from quantpick.errors import UsageError
    from quantpick.machine.llamacpp import find_llama_server
    from quantpick.serve.flags import capabilities_for

    path = find_llama_server(llama_server)
    if path is None:
        if llama_server is not None:
            raise UsageError(f"--llama-server {llama_server}: not an executable")
        return None
    return capabilities_for(path)


def _emit_command(
    cmd: ServerCommand,
    *,
    fmt: str,
    script: Path | None,
    comment: str,
    json_doc: dict[str, Any] | None,
) -> None:
    from quantpick.cli import output
    from quantpick.errors import UsageError
    from quantpick.serve.command import (
        render_env,
        render_json,
        render_line,
        render_script,
        write_script,
    )

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: use one of " + ", ".join(FORMATS))
    for warning in cmd.warnings:
        output.warn(warning)
    if script is not None:
        write_script(script, render_script(cmd, comment))
        output.note(f"Wrote {script}")
    if json_doc is not None:
        output.print_json(
            {**json_doc, "command": render_json(cmd), "script": str(script) if script else None}
        )
        return
    if fmt == "json":
        output.print_json({"command": render_json(cmd)})
    elif fmt == "script":
        sys.stdout.write(render_script(cmd, comment))
    elif fmt == "env":
        sys.stdout.write(render_env(cmd))
    elif script is None:
        sys.stdout.write(render_line(cmd) + "\n")


def _plan_comment(p: Plan, machine: Machine) -> str:
    where = machine.source if machine.described else "this machine (probed)"
    gpus = ", ".join(d.name for d in p.estimate.gpus) or "no GPU"
    return (
        f"quantpick plan: {p.model} {p.quant}, KV {p.config.cache_type_k}/{p.config.cache_type_v}, "
        f"-c {p.config.ctx_size}, {p.placement} on {gpus} ({where}); decode upper bound "
        f"{p.speed.tokens_per_s_empty:.0f} tok/s empty, {p.speed.tokens_per_s_target:.0f} at "
        f"{p.speed.target_context} tokens"
    )


@app.command("command")
def command_cmd(
    model: ModelArg = None,
    quant: QuantOpt = None,
    gguf: GgufOpt = None,
    mmproj: Annotated[
        Path | None,
        typer.Option("--mmproj", help="Projector file for --gguf with --vision.", dir_okay=False),
    ] = None,  # noqa: UP045
    ctx_size: CtxOpt = 0,
    parallel: NpOpt = 1,
    kv_unified: KvuOpt = False,
    prefer: PreferOpt = "quality",
    vision: VisionOpt = False,
    min_tps: MinTpsOpt = 10.0,
    allow_q4_kv: AllowQ4Opt = False,
    kv: KvOpt = None,
    no_offload: NoOffloadOpt = False,
    dir_: DirOpt = None,
    hardware: HardwareOpt = None,
    gpu: GpuOpt = None,
    ram: RamOpt = None,
    cpu_only: CpuOnlyOpt = False,
    llama_server: LlamaServerOpt = None,
    llama_bin: LlamaBinOpt = None,
    no_confirm: NoConfirmOpt = False,
    gpu_overhead: GpuOverheadOpt = None,
    margin: MarginOpt = None,
    ram_bandwidth: RamBandwidthOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8080,
    alias: AliasOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    fmt: FormatOpt = "line",
    script: ScriptOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Plan for a GGUF already on disk and print the llama-server command that runs it
    (confirmed by llama.cpp's llama-fit-params when it is installed)."""
    from quantpick.cli.confirm import confirmation_to_dict, report_confirmation
    from quantpick.cli.local import resolve_local
    from quantpick.cli.render import plan_to_dict
    from quantpick.plan.planner import plan
    from quantpick.serve.command import build_command

    machine = machine_from_cli(hardware, gpu, ram, cpu_only, llama_server, ram_bandwidth)
    local = resolve_local(model, quant, gguf, mmproj, dir_, vision)
    manifest, q, model_path = local.manifest, local.quant, local.model_path
    projector = local.projector
    request = plan_request(
        ctx_size,
        parallel,
        kv_unified,
        prefer,
        q,
        vision,
        min_tps,
        allow_q4_kv,
        kv,
        512,
        2048,
        "on",
        no_offload,
    )
    request, overheads, _ = apply_local_tuning(
        request,
        overheads_from_cli(gpu_overhead, margin),
        machine,
        llama_server,
        gpu_overhead=gpu_overhead,
    )
    p = plan(manifest, machine, lambda _q: local.layout, request, overheads=overheads)
    confirmation = None
    options = confirm_options(no_confirm, llama_bin, llama_server, machine)
    if options is not None:
        from quantpick.pipeline import confirm_local_plan

        confirmation = confirm_local_plan(
            p, manifest, model_path, machine, request, overheads, options
        )
        p = confirmation.plan
    report_confirmation(confirmation, machine, no_confirm, quiet=json_)
    caps = _capabilities(machine, llama_server)
    cmd = build_command(
        p.config,
        model_path=model_path,
        mmproj_path=projector,
        manifest=manifest,
        block_count=manifest.architecture.block_count,
        server=_server_options(host, port, alias, api_key_env),
        capabilities=caps,
    )
    doc = None
    if json_:
        doc = {
            "plan": plan_to_dict(p, machine, manifest.architecture.block_count),
            "confirmation": confirmation_to_dict(confirmation),
        }
    _emit_command(cmd, fmt=fmt, script=script, comment=_plan_comment(p, machine), json_doc=doc)


@app.command("get")
def get_cmd(
    model: ModelArg = None,
    ctx_size: CtxOpt = 0,
    quant: QuantOpt = None,
    parallel: NpOpt = 1,
    kv_unified: KvuOpt = False,
    prefer: PreferOpt = "quality",
    vision: VisionOpt = False,
    min_tps: MinTpsOpt = 10.0,
    allow_q4_kv: AllowQ4Opt = False,
    kv: KvOpt = None,
    no_offload: NoOffloadOpt = False,
    dir_: DirOpt = None,
    source: Annotated[
        str, typer.Option("--source", help="auto, hf, modelscope or mirror.")
    ] = "auto",
    allow_unverified: Annotated[
        bool, typer.Option("--allow-unverified", help="Download files no sha256 vouches for.")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Stop before downloading: plan, bytes, source, command."),
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-Q", help="No progress on stderr.")] = False,
    hardware: HardwareOpt = None,
    gpu: GpuOpt = None,
    ram: RamOpt = None,
    cpu_only: CpuOnlyOpt = False,
    llama_server: LlamaServerOpt = None,
    llama_bin: LlamaBinOpt = None,
    no_confirm: NoConfirmOpt = False,
    gpu_overhead: GpuOverheadOpt = None,
    margin: MarginOpt = None,
    ram_bandwidth: RamBandwidthOpt = None,
    exact: ExactOpt = False,
    no_network: NoNetworkOpt = False,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8080,
    alias: AliasOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    fmt: FormatOpt = "line",
    script: ScriptOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Pick, download + verify, and print (or --script) the llama-server command: the whole job."""
    from quantpick.cli import output
    from quantpick.cli.confirm import confirmation_to_dict, report_confirmation
    from quantpick.cli.download import _progress
    from quantpick.cli.download import plan_to_dict as fetch_plan_to_dict
    from quantpick.cli.render import plan_to_dict
    from quantpick.config import load_settings
    from quantpick.errors import UsageError
    from quantpick.pipeline import GetRequest, get
    from quantpick.serve.command import build_command

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: use one of " + ", ".join(FORMATS))
    settings = load_settings()
    manifest = load_manifest(model)
    machine = machine_from_cli(hardware, gpu, ram, cpu_only, llama_server, ram_bandwidth)
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
        512,
        2048,
        "on",
        no_offload,
    )
    request, overheads, _ = apply_local_tuning(
        request,
        overheads_from_cli(gpu_overhead, margin),
        machine,
        llama_server,
        gpu_overhead=gpu_overhead,
    )

    def announce(p: Plan) -> None:
        if not (json_ or quiet):
            output.note(
                f"Plan: {p.model} {p.quant} (KV {p.config.cache_type_k}, {p.placement}) for "
                f"-c {p.config.ctx_size}; decode upper bound {p.speed.tokens_per_s_target:.0f} "
                f"tok/s at that context"
            )

    progress, live = _progress(quiet or json_)
    result = get(
        GetRequest(
            manifest=manifest,
            machine=machine,
            plan_request=request,
            overheads=overheads,
            dest_dir=dir_ or settings.models_dir / manifest.id,
            exact=exact,
            network=not no_network,
            source=source,
            allow_unverified=allow_unverified,
            dry_run=dry_run,
            confirm=confirm_options(no_confirm, llama_bin, llama_server, machine),
        ),
        settings=settings,
        progress=progress,
        on_plan=announce,
        live=live,
    )
    for warning in result.warnings:
        output.warn(warning)
    if not dry_run:
        report_confirmation(result.confirmation, machine, no_confirm, quiet=quiet or json_)
    p, report, files = result.plan, result.report, result.files
    model_path, mmproj_path = result.model_path, result.mmproj_path
    caps = _capabilities(machine, llama_server)
    cmd = build_command(
        p.config,
        model_path=model_path,
        mmproj_path=mmproj_path,
        manifest=manifest,
        block_count=manifest.architecture.block_count,
        server=_server_options(host, port, alias, api_key_env),
        capabilities=caps,
    )
    doc = None
    if json_:
        doc = {
            "plan": plan_to_dict(p, machine, manifest.architecture.block_count),
            "dry_run": dry_run,
            "fetch": fetch_plan_to_dict(report.plan) if report is not None else None,
            "files": files,
            "confirmation": confirmation_to_dict(result.confirmation),
        }
    elif dry_run and report is not None:
        fp = report.plan
        from quantpick.units import human

        output.note(
            f"Would fetch {human(fp.bytes_to_fetch)} from {fp.source} into {fp.dest_dir} "
            f"({human(fp.free_bytes)} free: {'enough' if fp.enough_space else 'NOT enough'})"
        )
        for f in fp.files:
            output.note(
                f"  {f.name}: {f.state}, sha256 from {', '.join(f.sha256_from) or 'nowhere'}"
            )
    _emit_command(
        cmd,
        fmt=fmt,
        script=None if dry_run else script,
        comment=_plan_comment(p, machine),
        json_doc=doc,
    )
