"""Each option's default, given once, and the options a command takes, named.

typer reads a command's options from its signature and cannot group them (typer#264).
cli/option_table.py declares every option (flags, help) as an alias; `SHARED` below gives each its
default, once. A command names the options it takes, in --help order, and gets them by name:

    @app.command("pick")
    @takes("model ctx_size quant", MACHINE, "json_")
    def pick_cmd(**given: Any) -> None:
        machine = MachineOptions.of(given).machine()      # the option groups (cli/groups.py)

`MACHINE` is a block: options several commands take together (--hardware, --gpu, --ram, ...).
An option one command means in its own way (`download --quiet`) is a parameter of that command,
named in `takes` where it stands. `with_blocks` is the older form: a parameter whose default is a
block stands for the block's options.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from quantpick.cli import option_table as o
from quantpick.cli.options import DEFAULT_MIN_TPS

F = TypeVar("F", bound=Callable[..., Any])


class OptionBlock:
    """Options taken together (their annotations and defaults), as one unit."""

    def __init__(self, name: str, params: tuple[inspect.Parameter, ...]) -> None:
        self.name = name
        self.params = params

    @classmethod
    def declared(cls, declare: Callable[..., None]) -> OptionBlock:
        """The options of `declare`'s signature, in order, with their defaults."""
        signature = inspect.signature(declare, eval_str=True)
        return cls(declare.__name__, tuple(signature.parameters.values()))

    def __repr__(self) -> str:
        return f"<options {self.name}: {', '.join(p.name for p in self.params)}>"


def with_blocks(command: F) -> F:
    """`command` as typer sees it: each parameter whose default is an OptionBlock replaced by the
    block's parameters, `**options` dropped. Called with every option by name, it passes the
    block's options in `**options`."""
    params: list[inspect.Parameter] = []
    for param in inspect.signature(command, eval_str=True).parameters.values():
        if isinstance(param.default, OptionBlock):
            params.extend(param.default.params)
        elif param.kind is not inspect.Parameter.VAR_KEYWORD:
            params.append(param)
    return _as_typer_sees(command, params)


def takes(*parts: str | OptionBlock, **defaults: Any) -> Callable[[F], F]:
    """The options a command takes, in --help order: names (space-separated) of the command's own
    parameters or of SHARED, and blocks; `defaults`: the command's own default for a shared one
    (`bench --spec off`). The command gets the shared ones in `**options`."""

    def decorate(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        own = {p.name: p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD}
        params = list(block(*parts, names=own).params)
        unknown = set(defaults) - {p.name for p in params} | set(own) - {p.name for p in params}
        if unknown:
            raise TypeError(f"{command.__name__}: not among the options it takes: {unknown}")
        params = [p.replace(default=defaults.get(p.name, p.default)) for p in params]
        return _as_typer_sees(command, params)

    return decorate


def _as_typer_sees(command: F, params: list[inspect.Parameter]) -> F:
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise TypeError(f"{command.__name__}: an option is given twice: {names}")
    # typer wants the parameters with a default after those without (MODEL of `download`)
    params = sorted(params, key=lambda p: p.default is not p.empty)

    @functools.wraps(command)
    def run(**values: Any) -> Any:
        return command(**values)

    signature = inspect.signature(command, eval_str=True)
    run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    del run.__wrapped__  # typer reads this signature, not the placeholders'
    return run  # type: ignore[return-value]


def _shared(
    json_: o.JsonOpt = False,
    model: o.ModelArg = None,
    quant: o.QuantOpt = None,
    gguf: o.GgufOpt = None,
    mmproj: o.MmprojOpt = None,
    ctx_size: o.CtxOpt = 0,
    parallel: o.NpOpt = 1,
    kv_unified: o.KvuOpt = False,
    ubatch: o.UbOpt = 512,
    batch: o.BOpt = 2048,
    flash_attn: o.FaOpt = "on",
    prefer: o.PreferOpt = "balanced",
    vision: o.VisionOpt = False,
    min_tps: o.MinTpsOpt = DEFAULT_MIN_TPS,
    spec: o.SpecOpt = "auto",
    draft: o.DraftOpt = None,
    allow_q4_kv: o.AllowQ4Opt = False,
    kv: o.KvOpt = None,
    no_offload: o.NoOffloadOpt = False,
    dir_: o.ModelDirOpt = None,
    exact: o.ExactOpt = False,
    no_network: o.NoNetworkOpt = False,
    # the machine
    hardware: o.HardwareOpt = None,
    gpu: o.GpuOpt = None,
    ram: o.RamOpt = None,
    cpu_only: o.CpuOnlyOpt = False,
    gpu_overhead: o.GpuOverheadOpt = None,
    margin: o.MarginOpt = None,
    ram_reserve: o.RamReserveOpt = None,
    gpu_reserve: o.GpuReserveOpt = None,
    ram_bandwidth: o.RamBandwidthOpt = None,
    backend: o.BackendOpt = None,
    cores: o.CoresOpt = None,
    threads: o.ThreadsOpt = None,
    rpc: o.RpcOpt = None,
    rpc_device: o.RpcDeviceOpt = None,
    rpc_bandwidth: o.RpcBandwidthOpt = None,
    rpc_latency: o.RpcLatencyOpt = None,
    # llama.cpp's tools
    llama_server: o.LlamaServerOpt = None,
    llama_bin: o.LlamaBinOpt = None,
    no_confirm: o.NoConfirmOpt = False,
    no_calibration: o.NoCalibrationOpt = False,
    timeout: o.TimeoutOpt = None,
    # fetching
    source: o.SourceOpt = "auto",
    allow_unverified: o.AllowUnverifiedOpt = False,
    reuse: o.ReuseOpt = None,
    reuse_from: o.ReuseFromOpt = None,
    hf_cache: o.HfCacheOpt = None,
    connections: o.ConnectionsOpt = None,
    quiet: o.QuietOpt = False,
    # the command get and command write
    host: o.HostOpt = "127.0.0.1",
    port: o.PortOpt = 8080,
    alias: o.AliasOpt = None,
    api_key_env: o.ApiKeyEnvOpt = None,
    rpc_bind: o.RpcBindOpt = None,
    rpc_cache: o.RpcCacheOpt = True,
    fmt: o.FormatOpt = "line",
    model_source: o.ModelSourceOpt = "local",
    script: o.ScriptOpt = None,
    force: o.ForceOpt = False,
    preset: o.PresetOpt = None,
    swap_config: o.SwapConfigOpt = None,
    modelfile: o.ModelfileOpt = None,
    ttl: o.TtlOpt = 900,
    # one command's own
    max_context: o.MaxContextOpt = False,
    directory: o.VerifyDirArg = Path("."),
    checksums: o.ChecksumsOpt = "SHA256SUMS",
    n_gpu_layers: o.NglOpt = None,
    tensor_split: o.TensorSplitOpt = None,
    n_cpu_moe: o.NCpuMoeOpt = 0,
    cpu_moe: o.CpuMoeOpt = False,
    override_tensor: o.OverrideTensorOpt = None,
    cache_type_k: o.CacheTypeKOpt = "f16",
    cache_type_v: o.CacheTypeVOpt = "f16",
    device: o.DeviceOpt = None,
    no_kv_offload: o.NoKvOffloadOpt = False,
    spec_draft: o.SpecDraftOpt = 0,
    target: o.TargetArg = None,
    log: o.LogOpt = None,
    measure_speed: o.MeasureOpt = False,
    learn: o.LearnOpt = False,
    detach: o.DetachOpt = False,
    status: o.StatusOpt = False,
    stop: o.StopOpt = False,
    n_prompt: o.NPromptOpt = 512,
    n_gen: o.NGenOpt = 64,
    depth: o.DepthOpt = None,
    reps: o.RepsOpt = 2,
    tool: o.ToolOpt = "auto",
    compare: o.CompareOpt = False,
    no_save: o.NoSaveOpt = False,
    repo: o.ManifestRepoArg = ...,
    revision: o.RevisionOpt = None,
    manifest_id: o.ManifestIdOpt = None,
    file: o.ManifestFileArg = ...,
    all_: o.ResetAllOpt = False,
) -> None:
    """Every option more than one command takes, or one command takes in the sense they all
    share, with its default: declared here once, named by the commands (`takes`)."""


# `...` marks a required one (in a signature, a parameter without a default cannot follow one with)
SHARED = {
    p.name: p.replace(default=p.empty) if p.default is ... else p
    for p in OptionBlock.declared(_shared).params
}


def block(
    *parts: str | OptionBlock, names: dict[str, inspect.Parameter] | None = None
) -> OptionBlock:
    """The options named in `parts` (space-separated names of `names` or SHARED, or blocks), in
    that order, as one block."""
    params: list[inspect.Parameter] = []
    for part in parts:
        if isinstance(part, OptionBlock):
            params.extend(part.params)
        else:
            params.extend((names or {}).get(name) or SHARED[name] for name in part.split())
    return OptionBlock(" ".join(p.name for p in params), tuple(params))


# Options several commands take together, in this order.
MACHINE = block("hardware gpu ram cpu_only llama_server")
MACHINE_DETAILS = block(
    "gpu_overhead margin ram_reserve gpu_reserve ram_bandwidth backend cores threads rpc "
    "rpc_device rpc_bandwidth rpc_latency"
)
CHOICE = block(
    "parallel kv_unified prefer vision min_tps spec draft allow_q4_kv kv no_offload dir_"
)
RUN_TOOLS = block("llama_bin no_confirm no_calibration timeout")
LAUNCH = block("host port alias api_key_env rpc_bind rpc_cache fmt model_source")
LAUNCH_FILES = block("script force preset swap_config modelfile ttl")
FETCH = block("reuse reuse_from hf_cache")


# One command's own meaning of a name the others share (`serve --host`: where it listens).


def _serve_address(
    host: o.ServeHostOpt = "127.0.0.1",
    port: o.ServePortOpt = None,
    alias: o.ServeAliasOpt = None,
    api_key_env: o.ServeApiKeyEnvOpt = None,
) -> None:
    """Where `serve` listens and what it answers to."""


def _download_what(
    model: o.DownloadModelArg,
    quant: o.DownloadQuantOpt,
    vision: o.DownloadVisionOpt = False,
    dir_: o.DownloadDirOpt = None,
) -> None:
    """What `download` fetches, and where to."""


SERVE_ADDRESS = OptionBlock.declared(_serve_address)
DOWNLOAD_WHAT = OptionBlock.declared(_download_what)
