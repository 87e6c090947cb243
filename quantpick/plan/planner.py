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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from quantpick.errors import NoFitError, UsageError
from quantpick.machine.spec import Machine
from quantpick.model.layout import ModelLayout
from quantpick.model.manifest import Manifest
from quantpick.plan.build_class import apply_rule
from quantpick.plan.memory import (
    Estimate,
    Overheads,
    RunConfig,
    kv_type_problem,
    rpc_devices,
)
from quantpick.plan.placement import (
    PlacementSearch,
    all_workers,
    device_bandwidths,
    overflow,
    speed_params_for,
)
from quantpick.plan.plan_types import (
    POLICIES,
    Candidate,
    Placement,
    Plan,
    PlanRequest,
    expected_tps,
)
from quantpick.plan.policy import (
    choose,
    missed_min_tps,
    no_fit,
    speed_may_matter,
    speed_of,
    why_lost,
)
from quantpick.plan.quality import Quality, model_of, quality_of
from quantpick.plan.speculative import spec_step_ms, speculation, verify_efficiency

GiB = 1024**3
# llama.cpp's --fit never shrinks below 4096 (fit-ctx default); the planner's smallest context.
MIN_CONTEXT = 4096

# quant -> its layout, resolved by the caller (jobs.plan) before planning.
Layouts = Mapping[str, ModelLayout]


# ----------------------------------------------------------------------------------------------


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
    given = overheads or Overheads()

    def plan_on(m: Machine) -> Plan:
        return _plan_once(manifest, m, layouts, request, given)

    p = _plan_machine(machine, request.prefer, plan_on)
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
    if spec.spec_step_ms == 0.0:
        spec = replace(spec, spec_step_ms=spec_step_ms(machine))
    if request.calibration is not None and request.calibration.acceptance:
        spec = replace(spec, measured_acceptance=request.calibration.acceptance)
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


def _plan_machine(machine: Machine, prefer: str, plan_on: Callable[[Machine], Plan]) -> Plan:
    """`plan_on(machine)`; with RPC workers, weighed against `plan_on` this machine alone."""
    if not machine.rpc_workers:
        return plan_on(machine)
    with_workers: Plan | None = None
    problem: NoFitError | None = None
    try:
        with_workers = plan_on(machine)
    except NoFitError as exc:
        problem = exc
    local = replace(machine, rpc_workers=())
    try:
        alone = plan_on(local)
    except NoFitError:
        if with_workers is None:
            assert problem is not None
            raise problem from None
        return with_workers
    if with_workers is not None and (
        not with_workers.config.rpc_servers  # it left them out itself (they held nothing)
        or not _better_plan(alone, with_workers, prefer)
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
    overheads: Overheads,
) -> Plan:
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
    searches: dict[
        str, PlacementSearch
    ] = {}  # per searched quant: its layout, estimates and speeds

    candidates: list[Candidate] = []
    feasible: list[Candidate] = []
    best_tier: int | None = None  # the tier of the best feasible plan found so far
    # expert-offload candidates at their smallest --n-cpu-moe: (index, search, base config)
    offloaded: list[tuple[int, PlacementSearch, RunConfig]] = []

    def fitted(
        quant: str,
        q: Quality,
        kv: str,
        placement: Placement,
        best: Estimate,
        search: PlacementSearch,
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
        search = searches[quant] = PlacementSearch(
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
                over, where = overflow(least)
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
    # A searched plan can lose what put it ahead (its desktop room, with more experts in RAM),
    # so the tentative choice is taken again after each pass until no skipped plan could win.
    searched: set[int] = set()
    while offloaded:
        tentative = choose(feasible, request.prefer, request.kv_types)[0] if feasible else None
        todo = [
            (idx, search, base)
            for idx, search, base in offloaded
            if idx not in searched
            and (tentative is None
                 or speed_may_matter(candidates[idx], tentative, request.prefer,
                                     request.kv_types))
        ]  # fmt: skip
        if not todo:
            break
        for idx, search, base in todo:
            searched.add(idx)
            c = candidates[idx]
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
            named_slow = max(expected_tps(speed_of(c)) for c in feasible)
    if not feasible:
        raise no_fit(manifest, candidates, target, request)
    chosen, why = choose(feasible, request.prefer, request.kv_types)
    why += missed_min_tps(candidates, chosen, request.min_tps)
    final: list[Candidate] = []
    for c in candidates:
        if c is chosen:
            c = replace(c, reason="chosen: " + why)
        elif c.feasible:
            c = replace(c, reason=why_lost(c, chosen) + "; " + c.reason)
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
