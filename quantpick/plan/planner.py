"""Choose the quant, KV cache type and placement for a model, a machine and a target context. Pure.

Inputs are data (manifest, machine, each quant's layout, a request); the result is data (the
chosen plan and every candidate with the reason it lost). No I/O, no environment: the pipeline
resolves the layouts (header cache, hub, or synthesized) before it calls the planner.

Quality is measured (plan/quality.py: mean KLD vs BF16 and a tier of what a person would notice);
speed is expected (plan/speed.py); `min_tps` applies to the expected decode at the target context.

Policies (`PlanRequest.prefer`):
- "balanced" (default): the best quality tier that fits and is usable; experts in host RAM only
  when they buy a tier over the best full-GPU plan; within the tier, the highest quality unless a
  same-tier plan is safer (room) or meaningfully faster while speed is below comfortable. BF16 is
  never picked by default.
- "quality": the highest-quality plan (lowest KLD) that fits and reaches `min_tps`, BF16 included.
- "speed": the fastest plan at or above the SPEED_FLOOR_TIER quality floor, full GPU first; when
  nothing fits on the GPUs, the fastest offload plan (not the largest).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from quantpick.errors import NoFitError, UsageError
from quantpick.machine.spec import Machine
from quantpick.model.layout import ModelLayout
from quantpick.model.manifest import Manifest, ModelFile
from quantpick.plan.build_class import CONSERVATIVE, ComputeRule, apply_rule
from quantpick.plan.calibration import Calibration, calibrate_speed
from quantpick.plan.memory import (
    DESCRIBED_HOST_RESERVE,
    Estimate,
    LlamaDevice,
    Overheads,
    RunConfig,
    estimate,
    kv_type_problem,
    llama_devices,
    rpc_devices,
)
from quantpick.plan.quality import FAMILY, GENERIC, Quality, model_of, quality_of
from quantpick.plan.speculative import (
    SpecDecision,
    SpecRequest,
    speculation,
    verify_efficiency,
)
from quantpick.plan.speed import (
    DEFAULT_GPU_BANDWIDTH,
    DEFAULT_SPEED_PARAMS,
    DeviceSpeed,
    SpeedEstimate,
    SpeedParams,
    decode_speed,
    device_speeds,
    expected_speed,
)

GiB = 1024**3
DEFAULT_KV_TYPES = ("f16", "q8_0")
# A usable decode speed: about reading speed (people read ~5 tok/s of English; 250 words a minute).
DEFAULT_MIN_TPS = 5.0
POLICIES = ("balanced", "quality", "speed")
# llama.cpp's --fit never shrinks below 4096 (fit-ctx default); the planner's smallest context.
MIN_CONTEXT = 4096

# quant -> its layout, resolved by the caller (pipeline) before planning.
Layouts = Mapping[str, ModelLayout]


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
    # The installed llama.cpp build's compute rule (plan/build_class.py); unknown: conservative.
    compute_rule: ComputeRule = CONSERVATIVE
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
    compute_rule: ComputeRule = CONSERVATIVE  # the llama.cpp build class the compute assumes
    calibration: Calibration | None = None  # applied to the speed figures, when measured here
    arch: str = ""  # general.architecture of the planned file
    n_slots: int = 0  # llama.cpp's layer slots (-ngl counts them): block_count + 1
    # The speculative-decoding decision (None: not asked, --spec off by the library's default)
    speculative: SpecDecision | None = None


# ----------------------------------------------------------------------------------------------


def device_bandwidths(machine: Machine) -> dict[str, int]:
    """Device name -> bandwidth the bound uses (assumed figures included; see device_speeds)."""
    return {name: d.bandwidth_bytes_per_s for name, d in device_speeds(machine).items()}


def speed_params_for(machine: Machine) -> SpeedParams:
    """The expected-speed constants for the llama.cpp build this machine runs (if known)."""
    server = machine.llama_server
    return DEFAULT_SPEED_PARAMS.for_build(server.build if server is not None else None)


def all_workers(machine: Machine) -> tuple[str, ...]:
    """Every RPC worker of the machine, as llama-server's --rpc lists them."""
    return tuple(w.endpoint for w in machine.rpc_workers)


def _overflow(est: Estimate) -> tuple[int, str | None]:
    worst, where = 0, None
    for d in est.devices:
        over = d.total_bytes - d.budget_bytes
        if over > worst:
            worst, where = over, d.device
    return worst, where


# The multi-GPU --n-cpu-moe search past the smallest N that fits: every N up to OFFLOAD_WALK
# steps past it, then every stride-th N while the host fits, then the N around the best of those.
# The stride is the architecture's attention period (ModelView.attention_period: one layer with
# its own KV in every 4 for qwen35moe), the step where a split's speed changes most; at least
# OFFLOAD_STRIDE_MIN so that the walk stays short on a dense-attention model. Why a search at
# all: on a 15 GiB 2039 GB/s card beside a 22 GiB 192 GB/s one at -c 259072, more experts in
# RAM let the attention layers leave the slow card, 1.5-1.85x the expected decode of the
# smallest N.
# Measured against trying every N (python benchmarks/offload_search.py) in the note on #10.
OFFLOAD_WALK = 4
OFFLOAD_STRIDE_MIN = 4


def _gpu_overflow(est: Estimate) -> int:
    return max((d.total_bytes - d.budget_bytes for d in est.gpus), default=0)


@dataclass(frozen=True)
class _Bracket:
    """Where the ends of the two-GPU fitting interval are known to lie: the largest a (slots on
    GPU0) with GPU0 fitting in [a_max_lo, a_max_hi], the smallest with GPU1 fitting in
    [a_min_lo, a_min_hi]."""

    a_max_lo: int
    a_max_hi: int
    a_min_lo: int
    a_min_hi: int


@dataclass
class _Search:
    layout: ModelLayout
    machine: Machine
    overheads: Overheads
    projector_bytes: int
    bandwidths: dict[str, int]
    efficiency: float
    target_context: int
    calibration: Calibration | None = None
    bounds: tuple[int, int] = (0, -1)  # (a_min, a_max) of the last two-GPU split search
    _speeds: dict[int, tuple[Estimate, SpeedEstimate]] = field(default_factory=dict, repr=False)

    def run(self, config: RunConfig) -> Estimate:
        return estimate(
            self.layout,
            self.machine,
            config,
            overheads=self.overheads,
            projector_bytes=self.projector_bytes,
        )

    @functools.cached_property
    def device_speeds(self) -> dict[str, DeviceSpeed]:
        return device_speeds(self.machine)

    @functools.cached_property
    def speed_params(self) -> SpeedParams:
        return speed_params_for(self.machine)

    def speed(self, est: Estimate) -> SpeedEstimate:
        """The bound, with the expected speed beside it (the one place the planner computes
        speed; policies read `speed.expected.decode_tps_target`). Remembered per estimate: the
        split search weighs a plan, then the placement and offload searches read it again."""
        seen = self._speeds.get(id(est))
        if seen is not None and seen[0] is est:
            return seen[1]
        result = self._speed(est)
        self._speeds[id(est)] = (est, result)  # the estimate is kept, so its id is not reused
        return result

    def _speed(self, est: Estimate) -> SpeedEstimate:
        bound = decode_speed(
            self.layout,
            est,
            self.bandwidths,
            target_context=self.target_context,
            efficiency=self.efficiency,
        )
        expected = expected_speed(
            self.layout,
            est,
            self.device_speeds,
            target_context=self.target_context,
            params=self.speed_params,
        )
        if self.calibration is not None:
            expected = calibrate_speed(expected, self.calibration)
        return replace(bound, expected=expected)

    def splits(self, devices: tuple[LlamaDevice, ...], n_slots: int) -> Iterable[tuple[int, ...]]:
        """Candidate layer counts per device (contiguous, as -ts with integer counts)."""
        gpus = [d.gpu for d in devices]
        n_gpu = len(devices)
        if n_gpu == 1:
            yield (n_slots,)
            return
        if n_gpu == 2:
            yield from ((a, n_slots - a) for a in range(n_slots, -1, -1))
            return
        # 3+ GPUs: shares by budget, by bandwidth, by both, and shifted variants.
        weights_list = [
            [g.free_bytes for g in gpus],
            [g.free_bytes * (g.bandwidth_bytes_per_s or DEFAULT_GPU_BANDWIDTH) for g in gpus],
        ]
        seen: set[tuple[int, ...]] = set()
        for weights in weights_list:
            total = sum(weights) or 1
            base = [int(n_slots * w / total) for w in weights]
            base[-1] += n_slots - sum(base)
            for shift in range(-6, 7):
                for i in range(n_gpu):
                    for j in range(n_gpu):
                        if i == j:
                            continue
                        counts = list(base)
                        counts[i] += shift
                        counts[j] -= shift
                        if min(counts) < 0:
                            continue
                        key = tuple(counts)
                        if key not in seen:
                            seen.add(key)
                            yield key

    def best_split(
        self, config: RunConfig, bracket: _Bracket | None = None
    ) -> tuple[Estimate | None, Estimate]:
        """(the fastest fitting estimate or None, the least-overflowing estimate). With two GPUs
        the ends of the fitting interval found are left in `self.bounds`; `bracket` narrows
        their bisection (from neighbouring --n-cpu-moe values)."""
        devices = llama_devices(self.machine, config)
        n_gpu = len(devices)
        # the slots on the GPUs: all, or the last -ngl of them (the split shares those)
        n_slots = min(config.n_gpu_layers or self.layout.n_slots, self.layout.n_slots)
        best: Estimate | None = None
        best_speed = -1.0
        least: Estimate | None = None
        least_over = math.inf
        if n_gpu >= 2:
            # Split-invariant lower bound: with every slot on the GPUs, their weights, KV and
            # state add up to the same bytes whatever the split, and the host's load does not
            # depend on it either. If either already overflows, no split can fit.
            budgets = [d.gpu.free_bytes for d in devices]
            even = tuple(float(b) for b in budgets)
            probe = self.run(replace(config, tensor_split=even))
            fixed = sum(d.weights_bytes + d.kv_bytes + d.recurrent_bytes for d in probe.gpus)
            if fixed > sum(d.budget_bytes for d in probe.gpus) or not probe.host.fits:
                return None, probe
        if n_gpu == 2:
            evaluated = self._two_gpu_candidates(config, n_slots, bracket)
        else:
            evaluated = (
                self.run(
                    replace(
                        config, tensor_split=tuple(float(c) for c in counts) if n_gpu > 1 else None
                    )
                )
                for counts in self.splits(devices, n_slots)
            )
        for est in evaluated:
            over, _ = _overflow(est)
            if over < least_over:
                least, least_over = est, over
            if est.fits:
                tps = expected_tps(self.speed(est))
                if tps > best_speed + 1e-9:
                    best, best_speed = est, tps
        assert least is not None
        return best, least

    def _two_gpu_candidates(
        self, config: RunConfig, n_slots: int, bracket: _Bracket | None = None
    ) -> Iterable[Estimate]:
        """GPU0's load grows with its slot count a, GPU1's shrinks: the feasible a form an
        interval. Find its ends by bisection instead of trying all n_slots+1 splits."""

        def at(a: int) -> Estimate:
            return self.run(replace(config, tensor_split=(float(a), float(n_slots - a))))

        def gpu_over(est: Estimate, pos: int) -> int:
            d = est.gpus[pos]
            return d.total_bytes - d.budget_bytes

        cache: dict[int, Estimate] = {}

        def get(a: int) -> Estimate:
            if a not in cache:
                cache[a] = at(a)
            return cache[a]

        def fits0(a: int) -> bool:
            return gpu_over(get(a), 0) <= 0

        def fits1(a: int) -> bool:
            return gpu_over(get(a), 1) <= 0

        # The bracket is only a hint: each end is checked before it narrows a bisection.
        b = bracket or _Bracket(0, n_slots, 0, n_slots)
        # largest a with GPU0 fitting
        if not fits0(0):
            a_max = -1
        else:
            lo = b.a_max_lo if 0 <= b.a_max_lo <= n_slots and fits0(b.a_max_lo) else 0
            hi = b.a_max_hi if lo <= b.a_max_hi < n_slots and not fits0(b.a_max_hi + 1) else n_slots
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if fits0(mid):
                    lo = mid
                else:
                    hi = mid - 1
            a_max = lo
        # smallest a with GPU1 fitting
        if not fits1(n_slots):
            a_min = n_slots + 1
        else:
            hi = b.a_min_hi if 0 <= b.a_min_hi <= n_slots and fits1(b.a_min_hi) else n_slots
            lo = b.a_min_lo if 0 < b.a_min_lo <= hi and not fits1(b.a_min_lo - 1) else 0
            while lo < hi:
                mid = (lo + hi) // 2
                if fits1(mid):
                    hi = mid
                else:
                    lo = mid + 1
            a_min = lo
        self.bounds = (a_min, a_max)
        if a_min <= a_max:
            # The balanced split first, so that it wins a tie (two equal devices, or two RPC
            # workers the speed model cannot tell apart) instead of leaving a device empty.
            # Speed is close to linear in the split between its ends, but for two steps: where
            # the attention layers (KV depth) fall, and, with --n-cpu-moe N, a switch of GPU at
            # a slot whose experts are in RAM costs no extra hop (GPU0 -> CPU -> GPU1), so the
            # split at N-1 is tried too.
            splits = [(a_min + a_max) // 2, a_min, a_max]
            if config.n_cpu_moe and a_min <= config.n_cpu_moe - 1:
                splits.append(min(a_max, config.n_cpu_moe - 1))
            for a in dict.fromkeys(splits):
                yield get(a)
        else:
            # nothing fits: report the split that balances the overflow best
            yield from cache.values()
            mid = max(0, min(n_slots, (a_min + a_max) // 2))
            yield get(mid)

    def place(
        self, base: RunConfig, allow_offload: bool, *, search_offload: bool = True
    ) -> tuple[Placement, Estimate | None, Estimate]:
        """(placement, the best fitting estimate or None, the least-overflowing estimate).
        search_offload=False: an expert-offload plan at the smallest --n-cpu-moe that fits, for
        faster_offload to improve later only where that can change the pick.

        When the GPUs cannot hold everything: a MoE model moves routed experts to host RAM
        first (--n-cpu-moe: they are read at 1/expert_count of their bytes per token), whole
        layers only if that is not enough; a dense model moves whole layers (-ngl N)."""
        n_gpu = len(llama_devices(self.machine, base))
        if n_gpu == 0:
            est = self.run(replace(base, n_gpu_layers=0, devices=(), rpc_servers=()))
            return (Placement.CPU, est if est.fits else None, est)
        best, least = self.best_split(base)
        if best is not None:
            return (Placement.GPU, best, best)
        if not allow_offload:
            return (Placement.NONE, None, least)
        if self.layout.view.is_moe:
            found, last_least = self._expert_offload(base, least)
            if found is not None:
                if search_offload:
                    found = self.faster_offload(base, found)
                return (Placement.EXPERT_OFFLOAD, found, found)
            if _gpu_overflow(last_least) <= 0:
                return (Placement.NONE, None, last_least)  # the host is the limit
            least = last_least
        found, least = self._layer_offload(base, least)
        if found is None:
            return (Placement.NONE, None, least)
        return (Placement.LAYER_OFFLOAD, found, found)

    def _expert_offload(self, base: RunConfig, least: Estimate) -> tuple[Estimate | None, Estimate]:
        """--n-cpu-moe N moves the routed experts of blocks 0..N-1 to host memory. GPU load falls
        as N grows, so bisect for the smallest N whose GPUs fit; then check the host."""
        n_layer = self.layout.view.n_layer
        lo, hi = 1, n_layer
        found: Estimate | None = None
        last_least = least
        while lo <= hi:
            mid = (lo + hi) // 2
            fit, least_mid = self.best_split(replace(base, n_cpu_moe=mid))
            if fit is not None:
                found, hi = fit, mid - 1
            else:
                last_least = least_mid
                if _gpu_overflow(least_mid) <= 0:
                    break  # GPUs fit but the host does not: more offload only makes it worse
                lo = mid + 1
        return found, last_least

    def _layer_offload(self, base: RunConfig, least: Estimate) -> tuple[Estimate | None, Estimate]:
        """-ngl N keeps the last N slots (the output layer first) on the GPUs and the rest, with
        their KV, in host memory (llama_model_base::load_tensors: i_gpu_start = n_slots - N).
        GPU load grows with N and host load falls: the largest N whose GPUs fit is the fastest
        plan, if the host holds the rest."""
        n_slots = self.layout.n_slots
        tried: dict[int, tuple[Estimate | None, Estimate]] = {}

        def at(n: int) -> tuple[Estimate | None, Estimate]:
            if n not in tried:
                tried[n] = self.best_split(replace(base, n_gpu_layers=n))
            return tried[n]

        def more_fits(n: int) -> bool:
            # fits, or the GPUs still have room, or the host is short (then only a larger N can
            # help): true for small N, false past the largest N the GPUs hold
            fit, least_n = at(n)
            return fit is not None or _gpu_overflow(least_n) <= 0 or not least_n.host.fits

        if n_slots < 2 or not more_fits(1):
            return None, at(1)[1] if n_slots >= 2 else least
        lo, hi = 1, n_slots - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if more_fits(mid):
                lo = mid
            else:
                hi = mid - 1
        fit, least_n = at(lo)
        return fit, least_n

    def faster_offload(self, base: RunConfig, found: Estimate) -> Estimate:
        """The fastest --n-cpu-moe from the smallest that fits (`found`), on two GPUs; with
        three or more each N is a full split enumeration (a 3060+T4+3060 pick took 2.2 -> 6.4 s
        with the search), so the smallest N is kept there, as on one GPU."""
        if len(llama_devices(self.machine, base)) != 2:
            return found
        return self._faster_offload(base, found, self.layout.view.n_layer)

    def _faster_offload(self, base: RunConfig, found: Estimate, n_layer: int) -> Estimate:
        """With two GPUs the smallest --n-cpu-moe is not always the fastest: more expert
        layers in RAM free room on the GPUs to move slots (and their KV) off a slow card or to
        split where the switch costs no hop. One GPU gains nothing from it (every extra layer
        only moves experts to the slower host), so only then is this search made. Host use
        grows with N (and does not depend on the split), so the search ends where the host no
        longer fits, or where it would leave the host tight when the smallest N did not (the
        balanced policy ranks a tight host below any speed)."""
        start = found.config.n_cpu_moe or 0
        may_tighten = _host_tight(found)
        tried: dict[int, float] = {start: expected_tps(self.speed(found))}
        fits: dict[int, Estimate] = {start: found}
        host_ok = start  # the largest N known to fit the host (and not tighten it)
        host_full = n_layer + 1  # the smallest N known not to
        ends: dict[int, tuple[int, int]] = {}  # N -> (a_min, a_max) of its fitting interval

        def attempt(n: int) -> None:
            nonlocal host_ok, host_full
            if n in tried or n <= start or n > n_layer or n >= host_full:
                return
            # GPU load falls as N grows, so the interval's ends move outwards with N: those of
            # the nearest N tried on either side bracket this N's (a pure speed-up: each end of
            # the bracket is checked before it is used)
            below = max((k for k in ends if k < n), default=None)
            above = min((k for k in ends if k > n), default=None)
            n_slots = self.layout.n_slots
            lo_min, lo_max = ends[below] if below is not None else (n_slots, 0)
            hi_min, hi_max = ends[above] if above is not None else (0, n_slots)
            bracket = _Bracket(lo_max, hi_max, hi_min, lo_min)
            fit, least = self.best_split(replace(base, n_cpu_moe=n), bracket)
            ends[n] = self.bounds
            if (fit is None and not least.host.fits) or (
                not may_tighten and _host_tight(fit or least)
            ):
                host_full = n
                return
            host_ok = max(host_ok, n)
            tried[n] = -1.0 if fit is None else expected_tps(self.speed(fit))
            if fit is not None:
                fits[n] = fit

        def best() -> int:
            return max(tried, key=lambda n: (tried[n], -n))

        stride = max(OFFLOAD_STRIDE_MIN, self.layout.view.attention_period)
        for n in range(start + 1, start + OFFLOAD_WALK + 1):
            attempt(n)
        for n in range(start + OFFLOAD_WALK + stride, n_layer + 1, stride):
            attempt(n)
        # the top end (all the experts the host can take), found by bisection when the host
        # is the limit: the fast card then holds the most slots, often the fastest plan
        lo, hi = host_ok, min(host_full, n_layer + 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            attempt(mid)
            lo, hi = (mid, hi) if mid < host_full else (lo, mid)
        attempt(lo)
        # refine around the best so far: speed against N is a saw-tooth whose teeth are about
        # a stride apart (where an attention layer changes card)
        for centre in dict.fromkeys((best(), lo)):
            for n in range(centre - stride, centre + stride + 1):
                attempt(n)
        n = best()
        return fits[n] if tried[n] > tried[start] * (1 + 1e-9) else found


def _quality_order(manifest: Manifest, quants: list[str]) -> list[str]:
    """Best first: lower mean KLD, then the manifest's rank (ties: the bigger file)."""
    qual = {q: quality_for(manifest, q) for q in quants}
    rank = {
        f.quant: (f.quality_rank if f.quality_rank is not None else -1)
        for f in manifest.files
        if f.role == "model"
    }
    return sorted(quants, key=lambda q: (qual[q].mean_kld, -rank.get(q, -1)))


def quality_for(manifest: Manifest, quant: str) -> Quality:
    files = [f for f in manifest.files if f.quant == quant and f.role == "model"]
    bpw = files[0].bits_per_weight if files else None
    return quality_of(quant, bpw, model_of(manifest))


def plan(
    manifest: Manifest,
    machine: Machine,
    layouts: Layouts,
    request: PlanRequest,
    *,
    overheads: Overheads | None = None,
) -> Plan:
    """The best plan for `request`; raises NoFitError (exit 3) when nothing fits.

    With RPC workers, the plan without them (this machine alone, experts in its own RAM where
    needed) is weighed too: a worker behind a slow network can make every token slower than host
    offload, and then it is left out, with the figures that show why.
    """
    p = _plan_machine(manifest, machine, layouts, request, overheads=overheads)
    return _speculate(p, manifest, machine, layouts, request, overheads=overheads)


def _speculate(
    p: Plan,
    manifest: Manifest,
    machine: Machine,
    layouts: Layouts,
    request: PlanRequest,
    *,
    overheads: Overheads | None,
) -> Plan:
    """The chosen plan with speculative decoding decided on it: same quant, context and
    placement (a kind whose memory does not fit them is refused, plan/speculative.py)."""
    layout = layouts[p.quant]
    spec = request.spec
    if spec.verify_efficiency == 1.0:
        spec = replace(spec, verify_efficiency=verify_efficiency(machine))
    decision, config = speculation(
        layout, machine, p.config, expected_tps(p.speed), spec,
        model_name=manifest.id, files=tuple(f.name for f in manifest.files),
        model_file=p.files[0].name if p.files else "", fill=p.speed.target_context,
        params=speed_params_for(machine), overheads=overheads,
        projector_bytes=p.projector.size_bytes if p.projector else 0,
    )  # fmt: skip
    if not decision.enabled or decision.estimate is None:
        return replace(p, speculative=decision, config=config)
    return replace(
        p,
        speculative=decision,
        config=config,
        estimate=decision.estimate,
        notes=(*p.notes, "Speculation: " + decision.reason),
    )


def _plan_machine(
    manifest: Manifest,
    machine: Machine,
    layouts: Layouts,
    request: PlanRequest,
    *,
    overheads: Overheads | None = None,
) -> Plan:
    if not machine.rpc_workers:
        return _plan_once(manifest, machine, layouts, request, overheads=overheads)
    with_workers: Plan | None = None
    problem: NoFitError | None = None
    try:
        with_workers = _plan_once(manifest, machine, layouts, request, overheads=overheads)
    except NoFitError as exc:
        problem = exc
    local = replace(machine, rpc_workers=())
    try:
        alone = _plan_once(manifest, local, layouts, request, overheads=overheads)
    except NoFitError:
        if with_workers is None:
            assert problem is not None
            raise problem from None
        return with_workers
    if with_workers is not None and (
        not with_workers.config.rpc_servers  # it left them out itself (they held nothing)
        or not _better_plan(alone, with_workers, request.prefer)
    ):
        return with_workers
    endpoints = ", ".join(w.endpoint for w in machine.rpc_workers)
    if with_workers is None:
        why = f"RPC worker(s) {endpoints} unused: no plan that uses them fits"
    else:
        e = with_workers.speed.expected
        assert e is not None and alone.speed.expected is not None  # the planner always sets it
        net = getattr(e, "network_ms_target", None)
        over = f" (+{net:.1f} ms per token on the network at {e.target_context} tokens)"
        why = (
            f"RPC worker(s) {endpoints} left unused: with them the best plan is "
            f"{with_workers.quant} at ~{e.decode_tps_target:.0f} tok/s"
            + (over if net else "")
            + f"; this machine alone runs {alone.quant} at "
            f"~{alone.speed.expected.decode_tps_target:.0f} tok/s ({alone.placement})"
        )
    return replace(alone, notes=(*alone.notes, why), why=alone.why + "; " + why)


def _better_plan(alone: Plan, with_workers: Plan, prefer: str) -> bool:
    """Leave the workers out when this machine alone is no worse in quality (its tier, or its
    KLD under --prefer quality) and at least as fast: the network then costs more than it buys."""
    a, w = _chosen(alone), _chosen(with_workers)
    assert a.quality is not None and w.quality is not None
    if prefer == "quality":
        not_worse = a.quality.mean_kld <= w.quality.mean_kld
    else:
        not_worse = a.quality.tier <= w.quality.tier
    return not_worse and expected_tps(alone.speed) >= expected_tps(with_workers.speed)


def _chosen(p: Plan) -> Candidate:
    return next(c for c in p.candidates if c.reason.startswith("chosen"))


def _plan_once(
    manifest: Manifest,
    machine: Machine,
    layouts: Layouts,
    request: PlanRequest,
    *,
    overheads: Overheads | None = None,
) -> Plan:
    overheads = overheads or Overheads()
    if request.prefer not in POLICIES:
        raise UsageError(f"--prefer {request.prefer}: use " + ", ".join(POLICIES))
    if not request.kv_types:
        raise UsageError("no KV cache type allowed")
    quants = list(manifest.quants)
    if request.quant is not None:
        wanted = [q for q in quants if q.upper() == request.quant.upper()]
        if not wanted:
            raise UsageError(
                f"{manifest.id} has no quant {request.quant}",
                hint="available: " + ", ".join(quants),
            )
        quants = wanted
    ctx_train = manifest.architecture.context_length
    target = request.ctx_size or ctx_train
    if target > ctx_train:
        raise UsageError(
            f"-c {target} is above {manifest.id}'s context length {ctx_train}",
            hint=f"use -c {ctx_train} or less",
        )
    projector = manifest.projector if request.vision else None
    if request.vision and projector is None:
        raise UsageError(f"{manifest.id} has no vision projector (mmproj)")
    projector_bytes = projector.size_bytes if projector else 0
    bandwidths = device_bandwidths(machine)
    # A GPU whose query failed is left out of the plan, so name the ones used (--device): llama.cpp
    # would otherwise spread layers over every GPU it sees.
    usable = machine.usable_gpus
    rpc_servers = all_workers(machine)
    devices: tuple[int | str, ...] | None = None
    if len(usable) != len(machine.gpus):
        remote = rpc_devices(machine, rpc_servers)
        devices = (*(d.name for d in remote), *(g.index for g in usable))
    ranks = {
        f.quant: (f.quality_rank if f.quality_rank is not None else -1)
        for f in manifest.files
        if f.role == "model"
    }
    qualities = {q: quality_for(manifest, q) for q in quants}
    order = _quality_order(manifest, quants)
    # The 16-bit weights are the reference, "not for daily use" (the model card): only when asked.
    reference_ok = request.prefer == "quality" or request.quant is not None
    searches: dict[str, _Search] = {}  # per searched quant: its layout, estimates and speeds

    candidates: list[Candidate] = []
    feasible: list[Candidate] = []
    best_tier: int | None = None  # the tier of the best feasible plan found so far
    # expert-offload candidates at their smallest --n-cpu-moe: (index, search, base config)
    offloaded: list[tuple[int, _Search, RunConfig]] = []

    def fitted(
        quant: str, q: Quality, kv: str, placement: Placement, best: Estimate, search: _Search
    ) -> Candidate:
        speed = search.speed(best)
        tps = expected_tps(speed)
        ok = tps >= request.min_tps
        reason = (
            f"fits: {placement}, ~{tps:.0f} tok/s expected at {target} tokens"
            if ok
            else f"fits ({placement}) but ~{tps:.1f} tok/s expected at {target} tokens is "
            f"below --min-tps {request.min_tps:g}"
        )
        return Candidate(
            quant, ranks[quant], kv, placement, True, ok, reason, best.config, best, speed,
            quality=q,
        )  # fmt: skip

    for quant in order:
        q = qualities[quant]
        skip = None
        if q.basis == "reference" and not reference_ok:
            skip = "the 16-bit reference weights: not for daily use (--prefer quality or --quant)"
        elif request.prefer == "quality" and feasible:
            skip = f"lower quality than {feasible[0].quant}"
        elif request.prefer == "balanced" and best_tier is not None and q.tier > best_tier:
            skip = f"a lower quality tier than plans that fit ({q.verdict})"
        elif quant not in layouts:
            skip = "no tensor table: this quant's GGUF header is needed (not cached)"
        if skip is not None:
            for kv in request.kv_types:
                candidates.append(
                    Candidate(quant, ranks[quant], kv, Placement.NOT_SEARCHED, False, False,
                              skip, quality=q)
                )  # fmt: skip
            continue
        search = searches[quant] = _Search(
            layouts[quant],
            machine,
            overheads,
            projector_bytes,
            bandwidths,
            request.efficiency,
            target,
            request.calibration,
        )
        full_gpu_kv: str | None = None  # the first KV type that ran fully on the GPUs
        for kv in request.kv_types:
            refused = kv_type_problem(search.layout.view, kv, kv, request.flash_attn)
            if refused is not None:
                # llama.cpp would refuse the context (a quantized cache that does not divide the
                # head size, or one that needs flash attention where it is off)
                candidates.append(
                    Candidate(quant, ranks[quant], kv, Placement.NOT_SEARCHED, False, False,
                              refused, quality=q)
                )  # fmt: skip
                continue
            if full_gpu_kv is not None and request.prefer != "speed":
                # The KV types are listed best first, and on CUDA a quantized cache is never
                # faster at depth (plan/speed.py): once one runs fully on the GPUs, the others
                # cannot win under balanced or quality (speed still weighs them).
                candidates.append(
                    Candidate(quant, ranks[quant], kv, Placement.NOT_SEARCHED, False, False,
                              f"{full_gpu_kv} KV already runs fully on the GPUs", quality=q)
                )  # fmt: skip
                continue
            base = apply_rule(
                RunConfig(
                    ctx_size=target,
                    n_parallel=request.n_parallel,
                    kv_unified=request.kv_unified,
                    cache_type_k=kv,
                    cache_type_v=kv,
                    flash_attn=request.flash_attn,
                    ubatch=request.ubatch,
                    batch=request.batch,
                    vision=request.vision,
                    devices=devices,
                    rpc_servers=rpc_servers,
                ),
                request.compute_rule,
            )
            placement, best, least = search.place(base, request.allow_offload, search_offload=False)
            if best is None:
                over, where = _overflow(least)
                dev_name = next((d.name for d in least.devices if d.device == where), where)
                candidates.append(
                    Candidate(
                        quant, ranks[quant], kv, Placement.NONE, False, False,
                        f"too big by {over / GiB:.2f} GiB on {where} ({dev_name})",
                        least.config, least, search.speed(least), over, where, quality=q,
                    )
                )  # fmt: skip
                continue
            cand = fitted(quant, q, kv, placement, best, search)
            candidates.append(cand)
            if placement is Placement.EXPERT_OFFLOAD:
                offloaded.append((len(candidates) - 1, search, base))
            if placement is Placement.GPU and full_gpu_kv is None:
                full_gpu_kv = kv
            if cand.feasible:
                feasible.append(cand)
                best_tier = q.tier if best_tier is None else min(best_tier, q.tier)

    # The --n-cpu-moe search (two GPUs: more experts in RAM can be faster) only where its speed
    # can change the pick: the policy's choice is the same as with every offload plan searched.
    if offloaded:
        tentative = choose(feasible, request.prefer, request.kv_types)[0] if feasible else None
        for idx, search, base in offloaded:
            c = candidates[idx]
            if tentative is not None and not _speed_may_matter(
                c, tentative, request.prefer, request.kv_types
            ):
                continue
            assert c.estimate is not None
            faster = search.faster_offload(base, c.estimate)
            if faster is not c.estimate:
                assert c.quality is not None
                candidates[idx] = fitted(
                    c.quant, c.quality, c.cache_type, c.placement, faster, search
                )
        feasible = [c for c in candidates if c.feasible]

    named_slow = None
    if not feasible and request.quant is not None:
        # A quant the user named plans even below --min-tps (with a note): --min-tps picks among
        # quants, it does not overrule the one asked for.
        slow = [c for c in candidates if c.fits and not c.feasible]
        if slow:
            candidates = [replace(c, feasible=True) if c in slow else c for c in candidates]
            feasible = [c for c in candidates if c.feasible]
            named_slow = max(expected_tps(_s(c)) for c in feasible)
    if not feasible:
        raise _no_fit(manifest, candidates, target, request)
    chosen, why = choose(feasible, request.prefer, request.kv_types)
    why += _missed_min_tps(candidates, chosen, request.min_tps)
    final: list[Candidate] = []
    for c in candidates:
        if c is chosen:
            c = replace(c, reason="chosen: " + why)
        elif c.feasible:
            c = replace(c, reason=_why_lost(c, chosen) + "; " + c.reason)
        final.append(c)
    assert chosen.config is not None and chosen.estimate is not None and chosen.speed is not None
    assert chosen.quality is not None
    chosen_search = searches[chosen.quant]
    chosen_layout = chosen_search.layout
    notes = []
    config, est, speed = chosen.config, chosen.estimate, chosen.speed
    idle = _idle_workers(est)
    if idle:
        # llama-server connects to (and holds) every --rpc worker, even one holding nothing.
        config = _without_workers(machine, config, est, idle)
        est = chosen_search.run(config)
        speed = chosen_search.speed(est)
        final = [
            replace(c, config=config, estimate=est, speed=speed)
            if c.reason.startswith("chosen")
            else c
            for c in final
        ]
        notes.append(
            "RPC worker(s) " + ", ".join(idle) + " hold no layer in this plan: left out of --rpc"
        )
    if not chosen_layout.exact:
        notes.append(
            "weights from a synthesized tensor table (manifest size); "
            "use --exact for the GGUF header"
        )
    if chosen.quality.note:
        notes.append(chosen.quality.note)
    if named_slow is not None:
        notes.append(
            f"--quant {chosen.quant}: ~{expected_tps(speed):.1f} tok/s expected at {target} "
            f"tokens, below --min-tps {request.min_tps:g}; planned because the quant was named"
        )
    notes.extend(chosen_layout.view.notes)
    return Plan(
        model=manifest.id,
        quant=chosen.quant,
        files=manifest.quant_files(chosen.quant),
        projector=projector,
        config=config,
        estimate=est,
        speed=speed,
        placement=chosen.placement,
        policy=request.prefer,
        layout_basis=chosen_layout.basis,
        candidates=tuple(final),
        notes=tuple(notes),
        quality=chosen.quality,
        why=why,
        compute_rule=request.compute_rule,
        calibration=request.calibration,
        arch=chosen_layout.architecture.name,
        n_slots=chosen_layout.n_slots,
    )


def _idle_workers(est: Estimate) -> tuple[str, ...]:
    """RPC workers none of whose devices holds a layer or a weight."""
    used: dict[str, bool] = {}
    for d in est.gpus:
        if d.endpoint is not None:
            used[d.endpoint] = used.get(d.endpoint, False) or bool(d.layers or d.weights_bytes)
    return tuple(ep for ep, busy in used.items() if not busy)


def _without_workers(
    machine: Machine, config: RunConfig, est: Estimate, idle: tuple[str, ...]
) -> RunConfig:
    """`config` without the `idle` workers: out of --rpc, their -ts entries dropped, and the
    remaining RPC devices renamed (llama-server numbers them over the --rpc list)."""
    servers = tuple(ep for ep in config.rpc_servers if ep not in idle)
    split = config.tensor_split
    if split is not None:
        split = (
            tuple(s for s, d in zip(split, est.gpus, strict=False) if d.endpoint not in idle)
            or None
        )
    devices = config.devices
    if devices is not None:
        old = {d.name: (d.endpoint, d.gpu.index) for d in rpc_devices(machine, config.rpc_servers)}
        new = {(d.endpoint, d.gpu.index): d.name for d in rpc_devices(machine, servers)}
        devices = tuple(
            new[old[d]] if isinstance(d, str) and d in old else d
            for d in devices
            if not (isinstance(d, str) and d in old and old[d][0] in idle)
        )
    return replace(config, rpc_servers=servers, tensor_split=split, devices=devices)


# ---- the policies ------------------------------------------------------------------------------

# "balanced": judgment constants (policy choices, documented in the README).
# A speed factor this large is "meaningfully faster": run-to-run differences of 10-15% are common
# in the published data (one 4090 and build: 158-164 tok/s across three quants,
# speed-measurements.json), so 25% is what a person notices.
MEANINGFUL_SPEEDUP = 1.25
# What a quality difference is worth in speed: MEANINGFUL_SPEEDUP buys exactly the gap between
# Q8_0 and Q6_K on the family curve (0.0046 -> 0.0061 mean KLD, PPL unchanged; Q6_K at its type's
# size, 6.56 bpw): the card calls both near-lossless, and a step down between them should be worth
# a noticeable speedup. A step across a tier (0.0137 -> 0.027) then takes a ~6x speedup.
KLD_PER_SPEED_LOG = (
    quality_of("Q6_K", GENERIC.points[-2].bpw).mean_kld - FAMILY.points[5].mean_kld
) / math.log(MEANINGFUL_SPEEDUP)
# Above this expected decode speed more speed is not worth quality: a 2,000-token reasoning trace
# then takes under a minute, and people read ~5-10 tok/s.
COMFORTABLE_TPS = 40.0
# Host RAM left with less than this share of its budget free counts as tight: the host's figures
# include estimates (compute buffers, what mmap'd weights do to the page cache) and other programs
# grow. GPU budgets already keep --margin (llama.cpp's --fit-target) and are not judged tight.
TIGHT_FRACTION = 0.10
# "speed": the fastest plan at or above this tier ("small loss" at most) when one fits; speeds
# within this factor count as equal (then the better quality wins).
SPEED_FLOOR_TIER = 1
SPEED_TIE = 1.05


def expected_tps(speed: SpeedEstimate) -> float:
    """Expected decode tok/s at the target context (the figure policies and --min-tps use)."""
    if speed.expected is None:  # an estimate without the fitted model: the bandwidth bound
        return float(speed.tokens_per_s_target)
    return float(speed.expected.decode_tps_target)


def _tight(c: Candidate) -> bool:
    assert c.estimate is not None
    return _host_tight(c.estimate)


def _host_tight(est: Estimate) -> bool:
    host = est.host
    return host.headroom_bytes < TIGHT_FRACTION * max(host.budget_bytes, 1)


def desktop_room(est: Estimate) -> bool:
    """Whether a plan leaves the desktop room to work: max(4 GiB, 25 %) of the host budget still
    free after the plan. The figures are plan/memory.py's DESCRIBED_HOST_RESERVE, what a 32 GB
    desktop has in use (a desktop session and a browser, 4-8 GB): the budget already keeps that
    much for what runs now, and this keeps as much again for what a person opens next (a second
    browser, an IDE, a build). Within one quality tier the balanced policy prefers the lighter
    plan that leaves it over one that fills RAM with experts for a step nobody notices (a 32 GB
    desktop with a 12 GB card: Q5_K_M's experts, not Q6_K's, which left ~5 GiB)."""
    host = est.host
    floor, share = DESCRIBED_HOST_RESERVE
    return host.headroom_bytes >= max(floor, share * host.budget_bytes)


def _kld(c: Candidate) -> float:
    return c.quality.mean_kld if c.quality is not None else 1.0


def _per_quant(cands: list[Candidate], kv_order: tuple[str, ...]) -> list[Candidate]:
    """One plan per quant: full GPU over offload, the KV type listed first (f16: quality, and on
    CUDA faster at depth) unless another is meaningfully faster."""
    best: dict[str, Candidate] = {}
    for c in cands:
        cur = best.get(c.quant)
        if cur is None:
            best[c.quant] = c
            continue
        gpu_c, gpu_cur = c.placement is Placement.GPU, cur.placement is Placement.GPU
        if gpu_c != gpu_cur:
            if gpu_c:
                best[c.quant] = c
            continue
        assert c.speed is not None and cur.speed is not None
        first = kv_order.index(c.cache_type) < kv_order.index(cur.cache_type)
        faster = expected_tps(c.speed) >= MEANINGFUL_SPEEDUP * expected_tps(cur.speed)
        slower = expected_tps(cur.speed) >= MEANINGFUL_SPEEDUP * expected_tps(c.speed)
        if faster or (first and not slower):
            best[c.quant] = c
    return list(best.values())


def _speed_may_matter(
    c: Candidate, chosen: Candidate, prefer: str, kv_order: tuple[str, ...]
) -> bool:
    """Could a faster plan for offload candidate `c` (more experts in RAM, same quant and KV,
    a host no tighter) change the policy's choice, now `chosen`?
    - speed: the fastest plan fully on the GPUs wins over any offload plan, so only when the
      chosen plan is not fully on the GPUs, or when nothing at or above the quality floor is
      feasible yet and `c` is (its speed may lift it over --min-tps);
    - quality: only through --min-tps and the per-quant KV choice, so for quants at least as
      good as the chosen one;
    - balanced: speed is the key's last part; tier, host room and full-GPU come first and do
      not improve with the search, so only when those tie with or beat the chosen plan's."""
    if prefer == "speed":
        floor_empty = chosen.quality is None or chosen.quality.tier > SPEED_FLOOR_TIER
        above_floor = c.quality is not None and c.quality.tier <= SPEED_FLOOR_TIER
        return chosen.placement is not Placement.GPU or (floor_empty and above_floor)
    if prefer == "quality":
        return _kld(c) <= _kld(chosen)
    return balanced_key(c, kv_order)[:4] >= balanced_key(chosen, kv_order)[:4]


def choose(
    feasible: list[Candidate], prefer: str, kv_order: tuple[str, ...]
) -> tuple[Candidate, str]:
    """The policy's pick among feasible candidates, and why, in one line."""
    if prefer == "quality":
        c = min(_per_quant(feasible, kv_order), key=lambda c: (_kld(c), -c.quality_rank))
        return c, _describe(c) + ": the highest quality that fits and reaches --min-tps"
    if prefer == "speed":
        # Every plan, every KV type: a q8_0 cache more than SPEED_TIE faster is what this policy
        # is for (a per-quant KV rule here let a longer context raise the pick).
        floor = [
            c for c in feasible if c.quality is not None and c.quality.tier <= SPEED_FLOOR_TIER
        ]
        pool = floor or feasible
        gpu = [c for c in pool if c.placement is Placement.GPU]
        pool = gpu or pool
        fastest = max(expected_tps(_s(c)) for c in pool)
        ties = [c for c in pool if expected_tps(_s(c)) * SPEED_TIE >= fastest]
        c = min(
            ties,
            key=lambda c: (
                _kld(c),
                kv_order.index(c.cache_type) if c.cache_type in kv_order else len(kv_order),
                -expected_tps(_s(c)),
            ),
        )
        tail = "" if floor else " (nothing at or above the quality floor fits)"
        return c, _describe(c) + ": the fastest plan" + tail
    # balanced: one fixed key over every feasible plan (the KV preference is inside the key)
    return _choose_balanced(feasible, kv_order)


def _s(c: Candidate) -> SpeedEstimate:
    assert c.speed is not None
    return c.speed


def _describe(c: Candidate) -> str:
    assert c.quality is not None
    where = {
        Placement.GPU: "fully on the GPUs",
        Placement.EXPERT_OFFLOAD: "experts partly in RAM",
        Placement.LAYER_OFFLOAD: "layers partly in RAM",
        Placement.CPU: "on the CPU",
    }
    return (
        f"{c.quant} ({c.quality.verdict.split(':')[0]}, KLD {c.quality.mean_kld:.4f}), "
        f"{where.get(c.placement, c.placement)}, ~{expected_tps(_s(c)):.0f} tok/s"
    )


def balanced_key(
    c: Candidate, kv_order: tuple[str, ...] = DEFAULT_KV_TYPES
) -> tuple[int, bool, bool, bool, float]:
    """The balanced policy's order of plans (higher is better), a fixed key per plan, so that more
    memory can only raise the pick and a longer context only lower it:

    1. the quality tier (plan/quality.py): a step the data says a person notices always wins;
    2. host RAM not tight;
    2b. the desktop keeps its room (desktop_room: a quarter of the RAM free, at least 4 GiB);
    3. fully on the GPUs over experts in host RAM (RAM is used only when it buys a tier);
    4. utility: log expected decode speed, capped at COMFORTABLE_TPS, minus mean KLD weighed by
       KLD_PER_SPEED_LOG (a 25% faster plan is worth the Q8_0 -> Q6_K gap, no more), minus
       log(MEANINGFUL_SPEEDUP) for a KV type after the first allowed one (f16 by default: a
       quantized cache must be meaningfully faster to be chosen). The KV preference is part of
       the key, not a rule applied per quant first: such a rule made the order depend on which
       other plans fit, and a longer context could then raise the pick.
    """
    assert c.quality is not None
    tps = max(expected_tps(_s(c)), 1e-3)
    utility = math.log(min(tps, COMFORTABLE_TPS)) - c.quality.mean_kld / KLD_PER_SPEED_LOG
    if kv_order and c.cache_type != kv_order[0]:
        utility -= math.log(MEANINGFUL_SPEEDUP)
    assert c.estimate is not None
    room = desktop_room(c.estimate)
    return (-c.quality.tier, not _tight(c), room, c.placement is Placement.GPU, utility)


def _choose_balanced(cands: list[Candidate], kv_order: tuple[str, ...]) -> tuple[Candidate, str]:
    def key(c: Candidate) -> tuple[int, bool, bool, bool, float]:
        return balanced_key(c, kv_order)

    pick = max(cands, key=lambda c: (key(c), -_kld(c)))
    assert pick.quality is not None
    why = _describe(pick)
    better = [c for c in cands if _kld(c) < _kld(pick) and c.quant != pick.quant]
    if better:
        # The best-quality plan it was preferred to, and the reason in the policy's own terms.
        top = min(better, key=lambda c: (_kld(c), -expected_tps(_s(c))))
        assert top.quality is not None
        gap = top.quality.mean_kld
        kt, kp = key(top), key(pick)
        if kt[1] != kp[1]:
            reason = f"{top.quant} would leave host RAM tight (under {TIGHT_FRACTION:.0%} free)"
        elif kt[2] != kp[2]:
            floor, share = DESCRIBED_HOST_RESERVE
            reason = (
                f"{top.quant} would leave the desktop under max({floor / GiB:.0f} GiB, "
                f"{share:.0%}) of its RAM budget free, for no quality step a person would notice"
            )
        elif kt[3] != kp[3]:
            reason = (
                f"{top.quant} would need {_in_ram(top)} in RAM (~{expected_tps(_s(top)):.0f} "
                "tok/s) for no quality step a person would notice"
            )
        else:
            ratio = expected_tps(_s(pick)) / max(expected_tps(_s(top)), 1e-3)
            reason = (
                f"{top.quant} would be {ratio:.2f}x slower (~{expected_tps(_s(top)):.0f} tok/s) "
                "for a difference a person would not notice"
            )
        why += (
            f"; within {pick.quality.mean_kld - gap:.4f} KLD of {top.quant} (same tier); {reason}"
        )
    if pick.placement in (Placement.EXPERT_OFFLOAD, Placement.LAYER_OFFLOAD):
        gpu = [c for c in cands if c.placement is Placement.GPU]
        if gpu:
            g = max(gpu, key=key)
            assert g.quality is not None
            what = "experts" if pick.placement is Placement.EXPERT_OFFLOAD else "layers"
            why += (
                f"; {what} in RAM buy a quality step over the best full-GPU plan, {g.quant} "
                f"({g.quality.verdict.split(':')[0]})"
            )
        else:
            why += "; nothing of this quality fits fully on the GPUs"
    return pick, why


def _in_ram(c: Candidate) -> str:
    return "layers" if c.placement is Placement.LAYER_OFFLOAD else "experts"


def _why_lost(c: Candidate, chosen: Candidate) -> str:
    if c.quant == chosen.quant and c.cache_type != chosen.cache_type:
        return f"{chosen.cache_type} KV preferred"
    if c.quality is not None and chosen.quality is not None:
        if c.quality.tier > chosen.quality.tier:
            return f"lower quality tier than {chosen.quant}"
        if c.placement is not Placement.GPU and chosen.placement is Placement.GPU:
            return f"needs {_in_ram(c)} in RAM; a full-GPU plan of the same tier exists"
        if _kld(c) > _kld(chosen):
            return f"lower quality than {chosen.quant}"
    return f"{chosen.quant} preferred by the {'policy'}"


def _missed_min_tps(candidates: list[Candidate], chosen: Candidate, min_tps: float) -> str:
    """ "; Q4_K_M fits at ~4.3 tok/s, below --min-tps 5 (and 2 more better quants)": the better
    quants that fit but were left out for speed alone, so a low pick says what it cost. "" when
    none was."""
    missed: dict[str, float] = {}
    for c in candidates:
        if c.fits and not c.feasible and c.speed is not None and _kld(c) < _kld(chosen):
            missed[c.quant] = max(missed.get(c.quant, 0.0), expected_tps(c.speed))
    if not missed:
        return ""
    best = min(missed, key=lambda q: next(_kld(c) for c in candidates if c.quant == q))
    more = len(missed) - 1
    tail = f" (and {more} more better quant{'s' if more > 1 else ''})" if more else ""
    return f"; {best} fits at ~{missed[best]:.1f} tok/s, below --min-tps {min_tps:g}{tail}"


def min_tps_suggestion(tps: float, given: float) -> float | None:
    """A --min-tps below `given` that `tps` reaches: whole tok/s from 1 up, else tenths; None when
    nothing useful is (under 0.1 tok/s, or nothing below what was given)."""
    for value in (math.floor(tps), math.floor(tps * 10) / 10):
        if 0 < value < given:
            return float(value)
    return None


def _no_fit(
    manifest: Manifest, candidates: list[Candidate], target: int, request: PlanRequest
) -> NoFitError:
    failing = [c for c in candidates if c.placement is not Placement.NOT_SEARCHED]
    slow = [c for c in failing if c.fits and not c.feasible]
    if slow:
        fastest = max(slow, key=lambda c: expected_tps(c.speed) if c.speed else 0)
        tps = expected_tps(fastest.speed) if fastest.speed else 0
        return NoFitError(
            f"no plan of {manifest.id} reaches --min-tps {request.min_tps:g} at -c {target}: "
            f"the fastest, {fastest.quant} with {fastest.cache_type} KV ({fastest.placement}), "
            f"is expected to decode ~{tps:.1f} tok/s",
            hint=(
                f"lower --min-tps (e.g. --min-tps {suggest:g}) or the context"
                if (suggest := min_tps_suggestion(tps, request.min_tps)) is not None
                else "--min-tps 0 (no floor) or a shorter context"
            ),
        )
    smallest = min(failing, key=lambda c: c.shortfall_bytes) if failing else None
    if smallest is None:
        return NoFitError(f"nothing of {manifest.id} fits at -c {target}")
    hint = "try a shorter -c (quantpick max-context shows the limits)"
    if "q4_0" not in request.kv_types:
        hint += ", --allow-q4-kv"
    hint += ", or a machine with more memory"
    return NoFitError(
        f"nothing of {manifest.id} fits at -c {target}: the closest, {smallest.quant} with "
        f"{smallest.cache_type} KV, is {smallest.shortfall_bytes / GiB:.2f} GiB over budget on "
        f"{smallest.shortfall_device}",
        hint=hint,
    )


# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContextLimit:
    quant: str
    quality_rank: int
    max_context: int  # 0: does not fit even at MIN_CONTEXT
    cache_type: str | None
    placement: Placement | None
    tokens_per_s_target: float | None  # the bandwidth bound at max_context (not what to expect)
    expected_tps_target: float | None = None  # expected decode at max_context (what pick shows)


def max_context(
    manifest: Manifest,
    machine: Machine,
    layouts: Layouts,
    request: PlanRequest,
    *,
    overheads: Overheads | None = None,
) -> list[ContextLimit]:
    """The largest context (a multiple of 256, up to the model's) each quant supports here."""
    overheads = overheads or Overheads()
    ctx_train = manifest.architecture.context_length
    quants = [
        q for q in manifest.quants if request.quant is None or q.upper() == request.quant.upper()
    ]
    if not quants:
        raise UsageError(f"{manifest.id} has no quant {request.quant}")
    results = []
    for quant in quants:

        def feasible(ctx: int, quant: str = quant) -> Candidate | None:
            try:
                p = plan(
                    manifest,
                    machine,
                    layouts,
                    replace(request, ctx_size=ctx, quant=quant),
                    overheads=overheads,
                )
            except NoFitError:
                return None
            return next(c for c in p.candidates if c.reason.startswith("chosen"))

        rank = next(f.quality_rank or 0 for f in manifest.files if f.quant == quant)
        lo_units, hi_units = MIN_CONTEXT // 256, ctx_train // 256
        best = feasible(hi_units * 256)
        if best is not None:
            results.append(_limit(quant, rank, hi_units * 256, best))
            continue
        best = feasible(lo_units * 256)
        if best is None:
            results.append(ContextLimit(quant, rank, 0, None, None, None))
            continue
        while hi_units - lo_units > 1:
            mid = (lo_units + hi_units) // 2
            got = feasible(mid * 256)
            if got is not None:
                lo_units, best = mid, got
            else:
                hi_units = mid
        results.append(_limit(quant, rank, lo_units * 256, best))
    return results


def _limit(quant: str, rank: int, ctx: int, c: Candidate) -> ContextLimit:
    return ContextLimit(
        quant,
        rank,
        ctx,
        c.cache_type,
        c.placement,
        c.speed.tokens_per_s_target if c.speed else None,
        c.speed.expected.decode_tps_target if c.speed and c.speed.expected else None,
    )
