"""`quantpick serve`: from nothing to a running llama-server (plan, fetch or reuse, confirm,
start, wait for /health), in the foreground until Ctrl-C, or detached; and `--status` / `--stop`
for the servers it started.

Usage:
    quantpick serve qwen3.8-35b-a3b-distill -c 65536
    quantpick serve --gguf ./Tiny-Q8_0.gguf -c 8192 --port 0
    quantpick serve qwen3.8-35b-a3b-distill -c 65536 --detach
    quantpick serve --status
    quantpick serve --stop qwen3.8-35b-a3b-distill

`--stop` and `--status` are flags of the one command, with MODEL naming the server's alias, rather
than subcommands: a typer command that takes a MODEL argument cannot also have subcommands (the
group would read a model id as a subcommand's name), and `serve --stop NAME` keeps everything
about serving in one place and in one --help.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from quantpick.cli.core import app
from quantpick.cli.groups import (
    FetchOptions,
    LaunchOptions,
    LlamaCppOptions,
    MachineOptions,
    OutputOptions,
    PlanOptions,
)
from quantpick.cli.option_blocks import CHOICE, FETCH, SERVE_ADDRESS, takes
from quantpick.cli.option_table import ServeGgufOpt, ServeTimeoutOpt

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.jobs.serve import ServeResult
    from quantpick.serve.command import ServerOptions
    from quantpick.serve.server import Ended
    from quantpick.serve.server_records import ServerRecord

DEFAULT_PORT = 8080  # llama-server's own default (common/common.h)


class _ProgressLine:
    """One line on a terminal, rewritten in place while llama-server loads; nothing otherwise
    (its log has it all)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.shown = False

    def update(self, elapsed: float, last_line: str | None) -> None:
        if not self.tty:
            return
        import shutil

        width = shutil.get_terminal_size((100, 20)).columns
        text = f"Loading {self.label} ({elapsed:.0f} s)"
        if last_line:
            text += f": {last_line.strip()}"
        sys.stderr.write("\r\x1b[2K" + text[: max(20, width - 1)])
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
            self.shown = False


def _endpoint_doc(result: ServeResult) -> dict[str, Any]:
    record = result.running.record
    return {
        "base_url": record.base_url,
        "openai_base_url": f"{record.base_url}/v1",
        "model": record.alias,
        "ctx_size": result.plan.config.ctx_size,
        "n_parallel": result.plan.config.n_parallel,
        "host": record.host,
        "port": record.port,
        "pid": record.pid,
        "log": record.log,
        "record": str(result.running.record_path) if result.running.record_path else None,
        "detached": record.detached,
        "llama_server": {"path": str(result.found.path), "found": result.found.origin},
        "notes": list(result.notes),
        "argv": list(record.argv),
        "ready_seconds": round(result.running.ready_s, 2),
    }


def _print_endpoint(result: ServeResult) -> None:
    from quantpick.cli import output

    record, p = result.running.record, result.plan
    lines = [
        f"Serving {record.alias} ({p.quant}, KV {p.config.cache_type_k}, {p.placement}) "
        f"at {record.base_url}",
        f"  OpenAI base URL: {record.base_url}/v1",
        f"  model:           {record.alias}",
        f"  context:         {p.config.ctx_size} tokens, {p.config.n_parallel} slot"
        + ("s" if p.config.n_parallel != 1 else ""),
        f"  pid:             {record.pid}",
        f"  log:             {record.log}",
    ]
    if record.host in ("0.0.0.0", "::", "[::]"):
        lines.append(f"  (listening on every interface of this machine, {record.host})")
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    if record.detached:
        output.note(
            f"Detached: it keeps running. `quantpick serve --status` lists it; "
            f"`quantpick serve --stop {record.alias}` stops it."
        )
    else:
        output.note("Ctrl-C stops it.")


def _check_doc(check: Any, error: str | None) -> dict[str, Any]:
    """`check` (quantpick check's report) and `check_error` keys of serve's JSON."""
    from quantpick.cli.check import report_doc

    return {"check": report_doc(check.report) if check else None, "check_error": error}


def _print_check(check: Any, error: str | None) -> None:
    from quantpick.cli import output
    from quantpick.cli.check import report_lines

    if check is None:
        output.note(f"Check: not done ({error}).")
        return
    output.note("Check, the running server beside its plan (`quantpick check` repeats it):")
    for line in report_lines(check.report):
        output.note(f"  {line}")


def _status(settings: Settings, alias: str | None, port: int | None, json_: bool) -> None:
    from quantpick.cli import output
    from quantpick.process import escaped
    from quantpick.serve.server_records import scan_records, select_records

    scan = scan_records(settings.servers_dir)
    for problem in scan.problems:
        output.note(problem.line())
    records = select_records(scan.records, alias, port)
    if json_:
        from quantpick.jobs.check import check_running

        docs = []
        for r in records:
            check, error = check_running(r.base_url, settings.servers_dir, settings)
            docs.append({**_record_doc(r), **_check_doc(check, error)})
        output.print_json({"servers": docs})
        return
    if not records:
        output.note("No server started by quantpick is running.")
        return
    now = time.time()
    for r in records:
        mode = "detached" if r.detached else f"foreground (quantpick pid {r.quantpick_pid})"
        line = (
            f"{r.alias}: {r.base_url}/v1  pid {r.pid}, {r.quant or '?'} -c {r.ctx_size}, "
            f"up {_duration(now - r.started)}, {mode}"
        )
        sys.stdout.write(f"{escaped(line)}\n  log: {escaped(r.log)}\n")


def _record_doc(r: ServerRecord) -> dict[str, Any]:
    return {**r.to_dict(), "base_url": r.base_url, "openai_base_url": f"{r.base_url}/v1"}


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _stop(settings: Settings, alias: str | None, port: int | None, json_: bool) -> None:
    from quantpick.cli import output
    from quantpick.errors import QuantpickError, UsageError
    from quantpick.process import escaped
    from quantpick.serve.server import stop_record
    from quantpick.serve.server_records import scan_records, select_records

    scan = scan_records(settings.servers_dir)
    for problem in scan.problems:
        output.note(problem.line())
    running = scan.records
    chosen = select_records(running, alias, port)
    if not chosen:
        what = " ".join(x for x in (alias, f"on port {port}" if port else None) if x)
        raise QuantpickError(
            f"no running server {what}".rstrip()
            if what
            else "no server started by quantpick is running",
            hint="`quantpick serve --status` lists them" if running else None,
        )
    if alias is None and port is None and len(chosen) > 1:
        names = ", ".join(f"{escaped(r.alias)} (port {r.port})" for r in chosen)
        raise UsageError(
            f"{len(chosen)} servers are running: {names}",
            hint="name one: quantpick serve --stop ALIAS (or --port N)",
        )
    stopped = []
    for r in chosen:
        how = stop_record(r, settings.servers_dir)
        stopped.append({"alias": r.alias, "pid": r.pid, "port": r.port, "how": how})
        if not json_:
            forced = " with SIGKILL after the grace period" if how == "killed" else ""
            output.note(f"Stopped {escaped(r.alias)} (pid {r.pid}, port {r.port}){forced}.")
    if json_:
        output.print_json({"stopped": stopped})


@app.command("serve")
@takes(
    "model ctx_size quant gguf mmproj",
    CHOICE,
    "source allow_unverified",
    FETCH,
    "quiet cpu_only backend rpc llama_server llama_bin no_confirm gpu_overhead margin ram_reserve "
    "exact no_network",
    SERVE_ADDRESS,
    "detach timeout status stop json_",
)
def serve_cmd(gguf: ServeGgufOpt = None, timeout: ServeTimeoutOpt = 600.0, **options: Any) -> None:
    """Plan, fetch (or reuse) and verify, confirm with llama.cpp, then run llama-server with the
    plan's flags and wait until it answers; print the endpoint (OpenAI base URL, model, context).
    Stays in the foreground until Ctrl-C (exit 130) or SIGTERM (143), unless --detach."""
    given = {**locals(), **options}
    model, port, alias, json_ = (given[k] for k in ("model", "port", "alias", "json_"))
    from quantpick.cli import output
    from quantpick.errors import UsageError
    from quantpick.serve.server import stop_signals

    settings = FetchOptions.of(given).settings()
    status, stop = given["status"], given["stop"]
    if status and stop:
        raise UsageError("--status and --stop: give one")
    if status or stop:
        (_status if status else _stop)(settings, model, port, json_)
        return
    if not 1 <= timeout <= 86400:
        raise UsageError(f"--timeout {timeout:g}: give 1 to 86400 seconds")
    PlanOptions.of(given).request()  # the plan's options are checked before anything runs
    server = LaunchOptions.of(given, port=DEFAULT_PORT if port is None else port).server(
        any_port=True
    )
    progress_line = _ProgressLine(alias or model or (gguf.name if gguf else "the model"))
    with stop_signals():
        result = _start(given, settings, server, progress_line)
        ended = _show_and_wait(
            result, settings, json_=json_, detach=given["detach"], quiet=given["quiet"]
        )
    if ended is None:
        return  # detached: it keeps running
    if ended.how == "exited":
        output.note(f"llama-server ended (exit {ended.returncode}); it was stopped elsewhere.")
        return
    suffix = " (SIGKILL after the grace period)" if ended.how == "killed" else ""
    output.note(f"Stopped llama-server (pid {result.running.record.pid}){suffix}.")
    raise typer.Exit(ended.exit_code)


def _start(
    given: dict[str, Any], settings: Settings, server: ServerOptions, progress_line: _ProgressLine
) -> ServeResult:
    """Run the serve job until llama-server answers; llama-server's own lines when it fails, one
    line (and no process left) when stopped before it is ready."""
    from quantpick.cli import output
    from quantpick.errors import ServerError
    from quantpick.process import printable
    from quantpick.serve.server import StopRequested, exit_code_for

    try:
        result = _serve(given, settings, server, progress_line)
    except ServerError as exc:
        progress_line.clear()
        if exc.log_lines:
            output.note("llama-server's own lines (the last that say what went wrong):")
            for line in exc.log_lines:
                output.note(f"  {printable(line)}")
        raise
    except (KeyboardInterrupt, StopRequested) as stopped:
        progress_line.clear()
        output.note("Stopped before llama-server was ready (no process left running).")
        raise typer.Exit(exit_code_for(stopped)) from None
    progress_line.clear()
    return result


def _show_and_wait(
    result: ServeResult, settings: Settings, *, json_: bool, detach: bool, quiet: bool
) -> Ended | None:
    """The endpoint on stdout, then (unless --detach: None) the foreground wait until it ends."""
    from quantpick.cli import output
    from quantpick.serve.server import (
        Ended,
        StopRequested,
        exit_code_for,
        run_until_stopped,
        stop_process,
    )
    from quantpick.serve.server_records import remove_record

    running = result.running
    try:
        if json_:
            from quantpick.cli.render import plan_to_dict

            output.print_json(
                {
                    "endpoint": _endpoint_doc(result),
                    "plan": plan_to_dict(result.plan, result.machine,
                                         result.manifest.architecture.block_count),
                    **_check_doc(result.check, result.check_error),
                }
            )  # fmt: skip
        else:
            _print_endpoint(result)
            if not quiet:
                _print_check(result.check, result.check_error)
        if detach:
            return None
        return run_until_stopped(running, settings.servers_dir)
    except (KeyboardInterrupt, StopRequested) as stopped:
        # between "ready" and the foreground wait (run_until_stopped handles its own)
        how = stop_process(running.process.pid, process=running.process)
        remove_record(settings.servers_dir, running.record)
        return Ended(exit_code_for(stopped), how, running.process.returncode)


def _serve(
    given: dict[str, Any], settings: Settings, server: ServerOptions, progress_line: _ProgressLine
) -> ServeResult:
    """The serve job's request from the parsed options, and its progress on stderr."""
    from quantpick.cli import output
    from quantpick.cli.confirm import report_confirmation
    from quantpick.cli.launch import fetch_watch
    from quantpick.jobs.get import GetRequest
    from quantpick.jobs.serve import ServeRequest, serve

    quiet = OutputOptions.of(given).silent
    # Always this machine (probed; --cpu-only leaves its GPUs out; --rpc workers are read now).
    machine = MachineOptions.of(given).machine()
    local = None
    plan = PlanOptions.of(given)
    if given["gguf"] is not None:
        from quantpick.cli.local import local_model

        local = local_model(given)
        manifest, plan = local.manifest, replace(plan, quant=local.quant)
    else:
        manifest = plan.manifest()
    # --timeout is llama-server's load time here, not the llama.cpp tools'
    llama = LlamaCppOptions.of(given, timeout=None)

    def confirmed(confirmation: Any) -> None:
        report_confirmation(confirmation, machine, llama.no_confirm, quiet=quiet)

    def started(port: int, log_path: Path, found: Any, note: str | None) -> None:
        if note:  # not progress: where the server is; shown even with --quiet
            output.note(f"Note: {note}")
        if not quiet:
            output.note(f"Starting {found.path} (found: {found.origin}) on {server.host}:{port}; "
                        f"its log: {log_path}")  # fmt: skip

    fetch = FetchOptions.of(given)
    req = ServeRequest(
        get=GetRequest(
            plan.inputs(manifest, machine), dest_dir=fetch.dir_, source=fetch.source,
            allow_unverified=fetch.allow_unverified, confirm=llama.confirm(machine),
        ),
        server=server,
        local_file=local.model_path if local else None,
        local_quant=local.quant if local else None,
        mmproj_path=local.projector if local else None,
        llama_server=llama.llama_server, llama_bin=llama.llama_bin, detach=given["detach"],
        timeout_s=given["timeout"],
    )  # fmt: skip
    result = serve(
        req, settings=settings, watch=fetch_watch(quiet), on_confirmed=confirmed, on_start=started,
        on_wait=None if quiet else progress_line.update,
    )  # fmt: skip
    progress_line.clear()
    if not quiet:
        for warning in result.command.warnings:
            output.warn(warning)
    return result
