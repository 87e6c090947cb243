"""Speculative decoding: its expected decode speed on one machine, and whether to turn it on.
Pure: data in, data out.

The speed of a speculative round (Leviathan et al. 2023, as llama-server runs it): the draft
proposes n tokens, the target verifies n + 1 in one batch, and accepts a prefix. With a per-token
acceptance probability a (each draft token accepted given the ones before it were), a round
yields 1 + a + a^2 + ... + a^n tokens and costs n draft steps plus one verify batch of n + 1
tokens. llama-server's "draft acceptance rate" is accepted / drafted (tools/server
server-context.cpp `slot.n_draft_accepted / slot.n_draft_total`), i.e. (a + ... + a^n) / n when
every round drafts n (MTP and draft models draft n_max with --spec-draft-p-min 0.00, the default:
tests/data/llama-server-help-current.txt).

The step costs come from plan/speed.py on this machine: `decode_seconds` for a plain step,
`verify_seconds` for the batch of n + 1 (MoE layers read the experts n + 1 tokens pick),
`layers_seconds` over the NextN block and the output head for an MTP draft step. Acceptance per
kind and task is fitted to published runs (benchmarks/data/spec-measurements.json, cited row by
row; benchmarks/spec_accuracy.py holds sources out and prints the error).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from quantpick.machine.backends import BackendKind, all_backends, backend_of
from quantpick.machine.spec import Machine
from quantpick.model.layout import ModelLayout
from quantpick.model.speculative import (
    DraftModel,
    SpecKind,
    Vocabulary,
    spec_sources,
    vocab_problem,
    vocabulary_of,
)
from quantpick.plan.draft import DraftPlan, draft_step_seconds, is_sidecar, place_draft
from quantpick.plan.memory import DraftRun, Estimate, Overheads, RunConfig, estimate
from quantpick.plan.speed import (
    DEFAULT_SPEED_PARAMS,
    DeviceSpeed,
    SpeedParams,
    decode_seconds,
    device_speeds,
    layers_seconds,
    prefill_seconds,
    verify_seconds,
)
from quantpick.plan.speed_work import LayerKinds, SpeedWork, speed_work


class Task(str, Enum):
    """What the user decodes: acceptance differs by an order of magnitude between kinds of text."""

    MIXED = "mixed"  # the mtp-bench mix of llama.cpp PR #22673 (code, prose, math, translation)
    CODE = "code"
    CHAT = "chat"  # explanations, answers, summaries
    CREATIVE = "creative"
    # the output repeats much of its context: code or a document edited in place, a refactor
    # (what an n-gram lookup drafts from; llama.cpp PR #19493's benchmark)
    EDIT = "edit"


# Per-token acceptance a (conditional, see the module doc) by kind and task. Fitted: the median a
# of the rows of benchmarks/data/spec-measurements.json of that kind and task, each row's printed
# rate read as its build drafted (ungated, or gated by --draft-p-min: drafted_per_round)
# (`python benchmarks/spec_accuracy.py --fit` prints fit and table side by side). MTP: rows 1-17
# (llama.cpp PR #22673 mtp-bench runs, PR #24340 H800 per task, Strix Halo toolboxes, #23230).
# Draft models: mixed, rows 21-27 (the 12-prompt code/math/reasoning/summarization/chat suite of
# InventiveHQ/speculative-decoding-consumer-gpus, Qwen2.5-Coder 3B-14B drafted by 0.5B Q8_0 on
# five machines, rates 0.51-0.55 at n-max 5: a 0.78-0.81); code, rows 19 (#10455, a 0.86) and
# 42-43 (the same suite's code prompts: a 0.86 for the 7B pair over its six runs, 0.85 for the
# 14B); chat, row 18 (#5877). The suite's chat prompts (rows 44-45: a coder pair on chat, a
# 0.61-0.66) measure a pair outside its domain, not a task's acceptance: reported, not fitted.
# N-gram: row 20 (PR #19493, code edited in place: the context repeats, a = 0.99); the
# n-gram rows of fresh generation (35-41) found no draft (NGRAM_HIT), so their a is not
# measured and the cells are priors. Unmeasured cells are priors below the measured ones of
# their kind.
ACCEPTANCE: dict[tuple[SpecKind, Task], float] = {
    (SpecKind.MTP, Task.MIXED): 0.86,  # 11 rows
    (SpecKind.MTP, Task.CODE): 0.91,  # row 15
    (SpecKind.MTP, Task.CHAT): 0.84,  # row 17
    (SpecKind.MTP, Task.CREATIVE): 0.79,  # row 16
    (SpecKind.MTP, Task.EDIT): 0.91,  # prior: the code figure
    (SpecKind.DRAFT, Task.MIXED): 0.80,  # rows 21-25, 27
    (SpecKind.DRAFT, Task.CODE): 0.86,  # rows 19, 42, 43
    (SpecKind.DRAFT, Task.CHAT): 0.89,  # row 18
    (SpecKind.DRAFT, Task.CREATIVE): 0.75,  # prior
    (SpecKind.DRAFT, Task.EDIT): 0.86,  # prior: the code figure
    (SpecKind.NGRAM, Task.MIXED): 0.30,  # prior
    (SpecKind.NGRAM, Task.CODE): 0.30,  # prior
    (SpecKind.NGRAM, Task.CHAT): 0.25,  # prior
    (SpecKind.NGRAM, Task.CREATIVE): 0.10,  # prior
    (SpecKind.NGRAM, Task.EDIT): 0.99,  # row 20
}

# The share of rounds in which an n-gram lookup finds a draft at all (a model drafts every
# round): the others decode one token as without speculation, plus the lookup. Measured where
# the output does not repeat its context: rows 35-41 (ngram-cache, n-max 5, the same 12-prompt
# suite on an RTX 5060 Ti, a GTX 1080 Ti, an i7-8700 and an M3 Max) drafted 0-8 tokens over
# ~2900 generated, the code, chat and summarization prompts none: 0. Writing code is not
# editing it: where the output repeats the context (PR #19493: 160 drafts of 48, every token
# accepted) a lookup drafts most rounds; row 20 states no count of the plain rounds, so EDIT's
# 1.0 is a prior (its upper bound). CREATIVE: a prior at the measured 0.
NGRAM_HIT: dict[Task, float] = {
    Task.MIXED: 0.0,  # rows 35-41
    Task.CODE: 0.0,  # the code prompts of rows 35-41
    Task.CHAT: 0.0,  # the chat prompts of rows 35-41
    Task.CREATIVE: 0.0,  # prior
    Task.EDIT: 1.0,  # prior (row 20)
}


def draft_hit(kind: SpecKind, task: Task) -> float:
    """The share of rounds that draft: NGRAM_HIT for an n-gram lookup, every round for a model."""
    return NGRAM_HIT[task] if kind is SpecKind.NGRAM else 1.0


# Each extra verified row's share of a decode step's weight streaming, and a round's own cost
# (sampling n + 1 tokens, the draft's bookkeeping, the recurrent-state snapshot of a hybrid).
# Priors (0.05: mmvq reads the weights once for up to 8 rows; 1 ms: llama-server's per-round
# work), checked by benchmarks/spec_accuracy.py: with them the MTP rows' held-out median error
# is 14% (12 rows, worst 1.67x).
VERIFY_TOKEN_SHARE = 0.05
ROUND_OVERHEAD_MS = 1.0
# What one drafted token of a draft model costs llama-server beyond the draft's own decode step
# (plan/draft.py draft_step_seconds): its sampling, the host round trip of each draft step, the
# draft context's bookkeeping. Fitted: the median over the draft-model rows of
# benchmarks/data/spec-measurements.json that print their rate of (the measured round - the
# modelled verify and draft steps) / the drafts per round: rows 18 (3.2 ms, llama-speculative
# 2024-11, RTX 3060), 21 (3.4, b9789 RTX 5060 Ti CUDA), 22 (2.9, 5060 Ti Vulkan), 24 (5.3, GTX
# 1080 Ti CUDA), 25 (8.7, 1080 Ti Vulkan), 27 (11.3, b9430 M3 Max Metal), 19 (-10.9, M4 Pro: its
# verify and draft steps modelled ~1.25x too slow) (`python benchmarks/spec_accuracy.py --fit`;
# the benchmark refits it without each row's source; with it the draft rows' held-out median
# error is 14%). No row measures the pinned build (b11312).
DRAFT_TOKEN_OVERHEAD_MS = 3.37
# An n-gram lookup drafts on the CPU from the context's hashes: no model step (common/
# speculative.cpp common_speculative_impl_ngram_*: a hash-map lookup per round).
NGRAM_DRAFT_MS = 0.05
# How fast a backend runs the small verify batch relative to its own mat-vec decode (the extra
# rows' share of a verify step is divided by it): each backend's verify_efficiency
# (machine/backends, where the fitted figures and their data are). An input of the decision: the
# machine's backend says which.
BACKEND_VERIFY_EFFICIENCY: dict[BackendKind, float] = {
    b.kind: b.verify_efficiency for b in all_backends()
}


def spec_step_ms(machine: Machine) -> float:
    """What each decode step costs beyond itself with speculation on, on the machine's GPUs'
    backend (the largest of them; 0 without GPUs): Backend.spec_step_ms."""
    return max(
        (backend_of(g.backend).spec_step_ms for g in machine.usable_gpus),
        default=0.0,
    )


def verify_efficiency(machine: Machine) -> float:
    """The verify efficiency of the machine's GPUs' backend (the slowest of them; 1.0 without)."""
    return min(
        (BACKEND_VERIFY_EFFICIENCY[backend_of(g.backend).kind] for g in machine.usable_gpus),
        default=1.0,
    )


# llama-server's default --spec-draft-n-max (common/common.h: 3) and the range searched.
DEFAULT_DRAFT_N_MAX = 3
DRAFT_N_RANGE = range(1, 7)
# A speculation is worth turning on when it decodes at least this much faster: below it the
# prediction's own error (benchmarks/spec_accuracy.py: median ~15-25%) could make it a loss.
MIN_GAIN = 1.15
# How far a kind's predicted speed is expected to overshoot, by which auto divides it before the
# MIN_GAIN test (conservative: a kind is offered on its prediction less its known error). Draft
# models: `python benchmarks/spec_accuracy.py` held out by source, 15 published rows of 5
# sources (llama.cpp #5877, #10455; InventiveHQ's RTX 5060 Ti / GTX 1080 Ti / i7-8700 suite and
# its M3 Max community run; llama-swap's 3090 + P40), median error 14%, worst 1.55x (the M4
# Pro row, under-predicted); median predicted / measured 0.96, the over-predictions up to
# 1.38x (Vulkan on a GTX 1080 Ti) and 1.27x (the M3 Max run that lost 41%, its Metal cost per
# decode call, Backend.spec_step_ms, refitted without its source): a draft is offered on its
# prediction less its median error. MTP (14 rows, held-out median 7%, predicted
# / measured 1.03) and n-gram (6 rows, 1%; they measure rounds that find no draft) are taken as
# predicted.
SPEED_ERROR: dict[SpecKind, float] = {SpecKind.DRAFT: 1.14}
SPEED_ERROR_TEXT: dict[SpecKind, str] = {
    SpecKind.DRAFT: "an estimate checked on 15 published draft-model runs: held-out median "
    "error 14%, worst 1.55x",
}


def draft_count(n: int) -> str:
    """'1 draft', '3 drafts'."""
    return f"{n} draft" if n == 1 else f"{n} drafts"


def credited_tps(opt: SpecOption) -> float:
    """The option's predicted decode less its kind's expected overshoot (SPEED_ERROR); an
    acceptance measured on this machine (quantpick bench --spec) is taken as it is."""
    return opt.tps if opt.measured else opt.tps / SPEED_ERROR.get(opt.kind, 1.0)


def accepted_per_round(a: float, n: int) -> float:
    """Expected draft tokens accepted per round: a + a^2 + ... + a^n."""
    return sum(a**i for i in range(1, n + 1))


def drafted_per_round(a: float, n: int, *, gated: bool = False) -> float:
    """Expected draft tokens proposed per round: n, or with a confidence gate
    (--spec-draft-p-min > 0: the draft stops at its first token under p_min,
    common/speculative.cpp:812) the ideal gate's E[min(n, K + 1)] = 1 + a + ... + a^(n-1),
    where K is the accepted run: it stops right after the first token the target rejects (the
    bound of what a gate can save: no accepted token is lost, no rejected one is verified past
    the first)."""
    if not gated:
        return float(n)
    return sum(a**i for i in range(n))


def rate_from_acceptance(a: float, n: int, *, gated: bool = False) -> float:
    """llama-server's draft acceptance rate (accepted / drafted) for per-token acceptance a."""
    return accepted_per_round(a, n) / drafted_per_round(a, n, gated=gated) if n else 0.0


def acceptance_from_rate(rate: float, n: int, *, gated: bool = False) -> float:
    """The per-token acceptance a whose accepted / drafted over n drafts per round (or, gated,
    over the ideal gate's drafts) is `rate` (bisection: the rate rises with a)."""
    if n <= 1:
        return min(max(rate, 0.0), 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if rate_from_acceptance(mid, n, gated=gated) < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class StepCosts:
    """Seconds of one plain decode step, of one draft step, and of a verify batch of k tokens
    (verify[k], k = 1 .. max), on one machine at one fill."""

    decode_s: float
    draft_s: float
    verify_s: tuple[float, ...]  # index k - 1
    # each decode call's own cost once speculation is on (Backend.spec_step_ms): the target's
    # step, drafted or not, and each draft step of a model or an MTP head (an n-gram lookup is
    # no decode); the backend's, not the target's, so it is not scaled with the target's steps
    spec_step_s: float = 0.0
    spec_draft_step_s: float = 0.0

    def verify(self, tokens: float) -> float:
        """A verify batch of `tokens` (a fractional count, the mean of a gated round's batch,
        between its neighbours' costs)."""
        top = len(self.verify_s)
        t = min(max(tokens, 1.0), float(top))
        k = int(t)
        if k >= top:
            return self.verify_s[top - 1]
        return self.verify_s[k - 1] + (t - k) * (self.verify_s[k] - self.verify_s[k - 1])

    def scaled(self, factor: float, *, draft: bool = True) -> StepCosts:
        """The costs times `factor` (the target's measured or expected decode over the modelled
        one); `draft=False` keeps the draft step: a separate draft model's own, on its device."""
        return StepCosts(
            self.decode_s * factor,
            self.draft_s * (factor if draft else 1.0),
            tuple(v * factor for v in self.verify_s),
            self.spec_step_s,
            self.spec_draft_step_s,
        )


def round_speed(
    costs: StepCosts,
    a: float,
    n: int,
    overhead_ms: float = ROUND_OVERHEAD_MS,
    *,
    gated: bool = False,
    hit: float = 1.0,
) -> float:
    """Decode tok/s with n drafts per round at per-token acceptance a. `gated`: a confidence
    gate stops the draft early (drafted_per_round). `hit`: the share of rounds that find a draft
    at all (an n-gram lookup: NGRAM_HIT); the others are a plain decode step (llama-server
    decodes the sampled token alone when the draft is empty)."""
    if n <= 0:
        return 1.0 / costs.decode_s
    if hit <= 0.0:
        return 1.0 / (costs.decode_s + costs.draft_s + costs.spec_step_s)
    drafted = drafted_per_round(a, n, gated=gated)
    drafting = (
        costs.verify(drafted + 1) + drafted * (costs.draft_s + costs.spec_draft_step_s)
        + overhead_ms * 1e-3 + costs.spec_step_s
    )  # fmt: skip
    # the draft step that found nothing
    plain = costs.decode_s + costs.draft_s + costs.spec_step_s + costs.spec_draft_step_s
    tokens = hit * (1.0 + accepted_per_round(a, n)) + (1.0 - hit)
    return tokens / (hit * drafting + (1.0 - hit) * plain)


def mtp_draft_slots(layout: ModelLayout, estimate: Estimate) -> dict[str, tuple[LayerKinds, int]]:
    """What one MTP draft step reads, per device: the NextN block(s) (attention + the experts one
    token picks) and the output head, where the estimate placed them (the draft context runs on
    the target's weights: common/speculative.cpp:2556-2567)."""
    view = layout.view
    used = view.expert_used_count / view.expert_count if view.expert_count else 1.0
    out: dict[str, tuple[LayerKinds, int]] = {}

    def add(device: str, kinds: LayerKinds, nbytes: int) -> None:
        k, b = out.get(device, (LayerKinds(), 0))
        out[device] = (
            LayerKinds(
                k.attention + kinds.attention, k.recurrent, k.moe + kinds.moe, k.ffn + kinds.ffn
            ),
            b + nbytes,
        )

    host = estimate.host.device
    for d in estimate.devices:
        for s in d.layers:
            if s == layout.output_slot:
                add(d.device, LayerKinds(), layout.slots[s].dense_bytes + layout.tied_output_bytes)
            elif layout.is_nextn_slot(s):
                sw = layout.slots[s]
                moe = bool(sw.expert_bytes)
                add(
                    d.device,
                    LayerKinds(attention=1, moe=int(moe), ffn=int(not moe)),
                    sw.dense_bytes,
                )
                expert_dev = host if s in estimate.host.expert_layers else d.device
                add(expert_dev, LayerKinds(), int(sw.expert_bytes * used))
    return out


# Up to this many rows a quantized matmul runs the mat-vec kernels, one pass over the weights
# (ggml-cuda/mmvq.cuh:3 MMVQ_MAX_BATCH_SIZE 8, taken by ggml-cuda.cu:1799 when src1 has at most
# that many columns; the other backends' mat-vec paths are of the same width): a verify batch
# that size streams the weights (verify_seconds). A larger one takes the batched matmul, which
# is compute-bound on a card with few FLOPs per byte: an M4 Pro verifies 17 tokens of a 32B
# Q4 in ~430 ms, 4.7 of its 91 ms decode steps (llama.cpp PR #10455, spec-measurements row 19:
# 34.4 s for 58 rounds of 16 drafts, 8.8 s of them the draft's).
VERIFY_MATVEC_ROWS = 8


def verify_compute_seconds(
    work: SpeedWork,
    devices: dict[str, DeviceSpeed],
    fill: int,
    tokens: int,
    params: SpeedParams = DEFAULT_SPEED_PARAMS,
) -> float:
    """The compute floor of a verify batch of `tokens`: past VERIFY_MATVEC_ROWS it runs as a
    small prompt batch, plan/speed.py's prefill model over that many tokens (the matmuls at the
    efficiency their rows reach, the weights streamed once per tile); 0 below it."""
    if tokens <= VERIFY_MATVEC_ROWS:
        return 0.0
    return prefill_seconds(work, devices, fill, params, tokens=tokens)


def step_costs(
    layout: ModelLayout,
    estimate: Estimate,
    devices: dict[str, DeviceSpeed],
    kind: SpecKind,
    *,
    fill: int,
    params: SpeedParams = DEFAULT_SPEED_PARAMS,
    verify_efficiency: float = 1.0,
    draft_s: float | None = None,
    max_tokens: int = max(DRAFT_N_RANGE) + 1,
    token_share: float = VERIFY_TOKEN_SHARE,
    draft_overhead_ms: float = DRAFT_TOKEN_OVERHEAD_MS,
    spec_step_ms: float = 0.0,
) -> StepCosts:
    """The step costs of `kind` on this machine for the placement of `estimate` (its config with
    or without speculation: the trunk's work is the same). `draft_s`: the decode step of a
    separate draft file (a draft model; an mtp- sidecar), from its own estimate."""
    trunk = replace(estimate, config=replace(estimate.config, spec_draft_n=0))
    work = speed_work(layout, trunk)
    decode = decode_seconds(work, devices, fill, params)
    verify = tuple(
        max(
            verify_seconds(
                work, devices, fill, k, params, token_share=token_share,
                efficiency=verify_efficiency,
            ),
            verify_compute_seconds(work, devices, fill, k, params),
        )
        for k in range(1, max_tokens + 1)
    )  # fmt: skip
    if draft_s is not None:  # a separate file drafts: a draft model, an mtp- sidecar
        draft = draft_s + (draft_overhead_ms * 1e-3 if kind is SpecKind.DRAFT else 0.0)
    elif kind is SpecKind.MTP:
        mtp_work = speed_work(layout, replace(trunk, config=replace(trunk.config, spec_draft_n=1)))
        draft = layers_seconds(mtp_work, devices, mtp_draft_slots(layout, estimate), params)
    elif kind is SpecKind.NGRAM:
        draft = NGRAM_DRAFT_MS * 1e-3
    else:
        raise ValueError("a draft model's step cost is needed for SpecKind.DRAFT")
    # each draft step of a model or an MTP head is a decode call of its own; a lookup is not
    per_draft = 0.0 if kind is SpecKind.NGRAM else spec_step_ms * 1e-3
    return StepCosts(decode, draft, verify, spec_step_ms * 1e-3, per_draft)


@dataclass(frozen=True)
class SpecOption:
    """One kind at its best --spec-draft-n-max on this machine."""

    kind: SpecKind
    draft_n_max: int
    acceptance: float  # per-token a
    tps: float  # expected decode tok/s with it
    tps_without: float
    measured: bool = False  # the acceptance is this machine's (quantpick bench --spec), not fitted


def best_option(
    kind: SpecKind, costs: StepCosts, task: Task = Task.MIXED, acceptance: float | None = None
) -> SpecOption:
    """The draft count that decodes fastest for this kind on these costs."""
    a = ACCEPTANCE[(kind, task)] if acceptance is None else acceptance
    base = 1.0 / costs.decode_s
    best_n, best = DEFAULT_DRAFT_N_MAX, 0.0
    for n in DRAFT_N_RANGE:
        tps = round_speed(costs, a, n, hit=draft_hit(kind, task))
        if tps > best * 1.0001:
            best_n, best = n, tps
    return SpecOption(kind, best_n, a, best, base)


class SpecMode(str, Enum):
    OFF = "off"
    AUTO = "auto"
    MTP = "mtp"
    DRAFT = "draft"
    NGRAM = "ngram"

    @property
    def kind(self) -> SpecKind | None:
        return None if self in (SpecMode.OFF, SpecMode.AUTO) else SpecKind(self.value)


@dataclass(frozen=True)
class SpecDecision:
    enabled: bool
    kind: SpecKind | None
    draft_n_max: int
    tps: float  # expected decode tok/s with the decision applied
    tps_without: float
    reason: str  # one line
    options: tuple[SpecOption, ...] = ()
    estimate: Estimate | None = None  # the plan's memory with speculation (when enabled)
    draft: DraftPlan | None = None  # a draft model's placement and own buffers (kind DRAFT)

    @property
    def gain(self) -> float:
        return self.tps / self.tps_without if self.tps_without else 1.0


def decide(
    mode: SpecMode,
    available: tuple[SpecKind, ...],
    options: dict[SpecKind, SpecOption],
    refused: dict[SpecKind, str],
    tps_without: float,
    *,
    min_gain: float = MIN_GAIN,
) -> SpecDecision:
    """Turn speculation on only for a kind that is available, whose memory fits the plan as it
    is (same quant, same context: `refused` says why a kind does not) and whose expected gain
    reaches `min_gain` (auto). A kind asked by name is used whenever it is available and fits
    (an override), and the reason says when it is expected to be a loss."""

    def off(reason: str) -> SpecDecision:
        return SpecDecision(
            False, None, 0, tps_without, tps_without, reason, tuple(options.values())
        )

    if mode is SpecMode.OFF:
        return off("speculation off (--spec off)")
    asked = mode.kind
    if asked is not None:
        if asked not in available:
            return off(f"--spec {asked.value}: {_unavailable(asked)}; planned without it")
        if asked in refused:
            return off(f"--spec {asked.value}: {refused[asked]}; planned without it")
        # asked by name: used (an override), and said when the model expects a loss
        return _on(options[asked], tuple(options.values()), asked=True)
    usable = [options[k] for k in available if k in options and k not in refused]
    if not usable:
        why = "; ".join(f"{k.value}: {r}" for k, r in refused.items()) or "nothing to draft with"
        return off(f"no speculation: {why}")
    best = max(usable, key=credited_tps)
    if credited_tps(best) < tps_without * min_gain:
        also = "".join(
            f"; {o.kind.value} with {draft_count(o.draft_n_max)}: {o.tps:.1f} expected"
            + (f" ({credited_tps(o):.1f} less its error)" if o.kind in SPEED_ERROR else "")
            for o in usable
            if o is not best
        ) + "".join(f"; {k.value}: {r}" for k, r in refused.items())
        error = SPEED_ERROR.get(best.kind, 1.0)
        margin = f", less its {100 * (error - 1):.0f}% expected error," if error > 1 else ""
        return off(
            f"no speculation: the best, {best.kind.value} with {draft_count(best.draft_n_max)}, is "
            f"expected at {best.tps:.1f} vs {tps_without:.1f} tok/s without{margin} (under "
            f"{100 * (min_gain - 1):.0f}% gain) on this machine" + also
        )
    return _on(best, tuple(options.values()), asked=False)


def _unavailable(kind: SpecKind) -> str:
    return {
        SpecKind.MTP: "the file has no NextN/MTP block and the repository no mtp- sidecar",
        SpecKind.DRAFT: "no draft model given (--draft PATH) and none known for this model",
        SpecKind.NGRAM: "the installed llama-server has no ngram-mod",
    }[kind]


def _on(opt: SpecOption, options: tuple[SpecOption, ...], *, asked: bool) -> SpecDecision:
    gain = opt.tps / opt.tps_without if opt.tps_without else 1.0
    reason = (
        f"{opt.kind.value} speculation, {draft_count(opt.draft_n_max)}: {opt.tps:.1f} vs "
        f"{opt.tps_without:.1f} tok/s expected (x{gain:.2f}, acceptance "
        f"{100 * rate_from_acceptance(opt.acceptance, opt.draft_n_max):.0f}%"
        + (", measured here by quantpick bench --spec" if opt.measured else "")
        + ")"
        + (" as asked" if asked else "")
        + ("; expected slower than without it on this machine" if asked and gain < 1 else "")
        + (
            f"; {SPEED_ERROR_TEXT[opt.kind]}"
            if opt.kind in SPEED_ERROR_TEXT and not opt.measured
            else ""
        )
    )
    return SpecDecision(True, opt.kind, opt.draft_n_max, opt.tps, opt.tps_without, reason, options)


# ----------------------------------------------------------------------------------------------
# Planning: one plan's configuration, with and without speculation, on one machine.


@dataclass(frozen=True)
class SpecRequest:
    mode: SpecMode = SpecMode.OFF
    task: Task = Task.MIXED
    # --spec-type values the installed llama-server lists (serve/flags.py spec_types); None:
    # not known (the pinned build's, which has them all)
    server_types: frozenset[str] | None = None
    verify_efficiency: float = 1.0  # BACKEND_VERIFY_EFFICIENCY of the machine's backend
    spec_step_ms: float = 0.0  # the machine's backend's Backend.spec_step_ms
    draft: DraftModel | None = None  # --draft: a draft model to plan with
    # the target's vocabulary as read from its file (token texts included); None: from the
    # layout's metadata (no token texts)
    target_vocab: Vocabulary | None = None
    # per-token acceptance by kind ("mtp" -> a) that `quantpick bench --spec` measured on this
    # machine (plan/calibration.py Calibration.acceptance): used instead of the fitted ACCEPTANCE
    measured_acceptance: tuple[tuple[str, float], ...] = ()


def draft_refusal(layout: ModelLayout, request: SpecRequest) -> str | None:
    """Why llama.cpp would refuse the request's draft for this model (None: it takes it)."""
    if request.draft is None:
        return None
    target = request.target_vocab or vocabulary_of(layout.metadata, layout.architecture.vocab_size)
    problem = vocab_problem(target, request.draft.vocab)
    if problem is None:
        return None
    return f"{request.draft.label}: {problem} (llama.cpp's common_speculative_are_compatible)"


def with_kind(
    config: RunConfig, kind: SpecKind | None, n: int, run: DraftRun | None = None
) -> RunConfig:
    """`config` running `kind` with n drafts (None: without speculation); a draft model runs as
    `run` says (its placement)."""
    base = replace(config, spec_draft_n=0, spec_ngram_n=0, draft=None)
    if kind is SpecKind.MTP:
        # the model's own NextN block, or an mtp- sidecar run as the draft file (`run`)
        return replace(base, spec_draft_n=n, draft=replace(run, n_max=n) if run else None)
    if kind is SpecKind.NGRAM:
        return replace(base, spec_ngram_n=n)
    if kind is SpecKind.DRAFT and run is not None:
        return replace(base, draft=replace(run, n_max=n))
    return base


def speculation(
    layout: ModelLayout,
    machine: Machine,
    config: RunConfig,
    tps_without: float,
    request: SpecRequest,
    *,
    model_name: str,
    files: tuple[str, ...] = (),
    model_file: str = "",
    fill: int = 0,
    params: SpeedParams = DEFAULT_SPEED_PARAMS,
    overheads: Overheads | None = None,
    projector_bytes: int = 0,
) -> tuple[SpecDecision, RunConfig]:
    """The decision for one plan, and its configuration with the decision applied. Each kind is
    sized on the plan's own placement, quant and context: one that does not fit is refused (it
    would cost a better quant or the asked context). Speeds are the speed model's step costs,
    scaled so that the plain step is the plan's own expected decode (`tps_without`)."""
    base = with_kind(config, None, 0)
    sources = spec_sources(layout.view, model_name, files=files, model_file=model_file)
    available: list[SpecKind] = [k for k in sources.kinds if k is not SpecKind.DRAFT]
    refused: dict[SpecKind, str] = {}
    # a --draft that is an mtp- sidecar drafts as MTP (--spec-type draft-mtp -md FILE)
    sidecar = request.draft if request.draft and is_sidecar(request.draft.layout) else None
    file_kind = SpecKind.MTP if sidecar else SpecKind.DRAFT
    if sidecar is not None:
        if sources.nextn_layers:
            refused[SpecKind.MTP] = (
                f"{sidecar.label} is an mtp- sidecar and the model has its own NextN block"
            )
        elif SpecKind.MTP not in available:
            available.insert(0, SpecKind.MTP)
    elif request.draft is not None:
        available.insert(len(available) - 1, SpecKind.DRAFT)
        problem = draft_refusal(layout, request)
        if problem is not None:
            refused[SpecKind.DRAFT] = problem
    elif sources.drafts:
        available.insert(len(available) - 1, SpecKind.DRAFT)
        names = " or ".join(f"--draft {d.repo}" for d in sources.drafts)
        refused[SpecKind.DRAFT] = f"a known draft of this family is planned when named: {names}"
    if request.server_types is not None:
        for k in list(available):
            if k.spec_type not in request.server_types:
                refused.setdefault(
                    k, f"the installed llama-server has no --spec-type {k.spec_type}"
                )
    if request.mode is SpecMode.OFF:
        return decide(SpecMode.OFF, tuple(available), {}, refused, tps_without), base
    if sources.nextn_layers == 0 and sources.sidecar is not None and sidecar is None:
        refused.setdefault(
            SpecKind.MTP,
            f"the mtp- sidecar {sources.sidecar} is sized once given: download it and pass "
            "--draft PATH",
        )
    devices = device_speeds(machine)
    options: dict[SpecKind, SpecOption] = {}
    estimates: dict[tuple[SpecKind, int], Estimate] = {}
    drafts: dict[int, DraftPlan] = {}
    for kind in available:
        if kind in refused:
            continue
        fitting: list[int] = []
        short = ""
        for n in DRAFT_N_RANGE:
            if kind is file_kind and request.draft is not None:
                target = estimate(
                    layout, machine, with_kind(base, kind, n, DraftRun(request.draft.path, n)),
                    overheads=overheads, projector_bytes=projector_bytes,
                )  # fmt: skip
                placed = place_draft(request.draft, machine, base, target, n, overheads)
                if placed is not None:
                    fitting.append(n)
                    drafts[n] = placed
                    estimates[(kind, n)] = placed.combined
                elif not short:
                    short = (
                        f"{request.draft.label} ({request.draft.file_bytes / 2**20:.0f} MiB) "
                        "fits neither beside the model on its GPUs nor in host memory at this "
                        "quant and context"
                    )
                continue
            est = estimate(
                layout, machine, with_kind(base, kind, n),
                overheads=overheads, projector_bytes=projector_bytes,
            )  # fmt: skip
            if est.fits:
                fitting.append(n)
                estimates[(kind, n)] = est
            elif not short:
                worst = min(est.devices, key=lambda d: d.headroom_bytes)
                short = (
                    f"its memory ({kind.value} with {draft_count(n)}) leaves {worst.device} "
                    f"{-worst.headroom_bytes / 2**20:.0f} MiB short at this quant and context"
                )
        if not fitting:
            refused[kind] = short
            continue
        draft_s = None
        if kind is file_kind and request.draft is not None:
            own = drafts[fitting[0]].own
            draft_s = draft_step_seconds(request.draft, own, devices, fill, params)
        costs = step_costs(
            layout, estimates[(kind, fitting[0])], devices, kind, fill=fill, params=params,
            verify_efficiency=request.verify_efficiency, draft_s=draft_s,
            spec_step_ms=request.spec_step_ms,
        )  # fmt: skip
        # the plan's own expected decode: the target's steps (and an MTP head's, the target's
        # own layers) scale to it; a draft model's step is its own file's, on its own device
        scale = (1.0 / tps_without) / costs.decode_s if tps_without > 0 else 1.0
        costs = costs.scaled(scale, draft=kind is not SpecKind.DRAFT)
        measured = dict(request.measured_acceptance).get(kind.value)
        a = ACCEPTANCE[(kind, request.task)] if measured is None else measured
        hit = draft_hit(kind, request.task)
        best = max(fitting, key=lambda n: round_speed(costs, a, n, hit=hit))
        options[kind] = SpecOption(
            kind,
            best,
            a,
            round_speed(costs, a, best, hit=hit),
            tps_without,
            measured is not None,
        )
    decision = decide(request.mode, tuple(available), options, refused, tps_without)
    if not decision.enabled or decision.kind is None:
        return decision, base
    n = decision.draft_n_max
    if decision.kind is file_kind and request.draft is not None:
        placed = drafts[n]
        what = "the sidecar" if sidecar else "the draft"
        where = f"; {what} ({request.draft.label}) on {placed.where}"
        return replace(
            decision, estimate=placed.combined, draft=placed, reason=decision.reason + where
        ), with_kind(base, decision.kind, n, placed.run)
    chosen = with_kind(base, decision.kind, n)
    return replace(decision, estimate=estimates[(decision.kind, n)]), chosen
