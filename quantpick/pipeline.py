"""The whole job, stage by stage: machine -> model -> plan -> fetch -> serve.

Functions here join the stages (each stage is its own package and knows nothing of the others'
I/O); the CLI parses options, calls one of these and renders what comes back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine
    from quantpick.model.headers import LayoutSource
    from quantpick.model.manifest import Manifest
    from quantpick.plan.memory import Overheads
    from quantpick.plan.planner import Plan, PlanRequest


def plan_exact(
    manifest: Manifest,
    machine: Machine,
    layouts: LayoutSource,
    request: PlanRequest,
    overheads: Overheads,
) -> Plan:
    """Plan, then redo it on the chosen quant's exact header (at most three rounds)."""
    from quantpick.plan.planner import plan

    p = plan(manifest, machine, layouts, request, overheads=overheads)
    for _ in range(3):
        if not layouts.upgrade(p.quant):
            break
        p = plan(manifest, machine, layouts, request, overheads=overheads)
    return p
