"""quantpick.serve.command: golden argv for typical plans, shell-safe rendering, script/env/JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantpick.errors import UsageError
from quantpick.model.manifest import Manifest, Sampling
from quantpick.model.registry import load_manifest_file
from quantpick.plan.memory import RunConfig
from quantpick.serve.command import ServerCommand, ServerOptions, build_command
from quantpick.serve.formats.compose import render_compose
from quantpick.serve.formats.env import render_env
from quantpick.serve.formats.json_doc import render_json
from quantpick.serve.formats.line import render_line
from quantpick.serve.formats.script import render_script
from quantpick.serve.formats.systemd import render_systemd
from quantpick.serve.hf_tag import hf_candidates, hf_model
from quantpick.serve.script_file import write_script

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
    assert "-ctkd" not in argv  # f16, llama-server's default


def test_mtp_draft_cache_types(manifest: Manifest) -> None:
    config = RunConfig(spec_draft_n=2, spec_cache_type_k="q8_0", spec_cache_type_v="q4_0")
    argv = list(build(config, manifest).argv)
    assert argv[argv.index("-ctkd") + 1] == "q8_0" and argv[argv.index("-ctvd") + 1] == "q4_0"


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
        path.write_text("#!/bin/sh\n# Written by quantpick. Plan: old\n")
        write_script(path, "#!/bin/sh\necho new\n")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert path.read_text() == "#!/bin/sh\necho new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["serve.sh"]  # no temp file left behind
    assert subprocess.run([str(path)], capture_output=True, text=True).stdout == "new\n"


def test_write_script_replaces_only_what_quantpick_wrote(tmp_path: Path) -> None:
    # Before: any file at the path was replaced and made executable (notes.txt included).
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    notes.chmod(0o644)
    with pytest.raises(UsageError, match="exists and was not written by quantpick") as info:
        write_script(notes, "#!/bin/sh\n")
    assert "--force" in (info.value.hint or "")
    assert notes.read_text() == "my notes\n" and stat.S_IMODE(notes.stat().st_mode) == 0o644
    write_script(notes, "#!/bin/sh\n", force=True)
    assert notes.read_text() == "#!/bin/sh\n"
    # every rendering carries the marker, so quantpick can write over its own files again
    cmd = ServerCommand(argv=("/usr/bin/llama-server", "-c", "1"), env={}, warnings=(), target="t")
    for text in (render_script(cmd, "p"), render_systemd(cmd, "p", "m"), render_compose(cmd, "p")):
        path = tmp_path / "out"
        path.write_text(text)
        write_script(path, render_script(cmd, "again"))
        assert "again" in path.read_text()


def test_write_script_never_writes_over_a_special_file(tmp_path: Path) -> None:
    # Before: os.replace turned a FIFO (and, as root, /dev/null) into a regular file.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "FIFO"), (Path("/dev/null"), "character device"),
                       (tmp_path, "directory")):  # fmt: skip
        for force in (False, True):
            with pytest.raises(UsageError, match=f"is a {kind}, not a regular file"):
                write_script(path, "#!/bin/sh\n", force=force)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_write_script_replaces_a_link_only_with_force(tmp_path: Path) -> None:
    target = tmp_path / "real.sh"
    target.write_text("#!/bin/sh\n# Written by quantpick. Plan: x\n")
    link = tmp_path / "link.sh"
    link.symlink_to(target)
    with pytest.raises(UsageError, match="is a symbolic link"):
        write_script(link, "#!/bin/sh\necho new\n")
    write_script(link, "#!/bin/sh\necho new\n", force=True)
    assert not link.is_symlink() and link.read_text() == "#!/bin/sh\necho new\n"
    assert target.read_text() == "#!/bin/sh\n# Written by quantpick. Plan: x\n"


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


# --- RPC workers -------------------------------------------------------------------------------


def _workers(*, probed: bool = False, host: str = "192.168.1.20") -> tuple:
    from quantpick.machine.spec import Gpu, RpcWorker

    t4 = Gpu(0, "Tesla T4", 15 * 1024**3, 15 * 1024**3)
    two = (Gpu(0, "a", 1, 1), Gpu(1, "b", 1, 1))
    return (
        RpcWorker(host, 50052, (t4,), probed=probed, address=host if probed else None,
                  head_address="192.168.1.10" if probed else None),
        RpcWorker("192.168.1.21", 50100, two),
    )  # fmt: skip


def test_rpc_comes_first_and_devices_are_named(manifest: Manifest) -> None:
    cfg = RunConfig(
        ctx_size=65536,
        rpc_servers=("192.168.1.20:50052", "192.168.1.21:50100"),
        devices=("RPC0", 0, "RPC2"),
        tensor_split=(10.0, 26.0, 6.0),
        override_tensors=((r"blk\.3\.ffn_up_exps", "RPC1[192.168.1.21:50100]"),),
    )
    argv = list(build(cfg, manifest).argv)
    # --rpc before --device and -ot, which name the devices it creates (parsed in order)
    assert argv[:6] == ["llama-server", "-m", str(MODEL), "--rpc",
                        "192.168.1.20:50052,192.168.1.21:50100", "-c"]  # fmt: skip
    assert argv[argv.index("--device") + 1] == "RPC0,CUDA0,RPC2"
    assert argv[argv.index("-ts") + 1] == "10,26,6"
    assert argv[argv.index("-ot") + 1] == r"blk\.3\.ffn_up_exps=RPC1[192.168.1.21:50100]"
    assert argv.index("--rpc") < argv.index("--device") < argv.index("-ot")
    env = render_env(build(cfg, manifest))
    assert "export LLAMA_ARG_RPC=192.168.1.20:50052,192.168.1.21:50100" in env


def test_rpc_devices_need_device_support(manifest: Manifest) -> None:
    from quantpick.errors import QuantpickError
    from quantpick.serve.flags import parse_help, with_version

    data = ROOT / "tests" / "data"
    # the current build's help without -dev/--device: a build that cannot choose devices
    help_text = "\n".join(
        line
        for line in (data / "llama-server-help-current.txt").read_text().splitlines()
        if "--device <" not in line
    )
    caps = with_version(
        parse_help(help_text), (data / "llama-server-version-current.txt").read_text()
    )
    assert not caps.has("--device") and caps.has("--rpc")
    local = RunConfig(ctx_size=4096, devices=(1, 0))
    assert build(local, manifest, capabilities=caps).env["CUDA_VISIBLE_DEVICES"] == "1,0"
    remote = RunConfig(ctx_size=4096, rpc_servers=("10.0.0.7:50052",), devices=("RPC0",))
    with pytest.raises(QuantpickError, match="no --device"):
        build(remote, manifest, capabilities=caps)


def test_worker_lines_bind_the_lan_address_and_pin_described_devices() -> None:
    from quantpick.serve.workers import build_worker_commands, render_worker_json

    t4, two = build_worker_commands(_workers(), weights_bytes={"192.168.1.20:50052": 12 * 1024**3})
    assert t4.argv == ("ggml-rpc-server", "-H", "192.168.1.20", "-p", "50052", "-d", "CUDA0", "-c")
    assert two.argv == (
        "ggml-rpc-server", "-H", "192.168.1.21", "-p", "50100", "-d", "CUDA0,CUDA1", "-c",
    )  # fmt: skip
    assert (t4.devices, two.devices) == (("RPC0",), ("RPC1", "RPC2"))
    assert t4.cache_bytes == 12 * 1024**3 and "12.00 GiB" in " ".join(t4.notes)
    # LAN-bound: said plainly, with a firewall rule; the head's address is unknown here
    assert any("no authentication" in w for w in t4.warnings)
    assert t4.firewall[0].startswith("sudo ufw allow from <head-ip> to any port 50052 proto tcp")
    assert not any("0.0.0.0" in w for w in t4.warnings)
    doc = render_worker_json(t4)
    assert doc["shell"] == "ggml-rpc-server -H 192.168.1.20 -p 50052 -d CUDA0 -c"
    assert doc["bind"] == "192.168.1.20" and doc["cache"] is True


def test_probed_worker_keeps_its_devices_and_knows_the_head() -> None:
    from quantpick.serve.workers import build_worker_commands

    (w, _) = build_worker_commands(_workers(probed=True), cache=False)
    assert w.argv == ("ggml-rpc-server", "-H", "192.168.1.20", "-p", "50052")  # no -d, no -c
    assert "does not name" in w.notes[0]
    assert w.firewall[0].startswith("sudo ufw allow from 192.168.1.10 ")


def test_zero_zero_zero_zero_only_when_asked_and_then_loudly() -> None:
    from quantpick.serve.workers import build_worker_commands

    for w in build_worker_commands(_workers()):
        assert w.bind != "0.0.0.0"
    exposed = build_worker_commands(_workers(), bind="0.0.0.0")
    assert exposed[0].argv[1:3] == ("-H", "0.0.0.0")
    assert any("every interface (0.0.0.0)" in x for x in exposed[0].warnings)
    assert any("Bind its LAN address" in x for x in exposed[0].warnings)
    assert exposed[0].firewall
    with pytest.raises(UsageError, match="IPv4"):
        build_worker_commands(_workers(), bind="box.lan")


def test_loopback_workers_need_no_firewall_and_names_need_an_address() -> None:
    from quantpick.machine.spec import Gpu, RpcWorker
    from quantpick.serve.workers import build_worker_commands

    local = RpcWorker("127.0.0.1", 50052, (Gpu(0, "x", 1, 1),), probed=True, address="127.0.0.1")
    (w,) = build_worker_commands((local,))
    assert (w.warnings, w.firewall) == ((), ())
    named = RpcWorker("box.lan", 50052, (Gpu(0, "x", 1, 1),))
    with pytest.raises(UsageError, match="IPv4"):
        build_worker_commands((named,))
    (w,) = build_worker_commands((dataclasses.replace(named, address="192.168.1.30"),))
    assert w.argv[1:3] == ("-H", "192.168.1.30")
    (w,) = build_worker_commands((dataclasses.replace(named, address="192.168.1.30"),),
                                 bind="127.0.0.1")  # fmt: skip
    assert any("cannot be reached from the head" in x for x in w.warnings)


def test_script_lists_the_workers_as_comments(manifest: Manifest) -> None:
    from quantpick.serve.workers import build_worker_commands, render_worker_lines

    workers = build_worker_commands(_workers())
    cfg = RunConfig(ctx_size=4096, rpc_servers=("192.168.1.20:50052", "192.168.1.21:50100"))
    text = render_script(build(cfg, manifest), "plan", workers)
    assert "# Start these RPC workers first, each on its own machine:" in text
    assert "#   on 192.168.1.20:50052: ggml-rpc-server -H 192.168.1.20 -p 50052 -d CUDA0 -c" in text
    assert "exec llama-server" in text
    lines = render_worker_lines(workers).splitlines()
    assert lines[0] == "# on the RPC worker 192.168.1.20:50052 (RPC0), first:"
    assert lines[1] == "ggml-rpc-server -H 192.168.1.20 -p 50052 -d CUDA0 -c"
    # the script still runs: bash parses it
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


# --- numbers: as the manifest or header states them --------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.6000000238418579, "0.6"), (0.949999988079071, "0.95"), (0.6, "0.6"), (20.0, "20"),
     (0.0, "0"), (1e-05, "1e-05"), (33.0, "33"), (0.05000000074505806, "0.05")],
)  # fmt: skip
def test_numbers_are_the_shortest_float32_text(value: float, text: str) -> None:
    from quantpick.serve.command import flag_number as _num

    assert _num(value) == text


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_number_text_reads_back_as_the_same_float32(value: float) -> None:
    """llama.cpp parses with std::stof: the text must give back exactly the same float32, and no
    shorter text would."""
    import struct

    from quantpick.serve.command import flag_number as _num

    def f32(x: float) -> float:
        return struct.unpack("<f", struct.pack("<f", x))[0]

    text = _num(value)
    assert f32(float(text)) == value
    digits = len(text.lstrip("-").split("e")[0].replace(".", "").lstrip("0")) or 1
    if digits > 1 and not float(value).is_integer():
        shorter = f"{value:.{digits - 1}g}"
        assert f32(float(shorter)) != value


# --- systemd: ExecStart read back the way systemd reads it ---------------------------------------
# systemd.syntax(7) "QUOTING" and systemd.service(5) "COMMAND LINES", written out independently of
# quantpick's quoting so that the two can be checked against each other and against the man pages'
# own examples.

_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
              "\\": "\\", '"': '"', "'": "'", "s": " "}  # fmt: skip


def _c_unescape(text: str, i: int) -> tuple[int, str]:
    """One escape after a backslash at text[i-1]: (next index, character)."""
    c = text[i]
    if c in _C_ESCAPES:
        return i + 1, _C_ESCAPES[c]
    for prefix, width, base in (("x", 2, 16), ("u", 4, 16), ("U", 8, 16)):
        if c == prefix:
            return i + 1 + width, chr(int(text[i + 1 : i + 1 + width], base))
    if c in "01234567":
        return i + 3, chr(int(text[i : i + 3], 8))
    raise ValueError(f"unknown escape \\{c}")


def systemd_words(value: str) -> list[tuple[str, str]]:
    """(raw, unquoted) words of one setting: quotes only open a word, C escapes everywhere."""
    words, i, n = [], 0, len(value)
    while True:
        while i < n and value[i] in " \t":
            i += 1
        if i >= n:
            return words
        start, quote, word = i, None, []
        if value.startswith("\\;", i) and (i + 2 == n or value[i + 2] in " \t"):
            words.append(("\\;", ";"))  # an Exec line's literal ";" (systemd.service(5))
            i += 2
            continue
        if value[i] in "\"'":
            quote, i = value[i], i + 1
        while True:
            if i >= n:
                if quote:
                    raise ValueError("unterminated quote")
                break
            c = value[i]
            if quote and c == quote:
                i += 1
                if i < n and value[i] not in " \t":
                    raise ValueError("a closing quote must be followed by whitespace")
                break
            if not quote and c in " \t":
                break
            if c == "\\":
                i, ch = _c_unescape(value, i + 1)
                word.append(ch)
                continue
            word.append(c)
            i += 1
        words.append((value[start:i], "".join(word)))


def _expand(word: str, env: dict[str, str]) -> str:
    out, i = [], 0
    while i < len(word):
        if word.startswith("%%", i):
            out.append("%")
            i += 2
        elif word[i] == "%":
            raise ValueError(f"specifier in {word!r}")
        elif word.startswith("$$", i):
            out.append("$")
            i += 2
        elif word.startswith("${", i):
            end = word.index("}", i)
            out.append(env.get(word[i + 2 : end], ""))
            i = end + 1
        elif word[i] == "$":
            raise ValueError(f"$NAME inside {word!r}")
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def _specifiers(word: str) -> str:
    """The executable path: specifiers only ("%%" is "%"); "$" is not special there."""
    if re.search(r"%[^%]", word.replace("%%", "")):
        raise ValueError(f"specifier in {word!r}")
    return word.replace("%%", "%")


def systemd_exec(value: str, env: dict[str, str] | None = None) -> list[list[str]]:
    """The command lines of one ExecStart= value, each as [executable path, argv[1:]...] with
    the executable's argv[0] checked against it: lone ";" separates, "\\;" is a literal ";",
    "%%" and "$$" are literal, ${NAME} is one word and a lone $NAME splits at whitespace. The
    executable path (the first word, without an "@" prefix) gets specifiers but no variable
    expansion, so "$$" stays "$$" there (systemd.service(5), "COMMAND LINES"); with "@" the
    next word is argv[0], an ordinary (expanded) word."""
    env = env or {}
    commands: list[list[str]] = []
    pending: list[tuple[str, str]] = []

    def flush() -> None:
        if not pending:
            return
        (_, word0), rest = pending[0], pending[1:]
        at = word0.startswith("@")  # a prefix, read after unquoting
        path = _specifiers(word0[1:] if at else word0)
        argv: list[str] = []
        for raw, word in rest:
            if raw == "\\;":
                argv.append(";")
            elif raw[:1] == "$" and raw[1:2] not in ("$", "{") and raw[1:].isidentifier():
                argv.extend(env.get(raw[1:], "").split())
            else:
                argv.append(_expand(word, env))
        if at:
            assert argv and argv[0] == path, "argv[0] differs from the executable"
            argv = argv[1:]
        commands.append([path, *argv])
        pending.clear()

    for raw, word in systemd_words(value):
        if raw == ";":
            flush()
        else:
            pending.append((raw, word))
    flush()
    return commands


def unit_settings(unit: str, key: str) -> list[str]:
    """Every `key=` value of a unit file, continuation lines joined (systemd.syntax(7))."""
    logical, current = [], ""
    for line in unit.split("\n"):  # systemd ends lines at "\n" only
        if not current and line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    return [line.split("=", 1)[1] for line in logical if line.startswith(key + "=")]


def test_systemd_reader_follows_the_man_pages() -> None:
    """The reader above, on systemd.service(5)'s and systemd.syntax(7)'s own examples."""
    # systemd.service(5): Environment="ONE=one" 'TWO=two two' / ExecStart=echo $ONE $TWO ${TWO}
    env = dict(w.split("=", 1) for _, w in systemd_words("\"ONE=one\" 'TWO=two two'"))
    assert systemd_exec("echo $ONE $TWO ${TWO}", env) == [["echo", "one", "two", "two", "two two"]]
    # Environment=ONE='one' "TWO='two two' too" THREE=: a quote inside a word is a character
    words = [w for _, w in systemd_words("ONE='one' \"TWO='two two' too\" THREE=")]
    assert words == ["ONE='one'", "TWO='two two' too", "THREE="]
    assert systemd_exec("/bin/sh -c 'dmesg | tac'") == [["/bin/sh", "-c", "dmesg | tac"]]
    assert systemd_exec('echo one ; echo "two two"') == [["echo", "one"], ["echo", "two two"]]
    assert systemd_exec("echo \\; x") == [["echo", ";", "x"]]
    # systemd.syntax(7), table 1: the escapes
    assert [w for _, w in systemd_words(r'"\a\b\f\n\r\t\v\\\"\'\s\x41\101\u00e9\U0001F600"')] == [
        "\a\b\f\n\r\t\v\\\"' AA\u00e9\U0001f600"
    ]
    with pytest.raises(ValueError):
        systemd_words('"unterminated')


UNIT_ARGS = ["100%", "$HOME", "${X}", "a b", 'say "hi"', "back\\slash", ";", "#hash", "",
             "tab\there", "new\nline", "ünïcødé 模型", "-", "'single'", "%h"]  # fmt: skip


def _exec_start(cmd: ServerCommand) -> list[str]:
    [value] = unit_settings(render_systemd(cmd, "plan", "qwen"), "ExecStart")
    [argv] = systemd_exec(value)
    return argv


def test_systemd_exec_start_is_the_exact_argv(manifest: Manifest) -> None:
    cmd = build(RunConfig(), manifest, server=ServerOptions(extra_args=tuple(UNIT_ARGS)))
    cmd = dataclasses.replace(cmd, argv=("/opt/llama.cpp/bin/llama-server", *cmd.argv[1:]))
    assert _exec_start(cmd) == list(cmd.argv)


@given(st.lists(st.text(alphabet=st.characters(exclude_characters="\x00")), max_size=6))
def test_systemd_exec_start_round_trips_any_words(words: list[str]) -> None:
    cmd = ServerCommand(argv=("/usr/bin/llama-server", *words), env={}, warnings=(), target="t")
    assert _exec_start(cmd) == ["/usr/bin/llama-server", *words]


def test_systemd_unit_shape(manifest: Manifest) -> None:
    cfg = RunConfig(ctx_size=65536, tensor_split=(26.0, 16.0), devices=(0, 1))
    cmd = build(cfg, manifest, server=ServerOptions(api_key_env="QP_KEY"))
    unit = render_systemd(cmd, "plan 100% $sure", "qwen3.6 35b")
    assert "[Unit]" in unit and "[Service]" in unit and "[Install]" in unit
    assert unit_settings(unit, "WantedBy") == ["default.target"]
    assert unit_settings(unit, "Restart") == ["on-failure"]
    assert unit_settings(unit, "RestartSteps") and unit_settings(unit, "RestartMaxDelaySec")
    env = [dict([w.split("=", 1) for _, w in systemd_words(v)]) for v in
           unit_settings(unit, "Environment")]  # fmt: skip
    assert {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} in env
    # No secret in the unit: the key comes from a file the user writes.
    assert unit_settings(unit, "EnvironmentFile") == [
        "%h/.config/quantpick/llama-server-qwen3.6-35b.env"
    ]
    assert "QP_KEY" not in "".join(unit_settings(unit, "ExecStart"))
    assert "systemctl --user daemon-reload && systemctl --user enable --now" in unit


@pytest.mark.parametrize(
    "program", ["/opt/a$b/llama-server", "/opt/${X}/llama-server", "/opt/100% $$x/llama-server"]
)
def test_systemd_executable_path_is_not_variable_expanded(program: str) -> None:
    # Before: "$" doubled in the path too, which systemd does not undo there: not executable.
    cmd = ServerCommand(argv=(program, "-c", "1"), env={}, warnings=(), target="t")
    assert _exec_start(cmd) == [program, "-c", "1"]


@pytest.mark.parametrize("program", ["-llama-server", "@x", '/opt/"q"/llama-server'])
def test_systemd_refuses_programs_it_would_misread(program: str) -> None:
    cmd = ServerCommand(argv=(program, "-c", "1"), env={}, warnings=(), target="t")
    with pytest.raises(UsageError):
        render_systemd(cmd, "plan", "m")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_analyze_verify_accepts_the_unit(manifest: Manifest, tmp_path: Path) -> None:
    """systemd's own parser: no error and no warning but the back-off keys older versions lack."""
    cmd = build(RunConfig(devices=(0, 1), tensor_split=(1.0, 1.0)), manifest,
                server=ServerOptions(api_key_env="K", extra_args=tuple(UNIT_ARGS)))  # fmt: skip
    cmd = dataclasses.replace(cmd, argv=("/bin/echo", *cmd.argv[1:]))
    unit = tmp_path / "llama-server-test.service"
    unit.write_text(render_systemd(cmd, "plan", "test"))
    (tmp_path / "xdg").mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "xdg"), "HOME": str(tmp_path)}
    out = subprocess.run(["systemd-analyze", "--user", "verify", str(unit)], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    problems = [
        line for line in (out.stdout + out.stderr).splitlines()
        if line.strip() and "RestartSteps" not in line and "RestartMaxDelaySec" not in line
    ]  # fmt: skip
    if out.returncode != 0 and any("initialize manager" in p for p in problems):
        pytest.skip("systemd-analyze cannot start a user manager here")
    assert out.returncode == 0 and problems == [], problems


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
@pytest.mark.parametrize("directory", ["a$b", "${HOME}x", "100% sure", "plain"])
def test_systemd_analyze_finds_an_executable_with_dollars_in_its_path(
    tmp_path: Path, directory: str
) -> None:
    """Before: `systemd-analyze verify` said "Command .../a$$b/llama-server is not executable"."""
    program = tmp_path / directory / "llama-server"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    cmd = ServerCommand(argv=(str(program), "-c", "4096", "--alias", "a $b"), env={},
                        warnings=(), target="t")  # fmt: skip
    unit = tmp_path / "llama-server-test.service"
    unit.write_text(render_systemd(cmd, "plan", "test"))
    (tmp_path / "xdg").mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "xdg"), "HOME": str(tmp_path)}
    out = subprocess.run(["systemd-analyze", "--user", "verify", str(unit)], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    problems = [
        line for line in (out.stdout + out.stderr).splitlines()
        if line.strip() and "RestartSteps" not in line and "RestartMaxDelaySec" not in line
    ]  # fmt: skip
    if out.returncode != 0 and any("initialize manager" in p for p in problems):
        pytest.skip("systemd-analyze cannot start a user manager here")
    assert out.returncode == 0 and problems == [], problems


# --- docker compose ------------------------------------------------------------------------------


def compose_command(text: str) -> list[str]:
    """The `command:` list, read without a YAML library (each item is one JSON-style string)."""
    lines = text.splitlines()
    start = lines.index("    command:") + 1
    items = []
    for line in lines[start:]:
        if not line.startswith("      - "):
            break
        items.append(json.loads(line[len("      - ") :]).replace("$$", "$"))
    return items


def test_compose_rewrites_paths_host_and_gpus(manifest: Manifest) -> None:
    cfg = RunConfig(ctx_size=32768, vision=True, devices=(1, 3), tensor_split=(3.0, 1.0),
                    override_tensors=((r"blk\.1\.ffn_up_exps", "CUDA3"),))  # fmt: skip
    cmd = build(cfg, manifest, mmproj_path=Path("/proj/mmproj-BF16.gguf"),
                server=ServerOptions(host="192.168.1.5", port=9000))  # fmt: skip
    text = render_compose(cmd, "plan")
    args = compose_command(text)
    assert args[:4] == ["-m", f"/models/{MODEL.name}", "--mmproj", "/models-2/mmproj-BF16.gguf"]
    assert args[args.index("--host") + 1] == "0.0.0.0"  # inside; the port mapping decides
    # Only GPUs 1 and 3 are in the container, numbered 0 and 1 in PCI order.
    assert args[args.index("--device") + 1] == "CUDA0,CUDA1"
    assert args[args.index("-ot") + 1] == r"blk\.1\.ffn_up_exps=CUDA1"
    assert '      - "192.168.1.5:9000:9000"' in text
    assert 'device_ids: ["1", "3"]' in text and '"ghcr.io/ggml-org/llama.cpp:server-cuda"' in text
    assert text.count("read_only: true") == 2


def test_compose_cpu_plan_has_no_gpu_and_loopback_port(manifest: Manifest) -> None:
    cmd = build(RunConfig(ctx_size=8192, n_gpu_layers=0, devices=()), manifest,
                server=ServerOptions(api_key_env="QP_KEY"))  # fmt: skip
    text = render_compose(cmd, "plan")
    assert '"ghcr.io/ggml-org/llama.cpp:server"' in text and "deploy:" not in text
    assert '      - "127.0.0.1:8080:8080"' in text
    assert 'LLAMA_API_KEY: "${QP_KEY:?set QP_KEY to the API key}"' in text  # by reference
    assert "--api-key" not in text


def test_compose_parses_as_yaml_to_the_same_values(manifest: Manifest) -> None:
    yaml = pytest.importorskip("yaml")  # PyYAML only when installed (huggingface_hub brings it)
    hostile = ("$HOME", "${X}", 'q"uote', "line\nbreak", "nel\x85ls\u2028", "# not a comment",
               "- dash", "yes", "null", "1e3", "ünïcødé 模型", "tab\t")  # fmt: skip
    cmd = build(RunConfig(devices=(0,)), manifest, server=ServerOptions(extra_args=hostile))
    text = render_compose(cmd, "plan with: colons # and hashes\nand a newline")
    doc = yaml.safe_load(text)
    service = doc["services"]["llama-server"]
    command = [c.replace("$$", "$") for c in service["command"]]
    assert command == compose_command(text)
    assert command[-len(hostile) :] == list(hostile)
    assert service["volumes"][0] == {"type": "bind", "source": str(MODEL.parent),
                                     "target": "/models", "read_only": True}  # fmt: skip
    assert service["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}
    ]


GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize(
    ("name", "config", "server"),
    [
        ("cpu", RunConfig(ctx_size=8192, n_gpu_layers=0, devices=()), ServerOptions()),
        ("two-gpu", RunConfig(ctx_size=262144, tensor_split=(27.0, 15.0), devices=(0, 1)),
         ServerOptions(api_key_env="QP_KEY", alias="qwen")),
    ],
)  # fmt: skip
def test_golden_units_and_compose_files(
    name: str, config: RunConfig, server: ServerOptions, manifest: Manifest
) -> None:
    """Golden outputs (QUANTPICK_REGEN_GOLDEN=1 rewrites them; review the diff)."""
    program = dataclasses.replace(server, program="/opt/llama.cpp/bin/llama-server")
    cmd = build(config, manifest, server=program)
    plan = f"quantpick plan: golden {name}"
    rendered = {f"{name}.service": render_systemd(cmd, plan, server.alias or manifest.id),
                f"{name}.compose.yaml": render_compose(cmd, plan)}  # fmt: skip
    for file, text in rendered.items():
        path = GOLDEN / file
        if os.environ.get("QUANTPICK_REGEN_GOLDEN") == "1":
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
        assert text == path.read_text(), f"{file} changed (QUANTPICK_REGEN_GOLDEN=1 rewrites it)"


# --- -hf: the file llama-server's downloader picks --------------------------------------------


def test_hf_candidates_follow_find_best_model() -> None:
    listing = ["mmproj-Q4_K_M.gguf", "X-imatrix-Q4_K_M.gguf", "sub/X-UD-Q4_K_M.gguf",
               "X-Q4_K_M.gguf", "X-Q4_K_M_L.gguf", "big/X-Q8_0-00002-of-00002.gguf",
               "big/X-Q8_0-00001-of-00002.gguf", "X-q4_k_m.gguf.part", "README.md"]  # fmt: skip
    assert hf_candidates(listing, "q4_k_m") == ["sub/X-UD-Q4_K_M.gguf", "X-Q4_K_M.gguf"]
    assert hf_candidates(listing, "Q8_0") == ["big/X-Q8_0-00001-of-00002.gguf"]
    assert hf_candidates(listing, "Q4_K") == []  # "Q4_K[.-]": Q4_K_M does not match


def test_hf_model_adds_hf_file_only_when_the_tag_is_ambiguous(manifest: Manifest) -> None:
    hf = hf_model(manifest, "UD-Q4_K_M")
    assert (hf.repo, hf.tag, hf.file) == ("unsloth/Qwen3.6-35B-A3B-GGUF", "UD-Q4_K_M", None)
    first = manifest.quant_files("UD-Q4_K_M")[0]
    twin = dataclasses.replace(first, name="Qwen3.6-35B-A3B-Q4_K_M.gguf", quant="Q4_K_M")
    plain = dataclasses.replace(first, name="plain/Qwen3.6-35B-A3B-UD-Q4_K_M.gguf")
    both = dataclasses.replace(manifest, files=(*manifest.files, twin, plain))
    assert hf_model(both, "UD-Q4_K_M").file == first.name
    assert hf_model(both, "Q4_K_M").file == twin.name  # UD-Q4_K_M also matches "Q4_K_M[.-]"


def test_hf_command(manifest: Manifest) -> None:
    hf = hf_model(manifest, "UD-Q4_K_M")
    cmd = build(RunConfig(ctx_size=32768), manifest, model_path=None, hf=hf)
    assert cmd.argv[1:4] == ("-hf", "unsloth/Qwen3.6-35B-A3B-GGUF:UD-Q4_K_M", "--no-mmproj")
    assert "-m" not in cmd.argv
    assert any("main branch" in w and "sha256" in w for w in cmd.warnings)
    vision = build(RunConfig(vision=True), manifest, model_path=None, hf=hf)
    assert "--no-mmproj" not in vision.argv and "--mmproj" not in vision.argv
    with pytest.raises(UsageError):
        build(RunConfig(), manifest, model_path=None)


def test_hf_flags_pass_the_installed_help(manifest: Manifest) -> None:
    """-hf, --hf-file and --no-mmproj are checked against a real llama-server --help."""
    from quantpick.serve.flags import parse_help

    caps = parse_help((ROOT / "tests" / "data" / "llama-server-help-current.txt").read_text())
    hf = dataclasses.replace(hf_model(manifest, "UD-Q4_K_M"), file="a/b.gguf")
    cmd = build(RunConfig(), manifest, model_path=None, hf=hf, capabilities=caps)
    assert cmd.argv[1:6] == ("-hf", "unsloth/Qwen3.6-35B-A3B-GGUF:UD-Q4_K_M", "--hf-file",
                             "a/b.gguf", "--no-mmproj")  # fmt: skip
    assert not any("dropped" in w for w in cmd.warnings)


def test_compose_with_hf_keeps_the_cache_in_a_volume(manifest: Manifest) -> None:
    yaml = pytest.importorskip("yaml")
    hf = hf_model(manifest, "UD-Q4_K_M")
    cmd = build(RunConfig(devices=(0,)), manifest, model_path=None, hf=hf)
    doc = yaml.safe_load(render_compose(cmd, "plan"))
    service = doc["services"]["llama-server"]
    assert service["command"][:2] == ["-hf", "unsloth/Qwen3.6-35B-A3B-GGUF:UD-Q4_K_M"]
    assert service["environment"]["HF_TOKEN"] == "${HF_TOKEN:-}"  # a reference, never a token
    assert service["volumes"] == [{"type": "volume", "source": "hf-cache", "target": "/hf"}]
    assert "hf-cache" in doc["volumes"]


def test_spec_type_the_build_lacks_is_never_emitted(manifest: Manifest) -> None:
    """A --spec-type value missing from the installed --help: no speculation flags, a warning."""
    from quantpick.serve.flags import parse_help, spec_types

    text = (ROOT / "tests" / "data" / "llama-server-help-current.txt").read_text()
    caps = parse_help(text)
    assert spec_types(caps) is not None and {"draft-mtp", "ngram-mod"} <= spec_types(caps)  # type: ignore[operator]
    ok = build(RunConfig(spec_draft_n=3), manifest, capabilities=caps)
    assert "--spec-type" in ok.argv and not any("spec-type" in w for w in ok.warnings)
    ngram = build(RunConfig(spec_ngram_n=4), manifest, capabilities=caps)
    i = ngram.argv.index("--spec-type")
    assert ngram.argv[i : i + 6] == ("--spec-type", "ngram-mod", "--spec-ngram-mod-n-min", "4",
                                     "--spec-ngram-mod-n-max", "4")  # fmt: skip
    old = parse_help(text.replace("draft-mtp,", ""))
    cmd = build(RunConfig(spec_draft_n=3), manifest, capabilities=old)
    assert "--spec-type" not in cmd.argv and "--spec-draft-n-max" not in cmd.argv
    assert any("no --spec-type draft-mtp" in w for w in cmd.warnings)
