"""What a plan is: the request (what the user asks for), each candidate weighed with the reason it
won or lost, and the plan chosen. Plain dataclasses, pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from quantpick.model.manifest import ModelFile
from quantpick.plan.bandwidth_bound import SpeedEstimate
from quantpick.plan.build_class import PINNED, ComputeRule
from quantpick.plan.calibration import Calibration
from quantpick.plan.memory import (
    Estimate,
    RunConfig,
)
from quantpick.plan.quality import Quality
from quantpick.plan.speculative import SpecDecision, SpecRequest

DEFAULT_KV_TYPES = ("f16", "q8_0")


# A usable decode speed: about reading speed (people read ~5 tok/s of English; 250 words a minute).
DEFAULT_MIN_TPS = 5.0


POLICIES = ("balanced", "quality", "speed")


class Placement(str, Enum):
    """Where a plan puts the model (str values: --json documents and tests compare them)."""

    GPU = "gpu"  # every layer on the GPUs
    EXPERT_OFFLOAD = "expert-offload"  # routed experts of some layers in host RAM
    LAYER_OFFLOAD = "layer-offload"  # some whole layers in host RAM (-ngl N)
    CPU = "cpu"  # no GPU
    NONE = "none"  # does not fit
    NOT_SEARCHED = "not searched"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PlanRequest:
    ctx_size: int  # target context (-c); 0 = the model's own context length
    n_parallel: int = 1
    kv_unified: bool = False
    kv_types: tuple[str, ...] = DEFAULT_KV_TYPES  # allowed, best first
    prefer: str = "balanced"  # "balanced" | "quality" | "speed"
    quant: str | None = None  # fix the quant
    vision: bool = False
    min_tps: float = DEFAULT_MIN_TPS  # expected decode tok/s at the target context, every plan
    ubatch: int = 512
    batch: int = 2048
    flash_attn: str = "on"
    efficiency: float = 1.0  # speed calibration factor (1.0 = the bandwidth bound)
    allow_offload: bool = True
    # The installed llama.cpp build's compute rule (plan/build_class.py); none: the pinned build's.
    compute_rule: ComputeRule = PINNED
    # This machine's measured speed factors (quantpick bench), applied to every speed figure.
    calibration: Calibration | None = None
    # Speculative decoding: off, auto or a kind (plan/speculative.py decides on the chosen plan)
    spec: SpecRequest = field(default_factory=SpecRequest)


@dataclass(frozen=True)
class Candidate:
    quant: str
    quality_rank: int
    cache_type: str  # K and V cache type
    placement: Placement
    fits: bool  # fits every device's budget
    feasible: bool  # fits and meets the speed floor where it applies
    reason: str
    config: RunConfig | None = None
    estimate: Estimate | None = None
    speed: SpeedEstimate | None = None
    shortfall_bytes: int = 0  # does not fit: bytes over budget on the worst device
    shortfall_device: str | None = None
    quality: Quality | None = None


@dataclass(frozen=True)
class Plan:
    model: str
    quant: str
    files: tuple[ModelFile, ...]
    projector: ModelFile | None
    config: RunConfig
    estimate: Estimate
    speed: SpeedEstimate
    placement: Placement
    policy: str
    layout_basis: str
    candidates: tuple[Candidate, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    quality: Quality | None = None
    why: str = ""  # the pick in one line
    compute_rule: ComputeRule = PINNED  # the llama.cpp build class the compute assumes
    calibration: Calibration | None = None  # applied to the speed figures, when measured here
    arch: str = ""  # general.architecture of the planned file
    n_slots: int = 0  # llama.cpp's layer slots (-ngl counts them): block_count + 1
    # The speculative-decoding decision (None: not asked, --spec off by the library's default)
    speculative: SpecDecision | None = None


def expected_tps(speed: SpeedEstimate) -> float:
    """Expected decode tok/s at the target context (the figure policies and --min-tps use)."""
    if speed.expected is None:  # an estimate without the fitted model: the bandwidth bound
        return float(speed.tokens_per_s_target)
    return float(speed.expected.decode_tps_target)
