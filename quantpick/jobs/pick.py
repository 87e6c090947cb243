"""`quantpick pick`: the plan (jobs/plan.py), then llama.cpp's dry run of the chosen file before
download (jobs/dry_run.py), re-planned on its figures when a device overflows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantpick.jobs.plan import plan_for

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.jobs.confirm import ConfirmOptions, ConfirmReport
    from quantpick.jobs.plan import PlanInputs, PlanResult
    from quantpick.plan.plan_types import Plan


@dataclass(frozen=True)
class Picked:
    result: PlanResult  # the plan recipe's answer, with its notes and header problems
    dry_run: ConfirmReport | None  # None: not run (confirming off, described machine, no tool)

    @property
    def plan(self) -> Plan:
        """The plan to show: llama.cpp's re-plan when its dry run changed it."""
        report = self.dry_run
        if report is not None and report.status in ("confirmed", "replanned"):
            return report.plan
        return self.result.plan


def pick(
    inputs: PlanInputs, confirm: ConfirmOptions | None, *, settings: Settings | None = None
) -> Picked:
    """The plan for `inputs`; with `confirm`, llama.cpp's dry run of it on this machine."""
    result = plan_for(inputs, settings=settings)
    if confirm is None:
        return Picked(result, None)
    from quantpick.jobs.dry_run import dry_run

    if settings is None:
        from quantpick.config import load_settings

        settings = load_settings()
    return Picked(result, dry_run(result, confirm, settings=settings))
