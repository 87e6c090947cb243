"""Every option of the commands, declared once: its flags, help text, metavar and completion, as
an `Annotated` alias typer reads. Each option's default is given once too, where the commands
take it from (cli/option_blocks.py `SHARED`); a command names the options it takes.

An option that one command means in its own way (`download --quiet`, `serve --timeout`) has an
alias of its own here, named after the command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from quantpick.cli.complete import (
    FLASH_ATTN_CHOICES,
    MANIFEST_SOURCE_CHOICES,
    MODEL_SOURCES,
    PREFER_CHOICES,
)
from quantpick.cli.options import (
    choices_completion,
    complete_estimate_spec,
    complete_gpu,
    complete_kv,
    complete_model_id,
    complete_quant,
    complete_source,
    complete_spec,
    context_value,
)
from quantpick.machine.backends import device_names_example
from quantpick.machine.backends import names as backend_names  # pure data: no start-up cost
from quantpick.serve import formats

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
        autocompletion=choices_completion(FLASH_ATTN_CHOICES),
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
        autocompletion=choices_completion(PREFER_CHOICES),
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


# Fetch options shared by `download` and `get` (flag > environment > config file > default).
ReuseOpt = Annotated[
    Optional[bool],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--reuse/--no-reuse",
        help="Look for the files in other tools' stores (HF cache, llama.cpp, LM Studio, "
        "Ollama) and link verified copies instead of downloading (default: on; "
        "QUANTPICK_REUSE, config.toml `reuse`).",
        show_default=False,
    ),
]
ReuseFromOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--reuse-from",
        help="Only these stores: hf, llama, lmstudio, ollama (repeatable or comma-separated).",
        autocompletion=lambda incomplete: [
            s for s in ("hf", "llama", "lmstudio", "ollama") if s.startswith(incomplete)
        ],
    ),
]
HfCacheOpt = Annotated[
    Optional[bool],  # noqa: UP045
    typer.Option(
        "--hf-cache/--no-hf-cache",
        help="Write into the Hugging Face cache layout (blobs, snapshots, refs) so `hf` and "
        "`llama-server -hf` see the files (QUANTPICK_HF_CACHE, config.toml `hf_cache`).",
        show_default=False,
    ),
]
SourceOpt = Annotated[
    str,
    typer.Option(
        "--source",
        help="auto (the manifest's sources in order, falling back on failure), "
        "hf, modelscope or mirror.",
        autocompletion=complete_source,
    ),
]
AllowUnverifiedOpt = Annotated[
    bool,
    typer.Option(
        "--allow-unverified",
        help="Download files that have no known sha256 anywhere (refused by default).",
    ),
]
ConnectionsOpt = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--connections",
        help="Most connections per file (default 16, adaptive from 4 while the rate grows; "
        "1: one stream; QUANTPICK_CONNECTIONS, config.toml `connections`).",
        show_default=False,
    ),
]

# How `get` and `command` write the command (serve's own --host, --port, ... below).
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        help=formats.help_text(),
        autocompletion=lambda: list(formats.names()),
    ),
]
ModelSourceOpt = Annotated[
    str,
    typer.Option(
        "--model-source",
        help="local (default): the file on disk, -m PATH; hf: llama-server fetches it itself "
        "(-hf REPO:QUANT into its Hugging Face cache; no sha256 check, no pinned revision).",
        autocompletion=lambda: list(MODEL_SOURCES),
    ),
]
ScriptOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--script",
        help="Write an executable launch script here (atomic, mode 0755).",
        dir_okay=False,
    ),
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Let --script and --modelfile replace a file quantpick did not write (or edited "
        "since), --preset and --swap-config a section or entry of the same name written by "
        "hand, and any of them a symlink (the link itself; the old file is kept as a backup; "
        "never a device, FIFO or directory).",
    ),
]
HostOpt = Annotated[str, typer.Option("--host", help="llama-server --host.")]
PortOpt = Annotated[int, typer.Option("--port", help="llama-server --port.")]
AliasOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--alias", help="Model name the server reports (default: the model id)."),
]
ApiKeyEnvOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--api-key-env",
        help="NAME of an environment variable holding the API key "
        "(the key itself is never written).",
    ),
]
# --format preset | llama-swap | ollama: the file each writes (cli/ecosystem.py checks them).
PresetOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--preset",
        help="--format preset: the llama.cpp router INI file to add this model's section to "
        "(created if missing; other sections kept byte for byte; the old file kept as .bak, "
        ".bak.1, ...; a section quantpick did not write is replaced only with --force).",
        dir_okay=False,
    ),
]
SwapConfigOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--swap-config",
        help="--format llama-swap: merge the entry into this llama-swap config (else print it).",
        dir_okay=False,
    ),
]
ModelfileOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--modelfile",
        help="--format ollama: write the Modelfile here (else print it).",
        dir_okay=False,
    ),
]
TtlOpt = Annotated[
    int,
    typer.Option(
        "--ttl",
        help="--format llama-swap: seconds idle before llama-swap unloads the model (0: never).",
    ),
]

# ---- check ---------------------------------------------------------------------------------

TargetArg = Annotated[
    Optional[str],  # noqa: UP045
    typer.Argument(
        help="The alias of a server `quantpick serve` started, or the URL of any llama-server "
        "(default: the one server `serve` started).",
        show_default=False,
    ),
]
LogOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--log",
        help="The log of a llama-server quantpick did not start (llama.cpp's buffer lines need "
        "-lv 4 in current builds).",
        dir_okay=False,
    ),
]
LearnOpt = Annotated[
    bool,
    typer.Option(
        "--learn",
        help="Store the compute buffers llama.cpp allocated as this machine's memory "
        "calibration (for this build, these devices and this size of model) when the server "
        "runs as planned; `quantpick calibration list/reset` show and remove it.",
    ),
]
MeasureOpt = Annotated[
    bool,
    typer.Option(
        "--measure-speed",
        help="Send one short request (32 tokens) and time its decode; otherwise decode speed "
        "comes from /metrics when the server runs with --metrics.",
    ),
]

# ---- probe ---------------------------------------------------------------------------------

ProbeDirOpt = Annotated[
    Optional[Path],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--dir",
        help="Where models would go: free disk space is measured there (default: the models dir).",
        file_okay=False,
    ),
]

# ---- serve ---------------------------------------------------------------------------------

ServePortOpt = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--port",
        help="Port to listen on (default 8080). 0, or a port in use: a free one, said so. "
        "With --stop: the server on this port.",
        show_default=False,
    ),
]
DetachOpt = Annotated[
    bool, typer.Option("--detach", "-d", help="Leave it running in the background (a pid file).")
]
StatusOpt = Annotated[
    bool, typer.Option("--status", help="List the servers quantpick started that still run.")
]
StopOpt = Annotated[
    bool,
    typer.Option(
        "--stop", help="Stop a server quantpick started: MODEL names its alias (--port N)."
    ),
]
ServeGgufOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--gguf",
        help="Serve a GGUF on disk (planned on its own header; nothing is downloaded).",
        dir_okay=False,
    ),
]
ServeHostOpt = Annotated[str, typer.Option("--host", help="Address to listen on.")]
ServeAliasOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--alias", help="Model name the server answers to (default: the model id)."),
]
ServeApiKeyEnvOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--api-key-env",
        help="NAME of an environment variable holding the API key (never written anywhere).",
    ),
]
ServeTimeoutOpt = Annotated[
    float, typer.Option("--timeout", help="Seconds to wait for llama-server to load and answer.")
]

# ---- get and command -------------------------------------------------------------------------

QuietOpt = Annotated[bool, typer.Option("--quiet", "-Q", help="No progress on stderr.")]
GetDryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="Stop before downloading: plan, bytes, source, command.")
]
CommandGgufOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--gguf",
        help="A GGUF on disk: the plan uses its own header. With MODEL too, the file still "
        "wins; MODEL adds its sampling, reasoning format and alias.",
        dir_okay=False,
    ),
]

# ---- pick ------------------------------------------------------------------------------------

MaxContextOpt = Annotated[
    bool,
    typer.Option("--max-context", help="Print the largest context each quant supports instead."),
]

# ---- download and verify ---------------------------------------------------------------------

DownloadModelArg = Annotated[
    str, typer.Argument(help="Manifest id, alias or hub repo id.", autocompletion=complete_model_id)
]
DownloadQuantOpt = Annotated[
    str,
    typer.Option("--quant", help="The quant to fetch, e.g. Q4_K_M.", autocompletion=complete_quant),
]
DownloadVisionOpt = Annotated[
    bool, typer.Option("--vision", help="Also fetch the vision projector (mmproj).")
]
DownloadDirOpt = Annotated[
    Optional[Path],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--dir",
        help="Target directory (default: QUANTPICK_MODELS_DIR or the data dir, "
        "then the manifest id).",
        file_okay=False,
    ),
]
DownloadDryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="Show what would be fetched, from where, and disk room.")
]
DownloadQuietOpt = Annotated[
    bool, typer.Option("--quiet", help="No progress; print only the model file's path.")
]
VerifyDirArg = Annotated[
    Path, typer.Argument(help="Directory holding SHA256SUMS and the files.", file_okay=False)
]
ChecksumsOpt = Annotated[str, typer.Option("--checksums", help="Checksums file name inside DIR.")]

# ---- estimate: llama-server's own flags --------------------------------------------------------

NglOpt = Annotated[
    str | None,
    typer.Option("-ngl", "--n-gpu-layers", help="Layers on GPUs: N, all or auto (default all)."),
]
TensorSplitOpt = Annotated[
    str | None,
    typer.Option("-ts", "--tensor-split", help="Split among GPUs, e.g. 3,1 or 26,16."),
]
NCpuMoeOpt = Annotated[
    int, typer.Option("-ncmoe", "--n-cpu-moe", help="Experts of the first N layers in host memory.")
]
CpuMoeOpt = Annotated[bool, typer.Option("-cmoe", "--cpu-moe", help="All experts in host memory.")]
OverrideTensorOpt = Annotated[
    list[str] | None,
    typer.Option("-ot", "--override-tensor", help="<regex>=<buffer type>,... (repeatable)"),
]
CacheTypeKOpt = Annotated[
    str, typer.Option("-ctk", "--cache-type-k", help="K cache type.", autocompletion=complete_kv)
]
CacheTypeVOpt = Annotated[
    str, typer.Option("-ctv", "--cache-type-v", help="V cache type.", autocompletion=complete_kv)
]
DeviceOpt = Annotated[
    str | None,
    typer.Option(
        "-dev",
        "--device",
        help=f"Devices to use, as llama.cpp names them ({device_names_example()}, "
        "RPC0, ...) or none.",
    ),
]
NoKvOffloadOpt = Annotated[
    bool, typer.Option("-nkvo", "--no-kv-offload", help="Keep KV cache in host memory.")
]
SpecDraftOpt = Annotated[
    int,
    typer.Option(
        "--spec-draft-n-max",
        help="Draft tokens per round (with --spec; alone: MTP with N drafts, 0 = off).",
    ),
]
EstimateSpecOpt = Annotated[
    str,
    typer.Option(
        "--spec",
        help="Size speculative decoding of this kind: off, mtp or ngram.",
        autocompletion=complete_estimate_spec,
    ),
]

# ---- bench -----------------------------------------------------------------------------------

# How long the whole bench may run (llama-bench, or llama-server's load and requests): a 35B model
# with experts on the CPU and an 8K depth takes minutes; an hour means something is stuck.
BENCH_TIMEOUT_S = 3600.0
# The filled context of the second decode figure when --depth is not given: deep enough that KV
# reads show, short enough to prefill in seconds on a GPU (minutes with experts on the CPU).
DEFAULT_DEPTH = 8192

NPromptOpt = Annotated[int, typer.Option("--n-prompt", help="Prefill test size.")]
NGenOpt = Annotated[int, typer.Option("--n-gen", help="Tokens generated per decode test.")]
DepthOpt = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--depth",
        help=f"Filled context for the second decode figure (default: min(-c, {DEFAULT_DEPTH})"
        "; 0 = none; 16K = 16384).",
        parser=context_value,
        metavar="N",
    ),
]
RepsOpt = Annotated[int, typer.Option("--reps", help="Repetitions (llama-bench -r).")]
ToolOpt = Annotated[
    str,
    typer.Option(
        "--tool", help="auto (llama-bench, else llama-server), llama-bench, llama-server."
    ),
]
CompareOpt = Annotated[
    bool, typer.Option("--compare", help="Print the prediction beside the measurement.")
]
NoSaveOpt = Annotated[
    bool, typer.Option("--no-save", help="Measure only; do not store the calibration.")
]
BenchTimeoutOpt = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--timeout",
        metavar="SECONDS",
        help=f"How long the whole measurement may run (default {BENCH_TIMEOUT_S:g}) before "
        "the tool is stopped with everything it started.",
    ),
]

# ---- manifest, show, calibration -------------------------------------------------------------

ManifestRepoArg = Annotated[
    str,
    typer.Argument(
        help="owner/name of a GGUF repository, or its URL (huggingface.co, modelscope.cn).",
        show_default=False,
    ),
]
ManifestSourceOpt = Annotated[
    str,
    typer.Option(
        "--source",
        help="Where the repository lives: hf or modelscope.",
        autocompletion=lambda: list(MANIFEST_SOURCE_CHOICES),
    ),
]
RevisionOpt = Annotated[
    Optional[str],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option("--revision", help="Branch, tag or commit (default: main / master)."),
]
ManifestIdOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--id", help="Manifest id (default: from the repo name, e.g. name-owner)."),
]
ManifestForceOpt = Annotated[bool, typer.Option("--force", help="Replace a manifest with this id.")]
ManifestFileArg = Annotated[Path, typer.Argument(help="A manifest TOML file.", dir_okay=False)]
ShowModelArg = Annotated[
    str,
    typer.Argument(
        help="A manifest id (see `quantpick models`) or a repo id such as "
        "empero-ai/Qwen3.8-35B-A3B-Distill-GGUF.",
        show_default=False,
        autocompletion=complete_model_id,
    ),
]
ResetAllOpt = Annotated[
    bool, typer.Option("--all", help="Remove every machine's profile, not only this one's.")
]
