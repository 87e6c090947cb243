"""quantpick.serve.command: golden argv for typical plans, shell-safe rendering, script/env/JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from quantpick.errors import UsageError
from quantpick.model.manifest import Manifest, Sampling
from quantpick.model.registry import load_manifest_file
from quantpick.plan.memory import RunConfig
from quantpick.serve.command import (
    ServerCommand,
    ServerOptions,
    build_command,
    render_env,
    render_json,
    render_line,
    render_script,
    write_script,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL = Path("/models/Qwen3.6-35B-A3B-UD-Q4_K_M.gguf")
MMPROJ = Path("/models/mmproj-BF16.gguf")

TAIL = [
    "--fit", "off", "--jinja", "--reasoning-format", "deepseek",
    "--temp", "0.6", "--top-p", "0.95", "--top-k", "20", "--min-p", "0",
    "--host", "127.0.0.1", "--port", "8080", "--alias", "qwen3.6-35b-a3b-unsloth",
]  # fmt: skip


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    m = load_manifest_file(ROOT / "manifests" / "qwen3.6-35b-a3b-unsloth.toml")
    # Pin what the golden lists depend on, whatever the bundled manifest says later.
    return dataclasses.replace(
        m,
        id="qwen3.6-35b-a3b-unsloth",
        reasoning=True,
        sampling=Sampling(temperature=0.6, top_p=0.95, top_k=20, min_p=0.0),
    )


def build(config: RunConfig, manifest: Manifest | None, **kw: object) -> ServerCommand:
    args: dict[str, object] = dict(
        model_path=MODEL, mmproj_path=None, manifest=manifest, block_count=40,
        server=ServerOptions(), capabilities=None,
    )  # fmt: skip
    args.update(kw)
    return build_command(config, **args)  # type: ignore[arg-type]


# --- golden argv --------------------------------------------------------------------------------


def test_one_gpu_full_offload(manifest: Manifest) -> None:
    cfg = RunConfig(ctx_size=131072, n_parallel=4, kv_unified=True, cache_type_k="q8_0",
                    cache_type_v="q8_0")  # fmt: skip
    cmd = build(cfg, manifest)
    assert list(cmd.argv) == [
        "llama-server", "-m", str(MODEL), "-c", "131072", "-np", "4", "-kvu", "-ngl", "41",
        "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on", *TAIL,
    ]  # fmt: skip
    assert cmd.env == {}
    assert "current llama.cpp" in cmd.target
    assert any("no llama-server was checked" in w for w in cmd.warnings)


def test_mtp_file_full_offload_counts_the_mtp_block(manifest: Manifest) -> None:
    cmd = build(RunConfig(ctx_size=4096), manifest, block_count=41)
    assert cmd.argv[cmd.argv.index("-ngl") + 1] == "42"


def test_3090_plus_t4_split(manifest: Manifest) -> None:
    cfg = RunConfig(ctx_size=65536, n_parallel=1, tensor_split=(26.0, 16.0), devices=(0, 1))
    cmd = build(cfg, manifest)
    assert list(cmd.argv) == [
        "llama-server", "-m", str(MODEL), "-c", "65536", "-np", "1", "-ngl", "41",
        "--device", "CUDA0,CUDA1", "-ts", "26,16", "-ctk", "f16", "-ctv", "f16", "-fa", "on",
        *TAIL,
    ]  # fmt: skip
    # NVML indices are PCI bus order; CUDA's default is fastest-first.
    assert cmd.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_expert_offload(manifest: Manifest) -> None:
    cfg = RunConfig(ctx_size=262144, n_parallel=1, n_cpu_moe=12, ubatch=1024, batch=4096)
    cmd = build(cfg, manifest)
    assert list(cmd.argv) == [
        "llama-server", "-m", str(MODEL), "-c", "262144", "-np", "1", "-ngl", "41",
        "--n-cpu-moe", "12", "-ctk", "f16", "-ctv", "f16", "-fa", "on", "-ub", "1024",
        "-b", "4096", *TAIL,
    ]  # fmt: skip


def test_override_tensors_come_before_n_cpu_moe(manifest: Manifest) -> None:
    cfg = RunConfig(override_tensors=((r"blk\.39\.ffn_up_exps", "CPU"),), n_cpu_moe=2)
    argv = list(build(cfg, manifest).argv)
    assert argv.index("-ot") < argv.index("--n-cpu-moe")
    assert argv[argv.index("-ot") + 1] == r"blk\.39\.ffn_up_exps=CPU"


def test_all_experts_on_cpu(manifest: Manifest) -> None:
    argv = build(RunConfig(cpu_moe=True, n_cpu_moe=5), manifest).argv
    assert "--cpu-moe" in argv and "--n-cpu-moe" not in argv


def test_cpu_only(manifest: Manifest) -> None:
    cfg = RunConfig(ctx_size=8192, n_parallel=1, n_gpu_layers=0, devices=())
    cmd = build(cfg, manifest)
    # -dev none: no GPU at all (no CUDA context, no op offload); -ngl 0 alone still uses the GPU.
    assert list(cmd.argv) == [
        "llama-server", "-m", str(MODEL), "-c", "8192", "-np", "1", "-ngl", "0",
        "--device", "none", "-ctk", "f16", "-ctv", "f16", "-fa", "on", *TAIL,
    ]  # fmt: skip
    assert cmd.env == {}


def test_vision_adds_mmproj(manifest: Manifest) -> None:
    cmd = build(RunConfig(ctx_size=32768, vision=True), manifest, mmproj_path=MMPROJ)
    assert cmd.argv[1:5] == ("-m", str(MODEL), "--mmproj", str(MMPROJ))


def test_vision_without_projector_is_an_error(manifest: Manifest) -> None:
    with pytest.raises(UsageError, match="mmproj"):
        build(RunConfig(vision=True), manifest)


def test_no_manifest_means_no_sampling_reasoning_or_alias() -> None:
    argv = build(RunConfig(ctx_size=4096), None).argv
    for flag in ("--temp", "--reasoning-format", "--alias"):
        assert flag not in argv
    assert "--jinja" in argv


def test_kv_offload_off_and_mtp_speculation(manifest: Manifest) -> None:
    argv = list(build(RunConfig(kv_offload=False, spec_draft_n=3), manifest).argv)
    assert "-nkvo" in argv
    i = argv.index("--spec-type")
    assert argv[i : i + 4] == ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3"]


def test_server_options(manifest: Manifest) -> None:
    opts = ServerOptions(host="0.0.0.0", port=9000, alias="mine", extra_args=("--metrics",))
    cmd = build(RunConfig(), manifest, server=opts)
    argv = list(cmd.argv)
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == "9000"
    assert argv[argv.index("--alias") + 1] == "mine"
    assert argv[-1] == "--metrics"
    assert any("without an API key" in w for w in cmd.warnings)


# --- API key --------------------------------------------------------------------------------------


def test_api_key_only_by_reference(manifest: Manifest, tmp_path: Path) -> None:
    cmd = build(RunConfig(), manifest, server=ServerOptions(api_key_env="MY_KEY"))
    assert "--api-key" not in cmd.argv
    assert cmd.env_from == (("LLAMA_API_KEY", "MY_KEY"),)
    assert 'LLAMA_API_KEY="$MY_KEY"' in render_line(cmd)
    script = render_script(cmd, "plan")
    assert ': "${MY_KEY:?' in script and 'export LLAMA_API_KEY="$MY_KEY"' in script
    assert render_json(cmd)["env_from"] == {"LLAMA_API_KEY": "MY_KEY"}
    # At run time the server gets the key in its environment, not in argv.
    printer = _printer(tmp_path, extra='printf "KEY=%s\\0" "$LLAMA_API_KEY"')
    cmd = dataclasses.replace(cmd, argv=(str(printer), *cmd.argv[1:]))
    out = subprocess.run(
        ["sh", "-c", render_line(cmd)], env={**os.environ, "MY_KEY": "s3cret"},
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    words = out.split(b"\0")
    assert b"KEY=s3cret" in words and b"s3cret" not in words


def test_api_key_env_name_is_validated(manifest: Manifest) -> None:
    with pytest.raises(UsageError):
        build(RunConfig(), manifest, server=ServerOptions(api_key_env="X; rm -rf ~"))


# --- quoting --------------------------------------------------------------------------------------

HOSTILE = [
    "my models/Qwen 3.6.gguf",
    "it's.gguf",
    'say "hi".gguf',
    "$(touch /tmp/quantpick-pwned).gguf",
    "`touch /tmp/quantpick-pwned`.gguf",
    "line1\nline2.gguf",
    "-rf.gguf",
    "ünïcødé 模型.gguf",
    "semi;colon & amp | pipe > gt.gguf",
]


def _printer(tmp_path: Path, extra: str = "") -> Path:
    """A stand-in for llama-server that prints its arguments NUL-separated."""
    p = tmp_path / "printargs"
    p.write_text(f'#!/bin/sh\n{extra}\nprintf "%s\\0" "$@"\n')
    p.chmod(0o755)
    return p


def _words(out: bytes) -> list[str]:
    return out.decode().split("\0")[:-1]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_paths_round_trip_through_sh(
    name: str, manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work dir"
    work.mkdir()
    monkeypatch.chdir(work)
    sentinel = Path("/tmp/quantpick-pwned")
    sentinel.unlink(missing_ok=True)
    cmd = build(
        RunConfig(vision=True, devices=(1, 0), tensor_split=(1.0, 1.0)), manifest,
        model_path=Path(name), mmproj_path=work / name,
        server=ServerOptions(program=str(_printer(tmp_path)), alias=name),
    )  # fmt: skip
    model_arg = cmd.argv[cmd.argv.index("-m") + 1]
    assert model_arg == str(work / name)  # relative -> absolute: never starts with '-'
    out = subprocess.run(["sh", "-c", render_line(cmd)], capture_output=True, check=True).stdout
    assert _words(out) == list(cmd.argv[1:])
    # The script format too, run as a file.
    script = tmp_path / "run.sh"
    write_script(script, render_script(cmd, f"plan for {name}"))
    out = subprocess.run([str(script)], capture_output=True, check=True).stdout
    assert _words(out) == list(cmd.argv[1:])
    assert not sentinel.exists()


def test_plan_comment_cannot_inject_commands(manifest: Manifest, tmp_path: Path) -> None:
    cmd = build(RunConfig(), manifest, server=ServerOptions(program=str(_printer(tmp_path))))
    marker = tmp_path / "injected"
    script = tmp_path / "run.sh"
    write_script(script, render_script(cmd, f"line one\ntouch {marker}\r\ntouch {marker}"))
    subprocess.run([str(script)], capture_output=True, check=True)
    assert not marker.exists()


# --- formats --------------------------------------------------------------------------------------


def test_script_format(manifest: Manifest, tmp_path: Path) -> None:
    cmd = build(RunConfig(devices=(0, 1), tensor_split=(26.0, 16.0)), manifest)
    text = render_script(cmd, "Qwen3.6-35B-A3B UD-Q4_K_M, 2 GPUs, -c 65536")
    lines = text.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert "# Qwen3.6-35B-A3B UD-Q4_K_M, 2 GPUs, -c 65536" in lines
    assert "set -euo pipefail" in lines
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in lines
    assert any(line.startswith("exec llama-server") for line in lines)
    assert lines.index("set -euo pipefail") < next(
        i for i, line in enumerate(lines) if line.startswith("exec ")
    )
    subprocess.run(["bash", "-n", "-c", text], check=True)  # parses


def test_write_script_is_atomic_and_executable(tmp_path: Path) -> None:
    old_umask = os.umask(0o077)  # a strict umask must not make the script unreadable/unrunnable
    try:
        path = tmp_path / "serve.sh"
        path.write_text("old")
        write_script(path, "#!/bin/sh\necho new\n")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert path.read_text() == "#!/bin/sh\necho new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["serve.sh"]  # no temp file left behind
    assert subprocess.run([str(path)], capture_output=True, text=True).stdout == "new\n"


def test_write_script_into_a_read_only_directory_is_one_line(tmp_path: Path) -> None:
    from quantpick.errors import QuantpickError

    directory = tmp_path / "ro"
    directory.mkdir()
    if os.geteuid() == 0:  # root ignores mode bits: a read-only tmpfs, or nothing to test
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1g", "tmpfs", str(directory)],
            capture_output=True,
        )
        if mounted.returncode != 0:
            pytest.skip("running as root without mount(8): cannot make a read-only directory")
    else:
        directory.chmod(0o555)
    try:
        with pytest.raises(QuantpickError) as info:
            write_script(directory / "serve.sh", "#!/bin/sh\n")
        assert info.value.message.startswith(
            f"cannot write the launch script: {directory}/serve.sh: "
        )
        assert "\n" not in info.value.message
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(directory)], check=False)
        else:
            directory.chmod(0o755)


def test_json_format(manifest: Manifest) -> None:
    cmd = build(RunConfig(devices=(0,)), manifest)
    data = json.loads(json.dumps(render_json(cmd)))
    assert data["argv"] == list(cmd.argv)
    assert data["env"] == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert data["shell"] == render_line(cmd)
    assert data["target"] == cmd.target


def test_env_format_sources_to_the_same_values(
    manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    name = "a 'b' $(c)\nd.gguf"
    ot = ((r"blk\.1\.ffn_up_exps", "CPU"), (r"blk\.2\.ffn_up_exps", "CPU"))
    cfg = RunConfig(ctx_size=8192, kv_unified=True, kv_offload=False, override_tensors=ot)
    cmd = build(cfg, manifest, model_path=Path(name), server=ServerOptions(api_key_env="K"))
    text = render_env(cmd)
    assert "LLAMA_ARG_CTX_SIZE=8192" in text
    env_file = tmp_path / "env.sh"
    env_file.write_text(text)
    probe = (
        'set -eu; . "$1"; printf "%s\\0" "$LLAMA_ARG_MODEL" "$LLAMA_ARG_KV_UNIFIED" '
        '"$LLAMA_ARG_KV_OFFLOAD" "$LLAMA_ARG_OVERRIDE_TENSOR" "$LLAMA_ARG_TEMPERATURE" '
        '"$LLAMA_API_KEY"'
    )
    out = subprocess.run(
        ["sh", "-c", probe, "sh", str(env_file)], env={**os.environ, "K": "key"},
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    assert _words(out) == [
        str(tmp_path / name), "1", "0", r"blk\.1\.ffn_up_exps=CPU,blk\.2\.ffn_up_exps=CPU", "0.6",
        "key",
    ]  # fmt: skip
