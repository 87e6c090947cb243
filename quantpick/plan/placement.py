"""Where the layers, KV and experts of one candidate go: the split among GPUs (bisection, a
bracketed two-GPU search) and how many layers' experts stay in host memory (--n-cpu-moe), each
placement estimated with plan/memory.py and checked against every device's budget. Pure."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from quantpick.machine.spec import Machine
from quantpick.model.layout import ModelLayout
from quantpick.plan.bandwidth_bound import DEFAULT_GPU_BANDWIDTH, SpeedEstimate, decode_speed
from quantpick.plan.calibration import Calibration, calibrate_speed
from quantpick.plan.memory import (
    Estimate,
    LlamaDevice,
    Overheads,
    RunConfig,
    estimate,
    llama_devices,
)
from quantpick.plan.plan_types import (
    Placement,
    expected_tps,
)
from quantpick.plan.speed import (
    DEFAULT_SPEED_PARAMS,
    DeviceSpeed,
    SpeedParams,
    device_speeds,
    expected_speed,
)


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


def overflow(est: Estimate) -> tuple[int, str | None]:
    worst, where = 0, None
    for d in est.devices:
        over = d.total_bytes - d.budget_bytes
        if over > worst:
            worst, where = over, d.device
    return worst, where


# Host RAM left with less than this share of its budget free counts as tight: the host's figures
# include estimates (compute buffers, what mmap'd weights do to the page cache) and other programs
# grow. GPU budgets already keep --margin (llama.cpp's --fit-target) and are not judged tight.
TIGHT_FRACTION = 0.10

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
class PlacementSearch:
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
            over, _ = overflow(est)
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
        may_tighten = host_tight(found)
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
                not may_tighten and host_tight(fit or least)
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


def host_tight(est: Estimate) -> bool:
    host = est.host
    return host.headroom_bytes < TIGHT_FRACTION * max(host.budget_bytes, 1)
