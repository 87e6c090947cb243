"""The family tensor tables (Family.tensor_shapes) against headers llama.cpp loaded.

tests/data/arch-real/<config>.json holds the header of a full-size file of a real model config
(tests/arch_configs.py) that llama-fit-params loaded in every case recorded there
(scripts/record_arch_real.py). llama.cpp's loader refuses a file with a tensor it did not ask for
("wrong number of tensors"), a wrong shape or a missing required tensor, so a recorded header is
the loader's answer; each table must keep producing exactly it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from arch_configs import BY_NAME, CONFIGS
from arch_fixtures import tensor_type, write_header_only

from quantpick.arch.registry import family_of, tensor_shapes
from quantpick.model.gguf import architecture_from_metadata, header_from_json, read_gguf_file

DATA = Path(__file__).resolve().parents[1] / "data" / "arch-real"
RECORDED = sorted(DATA.glob("*.json"))
# Every architecture that has a table must have a recorded real config behind it.
TABLED = frozenset({
    "llama", "mistral3", "qwen2", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next",
    "glm4moe", "gpt-oss", "gemma3", "gemma4", "deepseek2", "nemotron_h", "lfm2",
})  # fmt: skip


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_table_equals_the_header_llama_cpp_loaded(path: Path) -> None:
    doc = _load(path)
    header = header_from_json(doc["header"])
    arch = architecture_from_metadata(header.metadata, {t.name for t in header.tensors})
    fam = family_of(arch.name)
    assert fam is not None and fam.tensor_shapes is not None
    table = tensor_shapes(arch)
    assert table is not None, arch.name
    want = {t.name: t.shape for t in header.tensors}
    got = dict(table)
    assert len(got) == len(table), "a table lists a tensor twice"
    assert sorted(set(got) - set(want)) == [] and sorted(set(want) - set(got)) == []
    assert {n: s for n, s in got.items() if want[n] != s} == {}
    # ... and llama.cpp loaded that header in every recorded case
    assert doc["cases"] and all(c["exit_code"] == 0 and c["mib"] for c in doc["cases"])


def test_every_tabled_architecture_has_a_recorded_real_config() -> None:
    recorded = {_load(p)["arch"] for p in RECORDED}
    assert TABLED <= recorded, sorted(TABLED - recorded)
    for name in TABLED:  # and the families say they have a table for it
        fam = family_of(name)
        assert fam is not None and fam.tensor_shapes is not None, name
    assert {c.arch for c in CONFIGS} == TABLED


def test_an_architecture_without_a_table_gets_none() -> None:
    # gemma2 is in the gemma family but has no table: a layout then needs the header
    from quantpick.arch.registry import architecture

    arch = architecture("gemma2", block_count=2, embedding_length=64, vocab_size=128)
    assert tensor_shapes(arch) is None


def test_the_writer_reproduces_the_recorded_header(tmp_path: Path) -> None:
    """The configs and the writer still make the file llama.cpp was shown (else re-record)."""
    for cfg in (BY_NAME["lfm2-1.2b"], BY_NAME["gemma-4-e2b"]):
        path = tmp_path / f"{cfg.name}.gguf"
        size = write_header_only(path, cfg.architecture, cfg.quant, name=cfg.name, file_type=False)
        doc = _load(DATA / f"{cfg.name}.json")
        got, want = read_gguf_file(path), header_from_json(doc["header"])
        assert size == doc["file_bytes"] == path.stat().st_size
        assert got.tensors == want.tensors
        assert got.metadata == want.metadata


@pytest.mark.parametrize(
    ("name", "ne", "quant", "tied", "want"),
    [
        ("blk.0.attn_q.weight", (4096, 4096), "Q4_K_M", False, "Q4_K"),
        ("output.weight", (4096, 128256), "Q4_K_M", False, "Q6_K"),
        ("token_embd.weight", (2048, 65536), "Q4_K_M", True, "Q6_K"),  # tied: the output
        ("token_embd.weight", (2048, 65536), "Q4_K_M", False, "Q4_K"),
        ("blk.0.attn_q.weight", (2880, 4096), "Q4_K_M", False, "Q5_0"),  # 2880 % 256 != 0
        ("blk.0.attn_k_b.weight", (128, 512, 128), "Q4_K_M", False, "Q5_0"),
        ("blk.0.ssm_a", (1, 128), "Q4_K_M", False, "F32"),  # no .weight suffix
        ("blk.0.ffn_gate_inp.weight", (2048, 128), "Q8_0", False, "F32"),
        ("blk.0.ffn_down_exps.weight", (2880, 2880, 32), "MXFP4_MOE", False, "MXFP4"),
        ("blk.0.attn_q.weight", (2880, 4096), "MXFP4_MOE", False, "Q8_0"),
        ("blk.0.ffn_gate_exps.bias", (2880, 32), "MXFP4_MOE", False, "F32"),
        ("blk.0.attn_q.weight", (100, 64), "Q8_0", False, "F16"),  # no 32-block fits
    ],
)
def test_tensor_types_follow_llama_quantize(
    name: str, ne: tuple[int, ...], quant: str, tied: bool, want: str
) -> None:
    assert tensor_type(name, ne, quant, tied=tied) == want


@pytest.mark.llamacpp
@pytest.mark.parametrize("name", [c.name for c in CONFIGS])
def test_llama_fit_params_loads_the_header_only_file(
    llamacpp_bin: Path, tmp_path: Path, name: str
) -> None:
    cfg = BY_NAME[name]
    path = tmp_path / f"{name}.gguf"
    write_header_only(path, cfg.architecture, cfg.quant, name=name)
    argv = [str(llamacpp_bin / "llama-fit-params"), "-m", str(path), "-c", "4096",
            "-dev", "none", "--fit-print", "on", "-fit", "off"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    host = [line.split() for line in proc.stdout.splitlines() if line.startswith("Host ")]
    assert host and int(host[0][1]) > 0, proc.stdout[-2000:]
