"""The policies that choose among the candidates that fit (PlanRequest.prefer: balanced, quality,
speed), with the reason each one lost; the judgment constants they rest on. Pure."""

from __future__ import annotations

import math

from quantpick.errors import NoFitError
from quantpick.model.manifest import Manifest
from quantpick.plan.bandwidth_bound import SpeedEstimate
from quantpick.plan.memory import DESCRIBED_HOST_RESERVE, Estimate
from quantpick.plan.placement import (
    TIGHT_FRACTION,
    host_tight,
)
from quantpick.plan.plan_types import (
    DEFAULT_KV_TYPES,
    Candidate,
    Placement,
    PlanRequest,
    expected_tps,
)
from quantpick.plan.quality import FAMILY, GENERIC, quality_of
from quantpick.units import GiB

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


# "speed": the fastest plan at or above this tier ("small loss" at most) when one fits; speeds
# within this factor count as equal (then the better quality wins).
SPEED_FLOOR_TIER = 1


SPEED_TIE = 1.05


def tight(c: Candidate) -> bool:
    assert c.estimate is not None
    return host_tight(c.estimate)


def desktop_room(est: Estimate) -> bool:
    """Whether a plan leaves the desktop room to work: max(4 GiB, 25 %) of the host's free RAM
    (all of it on a described machine) still inside the budget after the plan. The figures are
    plan/memory.py's DESCRIBED_HOST_RESERVE, what a 32 GB desktop has in use (a desktop session
    and a browser, 4-8 GB): the budget already keeps that much for what runs now, and this keeps
    as much again for what a person opens next (a second browser, an IDE, a build). Within one
    quality tier the balanced policy prefers the lighter plan that leaves it over one that fills
    RAM with experts for a step nobody notices (a 32 GB desktop with a 12 GB card: Q5_K_M's
    experts, not Q6_K's, which leave 6.4 of the 8 GiB)."""
    host = est.host
    floor, share = DESCRIBED_HOST_RESERVE
    return host.headroom_bytes >= max(floor, share * host.free_bytes)


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


def speed_may_matter(
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
        fastest = max(expected_tps(speed_of(c)) for c in pool)
        ties = [c for c in pool if expected_tps(speed_of(c)) * SPEED_TIE >= fastest]
        c = min(
            ties,
            key=lambda c: (
                _kld(c),
                kv_order.index(c.cache_type) if c.cache_type in kv_order else len(kv_order),
                -expected_tps(speed_of(c)),
            ),
        )
        tail = "" if floor else " (nothing at or above the quality floor fits)"
        return c, _describe(c) + ": the fastest plan" + tail
    # balanced: one fixed key over every feasible plan (the KV preference is inside the key)
    return _choose_balanced(feasible, kv_order)


def speed_of(c: Candidate) -> SpeedEstimate:
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
        f"{where.get(c.placement, c.placement)}, ~{expected_tps(speed_of(c)):.0f} tok/s"
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
    tps = max(expected_tps(speed_of(c)), 1e-3)
    utility = math.log(min(tps, COMFORTABLE_TPS)) - c.quality.mean_kld / KLD_PER_SPEED_LOG
    if kv_order and c.cache_type != kv_order[0]:
        utility -= math.log(MEANINGFUL_SPEEDUP)
    assert c.estimate is not None
    room = desktop_room(c.estimate)
    return (-c.quality.tier, not tight(c), room, c.placement is Placement.GPU, utility)


def _choose_balanced(cands: list[Candidate], kv_order: tuple[str, ...]) -> tuple[Candidate, str]:
    def key(c: Candidate) -> tuple[int, bool, bool, bool, float]:
        return balanced_key(c, kv_order)

    pick = max(cands, key=lambda c: (key(c), -_kld(c)))
    assert pick.quality is not None
    why = _describe(pick)
    better = [c for c in cands if _kld(c) < _kld(pick) and c.quant != pick.quant]
    if better:
        # The best-quality plan it was preferred to, and the reason in the policy's own terms.
        top = min(better, key=lambda c: (_kld(c), -expected_tps(speed_of(c))))
        assert top.quality is not None
        gap = top.quality.mean_kld
        kt, kp = key(top), key(pick)
        if kt[1] != kp[1]:
            reason = f"{top.quant} would leave host RAM tight (under {TIGHT_FRACTION:.0%} free)"
        elif kt[2] != kp[2]:
            floor, share = DESCRIBED_HOST_RESERVE
            reason = (
                f"{top.quant} would leave the desktop under max({floor / GiB:.0f} GiB, "
                f"{share:.0%}) of its free RAM, for no quality step a person would notice"
            )
        elif kt[3] != kp[3]:
            reason = (
                f"{top.quant} would need {_in_ram(top)} in RAM (~{expected_tps(speed_of(top)):.0f} "
                "tok/s) for no quality step a person would notice"
            )
        else:
            ratio = expected_tps(speed_of(pick)) / max(expected_tps(speed_of(top)), 1e-3)
            reason = (
                f"{top.quant} would be {ratio:.2f}x slower "
                f"(~{expected_tps(speed_of(top)):.0f} tok/s) "
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


def why_lost(c: Candidate, chosen: Candidate) -> str:
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


def missed_min_tps(candidates: list[Candidate], chosen: Candidate, min_tps: float) -> str:
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


def no_fit(
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
