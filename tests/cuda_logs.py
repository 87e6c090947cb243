"""Public CUDA logs of qwen35moe (tests/data/cuda-logs.json) beside quantpick's compute figures:
shared by tests/plan/test_compute.py and benchmarks/cuda_logs_accuracy.py.

Each row is rebuilt as a one-GPU machine of the log's size running the recorded real config
(tests/data/arch-real/qwen3.6-35b-a3b.json) with the log's flags; the build class decides the
logits rows and the host's mask as plan/build_class.py does for that build.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arch_real import load

from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.plan.build_class import apply_rule, compute_rule
from quantpick.plan.memory import RunConfig, estimate

DATA = Path(__file__).resolve().parent / "data" / "cuda-logs.json"
MiB = 1024**2
GiB = 1024**3


@dataclass(frozen=True)
class LogRow:
    id: str
    buffer: str  # "CUDA0" | "CUDA_Host"
    ours_mib: float
    theirs_mib: float
    flags_complete: bool

    @property
    def error(self) -> float:
        return self.ours_mib / self.theirs_mib - 1


def config(row: dict[str, Any]) -> RunConfig:
    f = row["flags"]
    base = RunConfig(
        ctx_size=f["ctx"],
        ubatch=f["ubatch"],
        batch=f["batch"],
        cpu_moe=f.get("cpu_moe", False),
        flash_attn=f["fa"],
        n_parallel=f["np"],
        cache_type_k=f.get("ctk", "f16"),
        cache_type_v=f.get("ctv", "f16"),
    )
    build = compute_rule(None, 9000, None) if row["build"] == "pre-cap" else (
        compute_rule("0.5.0-dev", 11312, None)
    )  # fmt: skip
    return apply_rule(base, build)


def rows() -> list[LogRow]:
    doc = json.loads(DATA.read_text())
    _, layout = load(DATA.parent / doc["model"])
    out = []
    for row in doc["rows"]:
        gpu = Gpu(index=0, name="GPU", total_bytes=row["gpu_gib"] * GiB,
                  free_bytes=row["gpu_gib"] * GiB)  # fmt: skip
        machine = Machine(gpus=(gpu,), host=Host(128 * GiB, 128 * GiB, 8))
        est = estimate(layout, machine, config(row))
        ours = {"CUDA0": est.gpus[0].compute_bytes, "CUDA_Host": est.host.compute_bytes}
        for buffer, theirs in row["compute_mib"].items():
            out.append(LogRow(row["id"], buffer, ours[buffer] / MiB, theirs, row["flags_complete"]))
    return out
