"""`quantpick estimate`, `pick` and `max-context`: the memory model and the planner.

Usage:
    quantpick pick qwen3.8-35b-a3b-distill -c 262144 --gpu 3090 --gpu t4
    quantpick estimate qwen3.8-35b-a3b-distill --quant Q4_K_M -c 131072 -ts 26,16 --json
    quantpick max-context qwen3.8-35b-a3b-distill --gpu 4090
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from quantpick.cli.core import app
from quantpick.cli.options import (
    CpuOnlyOpt,
    GpuOpt,
    HardwareOpt,
    JsonOpt,
    LlamaServerOpt,
    RamOpt,
    complete_model_id,
)

if TYPE_CHECKING:
    from quantpick.layout import ModelLayout
    from quantpick.machine import Machine
    from quantpick.manifest import Manifest
    from quantpick.memory import Estimate, Overheads
    from quantpick.planner import Plan
    from quantpick.speed import SpeedEstimate

# ---- options ---------------------------------------------------------------------------------

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


def _machine(
    hardware: Path | None,
    gpu: list[str] | None,
    ram: str | None,
    cpu_only: bool,
    llama_server: Path | None,
    ram_bandwidth: str | None,
) -> Machine:
    from dataclasses import replace

    from quantpick import output
    from quantpick.describe import machine_from_options, parse_bandwidth

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


def _overheads(gpu_overhead: str | None, margin: str | None) -> Overheads:
    from dataclasses import replace

    from quantpick.memory import Overheads
    from quantpick.units import parse_size

    o = Overheads()
    if gpu_overhead:
        o = replace(o, gpu_context_bytes=parse_size(gpu_overhead))
    if margin:
        o = replace(o, gpu_margin_bytes=parse_size(margin))
    return o


def _load_manifest(model: str | None) -> Manifest:
    from quantpick.errors import UsageError
    from quantpick.manifest import find_manifest

    if not model:
        raise UsageError("give a MODEL (see `quantpick models`) or --gguf PATH")
    return find_manifest(model)


def _layout_source(manifest: Manifest, *, exact: bool, network: bool) -> LayoutSource:
    return LayoutSource(manifest, exact=exact, network=network)


class LayoutSource:
    """quant -> ModelLayout for the planner, memoised.

    Candidates are planned from the header cache or the manifest's synthesized table; with
    --exact every candidate's header is required (read over the network when not cached). Without
    --exact, the chosen quant's header is read once over the network (then cached) and the plan
    is redone on it, so the answer rests on the exact table whenever it can be had.
    """

    def __init__(self, manifest: Manifest, *, exact: bool, network: bool) -> None:
        from quantpick.config import load_settings

        self.manifest = manifest
        self.exact = exact
        self.network = network and not _offline_env()
        self.settings = load_settings()
        self._cache: dict[str, ModelLayout] = {}
        self.problems: list[str] = []

    def __call__(self, quant: str) -> ModelLayout:
        from quantpick.layouts import layout_for

        if quant not in self._cache:
            self._cache[quant] = layout_for(
                self.manifest,
                quant,
                settings=self.settings,
                network=self.network and self.exact,
                require_exact=self.exact,
            )
        return self._cache[quant]

    def upgrade(self, quant: str) -> bool:
        """Replace quant's synthesized layout by the exact header when it can be fetched."""
        from quantpick.errors import GGUFError
        from quantpick.layouts import layout_for

        if self(quant).exact or not self.network:
            return False
        try:
            layout = layout_for(
                self.manifest, quant, settings=self.settings, network=True, require_exact=True
            )
        except GGUFError as exc:
            self.problems.append(exc.message)
            # One failed round per run: the other quants' headers sit on the same hubs.
            self.network = False
            return False
        self._cache[quant] = layout
        return True


def _offline_env() -> bool:
    import os

    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("QUANTPICK_OFFLINE", "HF_HUB_OFFLINE")
    )


def plan_exact(
    manifest: Manifest, machine: Machine, layouts: LayoutSource, request: Any, overheads: Overheads
) -> Plan:
    """Plan, then redo it on the chosen quant's exact header (at most three rounds)."""
    from quantpick.planner import plan

    p = plan(manifest, machine, layouts, request, overheads=overheads)
    for _ in range(3):
        if not layouts.upgrade(p.quant):
            break
        p = plan(manifest, machine, layouts, request, overheads=overheads)
    return p


# ---- rendering -------------------------------------------------------------------------------


def _device_dict(d: Any) -> dict[str, Any]:
    return {
        "device": d.device,
        "name": d.name,
        "kind": d.kind,
        "gpu_index": d.gpu_index,
        "weights_bytes": d.weights_bytes,
        "kv_bytes": d.kv_bytes,
        "recurrent_bytes": d.recurrent_bytes,
        "compute_bytes": d.compute_bytes,
        "overhead_bytes": d.overhead_bytes,
        "projector_bytes": d.projector_bytes,
        "total_bytes": d.total_bytes,
        "free_bytes": d.free_bytes,
        "budget_bytes": d.budget_bytes,
        "headroom_bytes": d.headroom_bytes,
        "fits": d.fits,
        "layers": list(d.layers),
        "attention_layers": list(d.attention_layers),
        "recurrent_layers": list(d.recurrent_layers),
        "expert_layers": list(d.expert_layers),
    }


def _config_dict(config: Any) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(config)
    data["override_tensors"] = [f"{p}={b}" for p, b in config.override_tensors]
    return data


def _speed_dict(speed: SpeedEstimate) -> dict[str, Any]:
    return {
        "tokens_per_s_empty": round(speed.tokens_per_s_empty, 2),
        "tokens_per_s_target": round(speed.tokens_per_s_target, 2),
        "target_context": speed.target_context,
        "efficiency": speed.efficiency,
        "kind": speed.bound,
        "devices": [
            {
                "device": t.device,
                "bandwidth_bytes_per_s": t.bandwidth_bytes_per_s,
                "weight_bytes_per_token": t.weight_bytes_per_token,
                "kv_bytes_per_token_at_target": t.kv_bytes_per_token_at_target,
                "state_bytes_per_token": t.state_bytes_per_token,
            }
            for t in speed.devices
        ],
    }


def _estimate_dict(est: Estimate) -> dict[str, Any]:
    return {
        "fits": est.fits,
        "basis": est.basis,
        "exact_weights": est.exact_weights,
        "n_ctx": est.n_ctx,
        "kv_size": est.kv_size,
        "n_stream": est.n_stream,
        "pipeline_parallel": est.pipeline_parallel,
        "estimated": ["compute_bytes", "overhead_bytes", "projector_bytes"],
        "devices": [_device_dict(d) for d in est.devices],
        "notes": list(est.notes),
    }


def _machine_summary(machine: Machine) -> dict[str, Any]:
    return {
        "described": machine.described,
        "source": machine.source,
        "gpus": [g.name for g in machine.usable_gpus],
    }


def _flags(config: Any, n_slots: int) -> list[str]:
    from quantpick.command import placement_flags

    return placement_flags(config, n_slots - 1)


def _device_table(est: Estimate, title: str) -> Any:
    from rich.table import Table

    gib = 1024**3
    table = Table(title=title + "  (GiB)", title_justify="left", pad_edge=False)
    for col in (
        "device",
        "weights",
        "KV",
        "state",
        "compute*",
        "other*",
        "total",
        "budget",
        "free after",
        "layers",
    ):
        table.add_column(col, justify="left" if col == "device" else "right")
    for d in est.devices:
        name = d.name.replace("NVIDIA ", "").replace("GeForce ", "")
        style = "" if d.fits else "[bold red]"
        table.add_row(
            f"{d.device} {name}",
            f"{d.weights_bytes / gib:.2f}",
            f"{d.kv_bytes / gib:.2f}",
            f"{d.recurrent_bytes / gib:.2f}",
            f"{d.compute_bytes / gib:.2f}",
            f"{(d.overhead_bytes + d.projector_bytes) / gib:.2f}",
            f"{d.total_bytes / gib:.2f}",
            f"{d.budget_bytes / gib:.2f}",
            f"{style}{d.headroom_bytes / gib:.2f}",
            _ranges(d.layers),
        )
    return table


def _ranges(values: tuple[int, ...]) -> str:
    if not values:
        return "-"
    out, start, prev = [], values[0], values[0]
    for v in values[1:]:
        if v == prev + 1:
            prev = v
            continue
        out.append(f"{start}-{prev}" if start != prev else str(start))
        start = prev = v
    out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)


# ---- estimate --------------------------------------------------------------------------------


@app.command("estimate")
def estimate_cmd(
    model: ModelArg = None,
    quant: QuantOpt = None,
    gguf: GgufOpt = None,
    ctx_size: CtxOpt = 0,
    n_gpu_layers: Annotated[
        str | None,
        typer.Option(
            "-ngl", "--n-gpu-layers", help="Layers on GPUs: N, all or auto (default all)."
        ),
    ] = None,  # noqa: UP045
    tensor_split: Annotated[
        str | None,
        typer.Option("-ts", "--tensor-split", help="Split among GPUs, e.g. 3,1 or 26,16."),
    ] = None,  # noqa: UP045
    n_cpu_moe: Annotated[
        int,
        typer.Option("-ncmoe", "--n-cpu-moe", help="Experts of the first N layers in host memory."),
    ] = 0,
    cpu_moe: Annotated[
        bool, typer.Option("-cmoe", "--cpu-moe", help="All experts in host memory.")
    ] = False,
    override_tensor: Annotated[
        list[str] | None,
        typer.Option("-ot", "--override-tensor", help="<regex>=<buffer type>,... (repeatable)"),
    ] = None,  # noqa: UP045
    cache_type_k: Annotated[
        str, typer.Option("-ctk", "--cache-type-k", help="K cache type.")
    ] = "f16",
    cache_type_v: Annotated[
        str, typer.Option("-ctv", "--cache-type-v", help="V cache type.")
    ] = "f16",
    parallel: NpOpt = 1,
    kv_unified: KvuOpt = False,
    ubatch: UbOpt = 512,
    batch: BOpt = 2048,
    flash_attn: FaOpt = "on",
    device: Annotated[
        str | None, typer.Option("-dev", "--device", help="GPUs to use: CUDA0,CUDA1 or none.")
    ] = None,  # noqa: UP045
    no_kv_offload: Annotated[
        bool, typer.Option("-nkvo", "--no-kv-offload", help="Keep KV cache in host memory.")
    ] = False,
    spec_draft: Annotated[
        int,
        typer.Option("--spec-draft-n-max", help="MTP speculation with N draft tokens (0 = off)."),
    ] = 0,
    vision: VisionOpt = False,
    hardware: HardwareOpt = None,
    gpu: GpuOpt = None,
    ram: RamOpt = None,
    cpu_only: CpuOnlyOpt = False,
    llama_server: LlamaServerOpt = None,
    gpu_overhead: GpuOverheadOpt = None,
    margin: MarginOpt = None,
    ram_bandwidth: RamBandwidthOpt = None,
    exact: ExactOpt = False,
    no_network: NoNetworkOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Itemize what llama.cpp will allocate on each device for one configuration."""
    from quantpick import output
    from quantpick.errors import UsageError
    from quantpick.memory import RunConfig, estimate
    from quantpick.planner import device_bandwidths
    from quantpick.speed import decode_speed

    machine = _machine(hardware, gpu, ram, cpu_only, llama_server, ram_bandwidth)
    layout, manifest, label = _resolve_layout(
        model, quant, gguf, exact=exact, network=not no_network
    )
    ngl: int | None
    if n_gpu_layers in (None, "all", "auto", "-1"):
        ngl = None
    else:
        try:
            ngl = int(n_gpu_layers)
        except ValueError:
            raise UsageError(f"-ngl {n_gpu_layers}: use a number, all or auto") from None
    ts = _parse_split(tensor_split)
    overrides = _parse_overrides(override_tensor or [])
    devices = _parse_devices(device, machine)
    config = RunConfig(
        ctx_size=ctx_size,
        n_parallel=parallel,
        kv_unified=kv_unified,
        n_gpu_layers=ngl,
        tensor_split=ts,
        n_cpu_moe=n_cpu_moe,
        cpu_moe=cpu_moe,
        override_tensors=overrides,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        flash_attn=flash_attn,
        ubatch=ubatch,
        batch=batch,
        kv_offload=not no_kv_offload,
        vision=vision,
        spec_draft_n=spec_draft,
        devices=devices,
    )
    projector_bytes = 0
    if vision:
        if manifest is None or manifest.projector is None:
            raise UsageError("--vision needs a model whose manifest has a projector (mmproj)")
        projector_bytes = manifest.projector.size_bytes
    est = estimate(
        layout,
        machine,
        config,
        overheads=_overheads(gpu_overhead, margin),
        projector_bytes=projector_bytes,
    )
    speed = decode_speed(layout, est, device_bandwidths(machine))
    if json_:
        output.print_json(
            {
                "model": label,
                "quant": layout.quant,
                "machine": _machine_summary(machine),
                "config": _config_dict(config),
                "flags": _flags(config, layout.n_slots),
                **_estimate_dict(est),
                "speed": _speed_dict(speed),
            }
        )
        return
    con = output.stdout()
    con.print(
        _device_table(
            est,
            f"{label}  -c {ctx_size or layout.architecture.context_length}"
            f" ({'described machine' if machine.described else 'this machine'})",
        )
    )
    _print_footer(con, est, speed, layout)


def _print_footer(con: Any, est: Estimate, speed: SpeedEstimate, layout: ModelLayout) -> None:
    con.print(f"Basis: {est.basis}" + ("" if est.exact_weights else " (estimate)"))
    con.print(
        "* compute and overhead are estimates; weights, KV and state follow llama.cpp's accounting."
    )
    con.print(
        f"Decode upper bound: {speed.tokens_per_s_empty:.1f} tok/s empty, "
        f"{speed.tokens_per_s_target:.1f} tok/s at {speed.target_context} tokens"
    )
    con.print("Fits." if est.fits else "[bold red]Does not fit.[/]")
    for note in est.notes:
        con.print(f"Note: {note}")


def _resolve_layout(
    model: str | None, quant: str | None, gguf: Path | None, *, exact: bool, network: bool
) -> tuple[ModelLayout, Manifest | None, str]:
    from quantpick.errors import UsageError
    from quantpick.gguf_header import layout_from_header, read_gguf_split

    if gguf is not None:
        # a split GGUF: every shard's header (each shard carries its own tensors)
        header = read_gguf_split(gguf)
        layout = layout_from_header(
            header, basis=f"gguf:{gguf}", file_bytes=header.stats.get("file_bytes"), quant=quant
        )
        manifest = None
        if model:
            manifest = _load_manifest(model)
        return layout, manifest, str(gguf)
    manifest = _load_manifest(model)
    if not quant:
        raise UsageError("give --quant (see `quantpick show " + manifest.id + "`) or --gguf PATH")
    layouts = _layout_source(manifest, exact=exact, network=network)
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


def _parse_devices(text: str | None, machine: Machine) -> tuple[int, ...] | None:
    from quantpick.errors import UsageError

    if text is None:
        return None
    if text.strip().lower() == "none":
        return ()
    out = []
    for part in text.split(","):
        name = part.strip().upper()
        if not name.startswith("CUDA") or not name[4:].isdigit():
            raise UsageError(f"--device {part}: use CUDA0,CUDA1,... or none")
        out.append(int(name[4:]))
    return tuple(out)


# ---- pick ------------------------------------------------------------------------------------


def _request(
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
    from quantpick.ggml import KV_CACHE_TYPES
    from quantpick.planner import DEFAULT_KV_TYPES, PlanRequest

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


def plan_to_dict(p: Plan, machine: Machine, block_count: int) -> dict[str, Any]:
    """The plan as JSON: the chosen configuration, per-device bytes, speed, the llama-server
    flags it implies and every candidate with the reason it lost."""
    return {
        "model": p.model,
        "quant": p.quant,
        "flags": _flags(p.config, block_count + 1),
        "files": [
            {"name": f.name, "size_bytes": f.size_bytes, "sha256": f.sha256} for f in p.files
        ],
        "projector": (
            {"name": p.projector.name, "size_bytes": p.projector.size_bytes}
            if p.projector
            else None
        ),
        "cache_type_k": p.config.cache_type_k,
        "cache_type_v": p.config.cache_type_v,
        "placement": p.placement,
        "policy": p.policy,
        "layout_basis": p.layout_basis,
        "machine": _machine_summary(machine),
        "config": _config_dict(p.config),
        **_estimate_dict(p.estimate),
        "speed": _speed_dict(p.speed),
        "candidates": [
            {
                "quant": c.quant,
                "cache_type": c.cache_type,
                "placement": c.placement,
                "fits": c.fits,
                "feasible": c.feasible,
                "reason": c.reason,
                "tokens_per_s_target": round(c.speed.tokens_per_s_target, 2) if c.speed else None,
                "shortfall_bytes": c.shortfall_bytes,
                "shortfall_device": c.shortfall_device,
                "devices": (
                    [
                        {
                            "device": d.device,
                            "total_bytes": d.total_bytes,
                            "budget_bytes": d.budget_bytes,
                        }
                        for d in c.estimate.devices
                    ]
                    if c.estimate
                    else None
                ),
            }
            for c in p.candidates
        ],
        "notes": list(p.notes),
    }


@app.command("pick")
def pick_cmd(
    model: ModelArg = None,
    ctx_size: CtxOpt = 0,
    parallel: NpOpt = 1,
    kv_unified: KvuOpt = False,
    prefer: PreferOpt = "quality",
    quant: QuantOpt = None,
    vision: VisionOpt = False,
    min_tps: MinTpsOpt = 10.0,
    allow_q4_kv: AllowQ4Opt = False,
    kv: KvOpt = None,
    no_offload: NoOffloadOpt = False,
    ubatch: UbOpt = 512,
    batch: BOpt = 2048,
    flash_attn: FaOpt = "on",
    max_context: Annotated[
        bool,
        typer.Option(
            "--max-context", help="Print the largest context each quant supports instead."
        ),
    ] = False,
    hardware: HardwareOpt = None,
    gpu: GpuOpt = None,
    ram: RamOpt = None,
    cpu_only: CpuOnlyOpt = False,
    llama_server: LlamaServerOpt = None,
    gpu_overhead: GpuOverheadOpt = None,
    margin: MarginOpt = None,
    ram_bandwidth: RamBandwidthOpt = None,
    exact: ExactOpt = False,
    no_network: NoNetworkOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Pick the best quant, KV cache type and placement for a target context."""
    if max_context:
        max_context_cmd(
            model=model,
            quant=quant,
            parallel=parallel,
            kv_unified=kv_unified,
            prefer=prefer,
            vision=vision,
            min_tps=min_tps,
            allow_q4_kv=allow_q4_kv,
            kv=kv,
            no_offload=no_offload,
            hardware=hardware,
            gpu=gpu,
            ram=ram,
            cpu_only=cpu_only,
            llama_server=llama_server,
            gpu_overhead=gpu_overhead,
            margin=margin,
            ram_bandwidth=ram_bandwidth,
            exact=exact,
            no_network=no_network,
            json_=json_,
        )
        return
    from quantpick import output

    manifest = _load_manifest(model)
    machine = _machine(hardware, gpu, ram, cpu_only, llama_server, ram_bandwidth)
    request = _request(
        ctx_size,
        parallel,
        kv_unified,
        prefer,
        quant,
        vision,
        min_tps,
        allow_q4_kv,
        kv,
        ubatch,
        batch,
        flash_attn,
        no_offload,
    )
    layouts = _layout_source(manifest, exact=exact, network=not no_network)
    p = plan_exact(manifest, machine, layouts, request, _overheads(gpu_overhead, margin))
    n_slots = manifest.architecture.block_count + 1
    if layouts.problems:
        output.note(
            f"Note: exact GGUF header unavailable, planned from the manifest: "
            f"{layouts.problems[-1]}"
        )
    if json_:
        doc = plan_to_dict(p, machine, manifest.architecture.block_count)
        doc["header_problems"] = layouts.problems
        output.print_json(doc)
        return
    render_plan(p, machine, n_slots)


def render_plan(p: Plan, machine: Machine, n_slots: int) -> None:
    from rich.table import Table

    from quantpick import output
    from quantpick.units import gb, human

    con = output.stdout()
    size = sum(f.size_bytes for f in p.files)
    where = "described machine: " + machine.source if machine.described else "this machine"
    con.print(
        f"[bold]{p.model}[/] -> [bold green]{p.quant}[/] ({gb(size)}, {human(size)}), "
        f"KV {p.config.cache_type_k}, {p.placement}  [dim]({where})[/]"
    )
    con.print(
        _device_table(
            p.estimate, f"Per device at -c {p.config.ctx_size}, -np {p.config.n_parallel}"
        )
    )
    con.print(
        f"Decode upper bound: {p.speed.tokens_per_s_empty:.1f} tok/s empty, "
        f"{p.speed.tokens_per_s_target:.1f} tok/s at {p.speed.target_context} tokens"
    )
    con.print("llama-server flags: " + " ".join(_flags(p.config, n_slots)))
    con.print(f"Basis: {p.layout_basis}")
    table = Table(title="Candidates", title_justify="left")
    for col in ("quant", "KV", "placement", "tok/s", "result"):
        table.add_column(col)
    for c in p.candidates:
        tps = f"{c.speed.tokens_per_s_target:.1f}" if c.speed and c.fits else "-"
        table.add_row(c.quant, c.cache_type, c.placement, tps, c.reason)
    con.print(table)
    for note in p.notes:
        output.note(f"Note: {note}")


# ---- max-context ------------------------------------------------------------------------------


@app.command("max-context")
def max_context_cmd(
    model: ModelArg = None,
    quant: QuantOpt = None,
    parallel: NpOpt = 1,
    kv_unified: KvuOpt = False,
    prefer: PreferOpt = "quality",
    vision: VisionOpt = False,
    min_tps: MinTpsOpt = 10.0,
    allow_q4_kv: AllowQ4Opt = False,
    kv: KvOpt = None,
    no_offload: NoOffloadOpt = False,
    hardware: HardwareOpt = None,
    gpu: GpuOpt = None,
    ram: RamOpt = None,
    cpu_only: CpuOnlyOpt = False,
    llama_server: LlamaServerOpt = None,
    gpu_overhead: GpuOverheadOpt = None,
    margin: MarginOpt = None,
    ram_bandwidth: RamBandwidthOpt = None,
    exact: ExactOpt = False,
    no_network: NoNetworkOpt = False,
    json_: JsonOpt = False,
) -> None:
    """The largest context each quant (or --quant) supports on this machine."""
    from quantpick import output
    from quantpick.planner import max_context

    manifest = _load_manifest(model)
    machine = _machine(hardware, gpu, ram, cpu_only, llama_server, ram_bandwidth)
    request = _request(
        0,
        parallel,
        kv_unified,
        prefer,
        quant,
        vision,
        min_tps,
        allow_q4_kv,
        kv,
        512,
        2048,
        "on",
        no_offload,
    )
    layout_of = _layout_source(manifest, exact=exact, network=not no_network)
    limits = max_context(
        manifest, machine, layout_of, request, overheads=_overheads(gpu_overhead, margin)
    )
    if json_:
        output.print_json(
            {
                "model": manifest.id,
                "machine": _machine_summary(machine),
                "limits": [
                    {
                        "quant": lim.quant,
                        "max_context": lim.max_context,
                        "cache_type": lim.cache_type,
                        "placement": lim.placement,
                        "tokens_per_s_target": round(lim.tokens_per_s_target, 2)
                        if lim.tokens_per_s_target
                        else None,
                    }
                    for lim in limits
                ],
            }
        )
        return
    from rich.table import Table

    table = Table(title=f"{manifest.id}: largest context per quant", title_justify="left")
    for col in ("quant", "max context", "KV", "placement", "tok/s at max"):
        table.add_column(col)
    for lim in limits:
        table.add_row(
            lim.quant,
            str(lim.max_context) if lim.max_context else "does not fit",
            lim.cache_type or "-",
            lim.placement or "-",
            f"{lim.tokens_per_s_target:.1f}" if lim.tokens_per_s_target else "-",
        )
    output.stdout().print(table)
