"""quantpick.serve.flags: --help parsing of recorded outputs, command checks, version warnings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from quantpick.errors import QuantpickError
from quantpick.model.manifest import Manifest, Sampling
from quantpick.model.registry import load_manifest_file
from quantpick.plan.memory import RunConfig
from quantpick.serve.command import ENV_VARS, ServerCommand, ServerOptions, build_command
from quantpick.serve.flags import (
    ServerCapabilities,
    capabilities_for,
    check_command,
    parse_help,
    with_version,
)

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = Path(__file__).resolve().parents[2]
MODEL = Path("/models/Qwen3.6-35B-A3B-UD-Q4_K_M.gguf")


def _read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def current() -> ServerCapabilities:
    caps = parse_help(_read("llama-server-help-current.txt"))
    return with_version(caps, _read("llama-server-version-current.txt"))


@pytest.fixture(scope="module")
def old() -> ServerCapabilities:
    caps = parse_help(_read("llama-server-help-old.txt"))
    return with_version(caps, _read("llama-server-version-old.txt"))


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    m = load_manifest_file(ROOT / "manifests" / "qwen3.6-35b-a3b-unsloth.toml")
    return dataclasses.replace(
        m, reasoning=True, sampling=Sampling(temperature=0.6, top_p=0.95, top_k=20, min_p=0.0)
    )


def build(config: RunConfig, manifest: Manifest, caps: ServerCapabilities | None, **kw: object):
    args: dict[str, object] = dict(
        model_path=MODEL, mmproj_path=Path("/models/mmproj.gguf"), manifest=manifest,
        block_count=40, server=ServerOptions(), capabilities=caps,
    )  # fmt: skip
    args.update(kw)
    return build_command(config, **args)  # type: ignore[arg-type]


# The notes' reference plan (single 24 GB GPU, 128k, q8_0 KV, 4 slots, unified) and the other
# shapes quantpick writes.
CONFIGS = {
    "reference": RunConfig(ctx_size=131072, n_parallel=4, kv_unified=True, cache_type_k="q8_0",
                           cache_type_v="q8_0"),
    "split": RunConfig(ctx_size=65536, tensor_split=(26.0, 16.0), devices=(0, 1)),
    "experts": RunConfig(ctx_size=262144, n_cpu_moe=12, ubatch=1024),
    "cpu": RunConfig(ctx_size=2048, n_gpu_layers=0, devices=()),
    "vision": RunConfig(ctx_size=32768, vision=True, kv_offload=False, spec_draft_n=3),
}  # fmt: skip


# --- parsing --------------------------------------------------------------------------------------


def test_parse_current_help(current: ServerCapabilities) -> None:
    fa = current.info("--flash-attn")
    assert fa is not None and fa.names == ("-fa", "--flash-attn")
    assert fa.choices == ("on", "off", "auto") and fa.env == "LLAMA_ARG_FLASH_ATTN"
    assert current.choices("--fit") == ("on", "off")
    assert current.takes_value("-ncmoe") and current.has("--n-cpu-moe")
    assert current.takes_value("-kvu") is False and current.has("--no-kv-unified")
    assert current.choices("-ctk") == (
        "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
    )  # fmt: skip
    assert current.choices("-sm") == ("none", "layer", "row", "tensor")
    assert current.choices("--device") is None  # <dev1,dev2,..> is a list, not choices
    # A flag field longer than 37 characters puts the help on the next line.
    draft = current.info("--spec-draft-n-cpu-moe")
    assert draft is not None and draft.takes_value and "-ncmoed" in draft.names
    assert current.version == "0.5.0-dev" and current.build == 11312


def test_parse_old_help(old: ServerCapabilities) -> None:
    assert old.has("-fa") and old.takes_value("-fa") is False  # a switch, not on|off|auto
    for flag in ("--no-mmap", "--mlock", "--draft-max"):
        assert old.has(flag)
    for flag in ("--fit", "--reasoning", "--n-cpu-moe", "-ot", "-kvu", "--mmproj", "--spec-type"):
        assert not old.has(flag), flag
    assert old.choices("--reasoning-format") == ("deepseek", "none")
    assert old.env_var("-nkvo") == "LLAMA_ARG_NO_KV_OFFLOAD"
    assert old.build == 4719 and old.version is None


def test_parse_ignores_noise() -> None:
    text = "load_backend: loaded CPU backend\n----- common params -----\n\n# -x comment\n"
    assert parse_help(text).flags == {}


def test_static_env_table_matches_current_help(current: ServerCapabilities) -> None:
    for flag, env in ENV_VARS.items():
        assert current.env_var(flag) == env, flag


# --- checking -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_generated_commands_pass_the_current_help(
    name: str, current: ServerCapabilities, manifest: Manifest
) -> None:
    unchecked = build(CONFIGS[name], manifest, None)
    assert check_command(unchecked.argv, current) == []
    checked = build(CONFIGS[name], manifest, current)
    assert checked.argv[1:] == unchecked.argv[1:]
    assert not any(w.startswith("dropped") for w in checked.warnings)


def test_check_reports_unknown_flags_values_and_choices(old: ServerCapabilities) -> None:
    cmd = ServerCommand(
        ("llama-server", "-m", "/m.gguf", "--fit", "off", "-fa", "on", "-ctk", "q3_0",
         "--n-cpu-moe", "4"),
        {}, (), "",
    )  # fmt: skip
    problems = {p.flag: p for p in check_command(cmd.argv, old)}
    assert set(problems) == {"--fit", "-fa", "-ctk", "--n-cpu-moe"}
    assert not problems["--fit"].required and problems["--n-cpu-moe"].required
    assert "takes no value" in problems["-fa"].message
    assert "q3_0" in problems["-ctk"].message


def test_old_build_adapts_and_drops(old: ServerCapabilities, manifest: Manifest) -> None:
    cmd = build(CONFIGS["reference"], manifest, old)
    argv = list(cmd.argv)
    assert "-fa" in argv and argv[argv.index("-fa") + 1] != "on"  # the switch form
    assert "--fit" not in argv and "-kvu" not in argv
    assert any("no -kvu" in w for w in cmd.warnings)
    assert check_command(cmd.argv, old) == []


def test_missing_optional_flag_is_dropped_with_a_warning(
    current: ServerCapabilities, manifest: Manifest
) -> None:
    flags = {
        k: v
        for k, v in current.flags.items()
        if k not in ("--temp", "--temperature", "--jinja", "--no-jinja")
    }
    caps = dataclasses.replace(current, flags=flags)
    cmd = build(CONFIGS["reference"], manifest, caps)
    assert "--temp" not in cmd.argv and "--jinja" not in cmd.argv and "--top-p" in cmd.argv
    assert any(w.startswith("dropped --temp") for w in cmd.warnings)
    assert any(w.startswith("dropped --jinja") for w in cmd.warnings)


@pytest.mark.parametrize("name", ["experts", "vision"])
def test_missing_required_flag_fails_with_upgrade_hint(
    name: str, old: ServerCapabilities, manifest: Manifest
) -> None:
    with pytest.raises(QuantpickError) as err:
        build(CONFIGS[name], manifest, old)
    assert "cannot run this plan" in err.value.message
    assert err.value.hint is not None and "upgrade llama.cpp" in err.value.hint


def test_n_cpu_moe_falls_back_to_override_tensor(
    current: ServerCapabilities, manifest: Manifest
) -> None:
    flags = {k: v for k, v in current.flags.items() if k not in ("-ncmoe", "--n-cpu-moe")}
    cmd = build(CONFIGS["experts"], manifest, dataclasses.replace(current, flags=flags))
    ot = cmd.argv[cmd.argv.index("-ot") + 1]
    assert ot == r"blk\.(0|1|2|3|4|5|6|7|8|9|10|11)\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU"


def test_no_device_flag_uses_cuda_visible_devices(
    current: ServerCapabilities, manifest: Manifest
) -> None:
    flags = {k: v for k, v in current.flags.items() if k not in ("-dev", "--device")}
    cfg = RunConfig(
        devices=(1, 0), tensor_split=(3.0, 1.0), override_tensors=(("blk\\.3\\.", "CUDA1"),)
    )
    cmd = build(cfg, manifest, dataclasses.replace(current, flags=flags))
    assert "--device" not in cmd.argv
    assert cmd.env == {"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    # Physical GPU 1 is CUDA0 once CUDA_VISIBLE_DEVICES reorders them.
    assert cmd.argv[cmd.argv.index("-ot") + 1] == "blk\\.3\\.=CUDA0"


# --- versions -------------------------------------------------------------------------------------


def test_old_build_warns_it_cannot_load_qwen35moe(
    old: ServerCapabilities, manifest: Manifest
) -> None:
    cmd = build(CONFIGS["reference"], manifest, old)
    (warning,) = [w for w in cmd.warnings if "qwen35moe" in w]
    assert "build 4719" in warning and "fail to load" in warning and "b7988" in warning


def test_current_semver_build_has_no_version_warning(
    current: ServerCapabilities, manifest: Manifest
) -> None:
    cmd = build(CONFIGS["reference"], manifest, current)
    assert not any("qwen35moe" in w for w in cmd.warnings)
    assert cmd.target.startswith("llama-server 0.5.0-dev (build 1")


def test_build_1_of_a_shallow_clone_counts_as_unknown(
    current: ServerCapabilities, manifest: Manifest
) -> None:
    caps = with_version(current, "version: 1 (0c1e570)\n")
    cmd = build(CONFIGS["reference"], manifest, caps)
    (warning,) = [w for w in cmd.warnings if "qwen35moe" in w]
    assert "shallow clone" in warning and "fail to load" not in warning


def test_new_enough_old_style_build_has_no_warning(
    current: ServerCapabilities, manifest: Manifest
) -> None:
    cmd = build(CONFIGS["reference"], manifest, with_version(current, "version: 8100 (abcdef1)"))
    assert not any("qwen35moe" in w for w in cmd.warnings)


# --- running --help -------------------------------------------------------------------------------


def _fake_server(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "llama-server"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return p


def test_capabilities_for_runs_help_and_version(tmp_path: Path) -> None:
    help_file, version_file = (
        DATA / "llama-server-help-current.txt",
        DATA / "llama-server-version-current.txt",
    )
    fake = _fake_server(
        tmp_path,
        f'if [ "$1" = --help ]; then cat "{help_file}"; else cat "{version_file}" >&2; fi\n',
    )
    caps = capabilities_for(fake)
    assert caps.has("--fit") and caps.path == str(fake)
    assert (caps.version, caps.build, caps.commit) == ("0.5.0-dev", 11312, "0c1e57098")


def test_capabilities_for_times_out(tmp_path: Path) -> None:
    fake = _fake_server(tmp_path, "exec sleep 5\n")
    with pytest.raises(QuantpickError, match="did not finish"):
        capabilities_for(fake, timeout_s=0.3)


def test_capabilities_for_rejects_non_help_output(tmp_path: Path) -> None:
    with pytest.raises(QuantpickError, match="lists no options"):
        capabilities_for(_fake_server(tmp_path, "echo hello\n"))


def test_capabilities_for_stops_a_help_that_floods(tmp_path: Path) -> None:
    # Before: `--help` read whole, a flood ended in MemoryError.
    fake = _fake_server(tmp_path, "exec yes -- '--flag N    some help text'\n")
    with pytest.raises(QuantpickError, match="--help printed more than 1 MiB"):
        capabilities_for(fake, timeout_s=30)


def test_capabilities_for_kills_what_a_hung_help_started(tmp_path: Path) -> None:
    pidfile = tmp_path / "helper.pid"
    fake = _fake_server(tmp_path, f"sleep 300 & echo $! > {pidfile}\nwait\n")
    with pytest.raises(QuantpickError, match="did not finish in 0.5 s"):
        capabilities_for(fake, timeout_s=0.5)
    import os
    import time

    pid = int(pidfile.read_text())
    for _ in range(150):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError("the help's child is still running")
