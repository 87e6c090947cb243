"""Choose the quant, KV cache type and placement for a model, a machine and a target context. Pure.

Inputs are data (manifest, machine, a function giving each quant's layout, a request); the result is
data (the chosen plan and every candidate with the reason it lost). No I/O, no environment.

Policies (`PlanRequest.prefer`):
- "quality" (default): the highest-quality plan that fits every device and reaches `min_tps`; among
  plans of equal quality a full-GPU plan beats one with experts in host memory, then the faster
  one wins. More memory on any device can only add feasible plans, so it never lowers the pick.
- "speed": plans that run fully on the GPUs first (the highest-quality quant that does); only when
  none does, the highest-quality plan with expert offload that reaches `min_tps`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from quantpick.errors import NoFitError, UsageError
from quantpick.machine.spec import Machine
from quantpick.model.layout import ModelLayout
from quantpick.model.manifest import Manifest, ModelFile
from quantpick.plan.build_class import CONSERVATIVE, ComputeRule, apply_rule
from quantpick.plan.calibration import Calibration, calibrate_speed
from quantpick.plan.memory import Estimate, Overheads, RunConfig, estimate
from quantpick.plan.speed import (
    DEFAULT_GPU_BANDWIDTH,
    DEFAULT_HOST_BANDWIDTH,
    SpeedEstimate,
    decode_speed,
)

GiB = 1024**3
DEFAULT_KV_TYPES = ("f16", "q8_0")
DEFAULT_MIN_TPS = 10.0
# llama.cpp's --fit never shrinks below 4096 (fit-ctx default); the planner's smallest context.
MIN_CONTEXT = 4096

LayoutFn = Callable[[str], ModelLayout]


@dataclass(frozen=True)
class PlanRequest:
    ctx_size: int  # target context (-c); 0 = the model's own context length
    n_parallel: int = 1
    kv_unified: bool = False
    kv_types: tuple[str, ...] = DEFAULT_KV_TYPES  # allowed, best first
    prefer: str = "quality"  # "quality" | "speed"
    quant: str | None = None  # fix the quant
    vision: bool = False
    min_tps: float = DEFAULT_MIN_TPS  # for plans with experts (or layers) in host memory
    ubatch: int = 512
    batch: int = 2048
    flash_attn: str = "on"
    efficiency: float = 1.0  # speed calibration factor (1.0 = the bandwidth bound)
    allow_offload: bool = True
    # The installed llama.cpp build's compute rule (plan/build_class.py); unknown: conservative.
    compute_rule: ComputeRule = CONSERVATIVE
    # This machine's measured speed factors (quantpick bench), applied to every speed figure.
    calibration: Calibration | None = None


@dataclass(frozen=True)
class Candidate:
    quant: str
    quality_rank: int
    cache_type: str  # K and V cache type
    placement: str  # "gpu" (all on GPUs) | "expert-offload" | "cpu" | "none" (does not fit)
    fits: bool  # fits every device's budget
    feasible: bool  # fits and meets the speed floor where it applies
    reason: str
    config: RunConfig | None = None
    estimate: Estimate | None = None
    speed: SpeedEstimate | None = None
    shortfall_bytes: int = 0  # does not fit: bytes over budget on the worst device
    shortfall_device: str | None = None


@dataclass(frozen=True)
class Plan:
    model: str
    quant: str
    files: tuple[ModelFile, ...]
    projector: ModelFile | None
    config: RunConfig
    estimate: Estimate
    speed: SpeedEstimate
    placement: str
    policy: str
    layout_basis: str
    candidates: tuple[Candidate, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    compute_rule: ComputeRule = CONSERVATIVE  # the llama.cpp build class the compute assumes
    calibration: Calibration | None = None  # applied to the speed figures, when measured here


# ----------------------------------------------------------------------------------------------


def device_bandwidths(machine: Machine) -> dict[str, int]:
    bandwidths = {
        f"CUDA{g.index}": g.bandwidth_bytes_per_s or DEFAULT_GPU_BANDWIDTH for g in machine.gpus
    }
    bandwidths["CPU"] = machine.host.ram_bandwidth_bytes_per_s or DEFAULT_HOST_BANDWIDTH
    return bandwidths


def _overflow(est: Estimate) -> tuple[int, str | None]:
    worst, where = 0, None
    for d in est.devices:
        over = d.total_bytes - d.budget_bytes
        if over > worst:
            worst, where = over, d.device
    return worst, where


def _gpu_overflow(est: Estimate) -> int:
    return max((d.total_bytes - d.budget_bytes for d in est.gpus), default=0)


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

    def run(self, config: RunConfig) -> Estimate:
        return estimate(
            self.layout,
            self.machine,
            config,
            overheads=self.overheads,
            projector_bytes=self.projector_bytes,
        )

    def speed(self, est: Estimate) -> SpeedEstimate:
        speed = decode_speed(
            self.layout,
            est,
            self.bandwidths,
            target_context=self.target_context,
            efficiency=self.efficiency,
        )
        return calibrate_speed(speed, self.calibration) if self.calibration else speed

    def splits(self, n_gpu: int, n_slots: int) -> Iterable[tuple[int, ...]]:
        """Candidate layer counts per GPU (contiguous, as -ts with integer counts)."""
        gpus = self.machine.usable_gpus
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

    def best_split(self, config: RunConfig) -> tuple[Estimate | None, Estimate]:
        """(the fastest fitting estimate or None, the least-overflowing estimate)."""
        n_gpu = len(self.machine.usable_gpus)
        n_slots = self.layout.n_slots
        best: Estimate | None = None
        best_speed = -1.0
        least: Estimate | None = None
        least_over = math.inf
        if n_gpu >= 2:
            # Split-invariant lower bound: with every slot on the GPUs, their weights, KV and
            # state add up to the same bytes whatever the split, and the host's load does not
            # depend on it either. If either already overflows, no split can fit.
            budgets = [g.free_bytes for g in self.machine.usable_gpus]
            even = tuple(float(b) for b in budgets)
            probe = self.run(replace(config, tensor_split=even))
            fixed = sum(d.weights_bytes + d.kv_bytes + d.recurrent_bytes for d in probe.gpus)
            if fixed > sum(d.budget_bytes for d in probe.gpus) or not probe.host.fits:
                return None, probe
        if n_gpu == 2:
            evaluated = self._two_gpu_candidates(config, n_slots)
        else:
            evaluated = (
                self.run(
                    replace(
                        config, tensor_split=tuple(float(c) for c in counts) if n_gpu > 1 else None
                    )
                )
                for counts in self.splits(n_gpu, n_slots)
            )
        for est in evaluated:
            over, _ = _overflow(est)
            if over < least_over:
                least, least_over = est, over
            if est.fits:
                tps = self.speed(est).tokens_per_s_target
                if tps > best_speed + 1e-9:
                    best, best_speed = est, tps
        assert least is not None
        return best, least

    def _two_gpu_candidates(self, config: RunConfig, n_slots: int) -> Iterable[Estimate]:
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

        # largest a with GPU0 fitting
        lo, hi = 0, n_slots
        if gpu_over(get(0), 0) > 0:
            a_max = -1
        else:
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if gpu_over(get(mid), 0) <= 0:
                    lo = mid
                else:
                    hi = mid - 1
            a_max = lo
        # smallest a with GPU1 fitting
        lo, hi = 0, n_slots
        if gpu_over(get(n_slots), 1) > 0:
            a_min = n_slots + 1
        else:
            while lo < hi:
                mid = (lo + hi) // 2
                if gpu_over(get(mid), 1) <= 0:
                    hi = mid
                else:
                    lo = mid + 1
            a_min = lo
        if a_min <= a_max:
            for a in {a_min, a_max, (a_min + a_max) // 2}:
                yield get(a)
        else:
            # nothing fits: report the split that balances the overflow best
            yield from cache.values()
            mid = max(0, min(n_slots, (a_min + a_max) // 2))
            yield get(mid)

    def place(self, base: RunConfig, allow_offload: bool) -> tuple[str, Estimate | None, Estimate]:
        """(placement, the best fitting estimate or None, the least-overflowing estimate)."""
        n_gpu = len(self.machine.usable_gpus)
        if n_gpu == 0:
            est = self.run(replace(base, n_gpu_layers=0, devices=()))
            return ("cpu", est if est.fits else None, est)
        best, least = self.best_split(base)
        if best is not None:
            return ("gpu", best, best)
        if not allow_offload:
            return ("none", None, least)
        # Expert offload: --n-cpu-moe N moves the routed experts of blocks 0..N-1 to host memory.
        # GPU load falls as N grows, so bisect for the smallest N whose GPUs fit; then check host.
        n_layer = self.layout.architecture.n_layer
        lo, hi = 1, n_layer
        found: Estimate | None = None
        last_least = least
        while lo <= hi:
            mid = (lo + hi) // 2
            fit, least_mid = self.best_split(replace(base, n_cpu_moe=mid))
            if fit is not None:
                found, hi = fit, mid - 1
            else:
                candidate = fit or least_mid
                if _gpu_overflow(candidate) <= 0:
                    # GPUs fit but the host does not: more offload only makes it worse
                    last_least = candidate
                    break
                last_least = candidate
                lo = mid + 1
        if found is not None:
            return ("expert-offload", found, found)
        return ("none", None, last_least)


def plan(
    manifest: Manifest,
    machine: Machine,
    layout_of: LayoutFn,
    request: PlanRequest,
    *,
    overheads: Overheads | None = None,
) -> Plan:
    """The best plan for `request`; raises NoFitError (exit 3) when nothing fits."""
    overheads = overheads or Overheads()
    if request.prefer not in ("quality", "speed"):
        raise UsageError(f"--prefer {request.prefer}: use quality or speed")
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
    devices = None if len(usable) == len(machine.gpus) else tuple(g.index for g in usable)
    ranks = {
        f.quant: (f.quality_rank if f.quality_rank is not None else -1)
        for f in manifest.files
        if f.role == "model"
    }

    candidates: list[Candidate] = []
    chosen: Candidate | None = None
    chosen_layout: ModelLayout | None = None
    # Candidate order: quant quality, then KV quality (the order given).
    for quant in quants:
        search: _Search | None = None  # built on first use: skipped quants need no layout
        for kv in request.kv_types:
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
                ),
                request.compute_rule,
            )
            if (
                chosen is not None
                and request.prefer == "quality"
                and ranks[quant] < chosen.quality_rank
            ):
                candidates.append(
                    Candidate(
                        quant,
                        ranks[quant],
                        kv,
                        "not searched",
                        False,
                        False,
                        f"lower quality than the chosen {chosen.quant}",
                    )
                )
                continue
            if search is None:
                layout = layout_of(quant)
                search = _Search(
                    layout,
                    machine,
                    overheads,
                    projector_bytes,
                    bandwidths,
                    request.efficiency,
                    target,
                    request.calibration,
                )
            placement, best, least = search.place(base, request.allow_offload)
            if best is None:
                over, where = _overflow(least)
                dev_name = next((d.name for d in least.devices if d.device == where), where)
                candidates.append(
                    Candidate(
                        quant,
                        ranks[quant],
                        kv,
                        "none",
                        False,
                        False,
                        f"too big by {over / GiB:.2f} GiB on {where} ({dev_name})",
                        least.config,
                        least,
                        search.speed(least),
                        over,
                        where,
                    )
                )
                continue
            speed = search.speed(best)
            needs_floor = placement != "gpu"
            feasible = not needs_floor or speed.tokens_per_s_target >= request.min_tps
            reason = (
                f"fits: {placement}, {speed.tokens_per_s_target:.1f} tok/s at {target} tokens"
                if feasible
                else f"fits only with {placement} at {speed.tokens_per_s_target:.1f} tok/s, "
                f"below --min-tps {request.min_tps:g}"
            )
            cand = Candidate(
                quant, ranks[quant], kv, placement, True, feasible, reason, best.config, best, speed
            )
            candidates.append(cand)
            if feasible and (
                chosen is None or _better(cand, chosen, request.prefer, request.kv_types)
            ):
                chosen, chosen_layout = cand, layout

    if chosen is None or chosen_layout is None:
        raise _no_fit(manifest, candidates, target, request)
    final: list[Candidate] = []
    for c in candidates:
        if c is chosen:
            c = replace(c, reason="chosen: " + c.reason)
        elif c.feasible:
            c = replace(c, reason=_why_lost(c, chosen) + "; " + c.reason)
        final.append(c)
    assert chosen.config is not None and chosen.estimate is not None and chosen.speed is not None
    notes = []
    if not chosen_layout.exact:
        notes.append(
            "weights from a synthesized tensor table (manifest size); "
            "use --exact for the GGUF header"
        )
    return Plan(
        model=manifest.id,
        quant=chosen.quant,
        files=manifest.quant_files(chosen.quant),
        projector=projector,
        config=chosen.config,
        estimate=chosen.estimate,
        speed=chosen.speed,
        placement=chosen.placement,
        policy=request.prefer,
        layout_basis=chosen_layout.basis,
        candidates=tuple(final),
        notes=tuple(notes),
        compute_rule=request.compute_rule,
        calibration=request.calibration,
    )


def _better(a: Candidate, b: Candidate, prefer: str, kv_order: tuple[str, ...]) -> bool:
    """Is candidate a preferred over b under the policy?

    Order: (speed policy: full-GPU first), quant quality, full-GPU over offload, the KV type
    listed first (f16 before q8_0: quality), then the faster plan.
    """
    assert a.speed is not None and b.speed is not None
    gpu_a, gpu_b = a.placement == "gpu", b.placement == "gpu"
    if prefer == "speed" and gpu_a != gpu_b:
        return gpu_a
    if a.quality_rank != b.quality_rank:
        return a.quality_rank > b.quality_rank
    if gpu_a != gpu_b:
        return gpu_a
    kv_a, kv_b = kv_order.index(a.cache_type), kv_order.index(b.cache_type)
    if kv_a != kv_b:
        return kv_a < kv_b
    return a.speed.tokens_per_s_target > b.speed.tokens_per_s_target


def _why_lost(c: Candidate, chosen: Candidate) -> str:
    if c.quality_rank < chosen.quality_rank:
        return f"lower quality than {chosen.quant}"
    if c.quant == chosen.quant and c.cache_type != chosen.cache_type:
        return f"{chosen.cache_type} KV preferred"
    if c.placement != "gpu" and chosen.placement == "gpu":
        return "needs expert offload; a full-GPU plan exists"
    return "slower"


def _no_fit(
    manifest: Manifest, candidates: list[Candidate], target: int, request: PlanRequest
) -> NoFitError:
    failing = [c for c in candidates if c.placement != "not searched"]
    slow = [c for c in failing if c.fits and not c.feasible]
    if slow:
        fastest = max(slow, key=lambda c: c.speed.tokens_per_s_target if c.speed else 0)
        tps = fastest.speed.tokens_per_s_target if fastest.speed else 0
        return NoFitError(
            f"no plan of {manifest.id} reaches --min-tps {request.min_tps:g} at -c {target}: "
            f"the fastest, {fastest.quant} with {fastest.cache_type} KV ({fastest.placement}), "
            f"predicts {tps:.1f} tok/s",
            hint=f"lower --min-tps (e.g. --min-tps {max(1, math.floor(tps))}) or the context",
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
    placement: str | None
    tokens_per_s_target: float | None


def max_context(
    manifest: Manifest,
    machine: Machine,
    layout_of: LayoutFn,
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
                    layout_of,
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
    )
