"""A draft model beside the target (llama-server `--spec-type draft-simple -md FILE`): its memory
as llama.cpp b11312 loads it, where it goes, and the cost of one of its decode steps. Pure.

llama-server loads the draft after the target (tools/server/server-context.cpp:1099-1129): the
parameters are the target's, rewritten by common_base_params_to_speculative
(common/speculative.cpp:2445-2500): the draft's own file, devices (-devd, else the target's
--device list), -ngld and -otd (the target's -ot, --cpu-moe and --n-cpu-moe do not apply), the
draft cache types -ctkd/-ctvd, and n_outputs_max = np (one output row per sequence). Then
common_speculative_init_result (:2515-2557) loads the file as a second llama_model and makes a
second llama_context for it with n_ctx = llama_n_ctx(ctx_tgt) (the target's context after its
padding, :2530) and n_rs_seq = 0 (:2534): its own weights, KV cache, recurrent state, output and
compute buffers, on top of the target's. llama-server -lv 4 prints each buffer after "loading
draft model" (tests/data/llama-server-draft-buffers.json, scripts/record_draft_oracle.py).
The target keeps its own memory, except that its output rows grow to np x (1 + n_max)
(server_output_limits over common_speculative_n_max, which counts draft-simple: :2315-2327); a
draft needs no rollback snapshots of the target's recurrent state (need_n_rs_seq counts MTP,
Eagle3, DFlash and DSpark only: common/common.h:396-402).

An `mtp-` sidecar (a GGUF of the NextN block alone, with the embeddings and the output head) is
such a draft file run with `--spec-type draft-mtp`: llama.cpp loads it as the draft model
(src/models/qwen35moe.cpp:39: `mtp_only` when the file has NextN blocks and no blk.0) and gives
its context the MTP type (common/speculative.cpp:2525-2527): the NextN layers' KV only (no
recurrent state), np output rows, its compute; the target keeps n_max rollback snapshots of its
recurrent state (need_n_rs_seq counts MTP). `mtp_context` sizes that.

Placement (quantpick's choice, written as -devd/-ngld): the whole draft on one GPU the target
already uses (no second runtime context), the one with the most room left, else on the host
(-devd none -ngld 0).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from quantpick.machine.spec import Machine
from quantpick.model.layout import ModelLayout
from quantpick.model.speculative import DraftModel
from quantpick.plan.compute import output_buffer
from quantpick.plan.memory import DeviceEstimate, DraftRun, Estimate, Overheads, RunConfig, estimate
from quantpick.plan.speed import DEFAULT_SPEED_PARAMS, DeviceSpeed, SpeedParams, decode_seconds
from quantpick.plan.speed_work import speed_work


def draft_config(target: RunConfig, n_ctx: int, run: DraftRun) -> RunConfig:
    """The draft's own llama-server configuration (common_base_params_to_speculative): the
    target's context (`n_ctx`: the target's padded n_ctx), sequences, batches, flash attention
    and KV offload; the draft's devices, layers and cache types; no tensor overrides."""
    return RunConfig(
        ctx_size=n_ctx,
        n_parallel=target.n_parallel,
        kv_unified=target.kv_unified,
        n_gpu_layers=run.n_gpu_layers,
        cache_type_k=target.spec_cache_type_k,
        cache_type_v=target.spec_cache_type_v,
        # an mtp- sidecar's context is the MTP one, whose KV plan/memory.py types by these
        spec_cache_type_k=target.spec_cache_type_k,
        spec_cache_type_v=target.spec_cache_type_v,
        flash_attn=target.flash_attn,
        ubatch=target.ubatch,
        batch=target.batch,
        kv_offload=target.kv_offload,
        devices=run.devices if run.devices is not None else target.devices,
        rpc_servers=target.rpc_servers,
        logits_rows="server",  # n_outputs_max = np: the estimate's rows without speculation
        fa_mask_f32=target.fa_mask_f32,
        swa_full=target.swa_full,
    )


def draft_overheads(overheads: Overheads | None) -> Overheads:
    """The draft's own estimate adds no GPU runtime context (it only goes to GPUs the target
    already holds), no corrections and no compute ratios measured for the target."""
    o = overheads or Overheads()
    return replace(
        o,
        gpu_context_bytes=0,
        gpu_context_by_device=(),
        device_correction_bytes=(),
        compute_ratio_by_device=(),
        compute_basis="",
    )


def draft_estimate(
    draft: DraftModel,
    machine: Machine,
    target: RunConfig,
    target_estimate: Estimate,
    run: DraftRun,
    overheads: Overheads | None = None,
) -> Estimate:
    """The draft file's own buffers on each device: a draft model's second llama_context, or an
    mtp- sidecar's MTP context (`mtp_context`)."""
    config = draft_config(target, target_estimate.n_ctx, run)
    o = draft_overheads(overheads)
    if is_sidecar(draft.layout):
        return mtp_context(draft.layout, machine, replace(config, spec_draft_n=run.n_max), o)
    return estimate(draft.layout, machine, config, overheads=o)


def is_sidecar(layout: ModelLayout) -> bool:
    """An MTP-only file (src/models/qwen35moe.cpp:39 and the other MTP architectures: NextN
    blocks and no blk.0.attn_norm.weight)."""
    return layout.architecture.nextn_predict_layers > 0 and not any(
        t.name == "blk.0.attn_norm.weight" for t in layout.tensors
    )


def mtp_context(
    sidecar: ModelLayout, machine: Machine, config: RunConfig, overheads: Overheads
) -> Estimate:
    """An `mtp-` sidecar's own buffers: its tensors (the NextN block, embeddings, output head),
    the MTP context's KV of the NextN layers at the target's n_ctx and -ctkd/-ctvd, np output
    rows and its compute (plan/memory.py's MTP draft context, on the sidecar's layout, whose
    trunk layers hold nothing). llama-server -lv 4: tests/data/llama-server-draft-buffers.json
    sidecar_cases."""
    with_mtp = estimate(sidecar, machine, config, overheads=overheads)
    plain = estimate(sidecar, machine, replace(config, spec_draft_n=0), overheads=overheads)
    out = output_buffer(sidecar.architecture.vocab_size, config.n_parallel)
    rows = []
    for w, p in zip(with_mtp.devices, plain.devices, strict=True):
        overhead = out if w.kind == "host" else 0
        kv, compute = w.kv_bytes - p.kv_bytes, w.compute_bytes - p.compute_bytes
        rows.append(
            replace(
                w,
                kv_bytes=kv,
                recurrent_bytes=0,
                compute_bytes=compute,
                overhead_bytes=overhead,
                total_bytes=w.weights_bytes + kv + compute + overhead,
                attention_layers=(),
                recurrent_layers=(),
            )  # fmt: skip
        )
    return replace(with_mtp, devices=tuple(rows))


def combine(target: Estimate, draft: Estimate) -> Estimate:
    """The target's estimate with the draft's buffers added on the same devices (by llama.cpp
    device name; the host is the host). The budgets are the target's: one process."""
    extra = {d.device: d for d in draft.devices}
    devices: list[DeviceEstimate] = []
    for d in target.devices:
        x = extra.pop(d.device, None)
        if x is None:
            devices.append(d)
            continue
        devices.append(
            replace(
                d,
                weights_bytes=d.weights_bytes + x.weights_bytes,
                kv_bytes=d.kv_bytes + x.kv_bytes,
                recurrent_bytes=d.recurrent_bytes + x.recurrent_bytes,
                compute_bytes=d.compute_bytes + x.compute_bytes,
                overhead_bytes=d.overhead_bytes + x.overhead_bytes,
                total_bytes=d.total_bytes + x.total_bytes,
            )
        )
    if any(x.total_bytes for x in extra.values()):
        raise ValueError(f"the draft uses devices the target does not: {', '.join(extra)}")
    return replace(target, devices=tuple(devices), notes=(*target.notes, *draft.notes))


def placements(
    target_estimate: Estimate, n_max: int, path: str, hub: bool = False
) -> list[DraftRun]:
    """Where the draft may go, best first: wholly on one of the target's GPUs (the one with the
    most room first), else the host."""
    gpus = sorted(
        (d for d in target_estimate.gpus if d.layers or d.weights_bytes),
        key=lambda d: -d.headroom_bytes,
    )
    out = [
        DraftRun(path, n_max, None, (d.gpu_index if d.gpu_index is not None else d.device,), hub)
        for d in gpus
    ]
    out.append(DraftRun(path, n_max, 0, (), hub))
    return out


@dataclass(frozen=True)
class DraftPlan:
    """The draft placed: its run flags, its own buffers, and the plan's estimate with them."""

    run: DraftRun
    own: Estimate  # the draft's buffers alone
    combined: Estimate  # the target's (with its grown output rows) plus the draft's

    @property
    def where(self) -> str:
        return (
            "the host"
            if self.run.devices == ()
            else ", ".join(d.device for d in self.own.gpus if d.total_bytes)
        )


def place_draft(
    draft: DraftModel,
    machine: Machine,
    target: RunConfig,
    target_estimate: Estimate,
    n_max: int,
    overheads: Overheads | None = None,
) -> DraftPlan | None:
    """The first placement whose combined estimate fits (None: none does). `target_estimate` is
    the target's estimate with n_max draft rows (its config carries the draft)."""
    for run in placements(target_estimate, n_max, draft.path, draft.hub):
        own = draft_estimate(draft, machine, target, target_estimate, run, overheads)
        combined = combine(target_estimate, own)
        if combined.fits:
            return DraftPlan(run, own, combined)
    return None


def draft_step_seconds(
    draft: DraftModel,
    own: Estimate,
    devices: dict[str, DeviceSpeed],
    fill: int,
    params: SpeedParams = DEFAULT_SPEED_PARAMS,
) -> float:
    """One decode step of the draft where it is placed (plan/speed.py on its own weights and
    KV); its sampling (top-k 10 on the backend: common/speculative.cpp:223-231) is in the
    round's overhead, not here."""
    return decode_seconds(speed_work(draft.layout, own), devices, fill, params, server=False)
