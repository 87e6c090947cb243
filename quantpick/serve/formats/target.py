"""What the formats that hand a plan to another tool (router preset, llama-swap, Ollama,
LM Studio) need besides the command: the model's files, the memory per device, sampling, the
chat template (`Target`, built by the CLI from the plan)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from quantpick.model.manifest import Sampling


@dataclass(frozen=True)
class DeviceUse:
    """One device of the plan: what the model takes there and what the machine allows."""

    device: str  # "CUDA0", "RPC0", "CPU"
    total_bytes: int
    budget_bytes: int


@dataclass(frozen=True)
class Target:
    """What the ecosystem outputs need besides the command."""

    name: str  # the model name clients ask for (the alias)
    quant: str
    plan_comment: str
    ctx_size: int
    n_parallel: int
    n_gpu_layers: int
    model_files: tuple[Path, ...] = ()  # every file of the quant (shards), first one first
    model_bytes: int = 0  # their size (known before they are downloaded)
    mmproj_path: Path | None = None
    devices: tuple[DeviceUse, ...] = ()
    machine_key: str = ""  # the machine the plan was made for (router sizing)
    machine_label: str = ""
    hf_repo: str | None = None  # "org/Repo" of the model's Hugging Face source
    sampling: Sampling | None = None
    chat_template: str | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "on"
    n_cpu_moe: int = 0  # experts of the first N layers in host memory
    override_tensors: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] | None = None
    kv_unified: bool = False
    rpc: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


def machine_key(parts: Sequence[str]) -> str:
    """A short stable name for a machine from what identifies it (GPU UUIDs or names and sizes,
    host RAM, RPC endpoints)."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
