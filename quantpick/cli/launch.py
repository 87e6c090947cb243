"""Writing the llama-server command a plan runs with: the installed llama-server's flags, the RPC
workers' lines, and the renderings (--format line, script, json, env, systemd, compose, and the
ecosystem formats: router preset, llama-swap, Ollama, LM Studio) on stdout or into --script.
Shared by `command` and `get`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.cli.complete import MODEL_SOURCES

if TYPE_CHECKING:
    from quantpick.cli.groups import LaunchOptions
    from quantpick.jobs.get import FetchWatch
    from quantpick.machine.spec import Machine
    from quantpick.model.manifest import Manifest
    from quantpick.plan.plan_types import Plan
    from quantpick.serve.command import ServerCommand
    from quantpick.serve.flags import ServerCapabilities
    from quantpick.serve.formats.base import EcosystemOptions, Emission, OutputFormat, Reporter
    from quantpick.serve.formats.target import Target
    from quantpick.serve.workers import WorkerCommand


def installed_capabilities(
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
        # (build_command's own "no llama-server was checked" warning says less: emit_command
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


def worker_commands(
    p: Plan, machine: Machine, bind: str | None, cache: bool
) -> tuple[WorkerCommand, ...]:
    """The ggml-rpc-server line of every worker the plan uses, in its --rpc order."""
    from dataclasses import replace

    from quantpick.machine.rpc import local_address_towards, resolve_ipv4
    from quantpick.serve.workers import build_worker_commands

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
    from quantpick.serve.script_file import check_script_target

    check_script_target(script, force=force)


def check_format(fmt: str, model_source: str = "local") -> None:
    from quantpick.errors import UsageError
    from quantpick.serve.formats import entry

    entry(fmt)  # an unknown format: "--format X: use one of ..."
    if model_source not in MODEL_SOURCES:
        raise UsageError(f"--model-source {model_source}: use local or hf")


def reporter() -> Reporter:
    """The formats' warnings and notes, on stderr."""
    from quantpick.cli import output
    from quantpick.serve.formats.base import Reporter

    return Reporter(warn=output.warn, note=output.note)


def emit_command(fmt: OutputFormat, job: Emission, *, json_doc: dict[str, Any] | None,
                 force: bool = False) -> None:  # fmt: skip
    """The command's warnings, --script, then the format's output: on stdout, or as the
    `rendered` part of the --json document."""
    from quantpick.cli import output
    from quantpick.serve.command import CURRENT_TARGET, UNCHECKED_WARNING
    from quantpick.serve.formats.json_doc import render_json
    from quantpick.serve.formats.script import render_script
    from quantpick.serve.script_file import write_script
    from quantpick.serve.workers import render_worker_json

    cmd, workers, script = job.cmd, job.workers, job.script
    for warning in cmd.warnings:
        if cmd.target == CURRENT_TARGET and warning.startswith(UNCHECKED_WARNING):
            continue  # installed_capabilities said plainly that no llama-server was found
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
    if script is not None:
        write_script(script, render_script(cmd, job.comment, workers), force=force)
        output.note(f"Wrote {script}")
    emitted = fmt.emit(job, reporter())
    if json_doc is not None:
        doc = {**json_doc, "command": render_json(cmd),
               "workers": [render_worker_json(w) for w in workers],
               "script": str(script) if script else None}  # fmt: skip
        if emitted.rendered is not None:
            doc["rendered"] = {"format": fmt.name, **emitted.rendered}
        output.print_json(doc)
    elif emitted.document is not None:
        output.print_json(emitted.document)
    else:
        sys.stdout.write(emitted.stdout)


def plan_comment(p: Plan, machine: Machine) -> str:
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


def target_maker(
    fmt: OutputFormat,
    p: Plan,
    machine: Machine,
    manifest: Manifest,
    model_path: Path | None,
    mmproj_path: Path | None,
    alias: str | None,
) -> Callable[[ServerCommand], Target] | None:
    """For a format that hands the plan to another tool: how its Target is made from the
    command (None for the others)."""
    if not fmt.uses_target:
        return None
    from quantpick.cli.ecosystem import ecosystem_target

    name = fmt.target_name(manifest.id, alias, reporter())

    def make(cmd: ServerCommand) -> Target:
        return ecosystem_target(p, machine, manifest, model_path, mmproj_path,
                                name, plan_comment(p, machine), cmd,
                                with_template=fmt.reads_template)  # fmt: skip

    return make


def files_in_place(
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


def checked_launch(launch: LaunchOptions, *, dry_run: bool = False) -> EcosystemOptions:
    """--format, --model-source, --script and the ecosystem files' options, checked before any
    planning or transfer, so a typo costs nothing."""
    check_format(launch.fmt, launch.model_source)
    check_script_destination(launch.script, launch.force)
    return launch.ecosystem(dry_run=dry_run)


def write_command(
    p: Plan,
    manifest: Manifest,
    machine: Machine,
    launch: LaunchOptions,
    *,
    capabilities: ServerCapabilities | None,
    model_path: Path | None,
    mmproj_path: Path | None = None,
    json_doc: dict[str, Any] | None,
    eco: EcosystemOptions,
    script: Path | None,
) -> None:
    """The llama-server command that runs `p`, written as --format says (`model_path` None:
    llama-server fetches the file itself, -hf REPO:QUANT; its RPC workers are not written)."""
    from quantpick.errors import UsageError
    from quantpick.machine.backends import local_backend
    from quantpick.serve.command import build_command
    from quantpick.serve.formats import output_format
    from quantpick.serve.formats.base import Emission
    from quantpick.serve.hf_tag import hf_model

    hf = hf_model(manifest, p.quant) if model_path is None else None
    cmd = build_command(
        p.config, model_path=model_path, mmproj_path=mmproj_path, manifest=manifest,
        block_count=manifest.architecture.block_count, server=launch.server(),
        capabilities=capabilities, hf=hf, backend=local_backend(machine.gpus),
    )  # fmt: skip
    fmt = output_format(launch.fmt)
    if hf is not None and fmt.needs_file:
        raise UsageError(f"--format {launch.fmt} needs the file on disk, not --model-source hf",
                         hint="drop --model-source hf: `quantpick get` downloads it")  # fmt: skip
    workers = () if hf else worker_commands(p, machine, launch.rpc_bind, launch.rpc_cache)
    target_of = target_maker(fmt, p, machine, manifest, model_path, mmproj_path, launch.alias)
    job = Emission(
        cmd, plan_comment(p, machine), launch.alias or manifest.id, workers,
        tuple(g.index for g in machine.usable_gpus), script, eco, target_of,
    )  # fmt: skip
    emit_command(fmt, job, json_doc=json_doc, force=launch.force)


def fetch_watch(silent: bool) -> FetchWatch:
    """How `get` and `serve` show their fetch on stderr: the transfer's progress and, once the
    quant is chosen, the plan's line (nothing when `silent`)."""
    from quantpick.cli import output
    from quantpick.cli.download import transfer_progress
    from quantpick.jobs.get import FetchWatch

    progress, live = transfer_progress(silent)
    announce = None if silent else (lambda p: output.note(announce_plan(p)))
    return FetchWatch(progress, announce, live)


def announce_plan(p: Plan, *, hf: bool = False) -> str:
    """The one line `get` and `serve` print once the quant is chosen, before any transfer."""
    head = (
        f"Plan: {p.model} {p.quant} (KV {p.config.cache_type_k}, {p.placement}) for "
        f"-c {p.config.ctx_size}"
    )
    if hf:
        return f"{head}; llama-server downloads it on first start (-hf)"
    assert p.speed.expected is not None  # every plan carries its expected speed
    return (
        f"{head}; expected ~{p.speed.expected.decode_tps_target:.0f} tok/s decode at that "
        f"context. Why: {p.why}"
    )
