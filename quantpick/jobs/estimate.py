"""`quantpick estimate`: one configuration in llama-server's own flags, itemized per device, with
the installed build's compute terms and this machine's calibration (the same tuning as every plan,
jobs/tuning.py), and llama.cpp's dry run of it when the file is still on the hub."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from quantpick.jobs.tuning import Tuning, local_tuning, tuned_overheads

if TYPE_CHECKING:
    from pathlib import Path

    from quantpick.config import Settings
    from quantpick.errors import NoFitError
    from quantpick.jobs.confirm import ConfirmOptions
    from quantpick.jobs.dry_run import ConfigCheck
    from quantpick.machine.spec import Machine
    from quantpick.model.layout import ModelLayout
    from quantpick.model.manifest import Manifest
    from quantpick.plan.bandwidth_bound import SpeedEstimate
    from quantpick.plan.memory import Estimate, Overheads, RunConfig


@dataclass(frozen=True)
class EstimateRequest:
    layout: ModelLayout
    manifest: Manifest | None  # None: a GGUF on disk given alone
    machine: Machine
    config: RunConfig  # as the flags say; the build's compute terms are applied here
    overheads: Overheads
    gpu_overhead_given: bool = False  # --gpu-overhead wins over a measured driver overhead
    llama_server: Path | None = None  # the build whose compute rule and calibration apply
    calibration: bool = True  # False: --no-calibration
    on_hub: bool = True  # the file is still on the hub: llama.cpp's dry run can read its header
    network: bool = True


@dataclass(frozen=True)
class EstimateResult:
    config: RunConfig  # with the build's compute terms
    tuning: Tuning
    estimate: Estimate
    speed: SpeedEstimate  # with the expected (calibrated) speed
    check: ConfigCheck | None  # llama.cpp's dry run (None: not run)

    def no_fit(self) -> NoFitError | None:
        """Why the configuration does not fit (exit 3, like `pick`), or None when it does: by
        quantpick's estimate, else by llama.cpp's own projection."""
        from quantpick.errors import NoFitError
        from quantpick.units import human

        over = [d for d in self.estimate.devices if not d.fits]
        check = self.check
        if not over and (check is None or check.status != "overflows"):
            return None
        why = (
            "this configuration does not fit: "
            + ", ".join(f"{d.device} is {human(-d.headroom_bytes)} over budget" for d in over)
            if over or check is None
            else check.message  # quantpick's estimate fits, llama.cpp's own projection does not
        )
        return NoFitError(why, hint="`quantpick pick` finds one that fits")


def estimate_config(
    req: EstimateRequest, confirm: ConfirmOptions | None, *, settings: Settings | None = None
) -> EstimateResult:
    """The itemized estimate and speed of `req.config` on `req.machine`."""
    from quantpick.errors import UsageError
    from quantpick.plan.bandwidth_bound import decode_speed
    from quantpick.plan.build_class import apply_rule
    from quantpick.plan.calibration import calibrate_speed, model_sizes
    from quantpick.plan.memory import estimate
    from quantpick.plan.placement import device_bandwidths, speed_params_for
    from quantpick.plan.speed import device_speeds, expected_speed

    layout, manifest, machine = req.layout, req.manifest, req.machine
    projector_bytes = 0
    if req.config.vision:
        if manifest is None or manifest.projector is None:
            raise UsageError("--vision needs a model whose manifest has a projector (mmproj)")
        projector_bytes = manifest.projector.size_bytes
    # the one file this configuration runs (a calibration applies to a model of its size)
    sizes: tuple[int, ...] = (layout.file_bytes,) if layout.file_bytes else ()
    if not sizes and manifest is not None:
        sizes = model_sizes(manifest)
    tuning = local_tuning(
        machine, req.llama_server, settings=settings, sizes=sizes,
        use_calibration=req.calibration,
    )  # fmt: skip
    config = apply_rule(req.config, tuning.rule)
    overheads = tuned_overheads(req.overheads, tuning, gpu_overhead_given=req.gpu_overhead_given)
    est = estimate(layout, machine, config, overheads=overheads, projector_bytes=projector_bytes)
    speed = decode_speed(layout, est, device_bandwidths(machine))
    expected = expected_speed(
        layout, est, device_speeds(machine), target_context=speed.target_context,
        params=speed_params_for(machine),
    )  # fmt: skip
    if tuning.calibration is not None:
        expected = calibrate_speed(expected, tuning.calibration)
    speed = replace(speed, expected=expected)
    check = None
    if confirm is not None and manifest is not None and req.on_hub:
        from quantpick.config import load_settings
        from quantpick.jobs.dry_run import dry_run_config

        check = dry_run_config(
            manifest, layout, machine, config, overheads=overheads, capped=tuning.rule.capped,
            projector_bytes=projector_bytes, options=confirm,
            settings=settings or load_settings(), network=req.network,
        )  # fmt: skip
    return EstimateResult(config, tuning, est, speed, check)
