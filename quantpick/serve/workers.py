"""The RPC workers' side of a plan: one ggml-rpc-server line per worker the plan uses (its bind
address, cache, firewall rule), as text and JSON."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quantpick.errors import UsageError
from quantpick.machine.backends import backend_of
from quantpick.machine.spec import RpcWorker
from quantpick.serve.command import comment_lines
from quantpick.units import human

RPC_SERVER_PROGRAM = "ggml-rpc-server"


# The worker's tensor cache (-c): weight tensors above HASH_THRESHOLD (10 MiB, ggml-rpc.cpp:87,717)
# are offered by hash first (RPC_CMD_SET_TENSOR_HASH); the worker saves those it receives in full
# (rpc_server::set_tensor) under $LLAMA_CACHE/rpc or ~/.cache/llama.cpp/rpc
# (tools/rpc/rpc-server.cpp fs_get_cache_directory).
RPC_CACHE_DIR = "$LLAMA_CACHE/rpc (default ~/.cache/llama.cpp/rpc)"


@dataclass(frozen=True)
class WorkerCommand:
    endpoint: str  # what the head's --rpc names
    argv: tuple[str, ...]
    bind: str  # -H: the IPv4 address the worker listens on
    devices: tuple[str, ...]  # the head's names for the worker's devices: "RPC0", ...
    cache: bool  # -c: the worker keeps the weights it receives on its disk
    cache_bytes: int | None  # about what the cache holds: the weights planned on the worker
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    firewall: tuple[str, ...]  # commands to run on the worker so that only the head gets in


def _loopback(text: str) -> bool:
    from quantpick.machine.rpc import is_ipv4  # only when there are workers

    return text.startswith("127.") and is_ipv4(text)


def build_worker_commands(
    workers: tuple[RpcWorker, ...],
    *,
    bind: str | None = None,
    cache: bool = True,
    program: str = RPC_SERVER_PROGRAM,
    weights_bytes: Mapping[str, int] | None = None,
) -> tuple[WorkerCommand, ...]:
    """The `ggml-rpc-server` line of each worker (flags of tools/rpc/rpc-server.cpp at b11312:
    -H host, -p port, -d dev1,dev2 (comma or '/'), -c cache switch, -t CPU threads).

    `bind` (--rpc-bind) is the address every worker listens on; by default each binds the
    address the head reaches it at. ggml-rpc-server binds IPv4 literals only (transport.cpp
    create_server: inet_addr), so a worker named by host name needs its address resolved first
    (RpcWorker.address). quantpick never picks 0.0.0.0 on its own. `weights_bytes` (endpoint ->
    bytes planned on it) sizes the tensor cache.
    """
    from quantpick.machine.rpc import is_ipv4  # only when there are workers

    if bind is not None and not is_ipv4(bind):
        raise UsageError(
            f"--rpc-bind {bind}: ggml-rpc-server binds an IPv4 address (e.g. 192.168.1.20)"
        )
    out: list[WorkerCommand] = []
    n_devices = 0
    for worker in workers:
        names = tuple(f"RPC{n_devices + i}" for i in range(len(worker.devices)))
        n_devices += len(worker.devices)
        reach = worker.address if worker.address and is_ipv4(worker.address) else None
        if reach is None and is_ipv4(worker.host):
            reach = worker.host
        address = bind if bind is not None else reach
        if address is None:
            raise UsageError(
                f"RPC worker {worker.endpoint}: cannot tell which IPv4 address it should bind "
                f"({worker.host!r} does not resolve here)",
                hint="name it by its IPv4 address, or give --rpc-bind ADDR",
            )
        argv = [program, "-H", address, "-p", str(worker.port)]
        warnings: list[str] = []
        notes: list[str] = []
        firewall: list[str] = []
        if worker.probed:
            notes.append(
                f"the RPC protocol does not name a worker's devices: if {worker.endpoint} was "
                "started with -d, keep that -d (the plan uses the devices it serves now)"
            )
        else:
            device_names = [backend_of(g.backend).device_name(g.index) for g in worker.devices]
            argv += ["-d", ",".join(device_names)]
            notes.append(
                f"-d assumes the described device(s) are the worker's {device_names[0]}.. in "
                f"that order; `{program} -d x` lists its devices"
            )
        if cache:
            argv.append("-c")
            size = (weights_bytes or {}).get(worker.endpoint)
            held = f" (about {human(size)} of its disk)" if size else ""
            notes.append(
                f"-c: {worker.endpoint} keeps the weights it receives{held} in {RPC_CACHE_DIR}; "
                "the next load sends a hash per large tensor instead of the tensor"
            )
        head = worker.head_address or "<head-ip>"
        if address == "0.0.0.0":
            warnings.append(
                f"{worker.endpoint}: ggml-rpc-server binds every interface (0.0.0.0), so anyone "
                "on any network that machine is on can use it: the RPC protocol has no "
                "authentication (rpc-server warns: never expose it to an open network). Bind its "
                "LAN address instead and let only the head in"
            )
        elif _loopback(address) and reach is not None and not _loopback(reach):
            warnings.append(
                f"{worker.endpoint}: bound to {address}, it cannot be reached from the head"
            )
        elif reach is not None and address != reach and not _loopback(address):
            warnings.append(
                f"{worker.endpoint}: bound to {address}, but the head reaches it at {reach}"
            )
        if not _loopback(address):
            if address != "0.0.0.0":
                warnings.append(
                    f"{worker.endpoint}: ggml-rpc-server on {address} accepts whoever reaches "
                    f"that address (no authentication): let only the head ({head}) in"
                )
            firewall.append(
                f"sudo ufw allow from {head} to any port {worker.port} proto tcp"
                "  # with ufw enabled (default: deny incoming)"
            )
        out.append(
            WorkerCommand(
                endpoint=worker.endpoint,
                argv=tuple(argv),
                bind=address,
                devices=names,
                cache=cache,
                cache_bytes=(weights_bytes or {}).get(worker.endpoint) if cache else None,
                warnings=tuple(warnings),
                notes=tuple(notes),
                firewall=tuple(firewall),
            )
        )
    return tuple(out)


def render_worker_json(worker: WorkerCommand) -> dict[str, Any]:
    return {
        "endpoint": worker.endpoint,
        "argv": list(worker.argv),
        "shell": shlex.join(worker.argv),
        "bind": worker.bind,
        "devices": list(worker.devices),
        "cache": worker.cache,
        "cache_bytes": worker.cache_bytes,
        "warnings": list(worker.warnings),
        "notes": list(worker.notes),
        "firewall": list(worker.firewall),
    }


def render_worker_lines(workers: tuple[WorkerCommand, ...]) -> str:
    """The workers' lines as a shell snippet: a comment saying where, then the command."""
    lines: list[str] = []
    for w in workers:
        lines += comment_lines(f"on the RPC worker {w.endpoint} ({', '.join(w.devices)}), first:")
        lines.append(shlex.join(w.argv))
        for rule in w.firewall:
            lines += comment_lines(f"  and: {rule}")
    return "\n".join(lines) + ("\n" if lines else "")
