"""Option aliases shared by several commands (llama-server spellings where they mean the same),
and turning parsed options into the core's inputs (machine, manifest, overheads, plan request)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine
    from quantpick.model.manifest import Manifest
    from quantpick.plan.memory import Overheads


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]

# The machine: probed here, or described (--hardware FILE / --gpu / --ram / --cpu-only).
HardwareOpt = Annotated[
    Optional[Path],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--hardware",
        help="Plan for a described machine: a `quantpick probe --json` file (JSON) or TOML.",
        dir_okay=False,
    ),
]
GpuOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--gpu",
        help="Describe a GPU: NAME[:VRAM[:BANDWIDTH]] "
        "(e.g. 3090, t4, 'a100-80g', 4090:24G:1008GB/s). "
        "Repeatable; order = device order.",
    ),
]
RamOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--ram", help="Describe the host RAM (e.g. 64G); overrides the probe."),
]
CpuOnlyOpt = Annotated[
    bool, typer.Option("--cpu-only", help="Plan without GPUs (ignores any probed GPU).")
]
LlamaServerOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option("--llama-server", help="The llama-server binary to inspect (default: PATH)."),
]
LlamaBinOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--llama-bin",
        help="Directory of llama.cpp's tools (llama-fit-params, llama-bench, llama-server); "
        "default: beside llama-server, then PATH.",
        file_okay=False,
    ),
]
NoConfirmOpt = Annotated[
    bool,
    typer.Option(
        "--no-confirm",
        help="Do not ask llama.cpp (llama-fit-params) to confirm the plan on this machine.",
    ),
]


def complete_model_id(incomplete: str) -> list[str]:
    """Shell completion for MODEL: the ids of the manifests quantpick knows."""
    try:
        from quantpick.model.registry import list_manifests

        ids = [m.id for m in list_manifests(errors=[])]
    except Exception:  # completion must never print a traceback into the shell
        return []
    return [i for i in ids if i.startswith(incomplete)]


# ---- planning options ------------------------------------------------------------------------

ModelArg = Annotated[
    Optional[str],  # noqa: UP045
    typer.Argument(
        help="Model id (see `quantpick models`) or its Hugging Face repo.",
        autocompletion=complete_model_id,
    ),
]
QuantOpt = Annotated[Optional[str], typer.Option("--quant", "-q", help="The quant, e.g. Q4_K_M.")]  # noqa: UP045
GgufOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--gguf", help="Plan for a local GGUF file (its header is the exact basis).", dir_okay=False
    ),
]
CtxOpt = Annotated[
    int, typer.Option("-c", "--ctx-size", help="Context length in tokens (0 = the model's).")
]
NpOpt = Annotated[int, typer.Option("-np", "--parallel", help="Slots (sequences) served at once.")]
KvuOpt = Annotated[
    bool, typer.Option("-kvu", "--kv-unified", help="One KV pool shared by all slots.")
]
UbOpt = Annotated[int, typer.Option("-ub", "--ubatch-size", help="Physical batch size.")]
BOpt = Annotated[int, typer.Option("-b", "--batch-size", help="Logical batch size.")]
FaOpt = Annotated[
    str, typer.Option("-fa", "--flash-attn", help="Flash attention: on, off or auto.")
]
VisionOpt = Annotated[
    bool, typer.Option("--vision", help="Also load the vision projector (--mmproj).")
]
GpuOverheadOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--gpu-overhead",
        help="Per-GPU CUDA context + runtime not accounted by llama.cpp (default 384MiB).",
    ),
]
MarginOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--margin",
        help="Safety margin kept free on every GPU (default 1GiB, as llama.cpp --fit-target).",
    ),
]
RamBandwidthOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--ram-bandwidth",
        help="Host memory bandwidth for the speed model (e.g. 80GB/s; default 50GB/s).",
    ),
]
ExactOpt = Annotated[
    bool, typer.Option("--exact", help="Require the exact tensor table from the GGUF header.")
]
NoNetworkOpt = Annotated[
    bool,
    typer.Option(
        "--no-network",
        "--offline",
        help="Never read headers over the network (cache or manifest only).",
    ),
]

PreferOpt = Annotated[
    str,
    typer.Option(
        "--prefer",
        help="quality (default): best quant that fits and reaches --min-tps; "
        "speed: full-GPU plans first.",
    ),
]
MinTpsOpt = Annotated[
    float,
    typer.Option(
        "--min-tps",
        help="Decode speed floor (upper bound, tok/s) for plans with experts in host memory.",
    ),
]
AllowQ4Opt = Annotated[bool, typer.Option("--allow-q4-kv", help="Also consider a q4_0 KV cache.")]
KvOpt = Annotated[
    list[str] | None,
    typer.Option("--kv", help="Restrict KV cache types (repeatable, best first)."),
]  # noqa: UP045
NoOffloadOpt = Annotated[
    bool, typer.Option("--no-offload", help="Never put experts in host memory.")
]


# ---- options -> core inputs ------------------------------------------------------------------


def machine_from_cli(
    hardware: Path | None,
    gpu: list[str] | None,
    ram: str | None,
    cpu_only: bool,
    llama_server: Path | None,
    ram_bandwidth: str | None,
) -> Machine:
    from dataclasses import replace

    from quantpick.cli import output
    from quantpick.machine.describe import machine_from_options, parse_bandwidth

    # llama-server is not run here: planning does not need it, and `get`/`command` inspect the
    # binary they target when they build the command (server_flags.capabilities_for).
    machine = machine_from_options(hardware, gpu, ram, cpu_only, llama_server, inspect_server=False)
    for line in machine.notes:
        output.note(f"Note: {line}")
    if ram_bandwidth:
        machine = replace(
            machine,
            host=replace(machine.host, ram_bandwidth_bytes_per_s=parse_bandwidth(ram_bandwidth)),
        )
    return machine


def overheads_from_cli(gpu_overhead: str | None, margin: str | None) -> Overheads:
    from dataclasses import replace

    from quantpick.plan.memory import Overheads
    from quantpick.units import parse_size

    o = Overheads()
    if gpu_overhead:
        o = replace(o, gpu_context_bytes=parse_size(gpu_overhead))
    if margin:
        o = replace(o, gpu_margin_bytes=parse_size(margin))
    return o


def apply_local_tuning(
    request: Any,
    overheads: Overheads,
    machine: Machine,
    llama_server: Path | None,
    *,
    gpu_overhead: str | None = None,
) -> tuple[Any, Overheads, Any]:
    """The request and overheads with the installed llama.cpp build's compute rule and this
    machine's calibration (pipeline.local_tuning). Its notes (a calibration applied, or why one
    was not) always go to stderr: a profile is never ignored silently. An explicit
    --gpu-overhead wins over the measured one."""
    from dataclasses import replace

    from quantpick.cli import output
    from quantpick.pipeline import local_tuning, tune

    tuning = local_tuning(machine, llama_server)
    for line in tuning.notes:
        output.note(f"Note: {line}")
    request, tuned = tune(request, overheads, tuning)
    if gpu_overhead is not None:
        tuned = replace(tuned, gpu_context_by_device=overheads.gpu_context_by_device)
    return request, tuned, tuning


def confirm_options(
    no_confirm: bool, llama_bin: Path | None, llama_server: Path | None, machine: Machine
) -> Any:
    """pipeline.ConfirmOptions, or None when confirming is off or the machine is not this one."""
    from quantpick.errors import UsageError
    from quantpick.pipeline import ConfirmOptions

    if llama_bin is not None and not llama_bin.is_dir():
        raise UsageError(f"--llama-bin {llama_bin}: not a directory")
    if no_confirm or machine.described:
        # llama.cpp projects on the devices it sees: a described machine is not this one.
        return None
    return ConfirmOptions(llama_bin=llama_bin, llama_server=llama_server)


def load_manifest(model: str | None) -> Manifest:
    from quantpick.errors import UsageError
    from quantpick.model.registry import find_manifest

    if not model:
        raise UsageError("give a MODEL (see `quantpick models`) or --gguf PATH")
    return find_manifest(model)


def plan_request(
    ctx_size: int,
    parallel: int,
    kv_unified: bool,
    prefer: str,
    quant: str | None,
    vision: bool,
    min_tps: float,
    allow_q4_kv: bool,
    kv: list[str] | None,
    ubatch: int,
    batch: int,
    flash_attn: str,
    no_offload: bool,
) -> Any:
    from quantpick.errors import UsageError
    from quantpick.model.ggml import KV_CACHE_TYPES
    from quantpick.plan.planner import DEFAULT_KV_TYPES, PlanRequest

    kv_types = tuple(kv) if kv else DEFAULT_KV_TYPES + (("q4_0",) if allow_q4_kv else ())
    for t in kv_types:
        if t not in KV_CACHE_TYPES:
            raise UsageError(
                f"--kv {t}: not a KV cache type", hint="use " + ", ".join(KV_CACHE_TYPES)
            )
    return PlanRequest(
        ctx_size=ctx_size,
        n_parallel=parallel,
        kv_unified=kv_unified,
        kv_types=kv_types,
        prefer=prefer,
        quant=quant,
        vision=vision,
        min_tps=min_tps,
        ubatch=ubatch,
        batch=batch,
        flash_attn=flash_attn,
        allow_offload=not no_offload,
    )
