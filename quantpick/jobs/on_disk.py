"""A file already on disk (`command`, `confirm`, `bench`): the plan on its own header, through the
plan recipe (the installed build's compute rule, this machine's calibration), then llama.cpp's
confirmation of it (llama-fit-params on the file itself)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantpick.jobs.confirm import confirm_local_plan
from quantpick.jobs.plan import plan_for

if TYPE_CHECKING:
    from pathlib import Path

    from quantpick.config import Settings
    from quantpick.jobs.confirm import ConfirmOptions, ConfirmReport
    from quantpick.jobs.plan import PlanInputs, PlanResult
    from quantpick.plan.plan_types import Plan


@dataclass(frozen=True)
class FilePlan:
    result: PlanResult  # the plan on the file's header, with the tuning it was made with
    confirmation: ConfirmReport | None  # None: confirming off (or not this machine)

    @property
    def plan(self) -> Plan:
        """The plan to run: llama.cpp's confirmed (or re-planned) one when it was asked."""
        return self.confirmation.plan if self.confirmation is not None else self.result.plan


def plan_file(
    inputs: PlanInputs,
    model_path: Path,
    confirm: ConfirmOptions | None,
    *,
    settings: Settings | None = None,
) -> FilePlan:
    """The plan for the file at `model_path` (`inputs.local`: its layout), confirmed by llama.cpp
    with `confirm`."""
    result = plan_for(inputs, settings=settings)
    if confirm is None:
        return FilePlan(result, None)
    tuned = result.inputs
    report = confirm_local_plan(
        result.plan, tuned.manifest, model_path, tuned.machine, tuned.request, tuned.overheads,
        confirm,
    )  # fmt: skip
    return FilePlan(result, report)
