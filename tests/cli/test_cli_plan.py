"""`quantpick pick`, `estimate`, `max-context` and `command` through the CLI (CliRunner)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from conformance_model import write_conformance_gguf
from typer.testing import CliRunner

from quantpick.cli import app

runner = CliRunner()
MODEL = "qwen3.8-35b-a3b-distill"
# The reference box, host included (a described host's CPU is otherwise assumed, and said so)
BOX = ["--gpu", "3090", "--gpu", "t4", "--ram", "64G", "--cores", "16", "--threads", "32"]
MiB = 1024**2
DEVICE_KEYS = {
    "name",
    "kind",
    "weights_bytes",
    "kv_bytes",
    "recurrent_bytes",
    "compute_bytes",
    "overhead_bytes",
    "total_bytes",
    "budget_bytes",
    "layers",
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # No test touches the internet: the manifests' hub sources are never contacted here.
    monkeypatch.setenv("QUANTPICK_OFFLINE", "1")


@pytest.fixture(scope="module")
def q4km_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "Qwen3.8-35B-A3B-Q4_K_M.gguf"
    write_conformance_gguf(path)
    return path


@pytest.fixture
def current_server(tmp_path: Path) -> Path:
    """A stand-in llama-server of the pinned tree (b11312): its --version picks the compute rule
    (plan/build_class.py); without one the conservative rule applies."""
    data = Path(__file__).resolve().parents[1] / "data"
    fake = tmp_path / "current" / "llama-server"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\ncat "{data / "llama-server-version-current.txt"}" >&2\n')
    fake.chmod(0o755)
    return fake


def run_json(args: list[str]) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_pick_json_reference_box_262144(current_server: Path) -> None:
    doc = run_json(["pick", MODEL, "-c", "262144", *BOX, "--llama-server", str(current_server)])
    assert doc["schema_version"] == 1
    assert doc["quant"] in {"Q5_K_M", "Q6_K"} and doc["placement"] == "gpu" and doc["fits"]
    assert doc["policy"] == "balanced" and "Q8_0 would need experts in RAM" in doc["why"]
    quality = doc["quality"]
    assert quality["tier"] == 0 and quality["basis"] == "interpolated"
    assert 0 < quality["mean_kld"] < 0.01 and "apex35" in quality["source"]
    assert doc["compute_rule"]["class"] == "capped"
    assert doc["compute_rule"]["build"] == "b11312 (0c1e57098)"
    assert doc["machine"]["described"] is True
    kinds = [d["kind"] for d in doc["devices"]]
    assert kinds == ["gpu", "gpu", "host"]
    for d in doc["devices"]:
        assert DEVICE_KEYS <= set(d)
        assert d["total_bytes"] <= d["budget_bytes"]
        assert isinstance(d["total_bytes"], int)
    assert doc["devices"][0]["layers"] and doc["devices"][1]["layers"]
    flags = " ".join(doc["flags"])
    assert "-c 262144" in flags and "-ts " in flags and "-ngl 42" in flags
    speed = doc["speed"]
    assert speed["tokens_per_s_target"] < speed["tokens_per_s_empty"]  # deprecated: the bound
    assert set(speed["expected"]) >= {"decode_tps_empty", "decode_tps_target", "prefill_tps"}
    assert set(speed["bound"]) == {"decode_tps_empty", "decode_tps_target"}
    assert speed["bound"]["decode_tps_target"] == speed["tokens_per_s_target"]
    expected = speed["expected"]
    assert 0 < expected["decode_tps_target"] < expected["decode_tps_empty"]
    assert expected["decode_tps_empty"] < speed["bound"]["decode_tps_empty"]
    assert expected["prefill_tps"] > expected["decode_tps_empty"]
    assert {c["quant"] for c in doc["candidates"]} == {
        "BF16",
        "Q8_0",
        "Q6_K",
        "Q5_K_M",
        "Q4_K_M",
        "IQ4_XS",
        "Q3_K_M",
        "IQ3_M",
        "Q2_K",
        "IQ2_M",
    }


def test_pick_human_table() -> None:
    result = runner.invoke(app, ["pick", MODEL, "-c", "32768", *BOX], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    assert "llama-server flags:" in result.stdout and "Candidates" in result.stdout
    assert "CUDA0" in result.stdout and "Tesla T4" in result.stdout
    # the expected speed first, the bound second, on one line
    line = next(x for x in result.stdout.splitlines() if x.startswith("Expected: ~"))
    assert "tok/s decode" in line and "at 32768 tokens" in line and "tok/s prefill" in line
    assert line.index("Expected") < line.index("bound:")


def test_pick_nothing_fits_exit_3() -> None:
    result = runner.invoke(app, ["pick", MODEL, "-c", "262144", "--gpu", "tiny:4G", "--ram", "6G"])
    assert result.exit_code == 3
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    notes = [line for line in lines if line.startswith("Note:")]
    lines = lines[len(notes) :]
    # a card the catalogue does not know: the assumed speed figures are said, not silent
    [gpu] = [n for n in notes if n.startswith("Note: GPU 0 (tiny) is not in the catalogue")]
    assert "300 GB/s" in gpu
    # and so are the host's: 6 cores, not this box's (the RAM was given)
    [host] = [n for n in notes if n.startswith("Note: described machine: assumed 6 CPU cores")]
    assert "RAM (--ram)" not in host
    assert lines[0].startswith("Error: nothing of") and lines[1].startswith("Hint:")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pick", MODEL, "-c", "400000", *BOX], "context length"),
        (["pick", MODEL, "--kv", "q9_9", *BOX], "not a KV cache type"),
        (
            ["estimate", MODEL, "-q", "Q4_K_M", "-ctv", "q8_0", "-fa", "off", *BOX],
            "flash attention",
        ),
        (["estimate", MODEL, "-q", "Q4_K_M", "-ts", "a,b", *BOX], "-ts"),
        (["estimate", MODEL, "-q", "Q7_K", *BOX], "no quant"),
        (["pick", "no-such-model", *BOX], "no-such-model"),
    ],
)
def test_bad_input_one_line_error(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code in (1, 2)
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert "Traceback" not in result.stderr


def test_estimate_json_devices_interface() -> None:
    doc = run_json(
        [
            "estimate",
            MODEL,
            "-q",
            "Q4_K_M",
            "-c",
            "131072",
            "-ts",
            "26,16",
            "-ctk",
            "q8_0",
            "-ctv",
            "q8_0",
            *BOX,
        ]
    )
    assert [d["kind"] for d in doc["devices"]] == ["gpu", "gpu", "host"]
    for d in doc["devices"]:
        assert DEVICE_KEYS <= set(d)
        assert d["total_bytes"] == (
            d["weights_bytes"]
            + d["kv_bytes"]
            + d["recurrent_bytes"]
            + d["compute_bytes"]
            + d["overhead_bytes"]
            + d["projector_bytes"]
        )
    assert doc["exact_weights"] is False and doc["basis"].startswith("synthesized")
    cuda0, cuda1, _ = doc["devices"]
    # -ts 26,16: blocks 0-25 (attention 3..23: six layers) on CUDA0, the other four on CUDA1;
    # q8_0 K + V = 2 x 544 bytes per cell per layer
    assert cuda0["kv_bytes"] == 6 * 131072 * 1088
    assert cuda1["kv_bytes"] == 4 * 131072 * 1088
    speed = doc["speed"]
    assert speed["expected"]["target_context"] == speed["target_context"] == doc["n_ctx"]
    assert speed["expected"]["decode_tps_target"] < speed["bound"]["decode_tps_target"]


def test_estimate_gguf_matches_llamacpp_through_the_cli(q4km_gguf: Path) -> None:
    """The conformance case `-c 32768 -np 1 -ts 24,16 --n-cpu-moe 10`, end to end."""
    doc = run_json(
        [
            "estimate",
            "--gguf",
            str(q4km_gguf),
            "-c",
            "32768",
            "-ts",
            "24,16",
            "--n-cpu-moe",
            "10",
            *BOX,
        ]
    )
    assert doc["exact_weights"] is True and doc["basis"].startswith("gguf:")
    cuda0, cuda1, _ = doc["devices"]
    assert (cuda0["weights_bytes"] // MiB, cuda1["weights_bytes"] // MiB) == (7897, 7289)
    assert (
        (cuda0["kv_bytes"] + cuda0["recurrent_bytes"]) // MiB,
        (cuda1["kv_bytes"] + cuda1["recurrent_bytes"]) // MiB,
    ) == (425, 276)


def test_estimate_bad_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTGGUF" + b"\0" * 100)
    result = runner.invoke(app, ["estimate", "--gguf", str(bad), *BOX])
    assert result.exit_code == 1 and result.stderr.startswith("Error: ")
    assert result.stdout == ""


def test_max_context_json() -> None:
    doc = run_json(["max-context", MODEL, "--gpu", "4090", "--ram", "8G", "--no-offload"])
    limits = {x["quant"]: x for x in doc["limits"]}
    assert limits["BF16"]["max_context"] == 0
    assert limits["IQ2_M"]["max_context"] == 262144
    assert 0 < limits["Q4_K_M"]["max_context"] < 262144
    assert doc["machine"]["described"] is True


def test_max_context_shows_what_pick_expects_and_labels_the_bound() -> None:
    """Issue 21: max-context printed the bandwidth bound (79) under "tok/s at max" where pick
    expected ~23 for the same plan."""
    box = ["--gpu", "4090", "--ram", "8G", "--quant", "Q4_K_M"]
    (limit,) = run_json(["max-context", MODEL, *box])["limits"]
    ctx = limit["max_context"]
    speed = run_json(["pick", MODEL, *box, "-c", str(ctx)])["speed"]
    assert limit["expected_decode_tps_target"] == speed["expected"]["decode_tps_target"]
    assert limit["bound_decode_tps_target"] == speed["bound"]["decode_tps_target"]
    assert limit["expected_decode_tps_target"] < limit["bound_decode_tps_target"]
    result = runner.invoke(app, ["max-context", MODEL, *box])
    assert result.exit_code == 0, result.stderr
    assert "expected tok/s at max" in result.stdout and "bound" in result.stdout
    row = next(line for line in result.stdout.splitlines() if "Q4_K_M" in line)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert abs(float(cells[4].lstrip("~")) - limit["expected_decode_tps_target"]) < 0.06
    assert abs(float(cells[5]) - limit["bound_decode_tps_target"]) < 0.6


def test_gb_means_gib_and_says_so_on_stderr_and_in_json() -> None:
    """Issue 21: `--gpu 3090:24GB --ram 64GB` planned a 22.35 GiB card and 59.6 GiB of RAM,
    without a note (and changed the pick); a bare number had one."""
    args = ["pick", MODEL, "-c", "65536", "--json"]
    result = runner.invoke(app, [*args, "--gpu", "3090:24GB", "--ram", "64GB"])
    assert result.exit_code == 0, result.stderr
    assert "Note: --ram 64GB is read as 64 GiB (memory sizes are binary" in result.stderr
    assert "Note: --gpu 3090:24GB: VRAM 24GB is read as 24 GiB" in result.stderr
    doc = json.loads(result.stdout)
    assert "G/GB/GiB = 2^30 B" in doc["machine"]["size_units"]
    assert any("--ram 64GB is read as 64 GiB" in n for n in doc["machine"]["notes"])
    plain = run_json(["pick", MODEL, "-c", "65536", "--gpu", "3090", "--ram", "64G"])
    assert doc["devices"] == plain["devices"] and doc["config"] == plain["config"]


def test_pick_max_context_flag_is_the_same_command() -> None:
    a = run_json(["max-context", MODEL, "--gpu", "4090", "--ram", "8G", "--quant", "Q4_K_M"])
    b = run_json(
        ["pick", MODEL, "--max-context", "--gpu", "4090", "--ram", "8G", "--quant", "Q4_K_M"]
    )
    assert a["limits"] == b["limits"]


def test_command_for_a_local_gguf(q4km_gguf: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["command", "--gguf", str(q4km_gguf), "-c", "65536", *BOX])
    assert result.exit_code == 0, result.stderr
    line = result.stdout.strip()
    assert str(q4km_gguf) in line and "-c 65536" in line and "-ngl 42" in line
    assert "targets current llama.cpp" in result.stderr  # no llama-server was checked
    script = tmp_path / "serve.sh"
    result = runner.invoke(
        app, ["command", "--gguf", str(q4km_gguf), "-c", "65536", *BOX, "--script", str(script)]
    )
    assert result.exit_code == 0, result.stderr
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o755
    text = script.read_text()
    assert "set -euo pipefail" in text and "exec " in text and "quantpick plan:" in text
    doc = run_json(["command", "--gguf", str(q4km_gguf), "-c", "65536", *BOX])
    argv = doc["command"]["argv"]
    assert argv[argv.index("-m") + 1] == str(q4km_gguf)
    assert doc["plan"]["quant"] == "Q4_K_M"


def test_a_model_directory_name_that_is_not_utf8_reaches_the_script_as_its_bytes(
    q4km_gguf: Path, tmp_path: Path
) -> None:
    """Issue 21: `--script` with a Latin-1 directory name ended in UnicodeEncodeError."""
    directory = tmp_path / os.fsdecode(b"mod\xe8les")
    directory.mkdir()
    gguf = directory / q4km_gguf.name
    os.link(q4km_gguf, gguf)
    script = tmp_path / "serve.sh"
    result = runner.invoke(
        app, ["command", "--gguf", str(gguf), "-c", "8192", *BOX, "--script", str(script)]
    )
    assert result.exit_code == 0, result.stderr
    assert os.fsencode(gguf) in script.read_bytes()


def test_script_writes_only_over_its_own_files(q4km_gguf: Path, tmp_path: Path) -> None:
    """Before: --script replaced whatever was there (notes.txt, a FIFO; as root /dev/null)."""
    base = ["command", "--gguf", str(q4km_gguf), "-c", "65536", *BOX]
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    result = runner.invoke(app, [*base, "--script", str(notes)])
    assert result.exit_code == 2
    assert f"Error: --script {notes}: exists and was not written by quantpick" in result.stderr
    assert result.stdout == "" and notes.read_text() == "mine\n"
    assert runner.invoke(app, [*base, "--script", str(notes), "--force"]).exit_code == 0
    assert "exec " in notes.read_text()
    assert runner.invoke(app, [*base, "--script", str(notes)]).exit_code == 0  # its own now
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/null")):
        result = runner.invoke(app, [*base, "--script", str(target), "--force"])
        assert result.exit_code == 2 and "not a regular file" in result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_command_needs_the_file(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["command", MODEL, "--quant", "Q4_K_M", "--dir", str(tmp_path), *BOX]
    )
    assert result.exit_code == 2
    assert "is not there" in result.stderr and "quantpick get" in result.stderr


def test_llama_server_runs_only_where_it_is_needed(
    q4km_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning never starts llama-server: it asks for --version (the build picks the compute
    rule) once per binary (remembered while the file is unchanged: machine/llamacpp.py);
    `command` also reads --help (and --version again) to check the command's flags."""
    data = Path(__file__).resolve().parents[1] / "data"
    log = tmp_path / "calls.log"
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> "{log}"\n'
        f'if [ "$1" = "--help" ]; then cat "{data / "llama-server-help-current.txt"}"; '
        f'else cat "{data / "llama-server-version-current.txt"}" >&2; fi\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    for args in (
        ["pick", MODEL, "-c", "32768"],
        ["estimate", MODEL, "-q", "Q4_K_M"],
        ["max-context", MODEL, "--quant", "IQ2_M"],
    ):
        result = runner.invoke(app, [*args, *BOX, "--json"])
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["compute_rule"]["class"] == "capped"
    assert log.read_text().split() == ["--version"]
    fake.write_text(fake.read_text() + "# rebuilt\n")  # another binary: asked again
    result = runner.invoke(app, ["pick", MODEL, "-c", "32768", *BOX])
    assert result.exit_code == 0, result.stderr
    assert log.read_text().split() == ["--version"] * 2
    log.unlink()
    result = runner.invoke(app, ["command", "--gguf", str(q4km_gguf), "-c", "8192", *BOX, "--json"])
    assert result.exit_code == 0, result.stderr
    assert log.read_text().split() == ["--help", "--version"]  # its build is remembered
    target = json.loads(result.stdout)["command"]
    assert target["argv"][0] == str(fake)


# ---- RPC workers -------------------------------------------------------------------------------

CLUSTER = ["--gpu", "3090", "--ram", "64G", "--rpc-device", "192.168.1.20:50052=t4"]


def test_pick_over_a_local_3090_and_a_remote_t4() -> None:
    # experts kept out of RAM, so the T4 worker is needed (with RAM allowed, this machine's own
    # expert offload is expected faster than the network at 262144 tokens: the worker is left out)
    doc = run_json(["pick", MODEL, "-c", "262144", "--no-offload", *CLUSTER])
    devices = {d["device"]: d for d in doc["devices"]}
    assert list(devices) == ["RPC0", "CUDA0", "CPU"]
    assert devices["RPC0"]["endpoint"] == "192.168.1.20:50052"
    assert devices["RPC0"]["name"] == "Tesla T4" and devices["RPC0"]["layers"]
    assert devices["CUDA0"]["endpoint"] is None
    assert doc["config"]["rpc_servers"] == ["192.168.1.20:50052"]
    assert doc["flags"][doc["flags"].index("--rpc") + 1] == "192.168.1.20:50052"
    assert doc["machine"]["rpc_workers"] == [
        {"endpoint": "192.168.1.20:50052", "devices": ["Tesla T4"], "probed": False}
    ]


def test_estimate_names_rpc_devices() -> None:
    doc = run_json(["estimate", MODEL, "-q", "Q4_K_M", "-c", "8192", *CLUSTER,
                    "-dev", "CUDA0,RPC0", "-ts", "30,12"])  # fmt: skip
    assert [d["device"] for d in doc["devices"]] == ["CUDA0", "RPC0", "CPU"]
    assert doc["config"]["devices"] == [0, "RPC0"]
    result = runner.invoke(app, ["estimate", MODEL, "-q", "Q4_K_M", *CLUSTER, "-dev", "RPC7"])
    assert result.exit_code == 2 and "RPC7" in result.stderr


def test_command_prints_every_hosts_line(q4km_gguf: Path, tmp_path: Path) -> None:
    # 262144 tokens of KV do not fit the 3090 beside the Q4_K_M weights; with experts kept out of
    # RAM (--no-offload) the T4 worker is needed (with RAM allowed, a few expert layers in this
    # machine's RAM are faster than the network: the worker is then left unused)
    args = ["command", "--gguf", str(q4km_gguf), "-c", "262144", "--no-offload", *CLUSTER]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "# on the RPC worker 192.168.1.20:50052 (RPC0), first:"
    assert lines[1] == "ggml-rpc-server -H 192.168.1.20 -p 50052 -d CUDA0 -c"
    assert "--rpc 192.168.1.20:50052" in lines[-1] and lines[-1].count("-ts") == 1
    assert "no authentication" in result.stderr and "sudo ufw allow from" in result.stdout

    doc = run_json(args)
    (worker,) = doc["workers"]
    assert worker["argv"] == ["ggml-rpc-server", "-H", "192.168.1.20", "-p", "50052",
                              "-d", "CUDA0", "-c"]  # fmt: skip
    assert worker["devices"] == ["RPC0"] and worker["cache_bytes"] > 0
    argv = doc["command"]["argv"]
    assert argv[argv.index("--rpc") + 1] == "192.168.1.20:50052"

    script = tmp_path / "serve.sh"
    result = runner.invoke(app, [*args, "--script", str(script)])
    assert result.exit_code == 0, result.stderr
    # the script is the head's; stdout carries the workers' lines
    assert result.stdout.splitlines()[1] == "ggml-rpc-server -H 192.168.1.20 -p 50052 -d CUDA0 -c"
    assert "#   on 192.168.1.20:50052: ggml-rpc-server" in script.read_text()

    exposed = runner.invoke(app, [*args, "--rpc-bind", "0.0.0.0", "--no-rpc-cache"])
    assert exposed.exit_code == 0, exposed.stderr
    assert "ggml-rpc-server -H 0.0.0.0 -p 50052 -d CUDA0\n" in exposed.stdout
    assert "every interface (0.0.0.0)" in exposed.stderr


# ---- rough edges (issue 12): each the command a newcomer ran, and what they expect -----------


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gguf_fixtures import write_gguf

    path = tmp_path_factory.mktemp("tiny") / "Tiny-Q8_0.gguf"
    write_gguf(path)  # general.sampling.temp = 0.6 as float32 (0.6000000238418579)
    return path


def test_command_prints_header_floats_as_written(tiny_gguf: Path) -> None:
    result = runner.invoke(app, ["command", "--gguf", str(tiny_gguf), "-c", "4096", "--cpu-only"])
    assert result.exit_code == 0, result.output
    line = result.stdout
    assert "--temp 0.6 " in line and "--top-p 0.95 " in line and "--min-p 0 " in line
    assert "0.6000000238418579" not in line and "0.949999988079071" not in line


def test_command_with_model_and_gguf_says_the_file_wins(tiny_gguf: Path) -> None:
    """MODEL and --gguf together: the file's header is the plan's basis, MODEL adds sampling and
    alias; a file of another architecture is refused."""
    result = runner.invoke(
        app, ["command", MODEL, "--gguf", str(tiny_gguf), "-c", "4096", "--cpu-only", "-q", "Q8_0"]
    )
    assert result.exit_code == 0, result.output
    assert f"planning on {tiny_gguf.name}'s own header; {MODEL} adds" in result.stderr
    assert f"--alias {MODEL}" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min-tps", "-1"], "--min-tps -1.0: a speed floor is 0 (none) or more"),
        (["-c", "1"], "-c 1: the smallest context is 256"),
        (["-c", "-5"], "-c -5: the smallest context is 256"),
        (["-np", "0"], "-np 0: at least 1 slot"),
        (["--ram", "0"], "--ram 0: RAM must be more than 0"),
        (["--llama-server", "/nonexistent/llama-server"], "no such file"),
    ],
)
def test_impossible_values_are_usage_errors(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["pick", MODEL, "--gpu", "3090", "-c", "8192", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr.splitlines()[-2 if "Hint" in result.stderr else -1]


def test_llama_server_that_is_not_executable(tmp_path: Path) -> None:
    not_exec = tmp_path / "llama-server"
    not_exec.write_text("")
    for cmd in (["probe"], ["pick", MODEL, "-c", "8192", "--gpu", "3090"]):
        result = runner.invoke(app, [*cmd, "--llama-server", str(not_exec)])
        assert result.exit_code == 2
        assert "not an executable file" in result.stderr


def test_bare_ram_is_gib_with_a_note() -> None:
    """`--ram 64` was 64 bytes ("nothing fits"); it is 64 GiB, and the CLI says so."""
    doc = json.loads(
        runner.invoke(
            app, ["pick", MODEL, "-c", "8192", "--cpu-only", "--ram", "64", "--json"]
        ).stdout
    )
    host = [d for d in doc["devices"] if d["kind"] == "host"][0]
    # 64 GiB, less the described machine's reserve (a quarter): the budget is 48 GiB
    assert host["budget_bytes"] == 48 * 1024**3
    result = runner.invoke(app, ["pick", MODEL, "-c", "8192", "--gpu", "3090:24"])
    assert result.exit_code == 0
    assert "Note: --gpu 3090:24: VRAM 24 is read as 24 GiB" in result.stderr


def test_estimate_that_does_not_fit_exits_3_and_still_prints() -> None:
    args = ["estimate", MODEL, "--quant", "Q6_K", "--gpu", "3090", "-c", "8192"]
    result = runner.invoke(app, args)
    assert result.exit_code == 3
    assert "Does not fit." in result.stdout and "CUDA0" in result.stdout
    as_json = runner.invoke(app, [*args, "--json"])
    assert as_json.exit_code == 3
    doc = json.loads(as_json.stdout)  # the estimate itself, not an error document
    assert doc["fits"] is False and doc["devices"]


def test_described_machine_is_named_once() -> None:
    result = runner.invoke(app, ["pick", MODEL, "-c", "8192", "--gpu", "3090"])
    assert "(described machine: --gpu 3090)" in result.stdout
    assert "described: described" not in result.stdout


def test_command_formats_systemd_and_compose(tiny_gguf: Path) -> None:
    base = ["command", "--gguf", str(tiny_gguf), "-c", "4096", "--cpu-only"]
    unit = runner.invoke(app, [*base, "--format", "systemd"])
    assert unit.exit_code == 0, unit.output
    assert "[Service]" in unit.stdout and "ExecStart=" in unit.stdout
    assert "systemctl --user daemon-reload && systemctl --user enable --now" in unit.stderr
    compose = runner.invoke(app, [*base, "--format", "compose"])
    assert compose.exit_code == 0, compose.output
    assert f'"/models/{tiny_gguf.name}"' in compose.stdout
    assert f'source: "{tiny_gguf.parent}"' in compose.stdout
    assert "docker compose up -d" in compose.stderr
    doc = json.loads(runner.invoke(app, [*base, "--format", "compose", "--json"]).stdout)
    assert doc["rendered"]["format"] == "compose" and "services:" in doc["rendered"]["text"]


def test_command_model_source_hf_needs_no_file() -> None:
    result = runner.invoke(
        app, ["command", MODEL, "-q", "Q4_K_M", "-c", "32768", "--gpu", "3090", "--model-source",
              "hf"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "-hf empero-ai/Qwen3.8-35B-A3B-Distill-GGUF:Q4_K_M --no-mmproj" in result.stdout
    assert " -m " not in result.stdout


def test_the_cli_min_tps_default_is_the_planners() -> None:
    # cli/options.py keeps its own copy so that the CLI need not import the planner at start-up
    from quantpick.cli.options import DEFAULT_MIN_TPS as CLI_DEFAULT
    from quantpick.plan.plan_types import DEFAULT_MIN_TPS, PlanRequest

    assert CLI_DEFAULT == DEFAULT_MIN_TPS == PlanRequest(ctx_size=4096).min_tps


def test_every_planning_command_plans_with_the_same_defaults() -> None:
    """pick, get, command, confirm and bench plan the same file the same way unless told
    otherwise (confirm and bench once defaulted to --prefer quality and --min-tps 10)."""
    import typer.main

    root = typer.main.get_command(app)
    defaults = {}
    for name in ("pick", "max-context", "get", "command", "confirm", "bench"):
        params = {p.name: p.default for p in root.commands[name].params}  # type: ignore[attr-defined]
        defaults[name] = (params["prefer"], params["min_tps"])
    assert set(defaults.values()) == {("balanced", 5.0)}, defaults


def test_gpu_reserve_is_taken_from_the_first_described_gpu_only() -> None:
    args = ["estimate", "qwen3.8-35b-a3b-distill", "--quant", "Q4_K_M", "-c", "4096",
            "--gpu", "3090", "--gpu", "t4", "--ram", "64G", "--offline"]  # fmt: skip

    def budgets(extra: list[str]) -> dict[str, int]:
        return {d["device"]: d["budget_bytes"] for d in run_json([*args, *extra])["devices"]}

    default, none, two = (
        budgets([]),
        budgets(["--gpu-reserve", "0"]),
        budgets(["--gpu-reserve", "2G"]),
    )
    MiB = 1024**2
    assert none["CUDA0"] - default["CUDA0"] == 512 * MiB  # the documented default
    assert none["CUDA0"] - two["CUDA0"] == 2048 * MiB
    assert none["CUDA1"] == default["CUDA1"] == two["CUDA1"]
    assert none["CPU"] == default["CPU"] == two["CPU"]


def test_a_described_host_is_a_typical_desktop_and_every_json_says_so() -> None:
    """`--gpu 3060 --ram 32G` used to take this box's cores (2 here: Q5_K_M ~17 tok/s); the
    described host is now the common 6-core desktop unless --cores says otherwise, a note names
    the assumption, and the JSON carries the host with what was assumed."""
    machine = ["--gpu", "3060", "--ram", "32G", "--offline"]
    result = runner.invoke(app, ["pick", MODEL, "-c", "32768", *machine, "--json"])
    assert result.exit_code == 0, result.stderr
    host = json.loads(result.stdout)["machine"]["host"]
    assert (host["cores"], host["threads"], host["ram_total_bytes"]) == (6, 12, 32 * 1024**3)
    assert host["assumed"] == ["cores", "threads", "ram_bandwidth"]
    assert host["ram_bandwidth_bytes_per_s"] == 50 * 10**9
    assert "assumed 6 CPU cores (--cores), 12 threads (--threads)" in result.stderr
    full = ["--cores", "8", "--threads", "16", "--ram-bandwidth", "60GB/s"]
    described = run_json(["pick", MODEL, "-c", "32768", *machine, *full])
    assert described["machine"]["host"]["assumed"] == []
    assert described["machine"]["host"]["cores"] == 8
    estimate = run_json(["estimate", MODEL, "-q", "Q4_K_M", "-c", "8192", "--cpu-moe", *machine])
    assert estimate["machine"]["host"]["cores"] == 6


def test_each_device_says_its_compute_figures_expected_error() -> None:
    """--json: a GPU's compute is an estimate within 15% (public CUDA logs), the host's (the CPU
    backend) within 5% of llama.cpp's allocator, both with a 16 MiB floor (plan/compute.py)."""
    doc = run_json(["pick", MODEL, "-c", "32768", *BOX, "--offline"])
    gpu, host = doc["devices"][0], doc["devices"][-1]
    assert (gpu["compute_estimated"], gpu["compute_expected_error"]) == (True, 0.15)
    assert (host["compute_estimated"], host["compute_expected_error"]) == (False, 0.05)
    assert host["compute_expected_error_floor_bytes"] == 16 * MiB
