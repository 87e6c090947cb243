"""`quantpick estimate`: one configuration in llama-server's own flags, itemized per device.

Usage:
    quantpick estimate qwen3.8-35b-a3b-distill --quant Q4_K_M -c 131072 -ts 26,16 --json
    quantpick estimate --gguf ./model.gguf -c 32768 --gpu 3090
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.cli.core import app
from quantpick.cli.groups import LlamaCppOptions, MachineOptions, PlanOptions, notes
from quantpick.cli.option_blocks import MACHINE, MACHINE_DETAILS, takes
from quantpick.cli.option_table import EstimateSpecOpt
from quantpick.cli.options import (
    check_run_options,
    load_manifest,
)
from quantpick.cli.render import (
    calibration_dict,
    config_dict,
    config_flags,
    device_table,
    estimate_dict,
    machine_summary,
    print_footer,
    rule_dict,
    speed_dict,
    tuning_lines,
)
from quantpick.machine.backends import device_names_example

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine
    from quantpick.model.layout import ModelLayout
    from quantpick.model.manifest import Manifest
    from quantpick.plan.memory import RunConfig

# ---------------------------------------------------------------------------------


@app.command("estimate")
@takes(
    "model quant gguf ctx_size n_gpu_layers tensor_split n_cpu_moe cpu_moe override_tensor "
    "cache_type_k cache_type_v parallel kv_unified ubatch batch flash_attn device no_kv_offload "
    "spec_draft spec vision",
    MACHINE,
    MACHINE_DETAILS,
    "exact no_network no_calibration llama_bin no_confirm timeout json_",
)
def estimate_cmd(spec: EstimateSpecOpt = "off", **given: Any) -> None:
    """Itemize what llama.cpp will allocate on each device for one configuration. For a quant
    still on the hub, with llama.cpp installed, its own projection (a dry run on the real header
    bytes, before download) is shown beside it."""
    given = {**given, "spec": spec}
    from quantpick.cli import output
    from quantpick.cli.confirm import confirmation_to_dict, print_confirmation
    from quantpick.jobs.estimate import EstimateRequest, estimate_config

    _check_flags(given)
    machine = MachineOptions.of(given).machine()
    gguf, network = given["gguf"], not given["no_network"]
    layout, manifest, label = _resolve_layout(
        given["model"], given["quant"], gguf, exact=given["exact"], network=network
    )
    basis, llama = PlanOptions.of(given), LlamaCppOptions.of(given)
    result = estimate_config(
        EstimateRequest(
            layout, manifest, machine, _config(given, machine, layout, label), basis.overheads(),
            gpu_overhead_given=basis.gpu_overhead is not None, llama_server=llama.llama_server,
            calibration=not given["no_calibration"], on_hub=gguf is None, network=network,
        ),
        llama.confirm(machine),
    )  # fmt: skip
    notes(result.tuning.notes)
    config, est, speed, check, tuning = (
        result.config, result.estimate, result.speed, result.check, result.tuning
    )  # fmt: skip
    # A configuration that does not fit is still itemized (stdout), then ends like `pick`: exit 3.
    no_fit = result.no_fit()
    if given["json_"]:
        output.print_json(
            {
                "model": label,
                "quant": layout.quant,
                "machine": machine_summary(machine),
                "compute_rule": rule_dict(tuning.rule),
                "calibration": calibration_dict(tuning.calibration),
                "config": config_dict(config),
                "flags": config_flags(config, layout.n_slots),
                **estimate_dict(est),
                "speed": speed_dict(speed),
                "dry_run": confirmation_to_dict(check),
            }
        )
    else:
        con = output.stdout()
        where = "described machine" if machine.described else "this machine"
        ctx = given["ctx_size"] or layout.architecture.context_length
        con.print(device_table(est, f"{label}  -c {ctx} ({where})"))
        print_footer(con, est, speed, layout)
        for line in tuning_lines(tuning.rule, tuning.calibration):
            con.print(line)
        if check is not None and check.status in ("skipped", "failed"):
            output.note(f"Note: {check.message}")
        elif check is not None:
            print_confirmation(check, stdout=True)
    if no_fit is not None:
        raise no_fit


def _check_flags(given: dict[str, Any]) -> None:
    """llama-server's own flags, checked before anything is read."""
    from quantpick.errors import UsageError

    check_run_options(
        given["ctx_size"], given["parallel"], given["ubatch"], given["batch"],
        flash_attn=given["flash_attn"], cache_types=(given["cache_type_k"], given["cache_type_v"]),
    )  # fmt: skip
    if given["n_cpu_moe"] < 0:
        raise UsageError(f"--n-cpu-moe {given['n_cpu_moe']}: 0 or more layers")


def _config(given: dict[str, Any], machine: Machine, layout: ModelLayout, label: str) -> RunConfig:
    """The configuration llama-server's own flags describe (-ngl, -ts, -ot, -dev, --spec, ...)."""
    from quantpick.errors import UsageError
    from quantpick.plan.memory import RunConfig
    from quantpick.plan.speculative import DEFAULT_DRAFT_N_MAX, SpecMode, with_kind

    n_gpu_layers = given["n_gpu_layers"]
    ngl: int | None
    if n_gpu_layers in (None, "all", "auto", "-1"):
        ngl = None
    else:
        try:
            ngl = int(n_gpu_layers)
        except ValueError:
            raise UsageError(f"-ngl {n_gpu_layers}: use a number, all or auto") from None
    spec, spec_draft = given["spec"], given["spec_draft"]
    config = RunConfig(
        ctx_size=given["ctx_size"],
        n_parallel=given["parallel"],
        kv_unified=given["kv_unified"],
        n_gpu_layers=ngl,
        tensor_split=_parse_split(given["tensor_split"]),
        n_cpu_moe=given["n_cpu_moe"],
        cpu_moe=given["cpu_moe"],
        override_tensors=_parse_overrides(given["override_tensor"] or []),
        cache_type_k=given["cache_type_k"],
        cache_type_v=given["cache_type_v"],
        flash_attn=given["flash_attn"],
        ubatch=given["ubatch"],
        batch=given["batch"],
        kv_offload=not given["no_kv_offload"],
        vision=given["vision"],
        spec_draft_n=spec_draft if spec in ("off", "mtp") else 0,
        devices=_parse_devices(given["device"], machine),
        rpc_servers=tuple(w.endpoint for w in machine.rpc_workers),
    )
    if spec not in ("off", SpecMode.MTP.value, SpecMode.NGRAM.value):
        raise UsageError(f"--spec {spec}: not a speculation kind", hint="use off, mtp or ngram")
    spec_mode = SpecMode(spec)
    if spec_mode is SpecMode.MTP and layout.architecture.nextn_predict_layers == 0:
        raise UsageError(f"--spec mtp: {label} has no NextN/MTP block")
    if spec_mode.kind is not None:
        config = with_kind(config, spec_mode.kind, spec_draft or DEFAULT_DRAFT_N_MAX)
    return config


def _resolve_layout(
    model: str | None, quant: str | None, gguf: Path | None, *, exact: bool, network: bool
) -> tuple[ModelLayout, Manifest | None, str]:
    from quantpick.errors import UsageError
    from quantpick.model.gguf import layout_from_header, read_gguf_split

    if gguf is not None:
        # a split GGUF: every shard's header (each shard carries its own tensors)
        header = read_gguf_split(gguf)
        layout = layout_from_header(
            header, basis=f"gguf:{gguf}", file_bytes=header.stats.get("file_bytes"), quant=quant
        )
        manifest = None
        if model:
            manifest = load_manifest(model)
        return layout, manifest, str(gguf)
    manifest = load_manifest(model, network=network)
    if not quant:
        raise UsageError("give --quant (see `quantpick show " + manifest.id + "`) or --gguf PATH")
    from quantpick.model.headers import LayoutSource

    layouts = LayoutSource(manifest, exact=exact, network=network)
    wanted = [q for q in manifest.quants if q.upper() == quant.upper()]
    if not wanted:
        raise UsageError(
            f"{manifest.id} has no quant {quant}", hint="available: " + ", ".join(manifest.quants)
        )
    layouts.upgrade(wanted[0])
    return layouts(wanted[0]), manifest, f"{manifest.id} {wanted[0]}"


def _parse_split(text: str | None) -> tuple[float, ...] | None:
    from quantpick.errors import UsageError

    if not text:
        return None
    try:
        values = tuple(float(v) for v in text.replace("/", ",").split(","))
    except ValueError:
        raise UsageError(f"-ts {text}: use comma-separated numbers, e.g. 3,1") from None
    return values


def _parse_overrides(items: list[str]) -> tuple[tuple[str, str], ...]:
    import re

    from quantpick.errors import UsageError

    pairs: list[tuple[str, str]] = []
    for item in items:
        for part in item.split(","):
            if not part:
                continue
            pattern, sep, buft = part.rpartition("=")
            if not sep or not pattern or not buft:
                raise UsageError(f"-ot {part}: use <regex>=<buffer type>, e.g. exps=CPU")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise UsageError(f"-ot {part}: bad regex ({exc})") from None
            pairs.append((pattern, buft))
    return tuple(pairs)


def _parse_devices(text: str | None, machine: Machine) -> tuple[int | str, ...] | None:
    """--device: local GPUs as their index (llama.cpp's name: CUDA0, ROCm0, MTL0, Vulkan0,
    SYCL0), RPC devices by name (RPC<k>)."""
    from quantpick.errors import UsageError
    from quantpick.machine.backends import parse_device_name

    if text is None:
        return None
    if text.strip().lower() == "none":
        return ()
    out: list[int | str] = []
    for part in text.split(","):
        name = part.strip().upper()
        local = parse_device_name(part)
        if local is not None and name[-1:].isdigit():
            out.append(local[1])
        elif name.startswith("RPC") and name[3:].isdigit():
            out.append(name)
        else:
            raise UsageError(
                f"--device {part}: use a device name as llama.cpp prints it "
                f"({device_names_example()}), RPC0,... or none"
            )
    return tuple(out)
