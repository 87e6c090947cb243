"""Against the real llama.cpp build (marked `llamacpp`): confirm and bench on the tiny synthetic
model, the stored profile changing the next estimate, and the memory model against live
llama-fit-params output on two RPC workers (read with the product's parser).

Run with: QUANTPICK_TEST_LLAMA_BIN=/path/to/llama.cpp/build/bin pytest -m llamacpp
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conformance_model import DATA, config_from_args, rpc_machine, write_grid_models
from typer.testing import CliRunner

from quantpick.cli import app
from quantpick.model.gguf import layout_from_header, read_gguf_file
from quantpick.plan.memory import estimate
from quantpick.serve.fitparams import run_fit_params

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_model import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.llamacpp
runner = CliRunner()
MiB = 1024**2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "tiny-qwen35moe.gguf"
    write_tiny_model(path)
    return path


def invoke_json(args: list[str]) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def tools(bin_dir: Path) -> list[str]:
    return ["--llama-bin", str(bin_dir), "--llama-server", str(bin_dir / "llama-server")]


def test_confirm_on_the_tiny_model(llamacpp_bin: Path, tiny: Path) -> None:
    doc = invoke_json(["confirm", "--gguf", str(tiny), "-c", "4096", *tools(llamacpp_bin)])
    c = doc["confirmation"]
    assert c["status"] == "confirmed", c["message"]
    (rnd,) = c["rounds"]
    (host,) = rnd["devices"]
    assert host["llama_device"] == "Host" and host["fits"]
    assert host["agrees"]["model"] and host["agrees"]["context"]
    assert host["difference_mib"]["model"] == host["difference_mib"]["context"] == 0
    assert host["difference_mib"]["compute"] == (
        host["llamacpp_mib"]["compute"] - host["predicted_compute_bytes"] // MiB
    )
    assert doc["plan"]["compute_rule"]["build"] == "b11312 (0c1e57098)"


def test_command_is_confirmed_before_it_is_written(llamacpp_bin: Path, tiny: Path) -> None:
    doc = invoke_json(["command", "--gguf", str(tiny), "-c", "8192", *tools(llamacpp_bin)])
    assert doc["confirmation"]["status"] == "confirmed"
    argv = doc["command"]["argv"]
    asked = doc["confirmation"]["rounds"][0]["argv"]
    for flag in ("-c", "-np", "-ngl", "-ctk", "-ctv", "-fa"):
        assert argv[argv.index(flag) + 1] == asked[asked.index(flag) + 1], flag
    off = invoke_json(["command", "--gguf", str(tiny), "-c", "8192", "--no-confirm"])
    assert off["confirmation"] is None


def test_bench_of_the_tiny_model_is_measured_but_never_stored(
    llamacpp_bin: Path, tiny: Path
) -> None:
    """Before: the README's bench of this 16 MiB model (decode faster at depth than empty,
    prefill 0.015x predicted) was stored and ruined the next CPU pick. Its figures are shown,
    and the profile is refused: the model is far outside the sizes the speed model was fitted
    on, so its ratios say nothing about the model quantpick plans."""
    estimate_args = ["estimate", "--gguf", str(tiny), "-c", "2048", "--llama-server",
                     str(llamacpp_bin / "llama-server")]  # fmt: skip
    before = invoke_json(estimate_args)
    assert before["calibration"] is None
    doc = invoke_json(
        ["bench", "--gguf", str(tiny), "-c", "2048", "--n-prompt", "32", "--n-gen", "8",
         "--depth", "64", "--reps", "2", *tools(llamacpp_bin)]
    )  # fmt: skip
    bench = doc["bench"]
    assert bench["tool"] == "llama-bench" and bench["build_id"] == "b11312-0c1e57098"
    measured = bench["measured"]
    assert measured["decode_tps_empty"] > 0 and measured["prefill_tps"] > 0
    assert measured["decode_tps_depth"] > 0 and bench["depth_tokens"] == 64
    assert bench["host_peak_rss_bytes"] > 0
    assert len(bench["samples"]["decode_empty"]) == 2  # llama-bench's samples_ts, -r 2
    ratios = bench["ratios"]
    assert ratios["decode_empty"] == pytest.approx(
        measured["decode_tps_empty"] / bench["predicted"]["decode_tps_empty"]
    )
    assert doc["saved"] is False and doc["profile_path"] is None
    assert any("is outside 1.17 GiB-118.04 GiB" in why for why in doc["not_saved_because"])
    after = invoke_json(estimate_args)
    assert after["calibration"] is None
    assert after["speed"]["expected"] == before["speed"]["expected"]


def test_bench_compare_prints_the_prediction_beside_the_measurement(
    llamacpp_bin: Path, tiny: Path
) -> None:
    args = ["bench", "--gguf", str(tiny), "-c", "2048", "--n-prompt", "32", "--n-gen", "8",
            "--depth", "0", "--reps", "1", "--no-save", *tools(llamacpp_bin)]  # fmt: skip
    plain = runner.invoke(app, args, env={"COLUMNS": "200"})
    compared = runner.invoke(app, [*args, "--compare"], env={"COLUMNS": "200"})
    assert plain.exit_code == 0 and compared.exit_code == 0, compared.stderr
    for out in (plain.stdout, compared.stdout):
        assert "decode, empty context" in out and "Calibration saved" not in out
    assert "measured / predicted" not in plain.stdout and "Predicted:" not in plain.stdout
    assert "measured / predicted" in compared.stdout
    assert "Predicted: " in compared.stdout and "(uncalibrated)" in compared.stdout


def test_bench_through_llama_server(llamacpp_bin: Path, tiny: Path) -> None:
    doc = invoke_json(
        ["bench", "--gguf", str(tiny), "-c", "2048", "--n-prompt", "64", "--n-gen", "8",
         "--depth", "128", "--tool", "llama-server", "--no-save", *tools(llamacpp_bin)]
    )  # fmt: skip
    bench = doc["bench"]
    assert bench["tool"] == "llama-server" and doc["profile_path"] is None
    m = bench["measured"]
    assert m["prefill_tps"] > 0 and m["decode_tps_empty"] > 0 and m["decode_tps_depth"] > 0
    assert bench["host_peak_rss_bytes"] > bench["ctx_size"]  # the model and its KV at least


# ---- live conformance: the memory model against llama-fit-params on two RPC workers ----------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def rpc_workers(bin_dir: Path, n: int = 2) -> Iterator[list[int]]:
    """ggml-rpc-server workers on free ports, address space capped (nothing is loaded on them)."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 1024**3, 3 * 1024**3))

    ports = [_free_port() for _ in range(n)]
    procs = [
        subprocess.Popen([str(bin_dir / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(p)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=cap)
        for p in ports
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 15
        for port in ports:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "RPC worker did not start"
                    time.sleep(0.1)
        yield ports
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)


EXTRA = json.loads((DATA / "llamacpp-fit-extra.json").read_text())["cases"]
LIVE = [EXTRA[i] for i in (0, 2, 5, 13, 19)]  # -ts split, q4_0 KV, --n-cpu-moe, -dev none, nomtp


def test_memory_model_equals_live_llama_fit_params(
    llamacpp_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    models = write_grid_models(tmp_path_factory.mktemp("grid"))
    with rpc_workers(llamacpp_bin) as ports:
        for case in LIVE:
            path, size = models[case["model"]]
            args = case["llama_cpp_args"]
            argv = [str(llamacpp_bin / "llama-fit-params"), "-m", str(path), "-fa", "on",
                    "-fitp", "on", "-fit", "off", "--log-jsonl", *args]  # fmt: skip
            if "-dev" not in args:
                argv += ["--rpc", ",".join(f"127.0.0.1:{p}" for p in ports)]
            live = run_fit_params(argv, {}, timeout_s=60).projection
            got = {d.name: (d.model_mib, d.context_mib, d.compute_mib) for d in live.devices}
            want = {k: (v["model"], v["context"], v["compute"]) for k, v in case["mib"].items()}
            for name, (model, context, compute) in want.items():
                # llama.cpp is deterministic: the recording still holds
                assert got[name][1:] == (context, compute), (args, name)
                if model is not None:
                    assert got[name][0] == model, (args, name)
            layout = layout_from_header(read_gguf_file(path), basis=str(path), file_bytes=size)
            config, n_gpu = config_from_args(args)
            est = estimate(layout, rpc_machine(n_gpu), config)
            for dev, row in zip(est.devices, live.devices, strict=True):
                assert (dev.kv_bytes + dev.recurrent_bytes) // MiB == row.context_mib, (args, row)
                if not row.is_host:
                    assert dev.weights_bytes // MiB == row.model_mib, (args, row)


# ---- what llama.cpp refuses is never written ---------------------------------------------------


@pytest.fixture(scope="module")
def wrong_shape(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF whose header parses (quantpick plans on it) but whose output_norm has twice the
    width llama.cpp's loader checks for."""
    from gguf_fixtures import TINY, tensor_list

    (n_embd,) = dict(tensor_list(TINY, mtp=False))["output_norm.weight"]
    path = tmp_path_factory.mktemp("wrong") / "wrong-shape.gguf"
    write_tiny_model(path, reshape={"output_norm.weight": (2 * n_embd,)})
    return path


def test_llama_fit_params_refusing_the_model_is_an_error_with_its_reason(
    llamacpp_bin: Path, wrong_shape: Path
) -> None:
    """Before: "could not confirm: llama-fit-params failed (exit -6)", the script written, exit 0,
    llama.cpp's reason dropped (with --log-jsonl it is lost in the buffer the abort drops)."""
    from quantpick.errors import ModelRejectedError

    argv = [str(llamacpp_bin / "llama-fit-params"), "-m", str(wrong_shape), "-c", "4096",
            "-ngl", "0", "--device", "none", "--fit", "off", "--fit-print", "on",
            "--log-jsonl"]  # fmt: skip
    with pytest.raises(ModelRejectedError) as exc:
        run_fit_params(argv, {})
    assert exc.value.message == (
        f"llama.cpp cannot load {wrong_shape}: check_tensor_dims: tensor 'output_norm.weight' "
        "has wrong shape; expected 256, got 512, 1, 1, 1"
    )


def test_command_and_get_on_a_model_llama_cpp_refuses_write_nothing(
    llamacpp_bin: Path, wrong_shape: Path, tmp_path: Path
) -> None:
    script = tmp_path / "serve.sh"
    result = runner.invoke(app, ["command", "--gguf", str(wrong_shape), "-c", "4096",
                                 *tools(llamacpp_bin), "--script", str(script)])  # fmt: skip
    assert result.exit_code == 7, result.stderr
    assert "tensor 'output_norm.weight' has wrong shape" in result.stderr
    assert not script.exists() and result.stdout == ""


def test_llama_server_refusing_the_model_during_bench_is_one_line(
    llamacpp_bin: Path, wrong_shape: Path
) -> None:
    """Before: "Error: No child processes" (the server had exited and been reaped twice)."""
    result = runner.invoke(app, ["bench", "--gguf", str(wrong_shape), "-c", "2048", "--tool",
                                 "llama-server", "--no-save", *tools(llamacpp_bin)])  # fmt: skip
    assert result.exit_code == 7, result.stderr
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("Error:")]
    assert "cannot load" in line and "has wrong shape" in line
    assert "No child processes" not in result.output
