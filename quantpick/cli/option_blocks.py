"""Options that several commands take together, declared once.

typer reads a command's options from its signature and cannot group them (typer#264). A block is
a function whose parameters are the options (`MACHINE`: --hardware, --gpu, --ram, ...); a command
names the block where its options stand, as a parameter whose default is the block, and takes
them in `**options`:

    @app.command("pick")
    @with_blocks
    def pick_cmd(model: ModelArg = None, machine: OptionBlock = MACHINE, **options: Any) -> None:
        given = {**locals(), **options}       # what the option groups read (cli/groups.py)

`with_blocks` gives typer the signature with the block's parameters in the placeholder's place,
so --help lists the options in the same order as before, and the command body gets them by name.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from quantpick.cli.options import (
    DEFAULT_MIN_TPS,
    AllowQ4Opt,
    BackendOpt,
    CoresOpt,
    CpuOnlyOpt,
    DraftOpt,
    GpuOpt,
    GpuOverheadOpt,
    GpuReserveOpt,
    HardwareOpt,
    KvOpt,
    KvuOpt,
    LlamaServerOpt,
    MarginOpt,
    MinTpsOpt,
    ModelDirOpt,
    NoOffloadOpt,
    NpOpt,
    PreferOpt,
    RamBandwidthOpt,
    RamOpt,
    RamReserveOpt,
    RpcBandwidthOpt,
    RpcDeviceOpt,
    RpcLatencyOpt,
    RpcOpt,
    SpecOpt,
    ThreadsOpt,
    VisionOpt,
)

F = TypeVar("F", bound=Callable[..., Any])


class OptionBlock:
    """The options of `declare`'s signature (their annotations and defaults), as one unit."""

    def __init__(self, declare: Callable[..., None]) -> None:
        self.name = declare.__name__
        self.params = tuple(inspect.signature(declare, eval_str=True).parameters.values())

    def __repr__(self) -> str:
        return f"<options {self.name}: {', '.join(p.name for p in self.params)}>"


def with_blocks(command: F) -> F:
    """`command` as typer sees it: each parameter whose default is an OptionBlock replaced by the
    block's parameters, `**options` dropped. Called with every option by name, it passes the
    block's options in `**options`."""
    signature = inspect.signature(command, eval_str=True)
    params: list[inspect.Parameter] = []
    placeholders: set[str] = set()
    for param in signature.parameters.values():
        if isinstance(param.default, OptionBlock):
            params.extend(param.default.params)
            placeholders.add(param.name)
        elif param.kind is not inspect.Parameter.VAR_KEYWORD:
            params.append(param)
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise TypeError(f"{command.__name__}: an option is given twice: {names}")

    @functools.wraps(command)
    def run(**values: Any) -> Any:
        return command(**values)

    run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    del run.__wrapped__  # typer reads this signature, not the placeholders'
    return run  # type: ignore[return-value]


def _machine(
    hardware: HardwareOpt = None,
    gpu: GpuOpt = None,
    ram: RamOpt = None,
    cpu_only: CpuOnlyOpt = False,
    llama_server: LlamaServerOpt = None,
) -> None:
    """The machine: probed, or described by a file, its GPUs and RAM (MachineOptions)."""


def _machine_details(
    gpu_overhead: GpuOverheadOpt = None,
    margin: MarginOpt = None,
    ram_reserve: RamReserveOpt = None,
    gpu_reserve: GpuReserveOpt = None,
    ram_bandwidth: RamBandwidthOpt = None,
    backend: BackendOpt = None,
    cores: CoresOpt = None,
    threads: ThreadsOpt = None,
    rpc: RpcOpt = None,
    rpc_device: RpcDeviceOpt = None,
    rpc_bandwidth: RpcBandwidthOpt = None,
    rpc_latency: RpcLatencyOpt = None,
) -> None:
    """What is kept free on each device, the host's CPU and bandwidth, and the RPC workers."""


def _choice(
    parallel: NpOpt = 1,
    kv_unified: KvuOpt = False,
    prefer: PreferOpt = "balanced",
    vision: VisionOpt = False,
    min_tps: MinTpsOpt = DEFAULT_MIN_TPS,
    spec: SpecOpt = "auto",
    draft: DraftOpt = None,
    allow_q4_kv: AllowQ4Opt = False,
    kv: KvOpt = None,
    no_offload: NoOffloadOpt = False,
    dir_: ModelDirOpt = None,
) -> None:
    """How the quant, KV cache and placement are chosen for the served model, and where it goes
    (`get`, `command`, `serve`)."""


CHOICE = OptionBlock(_choice)
MACHINE = OptionBlock(_machine)
MACHINE_DETAILS = OptionBlock(_machine_details)
