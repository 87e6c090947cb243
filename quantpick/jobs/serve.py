"""`quantpick serve`: the `get` recipe (or a file on disk), then llama-server with the plan's flags
until it answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from quantpick.jobs.check import (
    SERVER_LOG_VERBOSITY,
    CheckResult,
    check_running,
    planned_server,
)
from quantpick.jobs.confirm import confirm_local_plan
from quantpick.jobs.get import UNWATCHED, FetchWatch, GetRequest, get
from quantpick.jobs.plan import plan_for

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.jobs.confirm import ConfirmReport
    from quantpick.jobs.get import GetResult
    from quantpick.jobs.tuning import Tuning
    from quantpick.machine.llamacpp import FoundServer
    from quantpick.machine.spec import Machine
    from quantpick.model.manifest import Manifest
    from quantpick.plan.plan_types import Plan
    from quantpick.serve.command import ServerCommand, ServerOptions
    from quantpick.serve.server import RunningServer


@dataclass(frozen=True)
class ServeRequest:
    """`quantpick serve`: what `get` needs (or a file already on disk), and how to run it."""

    get: GetRequest  # the planning inputs; fetched unless `local_file` is given
    server: ServerOptions  # host, port (0: any free one), alias, API key variable
    local_file: Path | None = None  # --gguf: this file, planned on its own header, not fetched
    local_quant: str | None = None
    mmproj_path: Path | None = None  # the projector of `local_file` with --vision
    llama_server: Path | None = None  # --llama-server
    llama_bin: Path | None = None  # --llama-bin
    detach: bool = False
    timeout_s: float = 600.0  # serve.server.HEALTH_TIMEOUT_S
    servers_dir: Path | None = None  # records and logs (default: settings.servers_dir)
    check: bool = True  # once it answers: the running server beside its plan (check_server)


@dataclass
class ServeResult:
    running: RunningServer
    manifest: Manifest
    machine: Machine
    plan: Plan
    command: ServerCommand
    found: FoundServer  # which llama-server, and where it was found
    fetched: GetResult | None  # None for a file on disk
    confirmation: ConfirmReport | None
    notes: tuple[str, ...] = ()  # one line each: the port, the build
    check: CheckResult | None = None  # the running server beside its plan
    check_error: str | None = None  # why it could not be checked


def serve(
    req: ServeRequest,
    *,
    settings: Settings,
    watch: FetchWatch = UNWATCHED,
    on_confirmed: Callable[[ConfirmReport | None], None] | None = None,
    on_start: Callable[[int, Path, FoundServer, str | None], None] | None = None,
    on_wait: Callable[[float, str | None], None] | None = None,
) -> ServeResult:
    """Plan, fetch or reuse and verify (`get`), confirm with llama.cpp, then start llama-server
    with the plan's flags and wait until /health answers. Raises ServerError (exit 8) when no
    llama-server is found, its build predates the architecture, or it fails to load; the
    process is stopped on every failure or interruption before it is ready. `watch` sees the
    fetch and the quant once chosen; callbacks: `on_confirmed` (llama.cpp's check, before the
    start), `on_start` (each launch: port, log file, which llama-server), `on_wait` (while it
    loads)."""
    from quantpick.errors import ServerError
    from quantpick.machine.llamacpp import locate_llama_server, not_found_message
    from quantpick.serve.command import build_command, build_too_old
    from quantpick.serve.flags import capabilities_for
    from quantpick.serve.server import start_server

    g = req.get.plan
    if g.llama_server is None and req.llama_server is None and req.llama_bin is not None:
        # --llama-bin: the llama-server there is the build the plan's compute rule is for
        candidate = req.llama_bin / "llama-server"
        if candidate.is_file():
            g = replace(g, llama_server=candidate)
    manifest = g.manifest
    fetched: GetResult | None = None
    tuning: Tuning | None
    if req.local_file is not None:
        from quantpick.model.local import local_layout

        quant = req.local_quant or manifest.files[0].quant
        model_path, mmproj_path = req.local_file, req.mmproj_path
        # the plan recipe `command --gguf` uses: the build's compute rule and this machine's
        # calibrations (speed and memory) apply to a file on disk as to a fetched one
        planned = plan_for(
            replace(g, request=replace(g.request, quant=quant),
                    local=local_layout(model_path, quant)),
            settings=settings,
        )  # fmt: skip
        p, tuning = planned.plan, planned.tuning
        if watch.on_plan is not None:
            watch.on_plan(p)
        confirmation = None
        if req.get.confirm is not None:
            confirmation = confirm_local_plan(
                p, manifest, model_path, g.machine, planned.inputs.request,
                planned.inputs.overheads, req.get.confirm,
            )  # fmt: skip
            p = confirmation.plan
    else:
        fetched = get(replace(req.get, plan=g, dry_run=False), settings=settings, watch=watch)
        p, confirmation, tuning = fetched.plan, fetched.confirmation, fetched.tuning
        model_path, mmproj_path = fetched.model_path, fetched.mmproj_path
    if on_confirmed is not None:
        on_confirmed(confirmation)

    # The llama-server beside the llama-fit-params that confirmed the plan is the same build.
    beside = tuple(Path(r.argv[0]) for r in (confirmation.rounds if confirmation else ())[:1])
    found = locate_llama_server(req.llama_server, llama_bin=req.llama_bin, beside=beside)
    if found is None:
        raise ServerError(
            not_found_message(req.llama_server, req.llama_bin),
            hint="install llama.cpp, run scripts/build-llamacpp.sh, or give --llama-server PATH",
        )
    caps = capabilities_for(found.path)
    too_old = build_too_old(caps, manifest.architecture.name)
    if too_old is not None:
        raise ServerError(too_old, hint="upgrade llama.cpp, or give a newer --llama-server")
    notes = [f"llama-server: {caps.describe()} (found: {found.origin})"]
    block_count = manifest.architecture.block_count
    alias = req.server.alias or manifest.id
    commands: dict[int, ServerCommand] = {}

    def argv_for_port(port: int) -> tuple[tuple[str, ...], dict[str, str]]:
        from quantpick.machine.backends import local_backend

        cmd = build_command(
            p.config,
            model_path=model_path,
            mmproj_path=mmproj_path,
            manifest=manifest,
            block_count=block_count,
            server=replace(req.server, port=port, alias=alias),
            capabilities=caps,
            backend=local_backend(g.machine.gpus),
        )
        commands[port] = cmd
        # llama.cpp's own buffer lines (what `quantpick check` reads) are logged from
        # verbosity 4 on in this build (b11312 prints them at INFO, shown with -lv 4).
        argv = (*cmd.argv, *SERVER_LOG_VERBOSITY) if caps.has("-lv") else cmd.argv
        return argv, {**cmd.env, **_env_from(cmd)}

    def started(port: int, log_path: Path, note: str | None) -> None:
        if on_start is not None:
            on_start(port, log_path, found, note)

    running = start_server(
        argv_for_port,
        host=req.server.host,
        port=req.server.port,
        alias=alias,
        directory=req.servers_dir or settings.servers_dir,
        detach=req.detach,
        timeout_s=req.timeout_s,
        on_start=started,
        on_wait=on_wait,
        notes=notes,
        record_extra={
            "model_path": str(model_path.absolute()),
            "quant": p.quant,
            "ctx_size": p.config.ctx_size,
            "n_parallel": p.config.n_parallel,
            "plan": planned_server(p, "the plan `quantpick serve` started it with", tuning),
        },
    )
    result = ServeResult(running, manifest, g.machine, p, commands[running.record.port], found,
                         fetched, confirmation, tuple(notes))  # fmt: skip
    if req.check:
        directory = req.servers_dir or settings.servers_dir
        try:
            result.check, result.check_error = check_running(
                running.record.base_url, directory, settings
            )
        except BaseException:
            # Ctrl-C / SIGTERM while it is checked: nothing has reported the server yet, so it
            # is stopped like one interrupted while loading (the caller says so)
            from quantpick.serve.server import stop_process
            from quantpick.serve.server_records import remove_record

            stop_process(running.process.pid, process=running.process)
            remove_record(directory, running.record)
            raise
    return result


def _env_from(cmd: ServerCommand) -> dict[str, str]:
    """The variables a command copies from others at run time (LLAMA_API_KEY from $NAME)."""
    import os

    from quantpick.errors import UsageError

    out = {}
    for key, source in cmd.env_from:
        if source not in os.environ:
            raise UsageError(f"--api-key-env {source}: that variable is not set")
        out[key] = os.environ[source]
    return out
