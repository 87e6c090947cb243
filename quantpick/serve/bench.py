"""Run the planned configuration for real and measure it: speeds, GPU memory peaks, host RSS.

Two ways, the first that is installed:
- `llama-bench -o json` (tools/llama-bench/llama-bench.cpp): `-p N` prefill, `-n N` decode,
  `-d 0,D` the same at a filled context of D tokens (the depth is prefilled untimed, then cached
  across repetitions). Its spellings differ from llama-server's: `-ts a/b`, `-dev CUDA0/CUDA1`,
  `-ot` joined with `;`, `-nkvo 1`; it has no -c/-np (its context is n_prompt + n_gen + depth, one
  sequence).
- `llama-server` with the plan's own command, then `/completion` requests with generated token
  ids (`cache_prompt: false`, `ignore_eos: true`); speeds from the response's `timings`.

While it runs, a thread samples NVML's used memory of the planned GPUs (pynvml) every 50 ms; the
peak less the baseline before the start is what the run took. Host peak RSS comes from the child's
rusage (os.wait4).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantpick.errors import QuantpickError
from quantpick.plan.memory import RunConfig
from quantpick.serve.command import FFN_EXPS_REGEX, ServerOptions, build_command

BENCH = "llama-bench"
SERVER = "llama-server"
SAMPLE_INTERVAL_S = 0.05
HEALTH_TIMEOUT_S = 600.0  # a 20+ GB model loading from a slow disk

Progress = Callable[[str], None]


class BenchError(QuantpickError):
    """The benchmark could not run or gave no figures."""


@dataclass(frozen=True)
class BenchSettings:
    n_prompt: int = 512  # prefill test (-p)
    n_gen: int = 64  # decode test (-n)
    depth: int = 0  # the filled context for the second decode figure (-d); 0: none
    reps: int = 2  # llama-bench -r
    timeout_s: float = 3600.0


@dataclass(frozen=True)
class GpuPeak:
    index: int  # NVML index
    device: str  # llama.cpp's name, CUDA<index> with CUDA_DEVICE_ORDER=PCI_BUS_ID
    baseline_used_bytes: int
    peak_used_bytes: int


@dataclass(frozen=True)
class BenchMeasurement:
    tool: str  # "llama-bench" | "llama-server"
    argv: tuple[str, ...]
    decode_tps_empty: float | None
    decode_tps_depth: float | None
    prefill_tps: float | None
    prefill_tps_depth: float | None
    depth_tokens: int
    n_prompt: int
    n_gen: int
    ctx_size: int  # the context the tool allocated
    gpus: tuple[GpuPeak, ...]
    host_peak_rss_bytes: int | None
    seconds: float


# ---- GPU memory sampling ---------------------------------------------------------------------


class GpuSampler:
    """Peak NVML used memory per GPU index while a block runs (`with GpuSampler([0, 1]) as s`)."""

    def __init__(self, indices: list[int], interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.indices = indices
        self.interval_s = interval_s
        self.baseline: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}

    def __enter__(self) -> GpuSampler:
        if not self.indices:
            return self
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices}
            self.baseline = self._read()
        except Exception as exc:  # NVMLError of any kind: measure without GPU memory
            self.error = f"NVML: {exc}"
            return self
        self.peak = dict(self.baseline)
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> dict[int, int]:
        return {
            i: int(self._nvml.nvmlDeviceGetMemoryInfo(h).used) for i, h in self._handles.items()
        }

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for i, used in self._read().items():
                    self.peak[i] = max(self.peak[i], used)
            except Exception as exc:
                self.error = f"NVML: {exc}"
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            try:
                for i, used in self._read().items():
                    self.peak[i] = max(self.peak[i], used)
            except Exception:
                pass
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def peaks(self) -> tuple[GpuPeak, ...]:
        return tuple(
            GpuPeak(i, f"CUDA{i}", self.baseline[i], self.peak.get(i, self.baseline[i]))
            for i in self.indices
            if i in self.baseline
        )


# ---- running a child with its rusage ---------------------------------------------------------


@dataclass
class _Child:
    returncode: int
    stdout: str
    stderr_tail: list[str]
    max_rss_bytes: int | None


def _max_rss_bytes(ru_maxrss: int) -> int:
    # Linux reports KiB, macOS bytes (getrusage(2)).
    return ru_maxrss if sys.platform == "darwin" else ru_maxrss * 1024


def _wait_with_rusage(proc: subprocess.Popen, timeout_s: float) -> tuple[int, int | None]:
    """Wait for `proc` (killing it after timeout_s); (exit code, peak RSS in bytes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code
            return code, _max_rss_bytes(usage.ru_maxrss)
        if time.monotonic() > deadline:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            raise BenchError(f"{Path(str(proc.args[0])).name} did not finish in {timeout_s:g} s")
        time.sleep(0.05)


def _run_child(
    argv: list[str], env: dict[str, str], timeout_s: float, progress: Progress | None
) -> _Child:
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env={**os.environ, **env},
        )
    except OSError as exc:
        raise BenchError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
    out: list[str] = []
    tail: list[str] = []

    def read_out() -> None:
        assert proc.stdout is not None
        out.append(proc.stdout.read())

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            line = line.rstrip()
            tail.append(line)
            del tail[:-40]
            if progress is not None and line:
                progress(line)

    readers = [threading.Thread(target=read_out), threading.Thread(target=read_err)]
    for t in readers:
        t.start()
    code, rss = _wait_with_rusage(proc, timeout_s)
    for t in readers:
        t.join()
    return _Child(code, "".join(out), tail, rss)


# ---- llama-bench -----------------------------------------------------------------------------


def bench_argv(
    binary: Path, config: RunConfig, model_path: Path, block_count: int, settings: BenchSettings
) -> tuple[list[str], dict[str, str]]:
    """llama-bench's spelling of the plan's placement (its own syntax, see the module doc)."""
    argv = [str(binary), "-m", str(model_path), "-o", "json", "--progress"]
    argv += ["-p", str(settings.n_prompt), "-n", str(settings.n_gen)]
    argv += ["-d", "0" if settings.depth <= 0 else f"0,{settings.depth}"]
    argv += ["-r", str(max(1, settings.reps))]
    cpu_only = config.devices == ()
    if cpu_only:
        ngl = 0
    elif config.n_gpu_layers is None:
        ngl = block_count + 1
    else:
        ngl = config.n_gpu_layers
    argv += ["-ngl", str(ngl)]
    if config.devices is not None:
        argv += ["-dev", "/".join(f"CUDA{i}" for i in config.devices) or "none"]
    if config.tensor_split is not None and not cpu_only:
        argv += ["-ts", "/".join(f"{v:g}" for v in config.tensor_split)]
    overrides = [f"{p}={b}" for p, b in config.override_tensors]
    if config.cpu_moe:
        overrides.append(f"{FFN_EXPS_REGEX}=CPU")
    elif config.n_cpu_moe > 0:
        argv += ["-ncmoe", str(config.n_cpu_moe)]
    if overrides:
        argv += ["-ot", ";".join(overrides)]
    argv += ["-ctk", config.cache_type_k, "-ctv", config.cache_type_v, "-fa", config.flash_attn]
    argv += ["-ub", str(config.ubatch), "-b", str(config.batch)]
    if not config.kv_offload:
        argv += ["-nkvo", "1"]
    return argv, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def parse_bench_json(text: str, depth: int) -> dict[str, float | None]:
    """Speeds from `llama-bench -o json`: one record per test (n_prompt, n_gen, n_depth, avg_ts)."""
    try:
        records = json.loads(text)
    except ValueError as exc:
        raise BenchError("llama-bench printed no JSON results") from exc
    out: dict[str, float | None] = {
        "prefill": None,
        "prefill_depth": None,
        "decode_empty": None,
        "decode_depth": None,
    }
    for r in records if isinstance(records, list) else []:
        at_depth = int(r.get("n_depth", 0)) > 0
        if int(r.get("n_gen", 0)) > 0:
            out["decode_depth" if at_depth else "decode_empty"] = float(r["avg_ts"])
        elif int(r.get("n_prompt", 0)) > 0:
            out["prefill_depth" if at_depth else "prefill"] = float(r["avg_ts"])
    if out["decode_empty"] is None and out["prefill"] is None:
        raise BenchError("llama-bench's JSON has no prefill or decode result")
    if depth <= 0:
        out["decode_depth"] = out["prefill_depth"] = None
    return out


def run_llama_bench(
    binary: Path,
    config: RunConfig,
    model_path: Path,
    block_count: int,
    settings: BenchSettings,
    *,
    gpu_indices: list[int],
    progress: Progress | None = None,
) -> BenchMeasurement:
    argv, env = bench_argv(binary, config, model_path, block_count, settings)
    started = time.monotonic()
    with GpuSampler(gpu_indices) as sampler:
        child = _run_child(argv, env, settings.timeout_s, progress)
    if child.returncode != 0:
        why = next((ln for ln in reversed(child.stderr_tail) if ln.strip()), "no output")
        raise BenchError(f"llama-bench failed (exit {child.returncode}): {why[:200]}")
    speeds = parse_bench_json(child.stdout, settings.depth)
    return BenchMeasurement(
        tool=BENCH,
        argv=tuple(argv),
        decode_tps_empty=speeds["decode_empty"],
        decode_tps_depth=speeds["decode_depth"],
        prefill_tps=speeds["prefill"],
        prefill_tps_depth=speeds["prefill_depth"],
        depth_tokens=max(0, settings.depth),
        n_prompt=settings.n_prompt,
        n_gen=settings.n_gen,
        ctx_size=max(settings.n_prompt, settings.n_gen) + max(0, settings.depth),
        gpus=sampler.peaks(),
        host_peak_rss_bytes=child.max_rss_bytes,
        seconds=time.monotonic() - started,
    )


def bench_config(config: RunConfig, settings: BenchSettings) -> RunConfig:
    """The configuration llama-bench allocates for `config`: one sequence, a context of
    max(n_prompt, n_gen) + depth, logits for a whole ubatch (it keeps n_outputs_max = n_batch)."""
    from dataclasses import replace

    ctx = max(settings.n_prompt, settings.n_gen) + max(0, settings.depth)
    return replace(
        config, ctx_size=ctx, n_parallel=1, kv_unified=False, spec_draft_n=0, vision=False,
        logits_rows="batch",
    )  # fmt: skip


# ---- llama-server ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prompt_tokens(n: int, vocab_size: int) -> list[int]:
    """n token ids of ordinary text tokens (away from byte tokens and the specials at the end)."""
    lo = min(1000, vocab_size // 4)
    hi = max(lo + 1, vocab_size - 512)
    return [lo + (i * 7919) % (hi - lo) for i in range(n)]


def _post(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    import urllib.request

    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return dict(json.load(r))


def _healthy(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def run_llama_server(
    binary: Path,
    config: RunConfig,
    model_path: Path,
    block_count: int,
    settings: BenchSettings,
    *,
    vocab_size: int,
    gpu_indices: list[int],
    progress: Progress | None = None,
) -> BenchMeasurement:
    """Start llama-server with the plan's command and time /completion requests."""
    port = _free_port()
    cmd = build_command(
        config,
        model_path=model_path,
        mmproj_path=None,
        manifest=None,
        block_count=block_count,
        server=ServerOptions(host="127.0.0.1", port=port, alias="quantpick-bench",
                             program=str(binary)),
        capabilities=None,
    )  # fmt: skip
    slot_ctx = (
        config.ctx_size // max(1, config.n_parallel) if not config.kv_unified else (config.ctx_size)
    )
    depth = min(max(0, settings.depth), max(0, slot_ctx - settings.n_gen - 16))
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    figures: dict[str, float | None] = {}
    with GpuSampler(gpu_indices) as sampler:
        try:
            proc = subprocess.Popen(
                list(cmd.argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**os.environ, **cmd.env},
            )
        except OSError as exc:
            raise BenchError(f"cannot run {binary}: {exc.strerror or exc}") from exc
        try:
            if progress:
                progress(f"starting llama-server on port {port} (loading the model)")
            deadline = time.monotonic() + HEALTH_TIMEOUT_S
            while not _healthy(base + "/health"):
                if proc.poll() is not None:
                    raise BenchError(f"llama-server exited {proc.returncode} while loading")
                if time.monotonic() > deadline:
                    raise BenchError(f"llama-server not ready after {HEALTH_TIMEOUT_S:g} s")
                time.sleep(0.25)

            def complete(n_prompt: int, what: str) -> dict[str, Any]:
                if progress:
                    progress(f"{what}: {n_prompt} prompt tokens, {settings.n_gen} generated")
                body = {
                    "prompt": prompt_tokens(n_prompt, vocab_size),
                    "n_predict": settings.n_gen,
                    "cache_prompt": False,
                    "ignore_eos": True,
                    "temperature": 0.0,
                }
                timings = _post(base + "/completion", body, settings.timeout_s).get("timings")
                if not isinstance(timings, dict):
                    raise BenchError("llama-server's /completion response has no timings")
                return timings

            first = complete(settings.n_prompt, "prefill")
            figures["prefill"] = float(first["prompt_per_second"])
            figures["decode_empty"] = float(complete(8, "decode, empty context")[
                "predicted_per_second"])  # fmt: skip
            if depth > 0:
                deep = complete(depth, f"decode at {depth} tokens")
                figures["decode_depth"] = float(deep["predicted_per_second"])
                figures["prefill_depth"] = float(deep["prompt_per_second"])
        finally:
            proc.terminate()
            try:
                _, rss = _wait_with_rusage(proc, 30.0)
            except BenchError:
                rss = None
    return BenchMeasurement(
        tool=SERVER,
        argv=tuple(cmd.argv),
        decode_tps_empty=figures.get("decode_empty"),
        decode_tps_depth=figures.get("decode_depth"),
        prefill_tps=figures.get("prefill"),
        prefill_tps_depth=figures.get("prefill_depth"),
        depth_tokens=depth,
        n_prompt=settings.n_prompt,
        n_gen=settings.n_gen,
        ctx_size=config.ctx_size,
        gpus=sampler.peaks(),
        host_peak_rss_bytes=rss,
        seconds=time.monotonic() - started,
    )
