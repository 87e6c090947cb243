"""Writing the llama-server command a plan runs with: the installed llama-server's flags, the RPC
workers' lines, and the renderings (--format line, script, json, env, systemd, compose, and the
ecosystem formats: router preset, llama-swap, Ollama, LM Studio) on stdout or into --script.
Shared by `command` and `get`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.cli.complete import FORMATS, MODEL_SOURCES
from quantpick.cli.ecosystem import ECOSYSTEM_FORMATS

if TYPE_CHECKING:
    from quantpick.cli.ecosystem import EcosystemOptions
    from quantpick.cli.groups import LaunchOptions
    from quantpick.machine.spec import Machine
    from quantpick.model.manifest import Manifest
    from quantpick.plan.plan_types import Plan
    from quantpick.serve.command import ServerCommand
    from quantpick.serve.ecosystem import Target
    from quantpick.serve.flags import ServerCapabilities
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

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: use one of " + ", ".join(FORMATS))
    if model_source not in MODEL_SOURCES:
        raise UsageError(f"--model-source {model_source}: use local or hf")


def emit_command(
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
    from quantpick.serve.command import CURRENT_TARGET, UNCHECKED_WARNING
    from quantpick.serve.formats import (
        SYSTEMD_UNIT_DIR,
        render_compose,
        render_env,
        render_json,
        render_line,
        render_script,
        render_systemd,
        systemd_unit_name,
    )
    from quantpick.serve.script_file import write_script
    from quantpick.serve.workers import render_worker_json, render_worker_lines

    check_format(fmt)
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


def ecosystem_for(
    fmt: str,
    eco: EcosystemOptions,
    p: Plan,
    machine: Machine,
    manifest: Manifest,
    model_path: Path | None,
    mmproj_path: Path | None,
    alias: str | None,
) -> tuple[Callable[[ServerCommand], Target], EcosystemOptions] | None:
    """What `emit_command` needs for --format preset / llama-swap / ollama / lmstudio."""
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
                                name, plan_comment(p, machine), cmd,
                                with_template=fmt == "ollama")  # fmt: skip

    return make, eco


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
    from quantpick.serve.hf_tag import hf_model

    hf = hf_model(manifest, p.quant) if model_path is None else None
    cmd = build_command(
        p.config, model_path=model_path, mmproj_path=mmproj_path, manifest=manifest,
        block_count=manifest.architecture.block_count, server=launch.server(),
        capabilities=capabilities, hf=hf, backend=local_backend(machine.gpus),
    )  # fmt: skip
    if hf is not None and launch.fmt in ("ollama", "lmstudio"):
        raise UsageError(f"--format {launch.fmt} needs the file on disk, not --model-source hf",
                         hint="drop --model-source hf: `quantpick get` downloads it")  # fmt: skip
    workers = () if hf else worker_commands(p, machine, launch.rpc_bind, launch.rpc_cache)
    emit_command(
        cmd, fmt=launch.fmt, script=script, comment=plan_comment(p, machine), json_doc=json_doc,
        workers=workers, name=launch.alias or manifest.id,
        machine_gpus=tuple(g.index for g in machine.usable_gpus), force=launch.force,
        ecosystem=ecosystem_for(
            launch.fmt, eco, p, machine, manifest, model_path, mmproj_path, launch.alias
        ),
    )  # fmt: skip


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
