"""Run `llama-fit-params` on a plan and read its per-device projection.

`llama-fit-params --fit off --fit-print on` (tools/fit-params/fit-params.cpp, common/fit.cpp:
common_fit_print) loads the model's metadata, builds the context with `no_alloc` on the real
devices and prints, on stdout, one line per device and one for the host:

    RPC0 12613 851 212
    RPC1 7289 553 657
    Host 272 0 148

(device name, model, context, compute; MiB, floored). With `--log-jsonl` the same measurement
also logs a `fit_memory_breakdown` record (common/fit.cpp: common_memory_breakdown_print) that adds
each device's free and total memory, and lists host buffer types the table leaves out (CPU_REPACK):

    {"type":"fit_memory_breakdown","data":{"unit":"MiB","rows":[{"kind":"device","name":"RPC0",
     "description":"127.0.0.1:50172","total":24105,"free":24105,"self":13676,"model":12613,
     "context":851,"compute":212,"unaccounted":-13676}, ..., {"kind":"host","name":"Host",
     "self":420,"model":272,"context":0,"compute":148}]}}

Both were read from the pinned tree's source and recorded from real runs of b11312
(tests/data/llama-fit-params-*.txt). A full-size 35B-A3B header projects in ~0.3 s here; the
timeout guards a stuck driver. Parsing is by hand: it is llama.cpp's own ad-hoc format, no library
reads it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from quantpick.errors import QuantpickError
from quantpick.plan.confirm import LlamaDevice, Projection, fit_params_config
from quantpick.plan.memory import RunConfig
from quantpick.serve.command import ServerOptions, build_command

FIT_PARAMS = "llama-fit-params"
# Seconds llama-fit-params may take: a full-size header projects in 0.3 s on a CPU build; CUDA
# initialisation adds 1-3 s on a real GPU.
DEFAULT_TIMEOUT_S = 10.0
# The flags that shape memory and placement: the ones llama-fit-params is given from the plan's
# own llama-server command (-kvu has no llama-fit-params spelling; see plan/confirm.py).
PLACEMENT_FLAGS = frozenset(
    {"-c", "-np", "-ngl", "--device", "-ts", "-ot", "--n-cpu-moe", "--cpu-moe", "-ctk", "-ctv",
     "-fa", "-ub", "-b", "-nkvo"}
)  # fmt: skip
_VALUELESS = frozenset({"--cpu-moe", "-nkvo"})


class FitParamsError(QuantpickError):
    """llama-fit-params could not give a projection (missing, failing, timing out)."""


@dataclass(frozen=True)
class FitParamsRun:
    argv: tuple[str, ...]
    env: dict[str, str]
    seconds: float
    projection: Projection
    stdout: str


def find_tool(
    name: str, *, llama_bin: Path | None = None, llama_server: Path | None = None
) -> Path | None:
    """A llama.cpp tool: in --llama-bin DIR, else beside llama-server, else on PATH, else in
    quantpick's own build cache (machine.llamacpp.cached_builds)."""
    if llama_bin is not None:
        path = llama_bin / name
        return path if path.is_file() and os.access(path, os.X_OK) else None
    server = llama_server
    if server is None:
        found = shutil.which("llama-server")
        server = Path(found) if found else None
    elif not server.exists():
        found = shutil.which(str(server))
        server = Path(found) if found else None
    if server is not None:
        beside = server.resolve().parent / name
        if beside.is_file() and os.access(beside, os.X_OK):
            return beside
    found = shutil.which(name)
    if found:
        return Path(found)
    if llama_server is None:
        from quantpick.machine.llamacpp import cached_builds

        for bin_dir in cached_builds():
            if (bin_dir / name).is_file() and os.access(bin_dir / name, os.X_OK):
                return bin_dir / name
    return None


def fit_params_argv(
    binary: Path,
    config: RunConfig,
    model_path: Path,
    block_count: int,
    *,
    extra_args: tuple[str, ...] = (),
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) asking llama-fit-params for the projection of `config`'s llama-server command.

    The flags are taken from the command quantpick writes (serve/command.py), so both agree on
    every spelling (-ngl as block_count + 1, --device, CUDA_DEVICE_ORDER ...).
    """
    cmd = build_command(
        fit_params_config(config),
        model_path=model_path,
        mmproj_path=None,
        manifest=None,
        block_count=block_count,
        server=ServerOptions(),
        capabilities=None,
    )
    argv = [str(binary)]
    words = list(cmd.argv[1:])
    i = 0
    while i < len(words):
        flag = words[i]
        value = None
        if (
            flag not in _VALUELESS
            and i + 1 < len(words)
            and (not words[i + 1].startswith("-") or flag == "-ot")
        ):
            value = words[i + 1]
        if flag in PLACEMENT_FLAGS or flag == "-m":
            argv += [flag] if value is None else [flag, value]
        i += 1 if value is None else 2
    argv += ["--fit", "off", "--fit-print", "on", "--log-jsonl", *extra_args]
    # CUDA<i> in llama.cpp must be NVML's GPU i, as in the command (PCI bus order).
    env = {**cmd.env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    return argv, env


def parse_output(text: str) -> Projection:
    """The projection from llama-fit-params' stdout: the JSON record when present (it has free
    memory), else the plain table. Raises FitParamsError when neither is there."""
    record = None
    table: list[LlamaDevice] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("{"):
            try:
                doc = json.loads(stripped)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("type") == "fit_memory_breakdown":
                record = doc.get("data")
            continue
        parts = stripped.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            table.append(LlamaDevice(parts[0], int(parts[1]), int(parts[2]), int(parts[3])))
    if isinstance(record, dict) and record.get("unit") == "MiB":
        return _from_record(record, table)
    if table and table[-1].is_host:
        return Projection(devices=tuple(table))
    raise FitParamsError("llama-fit-params printed no memory projection")


def _from_record(record: dict, table: list[LlamaDevice]) -> Projection:
    devices: list[LlamaDevice] = []
    host: LlamaDevice | None = None
    other: list[tuple[str, int]] = []
    for row in record.get("rows", []):
        kind, name = row.get("kind"), str(row.get("name"))
        if kind == "device":
            devices.append(
                LlamaDevice(
                    name,
                    int(row["model"]),
                    int(row["context"]),
                    int(row["compute"]),
                    free_mib=int(row["free"]),
                    total_mib=int(row["total"]),
                )
            )
        elif kind == "host":
            host = LlamaDevice("Host", int(row["model"]), int(row["context"]), int(row["compute"]))
        elif kind == "buffer_type" and int(row.get("self", 0)):
            other.append((name, int(row.get("model", 0)) + int(row.get("context", 0))))
    if host is None:
        host = next((d for d in table if d.is_host), None)
    if host is None:
        raise FitParamsError("llama-fit-params' memory record has no host row")
    return Projection(devices=(*devices, host), other_host_mib=tuple(other))


def run_fit_params(
    argv: list[str], env: dict[str, str], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> FitParamsRun:
    """Run it and parse the projection. Raises FitParamsError (with llama.cpp's reason)."""
    started = time.monotonic()
    proc = _run(argv, env, timeout_s)
    if proc.returncode != 0 and "--log-jsonl" in argv and "log-jsonl" in proc.stderr:
        # A build from before --log-jsonl: the table alone (no free memory figures).
        argv = [a for a in argv if a != "--log-jsonl"]
        proc = _run(argv, env, timeout_s)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        why = next(
            (ln for ln in reversed(lines) if "error" in ln.lower() or "failed" in ln.lower()),
            lines[-1] if lines else "no output",
        )
        raise FitParamsError(f"llama-fit-params failed (exit {proc.returncode}): {why[:200]}")
    return FitParamsRun(tuple(argv), env, seconds, parse_output(proc.stdout), proc.stdout)


def _run(argv: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            env={**os.environ, **env},
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise FitParamsError(f"llama-fit-params did not answer in {timeout_s:g} s") from exc
    except OSError as exc:
        raise FitParamsError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
