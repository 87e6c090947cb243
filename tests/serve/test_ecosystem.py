"""serve/formats/ (preset, llama_swap, ollama, lmstudio): the router preset section and its
merge into an INI file, --models-max, the llama-swap entry (read back with a real YAML parser and
POSIX word splitting, as llama-swap does), the Ollama Modelfile and the LM Studio links."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
import yaml

from quantpick.errors import QuantpickError, UsageError
from quantpick.model.manifest import Sampling
from quantpick.outputs import OutputRefused
from quantpick.plan.memory import RunConfig
from quantpick.serve.command import ServerOptions, build_command
from quantpick.serve.formats.config_file import open_config
from quantpick.serve.formats.llama_swap import merge_swap_config, swap_entry
from quantpick.serve.formats.lmstudio import link_into_lmstudio, lmstudio_folder
from quantpick.serve.formats.ollama import ollama_modelfile, ollama_name
from quantpick.serve.formats.preset import (
    merge_preset,
    models_max,
    planned_sections,
    preset_section,
    router_line,
)
from quantpick.serve.formats.target import DeviceUse, Target
from quantpick.units import GiB

MODEL = Path("/models/Tiny Q8_0.gguf")  # a space: one argument, one INI value


def command(config: RunConfig | None = None, model: Path = MODEL, **server: object):  # type: ignore[no-untyped-def]
    return build_command(
        config or RunConfig(ctx_size=8192, devices=()),
        model_path=model, mmproj_path=None, manifest=None, block_count=40,
        server=ServerOptions(alias="tiny", **server),  # type: ignore[arg-type]
        capabilities=None,
    )  # fmt: skip


def target(**changes: object) -> Target:
    base = dict(
        name="tiny", quant="Q8_0", plan_comment="quantpick plan: tiny Q8_0 on CPU",
        ctx_size=8192, n_parallel=1, n_gpu_layers=0, model_files=(MODEL,),
        devices=(DeviceUse("CPU", 2 * GiB, 20 * GiB),), machine_key="box1",
    )  # fmt: skip
    base.update(changes)
    return Target(**base)  # type: ignore[arg-type]


# ---- preset -------------------------------------------------------------------------------------


def test_section_has_the_plans_flags_under_llama_cpp_keys() -> None:
    config = RunConfig(ctx_size=8192, devices=(0, 1), tensor_split=(27.0, 15.0), n_cpu_moe=3,
                       kv_unified=True, n_parallel=2, cache_type_k="q8_0",
                       cache_type_v="q8_0")  # fmt: skip
    lines, warnings = preset_section(command(config), target())
    assert lines[0] == "[tiny]" and lines[1].startswith("; written by quantpick ")
    assert lines[2] == "; quantpick plan: tiny Q8_0 on CPU"
    assert lines[3] == f"; quantpick-memory: machine=box1 CPU={2 * GiB}/{20 * GiB}"
    keys = dict(line.split(" = ", 1) for line in lines[4:])
    assert keys["model"] == str(MODEL) and keys["ctx-size"] == "8192"
    assert keys["tensor-split"] == "27,15" and keys["n-cpu-moe"] == "3"
    assert keys["kv-unified"] == "true" and keys["parallel"] == "2"
    assert keys["cache-type-k"] == "q8_0" and keys["device"] == "CUDA0,CUDA1"
    assert keys["fit"] == "off" and keys["jinja"] == "true"
    assert not {"host", "port", "alias"} & set(keys)  # the router sets them per child
    assert warnings == []


def test_override_tensors_become_one_comma_list() -> None:
    config = RunConfig(ctx_size=4096, devices=(0,),
                       override_tensors=(("blk\\.1\\.ffn_up_exps", "CPU"),
                                         ("blk\\.2\\.ffn_up_exps", "CPU")))  # fmt: skip
    lines, _ = preset_section(command(config), target())
    [ot] = [line for line in lines if line.startswith("override-tensor")]
    assert ot == "override-tensor = blk\\.1\\.ffn_up_exps=CPU,blk\\.2\\.ffn_up_exps=CPU"


@pytest.mark.parametrize("name", ["a;b.gguf", "a#b.gguf", "trailing-space.gguf "])
def test_values_the_ini_reader_would_cut_are_refused(name: str) -> None:
    with pytest.raises(UsageError, match="cannot be written in a llama.cpp preset"):
        preset_section(command(model=Path("/m") / name), target())


def test_an_api_key_goes_on_the_router_line_not_the_preset() -> None:
    cmd = command(api_key_env="MY_KEY")
    lines, warnings = preset_section(cmd, target())
    assert not any("api" in line.lower() for line in lines[3:])
    assert warnings and "drops API keys" in warnings[0]
    line = router_line("llama-server", Path("/p.ini"), 2, cmd, "127.0.0.1", 8080)
    assert line.startswith('LLAMA_API_KEY="$MY_KEY" llama-server --models-preset /p.ini')


OTHER = """\
; my presets
version = 1

[*]
c = 4096   ; for all

[other-model]
model = /m/other.gguf
; a comment about the next one

[ggml-org/gemma:Q4_K_M]
ngl = 99
"""


def test_merge_adds_a_section_and_leaves_every_other_byte() -> None:
    section, _ = preset_section(command(), target())
    text, replaced = merge_preset(OTHER, "tiny", section)
    assert not replaced
    assert text.startswith(OTHER) and text[len(OTHER) :] == "\n" + "\n".join(section) + "\n"


def test_merge_replaces_its_section_in_place_and_drops_later_copies() -> None:
    old, _ = preset_section(command(), target())
    first, _ = merge_preset(OTHER, "tiny", old)
    duplicated = first + "\n[tiny]\nmodel = /stale.gguf\n"
    new, _ = preset_section(command(RunConfig(ctx_size=16384, devices=())), target())
    with pytest.raises(OutputRefused, match=r"the section \[tiny\] was not written by quantpick"):
        merge_preset(duplicated, "tiny", new)  # the second copy was written by hand
    text, replaced = merge_preset(duplicated, "tiny", new, force=True)
    assert replaced and "ctx-size = 16384" in text and "/stale.gguf" not in text
    assert text.startswith(OTHER) and text.count("[tiny]") == 1
    # the comment that introduces the next section stays where it was
    moved, _ = merge_preset(OTHER, "other-model", ["[other-model]", "model = /m/new.gguf"],
                                force=True)  # fmt: skip
    assert "model = /m/new.gguf\n; a comment about the next one\n\n[ggml-org" in moved
    assert moved.split("[other-model]")[0] == OTHER.split("[other-model]")[0]


def test_merge_keeps_crlf_files_crlf() -> None:
    crlf = OTHER.replace("\n", "\r\n")
    section, _ = preset_section(command(), target())
    text, _ = merge_preset(crlf, "tiny", section)
    assert text.startswith(crlf) and "\n" not in text.replace("\r\n", "")


def test_a_new_file_has_the_version_line() -> None:
    text, replaced = merge_preset(None, "tiny", ["[tiny]", "model = /m.gguf"])
    assert not replaced and "version = 1\n" in text and text.endswith("model = /m.gguf\n")


def _planned(name: str, machine: str, cpu: int, gpu: int | None = None) -> list[str]:
    devices = [DeviceUse("CPU", cpu * GiB, 20 * GiB)]
    if gpu is not None:
        devices.insert(0, DeviceUse("CUDA0", gpu * GiB, 22 * GiB))
    lines, _ = preset_section(
        command(), target(name=name, machine_key=machine, devices=tuple(devices))
    )
    return lines


def test_models_max_is_the_largest_count_whose_worst_case_fits() -> None:
    text = None
    for name, gpu in (("a", 10), ("b", 8), ("c", 6), ("d", 3)):
        text, _ = merge_preset(text, name, _planned(name, "box1", 1, gpu))
    text, _ = merge_preset(text, "elsewhere", _planned("elsewhere", "box2", 1, 21))
    text += "\n[hand-written]\nmodel = /x.gguf\n"
    planned, others = planned_sections(text)
    assert [p.name for p in planned] == ["a", "b", "c", "d", "elsewhere"]
    assert others == ["hand-written"]
    current = target(machine_key="box1", devices=(DeviceUse("CUDA0", 3 * GiB, 22 * GiB),
                                                  DeviceUse("CPU", GiB, 20 * GiB)))  # fmt: skip
    limit = models_max(planned, current)
    # 10 + 8 = 18 GiB fit in 22; the three largest, 24, do not (the box2 plan is not counted)
    assert (limit.value, limit.counted) == (2, 4)
    assert "any 2 of the 4 models" in limit.reason and "CUDA0" in limit.reason
    roomy = target(machine_key="box1", devices=(DeviceUse("CUDA0", 3 * GiB, 80 * GiB),))
    assert models_max(planned, roomy).value == 4


def test_a_config_file_keeps_the_old_version_and_its_mode(tmp_path: Path) -> None:
    real = tmp_path / "real.ini"
    real.write_text("old\n")
    real.chmod(0o600)
    written = open_config(real, "--preset").write("new\n")
    assert written.path == real and real.read_text() == "new\n"
    assert written.backup == tmp_path / "real.ini.bak" and written.backup.read_text() == "old\n"
    assert (real.stat().st_mode & 0o777) == 0o600 and (written.backup.stat().st_mode & 0o077) == 0
    fresh = open_config(tmp_path / "fresh.ini", "--preset").write("x\n")
    assert fresh.created and fresh.backup is None


def test_a_link_at_a_config_path_is_never_written_through(tmp_path: Path) -> None:
    """A symlink at --preset is refused; with --force the link itself is replaced by a regular
    file and its target is left as it was (it may be any file, /etc/... as root)."""
    target_file = tmp_path / "elsewhere.ini"
    target_file.write_text("theirs\n")
    link = tmp_path / "link.ini"
    link.symlink_to(target_file)
    with pytest.raises(OutputRefused, match="is a symbolic link") as info:
        open_config(link, "--preset")
    assert info.value.exit_code == 2 and info.value.hint and "--force" in info.value.hint
    written = open_config(link, "--preset", force=True).write("new\n")
    assert not link.is_symlink() and link.read_text() == "new\n" and written.backup is None
    assert target_file.read_text() == "theirs\n"


# ---- llama-swap -----------------------------------------------------------------------------


def _swap_argv(doc: dict, name: str) -> list[str]:
    """What llama-swap runs: lines starting with '#' dropped, POSIX word splitting, ${PORT}."""
    cmd = doc["models"][name]["cmd"]
    kept = "\n".join(line for line in cmd.split("\n") if not line.strip().startswith("#"))
    return [w.replace("${PORT}", "5800") for w in shlex.split(kept, posix=True)]


def test_swap_entry_parses_back_to_the_plans_argv() -> None:
    cmd = command(RunConfig(ctx_size=8192, devices=(0,)))
    entry = swap_entry(cmd, target(plan_comment="plan with 'quotes' and $HOME\nline 2"), ttl=60)
    doc = yaml.safe_load("models:\n" + "\n".join(entry) + "\n")
    model = doc["models"]["tiny"]
    assert model["ttl"] == 60 and model["proxy"] == "http://127.0.0.1:${PORT}"
    assert model["checkEndpoint"] == "/health" and model["env"] == ["CUDA_DEVICE_ORDER=PCI_BUS_ID"]
    argv = _swap_argv(doc, "tiny")
    expected = [w for w in cmd.argv if w not in ("--host", "127.0.0.1", "--port", "8080")]
    assert argv[: len(expected)] == expected and str(MODEL) in argv
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", "5800"]


def test_swap_refuses_what_llama_swap_would_rewrite() -> None:
    with pytest.raises(UsageError, match="macro"):
        swap_entry(command(model=Path("/m/${HOME}.gguf")), target())


SWAP = """\
healthCheckTimeout: 300   # slow disks
models:
    other:
        cmd: llama-server -m /x.gguf --port ${PORT}
        ttl: 60
    'tiny':
        cmd: old
        ttl: 5

    # a group comes next
groups:
  g: {members: [other]}
"""


def test_swap_merge_replaces_the_entry_and_nothing_else() -> None:
    entry = swap_entry(command(), target(), ttl=30)
    text, replaced = merge_swap_config(SWAP, "tiny", entry, force=True)  # SWAP's: by hand
    assert replaced
    before, after = SWAP.split("    'tiny':")
    assert text.startswith(before)
    assert text.endswith("\n    # a group comes next\ngroups:\n  g: {members: [other]}\n")
    doc = yaml.safe_load(text)
    assert doc["models"]["other"] == yaml.safe_load(SWAP)["models"]["other"]
    assert doc["models"]["tiny"]["ttl"] == 30 and doc["groups"] == {"g": {"members": ["other"]}}
    assert doc["healthCheckTimeout"] == 300
    again, replaced_again = merge_swap_config(text, "tiny", entry)
    assert replaced_again and again == text  # idempotent


def test_swap_merge_adds_an_entry_or_a_models_block() -> None:
    entry = swap_entry(command(), target())
    added, replaced = merge_swap_config(SWAP.replace("'tiny'", "'small'"), "tiny", entry)
    assert not replaced and set(yaml.safe_load(added)["models"]) == {"other", "small", "tiny"}
    fresh, _ = merge_swap_config("healthCheckTimeout: 60\n", "tiny", entry)
    assert set(yaml.safe_load(fresh)) == {"healthCheckTimeout", "models"}
    with pytest.raises(UsageError, match="not a block mapping"):
        merge_swap_config("models: {}\n", "tiny", entry)


# ---- Ollama ---------------------------------------------------------------------------------


def test_modelfile_carries_the_file_context_and_sampling() -> None:
    t = target(ctx_size=16384, n_parallel=2, n_gpu_layers=41, cache_type_k="q8_0",
               cache_type_v="q8_0", sampling=Sampling(0.6, 0.95, 20, 0.0),
               chat_template="{% for m in messages %}<|im_start|>{{ m.role }}...")  # fmt: skip
    text, cannot = ollama_modelfile(command(), t)
    lines = text.splitlines()
    assert f"FROM {MODEL}" in lines and "PARAMETER num_ctx 8192" in lines  # per slot
    assert "PARAMETER num_gpu 41" in lines and "PARAMETER temperature 0.6" in lines
    assert "PARAMETER top_k 20" in lines and 'PARAMETER stop "<|im_end|>"' in lines
    assert any(line.startswith('TEMPLATE """{{- range .Messages }}') for line in lines)
    assert "OLLAMA_KV_CACHE_TYPE=q8_0" in text and "OLLAMA_NUM_PARALLEL=2" in text
    assert cannot == []
    named = target(name="Qwen3.8 35B", quant="UD-Q4_K_XL")
    assert ollama_name(named) == "qwen3.8-35b:ud-q4_k_xl"


def test_modelfile_says_plainly_what_ollama_cannot_express() -> None:
    t = target(n_cpu_moe=12, tensor_split=(27.0, 15.0), chat_template="{{ bos_token }}")
    text, cannot = ollama_modelfile(command(), t)
    assert any("--n-cpu-moe 12" in c and "cannot express" in c for c in cannot)
    assert any("-ts 27,15" in c for c in cannot)
    assert "# Not expressible in Ollama: the plan needs expert offload" in text
    assert "TEMPLATE" not in text.replace("no TEMPLATE", "")


# ---- LM Studio ------------------------------------------------------------------------------


def test_lmstudio_links_never_move_and_never_replace(tmp_path: Path) -> None:
    model = tmp_path / "dl" / "Tiny-Q8_0.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF" + b"\0" * 100)
    t = target(model_files=(model,), hf_repo="org/Tiny-GGUF")
    models_dir = tmp_path / "lms" / "models"
    [linked] = link_into_lmstudio(t, models_dir)
    dest = models_dir / "org" / "Tiny-GGUF" / "Tiny-Q8_0.gguf"
    assert linked.dest == dest and linked.action == "hardlink"
    assert model.is_file() and os.path.samefile(model, dest)  # still there, same bytes
    [again] = link_into_lmstudio(t, models_dir)
    assert again.action == "present"
    dest.unlink()
    dest.write_bytes(b"someone else's")
    with pytest.raises(QuantpickError, match="already has a different file"):
        link_into_lmstudio(t, models_dir)
    assert dest.read_bytes() == b"someone else's"
    assert lmstudio_folder(target(hf_repo=None)) == ("quantpick", "tiny")
