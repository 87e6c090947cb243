"""llama.cpp's own test models of every architecture, and its projection of each in bytes.

`tests/test-llama-archs -o DIR` (built from the pinned tree by scripts/build-llamacpp.sh) writes a
random tiny GGUF of every architecture llama.cpp loads: what llama.cpp itself considers a valid
model of each family. `llama-memory-bytes` (scripts/llamacpp-memory/, built beside it) loads a
model as llama-fit-params does (no_alloc) and prints every device's model / context / compute
bytes; it takes --kv-unified, which llama-fit-params in b11312 does not. floor(bytes / MiB) equals
llama-fit-params' figure on all 21,555 grid rows checked (docs/architectures.md).

Used by scripts/record_arch_conformance.py (writes tests/data/llamacpp-archs.json.gz) and by the
live test in tests/arch/test_conformance.py.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.plan.memory import RunConfig

GiB = 1024**3
MODELS_TIMEOUT_S = 300.0
RUN_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Case:
    """One configuration, as llama.cpp's flags and as quantpick's RunConfig."""

    ctx: int
    np: int = 1
    kv: str = "f16"
    fa: str = "on"
    kvu: bool = False
    rpc: bool = False  # two CPU RPC workers (RPC0, RPC1) instead of the host alone
    ngl: int | None = None  # None: all
    ts: tuple[float, ...] | None = None
    n_cpu_moe: int = 0
    nkvo: bool = False
    swa_full: bool = False
    moe_only: bool = False  # only for models with experts

    def flags(self) -> list[str]:
        out = ["-c", str(self.ctx), "-np", str(self.np), "-ctk", self.kv, "-ctv", self.kv]
        out += ["-fa", self.fa]
        if self.kvu:
            out.append("-kvu")
        if not self.rpc:
            out += ["-dev", "none"]
        else:
            out += ["-ngl", "all" if self.ngl is None else str(self.ngl)]
            if self.ts is not None:
                out += ["-ts", ",".join(f"{v:g}" for v in self.ts)]
        if self.n_cpu_moe:
            out += ["--n-cpu-moe", str(self.n_cpu_moe)]
        if self.nkvo:
            out.append("-nkvo")
        if self.swa_full:
            out.append("--swa-full")
        return out

    def config(self) -> RunConfig:
        return RunConfig(
            ctx_size=self.ctx,
            n_parallel=self.np,
            kv_unified=self.kvu,
            cache_type_k=self.kv,
            cache_type_v=self.kv,
            flash_attn=self.fa,
            n_gpu_layers=self.ngl if self.rpc else None,
            tensor_split=self.ts if self.rpc else None,
            n_cpu_moe=self.n_cpu_moe,
            kv_offload=not self.nkvo,
            swa_full=self.swa_full,
            logits_rows="batch",
        )

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


# The grid: context padding and streams (np 3, 33000 tokens), unified KV, a quantized cache, flash
# attention off (V padding), SWA at full size, two devices split by -ts, a partial -ngl (the
# output layer first), KV on the host (-nkvo), routed experts in host memory.
GRID: tuple[Case, ...] = (
    Case(4096),
    Case(33000, np=3, kv="q8_0"),
    Case(33000, np=3, kvu=True),
    Case(4096, fa="off"),
    Case(4096, swa_full=True),
    Case(33000, rpc=True, ts=(1, 1)),
    Case(4096, np=3, kv="q8_0", rpc=True, ngl=1, ts=(3, 1)),
    Case(4096, rpc=True, ts=(3, 1), nkvo=True),
    Case(4096, np=2, kvu=True, rpc=True, ts=(1, 1)),
    Case(4096, rpc=True, ts=(1, 1), n_cpu_moe=1, moe_only=True),
)


def case_from_dict(data: dict[str, Any]) -> Case:
    data = dict(data)
    if data.get("ts") is not None:
        data["ts"] = tuple(data["ts"])
    return Case(**data)


def machine(rpc: bool) -> Machine:
    """The machine llama.cpp saw: the host alone, or two CPU RPC workers as RPC0 and RPC1 (their
    buffers are CPU buffers: 32-byte alignment, no row padding)."""
    gpus = (
        tuple(
            Gpu(index=i, name=f"RPC{i}", total_bytes=64 * GiB, free_bytes=64 * GiB, backend="CPU")
            for i in range(2)
        )
        if rpc
        else ()
    )
    return Machine(
        gpus=gpus, host=Host(ram_total_bytes=128 * GiB, ram_available_bytes=128 * GiB, cpu_cores=2)
    )


def generate_models(bin_dir: Path, out_dir: Path) -> dict[str, Path]:
    """Every model test-llama-archs writes: "<arch>-<dense|moe>" -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(bin_dir / "test-llama-archs"), "-o", str(out_dir)],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=MODELS_TIMEOUT_S,
    )
    return {p.stem: p for p in sorted(out_dir.glob("*.gguf"))}


@dataclass
class Projection:
    """llama.cpp's bytes per device ("Host", "RPC0", "RPC1"), or why it refused the case."""

    devices: dict[str, dict[str, int]] = field(default_factory=dict)
    error: str | None = None


def project(bin_dir: Path, model: Path, case: Case, endpoints: Iterable[str]) -> Projection:
    argv = [str(bin_dir / "llama-memory-bytes"), "-m", str(model), "--log-disable", *case.flags()]
    if case.rpc:
        argv += ["--rpc", ",".join(endpoints)]
    run = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=RUN_TIMEOUT_S,
    )
    line = next((x for x in run.stdout.splitlines() if x.startswith("{")), None)
    if run.returncode != 0 or line is None:
        return Projection(error=(run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1])
    doc = json.loads(line)
    return Projection(
        {
            d["name"]: {"model": d["model"], "context": d["context"], "compute": d["compute"]}
            for d in doc["devices"]
        }
    )
