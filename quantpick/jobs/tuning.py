"""This machine's own llama.cpp: which build class the compute assumes, and its calibration."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.machine.spec import LlamaServer, Machine
    from quantpick.plan.build_class import ComputeRule
    from quantpick.plan.calibration import Calibration
    from quantpick.plan.memory import Overheads
    from quantpick.plan.memory_calibration import MemoryCalibration
    from quantpick.plan.plan_types import PlanRequest


# Which build each llama-server binary is (machine/llamacpp.remembered_llama_server).
BUILD_MEMO = "llama-server-builds.json"


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
    file that recorded one (`probe --json`), else from llama-server on PATH; none: the pinned
    build's.
    `sizes`: the planned model's file sizes (a profile applies to a model of its size class);
    `use_calibration=False`: --no-calibration."""
    from quantpick.app_dirs import app_dirs
    from quantpick.machine.llamacpp import find_llama_server, remembered_llama_server
    from quantpick.plan.build_class import PINNED, compute_rule
    from quantpick.plan.calibration import build_id

    notes: list[str] = []
    recorded = machine.llama_server
    server: LlamaServer | None
    if llama_server is None and recorded is not None and recorded.build is not None:
        server = recorded
    else:
        path = find_llama_server(llama_server)
        # the cache directory alone (no config file read for it)
        cache = settings.cache_dir if settings is not None else app_dirs(os.environ).cache
        memo = cache / BUILD_MEMO
        server = remembered_llama_server(path, memo) if path is not None else None
        if server is not None and server.error is not None:
            notes.append(f"llama-server at {path}: {server.error}")
            server = None
    if server is None:
        rule, build = PINNED, build_id(None, None, None)
    else:
        rule = compute_rule(server.version, server.build, server.commit)
        build = build_id(server.build, server.commit, server.version)
    if machine.described:
        return Tuning(rule, notes=tuple(notes), build=build)
    if not use_calibration:
        return Tuning(rule, notes=(*notes, "calibration off (--no-calibration): uncalibrated"),
                      build=build)  # fmt: skip
    # a profile is this machine's: read only when planning for it
    from quantpick.serve.calibration import load_calibration, load_memory_calibration

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


def tuned_overheads(overheads: Overheads, tuning: Tuning, *, gpu_overhead_given: bool) -> Overheads:
    """`overheads` with this machine's measured driver overhead per GPU, unless --gpu-overhead
    was given: the user's figure wins over a measured one."""
    from quantpick.plan.calibration import apply_overheads

    if tuning.calibration is None or gpu_overhead_given:
        return overheads
    return apply_overheads(overheads, tuning.calibration)


def tune(
    request: PlanRequest, overheads: Overheads, tuning: Tuning, *, gpu_overhead_given: bool = False
) -> tuple[PlanRequest, Overheads]:
    """The request and overheads with the build's compute rule and the calibration applied."""
    request = replace(request, compute_rule=tuning.rule, calibration=tuning.calibration)
    overheads = tuned_overheads(overheads, tuning, gpu_overhead_given=gpu_overhead_given)
    if tuning.memory is not None:
        # compute ratios learned by `check --learn` (plan/memory_calibration.py)
        overheads = replace(overheads, compute_ratio_by_device=tuning.memory.ratios,
                            compute_basis=tuning.memory.label)  # fmt: skip
    return request, overheads
