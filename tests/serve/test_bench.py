"""bench: llama-bench's spelling of a plan, its JSON, the NVML sampler, the llama-server fallback
and the calibration entry (fakes replay recorded real output; NVML is tests/fake_nvml.py)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conformance_model import rpc_machine, write_conformance_gguf
from fake_llamacpp import CURRENT_VERSION, DATA, calls, fake_tool, fixture
from fake_nvml import FakeGpu, FakeNvml, Memory

from quantpick.errors import ModelRejectedError
from quantpick.jobs.bench import bench_plan
from quantpick.model.gguf import layout_from_header, read_gguf_file
from quantpick.model.local import manifest_for_gguf
from quantpick.plan.bandwidth_bound import decode_speed
from quantpick.plan.build_class import compute_rule
from quantpick.plan.memory import Overheads, RunConfig, estimate
from quantpick.plan.placement import device_bandwidths, speed_params_for
from quantpick.plan.plan_types import Plan
from quantpick.plan.speed import device_speeds, expected_speed
from quantpick.serve.bench import (
    BenchError,
    BenchModel,
    BenchSettings,
    GpuSampler,
    bench_argv,
    bench_config,
    parse_bench_json,
    parse_bench_records,
    prompt_tokens,
    run_llama_bench,
    run_llama_server,
)

GiB = 1024**3
MiB = 1024**2
RECORDED = "".join(
    ln for ln in (DATA / "llama-bench-tiny.txt").read_text().splitlines(True) if ln[:1] != "#"
)


def test_llama_bench_spells_the_plan_its_own_way() -> None:
    config = RunConfig(
        ctx_size=131072, tensor_split=(27.0, 15.0), n_cpu_moe=4, cache_type_k="q8_0",
        cache_type_v="q8_0", ubatch=1024, kv_offload=False, devices=(0, 1),
        override_tensors=((r"blk\.3\.ffn_up_exps", "CPU"), (r"blk\.4\.ffn_up_exps", "CUDA1")),
    )  # fmt: skip
    argv, env = bench_argv(Path("/b/llama-bench"), config, Path("/m.gguf"), 41,
                           BenchSettings(n_prompt=512, n_gen=64, depth=8192, reps=3))  # fmt: skip
    assert argv == [
        "/b/llama-bench", "-m", "/m.gguf", "-o", "json", "--progress", "-p", "512", "-n", "64",
        "-d", "0,8192", "-r", "3", "-ngl", "42", "-dev", "CUDA0/CUDA1", "-ts", "27/15",
        "-ncmoe", "4", "-ot", r"blk\.3\.ffn_up_exps=CPU;blk\.4\.ffn_up_exps=CUDA1",
        "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on", "-ub", "1024", "-b", "2048", "-nkvo", "1",
    ]  # fmt: skip
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    cpu, _ = bench_argv(Path("b"), RunConfig(devices=(), cpu_moe=True), Path("m"), 8,
                        BenchSettings(depth=0))  # fmt: skip
    assert cpu[cpu.index("-ngl") + 1] == "0" and cpu[cpu.index("-dev") + 1] == "none"
    assert cpu[cpu.index("-d") + 1] == "0" and "exps=CPU" in cpu[cpu.index("-ot") + 1]


def test_the_configuration_llama_bench_allocates() -> None:
    ran = bench_config(RunConfig(ctx_size=262144, n_parallel=4, kv_unified=True),
                       BenchSettings(n_prompt=512, n_gen=64, depth=8192))  # fmt: skip
    assert (ran.ctx_size, ran.n_parallel, ran.kv_unified, ran.logits_rows) == (
        512 + 8192, 1, False, "batch",
    )  # fmt: skip


def test_recorded_llama_bench_json() -> None:
    got = parse_bench_json(RECORDED, depth=64)
    assert got == {
        "prefill": 131.356546,
        "decode_empty": 52.343257,
        "prefill_depth": 302.291098,
        "decode_depth": 123.147126,
    }
    assert parse_bench_json(RECORDED, depth=0)["decode_depth"] is None
    with pytest.raises(BenchError, match="no JSON"):
        parse_bench_json("error: failed to load model", depth=0)
    with pytest.raises(BenchError, match="no prefill or decode"):
        parse_bench_json("[]", depth=0)


def test_prompt_tokens_are_ordinary_tokens() -> None:
    for vocab in (1024, 248320):
        ids = prompt_tokens(5000, vocab)
        assert len(ids) == 5000 and min(ids) >= min(1000, vocab // 4) and max(ids) < vocab - 512
        assert len(set(ids)) > 100


class RisingNvml(FakeNvml):
    """Used memory: the baseline at the first read of each GPU, then baseline + `grow`."""

    def __init__(self, gpus: list[FakeGpu], grow: dict[int, int]) -> None:
        super().__init__(gpus)
        self.grow = grow
        self.reads: dict[int, int] = {}

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Memory:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        n = self.reads[handle] = self.reads.get(handle, 0) + 1
        used = gpu.total - gpu.free + (self.grow.get(handle, 0) if n > 1 else 0)
        return Memory(total=gpu.total, free=gpu.total - used, used=used)


def two_gpus() -> list[FakeGpu]:
    return [
        FakeGpu("RPC0", 64 * GiB, 63 * GiB, 384, 9751),
        FakeGpu("RPC1", 64 * GiB, 63 * GiB, 384, 9751),
    ]


def test_sampler_keeps_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = RisingNvml(two_gpus(), {0: 5 * GiB, 1: 2 * GiB})
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with GpuSampler([0, 1], interval_s=0.01) as s:
        pass
    (a, b) = s.peaks()
    assert (a.device, a.baseline_used_bytes, a.peak_used_bytes) == ("CUDA0", 1 * GiB, 6 * GiB)
    assert b.peak_used_bytes - b.baseline_used_bytes == 2 * GiB
    assert fake.initialized is False  # shut down again


def test_sampler_without_nvml_measures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    with GpuSampler([0]) as s:  # conftest's fake: no driver
        pass
    assert s.peaks() == () and s.error is not None


def test_llama_bench_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", RisingNvml(two_gpus(), {0: 3 * GiB}))
    tool = fake_tool(
        tmp_path, "llama-bench", routes=[(["-o", "json"], DATA / "llama-bench-tiny.txt")]
    )
    lines: list[str] = []
    m = run_llama_bench(tool, RunConfig(ctx_size=4096),
                        BenchModel(Path("/m.gguf"), 8, [0], progress=lines.append),
                        BenchSettings(n_prompt=32, n_gen=8, depth=64, reps=1))  # fmt: skip
    assert (m.tool, m.prefill_tps, m.decode_tps_empty, m.decode_tps_depth) == (
        "llama-bench", 131.356546, 52.343257, 123.147126,
    )  # fmt: skip
    assert m.ctx_size == 32 + 64 and m.depth_tokens == 64
    assert m.gpus[0].peak_used_bytes - m.gpus[0].baseline_used_bytes == 3 * GiB
    assert m.host_peak_rss_bytes is not None and m.host_peak_rss_bytes > 1 * MiB  # a Python child
    failing = fake_tool(tmp_path / "f", "llama-bench", stderr_file=fixture("missing-model"),
                        exit_code=-6)  # fmt: skip
    with pytest.raises(ModelRejectedError, match="cannot load /m: failed to load model"):
        run_llama_bench(failing, RunConfig(), BenchModel(Path("/m"), 8, []), BenchSettings())


FAKE_SERVER = """\
#!{python}
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
log = open({log!r}, "a")
log.write(json.dumps(argv) + "\\n"); log.flush()
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        self.wfile.write(b"{{}}")
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        log.write(json.dumps({{"n_prompt": len(body["prompt"]), **{{k: v for k, v in body.items()
                               if k != "prompt"}}}}) + "\\n"); log.flush()
        n = len(body["prompt"])
        timings = {{"prompt_n": n, "prompt_per_second": 1000.0 - n / 100,
                    "predicted_n": body["n_predict"], "predicted_per_second": 50.0 - n / 1000}}
        out = json.dumps({{"content": "", "timings": timings}}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out))); self.end_headers(); self.wfile.write(out)
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_llama_server_fallback(tmp_path: Path) -> None:
    server = tmp_path / "llama-server"
    server.write_text(FAKE_SERVER.format(python=sys.executable, log=str(tmp_path / "log.jsonl")))
    server.chmod(0o755)
    config = RunConfig(ctx_size=8192, n_parallel=2, devices=())
    m = run_llama_server(server, config, BenchModel(Path("/m.gguf"), 8, [], vocab_size=248320),
                         BenchSettings(n_prompt=512, n_gen=16, depth=100000))  # fmt: skip
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    argv, requests = log[0], log[1:]
    assert argv[argv.index("-c") + 1] == "8192" and argv[argv.index("-np") + 1] == "2"
    # the depth is clamped to one slot's context (8192 / 2) less the generated tokens; each
    # figure is measured once per repetition (--reps, default 2)
    assert [r["n_prompt"] for r in requests] == [512, 8, 4096 - 16 - 16] * 2
    assert m.samples["decode_empty"] == pytest.approx((50 - 0.008, 50 - 0.008))
    assert all(r["cache_prompt"] is False and r["ignore_eos"] is True for r in requests)
    assert m.tool == "llama-server" and m.depth_tokens == 4064
    assert m.prefill_tps == pytest.approx(1000 - 5.12)
    assert m.decode_tps_empty == pytest.approx(50 - 0.008)
    assert m.decode_tps_depth == pytest.approx(50 - 4.064)
    assert m.host_peak_rss_bytes is not None


@pytest.fixture(scope="module")
def q4km(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    path = tmp_path_factory.mktemp("gguf") / "q4km.gguf"
    size = write_conformance_gguf(path)
    return path, layout_from_header(read_gguf_file(path), basis=str(path), file_bytes=size)


def test_bench_plan_builds_the_profile_entry(
    q4km,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """Measured speeds against the uncalibrated expected speed at the same depth; the GPU's driver
    overhead
    is NVML's rise less llama.cpp's own buffers for the configuration that ran."""
    path, layout = q4km
    machine = rpc_machine(2)
    config = RunConfig(ctx_size=262144, tensor_split=(30.0, 12.0))
    est = estimate(layout, machine, config)
    speed = decode_speed(layout, est, device_bandwidths(machine))
    rule = compute_rule("0.5.0-dev", 11312, "0c1e57098")
    p = Plan("q4km", "Q4_K_M", (), None, config, est, speed, "gpu", "quality", layout.basis, (),
             compute_rule=rule)  # fmt: skip
    bin_dir = tmp_path / "bin"
    fake_tool(bin_dir, "llama-bench", routes=[(["-o", "json"], DATA / "llama-bench-tiny.txt")],
              version_text=CURRENT_VERSION)  # fmt: skip
    fake_tool(bin_dir, "llama-fit-params", routes=[([], fixture("q4km-rpc-30-12"))])
    rise = {0: 20 * GiB, 1: 9 * GiB}
    monkeypatch.setitem(sys.modules, "pynvml", RisingNvml(two_gpus(), rise))
    settings = BenchSettings(n_prompt=32, n_gen=8, depth=64, reps=1)
    report = bench_plan(
        p, manifest_for_gguf(path, layout), path, machine, Overheads(), settings=settings,
        llama_bin=bin_dir, llama_server=None, date="2026-11-30",
    )  # fmt: skip
    fit_argv = [c for c in calls(bin_dir) if "--fit-print" in c][0]
    assert fit_argv[fit_argv.index("-c") + 1] == str(32 + 64)  # llama-bench's own context
    assert report.build_id == "b11312-0c1e57098" and report.build_label == "b11312 (0c1e57098)"
    accounted = {"CUDA0": (14495 + 3632 + 1108) * MiB, "CUDA1": (5407 + 1550 + 1553) * MiB}
    for g in report.gpus:
        assert g.accounted_from == "llama-fit-params"
        assert g.accounted_bytes == accounted[g.device]
        assert g.driver_overhead_bytes == rise[g.index] - accounted[g.device]
    # the uncalibrated expected model at the same depth, without the server loop (llama-bench)
    params = replace(speed_params_for(machine), server_ms=0.0)
    expected = expected_speed(layout, est, device_speeds(machine), target_context=64, params=params)
    assert report.predicted["decode_empty"] == pytest.approx(expected.decode_tps_empty)
    assert report.ratios.decode_empty == pytest.approx(52.343257 / expected.decode_tps_empty)
    assert report.ratios.decode_depth == pytest.approx(123.147126 / expected.decode_tps_target)
    assert report.predicted["prefill"] == pytest.approx(expected.prefill_tps)
    e = report.entry
    assert e["build_id"] == "b11312-0c1e57098" and e["date"] == "2026-11-30"
    assert e["argv"][0] == "llama-bench" and e["depth_tokens"] == 64
    assert [g["driver_overhead_bytes"] for g in e["gpus"]] == [
        g.driver_overhead_bytes for g in report.gpus
    ]
    json.dumps(e)  # storable as is


# ---- what a tool says that is not a measurement: one line, never a traceback ------------------


def _bench_json(**overrides: object) -> str:
    record = {"n_prompt": 0, "n_gen": 8, "n_depth": 0, "avg_ts": 52.3, "samples_ts": [52.3]}
    return json.dumps([{**record, **overrides}])


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (_bench_json(avg_ts="fast"), "reported 'fast' as the tg8 speed"),
        (_bench_json(avg_ts=None), "reported None as the tg8 speed"),
        (_bench_json(avg_ts=-565.0), "reported -565 tok/s"),
        ('[{"n_gen": 8, "avg_ts": NaN}]', "reported nan tok/s"),
        ('[{"n_gen": 8, "avg_ts": Infinity}]', "reported inf tok/s"),
        (_bench_json(samples_ts=[52.3, "x"]), "reported 'x' as the tg8 sample"),
        (_bench_json(n_gen="8"), "n_gen = '8'"),
        ("[7]", "not an object"),
        ('{"n_gen": 8}', "not a list"),
        ("<html>nope</html>", "no JSON results"),
    ],
)
def test_llama_bench_json_that_is_not_a_measurement(text: str, match: str) -> None:
    # Before: float("fast") and int("8") tracebacks; NaN and negatives stored as measurements.
    with pytest.raises(BenchError, match=match):
        parse_bench_json(text, 0)


def test_llama_bench_samples_and_model_size_are_kept() -> None:
    speeds, samples, size = parse_bench_records(RECORDED, 64)
    assert samples["decode_empty"] == (52.3433,) and samples["decode_depth"] == (123.147,)
    assert size == 17224320 and speeds["prefill"] == 131.356546


def test_llama_bench_flooding_stdout_is_stopped(tmp_path: Path) -> None:
    tool = fake_tool(tmp_path, "llama-bench", flood=True)
    with pytest.raises(BenchError, match="printed more than 4 MiB on stdout"):
        run_llama_bench(tool, RunConfig(), BenchModel(Path("/m"), 8, []), BenchSettings())


def test_llama_bench_past_its_deadline_is_stopped_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "helper.pid"
    tool = fake_tool(tmp_path, "llama-bench", sleep=60, grandchild=pidfile)
    with pytest.raises(BenchError, match="did not finish in 1 s"):
        run_llama_bench(tool, RunConfig(), BenchModel(Path("/m"), 8, []),
                        BenchSettings(timeout_s=1))  # fmt: skip
    assert _gone(int(pidfile.read_text()))


def test_a_grandchild_holding_llama_benchs_stdout_does_not_hold_bench(tmp_path: Path) -> None:
    # Before: the reader waited for the end of stdout, which the helper held: no deadline.
    import time

    pidfile = tmp_path / "helper.pid"
    tool = fake_tool(tmp_path, "llama-bench", grandchild=pidfile,
                     routes=[(["-o", "json"], DATA / "llama-bench-tiny.txt")])  # fmt: skip
    started = time.monotonic()
    m = run_llama_bench(tool, RunConfig(), BenchModel(Path("/m"), 8, []),
                        BenchSettings(timeout_s=600))  # fmt: skip
    assert time.monotonic() - started < 5
    assert m.decode_tps_empty == 52.343257
    assert _gone(int(pidfile.read_text()))


def _gone(pid: int) -> bool:
    import os
    import time

    for _ in range(150):
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.02)
    return False


ODD_SERVER = """\
#!{python}
import sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
if {mode!r} == "dies":
    sys.stderr.write("\\x1b[31mllama_model_load: error loading model: tensor 'x' has wrong shape"
                     "\\x1b[0m\\nmain: exiting due to model loading error\\n")
    sys.exit(1)
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if {mode!r} == "crashes":
            sys.stderr.write("GGML_ASSERT(ok) failed\\n"); sys.stderr.flush()
            import os; os._exit(134)
        out = b"<html><body>502 Bad Gateway</body></html>"
        self.send_response(200); self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(out))); self.end_headers(); self.wfile.write(out)
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.mark.parametrize(
    ("mode", "error", "match"),
    [
        # Before: a traceback (json.load on HTML)
        ("html", BenchError, r"answer is not JSON \(text/html\): '<html><body>502"),
        # Before: "Error: No child processes" (Popen.poll reaped it, then os.wait4)
        ("dies", ModelRejectedError, r"cannot load /m.gguf: tensor 'x' has wrong shape$"),
        ("crashes", BenchError, r"exited \(exit 134\) during the benchmark \(prefill\): GGML_ASS"),
    ],
)
def test_llama_server_misbehaving_is_one_line(
    tmp_path: Path, mode: str, error: type, match: str
) -> None:
    server = tmp_path / "llama-server"
    server.write_text(ODD_SERVER.format(python=sys.executable, mode=mode))
    server.chmod(0o755)
    with pytest.raises(error, match=match):
        run_llama_server(server, RunConfig(ctx_size=4096, devices=()),
                         BenchModel(Path("/m.gguf"), 8, [], vocab_size=1000),
                         BenchSettings(n_prompt=32, n_gen=8, depth=0, timeout_s=60))  # fmt: skip


def test_speculation_runs_name_the_devices_through_the_machines_backend(tmp_path: Path) -> None:
    """Both runs of `bench --spec` start llama-server with the machine's backend: its device
    names in --device (before, measure_speculation dropped the backend: CUDA0 on a Vulkan box)."""
    from quantpick.machine.backends import backend
    from quantpick.model.speculative import SpecKind
    from quantpick.plan.speculative import with_kind
    from quantpick.serve.bench import measure_speculation

    server = tmp_path / "llama-server"
    server.write_text(FAKE_SERVER.format(python=sys.executable, log=str(tmp_path / "log.jsonl")))
    server.chmod(0o755)
    plain = RunConfig(ctx_size=4096, devices=(0,))
    model = BenchModel(Path("/m.gguf"), 8, [], vocab_size=1000, backend=backend("vulkan"))
    m = measure_speculation(server, with_kind(plain, SpecKind.NGRAM, 4), plain, model,
                            BenchSettings(n_prompt=32, n_gen=8, timeout_s=60))  # fmt: skip
    argvs = [a for a in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines())
             if isinstance(a, list)]  # fmt: skip
    assert [a[a.index("--device") + 1] for a in argvs] == ["Vulkan0", "Vulkan0"]
    assert m.decode_tps_without > 0 and m.drafted == 0
