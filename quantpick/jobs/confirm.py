"""Confirm: llama.cpp's own projection of a plan on this machine's devices (llama-fit-params),
re-planned on its figures when a device overflows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine
    from quantpick.model.layout import ModelLayout
    from quantpick.model.manifest import Manifest
    from quantpick.plan.confirm import Confirmation
    from quantpick.plan.memory import Overheads
    from quantpick.plan.plan_types import Plan, PlanRequest


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
    from quantpick.machine.backends import local_backend
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
                f"llama.cpp projects the plan will not fit ({overflow_text(confirmation)}); "
                f"re-planned with its figures: {exc.message}",
                hint=exc.hint,
            ) from exc
    replans = len(rounds) - 1
    raise NoFitError(
        "llama.cpp projects the plan will not fit: over budget on "
        + overflow_text(rounds[-1].confirmation)
        + (f", also after {replans} re-plan(s) with its own figures" if replans else ""),
        hint="try a shorter -c, --allow-q4-kv, or free memory on the GPUs",
    )


def overflow_text(confirmation: Confirmation) -> str:
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
