"""Real llama.cpp RPC workers (`ggml-rpc-server`, CPU build) on 127.0.0.1, for tests marked
`llamacpp`: two of them stand in for two GPUs on other machines.

    with rpc_workers(llamacpp_bin, 2) as endpoints:     # ["127.0.0.1:PORT", ...], ready
        ...
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from quantpick.errors import RpcWorkerError
from quantpick.machine.rpc import query_worker

READY_TIMEOUT_S = 30.0


def free_ports(n: int) -> list[int]:
    """n distinct ports free right now (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path | None = None) -> None:
    """Until the worker answers quantpick's probe (which is safe to repeat: it knocks first)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            text = log.read_text() if log is not None and log.exists() else ""
            raise RuntimeError(f"ggml-rpc-server exited {proc.returncode}:\n{text[-2000:]}")
        try:
            query_worker("127.0.0.1", port, timeout_s=2)
            return
        except RpcWorkerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def start_worker(
    argv: Sequence[str], port: int, *, log: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(
        list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
    )
    try:
        wait_ready(proc, port, log)
    except BaseException:
        stop(proc)
        raise
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def rpc_workers(bin_dir: Path, n: int = 2, *, log_dir: Path | None = None) -> Iterator[list[str]]:
    procs: list[subprocess.Popen[bytes]] = []
    ports = free_ports(n)
    try:
        for port in ports:
            log = log_dir / f"rpc-{port}.log" if log_dir is not None else None
            argv = [str(bin_dir / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port)]
            procs.append(start_worker(argv, port, log=log))
        yield [f"127.0.0.1:{p}" for p in ports]
    finally:
        for proc in procs:
            stop(proc)
