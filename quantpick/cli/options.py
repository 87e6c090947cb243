"""Option aliases shared by several commands (llama-server spellings where they mean the same),
and turning parsed options into the core's inputs (machine, manifest, overheads, plan request)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from quantpick.cli.complete import (
    ESTIMATE_SPEC_CHOICES,
    FLASH_ATTN_CHOICES,
    PREFER_CHOICES,
    SOURCE_CHOICES,
    SPEC_CHOICES,
)
from quantpick.machine.backends import names as backend_names  # pure data: no start-up cost
from quantpick.model.ggml import KV_CACHE_TYPES  # a plain tuple: no cost at start-up

if TYPE_CHECKING:
    from quantpick.model.manifest import Manifest


# ---- shell completion (each Tab is a new process: keep these light) ---------------------------


def complete_model_id(incomplete: str) -> list[str]:
    """Shell completion for MODEL: the ids of the manifests quantpick knows."""
    try:
        from quantpick.cli.complete import model_items

        return [value for value, _ in model_items(incomplete)]
    except Exception:  # completion must never print a traceback into the shell
        return []


def complete_quant(ctx: typer.Context, incomplete: str) -> list[tuple[str, str | None]]:
    """Shell completion for --quant: the quants of the MODEL already on the command line (best
    first), with their size as the help text zsh and fish show."""
    try:
        from quantpick.cli import completion_args
        from quantpick.cli.complete import quant_items

        # click stops parsing at the option still waiting for its value (`--quant <Tab>`), so
        # MODEL may not be in ctx.params yet: look at the words typed so far too.
        return quant_items([ctx.params.get("model") or "", *completion_args()], incomplete)
    except Exception:  # a broken manifest: nothing to offer, and no traceback in the shell
        return []


def complete_gpu(incomplete: str) -> list[tuple[str, str | None]]:
    """Shell completion for --gpu: the catalogue's names (NAME, before any :VRAM)."""
    try:
        from quantpick.cli.complete import gpu_items

        return gpu_items(incomplete)
    except Exception:
        return []


def _choices(values: tuple[str, ...]) -> Any:
    """A completion callback offering fixed values (validated where the option is used)."""

    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return complete


KV_CHOICES = KV_CACHE_TYPES  # common/arg.cpp kv_cache_types: what -ctk/-ctv accept
complete_kv = _choices(KV_CHOICES)
complete_source = _choices(SOURCE_CHOICES)
complete_spec = _choices(SPEC_CHOICES)
complete_estimate_spec = _choices(ESTIMATE_SPEC_CHOICES)


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
        "(e.g. 3090, t4, 'a100-80g', 4090:24G:1008GB/s; bare numbers are GiB and GB/s). "
        "Repeatable; order = device order.",
        autocompletion=complete_gpu,
    ),
]
BackendOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--backend",
        help=f"llama.cpp's backend for the GPUs: {', '.join(backend_names()[:-1])} or "
        f"{backend_names()[-1]} (default: the installed build's, or for --gpu the vendor's usual "
        "one).",
    ),
]
RamOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--ram", help="Describe the host RAM (e.g. 64G; a bare number is GiB); overrides the probe."
    ),
]
CpuOnlyOpt = Annotated[
    bool, typer.Option("--cpu-only", help="Plan without GPUs (ignores any probed GPU).")
]
# llama.cpp RPC workers: other machines' devices, reached by llama-server --rpc. Every command
# that takes a machine takes these (probe, pick, max-context, estimate, get, command; a future
# `bench` passes them to MachineOptions the same way).
RpcOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--rpc",
        help="An llama.cpp RPC worker (ggml-rpc-server) to read now: HOST:PORT. Repeatable, in "
        "llama-server --rpc order (its devices become RPC0, RPC1, ...).",
    ),
]
RpcDeviceOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--rpc-device",
        help="Describe an RPC worker's device: HOST:PORT=GPU[:VRAM[:BANDWIDTH]] (e.g. "
        "192.168.1.20:50052=t4). Repeatable; repeat an endpoint for each of its devices.",
    ),
]
RpcBandwidthOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--rpc-bandwidth",
        help="Head-to-worker network bandwidth (e.g. 1.1GB/s; default 117MB/s, 1 GbE goodput).",
    ),
]
RpcLatencyOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--rpc-latency",
        help="Head-to-worker round trip (e.g. 0.3ms; default: measured when probed, else 0.3ms).",
    ),
]
RpcBindOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--rpc-bind",
        help="Address every worker's ggml-rpc-server binds (-H); default: the address the head "
        "reaches it at. 0.0.0.0 exposes the worker to every network it is on.",
    ),
]
RpcCacheOpt = Annotated[
    bool,
    typer.Option(
        "--rpc-cache/--no-rpc-cache",
        help="Workers keep received weights on disk (ggml-rpc-server -c): faster reloads.",
    ),
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
NoCalibrationOpt = Annotated[
    bool,
    typer.Option(
        "--no-calibration",
        help="Ignore this machine's stored calibration (quantpick bench): uncalibrated figures.",
    ),
]
TimeoutOpt = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--timeout",
        metavar="SECONDS",
        help="How long each llama.cpp tool may run (llama-fit-params, llama-server --help; "
        "default 10) before it is stopped with everything it started.",
    ),
]
# llama-fit-params projects a full-size header in 0.3 s; CUDA initialisation adds 1-3 s.
TOOL_TIMEOUT_S = 10.0


def tool_timeout(value: float | None, default: float | None = None) -> float:
    """--timeout SECONDS as a number of seconds above 0 (default, else TOOL_TIMEOUT_S, when not
    given)."""
    import math

    from quantpick.errors import UsageError

    if value is None:
        return TOOL_TIMEOUT_S if default is None else default
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"--timeout {value:g}: give a number of seconds above 0")
    return value


# ---- planning options ------------------------------------------------------------------------

ModelArg = Annotated[
    Optional[str],  # noqa: UP045
    typer.Argument(
        help="Model id (see `quantpick models`) or its Hugging Face repo.",
        autocompletion=complete_model_id,
    ),
]
QuantOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--quant", "-q", help="The quant, e.g. Q4_K_M.", autocompletion=complete_quant),
]
GgufOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--gguf", help="Plan for a local GGUF file (its header is the exact basis).", dir_okay=False
    ),
]


def context_value(text: Any) -> int:
    """typer parser for a context length: units.parse_context ("128K" = 131072), its problem as
    click's one-line usage error (with the hint the CLI boundary prints)."""
    from quantpick.cli.core import HintedBadParameter
    from quantpick.errors import UsageError
    from quantpick.units import parse_context

    try:
        return parse_context(text)
    except UsageError as exc:
        raise HintedBadParameter(exc.message, exc.hint) from None


CtxOpt = Annotated[
    int,
    typer.Option(
        "-c",
        "--ctx-size",
        help="Context length in tokens: 0 (the model's) or at least 256 "
        "(llama.cpp pads it to a multiple of 256); 128K = 131072.",
        parser=context_value,
        metavar="N",
    ),
]
NpOpt = Annotated[int, typer.Option("-np", "--parallel", help="Slots (sequences) served at once.")]
KvuOpt = Annotated[
    bool, typer.Option("-kvu", "--kv-unified", help="One KV pool shared by all slots.")
]
UbOpt = Annotated[int, typer.Option("-ub", "--ubatch-size", help="Physical batch size.")]
BOpt = Annotated[int, typer.Option("-b", "--batch-size", help="Logical batch size.")]
FaOpt = Annotated[
    str,
    typer.Option(
        "-fa",
        "--flash-attn",
        help="Flash attention: on, off or auto.",
        autocompletion=_choices(FLASH_ATTN_CHOICES),
    ),
]
VisionOpt = Annotated[
    bool, typer.Option("--vision", help="Also load the vision projector (--mmproj).")
]
GpuOverheadOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--gpu-overhead",
        help="Per-GPU driver context + runtime not accounted by llama.cpp (default 384MiB).",
    ),
]
MarginOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--margin",
        help="Safety margin kept free on every GPU (default 1GiB, as llama.cpp --fit-target).",
    ),
]
RamReserveOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--ram-reserve",
        help="Host RAM left to everything else (default: max(4GiB, 25%) of a described machine's "
        "RAM, max(1GiB, 5%) beyond what a probed machine already uses).",
    ),
]
GpuReserveOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--gpu-reserve",
        help="VRAM a desktop takes on the first GPU of a described machine (default 512MiB; 0 on a "
        "headless box; a probed GPU reports it as used).",
    ),
]
RamBandwidthOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--ram-bandwidth",
        help="Host memory bandwidth for the speed model (e.g. 80GB/s; default 50GB/s).",
    ),
]
CoresOpt = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--cores",
        help="Describe the host's physical CPU cores (a described machine otherwise assumes 6, "
        "the most common desktop; a probed one has its own).",
        show_default=False,
    ),
]
ThreadsOpt = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--threads",
        help="Describe the host's CPU threads (default: two per core when described).",
        show_default=False,
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
        help="balanced (default): the best quality a person would notice, at a usable speed, "
        "experts in RAM only for a real quality step, never BF16; quality: the lowest KLD "
        "that fits and reaches --min-tps; speed: the fastest plan above a quality floor.",
        autocompletion=_choices(PREFER_CHOICES),
    ),
]
# Where get puts models and command, confirm and bench look for them.
ModelDirOpt = Annotated[
    Optional[Path],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--dir",
        help="Model directory (default: QUANTPICK_MODELS_DIR or the data dir).",
        file_okay=False,
    ),
]
MmprojOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option("--mmproj", help="Projector file for --gguf with --vision.", dir_okay=False),
]
# = quantpick.plan.planner.DEFAULT_MIN_TPS, kept here so the CLI does not import the planner to
# show a default (tests/cli/test_cli_plan.py checks they agree).
DEFAULT_MIN_TPS = 5.0
MinTpsOpt = Annotated[
    float,
    typer.Option(
        "--min-tps",
        help="Expected decode speed floor (tok/s at the target context) for every plan.",
    ),
]
SpecOpt = Annotated[
    str,
    typer.Option(
        "--spec",
        help="Speculative decoding: auto (on where the expected gain is real on this machine and "
        "its memory costs neither the quant nor the context), off, or a kind: mtp (the model's "
        "MTP block), draft (a draft model: --draft), ngram.",
        autocompletion=complete_spec,
    ),
]
DraftOpt = Annotated[
    Optional[str],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--draft",
        help="A draft model for speculative decoding: a GGUF file of the same vocabulary (a "
        "smaller model of the family). Sized, placed and used where it is expected to speed "
        "decoding up (--spec auto) or as asked (--spec draft).",
        metavar="PATH",
    ),
]
AllowQ4Opt = Annotated[bool, typer.Option("--allow-q4-kv", help="Also consider a q4_0 KV cache.")]
KvOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--kv", help="Restrict KV cache types (repeatable, best first).", autocompletion=complete_kv
    ),
]  # noqa: UP045
NoOffloadOpt = Annotated[
    bool, typer.Option("--no-offload", help="Never put experts in host memory.")
]


# ---- options -> core inputs ------------------------------------------------------------------

# llama.cpp pads every context to a multiple of 256 cells (src/llama-context.cpp: `cparams.n_ctx =
# GGML_PAD(cparams.n_ctx, 256)`), and before padding it caps the batch at -c (`n_batch =
# min(n_ctx, n_batch)`): a -c below 256 runs with 256 cells but a smaller batch than planned.
# So 256 is the smallest -c quantpick plans. (--fit's floor of 4096, common.h
# `fit_params_min_ctx`, only bounds how far --fit lowers -c by itself.)
MIN_CTX_SIZE = 256


def check_run_options(
    ctx_size: int,
    parallel: int,
    ubatch: int,
    batch: int,
    min_tps: float | None = None,
    flash_attn: str = "on",
    cache_types: tuple[str, ...] = (),
) -> None:
    """Reject values llama.cpp would not run as planned (exit 2, one line each)."""
    from quantpick.errors import UsageError

    if flash_attn not in FLASH_ATTN_CHOICES:
        raise UsageError(f"-fa {flash_attn}: use on, off or auto")
    for t in cache_types:
        if t not in KV_CACHE_TYPES:
            raise UsageError(
                f"KV cache type {t!r} is not one llama.cpp knows",
                hint="use " + ", ".join(KV_CHOICES),
            )

    if ctx_size != 0 and ctx_size < MIN_CTX_SIZE:
        raise UsageError(
            f"-c {ctx_size}: the smallest context is {MIN_CTX_SIZE}",
            hint="llama.cpp pads -c to a multiple of 256; use 0 for the model's own context",
        )
    if parallel < 1:
        raise UsageError(f"-np {parallel}: at least 1 slot")
    if ubatch < 1 or batch < 1:
        raise UsageError(f"-ub {ubatch} / -b {batch}: batch sizes are at least 1")
    if min_tps is not None and not min_tps >= 0:
        raise UsageError(f"--min-tps {min_tps}: a speed floor is 0 (none) or more tok/s")


def check_llama_server(path: Path | None) -> None:
    """--llama-server must name an executable file (checked without running it)."""
    import os

    from quantpick.errors import UsageError

    if path is None:
        return
    if not path.exists():
        raise UsageError(f"--llama-server {path}: no such file")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UsageError(f"--llama-server {path}: not an executable file")


def load_manifest(model: str | None, *, network: bool = True) -> Manifest:
    """MODEL as a manifest: a bundled or added one by id, alias or repository, else any hub
    repository named by owner/name or URL (model/repos.py: listed, every quant's header read and
    cached; `network=False`: from the cache only)."""
    from quantpick.errors import UnknownModelError, UsageError
    from quantpick.model.registry import find_manifest

    if not model:
        from quantpick.cli.core import command_has_option

        # pick and max-context plan a MODEL only; estimate, command, confirm also take --gguf.
        local = " or --gguf PATH" if command_has_option("--gguf") else ""
        raise UsageError(f"give a MODEL (see `quantpick models`){local}")
    from quantpick.cli import output

    try:
        return find_manifest(model, on_note=lambda text: output.note(f"Note: {text}"))
    except UnknownModelError:
        from quantpick.model.repos import is_repo_name, repo_manifest

        if not is_repo_name(model):
            raise
    from quantpick.config import load_settings

    return repo_manifest(
        model, settings=load_settings(), network=network, progress=_header_progress(),
        on_note=lambda text: output.note(f"Note: {text}"),
    )  # fmt: skip


def _header_progress() -> Any:
    """A one-line count of the header reads on a terminal; nothing on a pipe."""
    import sys

    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        sys.stderr.write(f"\rreading GGUF headers {done}/{total}")
        if done >= total:
            sys.stderr.write("\r\033[K")
        sys.stderr.flush()

    return show
