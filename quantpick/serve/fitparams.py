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
import re
import shlex
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from quantpick.errors import ModelRejectedError, QuantpickError
from quantpick.machine.backends import Backend, default_gpu_backend
from quantpick.plan.confirm import LlamaDevice, Projection, fit_params_config
from quantpick.plan.memory import RunConfig
from quantpick.process import ToolResult, printable, run_tool
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
    exit_code: int = 0  # non-zero: it printed a projection, then failed (`failure` says how)
    failure: str | None = None


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
    backend: Backend | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) asking llama-fit-params for the projection of `config`'s llama-server command.

    The flags are taken from the command quantpick writes (serve/command.py), so both agree on
    every spelling (-ngl as block_count + 1, --device and its backend's names, the backend's
    order variables). `backend`: the machine's (default: default_gpu_backend()).
    """
    local = backend or default_gpu_backend()
    cmd = build_command(
        fit_params_config(config),
        model_path=model_path,
        mmproj_path=None,
        manifest=None,
        block_count=block_count,
        server=ServerOptions(),
        capabilities=None,
        backend=local,
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
    # Device i in llama.cpp must be the plan's GPU i, as in the command (CUDA: PCI bus order).
    env = {**cmd.env, **dict(local.order_env)}
    return argv, env


# A figure no device can hold: 16 TiB in MiB (the largest GPUs hold 288 GB, the largest hosts a
# few TiB). Beyond it, or below zero, the projection is not a measurement of anything.
MAX_PLAUSIBLE_MIB = 16 * 1024**2
# `Name model context compute`, ASCII digits only (str.isdigit accepts "²").
_TABLE_ROW = re.compile(r"^(\S+) ([0-9]{1,12}) ([0-9]{1,12}) ([0-9]{1,12})$")


def parse_output(text: str) -> Projection:
    """The projection from llama-fit-params' stdout: the JSON record when present (it has free
    memory), else the plain table. Raises FitParamsError when neither is there, when either is
    malformed or absurd, or when the two disagree (both come from one measurement)."""
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
        match = _TABLE_ROW.match(stripped)
        if match:
            name, *mib = match.groups()
            table.append(LlamaDevice(name, *(_mib(int(v), f"{name}'s table row") for v in mib)))
    if record is not None:
        if not isinstance(record, dict) or record.get("unit") != "MiB":
            raise FitParamsError("llama-fit-params' memory record is malformed (no MiB unit)")
        projection = _from_record(record, table)
        if table:
            _check_agreement(projection, table)
        return projection
    if table and table[-1].is_host:
        return Projection(devices=tuple(table))
    raise FitParamsError("llama-fit-params printed no memory projection")


def _mib(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FitParamsError(f"llama-fit-params' memory record is malformed: {where} is {value!r}")
    if not 0 <= value <= MAX_PLAUSIBLE_MIB:
        raise FitParamsError(
            f"llama-fit-params projects {value} MiB for {where}: not a size any device has"
        )
    return value


def _from_record(record: dict, table: list[LlamaDevice]) -> Projection:
    devices: list[LlamaDevice] = []
    host: LlamaDevice | None = None
    other: list[tuple[str, int]] = []
    rows = record.get("rows", [])
    if not isinstance(rows, list):
        raise FitParamsError("llama-fit-params' memory record is malformed: rows is not a list")
    for row in rows:
        if not isinstance(row, dict):
            raise FitParamsError("llama-fit-params' memory record is malformed: a row is not "
                                 "an object")  # fmt: skip
        kind, name = row.get("kind"), printable(str(row.get("name")))[:64]
        where = f"{name}"

        def field(key: str, default: object = None, row: dict = row, where: str = where) -> int:
            return _mib(row.get(key, default), f"{where} {key}")

        if kind == "device":
            free, total = field("free"), field("total")
            if free > total:
                raise FitParamsError(
                    f"llama-fit-params reports {free} MiB free of {total} MiB on {name}"
                )
            devices.append(LlamaDevice(name, field("model"), field("context"), field("compute"),
                                       free_mib=free, total_mib=total))  # fmt: skip
        elif kind == "host":
            host = LlamaDevice("Host", field("model"), field("context"), field("compute"))
        elif kind == "buffer_type" and field("self", 0):
            other.append((name, field("model", 0) + field("context", 0)))
    if host is None:
        host = next((d for d in table if d.is_host), None)
    if host is None:
        raise FitParamsError("llama-fit-params' memory record has no host row")
    return Projection(devices=(*devices, host), other_host_mib=tuple(other))


def _check_agreement(projection: Projection, table: list[LlamaDevice]) -> None:
    """The record and the table print one measurement: any difference means the output is not
    what llama-fit-params printed (or not llama-fit-params)."""

    def rows(devices: tuple[LlamaDevice, ...] | list[LlamaDevice]) -> list[tuple]:
        return [(d.name, d.model_mib, d.context_mib, d.compute_mib) for d in devices]

    ours, theirs = rows(projection.devices), rows(table)
    if ours != theirs:
        pairs = zip(ours, theirs, strict=False)  # a shorter list is reported below
        diff = next(
            (f"{a[0]}: {a[1:]} vs {b[0]}: {b[1:]}" for a, b in pairs if a != b),
            f"{len(ours)} rows vs {len(theirs)}",
        )
        raise FitParamsError(
            "llama-fit-params' JSON record and its table disagree (model, context, compute MiB "
            f"{diff})"
        )


# How llama.cpp says it cannot load a model (src/llama.cpp llama_model_load: "error loading
# model: <reason>"; common/fit.cpp common_get_device_memory_data_impl throws "failed to load
# model" after it, and llama-fit-params aborts on the uncaught exception: SIGABRT, exit -6).
_LOAD_ERROR = re.compile(r"error loading model:\s*(?P<why>.+)")
_LOAD_FAILED = "failed to load model"
# How often a run is asked again for what llama.cpp's log thread lost (its race with the abort
# or the exit; each run ~0.03-0.3 s): a refused model's reason, a projection's JSON record. CI runs
# under load lost each once (2026-12-03, 2026-12-04).
REASON_TRIES = 5


# llama.cpp's log prefix on stderr (common/log.cpp with timestamps): "0.00.030.939 E ".
_LOG_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ")


def tool_lines(result: ToolResult) -> list[str]:
    """What a tool said, printable, one entry per line: stderr, then the messages of its JSON log
    records on stdout (`--log-jsonl`: {"type": "log", "level": ..., "msg": ...}), then the rest
    of stdout; llama.cpp's timestamp prefix removed."""
    out = []
    for raw in result.stderr.splitlines():
        out.append(raw)
    for raw in result.stdout.splitlines():
        stripped = raw.strip()
        if stripped.startswith('{"type":"log"') or stripped.startswith('{"type": "log"'):
            try:
                doc = json.loads(stripped)
            except ValueError:
                continue
            msg = doc.get("msg") if isinstance(doc, dict) else None
            if isinstance(msg, str):
                out.extend(msg.splitlines())
            continue
        out.append(raw)
    lines = [_LOG_PREFIX.sub("", printable(ln).strip()) for ln in out]
    return [ln for ln in lines if ln][-40:]


def failure_reason(lines: list[str]) -> str:
    """The line that says why a run failed: llama.cpp's own error, not the abort after it."""
    for line in reversed(lines):
        match = _LOAD_ERROR.search(line)
        if match:
            return " ".join(match["why"].split())
    # "terminate called after throwing ..." / "what():  <message>": the message is the reason.
    shown = [
        " ".join(ln.removeprefix("what():").split()) for ln in lines
        if not ln.startswith("terminate called")
    ]  # fmt: skip
    specific = [ln for ln in shown if "error" in ln.lower() or "failed" in ln.lower()]
    if specific:
        return specific[-1]
    return shown[-1] if shown else "no output"


def refused_model(lines: list[str]) -> bool:
    """Whether a tool's output says llama.cpp could not load the model."""
    return any(_LOAD_FAILED in ln or _LOAD_ERROR.search(ln) for ln in lines)


def model_rejected(model: str, lines: list[str]) -> ModelRejectedError:
    """The error for a model llama.cpp cannot load, with llama.cpp's own reason."""
    return ModelRejectedError(
        f"llama.cpp cannot load {model}: {failure_reason(lines)[:300]}",
        hint="nothing was written. The file is damaged (`quantpick verify "
        f"{shlex.quote(str(Path(model).parent))}` checks it against its SHA256SUMS) or of "
        "a kind this llama.cpp build does not load (a newer build may)",
    )


def rejected_before_download(
    exc: ModelRejectedError, standin: Path, name: str
) -> ModelRejectedError:
    """A rejection by llama.cpp's dry run on a sparse stand-in (jobs.dry_run): it names the
    hub's file, not the stand-in (already removed), and nothing about a damaged local file: the
    header llama.cpp read is the hub's own bytes, so only the build can be at fault."""
    message = exc.message.replace(str(standin), name, 1)
    return ModelRejectedError(
        f"{message} (its header, read from the hub before download)",
        hint="nothing was downloaded: this llama.cpp build does not load this file (a newer "
        "build may)",
    )


def exit_text(code: int) -> str:
    """`exit 1`, or the signal that ended the tool (`SIGABRT`)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def run_fit_params(
    argv: list[str], env: dict[str, str], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> FitParamsRun:
    """Run it and parse the projection.

    Raises ModelRejectedError (exit 7) when llama.cpp cannot load the model, with its own reason;
    FitParamsError when there is no projection to read (failing, hung, flooding, garbled). A run
    that printed a projection and then exited non-zero returns it with `exit_code` set: what it
    projects still counts (an overflow is an overflow), but it is not a confirmation.
    """
    started = time.monotonic()
    result = _run(argv, env, timeout_s)
    if result.returncode != 0 and "--log-jsonl" in argv and "log-jsonl" in result.stderr:
        # A build from before --log-jsonl: the table alone (no free memory figures).
        argv = [a for a in argv if a != "--log-jsonl"]
        result = _run(argv, env, timeout_s)
    for _ in range(REASON_TRIES - 1):
        if not _record_lost(argv, result):
            break
        # The table is printed at once, the JSON record by llama.cpp's log thread: on a busy
        # machine the process can exit before that thread wrote it, and the table alone leaves
        # out the host's repacked weights (CPU_REPACK). Asked again, it comes.
        result = _run(argv, env, timeout_s)
    seconds = time.monotonic() - started
    bound = result.bound_exceeded(timeout_s)
    if result.timed_out:
        raise FitParamsError(f"llama-fit-params did not answer in {timeout_s:g} s (stopped)")
    if bound:
        raise FitParamsError(f"llama-fit-params {bound}")
    lines = tool_lines(result)
    if refused_model(lines):
        plain = [a for a in argv if a != "--log-jsonl"]
        for _ in range(REASON_TRIES):
            if any(_LOAD_ERROR.search(ln) for ln in lines):
                break
            # llama.cpp's log is written by a worker thread (common/log.cpp common_log::worker)
            # and the abort after "failed to load model" can come before it wrote the reason:
            # always with --log-jsonl (stdout, buffered), on a busy machine without it too.
            # Asked again without it the reason comes on stderr (~0.03 s a run).
            lines = tool_lines(_run(plain, env, timeout_s)) or lines
        model = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else "the model"
        raise model_rejected(model, lines)
    if result.returncode != 0:
        how = exit_text(result.returncode)
        why = f"llama-fit-params failed ({how}): {failure_reason(lines)[:300]}"
        try:
            projection = parse_output(result.stdout)
        except FitParamsError:
            raise FitParamsError(why) from None
        return FitParamsRun(tuple(argv), env, seconds, projection, result.stdout,
                            exit_code=result.returncode, failure=why)  # fmt: skip
    return FitParamsRun(tuple(argv), env, seconds, parse_output(result.stdout), result.stdout)


def _record_lost(argv: list[str], result: ToolResult) -> bool:
    """Whether a run asked for the JSON record (--log-jsonl), printed its table and exited
    cleanly, but the record is not there."""
    return (
        "--log-jsonl" in argv
        and result.returncode == 0
        and not result.timed_out
        and '"fit_memory_breakdown"' not in result.stdout
        and any(_TABLE_ROW.match(line.strip()) for line in result.stdout.splitlines())
    )


def _run(argv: list[str], env: dict[str, str], timeout_s: float) -> ToolResult:
    try:
        return run_tool(argv, env=env, timeout_s=timeout_s)
    except OSError as exc:
        raise FitParamsError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
