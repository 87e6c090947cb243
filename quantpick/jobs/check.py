"""`quantpick check`: a running llama-server beside its plan (its endpoints, its own buffer
lines, its process's swap and GPU memory); also the end of `serve`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.jobs.plan import PlanInputs, plan_for

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.jobs.tuning import Tuning
    from quantpick.plan.check import PlannedServer
    from quantpick.plan.plan_types import Plan


def check_running(
    url: str, servers_dir: Path, settings: Settings
) -> tuple[CheckResult | None, str | None]:
    """check_server for a server `serve` started, never raising for what the server answers:
    (the result, None) or (None, why it could not be checked)."""
    from quantpick.errors import QuantpickError

    try:
        return check_server(CheckRequest(url, servers_dir=servers_dir), settings=settings), None
    except QuantpickError as exc:
        return None, exc.message


# llama-server's log verbosity for a server `serve` starts: see argv_for_port in `serve`.
SERVER_LOG_VERBOSITY = ("-lv", "4")


def planned_server(p: Plan, basis: str, tuning: Tuning | None = None) -> PlannedServer:
    """What `quantpick check` compares a running server with: the plan's device rows, context
    and expected decode speed (and the memory calibration its compute already carries)."""
    from quantpick.plan.check import planned_from_estimate

    expected = p.speed.expected
    tps = expected.decode_tps_target if expected is not None else None
    ratios = tuning.memory.ratios if tuning is not None and tuning.memory is not None else ()
    return planned_from_estimate(p.estimate, decode_tps=tps, basis=basis, compute_ratios=ratios,
                                 build=tuning.build if tuning is not None else "")  # fmt: skip


@dataclass(frozen=True)
class CheckRequest:
    """`quantpick check [ALIAS | URL]`."""

    target: str | None  # an alias of a server `serve` started, a URL, or None (the only one)
    plan_inputs: PlanInputs | None = None  # --gguf FILE and options: plan for that
    plan_basis: str = ""  # how plan_inputs were given, in words ("--gguf F -c 32768")
    log: Path | None = None  # --log: a llama-server log quantpick did not write
    timed_request: bool = False  # --measure-speed
    servers_dir: Path | None = None
    learn: bool = False  # --learn: store the measured compute as a memory calibration


@dataclass(frozen=True)
class CheckResult:
    report: Any  # plan.check.CheckReport
    base_url: str
    record: Any  # serve.server.ServerRecord | None
    live: Any  # serve.live.LiveServer
    log_path: Path | None
    learned: Path | None = None  # where --learn stored the memory calibration
    not_learned: tuple[str, ...] = ()  # why --learn stored nothing


def _is_url(text: str) -> bool:
    return "://" in text


def find_record(records: list[Any], target: str | None) -> Any:
    """The record `check TARGET` means (None for a URL no record has)."""
    from quantpick.errors import QuantpickError, UsageError

    if target is not None and _is_url(target):
        from quantpick.serve.live import check_url

        url = check_url(target)
        return next((r for r in records if r.base_url == url), None)
    chosen = [r for r in records if target is None or r.alias == target]
    if not chosen:
        if target is None:
            raise QuantpickError(
                "no server started by quantpick is running",
                hint="give a URL: quantpick check http://127.0.0.1:8080",
            )
        raise QuantpickError(
            f"no running server {target}",
            hint="`quantpick serve --status` lists them; a URL checks any llama-server",
        )
    if len(chosen) > 1:
        names = ", ".join(f"{r.alias} ({r.base_url})" for r in chosen)
        raise UsageError(f"{len(chosen)} servers match: {names}", hint="give the URL of one")
    return chosen[0]


def _measured_figures(log: Any) -> tuple[Any, ...]:
    from quantpick.plan.check import HOST, Figures

    return tuple(
        Figures(
            device=m.device,
            kind="host" if m.device == HOST else "gpu",
            weights_bytes=m.weights_bytes,
            kv_bytes=m.kv_bytes,
            recurrent_bytes=m.recurrent_bytes,
            compute_bytes=m.compute_bytes,
            output_bytes=m.output_bytes,
        )
        for m in log.measured()
    )


def check_server(req: CheckRequest, *, settings: Settings) -> CheckResult:
    """Read the server (its endpoints, its log, its process's swap and GPU memory) and compare
    it with its plan: the one `serve` recorded, else the plan for `req.plan_inputs`, else the
    server's own /props (a comparison of the server with itself: measured figures only)."""
    from quantpick.plan.check import MIN_DECODE_TOKENS, GpuUse, Observed, PlannedServer, compare
    from quantpick.serve.live import read_server
    from quantpick.serve.processes import process_memory
    from quantpick.serve.server_log import read_log
    from quantpick.serve.server_records import list_records

    records = list_records(req.servers_dir or settings.servers_dir)
    record = find_record(records, req.target)
    url = record.base_url if record is not None else str(req.target)
    live = read_server(url, timed_request=req.timed_request)
    problems = list(live.problems)
    planned: PlannedServer | None = None
    if req.plan_inputs is not None:
        result = plan_for(req.plan_inputs)
        planned = planned_server(result.plan, f"planned now: {req.plan_basis}", result.tuning)
    elif record is not None and record.plan is not None:
        planned = record.plan
    props = live.props
    if planned is None:
        planned = PlannedServer(
            devices=(), n_ctx=props.n_ctx, n_parallel=max(1, props.total_slots),
            n_ctx_seq=props.n_ctx_slot, decode_tps=None,
            basis="no plan: the server's own /props (give --gguf FILE and its options to plan)",
        )  # fmt: skip
    log_path = req.log or (Path(record.log) if record is not None else None)
    devices: tuple[Any, ...] = ()
    offloaded = None
    n_ctx_seq, n_ctx_from = props.n_ctx_slot, "/props"
    if log_path is not None:
        log = read_log(log_path)
        problems.extend(log.problems)
        devices, offloaded = _measured_figures(log), log.offloaded
        if log.n_ctx_seq is not None:
            n_ctx_seq, n_ctx_from = log.n_ctx_seq, "llama.cpp's log"
    else:
        problems.append(
            "no log: llama.cpp's per-device buffers were not read (give --log FILE, the "
            "server's own output with -lv 4)"
        )
    rss = swap = None
    gpus: tuple[Any, ...] = ()
    if record is not None:
        rss, swap = process_memory(record.pid)
        if any(d.kind == "gpu" for d in planned.devices):
            from quantpick.machine.backends import default_gpu_backend, parse_device_name
            from quantpick.machine.probe import gpu_memory_use

            # named as the plan's GPUs are (NVML's index = the backend's in PCI bus order)
            planned_gpus = (parse_device_name(d.device) for d in planned.devices)
            named = next((p[0] for p in planned_gpus if p is not None), default_gpu_backend())

            use, note = gpu_memory_use(record.pid)
            if note:
                problems.append(note)
            gpus = tuple(
                GpuUse(named.device_name(g.index), g.total_bytes, g.used_bytes, g.process_bytes)
                for g in use
            )
    decode = live.decode_tps
    if (
        decode is not None
        and not live.timed_decode_tps
        and (live.metrics is None or live.metrics.tokens_predicted < MIN_DECODE_TOKENS)
    ):
        decode = None
    observed = Observed(
        devices=devices,
        n_ctx_seq=n_ctx_seq,
        n_ctx_from=n_ctx_from,
        offloaded=offloaded,
        swap_bytes=swap,
        rss_bytes=rss,
        gpus=gpus,
        decode_tps=decode[0] if decode else None,
        decode_from=decode[1] if decode else None,
        problems=tuple(problems),
    )
    report = compare(planned, observed)
    if not req.learn:
        return CheckResult(report, url, record, live, log_path)
    learned, why = _learn(report, live, record, req, settings)
    return CheckResult(report, url, record, live, log_path, learned, why)


def _learn(
    report: Any, live: Any, record: Any, req: CheckRequest, settings: Settings
) -> tuple[Path | None, tuple[str, ...]]:
    """Store the check's compute buffers as this machine's memory calibration (check --learn)."""
    import datetime
    import re

    from quantpick.errors import QuantpickError
    from quantpick.plan.calibration import build_id, machine_devices
    from quantpick.plan.memory_calibration import make_entry, report_problems
    from quantpick.serve.calibration import save_memory_entry

    problems = report_problems(report)
    if req.plan_inputs is not None and req.plan_inputs.machine.described:
        problems.append("the plan is for a described machine, not this one")
    if req.plan_inputs is None and record is None:
        problems.append("the server's plan is not known (give --gguf FILE and its options)")
    if any(d.endpoint for d in report.planned.devices):
        problems.append("RPC devices are not learned")
    m = re.fullmatch(r"b(\d+)-([0-9a-f]+)", live.props.build_info or "")
    if m is None:
        problems.append(f"the server's build ({live.props.build_info!r}) is not b<N>-<commit>")
    elif report.planned.build != build_id(int(m.group(1)), m.group(2), None):
        problems.append(
            f"the plan's compute was estimated for llama.cpp {report.planned.build or 'unknown'},"
            f" the server runs {live.props.build_info} (plan with --llama-server PATH)"
        )
    if problems:
        return None, tuple(problems)
    assert m is not None
    if req.plan_inputs is not None:
        machine = req.plan_inputs.machine
    else:
        from quantpick.machine.probe import probe

        machine = probe(inspect_server=False)
    entry = make_entry(
        report,
        build=build_id(int(m.group(1)), m.group(2), None),
        devices=machine_devices(machine),
        model_bytes=sum(d.weights_bytes for d in report.planned.devices),
        date=datetime.date.today().isoformat(),
        model=(record.alias if record is not None else None) or live.props.model_alias or "?",
    )
    try:
        return save_memory_entry(machine, entry, settings), ()
    except QuantpickError as exc:
        return None, (exc.message,)
