"""The whole job, stage by stage: machine -> model -> plan -> fetch -> serve.

Functions here join the stages (each stage is its own package and knows nothing of the others'
I/O); the CLI parses options, calls one of these and renders what comes back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.machine.backends import (
    default_gpu_backend,
    device_env_prefixes,
    local_backend,
    parse_device_name,
)

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.fetch.download import FetchReport
    from quantpick.fetch.transfer import ProgressSink
    from quantpick.machine.llamacpp import FoundServer
    from quantpick.machine.spec import LlamaServer, Machine
    from quantpick.model.headers import LayoutSource
    from quantpick.model.layout import ModelLayout
    from quantpick.model.manifest import Manifest
    from quantpick.plan.build_class import ComputeRule
    from quantpick.plan.calibration import Calibration, SpeedFactors
    from quantpick.plan.check import PlannedServer
    from quantpick.plan.confirm import Confirmation
    from quantpick.plan.memory import Overheads, RunConfig
    from quantpick.plan.memory_calibration import MemoryCalibration
    from quantpick.plan.planner import ContextLimit, Plan, PlanRequest
    from quantpick.serve.bench import BenchMeasurement, BenchSettings
    from quantpick.serve.command import ServerCommand, ServerOptions
    from quantpick.serve.server import RunningServer


def plan_exact(
    manifest: Manifest,
    machine: Machine,
    layouts: LayoutSource,
    request: PlanRequest,
    overheads: Overheads,
) -> Plan:
    """Plan on the layouts at hand (cache or synthesized), then redo it on the chosen quant's
    exact header (read from the hub when it can be; at most three rounds). The planner itself
    never reaches for a header: it is handed the layouts."""
    from quantpick.errors import NoFitError
    from quantpick.plan.planner import plan

    wanted = (
        None
        if request.quant is None
        else tuple(q for q in manifest.quants if q.upper() == request.quant.upper())
    )
    resolved = layouts.layouts(wanted or None)
    if not resolved and layouts.problems:
        raise NoFitError(
            f"nothing of {manifest.id} can be planned: {layouts.problems[-1]}",
            hint="allow network access once (headers are then cached)",
        )
    p = plan(manifest, machine, resolved, request, overheads=overheads)
    for _ in range(3):
        if not layouts.upgrade(p.quant):
            break
        resolved[p.quant] = layouts(p.quant)
        p = plan(manifest, machine, resolved, request, overheads=overheads)
    return p


def plan_on_local_file(
    manifest: Manifest,
    quant: str,
    model_path: Path,
    machine: Machine,
    request: PlanRequest,
    overheads: Overheads,
) -> Plan:
    """Plan one quant on the header of its file on disk: the file is the truth."""
    from quantpick.model.local import local_layout
    from quantpick.plan.planner import plan

    layout = local_layout(model_path, quant)
    return plan(
        manifest, machine, {quant: layout}, replace(request, quant=quant), overheads=overheads
    )


# ----------------------------------------------------------------------------------------------
# The plan recipe: every command that plans goes through plan_for.


@dataclass(frozen=True)
class PlanInputs:
    """What one plan needs, gathered once by the CLI. `plan_for` applies the installed build's
    compute rule and this machine's calibration, then plans on the best layouts it can have."""

    manifest: Manifest
    machine: Machine
    request: PlanRequest
    overheads: Overheads
    llama_server: Path | None = None  # --llama-server: the build whose compute rule applies
    gpu_overhead_given: bool = False  # --gpu-overhead: it wins over a measured driver overhead
    exact: bool = False  # --exact: every candidate on its exact header
    network: bool = True  # False: --offline / --no-network
    local: ModelLayout | None = None  # a file on disk: plan its quant on its own header
    local_dir: Path | None = None  # where the files would be: a header read there needs no hub
    calibration: bool = True  # False: --no-calibration


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    inputs: PlanInputs  # with the tuned request and overheads the plan was made with
    tuning: Tuning
    header_problems: tuple[str, ...] = ()
    # What the chosen quant's exact header contradicts in the manifest (one line each)
    contradictions: tuple[str, ...] = ()

    @property
    def notes(self) -> tuple[str, ...]:
        """What the CLI says on stderr: the tuning applied (or why not), a missing header, a
        manifest the header contradicts."""
        out = list(self.tuning.notes)
        if self.header_problems:
            out.append(
                "exact GGUF header unavailable, planned from the manifest: "
                + self.header_problems[-1]
            )
        out.extend(self.contradictions)
        return tuple(out)


def tuned(inputs: PlanInputs, *, settings: Settings | None = None) -> tuple[PlanInputs, Tuning]:
    """`inputs` with the build's compute rule and this machine's calibration applied."""
    from quantpick.plan.calibration import model_sizes

    tuning = local_tuning(
        inputs.machine, inputs.llama_server, settings=settings,
        sizes=model_sizes(inputs.manifest), use_calibration=inputs.calibration,
    )  # fmt: skip
    request, overheads = tune(inputs.request, inputs.overheads, tuning)
    if inputs.gpu_overhead_given:
        overheads = replace(overheads, gpu_context_by_device=inputs.overheads.gpu_context_by_device)
    return replace(inputs, request=request, overheads=overheads), tuning


def plan_for(inputs: PlanInputs, *, settings: Settings | None = None) -> PlanResult:
    """The plan for `inputs`: tuned, then on the file's own header (`local`) or on the exact
    header of the chosen quant when it can be had."""
    from quantpick.model.headers import LayoutSource, manifest_contradictions
    from quantpick.plan.planner import plan

    inputs, tuning = tuned(inputs, settings=settings)
    if inputs.local is not None:
        quant = inputs.request.quant or inputs.local.quant or inputs.manifest.quants[0]
        request = replace(inputs.request, quant=quant)
        p = plan(
            inputs.manifest, inputs.machine, {quant: inputs.local}, request,
            overheads=inputs.overheads,
        )  # fmt: skip
        return PlanResult(p, replace(inputs, request=request), tuning)
    layouts = LayoutSource(
        inputs.manifest, exact=inputs.exact, network=inputs.network, settings=settings,
        local_dir=inputs.local_dir,
    )  # fmt: skip
    p = plan_exact(inputs.manifest, inputs.machine, layouts, inputs.request, inputs.overheads)
    contradictions = manifest_contradictions(inputs.manifest, p.quant, layouts(p.quant))
    return PlanResult(p, inputs, tuning, tuple(layouts.problems), tuple(contradictions))


@dataclass(frozen=True)
class LimitsResult:
    limits: list[ContextLimit]
    tuning: Tuning
    header_problems: tuple[str, ...] = ()


def max_context_for(inputs: PlanInputs, *, settings: Settings | None = None) -> LimitsResult:
    """The largest context per quant, through the same recipe as plan_for."""
    from quantpick.model.headers import LayoutSource
    from quantpick.plan.planner import max_context

    inputs, tuning = tuned(inputs, settings=settings)
    source = LayoutSource(
        inputs.manifest, exact=inputs.exact, network=inputs.network, settings=settings
    )
    limits = max_context(
        inputs.manifest, inputs.machine, source.layouts(), inputs.request,
        overheads=inputs.overheads,
    )  # fmt: skip
    return LimitsResult(limits, tuning, tuple(source.problems))


@dataclass(frozen=True)
class GetRequest:
    """`quantpick get`: the planning inputs and where and how to fetch."""

    manifest: Manifest
    machine: Machine
    plan_request: PlanRequest
    overheads: Overheads
    dest_dir: Path | None  # None: the default (the models dir, or the HF cache with --hf-cache)
    exact: bool = False
    network: bool = True  # False: --offline (no hub is contacted)
    source: str = "auto"
    allow_unverified: bool = False
    dry_run: bool = False
    confirm: ConfirmOptions | None = None  # None: --no-confirm
    llama_server: Path | None = None  # the build whose compute rule and calibration apply
    gpu_overhead_given: bool = False  # --gpu-overhead wins over a measured driver overhead
    calibration: bool = True  # False: --no-calibration


@dataclass(frozen=True)
class GetResult:
    plan: Plan  # re-planned on the downloaded file's own header unless a dry run
    first_plan: Plan  # the plan that chose the quant (manifest or remote header)
    report: FetchReport | None  # None: no hub was used (offline, files verified in place)
    # One entry per file in place ([] for a dry run), with `reuse`: the other tool's copy it
    # came from (store, path, how it was linked), or null.
    files: list[dict[str, Any]] | None
    model_path: Path
    mmproj_path: Path | None
    header_problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)
    confirmation: ConfirmReport | None = None  # llama.cpp's check of `plan` (None: not run)
    tuning: Tuning | None = None  # the compute rule and calibration the plan was made with
    contradictions: tuple[str, ...] = ()  # PlanResult.contradictions: what `pick` notes too


def get(
    req: GetRequest,
    *,
    settings: Settings,
    progress: ProgressSink | None = None,
    on_plan: Any = None,
    live: Any = None,
) -> GetResult:
    """Plan, fetch + verify (or verify what is in place when no hub answers), re-plan on the file.

    `on_plan(plan)` is called once the quant is chosen, before any transfer (the CLI prints it);
    `live` is a context manager around the transfer (the CLI's progress display).
    """
    from contextlib import nullcontext

    from quantpick.errors import DownloadError
    from quantpick.fetch.download import (
        fetch_model,
        files_in_place,
        report_files,
        verified_hf_cache_files,
        verified_local_files,
    )
    from quantpick.fetch.http import RetryPolicy
    from quantpick.fetch.stores import HashCache, hash_cache_path

    manifest = req.manifest
    vision = req.plan_request.vision
    dest = req.dest_dir if req.dest_dir is not None else settings.models_dir / manifest.id
    in_cache = settings.hf_cache and req.dest_dir is None
    planned = plan_for(
        PlanInputs(
            manifest, req.machine, req.plan_request, req.overheads,
            llama_server=req.llama_server, gpu_overhead_given=req.gpu_overhead_given,
            exact=req.exact, network=req.network, local_dir=None if in_cache else dest,
            calibration=req.calibration,
        ),
        settings=settings,
    )  # fmt: skip
    first = planned.plan
    # what the file's own plan and the confirm rounds use: the tuned request and overheads
    req = replace(req, plan_request=planned.inputs.request, overheads=planned.inputs.overheads)
    if on_plan is not None:
        on_plan(first)
    warnings: list[str] = []
    report = None
    files: list[dict[str, Any]] | None = None
    offline = not req.network or settings.offline
    pre_download = None
    if req.confirm is not None and not offline:
        # `pick`'s dry run on a stand-in of the file's own header: a file this llama.cpp build
        # cannot load ends here (ModelRejectedError, exit 7), before a byte of it is fetched;
        # `get --dry-run` answers with its plan, as `pick` does.
        pre_download = dry_run(planned, req.confirm, settings=settings)
    if offline and req.dry_run:
        # Offline means offline, dry run included: the plan and the local files, no hub.
        warnings.append(f"offline: no hub contacted; the dry run shows the plan for {dest}")
        model_path = dest / manifest.quant_files(first.quant)[0].name
        mmproj = dest / manifest.projector.name if vision and manifest.projector else None
        return GetResult(
            first, first, None, None, model_path, mmproj, planned.header_problems,
            tuple(warnings), tuning=planned.tuning, contradictions=planned.contradictions,
        )  # fmt: skip
    try:
        if offline and not req.dry_run:
            raise DownloadError("offline (--offline or QUANTPICK_OFFLINE): no hub contacted")
        with live if live is not None else nullcontext():
            # Files in place that a pinned sha256 verifies need no hub.
            files = None if req.dry_run else files_in_place(
                manifest, first.quant, vision, settings=settings, dest_dir=req.dest_dir,
                progress=progress,
            )  # fmt: skip
            if files is None:
                report = fetch_model(
                    manifest,
                    first.quant,
                    settings=settings,
                    vision=vision,
                    dest_dir=req.dest_dir,
                    source=req.source,
                    allow_unverified=req.allow_unverified,
                    dry_run=req.dry_run,
                    progress=progress,
                    # a dry run reads a listing and a checksums file: one attempt, like `download`
                    policy=RetryPolicy(attempts=1) if req.dry_run else None,
                )
                files = [] if req.dry_run else report_files(report)
    except DownloadError as exc:
        # No hub (offline, HF_HUB_OFFLINE, an outage): files already in place still serve, once
        # verified against the checksums a previous run left beside them (or, in the Hugging
        # Face cache, against the manifest and the blob names).
        cache = HashCache(hash_cache_path(settings.cache_dir))
        if req.dry_run:
            files = None
        elif settings.hf_cache and req.dest_dir is None:
            files = verified_hf_cache_files(manifest, first.quant, vision, settings, cache)
        else:
            files = verified_local_files(manifest, first.quant, vision, dest, cache)
        if files is None:
            raise
        where = (
            "the Hugging Face cache"
            if settings.hf_cache
            else f"{dest}, verified against their pinned sha256"
        )
        warnings.append(f"{exc.message}; using the files in {where}")
    model_name = manifest.quant_files(first.quant)[0].name
    projector = manifest.projector if vision else None
    by_name = {f["name"]: Path(f["path"]) for f in files or []}
    if report is not None and report.plan.hf_cache is not None and not by_name:
        # a dry run into the HF cache: where the files will be
        by_name = {p.name: report.plan.hf_cache.pointer_path(p.name) for p in report.plan.files}
    # The file's own path: a reused copy used in place, or a Hugging Face cache snapshot entry,
    # is not under the models dir.
    model_path = by_name.get(model_name, dest / model_name)
    mmproj_path = by_name.get(projector.name, dest / projector.name) if projector else None
    final = first
    confirmation = None
    if req.dry_run and pre_download is not None:
        confirmation = pre_download
        if pre_download.status in ("confirmed", "replanned"):
            final = pre_download.plan
    if not req.dry_run:
        final = plan_on_local_file(
            manifest, first.quant, model_path, req.machine, req.plan_request, req.overheads
        )
        if req.confirm is not None:
            confirmation = confirm_local_plan(
                final, manifest, model_path, req.machine, req.plan_request, req.overheads,
                req.confirm,
            )  # fmt: skip
            final = confirmation.plan
    return GetResult(
        plan=final,
        first_plan=first,
        report=report,
        files=files,
        model_path=model_path,
        mmproj_path=mmproj_path,
        header_problems=planned.header_problems,
        warnings=tuple(warnings),
        confirmation=confirmation,
        tuning=planned.tuning,
        contradictions=planned.contradictions,
    )


# ----------------------------------------------------------------------------------------------
# This machine's own llama.cpp: which build class the compute assumes, and its calibration.


@dataclass(frozen=True)
class Tuning:
    """What the installed llama.cpp and this machine's measurements change in a plan."""

    rule: ComputeRule
    calibration: Calibration | None = None  # applied (same GPUs, same build)
    notes: tuple[str, ...] = ()  # one line each: what was applied, or why a profile was not
    memory: MemoryCalibration | None = None  # compute ratios learned by `check --learn`
    build: str = ""  # build_id of the llama.cpp the compute rule is for ("unknown": none found)


def local_tuning(
    machine: Machine,
    llama_server: Path | None,
    *,
    settings: Settings | None = None,
    sizes: tuple[int, ...] = (),
    use_calibration: bool = True,
) -> Tuning:
    """The compute rule of the llama-server that will run the plan and this machine's calibration
    profile for that build, if any. The build comes from `--llama-server`, else from a hardware
    file that recorded one (`probe --json`), else from llama-server on PATH; none: conservative.
    `sizes`: the planned model's file sizes (a profile applies to a model of its size class);
    `use_calibration=False`: --no-calibration."""
    from quantpick.machine.llamacpp import find_llama_server, inspect_llama_server
    from quantpick.plan.build_class import CONSERVATIVE, compute_rule
    from quantpick.plan.calibration import build_id
    from quantpick.serve.calibration import load_calibration

    notes: list[str] = []
    recorded = machine.llama_server
    server: LlamaServer | None
    if llama_server is None and recorded is not None and recorded.build is not None:
        server = recorded
    else:
        path = find_llama_server(llama_server)
        server = inspect_llama_server(path) if path is not None else None
        if server is not None and server.error is not None:
            notes.append(f"llama-server at {path}: {server.error}")
            server = None
    if server is None:
        rule, build = CONSERVATIVE, build_id(None, None, None)
    else:
        rule = compute_rule(server.version, server.build, server.commit)
        build = build_id(server.build, server.commit, server.version)
    if machine.described:
        return Tuning(rule, notes=tuple(notes), build=build)
    if not use_calibration:
        return Tuning(rule, notes=(*notes, "calibration off (--no-calibration): uncalibrated"),
                      build=build)  # fmt: skip
    from quantpick.serve.calibration import load_memory_calibration

    memory, memory_why = load_memory_calibration(machine, build, sizes=sizes, settings=settings)
    if memory is not None:
        notes.append(f"compute {memory.label}")
    elif memory_why:
        notes.append(f"memory calibration not applied: {memory_why}")
    calibration, why = load_calibration(machine, build, sizes=sizes, settings=settings)
    if calibration is not None:
        return Tuning(rule, calibration, (*notes, calibration.label), memory, build)
    if why:
        notes.append(f"calibration not applied: {why}")
    return Tuning(rule, None, tuple(notes), memory, build)


def tune(
    request: PlanRequest, overheads: Overheads, tuning: Tuning
) -> tuple[PlanRequest, Overheads]:
    """The request and overheads with the build's compute rule and the calibration applied."""
    from quantpick.plan.calibration import apply_overheads

    request = replace(request, compute_rule=tuning.rule, calibration=tuning.calibration)
    if tuning.calibration is not None:
        overheads = apply_overheads(overheads, tuning.calibration)
    if tuning.memory is not None:
        overheads = replace(overheads, compute_ratio_by_device=tuning.memory.ratios,
                            compute_basis=tuning.memory.label)  # fmt: skip
    return request, overheads


# ----------------------------------------------------------------------------------------------
# Confirm: llama.cpp's own projection of the plan on this machine's devices.


@dataclass(frozen=True)
class ConfirmOptions:
    llama_bin: Path | None = None  # --llama-bin DIR
    llama_server: Path | None = None  # --llama-server (its directory is searched too)
    timeout_s: float = 10.0
    max_rounds: int = 3  # llama-fit-params runs at most this many times
    extra_args: tuple[str, ...] = ()  # appended to llama-fit-params (tests: --rpc)


@dataclass(frozen=True)
class ConfirmRound:
    plan: Plan | None  # None: a fixed configuration (`estimate`'s dry run), not a plan
    confirmation: Confirmation
    argv: tuple[str, ...]
    seconds: float


@dataclass(frozen=True)
class ConfirmReport:
    status: str  # "confirmed" | "replanned" | "skipped" | "failed"
    plan: Plan  # the plan to write: confirmed by llama.cpp unless skipped/failed
    rounds: tuple[ConfirmRound, ...] = ()
    message: str = ""  # one line for the user
    changes: tuple[str, ...] = ()  # what the re-plan changed, flag by flag

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.rounds)


Replan = Callable[["Overheads"], "Plan"]


def confirm_plan(
    p: Plan,
    *,
    layout: ModelLayout,
    machine: Machine,
    overheads: Overheads,
    model_path: Path,
    block_count: int,
    replan: Replan,
    options: ConfirmOptions,
    projector_bytes: int = 0,
    runner: Any = None,
) -> ConfirmReport:
    """Run llama-fit-params with the plan's flags and compare (`runner`: run_fit_params's
    signature, e.g. a cached one for the dry run); on a projected overflow re-plan with
    llama.cpp's figures (`replan(overheads with corrections)`, which raises NoFitError when nothing
    fits) and confirm again. Raises NoFitError when llama.cpp still projects an overflow after
    `max_rounds` (also when it printed the overflow and then exited non-zero), and
    ModelRejectedError when llama.cpp cannot load the file: a command llama.cpp refuses is never
    returned. A projection that cannot be read, or one printed by a run that then failed, is
    "failed" (not confirmed), never "confirmed"."""
    from quantpick.errors import NoFitError
    from quantpick.plan.confirm import compare
    from quantpick.serve.fitparams import (
        FIT_PARAMS,
        FitParamsError,
        find_tool,
        fit_params_argv,
        run_fit_params,
    )

    tool = find_tool(FIT_PARAMS, llama_bin=options.llama_bin, llama_server=options.llama_server)
    if tool is None:
        where = f"in {options.llama_bin}" if options.llama_bin else "beside llama-server or on PATH"
        return ConfirmReport(
            "skipped", p, message=f"no {FIT_PARAMS} {where}: the plan is not confirmed by llama.cpp"
        )
    rounds: list[ConfirmRound] = []
    current, current_overheads = p, overheads
    while True:
        argv, env = fit_params_argv(
            tool, current.config, model_path, block_count, extra_args=options.extra_args,
            backend=local_backend(machine.gpus),
        )  # fmt: skip
        try:
            # ModelRejectedError (llama.cpp cannot load the file) is not caught: it ends the
            # command with llama.cpp's reason, and nothing is written.
            run = (runner or run_fit_params)(argv, env, timeout_s=options.timeout_s)
        except FitParamsError as exc:
            return ConfirmReport(
                "failed",
                current,
                tuple(rounds),
                f"could not confirm with llama.cpp: {exc.message}",
                _changes(p, current),
            )
        confirmation = compare(
            layout,
            machine,
            current.config,
            run.projection,
            capped=current.compute_rule.capped,
            overheads=current_overheads,
            projector_bytes=projector_bytes if current.config.vision else 0,
        )
        rounds.append(ConfirmRound(current, confirmation, run.argv, run.seconds))
        if confirmation.problem is not None:
            return ConfirmReport(
                "failed",
                current,
                tuple(rounds),
                f"could not confirm with llama.cpp: {confirmation.problem}",
                _changes(p, current),
            )
        if confirmation.fits and run.failure is not None:
            # It printed a projection that fits, then failed: not a confirmation.
            return ConfirmReport(
                "failed",
                current,
                tuple(rounds),
                f"could not confirm with llama.cpp: {run.failure} (after printing a projection)",
                _changes(p, current),
            )
        if confirmation.fits:
            status = "confirmed" if current is p else "replanned"
            return ConfirmReport(
                status,
                current,
                tuple(rounds),
                _confirmed_message(confirmation, status, len(rounds)),
                _changes(p, current),
            )
        if len(rounds) >= max(1, options.max_rounds):
            break
        current_overheads = replace(
            current_overheads, device_correction_bytes=confirmation.corrections()
        )
        try:
            current = replan(current_overheads)
        except NoFitError as exc:
            raise NoFitError(
                f"llama.cpp projects the plan will not fit ({_overflow_text(confirmation)}); "
                f"re-planned with its figures: {exc.message}",
                hint=exc.hint,
            ) from exc
    replans = len(rounds) - 1
    raise NoFitError(
        "llama.cpp projects the plan will not fit: over budget on "
        + _overflow_text(rounds[-1].confirmation)
        + (f", also after {replans} re-plan(s) with its own figures" if replans else ""),
        hint="try a shorter -c, --allow-q4-kv, or free memory on the GPUs",
    )


def _overflow_text(confirmation: Confirmation) -> str:
    return ", ".join(
        f"{c.device} by {(c.projected_bytes - c.budget_bytes) / 2**20:.0f} MiB"
        for c in confirmation.overflowing
    )


def _confirmed_message(confirmation: Confirmation, status: str, rounds: int) -> str:
    tightest = min(confirmation.checks, key=lambda c: c.headroom_bytes)
    head = (
        "confirmed by llama.cpp"
        if status == "confirmed"
        else f"re-planned with llama.cpp's figures and confirmed (round {rounds})"
    )
    return (
        f"{head}: {tightest.headroom_bytes / 2**20:.0f} MiB to spare on {tightest.device} "
        "(the tightest device)"
    )


def _changes(before: Plan, after: Plan) -> tuple[str, ...]:
    """What differs between two plans, flag by flag (`-c 262144 -> 245760`)."""
    if before is after:
        return ()
    a, b = before.config, after.config
    out = []
    for label, x, y in (
        ("quant", before.quant, after.quant),
        ("-c", a.ctx_size, b.ctx_size),
        ("-ctk", a.cache_type_k, b.cache_type_k),
        ("-ctv", a.cache_type_v, b.cache_type_v),
        ("-ts", a.tensor_split, b.tensor_split),
        ("--n-cpu-moe", a.n_cpu_moe, b.n_cpu_moe),
        ("-ngl", a.n_gpu_layers, b.n_gpu_layers),
        ("placement", before.placement, after.placement),
    ):
        if x != y:
            out.append(f"{label} {_show(x)} -> {_show(y)}")
    return tuple(out)


def confirm_local_plan(
    p: Plan,
    manifest: Manifest,
    model_path: Path,
    machine: Machine,
    request: PlanRequest,
    overheads: Overheads,
    options: ConfirmOptions,
    *,
    runner: Any = None,
) -> ConfirmReport:
    """`confirm_plan` for a plan made on a file on disk (`get`, `command`, `confirm`)."""
    from quantpick.model.local import local_layout

    layout = local_layout(model_path, p.quant)
    projector = manifest.projector.size_bytes if manifest.projector else 0
    return confirm_plan(
        p,
        layout=layout,
        machine=machine,
        overheads=overheads,
        model_path=model_path,
        block_count=manifest.architecture.block_count,
        replan=replan_for_file(manifest, p.quant, layout, machine, request),
        options=options,
        projector_bytes=projector,
        runner=runner,
    )


DRY_RUN_BASIS = "llama.cpp dry run, before download"


def dry_run(
    result: PlanResult, options: ConfirmOptions, *, settings: Settings
) -> ConfirmReport | None:
    """llama.cpp's own projection of a plan whose file is still on the hub: its real header
    bytes as a sparse stand-in (serve/standin.py), llama-fit-params run on it with the plan's
    flags, re-planned on its figures when a device overflows, as `get` does on the downloaded
    file. None when there is nothing to run it on: a described machine (llama.cpp projects on
    this one's devices), a plan already on a file on disk, or no llama-fit-params; a report
    "skipped" with the reason when the header bytes or a sparse file cannot be had."""
    inputs, p = result.inputs, result.plan
    if inputs.machine.described or inputs.local is not None or _fit_params(options) is None:
        return None
    from quantpick.errors import ModelRejectedError
    from quantpick.serve.fitparams import rejected_before_download

    try:
        with _standin(inputs.manifest, p.quant, inputs.machine, settings, inputs.network) as (
            path,
            runner,
        ):
            try:
                report = confirm_local_plan(
                    p, inputs.manifest, path, inputs.machine, inputs.request, inputs.overheads,
                    options, runner=runner,
                )  # fmt: skip
            except ModelRejectedError as exc:
                name = inputs.manifest.quant_files(p.quant)[0].name
                raise rejected_before_download(exc, path, name) from None
    except _NoDryRun as exc:
        return ConfirmReport("skipped", p, message=f"no {DRY_RUN_BASIS}: {exc}")
    return replace(report, message=f"{report.message} ({DRY_RUN_BASIS}){runner.cached_note}")


@dataclass(frozen=True)
class ConfigCheck:
    """llama.cpp's dry run of one fixed configuration (`estimate`): compared, never re-planned."""

    status: str  # "fits" | "overflows" | "skipped" | "failed"
    message: str
    rounds: tuple[ConfirmRound, ...] = ()
    changes: tuple[str, ...] = ()

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.rounds)


def dry_run_config(
    manifest: Manifest,
    layout: ModelLayout,
    machine: Machine,
    config: RunConfig,
    *,
    overheads: Overheads,
    capped: bool,
    projector_bytes: int,
    options: ConfirmOptions,
    settings: Settings,
    network: bool,
) -> ConfigCheck | None:
    """`dry_run` for `estimate`'s one configuration of a remote quant: llama-fit-params on the
    stand-in with exactly these flags, compared device by device. None as for `dry_run`."""
    from quantpick.plan.confirm import compare
    from quantpick.serve.fitparams import FitParamsError, fit_params_argv

    tool = _fit_params(options)
    if machine.described or layout.quant is None or tool is None:
        return None
    try:
        with _standin(manifest, layout.quant, machine, settings, network) as (path, runner):
            argv, env = fit_params_argv(
                tool, config, path, layout.n_slots - 1, extra_args=options.extra_args,
                backend=local_backend(machine.gpus),
            )  # fmt: skip
            run = runner(argv, env, timeout_s=options.timeout_s)
    except _NoDryRun as exc:
        return ConfigCheck("skipped", f"no {DRY_RUN_BASIS}: {exc}")
    except FitParamsError as exc:
        return ConfigCheck("failed", f"no {DRY_RUN_BASIS}: {exc.message}")
    c = compare(
        layout, machine, config, run.projection, capped=capped, overheads=overheads,
        projector_bytes=projector_bytes if config.vision else 0,
    )  # fmt: skip
    rounds = (ConfirmRound(None, c, run.argv, run.seconds),)
    basis = f"({DRY_RUN_BASIS}){runner.cached_note}"
    if c.problem is not None:
        return ConfigCheck("failed", f"could not read llama.cpp's projection: {c.problem}", rounds)
    if c.fits:
        tightest = min(c.checks, key=lambda d: d.headroom_bytes)
        return ConfigCheck(
            "fits",
            f"fits by llama.cpp's own figures: {tightest.headroom_bytes / 2**20:.0f} MiB to "
            f"spare on {tightest.device} {basis}",
            rounds,
        )
    return ConfigCheck(
        "overflows",
        f"llama.cpp projects it will not fit: over budget on {_overflow_text(c)} {basis}",
        rounds,
    )


class _NoDryRun(Exception):
    """No stand-in could be had (header bytes, sparse files): the estimate stands alone."""


def _fit_params(options: ConfirmOptions) -> Path | None:
    from quantpick.serve.fitparams import FIT_PARAMS, find_tool

    return find_tool(FIT_PARAMS, llama_bin=options.llama_bin, llama_server=options.llama_server)


@contextmanager
def _standin(
    manifest: Manifest, quant: str, machine: Machine, settings: Settings, network: bool
) -> Iterator[tuple[Path, DryRunCache]]:
    """The quant's sparse stand-in (removed afterwards) and the cached llama-fit-params to run
    on it; _NoDryRun with the reason when there is none."""
    from quantpick.errors import GGUFError
    from quantpick.model.headers import raw_headers
    from quantpick.serve.sealed import install_key
    from quantpick.serve.standin import NoSparseFiles, standins

    try:
        shards = raw_headers(manifest, quant, settings=settings, network=network)
    except GGUFError as exc:
        raise _NoDryRun(exc.message) from exc
    devices = [(g.name, g.total_bytes, g.backend) for g in machine.gpus]
    runner = DryRunCache(
        settings.cache_dir / "dry-runs",
        hashlib.sha256(b"".join(data for _, data, _ in shards)).hexdigest(),
        repr((devices, [w.endpoint for w in machine.rpc_workers])),
        key=install_key((settings.state_dir or settings.config_dir) / "dry-run.key"),
    )
    try:
        with standins(shards, parent=settings.cache_dir / "standins") as path:
            runner.standin = str(path)
            yield path, runner
    except NoSparseFiles as exc:
        raise _NoDryRun(exc.message) from exc


@dataclass
class DryRunCache:
    """run_fit_params, remembered (settings.cache_dir/dry-runs): the same tool build, flags,
    header bytes and devices give the same model/context/compute projection. The free memory it
    also prints is of that moment, so a projection read back has none: the comparison then uses
    this probe's free memory and the device's own overhead, as for a build that prints none.
    Each entry is sealed with this install's key (serve/sealed.py): an edited entry is ignored
    and the dry run runs again; without a key nothing is cached."""

    directory: Path
    file_key: str  # sha256 of the stand-in's header bytes
    devices: str  # the machine's GPUs (name, total, backend) and RPC workers
    standin: str = ""  # the stand-in's path, replaced by file_key in the cache key
    hits: int = 0
    key: bytes | None = None  # serve/sealed.install_key

    @property
    def cached_note(self) -> str:
        return " (its projection read back from the cache)" if self.hits else ""

    def __call__(self, argv: list[str], env: dict[str, str], *, timeout_s: float) -> Any:
        import json

        from quantpick.errors import QuantpickError
        from quantpick.plan.confirm import Projection
        from quantpick.serve.fitparams import FitParamsRun, parse_output, run_fit_params
        from quantpick.serve.sealed import read_sealed, write_sealed

        try:
            st = Path(argv[0]).stat()
        except OSError:
            return run_fit_params(argv, env, timeout_s=timeout_s)
        if self.key is None:
            return run_fit_params(argv, env, timeout_s=timeout_s)
        tool = f"{Path(argv[0]).resolve()}:{st.st_size}:{st.st_mtime_ns}"
        words = [self.file_key if a == self.standin else a for a in argv[1:]]
        shown = {k: v for k, v in sorted(env.items()) if k.startswith(device_env_prefixes())}
        digest = hashlib.sha256(json.dumps([tool, words, shown, self.devices]).encode())
        path = self.directory / f"{digest.hexdigest()[:40]}.txt"
        try:
            body = read_sealed(path, self.key)
            if body is None:  # none, or edited since it was written: run again
                raise ValueError("no verified entry")
            stdout = body.decode("utf-8")
            projection = parse_output(stdout)
        except (OSError, ValueError, QuantpickError):
            pass
        else:
            self.hits += 1
            devices = tuple(replace(d, free_mib=None, total_mib=None) for d in projection.devices)
            return FitParamsRun(
                tuple(argv), env, 0.0, Projection(devices, projection.other_host_mib), stdout
            )
        got = run_fit_params(argv, env, timeout_s=timeout_s)
        if got.exit_code == 0:
            try:
                write_sealed(path, self.key, got.stdout.encode("utf-8"))
            except OSError:
                pass  # a read-only cache only costs the next dry run its run
        return got


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" for v in value)
    return str(value)


def replan_for_file(
    manifest: Manifest,
    quant: str,
    layout: ModelLayout,
    machine: Machine,
    request: PlanRequest,
) -> Replan:
    """The re-plan a confirm round uses: the same file (quant), the planner's own policy with
    llama.cpp's corrections (q8_0 KV or more experts on the host where the request allows), and
    when nothing fits at the requested context, the largest context that does."""
    from quantpick.errors import NoFitError
    from quantpick.plan.planner import max_context, plan

    fixed = replace(request, quant=quant)

    layouts = {quant: layout}

    def run(overheads: Overheads) -> Plan:
        try:
            return plan(manifest, machine, layouts, fixed, overheads=overheads)
        except NoFitError:
            limits = max_context(manifest, machine, layouts, fixed, overheads=overheads)
            ctx = max((lim.max_context for lim in limits), default=0)
            target = request.ctx_size or manifest.architecture.context_length
            if ctx <= 0 or ctx >= target:
                raise
            return plan(
                manifest, machine, layouts, replace(fixed, ctx_size=ctx), overheads=overheads
            )

    return run


# ----------------------------------------------------------------------------------------------
# Bench: measure the plan on this machine and derive its calibration profile.


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
    from quantpick.plan.planner import speed_params_for
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
    block_count = manifest.architecture.block_count
    gpu_indices = [g.gpu_index for g in p.estimate.gpus if g.gpu_index is not None]
    notes: list[str] = []
    if bench_bin is not None:
        binary = bench_bin
        measurement = run_llama_bench(
            bench_bin, p.config, model_path, block_count, settings,
            gpu_indices=gpu_indices, progress=progress, backend=local_backend(machine.gpus),
        )  # fmt: skip
        ran = bench_config(p.config, settings)
    else:
        assert server_bin is not None
        binary = server_bin
        measurement = run_llama_server(
            server_bin, p.config, model_path, block_count, settings,
            vocab_size=layout.architecture.vocab_size, gpu_indices=gpu_indices, progress=progress,
            backend=local_backend(machine.gpus),
        )  # fmt: skip
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
        argv, env = fit_params_argv(fit_bin, ran, model_path, block_count,
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


# ----------------------------------------------------------------------------------------------
# Serve: the `get` recipe, then llama-server with the plan's flags until it answers.


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
    progress: ProgressSink | None = None,
    on_plan: Any = None,
    live: Any = None,
    on_confirmed: Callable[[ConfirmReport | None], None] | None = None,
    on_start: Callable[[int, Path, FoundServer, str | None], None] | None = None,
    on_wait: Callable[[float, str | None], None] | None = None,
) -> ServeResult:
    """Plan, fetch or reuse and verify (`get`), confirm with llama.cpp, then start llama-server
    with the plan's flags and wait until /health answers. Raises ServerError (exit 8) when no
    llama-server is found, its build predates the architecture, or it fails to load; the
    process is stopped on every failure or interruption before it is ready. Callbacks: `on_plan`
    (the quant is chosen), `on_confirmed` (llama.cpp's check, before the start), `on_start`
    (each launch: port, log file, which llama-server), `on_wait` (while it loads)."""
    from quantpick.errors import ServerError
    from quantpick.machine.llamacpp import locate_llama_server, not_found_message
    from quantpick.serve.command import build_command, build_too_old
    from quantpick.serve.flags import capabilities_for
    from quantpick.serve.server import start_server

    g = req.get
    if g.llama_server is None and req.llama_server is None and req.llama_bin is not None:
        # --llama-bin: the llama-server there is the build the plan's compute rule is for
        candidate = req.llama_bin / "llama-server"
        if candidate.is_file():
            g = replace(g, llama_server=candidate)
    manifest = g.manifest
    fetched: GetResult | None = None
    tuning: Tuning | None
    if req.local_file is not None:
        quant = req.local_quant or manifest.files[0].quant
        model_path, mmproj_path = req.local_file, req.mmproj_path
        from quantpick.model.local import local_layout

        # the plan recipe `command --gguf` uses: the build's compute rule and this machine's
        # calibrations (speed and memory) apply to a file on disk as to a fetched one
        planned = plan_for(
            PlanInputs(manifest, g.machine, replace(g.plan_request, quant=quant), g.overheads,
                       llama_server=g.llama_server, gpu_overhead_given=g.gpu_overhead_given,
                       calibration=g.calibration, local=local_layout(model_path, quant)),
            settings=settings,
        )  # fmt: skip
        p, tuning = planned.plan, planned.tuning
        if on_plan is not None:
            on_plan(p)
        confirmation = None
        if g.confirm is not None:
            confirmation = confirm_local_plan(
                p, manifest, model_path, g.machine, planned.inputs.request,
                planned.inputs.overheads, g.confirm,
            )  # fmt: skip
            p = confirmation.plan
    else:
        fetched = get(replace(g, dry_run=False), settings=settings, progress=progress,
                      on_plan=on_plan, live=live)  # fmt: skip
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
            from quantpick.serve.server import remove_record, stop_process

            stop_process(running.process.pid, process=running.process)
            remove_record(directory, running.record)
            raise
    return result


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


# ----------------------------------------------------------------------------------------------
# Check: a running llama-server beside its plan (quantpick check, and the end of serve).


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
    from quantpick.serve.server import list_records, process_memory
    from quantpick.serve.server_log import read_log

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
            from quantpick.machine.probe import gpu_memory_use

            use, note = gpu_memory_use(record.pid)
            if note:
                problems.append(note)
            # named as the plan's GPUs are (NVML's index = the backend's in PCI bus order)
            planned_gpus = (parse_device_name(d.device) for d in planned.devices)
            named = next((p[0] for p in planned_gpus if p is not None), default_gpu_backend())
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
