"""llama-fit-params: finding it, the flags quantpick sends, reading its real output, and what
happens when it is missing, fails, hangs or predates --log-jsonl (fakes replay recorded output)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fake_llamacpp import DATA, calls, fake_tool, fixture
from hypothesis import given, settings
from hypothesis import strategies as st

from quantpick.plan.memory import RunConfig
from quantpick.serve.fitparams import (
    FitParamsError,
    find_tool,
    fit_params_argv,
    parse_output,
    run_fit_params,
)
from quantpick.serve.flags import parse_help


def recorded(name: str) -> str:
    return fixture(name).read_text()


# ---- the output format ---------------------------------------------------------------------


def test_two_rpc_devices_json_record_gives_free_memory() -> None:
    p = parse_output(recorded("q4km-rpc-30-12"))
    assert [d.name for d in p.devices] == ["RPC0", "RPC1", "Host"]
    rpc0, rpc1, host = p.devices
    # the figures llama.cpp printed (b11312, two RPC workers, -ts 30,12 at 262144)
    assert (rpc0.model_mib, rpc1.model_mib, host.model_mib) == (14495, 5407, 272)
    assert rpc0.free_mib == rpc0.total_mib == 24105  # an RPC worker's free memory = its RAM
    assert host.free_mib is None and host.is_host
    assert p.other_host_mib == ()


def test_the_json_record_and_the_table_agree() -> None:
    """Both come from the same measurement: the JSON adds only free/total."""
    text = recorded("q4km-rpc-41-1")
    from_json = parse_output(text)
    table_only = parse_output("\n".join(ln for ln in text.splitlines() if not ln.startswith("{")))
    assert [(d.name, d.model_mib, d.context_mib, d.compute_mib) for d in from_json.devices] == [
        (d.name, d.model_mib, d.context_mib, d.compute_mib) for d in table_only.devices
    ]
    assert all(d.free_mib is None for d in table_only.devices)


def test_table_only_output_of_a_build_without_log_jsonl() -> None:
    p = parse_output(recorded("tiny-host-table"))
    assert [(d.name, d.model_mib, d.context_mib, d.compute_mib) for d in p.devices] == [
        ("Host", 16, 4, 11)
    ]


def test_repacked_host_weights_are_listed_beside_host() -> None:
    """-dev none on a CPU build: the table's Host line leaves CPU_REPACK out; the record has it."""
    p = parse_output(recorded("q4km-host"))
    assert p.host is not None and p.host.model_mib == 5160
    assert p.other_host_mib == (("CPU_REPACK", 15015),)


@pytest.mark.parametrize(
    "text", ["", "llama_fit_params: printing estimated memory\n", "Host 1 2\n"]
)
def test_no_projection_is_an_error(text: str) -> None:
    with pytest.raises(FitParamsError, match="no memory projection"):
        parse_output(text)


@given(st.text(max_size=300))
@settings(max_examples=200)
def test_parser_never_crashes_on_other_text(text: str) -> None:
    try:
        parse_output(text)
    except FitParamsError:
        pass


# ---- the flags -------------------------------------------------------------------------------

HELP = parse_help((DATA / "llama-fit-params-help.txt").read_text())

CONFIGS = [
    RunConfig(ctx_size=262144, tensor_split=(27.0, 15.0)),
    RunConfig(
        ctx_size=65536,
        n_parallel=4,
        kv_unified=True,
        cache_type_k="q8_0",
        cache_type_v="q8_0",
        ubatch=1024,
        batch=4096,
        devices=(0, 2),
    ),  # fmt: skip
    RunConfig(ctx_size=32768, n_cpu_moe=12, kv_offload=False, flash_attn="auto"),
    RunConfig(ctx_size=32768, cpu_moe=True),
    RunConfig(ctx_size=8192, override_tensors=((r"blk\.(1|2)\.ffn_up_exps", "CPU"),)),
    RunConfig(ctx_size=4096, devices=()),
    RunConfig(ctx_size=4096, n_gpu_layers=20, spec_draft_n=3, vision=True),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_every_flag_sent_is_one_llama_fit_params_accepts(config: RunConfig) -> None:
    argv, env = fit_params_argv(Path("/bin/llama-fit-params"), config, Path("/m/x.gguf"), 41)
    flags = [w for w in argv[1:] if w.startswith("-")]
    assert flags and all(HELP.has(flag) for flag in flags), flags
    assert argv[-5:] == ["--fit", "off", "--fit-print", "on", "--log-jsonl"]
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_flags_are_the_commands_placement() -> None:
    config = RunConfig(
        ctx_size=65536, n_parallel=2, tensor_split=(24.0, 18.0), n_cpu_moe=3,
        cache_type_k="q8_0", cache_type_v="f16", ubatch=1024, devices=(0, 1),
    )  # fmt: skip
    argv, _ = fit_params_argv(Path("/t/llama-fit-params"), config, Path("/m/a b.gguf"), 41)
    assert argv == [
        "/t/llama-fit-params", "-m", "/m/a b.gguf", "-c", "65536", "-np", "2", "-ngl", "42",
        "--device", "CUDA0,CUDA1", "-ts", "24,18", "--n-cpu-moe", "3", "-ctk", "q8_0",
        "-ctv", "f16", "-fa", "on", "-ub", "1024",
        "--fit", "off", "--fit-print", "on", "--log-jsonl",
    ]  # fmt: skip


def test_what_llama_fit_params_cannot_be_asked_is_left_out() -> None:
    """No -kvu (it has none), no projector, no MTP draft flags: plan/confirm.py adjusts."""
    config = RunConfig(ctx_size=8192, n_parallel=4, kv_unified=True, vision=True, spec_draft_n=2)
    argv, _ = fit_params_argv(Path("/t/f"), config, Path("/m/x.gguf"), 41, extra_args=("-x",))
    assert "-kvu" not in argv and "--mmproj" not in argv and "--spec-type" not in argv
    assert argv[-1] == "-x"


# ---- finding the tool --------------------------------------------------------------------------


def test_find_tool_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir, server_dir, path_dir = tmp_path / "bin", tmp_path / "srv", tmp_path / "path"
    explicit = fake_tool(bin_dir, "llama-fit-params")
    server = fake_tool(server_dir, "llama-server")
    beside = fake_tool(server_dir, "llama-fit-params")
    on_path = fake_tool(path_dir, "llama-fit-params")
    monkeypatch.setenv("PATH", str(path_dir))
    assert find_tool("llama-fit-params", llama_bin=bin_dir) == explicit
    assert find_tool("llama-fit-params", llama_server=server) == beside.resolve()
    assert find_tool("llama-fit-params") == on_path
    os.unlink(on_path)
    assert find_tool("llama-fit-params") is None
    assert find_tool("llama-fit-params", llama_bin=tmp_path / "empty") is None


# ---- running it ----------------------------------------------------------------------------------


def test_run_replays_a_recording(tmp_path: Path) -> None:
    tool = fake_tool(
        tmp_path, "llama-fit-params", routes=[(["-ts", "30,12"], fixture("q4km-rpc-30-12"))]
    )
    argv, env = fit_params_argv(tool, RunConfig(ctx_size=262144, tensor_split=(30.0, 12.0)),
                                Path("/m.gguf"), 41)  # fmt: skip
    run = run_fit_params(argv, env)
    assert [d.name for d in run.projection.devices] == ["RPC0", "RPC1", "Host"]
    assert calls(tmp_path) == [argv[1:]]


def test_a_hung_tool_times_out(tmp_path: Path) -> None:
    tool = fake_tool(tmp_path, "llama-fit-params", sleep=30, routes=[([], fixture("tiny-host"))])
    with pytest.raises(FitParamsError, match="did not answer in 0.5 s"):
        run_fit_params([str(tool)], {}, timeout_s=0.5)


def test_a_failing_tool_says_why(tmp_path: Path) -> None:
    """The recorded failure: a model that does not load aborts (SIGABRT) with llama.cpp's reason."""
    tool = fake_tool(
        tmp_path, "llama-fit-params", stderr_file=fixture("missing-model"), exit_code=-6
    )
    with pytest.raises(FitParamsError, match="exit -6.*failed to load model"):
        run_fit_params([str(tool), "-m", "/gone.gguf"], {})


def test_a_build_without_log_jsonl_is_asked_again_without_it(tmp_path: Path) -> None:
    tool = fake_tool(
        tmp_path, "llama-fit-params", reject_jsonl=True, routes=[([], fixture("tiny-host-table"))]
    )
    run = run_fit_params([str(tool), "-c", "4096", "--log-jsonl"], {})
    assert run.projection.host is not None and run.projection.host.free_mib is None
    assert calls(tmp_path) == [["-c", "4096", "--log-jsonl"], ["-c", "4096"]]


def test_a_missing_binary(tmp_path: Path) -> None:
    with pytest.raises(FitParamsError, match="cannot run"):
        run_fit_params([str(tmp_path / "nope")], {})
