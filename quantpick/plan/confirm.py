"""llama.cpp's own projection beside quantpick's estimate, per device. Pure.

`llama-fit-params --fit off --fit-print on` (serve/fitparams.py runs it) dry-runs llama.cpp's
allocator on the real devices for a configuration and prints, per device, the MiB (floored) of
model weights, context (KV + recurrent state) and compute buffers, and with `--log-jsonl` each
device's free and total memory. This module compares that with the memory model and decides, with
llama.cpp's figures and llama.cpp's own criterion (free - used >= margin, as `--fit` checks),
whether the plan fits.

llama-fit-params cannot be asked everything llama-server does:
- it keeps `n_outputs_max = n_batch`, so its compute buffer on the output device holds logits for a
  whole ubatch; llama-server (builds with PR #23861) reserves a few rows. The saving is measured,
  not modelled: llama-server's own fit projection (`--fit on --log-jsonl`, its fit_memory_breakdown
  record) against llama-fit-params, b11312, full-size qwen35moe Q4_K_M on two RPC devices and on
  the host, 5 configurations (ub 256..2048, np 1..4, f16/q8_0 KV, with and without --n-cpu-moe):
  saving = 0.838 MiB per ubatch row = (vocab x 4 B - 107..114 KiB) per row saved; e.g. 537 -> 108
  MiB at ub 512 np 4, 2148 -> 432 MiB at ub 2048. The constant below (128 KiB) keeps the saving
  10-35 MiB smaller than measured: the projection errs on the side of overflow.
- it has no -kvu and loads no projector (mmproj) or MTP draft context: those differences come from
  the memory model (KV and state exactly, compute as estimated), listed as adjustments.

Units: llama.cpp prints floor(bytes / MiB). Where quantpick's exact bytes floor to the printed
MiB, the exact bytes are used; elsewhere llama.cpp's figure is taken at its upper bound
(MiB + 1 MiB - 1 byte), and free memory at its lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from quantpick.machine.spec import Machine
from quantpick.model.layout import ModelLayout
from quantpick.plan.memory import (
    DeviceEstimate,
    Estimate,
    Overheads,
    RunConfig,
    estimate,
    spec_n_max,
)

MiB = 1024**2
# Bytes per saved logits row that stay live beside the logits in llama-fit-params' reservation
# (measured 107-114 KiB, see the module docstring; rounded up so the saving is not overstated).
LOGITS_LIVE_BYTES_PER_ROW = 128 * 1024


@dataclass(frozen=True)
class LlamaDevice:
    """One device row of llama-fit-params' output, MiB as printed (floored)."""

    name: str  # llama.cpp's device name: CUDA0, RPC1, Vulkan0, ... or "Host"
    model_mib: int
    context_mib: int
    compute_mib: int
    free_mib: int | None = None  # from the fit_memory_breakdown record (--log-jsonl)
    total_mib: int | None = None

    @property
    def is_host(self) -> bool:
        return self.name == "Host"


@dataclass(frozen=True)
class Projection:
    """llama-fit-params' answer for one configuration."""

    devices: tuple[LlamaDevice, ...]  # llama.cpp's device order, Host last
    # host buffer types outside "Host" (CPU_REPACK ...): name -> model MiB (JSON record only)
    other_host_mib: tuple[tuple[str, int], ...] = ()

    @property
    def gpus(self) -> tuple[LlamaDevice, ...]:
        return tuple(d for d in self.devices if not d.is_host)

    @property
    def host(self) -> LlamaDevice | None:
        return next((d for d in self.devices if d.is_host), None)


@dataclass(frozen=True)
class Adjustment:
    device: str  # quantpick's device name
    bytes: int
    why: str


@dataclass(frozen=True)
class DeviceCheck:
    device: str  # quantpick's device name ("CUDA0", "CPU")
    llama_device: str  # llama.cpp's ("CUDA0", "RPC0", "Host")
    kind: str  # "gpu" | "host"
    # quantpick's estimate of the configuration llama-fit-params ran
    predicted_model_bytes: int
    predicted_context_bytes: int
    predicted_compute_bytes: int
    # llama.cpp's figures
    model_mib: int
    context_mib: int
    compute_mib: int
    adjust_bytes: int  # llama-server minus llama-fit-params (see the adjustments)
    projected_bytes: int  # llama.cpp's projection for the llama-server command (upper bound)
    free_bytes: int
    free_from: str  # "llama.cpp" (printed, lower bound) | "probe" (quantpick's machine)
    budget_bytes: int  # free minus the margin
    estimate_total_bytes: int  # quantpick's own total for the plan (for the difference column)
    correction_bytes: int  # what quantpick's estimate needs so it overflows where llama.cpp does
    # llama.cpp's model MiB here is a sum of this many figures, each floored (Host + CPU_REPACK):
    # a sum of n floors lies within n - 1 MiB below the floor of the sum.
    model_floors: int = 1

    @property
    def headroom_bytes(self) -> int:
        return self.budget_bytes - self.projected_bytes

    @property
    def fits(self) -> bool:
        return self.projected_bytes <= self.budget_bytes

    def agrees(self, component: str) -> bool:
        """Does quantpick's estimate floor to llama.cpp's printed MiB?"""
        ours = {
            "model": self.predicted_model_bytes,
            "context": self.predicted_context_bytes,
            "compute": self.predicted_compute_bytes,
        }[component]
        theirs = {"model": self.model_mib, "context": self.context_mib, "compute": self.compute_mib}
        floors = self.model_floors if component == "model" else 1
        return 0 <= ours // MiB - theirs[component] <= floors - 1


@dataclass(frozen=True)
class Confirmation:
    checks: tuple[DeviceCheck, ...]
    adjustments: tuple[Adjustment, ...] = ()
    problem: str | None = None  # why the projection could not be compared (device mismatch)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fits(self) -> bool:
        return self.problem is None and all(c.fits for c in self.checks)

    @property
    def overflowing(self) -> tuple[DeviceCheck, ...]:
        return tuple(c for c in self.checks if not c.fits)

    def corrections(self) -> tuple[tuple[str, int], ...]:
        return tuple((c.device, c.correction_bytes) for c in self.checks if c.correction_bytes)


def fit_params_config(config: RunConfig) -> RunConfig:
    """What llama-fit-params actually runs for `config`: no -kvu, no projector or MTP draft, and
    logits for a whole ubatch (it keeps n_outputs_max = n_batch)."""
    return replace(
        config, kv_unified=False, spec_draft_n=0, draft=None, vision=False, logits_rows="batch"
    )


def server_logits_saving(layout: ModelLayout, config: RunConfig, n_ctx: int) -> int:
    """Bytes llama-server (with the n_outputs_max cap) reserves less than llama-fit-params on the
    output device: measured per saved row (module docstring)."""
    ub = min(config.ubatch, config.batch, n_ctx)
    rows = min(ub, config.batch, max(1, config.n_parallel) * (1 + spec_n_max(config)))
    per_row = layout.architecture.vocab_size * 4 - LOGITS_LIVE_BYTES_PER_ROW
    return max(0, (ub - rows) * per_row)


def _accounted(d: DeviceEstimate) -> int:
    return d.weights_bytes + d.kv_bytes + d.recurrent_bytes + d.compute_bytes


def _component(ours: int, mib: int) -> int:
    """Exact bytes where quantpick agrees to the MiB, else llama.cpp's upper bound."""
    return ours if ours // MiB == mib else (mib + 1) * MiB - 1


# How far llama.cpp's total of model weights may be from the file's own before the projection is
# taken to be of something else (another file, a garbled output): weights are exact against
# llama.cpp (tests/plan/test_memory.py's conformance grid: equal to the MiB), so a quarter is
# far beyond any rounding, and 64 MiB covers the per-row flooring of a tiny model.
WEIGHTS_TOLERANCE = 0.25
WEIGHTS_TOLERANCE_MIB = 64


def _implausible(
    checks: list[DeviceCheck], fp_est: Estimate, projection: Projection, other_host: int
) -> str | None:
    """Why llama.cpp's projection cannot be a projection of this plan, or None."""
    theirs = sum(d.model_mib for d in projection.devices) + other_host
    ours = sum(d.weights_bytes for d in fp_est.devices) // MiB
    if abs(theirs - ours) > max(ours * WEIGHTS_TOLERANCE, WEIGHTS_TOLERANCE_MIB):
        return (
            f"llama.cpp projects {theirs} MiB of model weights, the file holds {ours} MiB: the "
            "projection is not of this plan"
        )
    negative = [c.device for c in checks if c.projected_bytes < 0]
    if negative:
        return f"llama.cpp's projection is negative on {', '.join(negative)}: not a measurement"
    return None


def compare(
    layout: ModelLayout,
    machine: Machine,
    config: RunConfig,
    projection: Projection,
    *,
    capped: bool,
    overheads: Overheads | None = None,
    projector_bytes: int = 0,
) -> Confirmation:
    """llama.cpp's projection (for `fit_params_config(config)`) against the plan, per device.

    `config` is the plan's llama-server configuration; `capped` says whether the installed
    llama-server has the n_outputs_max cap (plan/build_class.py).
    """
    overheads = overheads or Overheads()
    plan_est = estimate(
        layout, machine, config, overheads=overheads, projector_bytes=projector_bytes
    )
    fp_config = fit_params_config(config)
    fp_est = estimate(layout, machine, fp_config, overheads=overheads)
    # The plan as llama-fit-params would reserve it (whole-ubatch logits): its difference from
    # fp_est is what -kvu / MTP / the projector change; the cap's saving is applied separately.
    uncapped = estimate(
        layout,
        machine,
        replace(config, logits_rows="batch"),
        overheads=overheads,
        projector_bytes=projector_bytes,
    )
    if len(projection.gpus) != len(plan_est.gpus) or projection.host is None:
        have = ", ".join(d.name for d in projection.gpus) or "no GPU"
        want = ", ".join(d.device for d in plan_est.gpus) or "no GPU"
        return Confirmation(
            checks=(),
            problem=f"llama.cpp sees {have} but the plan uses {want}: this build cannot run the "
            "plan as written (a CPU-only build, or other devices)",
        )
    existing = dict(overheads.device_correction_bytes)
    saving = server_logits_saving(layout, config, plan_est.n_ctx) if capped else 0
    output_device = next(
        (d.device for d in plan_est.devices if layout.output_slot in d.layers), None
    )
    other_host = sum(mib for _, mib in projection.other_host_mib)
    llama_rows = [*projection.gpus, projection.host]
    checks: list[DeviceCheck] = []
    adjustments: list[Adjustment] = []
    for ours, fp, unc, theirs in zip(
        plan_est.devices, fp_est.devices, uncapped.devices, llama_rows, strict=True
    ):
        model_mib = theirs.model_mib + (other_host if theirs.is_host else 0)
        projected = (
            _component(fp.weights_bytes, model_mib)
            + _component(fp.kv_bytes + fp.recurrent_bytes, theirs.context_mib)
            + _component(fp.compute_bytes, theirs.compute_mib)
        )
        adjust: list[Adjustment] = []
        config_delta = _accounted(unc) - _accounted(fp)
        if config_delta:
            adjust.append(
                Adjustment(
                    ours.device,
                    config_delta,
                    "flags llama-fit-params lacks (-kvu, MTP draft): quantpick's estimate",
                )
            )
        if saving and ours.device == output_device:
            adjust.append(
                Adjustment(
                    ours.device,
                    -saving,
                    "llama-server reserves logits for a few rows, llama-fit-params for a whole "
                    "ubatch (PR #23861; saving measured)",
                )
            )
        if ours.projector_bytes:
            adjust.append(
                Adjustment(
                    ours.device,
                    ours.projector_bytes,
                    "vision projector (not loaded by llama-fit-params): quantpick's estimate",
                )
            )
        if ours.kind == "host" and ours.overhead_bytes:
            adjust.append(
                Adjustment(
                    ours.device,
                    ours.overhead_bytes,
                    "logits output buffer (outside llama.cpp's breakdown): quantpick's estimate",
                )
            )
        adjust_bytes = sum(a.bytes for a in adjust)
        adjustments.extend(adjust)
        projected += adjust_bytes
        if ours.kind == "gpu" and theirs.free_mib is not None:
            # llama.cpp measures free memory after creating its backends: the CUDA context is
            # already taken, so no context overhead is added on its side.
            free, free_from = theirs.free_mib * MiB, "llama.cpp"
            budget = free - overheads.gpu_margin_bytes
        else:
            free, free_from = ours.free_bytes, "probe"
            budget = ours.budget_bytes
            if ours.kind == "gpu":
                projected += ours.overhead_bytes  # no free figure from llama.cpp: add the context
        llama_over = projected - budget
        ours_over = ours.total_bytes - ours.budget_bytes
        correction = existing.get(ours.device, 0) + llama_over - ours_over
        checks.append(
            DeviceCheck(
                device=ours.device,
                llama_device=theirs.name,
                kind=ours.kind,
                predicted_model_bytes=fp.weights_bytes,
                predicted_context_bytes=fp.kv_bytes + fp.recurrent_bytes,
                predicted_compute_bytes=fp.compute_bytes,
                model_mib=model_mib,
                context_mib=theirs.context_mib,
                compute_mib=theirs.compute_mib,
                adjust_bytes=adjust_bytes,
                projected_bytes=projected,
                free_bytes=free,
                free_from=free_from,
                budget_bytes=budget,
                estimate_total_bytes=ours.total_bytes,
                correction_bytes=correction,
                model_floors=1 + (len(projection.other_host_mib) if theirs.is_host else 0),
            )
        )
    problem = _implausible(checks, fp_est, projection, other_host)
    if problem is not None:
        return Confirmation((), (), problem)
    notes = []
    if other_host:
        names = ", ".join(n for n, _ in projection.other_host_mib)
        notes.append(f"host model includes {names} ({other_host} MiB, repacked weights)")
    return Confirmation(tuple(checks), tuple(adjustments), None, tuple(notes))
