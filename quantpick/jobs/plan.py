"""The plan recipe every command that plans goes through: the installed build's compute rule and
this machine's calibration applied (jobs/tuning.py), then the plan on the best layouts at hand: a
file's own header, else the chosen quant's exact header when it can be had."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from quantpick.jobs.tuning import Tuning, local_tuning, tune

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.jobs.tuning import Tuning
    from quantpick.machine.spec import Machine
    from quantpick.model.headers import LayoutSource
    from quantpick.model.layout import ModelLayout
    from quantpick.model.manifest import Manifest
    from quantpick.plan.memory import Overheads
    from quantpick.plan.plan_types import Plan, PlanRequest
    from quantpick.plan.planner import ContextLimit
    from quantpick.plan.speculative import SpecRequest


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
        # `resolved` reads the upgraded layout from `layouts` (PlanLayouts)
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
    request, overheads = tune(
        inputs.request, inputs.overheads, tuning, gpu_overhead_given=inputs.gpu_overhead_given
    )
    return replace(inputs, request=request, overheads=overheads), tuning


def plan_for(inputs: PlanInputs, *, settings: Settings | None = None) -> PlanResult:
    """The plan for `inputs`: tuned, then on the file's own header (`local`) or on the exact
    header of the chosen quant when it can be had."""
    from quantpick.model.headers import LayoutSource, manifest_contradictions
    from quantpick.plan.planner import plan

    inputs, tuning = tuned(inputs, settings=settings)
    if inputs.local is not None:
        quant = inputs.request.quant or inputs.local.quant or inputs.manifest.quants[0]
        request = replace(inputs.request, quant=quant, spec=_with_target_vocab(inputs))
        p = plan(
            inputs.manifest, inputs.machine, {quant: inputs.local}, request,
            overheads=inputs.overheads,
        )  # fmt: skip
        return PlanResult(p, replace(inputs, request=request), tuning)
    layouts = LayoutSource(
        inputs.manifest, exact=inputs.exact, network=inputs.network, settings=settings,
        local_copy=_verified_copy(inputs, settings),
    )  # fmt: skip
    p = plan_exact(inputs.manifest, inputs.machine, layouts, inputs.request, inputs.overheads)
    contradictions = manifest_contradictions(inputs.manifest, p.quant, layouts(p.quant))
    return PlanResult(p, inputs, tuning, tuple(layouts.problems), tuple(contradictions))


def _with_target_vocab(inputs: PlanInputs) -> SpecRequest:
    """The request's speculation with the local file's vocabulary (token texts included) for
    the draft check, where a draft is given."""
    spec = inputs.request.spec
    local = inputs.local
    if spec.draft is None or local is None or not local.basis.startswith("gguf:"):
        return spec
    from quantpick.model.local import local_vocabulary

    path = Path(local.basis[len("gguf:") :])
    if not path.is_file():
        return spec
    return replace(spec, target_vocab=local_vocabulary(path, local))


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


def _verified_copy(
    inputs: PlanInputs, settings: Settings | None
) -> Callable[[str], Path | None] | None:
    """A quant's file in `inputs.local_dir` already known (sha256 cache) to be the pinned one, so
    its own header is read with no hub; None when there is no such directory."""
    local_dir = inputs.local_dir
    if local_dir is None:
        return None

    def copy(quant: str) -> Path | None:
        from quantpick.config import load_settings
        from quantpick.fetch.offline import known_local_copy

        return known_local_copy(inputs.manifest, quant, local_dir, settings or load_settings())

    return copy
