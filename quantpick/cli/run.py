"""`quantpick command` and `quantpick get`: the ready-to-run llama-server command, and the whole
pipeline (probe -> pick -> download + verify -> command) in one step.

Usage:
    quantpick get qwen3.8-35b-a3b-distill -c 262144
    quantpick get qwen3.8-35b-a3b-distill -c 65536 --format systemd > llama.service
    quantpick command qwen3.8-35b-a3b-distill -q Q4_K_M -c 32768 --model-source hf
    quantpick get qwen3.8-35b-a3b-distill -c 131072 --gpu 3090 --gpu t4 --dry-run --json
    quantpick get qwen3.8-35b-a3b-distill -c 65536 --script ~/bin/serve-qwen
    quantpick command --gguf ./Qwen3.8-35B-A3B-Q4_K_M.gguf -c 65536
    quantpick get qwen3.8-35b-a3b-distill -c 131072 --rpc 192.168.1.20:50052 --script ~/bin/serve
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from quantpick.cli.complete import FORMATS, MODEL_SOURCES
from quantpick.cli.core import app
from quantpick.cli.download import (
    AllowUnverifiedOpt,
    ConnectionsOpt,
    HfCacheOpt,
    ReuseFromOpt,
    ReuseOpt,
    SourceOpt,
)
from quantpick.cli.ecosystem import (
    ECOSYSTEM_FORMATS,
    ModelfileOpt,
    PresetOpt,
    SwapConfigOpt,
    TtlOpt,
)
from quantpick.cli.options import (
    DEFAULT_MIN_TPS,
    AllowQ4Opt,
    BackendOpt,
    CoresOpt,
    CpuOnlyOpt,
    CtxOpt,
    ExactOpt,
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
    MmprojOpt,
    ModelArg,
    ModelDirOpt,
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
    RpcBindOpt,
    RpcCacheOpt,
    RpcDeviceOpt,
    RpcLatencyOpt,
    RpcOpt,
    SpecOpt,
    ThreadsOpt,
    TimeoutOpt,
    VisionOpt,
    confirm_options,
    load_manifest,
    machine_from_cli,
    overheads_from_cli,
    plan_request,
    tool_timeout,
)

if TYPE_CHECKING:
    from quantpick.cli.ecosystem import EcosystemOptions
    from quantpick.machine.spec import Machine
    from quantpick.model.manifest import Manifest
    from quantpick.plan.memory import Overheads
    from quantpick.plan.planner import Plan
    from quantpick.serve.command import ServerCommand, ServerOptions, WorkerCommand
    from quantpick.serve.ecosystem import Target
    from quantpick.serve.flags import ServerCapabilities


FormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        help="line (default), script, json, env (LLAMA_ARG_*), systemd (a user unit), "
        "compose (docker compose, official llama.cpp image), preset (a llama.cpp router INI "
        "section, --preset FILE), llama-swap (a models entry), ollama (a Modelfile) or "
        "lmstudio (links the file into LM Studio's models folder).",
        autocompletion=lambda: list(FORMATS),
    ),
]
ModelSourceOpt = Annotated[
    str,
    typer.Option(
        "--model-source",
        help="local (default): the file on disk, -m PATH; hf: llama-server fetches it itself "
        "(-hf REPO:QUANT into its Hugging Face cache; no sha256 check, no pinned revision).",
        autocompletion=lambda: list(MODEL_SOURCES),
    ),
]
ScriptOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--script",
        help="Write an executable launch script here (atomic, mode 0755).",
        dir_okay=False,
    ),
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Let --script and --modelfile replace a file quantpick did not write (or edited "
        "since), --preset and --swap-config a section or entry of the same name written by "
        "hand, and any of them a symlink (the link itself; the old file is kept as a backup; "
        "never a device, FIFO or directory).",
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


def _server_options(
    host: str, port: int, alias: str | None, api_key_env: str | None
) -> ServerOptions:
    from quantpick.errors import UsageError
    from quantpick.serve.command import ServerOptions

    if not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: use 1-65535")
    return ServerOptions(host=host, port=port, alias=alias, api_key_env=api_key_env)


def _capabilities(
    machine: Machine, llama_server: Path | None, timeout_s: float | None = None
) -> ServerCapabilities | None:
    """The installed llama-server's flags (--llama-server, PATH, or quantpick's own build
    cache), or None: the command targets current llama.cpp, and a warning says plainly that no
    llama-server was found. `timeout_s`: how long its --help may take (--timeout)."""
    from quantpick.cli import output
    from quantpick.errors import UsageError
    from quantpick.machine.llamacpp import find_llama_server, not_found_message
    from quantpick.serve.flags import capabilities_for

    path = find_llama_server(llama_server)
    if path is None:
        if llama_server is not None:
            raise UsageError(f"--llama-server {llama_server}: not an executable")
        # (build_command's own "no llama-server was checked" warning says less: _emit_command
        # leaves it out after this one)
        output.warn(
            f"{not_found_message()}: the command targets current llama.cpp and runs "
            "`llama-server` from PATH when it starts; "
            "install llama.cpp, run scripts/build-llamacpp.sh, or give --llama-server PATH"
        )
        return None
    if timeout_s is None:
        return capabilities_for(path)
    return capabilities_for(path, timeout_s=timeout_s)


def _worker_commands(
    p: Plan, machine: Machine, bind: str | None, cache: bool
) -> tuple[WorkerCommand, ...]:
    """The ggml-rpc-server line of every worker the plan uses, in its --rpc order."""
    from dataclasses import replace

    from quantpick.machine.rpc import local_address_towards, resolve_ipv4
    from quantpick.serve.command import build_worker_commands

    by_endpoint = {w.endpoint: w for w in machine.rpc_workers}
    workers = []
    for endpoint in p.config.rpc_servers:
        w = by_endpoint[endpoint]
        # A described worker was never contacted: find its address and this machine's address
        # towards it here (a name lookup and a routing lookup; nothing is sent to it).
        address = w.address or resolve_ipv4(w.host)
        head = w.head_address or (local_address_towards(address, w.port) if address else None)
        workers.append(replace(w, address=address, head_address=head))
    weights: dict[str, int] = {}
    for d in p.estimate.devices:
        if d.endpoint is not None:
            weights[d.endpoint] = weights.get(d.endpoint, 0) + d.weights_bytes
    return build_worker_commands(tuple(workers), bind=bind, cache=cache, weights_bytes=weights)


def check_script_destination(script: Path | None, force: bool = False) -> None:
    """--script's directory must exist and be writable, and the path must be one quantpick may
    write (serve.command.check_script_target): checked before any download, so a typo costs
    nothing (the script itself is written atomically at the end)."""
    import os
    import shlex

    from quantpick.errors import UsageError

    if script is None:
        return
    parent = script.parent
    if script.is_dir() and not script.is_symlink():
        raise UsageError(f"--script {script}: is a directory", hint="give a file name")
    if not parent.is_dir():
        if parent.exists():
            raise UsageError(f"--script {script}: {parent} is not a directory")
        raise UsageError(
            f"--script {script}: no such directory {parent}",
            hint=f"create it first: mkdir -p {shlex.quote(str(parent))}",
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--script {script}: cannot write in {parent}")
    from quantpick.serve.command import check_script_target

    check_script_target(script, force=force)


def _check_format(fmt: str, model_source: str = "local") -> None:
    from quantpick.errors import UsageError

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: use one of " + ", ".join(FORMATS))
    if model_source not in MODEL_SOURCES:
        raise UsageError(f"--model-source {model_source}: use local or hf")


def _emit_command(
    cmd: ServerCommand,
    *,
    fmt: str,
    script: Path | None,
    comment: str,
    json_doc: dict[str, Any] | None,
    name: str,
    machine_gpus: tuple[int, ...] = (),
    workers: tuple[WorkerCommand, ...] = (),
    force: bool = False,
    ecosystem: tuple[Callable[[ServerCommand], Target], EcosystemOptions] | None = None,
) -> None:
    from quantpick.cli import output
    from quantpick.serve.command import (
        CURRENT_TARGET,
        SYSTEMD_UNIT_DIR,
        UNCHECKED_WARNING,
        render_compose,
        render_env,
        render_json,
        render_line,
        render_script,
        render_systemd,
        render_worker_json,
        render_worker_lines,
        systemd_unit_name,
        write_script,
    )

    _check_format(fmt)
    for warning in cmd.warnings:
        if cmd.target == CURRENT_TARGET and warning.startswith(UNCHECKED_WARNING):
            continue  # _capabilities said plainly that no llama-server was found
        output.warn(warning)
    for w in workers:
        for warning in w.warnings:
            output.warn(warning)
        for note in w.notes:
            output.note(f"Note: {note}")
    if workers:
        output.note(
            "Note: start the RPC workers before llama-server; each serves one client, so "
            "`quantpick probe --rpc` cannot read a worker while llama-server is connected to it"
        )
    worker_docs = [render_worker_json(w) for w in workers]
    if script is not None:
        write_script(script, render_script(cmd, comment, workers), force=force)
        output.note(f"Wrote {script}")
    text: str | None = None
    if ecosystem is not None and fmt in ECOSYSTEM_FORMATS:
        from quantpick.cli.ecosystem import emit_ecosystem

        make_target, eco = ecosystem
        part = emit_ecosystem(fmt, cmd, make_target(cmd), eco, json_doc=json_doc)
        if json_doc is not None:
            output.print_json({**json_doc, "command": render_json(cmd), "workers": worker_docs,
                               "script": str(script) if script else None,
                               "rendered": {"format": fmt, **part}})  # fmt: skip
        return
    if fmt == "script":
        text = render_script(cmd, comment, workers)
    elif fmt == "env":
        # Environment files hold the head's settings; the workers' lines stay comments.
        lines = render_worker_lines(workers).splitlines()
        text = "".join((x if x.startswith("#") else f"# {x}") + "\n" for x in lines)
        text += render_env(cmd)
    elif fmt == "systemd":
        text = render_systemd(cmd, comment, name)
        unit = systemd_unit_name(name)
        output.note(
            f"Install: save it as {SYSTEMD_UNIT_DIR}/{unit}.service (mkdir -p "
            f"{SYSTEMD_UNIT_DIR}), then: systemctl --user daemon-reload && "
            f"systemctl --user enable --now {unit}.service"
        )
    elif fmt == "compose":
        text = render_compose(cmd, comment, machine_gpus)
        output.note("Run: save it as compose.yaml, then: docker compose up -d")
    if workers and fmt in ("systemd", "compose"):
        output.note("The RPC workers run elsewhere; their lines:\n" + render_worker_lines(workers))
    if json_doc is not None:
        doc = {
            **json_doc,
            "command": render_json(cmd),
            "workers": worker_docs,
            "script": str(script) if script else None,
        }
        if text is not None:
            doc["rendered"] = {"format": fmt, "text": text}
        output.print_json(doc)
        return
    if fmt == "json":
        output.print_json({"command": render_json(cmd), "workers": worker_docs})
    elif text is not None:
        sys.stdout.write(text)
    elif script is None:
        if workers:
            sys.stdout.write(render_worker_lines(workers) + "# then, on this machine:\n")
        sys.stdout.write(render_line(cmd) + "\n")
    else:
        # --script wrote the head's launcher; the workers' lines run elsewhere.
        sys.stdout.write(render_worker_lines(workers))


def _plan_comment(p: Plan, machine: Machine) -> str:
    where = machine.source if machine.described else "this machine (probed)"
    gpus = ", ".join(d.name for d in p.estimate.gpus if d.endpoint is None) or "no GPU"
    if p.config.rpc_servers:
        gpus += " + RPC workers " + ", ".join(p.config.rpc_servers)
    e = p.speed.expected
    assert e is not None  # every plan carries its expected speed
    return (
        f"quantpick plan: {p.model} {p.quant}, KV {p.config.cache_type_k}/{p.config.cache_type_v}, "
        f"-c {p.config.ctx_size}, {p.placement} on {gpus} ({where}); expected decode "
        f"~{e.decode_tps_empty:.0f} tok/s empty, ~{e.decode_tps_target:.0f} at "
        f"{p.speed.target_context} tokens (bound {p.speed.tokens_per_s_empty:.0f}); {p.why}"
        + (f"; speeds {p.calibration.label}" if p.calibration is not None else "")
    )


@app.command("command")
def command_cmd(
    model: ModelArg = None,
    quant: QuantOpt = None,
    gguf: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--gguf",
            help="A GGUF on disk: the plan uses its own header. With MODEL too, the file still "
            "wins; MODEL adds its sampling, reasoning format and alias.",
            dir_okay=False,
        ),
    ] = None,
    mmproj: MmprojOpt = None,
    ctx_size: CtxOpt = 0,
    parallel: NpOpt = 1,
    kv_unified: KvuOpt = False,
    prefer: PreferOpt = "balanced",
    vision: VisionOpt = False,
    min_tps: MinTpsOpt = DEFAULT_MIN_TPS,
    spec: SpecOpt = "auto",
    allow_q4_kv: AllowQ4Opt = False,
    kv: KvOpt = None,
    no_offload: NoOffloadOpt = False,
    dir_: ModelDirOpt = None,
    hardware: HardwareOpt = None,
    gpu: GpuOpt = None,
    ram: RamOpt = None,
    cpu_only: CpuOnlyOpt = False,
    llama_server: LlamaServerOpt = None,
    llama_bin: LlamaBinOpt = None,
    no_confirm: NoConfirmOpt = False,
    no_calibration: NoCalibrationOpt = False,
    timeout: TimeoutOpt = None,
    gpu_overhead: GpuOverheadOpt = None,
    margin: MarginOpt = None,
    ram_reserve: RamReserveOpt = None,
    gpu_reserve: GpuReserveOpt = None,
    ram_bandwidth: RamBandwidthOpt = None,
    backend: BackendOpt = None,
    cores: CoresOpt = None,
    threads: ThreadsOpt = None,
    rpc: RpcOpt = None,
    rpc_device: RpcDeviceOpt = None,
    rpc_bandwidth: RpcBandwidthOpt = None,
    rpc_latency: RpcLatencyOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8080,
    alias: AliasOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    rpc_bind: RpcBindOpt = None,
    rpc_cache: RpcCacheOpt = True,
    fmt: FormatOpt = "line",
    model_source: ModelSourceOpt = "local",
    exact: ExactOpt = False,
    no_network: NoNetworkOpt = False,
    script: ScriptOpt = None,
    force: ForceOpt = False,
    preset: PresetOpt = None,
    swap_config: SwapConfigOpt = None,
    modelfile: ModelfileOpt = None,
    ttl: TtlOpt = 900,
    json_: JsonOpt = False,
) -> None:
    """Plan for a GGUF already on disk (or, with --model-source hf, one llama-server fetches
    itself) and print the llama-server command that runs it (confirmed by llama.cpp's
    llama-fit-params when it is installed)."""
    from quantpick.cli import output
    from quantpick.cli.confirm import confirmation_to_dict, report_confirmation
    from quantpick.cli.local import canonical_quant, resolve_local
    from quantpick.cli.render import plan_to_dict
    from quantpick.errors import UsageError
    from quantpick.machine.backends import local_backend
    from quantpick.serve.command import build_command

    _check_format(fmt, model_source)
    check_script_destination(script, force)
    eco = _ecosystem_options(fmt, preset, swap_config, modelfile, ttl, host, port, False, force)
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
        backend_name=backend,
    )
    if model_source == "hf":
        if gguf is not None:
            raise UsageError("--model-source hf plans a repository file, not --gguf")
        manifest = load_manifest(model, network=not no_network)
        if not quant:
            raise UsageError("give --quant Q", hint=f"`quantpick get {manifest.id} -c N "
                             "--model-source hf` picks one")  # fmt: skip
        q = canonical_quant(manifest, quant)
        request = plan_request(ctx_size, parallel, kv_unified, prefer, q, vision, min_tps,
                               allow_q4_kv, kv, 512, 2048, "on", no_offload, spec)  # fmt: skip
        overheads = overheads_from_cli(gpu_overhead, margin, ram_reserve, gpu_reserve)
        p = _plan_from_hub(manifest, machine, request, overheads, exact, no_network,
                           llama_server, gpu_overhead is not None,
                           calibration=not no_calibration)  # fmt: skip
        _emit_hf(p, manifest, machine, llama_server, (host, port, alias, api_key_env),
                 fmt=fmt, script=script, json_doc={} if json_ else None,
                 timeout_s=tool_timeout(timeout), force=force, eco=eco)  # fmt: skip
        return
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
        spec,
    )
    from quantpick.pipeline import PlanInputs, plan_for

    planned = plan_for(
        PlanInputs(
            manifest, machine, request,
            overheads_from_cli(gpu_overhead, margin, ram_reserve, gpu_reserve),
            llama_server=llama_server, gpu_overhead_given=gpu_overhead is not None,
            calibration=not no_calibration,
            local=local.layout,
        )
    )  # fmt: skip
    for line in planned.notes:
        output.note(f"Note: {line}")
    p, request, overheads = planned.plan, planned.inputs.request, planned.inputs.overheads
    confirmation = None
    options = confirm_options(no_confirm, llama_bin, llama_server, machine, timeout)
    if options is not None:
        from quantpick.pipeline import confirm_local_plan

        confirmation = confirm_local_plan(
            p, manifest, model_path, machine, request, overheads, options
        )
        p = confirmation.plan
    report_confirmation(confirmation, machine, no_confirm, quiet=json_)
    caps = _capabilities(machine, llama_server, tool_timeout(timeout))
    cmd = build_command(
        p.config,
        model_path=model_path,
        mmproj_path=projector,
        manifest=manifest,
        block_count=manifest.architecture.block_count,
        server=_server_options(host, port, alias, api_key_env),
        capabilities=caps,
        backend=local_backend(machine.gpus),
    )
    doc = None
    if json_:
        doc = {
            "plan": plan_to_dict(p, machine, manifest.architecture.block_count),
            "confirmation": confirmation_to_dict(confirmation),
        }
    _emit_command(
        cmd,
        fmt=fmt,
        script=script,
        comment=_plan_comment(p, machine),
        json_doc=doc,
        workers=_worker_commands(p, machine, rpc_bind, rpc_cache),
        name=alias or manifest.id,
        machine_gpus=tuple(g.index for g in machine.usable_gpus),
        force=force,
        ecosystem=_ecosystem(fmt, eco, p, machine, manifest, model_path, projector, alias),
    )


def _ecosystem_options(
    fmt: str,
    preset: Path | None,
    swap_config: Path | None,
    modelfile: Path | None,
    ttl: int,
    host: str,
    port: int,
    dry_run: bool,
    force: bool = False,
) -> EcosystemOptions:
    """The ecosystem formats' options, checked before any planning or transfer."""
    from quantpick.cli.ecosystem import EcosystemOptions, check_ecosystem_options

    eco = EcosystemOptions(preset, swap_config, modelfile, ttl, dry_run, host, port, force)
    check_ecosystem_options(fmt, eco)
    return eco


def _ecosystem(
    fmt: str,
    eco: EcosystemOptions,
    p: Plan,
    machine: Machine,
    manifest: Manifest,
    model_path: Path | None,
    mmproj_path: Path | None,
    alias: str | None,
) -> tuple[Callable[[ServerCommand], Target], EcosystemOptions] | None:
    """What `_emit_command` needs for --format preset / llama-swap / ollama / lmstudio."""
    if fmt not in ECOSYSTEM_FORMATS:
        return None
    from quantpick.cli.ecosystem import ecosystem_target

    name = alias or manifest.id
    if fmt == "preset" and alias is None:
        from quantpick.cli import output
        from quantpick.serve.ecosystem import preset_section_name

        name = preset_section_name(manifest.id)
        if name != manifest.id:
            output.note(
                f"Note: preset section [{name}], derived from the model name {manifest.id!r} "
                "(a section name is letters, digits and . _ - / @ +; --alias NAME sets another)"
            )

    def make(cmd: ServerCommand) -> Target:
        return ecosystem_target(p, machine, manifest, model_path, mmproj_path,
                                name, _plan_comment(p, machine), cmd,
                                with_template=fmt == "ollama")  # fmt: skip

    return make, eco


def _plan_from_hub(
    manifest: Manifest,
    machine: Machine,
    request: Any,
    overheads: Overheads,
    exact: bool,
    no_network: bool,
    llama_server: Path | None,
    gpu_overhead_given: bool,
    *,
    calibration: bool = True,
) -> Plan:
    """The plan for a file that stays on the hub: on its exact header when it can be read (cache
    or a few range requests), else on the manifest, through the recipe `pick` uses."""
    from quantpick.cli import output
    from quantpick.pipeline import PlanInputs, plan_for

    result = plan_for(
        PlanInputs(
            manifest, machine, request, overheads, llama_server=llama_server,
            gpu_overhead_given=gpu_overhead_given, exact=exact, network=not no_network,
            calibration=calibration,
        )
    )  # fmt: skip
    for line in result.notes:
        output.note(f"Note: {line}")
    return result.plan


def _emit_hf(
    p: Plan,
    manifest: Manifest,
    machine: Machine,
    llama_server: Path | None,
    server: tuple[str, int, str | None, str | None],
    *,
    fmt: str,
    script: Path | None,
    json_doc: dict[str, Any] | None,
    timeout_s: float | None = None,
    force: bool = False,
    eco: EcosystemOptions | None = None,
) -> None:
    """The command for `-hf REPO:QUANT`: llama-server downloads the file into its HF cache."""
    from quantpick.cli.render import plan_to_dict
    from quantpick.machine.backends import local_backend
    from quantpick.serve.command import build_command, hf_model

    host, port, alias, api_key_env = server
    cmd = build_command(
        p.config,
        model_path=None,
        mmproj_path=None,
        manifest=manifest,
        block_count=manifest.architecture.block_count,
        server=_server_options(host, port, alias, api_key_env),
        capabilities=_capabilities(machine, llama_server, timeout_s),
        hf=hf_model(manifest, p.quant),
        backend=local_backend(machine.gpus),
    )
    doc = None
    if json_doc is not None:
        doc = {**json_doc, "plan": plan_to_dict(p, machine, manifest.architecture.block_count),
               "model_source": "hf"}  # fmt: skip
    if fmt in ("ollama", "lmstudio"):
        from quantpick.errors import UsageError

        raise UsageError(f"--format {fmt} needs the file on disk, not --model-source hf",
                         hint="drop --model-source hf: `quantpick get` downloads it")  # fmt: skip
    _emit_command(cmd, fmt=fmt, script=script, comment=_plan_comment(p, machine), json_doc=doc,
                  name=alias or manifest.id, force=force,
                  machine_gpus=tuple(g.index for g in machine.usable_gpus),
                  ecosystem=_ecosystem(fmt, eco, p, machine, manifest, None, None, alias)
                  if eco is not None else None)  # fmt: skip


def _files_in_place(
    manifest: Manifest, quant: str, vision: bool, dest: Path
) -> list[dict[str, Any]]:
    """For a dry run that contacted no hub: which planned files are already in `dest` (by name
    and size; their hashes are checked when a real run uses them)."""
    wanted = list(manifest.quant_files(quant))
    if vision and manifest.projector is not None:
        wanted.append(manifest.projector)
    out = []
    for f in wanted:
        path = dest / f.name
        present = path.is_file() and (not f.size_exact or path.stat().st_size == f.size_bytes)
        out.append({"name": f.name, "path": str(path), "present": present})
    return out


@app.command("get")
def get_cmd(
    model: ModelArg = None,
    ctx_size: CtxOpt = 0,
    quant: QuantOpt = None,
    parallel: NpOpt = 1,
    kv_unified: KvuOpt = False,
    prefer: PreferOpt = "balanced",
    vision: VisionOpt = False,
    min_tps: MinTpsOpt = DEFAULT_MIN_TPS,
    spec: SpecOpt = "auto",
    allow_q4_kv: AllowQ4Opt = False,
    kv: KvOpt = None,
    no_offload: NoOffloadOpt = False,
    dir_: ModelDirOpt = None,
    source: SourceOpt = "auto",
    allow_unverified: AllowUnverifiedOpt = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Stop before downloading: plan, bytes, source, command."),
    ] = False,
    reuse: ReuseOpt = None,
    reuse_from: ReuseFromOpt = None,
    hf_cache: HfCacheOpt = None,
    connections: ConnectionsOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-Q", help="No progress on stderr.")] = False,
    hardware: HardwareOpt = None,
    gpu: GpuOpt = None,
    ram: RamOpt = None,
    cpu_only: CpuOnlyOpt = False,
    llama_server: LlamaServerOpt = None,
    llama_bin: LlamaBinOpt = None,
    no_confirm: NoConfirmOpt = False,
    no_calibration: NoCalibrationOpt = False,
    timeout: TimeoutOpt = None,
    gpu_overhead: GpuOverheadOpt = None,
    margin: MarginOpt = None,
    ram_reserve: RamReserveOpt = None,
    gpu_reserve: GpuReserveOpt = None,
    ram_bandwidth: RamBandwidthOpt = None,
    backend: BackendOpt = None,
    cores: CoresOpt = None,
    threads: ThreadsOpt = None,
    rpc: RpcOpt = None,
    rpc_device: RpcDeviceOpt = None,
    rpc_bandwidth: RpcBandwidthOpt = None,
    rpc_latency: RpcLatencyOpt = None,
    exact: ExactOpt = False,
    no_network: NoNetworkOpt = False,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8080,
    alias: AliasOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    rpc_bind: RpcBindOpt = None,
    rpc_cache: RpcCacheOpt = True,
    fmt: FormatOpt = "line",
    model_source: ModelSourceOpt = "local",
    script: ScriptOpt = None,
    force: ForceOpt = False,
    preset: PresetOpt = None,
    swap_config: SwapConfigOpt = None,
    modelfile: ModelfileOpt = None,
    ttl: TtlOpt = 900,
    json_: JsonOpt = False,
) -> None:
    """Pick, download + verify, and print (or --script) the llama-server command: the whole job."""
    from quantpick.cli import output
    from quantpick.cli.confirm import confirmation_to_dict, report_confirmation
    from quantpick.cli.download import _progress, reuse_lines
    from quantpick.cli.download import plan_to_dict as fetch_plan_to_dict
    from quantpick.cli.render import plan_to_dict
    from quantpick.config import load_settings, with_fetch_flags
    from quantpick.machine.backends import local_backend
    from quantpick.pipeline import GetRequest, get
    from quantpick.serve.command import build_command

    _check_format(fmt, model_source)
    check_script_destination(script, force)
    eco = _ecosystem_options(fmt, preset, swap_config, modelfile, ttl, host, port, dry_run, force)
    settings = with_fetch_flags(
        load_settings(),
        reuse=reuse,
        reuse_from=reuse_from,
        hf_cache=hf_cache,
        connections=connections,
    )
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
        backend_name=backend,
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
        512,
        2048,
        "on",
        no_offload,
        spec,
    )
    if model_source == "hf":
        # llama-server fetches the file itself: plan (on the hub's header), nothing to download.
        overheads = overheads_from_cli(gpu_overhead, margin, ram_reserve, gpu_reserve)
        p = _plan_from_hub(manifest, machine, request, overheads, exact, no_network,
                           llama_server, gpu_overhead is not None,
                           calibration=not no_calibration)  # fmt: skip
        if not (json_ or quiet):
            output.note(
                f"Plan: {p.model} {p.quant} (KV {p.config.cache_type_k}, {p.placement}) for "
                f"-c {p.config.ctx_size}; llama-server downloads it on first start (-hf)"
            )
        _emit_hf(
            p,
            manifest,
            machine,
            llama_server,
            (host, port, alias, api_key_env),
            fmt=fmt,
            script=None if dry_run else script,
            json_doc={"dry_run": dry_run, "fetch": None, "files": None} if json_ else None,
            timeout_s=tool_timeout(timeout),
            force=force,
            eco=eco,
        )
        return  # fmt: skip
    overheads = overheads_from_cli(gpu_overhead, margin, ram_reserve, gpu_reserve)

    def announce(p: Plan) -> None:
        assert p.speed.expected is not None  # every plan carries its expected speed
        if not (json_ or quiet):
            output.note(
                f"Plan: {p.model} {p.quant} (KV {p.config.cache_type_k}, {p.placement}) for "
                f"-c {p.config.ctx_size}; expected ~{p.speed.expected.decode_tps_target:.0f} tok/s "
                f"decode at that context. Why: {p.why}"
            )

    progress, live = _progress(quiet or json_)
    result = get(
        GetRequest(
            manifest=manifest,
            machine=machine,
            plan_request=request,
            overheads=overheads,
            dest_dir=dir_,
            exact=exact,
            network=not no_network,
            source=source,
            allow_unverified=allow_unverified,
            dry_run=dry_run,
            confirm=confirm_options(no_confirm, llama_bin, llama_server, machine, timeout),
            llama_server=llama_server,
            gpu_overhead_given=gpu_overhead is not None,
            calibration=not no_calibration,
        ),
        settings=settings,
        progress=progress,
        on_plan=announce,
        live=live,
    )
    for line in (*(result.tuning.notes if result.tuning is not None else ()),
                 *result.contradictions):  # fmt: skip
        output.note(f"Note: {line}")
    for warning in result.warnings:
        output.warn(warning)
    if not dry_run:
        report_confirmation(result.confirmation, machine, no_confirm, quiet=quiet or json_)
    p, report, files = result.plan, result.report, result.files
    model_path, mmproj_path = result.model_path, result.mmproj_path
    caps = _capabilities(machine, llama_server, tool_timeout(timeout))
    cmd = build_command(
        p.config,
        model_path=model_path,
        mmproj_path=mmproj_path,
        manifest=manifest,
        block_count=manifest.architecture.block_count,
        server=_server_options(host, port, alias, api_key_env),
        capabilities=caps,
        backend=local_backend(machine.gpus),
    )
    dest = dir_ or settings.models_dir / manifest.id
    in_place = _files_in_place(manifest, p.quant, vision, dest) if dry_run and not report else []
    doc = None
    if json_:
        doc = {
            "plan": plan_to_dict(p, machine, manifest.architecture.block_count),
            "dry_run": dry_run,
            "fetch": fetch_plan_to_dict(report.plan) if report is not None else None,
            "files": files,
            "confirmation": confirmation_to_dict(result.confirmation),
        }
        if in_place:
            doc["in_place"] = in_place
    elif in_place:
        for f in in_place:
            where = "in place (checked against SHA256SUMS when used)" if f["present"] else "not in"
            output.note(f"  {f['name']}: {where} {dest if not f['present'] else ''}".rstrip())
    elif dry_run and report is not None:
        fp = report.plan
        from quantpick.units import human

        output.note(
            f"Would fetch {human(fp.bytes_to_fetch)} from {fp.source} into {fp.dest_dir} "
            f"({human(fp.free_bytes)} free: {'enough' if fp.enough_space else 'NOT enough'})"
        )
        for planned in fp.files:
            output.note(
                f"  {planned.name}: {planned.state}, sha256 from "
                f"{', '.join(planned.sha256_from) or 'nowhere'}"
            )
        for line in reuse_lines(fp):
            output.note(line)
    _emit_command(
        cmd,
        fmt=fmt,
        script=None if dry_run else script,
        comment=_plan_comment(p, machine),
        json_doc=doc,
        workers=_worker_commands(p, machine, rpc_bind, rpc_cache),
        name=alias or manifest.id,
        machine_gpus=tuple(g.index for g in machine.usable_gpus),
        force=force,
        ecosystem=_ecosystem(fmt, eco, p, machine, manifest, model_path, mmproj_path, alias),
    )
