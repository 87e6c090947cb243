"""File name -> quant tag / role / shard, and grouping a repository listing into quants."""

from __future__ import annotations

import pytest

from quantpick.model.gguf_names import group_gguf_files, parse_gguf_name, quant_tag


@pytest.mark.parametrize(
    ("name", "quant", "role", "shard"),
    [
        ("Qwen3.6-35B-A3B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL", "model", None),
        ("Qwen3.6-35B-A3B-UD-IQ4_NL_XL.gguf", "UD-IQ4_NL_XL", "model", None),
        ("Qwen3.8-35B-A3B-IQ2_M.gguf", "IQ2_M", "model", None),
        ("Qwen3.8-35B-A3B-Q8_0.gguf", "Q8_0", "model", None),
        ("Qwen3.6-35B-A3B-MXFP4_MOE.gguf", "MXFP4_MOE", "model", None),
        ("Qwen3.6-35B-A3B-UD-Q8_K_XL.gguf", "UD-Q8_K_XL", "model", None),
        ("model.Q5_K_S.gguf", "Q5_K_S", "model", None),
        ("qwen2.5-0.5b-instruct-q4_k_m.gguf", "Q4_K_M", "model", None),
        ("qwen2.5-0.5b-instruct-fp16.gguf", "F16", "model", None),
        ("llama-3-8b-Q4_0.gguf", "Q4_0", "model", None),
        ("Model-IQ3_XXS.gguf", "IQ3_XXS", "model", None),
        ("BF16/Qwen3.6-35B-A3B-BF16-00002-of-00003.gguf", "BF16", "model", (2, 3)),
        ("Q8_0/Model-00001-of-00002.gguf", "Q8_0", "model", (1, 2)),  # tag from the folder
        ("mmproj-Qwen3.8-35B-A3B-F16.gguf", "F16", "mmproj", None),
        ("mmproj-BF16.gguf", "BF16", "mmproj", None),
        ("mmproj.gguf", "F16", "mmproj", None),
        ("Qwen3.6-35B-A3B.gguf", None, "model", None),
        # "3B" in the model name and "K" alone are not tags; the last real tag wins
        ("Q4_K_M-retrained-Q6_K.gguf", "Q6_K", "model", None),
    ],
)
def test_parse(name: str, quant: str | None, role: str, shard: tuple[int, int] | None) -> None:
    parsed = parse_gguf_name(name)
    assert parsed is not None
    assert (parsed.quant, parsed.role) == (quant, role)
    assert (None if parsed.shard is None else (parsed.shard, parsed.shard_count)) == shard


@pytest.mark.parametrize("name", ["README.md", "SHA256SUMS", "config.json", "model.gguf.part"])
def test_non_gguf_files_are_ignored(name: str) -> None:
    assert parse_gguf_name(name) is None


def test_impossible_shard_number_has_no_quant() -> None:
    parsed = parse_gguf_name("m-Q4_K_M-00004-of-00003.gguf")
    assert parsed is not None and parsed.quant is None


def test_quant_tag_needs_boundaries() -> None:
    assert quant_tag("SQ4_K_MX") is None
    assert quant_tag("x-q4_k_m") == "Q4_K_M"


def test_grouping() -> None:
    names = [
        "README.md",
        "SHA256SUMS",
        "M-Q4_K_M.gguf",
        "M-UD-Q4_K_XL.gguf",
        "BF16/M-BF16-00002-of-00002.gguf",
        "BF16/M-BF16-00001-of-00002.gguf",
        "Q8_0/M-Q8_0-00001-of-00003.gguf",  # shard 2 and 3 missing
        "M-v2-Q4_K_M.gguf",  # a second Q4_K_M set: the first by name wins
        "mmproj-F16.gguf",
        "mmproj-BF16.gguf",
        "M.gguf",
    ]
    groups, skipped = group_gguf_files(names)
    by = {(g.role, g.quant): [f.name for f in g.files] for g in groups}
    assert by == {
        ("model", "BF16"): ["BF16/M-BF16-00001-of-00002.gguf", "BF16/M-BF16-00002-of-00002.gguf"],
        ("model", "Q4_K_M"): ["M-Q4_K_M.gguf"],
        ("model", "UD-Q4_K_XL"): ["M-UD-Q4_K_XL.gguf"],
        ("mmproj", "F16"): ["mmproj-F16.gguf"],
        ("mmproj", "BF16"): ["mmproj-BF16.gguf"],
    }
    reasons = dict(skipped)
    assert "incomplete split set" in reasons["Q8_0/M-Q8_0-00001-of-00003.gguf"]
    assert "already M-Q4_K_M.gguf" in reasons["M-v2-Q4_K_M.gguf"]
    assert "no quant tag" in reasons["M.gguf"]
    assert "README.md" not in reasons
