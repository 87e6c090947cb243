"""llama-fit-params: finding it, the flags quantpick sends, reading its real output, and what
happens when it is missing, fails, hangs or predates --log-jsonl (fakes replay recorded output)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fake_llamacpp import DATA, calls, fake_tool, fixture
from hypothesis import given, settings
from hypothesis import strategies as st

from quantpick.errors import ModelRejectedError
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


def test_a_model_llama_cpp_cannot_load_is_refused(tmp_path: Path) -> None:
    """The recorded failure: a model that does not load aborts (SIGABRT); that is llama.cpp
    refusing the file (exit 7), not a tool that could not confirm."""
    tool = fake_tool(
        tmp_path, "llama-fit-params", stderr_file=fixture("missing-model"), exit_code=-6
    )
    with pytest.raises(ModelRejectedError, match="cannot load /gone.gguf: failed to load model"):
        run_fit_params([str(tool), "-m", "/gone.gguf"], {})


def test_llama_cpps_own_reason_is_kept(tmp_path: Path) -> None:
    """Before: "llama-fit-params failed (exit -6): what(): failed to load model", the reason
    ("tensor ... has wrong shape") dropped. Output as src/llama.cpp llama_model_load logs it."""
    stderr = tmp_path / "stderr.txt"
    stderr.write_text(
        "llama_model_load: error loading model: check_tensor_dims: tensor 'output_norm.weight' "
        "has wrong shape; expected   256, got   512\n"
        "llama_model_load_from_file_impl: failed to load model\n"
        "terminate called after throwing an instance of 'std::runtime_error'\n"
        "  what():  failed to load model\n"
    )
    tool = fake_tool(tmp_path, "llama-fit-params", stderr_file=stderr, exit_code=-6)
    with pytest.raises(ModelRejectedError) as exc:
        run_fit_params([str(tool), "-m", "/m/x.gguf"], {})
    assert exc.value.message == (
        "llama.cpp cannot load /m/x.gguf: check_tensor_dims: tensor 'output_norm.weight' has "
        "wrong shape; expected 256, got 512"
    )
    assert exc.value.exit_code == 7 and "quantpick verify /m" in (exc.value.hint or "")


def test_a_reason_lost_to_the_log_threads_race_is_asked_for_again(tmp_path: Path) -> None:
    """llama.cpp writes its log from a worker thread; under load the abort can come before the
    reason is written. Before: a CI run printed "cannot load ...: failed to load model" (asked
    once). The tool here loses the reason on its first two runs."""
    count = tmp_path / "runs"
    tool = tmp_path / "llama-fit-params"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo x >> "{count}"\n'
        f'if [ "$(wc -l < "{count}")" -ge 3 ]; then\n'
        "  echo \"llama_model_load: error loading model: check_tensor_dims: tensor 'a' has "
        'wrong shape" >&2\n'
        "fi\n"
        "echo 'llama_model_load_from_file_impl: failed to load model' >&2\n"
        "echo '  what():  failed to load model' >&2\n"
        "kill -ABRT $$\n"
    )
    tool.chmod(0o755)
    with pytest.raises(ModelRejectedError) as exc:
        run_fit_params([str(tool), "-m", "/m/x.gguf"], {})
    assert exc.value.message == (
        "llama.cpp cannot load /m/x.gguf: check_tensor_dims: tensor 'a' has wrong shape"
    )
    assert len(count.read_text().splitlines()) == 3


def test_a_json_record_lost_to_the_log_thread_is_asked_for_again(tmp_path: Path) -> None:
    """The table is printed at once, the JSON record by llama.cpp's log thread; on a busy machine
    the process can exit first. Before: the table alone was read, without the host's repacked
    weights, and a CI run's dry run said "llama.cpp projects 86 MiB of model weights, the file
    holds 280 MiB". The tool here prints the table alone on its first run."""
    count = tmp_path / "runs"
    tool = tmp_path / "llama-fit-params"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo x >> "{count}"\n'
        f'if [ "$(wc -l < "{count}")" -ge 2 ]; then cat "{fixture("tiny-host")}"; '
        f'else cat "{fixture("tiny-host-table")}"; fi\n'
    )
    tool.chmod(0o755)
    run = run_fit_params([str(tool), "-c", "4096", "--log-jsonl"], {})
    assert '"fit_memory_breakdown"' in run.stdout  # the projection read is the record's
    assert len(count.read_text().splitlines()) == 2
    # without --log-jsonl the table is all there is: asked once
    count.unlink()
    run_fit_params([str(tool), "-c", "4096"], {})
    assert len(count.read_text().splitlines()) == 1


def test_a_failing_tool_says_why(tmp_path: Path) -> None:
    stderr = tmp_path / "stderr.txt"
    stderr.write_text("ggml_cuda_init: failed to initialize CUDA: unknown error\nbye\n")
    tool = fake_tool(tmp_path, "llama-fit-params", stderr_file=stderr, exit_code=-6)
    with pytest.raises(
        FitParamsError, match=r"failed \(killed by SIGABRT\): ggml_cuda_init: failed to init"
    ):
        run_fit_params([str(tool), "-m", "/m.gguf"], {})


def test_escapes_in_the_tools_stderr_do_not_reach_the_message(tmp_path: Path) -> None:
    stderr = tmp_path / "stderr.txt"
    stderr.write_text("\x1b]0;owned\x07\x1b[31merror: bad \x1b[2Jthing\x1b[0m\n")
    tool = fake_tool(tmp_path, "llama-fit-params", stderr_file=stderr, exit_code=1)
    with pytest.raises(FitParamsError) as exc:
        run_fit_params([str(tool)], {})
    assert exc.value.message == "llama-fit-params failed (exit 1): error: bad thing"


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


# ---- output that is not a projection: one clear line, never a traceback ------------------------


def _record(rows: object) -> str:
    import json

    doc = {"type": "fit_memory_breakdown", "data": {"unit": "MiB", "rows": rows}}
    return json.dumps(doc) + "\n"


HOST_ROW = {"kind": "host", "name": "Host", "self": 31, "model": 16, "context": 4, "compute": 11}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (_record([{**HOST_ROW, "model": "16"}]), "Host model is '16'"),
        (_record([{**HOST_ROW, "model": None}]), "Host model is None"),
        (_record([{"kind": "host", "name": "Host"}]), "Host model is None"),
        (_record([{**HOST_ROW, "model": True}]), "Host model is True"),
        (_record([{**HOST_ROW, "model": 1.5}]), "Host model is 1.5"),
        (_record("rows"), "rows is not a list"),
        (_record([7]), "a row is not an object"),
        (_record([{**HOST_ROW, "context": -5}]), "projects -5 MiB for Host context"),
        (_record([{**HOST_ROW, "compute": 10**303}]), "not a size any device has"),
        (
            _record(
                [
                    {
                        "kind": "device",
                        "name": "CUDA0",
                        "free": 9000,
                        "total": 100,
                        "model": 1,
                        "context": 1,
                        "compute": 1,
                    },
                    HOST_ROW,
                ]
            ),  # fmt: skip
            "9000 MiB free of 100 MiB on CUDA0",
        ),
        ('{"type":"fit_memory_breakdown","data":[1]}\n', "malformed"),
        (_record([HOST_ROW]) + "Host 16 4 12\n", "record and its table disagree"),
        (_record([HOST_ROW]) + "CUDA0 1 1 1\nHost 16 4 11\n", "record and its table disagree"),
        ("Host 16 4 1²\n", "no memory projection"),
        ("Host ² ² ²\n", "no memory projection"),
    ],
)
def test_a_malformed_or_absurd_projection_is_an_error(text: str, match: str) -> None:
    # Before: KeyError / ValueError / TypeError tracebacks ("²".isdigit() is True), or figures
    # nobody checked taken as llama.cpp's word.
    with pytest.raises(FitParamsError, match=match):
        parse_output(text)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "kind",
                        "name",
                        "model",
                        "context",
                        "compute",
                        "free",
                        "total",
                        "self",
                        "rows",
                        "unit",
                    ]
                ),  # fmt: skip
                children,
                max_size=6,
            )
        ),
        max_leaves=20,
    )
)
@settings(max_examples=300)
def test_the_record_parser_never_crashes(rows: object) -> None:
    import json

    for data in (rows, {"unit": "MiB", "rows": rows}):
        text = json.dumps({"type": "fit_memory_breakdown", "data": data}) + "\nHost 1 2 3\n"
        try:
            parse_output(text)
        except FitParamsError:
            pass


def test_a_flood_on_stdout_is_stopped(tmp_path: Path) -> None:
    # Before: read whole, until MemoryError.
    tool = fake_tool(tmp_path, "llama-fit-params", flood=True)
    with pytest.raises(FitParamsError, match="printed more than 4 MiB on stdout"):
        run_fit_params([str(tool)], {}, timeout_s=30)


def test_a_timed_out_tools_children_are_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "helper.pid"
    tool = fake_tool(tmp_path, "llama-fit-params", sleep=30, grandchild=pidfile)
    with pytest.raises(FitParamsError, match="did not answer in 1 s"):
        run_fit_params([str(tool)], {}, timeout_s=1)
    pid = int(pidfile.read_text())
    import time

    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                break
        time.sleep(0.02)
    else:
        raise AssertionError("the tool's helper is still running")


def test_a_projection_then_a_failure_is_returned_with_the_failure(tmp_path: Path) -> None:
    stderr = tmp_path / "stderr.txt"
    stderr.write_text("common_fit_print: error: something went wrong afterwards\n")
    tool = fake_tool(tmp_path, "llama-fit-params", stdout_file=fixture("q4km-rpc-41-1"),
                     stderr_file=stderr, exit_code=1)  # fmt: skip
    run = run_fit_params([str(tool)], {})
    assert run.exit_code == 1
    assert run.failure == (
        "llama-fit-params failed (exit 1): common_fit_print: error: something went wrong afterwards"
    )
    assert [d.name for d in run.projection.devices] == ["RPC0", "RPC1", "Host"]
