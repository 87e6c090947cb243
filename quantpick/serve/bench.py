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
rusage (os.wait4). Both run through quantpick.process: one deadline (`--timeout`, default 3600 s)
for the whole run, the tool's process group killed at it, its output capped.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from quantpick.errors import QuantpickError
from quantpick.machine.backends import Backend, Vendor, default_gpu_backend
from quantpick.plan.memory import RunConfig
from quantpick.process import ToolProcess, printable, run_tool
from quantpick.serve.command import FFN_EXPS_REGEX, ServerOptions, build_command
from quantpick.serve.fitparams import (
    exit_text,
    failure_reason,
    model_rejected,
    refused_model,
    tool_lines,
)

BENCH = "llama-bench"
SERVER = "llama-server"
SAMPLE_INTERVAL_S = 0.05
HEALTH_TIMEOUT_S = 600.0  # a 20+ GB model loading from a slow disk
EXIT_GRACE_S = 2.0  # after a failed request: how long to wait to see whether the server died

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
    device: str  # llama.cpp's name for the NVML index (the backend's, in PCI bus order)
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
    # tok/s of each repetition, per figure ("decode_empty": (52.1, 51.8)): their spread says
    # whether the run can calibrate anything (plan/calibration.py)
    samples: dict[str, tuple[float, ...]] = field(default_factory=dict)
    model_bytes: int | None = None  # the tool's own figure for the model's size (llama-bench)


@dataclass(frozen=True)
class BenchModel:
    """The model a bench run loads and what the run watches: the GGUF, its block count (-ngl all
    is block_count + 1) and vocabulary (llama-server's prompts are token ids below it), the GPUs
    whose memory is sampled, the backend that names the plan's devices, the tool's progress."""

    path: Path
    block_count: int
    gpu_indices: list[int]
    vocab_size: int = 0  # llama-server runs only
    progress: Progress | None = None
    backend: Backend | None = None


# ---- GPU memory sampling ---------------------------------------------------------------------


class GpuSampler:
    """Peak NVML used memory per GPU index while a block runs (`with GpuSampler([0, 1]) as s`)."""

    def __init__(
        self,
        indices: list[int],
        interval_s: float = SAMPLE_INTERVAL_S,
        backend: Backend | None = None,
    ) -> None:
        self.indices = indices
        # names the devices: NVML sees NVIDIA GPUs, so a backend that drives them, else the default
        nvidia = backend is not None and backend.drives(Vendor.NVIDIA)
        self.backend = backend if backend is not None and nvidia else default_gpu_backend()
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
            GpuPeak(
                i, self.backend.device_name(i), self.baseline[i], self.peak.get(i, self.baseline[i])
            )
            for i in self.indices
            if i in self.baseline
        )


# ---- llama-bench -----------------------------------------------------------------------------


def bench_argv(
    binary: Path,
    config: RunConfig,
    model_path: Path,
    block_count: int,
    settings: BenchSettings,
    backend: Backend | None = None,
) -> tuple[list[str], dict[str, str]]:
    """llama-bench's spelling of the plan's placement (its own syntax, see the module doc), with
    the backend's device names and order variables (default: default_gpu_backend())."""
    local = backend or default_gpu_backend()
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
        argv += ["-dev", "/".join(
            local.device_name(i) if isinstance(i, int) else i for i in config.devices
        ) or "none"]  # fmt: skip
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
    return argv, dict(local.order_env)


def tool_speed(value: object, what: str, tool: str) -> float:
    """A tokens/s figure a tool reported: a finite number above zero, or BenchError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        shown = printable(repr(value))[:60]
        raise BenchError(f"{tool} reported {shown} as the {what}: not a number")
    speed = float(value)
    if not math.isfinite(speed) or speed <= 0:
        raise BenchError(f"{tool} reported {speed:g} tok/s as the {what}: not a speed")
    return speed


def parse_bench_json(text: str, depth: int) -> dict[str, float | None]:
    """Speeds from `llama-bench -o json`: one record per test (n_prompt, n_gen, n_depth, avg_ts).
    Raises BenchError for anything else (a record without numbers, a speed that is not one)."""
    return parse_bench_records(text, depth)[0]


def parse_bench_records(
    text: str, depth: int
) -> tuple[dict[str, float | None], dict[str, tuple[float, ...]], int | None]:
    """(speeds, per-repetition samples of each speed, llama-bench's model_size in bytes)."""
    try:
        records = json.loads(text)
    except ValueError as exc:
        raise BenchError("llama-bench printed no JSON results") from exc
    if not isinstance(records, list):
        raise BenchError("llama-bench's JSON is not a list of results")
    out: dict[str, float | None] = {
        "prefill": None,
        "prefill_depth": None,
        "decode_empty": None,
        "decode_depth": None,
    }
    samples: dict[str, tuple[float, ...]] = {}
    model_size: int | None = None
    for r in records:
        if not isinstance(r, dict):
            raise BenchError("llama-bench's JSON has a result that is not an object")
        counts = {}
        for key in ("n_depth", "n_gen", "n_prompt"):
            value = r.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BenchError(f"llama-bench's JSON has {key} = {printable(repr(value))[:40]}")
            counts[key] = value
        at_depth = counts["n_depth"] > 0
        if counts["n_gen"] > 0:
            key, what = ("decode_depth" if at_depth else "decode_empty"), f"tg{counts['n_gen']}"
        elif counts["n_prompt"] > 0:
            key, what = ("prefill_depth" if at_depth else "prefill"), f"pp{counts['n_prompt']}"
        else:
            continue
        out[key] = tool_speed(r.get("avg_ts"), f"{what} speed (avg_ts)", BENCH)
        raw = r.get("samples_ts")
        if isinstance(raw, list) and raw:
            samples[key] = tuple(tool_speed(v, f"{what} sample", BENCH) for v in raw)
        size = r.get("model_size")
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            model_size = size
    if out["decode_empty"] is None and out["prefill"] is None:
        raise BenchError("llama-bench's JSON has no prefill or decode result")
    if depth <= 0:
        out["decode_depth"] = out["prefill_depth"] = None
        samples.pop("decode_depth", None)
        samples.pop("prefill_depth", None)
    return out, samples, model_size


def run_llama_bench(
    binary: Path, config: RunConfig, model: BenchModel, settings: BenchSettings
) -> BenchMeasurement:
    argv, env = bench_argv(binary, config, model.path, model.block_count, settings, model.backend)
    started = time.monotonic()
    with GpuSampler(model.gpu_indices, backend=model.backend) as sampler:
        try:
            child = run_tool(
                argv, env=env, timeout_s=settings.timeout_s, on_stderr_line=model.progress
            )
        except OSError as exc:
            raise BenchError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
    if child.timed_out:
        raise BenchError(
            f"llama-bench did not finish in {settings.timeout_s:g} s (stopped, with everything "
            "it started)",
            hint="give it longer with --timeout SECONDS, or bench less (--depth, --reps)",
        )
    if child.overflowed:
        raise BenchError(f"llama-bench {child.bound_exceeded(settings.timeout_s)}")
    lines = tool_lines(child)
    if refused_model(lines):
        raise model_rejected(str(model.path), lines)
    if child.returncode != 0:
        raise BenchError(
            f"llama-bench failed ({exit_text(child.returncode)}): {failure_reason(lines)[:200]}"
        )
    speeds, samples, model_size = parse_bench_records(child.stdout, settings.depth)
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
        samples=samples,
        model_bytes=model_size,
    )


def bench_config(config: RunConfig, settings: BenchSettings) -> RunConfig:
    """The configuration llama-bench allocates for `config`: one sequence, a context of
    max(n_prompt, n_gen) + depth, logits for a whole ubatch (it keeps n_outputs_max = n_batch)."""
    from dataclasses import replace

    ctx = max(settings.n_prompt, settings.n_gen) + max(0, settings.depth)
    return replace(
        config, ctx_size=ctx, n_parallel=1, kv_unified=False, spec_draft_n=0, draft=None,
        vision=False, logits_rows="batch",
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


# A /completion answer: a JSON object of a few KB (content, timings, settings).
RESPONSE_CAP_BYTES = 16 * 1024**2


def _post(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One request to llama-server; BenchError for anything but a JSON object back."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=max(0.1, timeout_s)) as r:
            raw = r.read(RESPONSE_CAP_BYTES + 1)
            kind = r.headers.get("Content-Type", "?")
    except urllib.error.HTTPError as exc:
        raise BenchError(f"llama-server answered /completion with HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        why = printable(str(getattr(exc, "reason", None) or exc))[:120]
        raise BenchError(f"llama-server's /completion failed: {why}") from None
    if len(raw) > RESPONSE_CAP_BYTES:
        raise BenchError("llama-server's /completion answer is over 16 MiB: not a completion")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise BenchError(
            f"llama-server's /completion answer is not JSON ({printable(kind)[:40]}): "
            f"{printable(raw[:60].decode('utf-8', 'replace'))!r}"
        ) from None
    if not isinstance(doc, dict):
        raise BenchError("llama-server's /completion answer is not a JSON object")
    return doc


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
    model: BenchModel,
    settings: BenchSettings,
    *,
    text: str | None = None,
) -> BenchMeasurement:
    """Start llama-server with the plan's command and time /completion requests. `text`: the
    decode tests continue this text instead of random tokens (speculation drafts from real
    text); their draft counts, when the server speculates, are kept as samples."""
    progress, vocab_size = model.progress, model.vocab_size
    port = _free_port()
    cmd = build_command(
        config,
        model_path=model.path,
        mmproj_path=None,
        manifest=None,
        block_count=model.block_count,
        server=ServerOptions(host="127.0.0.1", port=port, alias="quantpick-bench",
                             program=str(binary)),
        capabilities=None,
        backend=model.backend,
    )  # fmt: skip
    slot_ctx = (
        config.ctx_size // max(1, config.n_parallel) if not config.kv_unified else (config.ctx_size)
    )
    depth = min(max(0, settings.depth), max(0, slot_ctx - settings.n_gen - 16))
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    deadline = started + settings.timeout_s
    figures: dict[str, float | None] = {}
    samples: dict[str, list[float]] = {}
    with GpuSampler(model.gpu_indices, backend=model.backend) as sampler:
        try:
            server = ToolProcess(cmd.argv, env=cmd.env, capture_stdout=False)
        except OSError as exc:
            raise BenchError(f"cannot run {binary}: {exc.strerror or exc}") from exc

        def exited(when: str) -> QuantpickError:
            result = server.finish()
            lines = tool_lines(result)
            if refused_model(lines):
                return model_rejected(str(model.path), lines)
            return BenchError(
                f"llama-server exited ({exit_text(result.returncode)}) {when}: "
                f"{failure_reason(lines)[:200]}"
            )

        rss = None
        try:
            if progress:
                progress(f"starting llama-server on port {port} (loading the model)")
            ready_by = min(deadline, time.monotonic() + HEALTH_TIMEOUT_S)
            while not _healthy(base + "/health"):
                if server.poll() is not None:
                    raise exited("while loading")
                if time.monotonic() > ready_by:
                    raise BenchError(
                        f"llama-server not ready after {ready_by - started:.0f} s",
                        hint="give it longer with --timeout SECONDS",
                    )
                time.sleep(0.25)

            def complete(n_prompt: int, what: str, prompt: str | None = None) -> dict[str, Any]:
                if progress:
                    progress(f"{what}: {n_prompt} prompt tokens, {settings.n_gen} generated")
                body = {
                    "prompt": prompt if prompt is not None else prompt_tokens(n_prompt, vocab_size),
                    "n_predict": settings.n_gen,
                    "cache_prompt": False,
                    "ignore_eos": True,
                    "temperature": 0.0,
                }
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BenchError(f"the benchmark did not finish in {settings.timeout_s:g} s",
                                     hint="give it longer with --timeout SECONDS")  # fmt: skip
                try:
                    timings = _post(base + "/completion", body, remaining).get("timings")
                except BenchError:
                    # a dying server closes its sockets a moment before it can be reaped
                    if server.wait(EXIT_GRACE_S) is not None:
                        raise exited(f"during the benchmark ({what})") from None
                    raise
                if not isinstance(timings, dict):
                    raise BenchError("llama-server's /completion response has no timings")
                return timings

            def measure(key: str, timings: dict[str, Any], field: str, what: str) -> None:
                speed = tool_speed(timings.get(field), f"{what} speed ({field})", SERVER)
                samples.setdefault(key, []).append(speed)

            for _ in range(max(1, settings.reps)):
                first = complete(settings.n_prompt, "prefill")
                measure("prefill", first, "prompt_per_second", "prefill")
                empty = complete(8, "decode, empty context", text)
                measure("decode_empty", empty, "predicted_per_second", "decode")
                for field_name in ("draft_n", "draft_n_accepted"):
                    # llama-server's timings with speculation (tools/server/server-common.cpp:100)
                    value = empty.get(field_name)
                    if isinstance(value, int | float) and value >= 0:
                        samples.setdefault(field_name, []).append(float(value))
                if depth > 0:
                    deep = complete(depth, f"decode at {depth} tokens")
                    measure("decode_depth", deep, "predicted_per_second", "decode at depth")
                    measure("prefill_depth", deep, "prompt_per_second", "prefill at depth")
            figures = {k: sum(v) / len(v) for k, v in samples.items()}
        finally:
            rss = server.stop(grace_s=30.0).max_rss_bytes
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
        samples={k: tuple(v) for k, v in samples.items()},
    )


# A prompt whose continuation is ordinary code and prose: what speculation drafts from.
SPEC_TEXT = (
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a "
    "docstring, type hints and three doctest examples.\n\ndef fibonacci(n: int) -> int:\n"
)


@dataclass(frozen=True)
class SpecMeasurement:
    """The plan's speculation measured both ways through llama-server."""

    decode_tps_without: float
    decode_tps_with: float
    drafted: int
    accepted: int
    argv: tuple[str, ...]

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def problems(self) -> list[str]:
        """Why the pair cannot be true (the plausibility rule of a bench run)."""
        out = []
        if not (self.decode_tps_with > 0 and self.decode_tps_without > 0):
            out.append("a decode speed of 0")
        if self.accepted > self.drafted:
            out.append(f"{self.accepted} drafts accepted of {self.drafted}")
        if self.drafted == 0:
            out.append("llama-server drafted nothing (no draft counts in its timings)")
        return out


def measure_speculation(
    binary: Path,
    with_spec: RunConfig,
    without: RunConfig,
    model: BenchModel,
    settings: BenchSettings,
) -> SpecMeasurement:
    """Decode the same text with and without the plan's speculation (llama-server timings:
    predicted_per_second, draft_n, draft_n_accepted)."""
    quick = replace(settings, depth=0, n_prompt=min(settings.n_prompt, 16))  # decode only
    plain, spec = (
        run_llama_server(binary, config, model, quick, text=SPEC_TEXT)
        for config in (without, with_spec)
    )
    return SpecMeasurement(
        decode_tps_without=plain.decode_tps_empty or 0.0,
        decode_tps_with=spec.decode_tps_empty or 0.0,
        drafted=int(sum(spec.samples.get("draft_n", ()))),
        accepted=int(sum(spec.samples.get("draft_n_accepted", ()))),
        argv=spec.argv,
    )
