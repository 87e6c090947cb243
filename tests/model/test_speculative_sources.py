"""The model view of speculative decoding: NextN blocks, mtp- sidecars, draft siblings."""

from __future__ import annotations

from dataclasses import replace

from quantpick.model.layout import synthesize_layout
from quantpick.model.registry import bundled_manifest_dir, load_manifest_file
from quantpick.model.speculative import (
    SpecKind,
    Vocabulary,
    draft_siblings,
    find_sidecar,
    quant_bits,
    quant_tag,
    spec_sources,
    vocab_problem,
)


def test_quant_tag_and_bits_follow_get_gguf_split_info() -> None:
    assert quant_tag("Qwen3.6-35B-A3B-UD-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_tag("dir/model-Q8_0-00001-of-00003.gguf") == "Q8_0"
    assert quant_bits("model-F16.gguf") == 16
    assert quant_bits("model.gguf") == 0


def test_sidecar_prefers_same_directory_exact_tag_then_closest_bits() -> None:
    files = (
        "Qwen-Q4_K_M.gguf",
        "mtp-Qwen-Q8_0.gguf",
        "mtp-Qwen-Q4_K_M.gguf",
        "other/mtp-Qwen-Q4_K_M.gguf",
        "mmproj-F16.gguf",
    )
    assert find_sidecar(files, "Qwen-Q4_K_M.gguf") == "mtp-Qwen-Q4_K_M.gguf"
    assert find_sidecar(files, "Qwen-Q4_K_M.gguf", "Q8_0") == "mtp-Qwen-Q8_0.gguf"
    # no tag: the closest bits to the model's (5: Q4 at 1 beats Q8 at 3)
    assert find_sidecar(("mtp-a-Q8_0.gguf", "mtp-a-Q4_0.gguf"), "a-Q5_K_M.gguf") == (
        "mtp-a-Q4_0.gguf"
    )
    # a sidecar in another directory than the model's is not the model's
    assert find_sidecar(("x/mtp-a-Q4_0.gguf",), "y/a-Q4_0.gguf") is None
    assert find_sidecar(("a-Q4_0.gguf",), "a-Q4_0.gguf") is None


def test_vocab_problem_mirrors_common_speculative_are_compatible() -> None:
    qwen = Vocabulary("gpt2", "qwen35", 248320, eos=248046)
    assert vocab_problem(qwen, Vocabulary("gpt2", "qwen35", 248320 + 100)) is None
    assert "differs" in (vocab_problem(qwen, Vocabulary("gpt2", "qwen2", 151936)) or "")
    assert "tokenizer" in (vocab_problem(qwen, Vocabulary("llama", "qwen35", 248320)) or "")
    assert "by more than 128" in (vocab_problem(qwen, Vocabulary("gpt2", "", 248320 + 129)) or "")
    # the EOS (BOS) id matters only where both add it (llama_vocab_get_add_eos)
    assert vocab_problem(qwen, Vocabulary("gpt2", "qwen35", 248320, eos=1)) is None
    adds = Vocabulary("gpt2", "qwen35", 248320, eos=248046, add_eos=True)
    assert "EOS" in (vocab_problem(adds, replace(adds, eos=1)) or "")
    no_bos = replace(qwen, add_bos=False)
    assert "adds BOS" in (vocab_problem(no_bos, replace(qwen, add_bos=True, bos=1)) or "")
    assert "add" in (vocab_problem(replace(qwen, add_bos=True), replace(qwen, add_bos=False)) or "")
    # the pre-tokenizer is not compared (llama.cpp does not)
    assert vocab_problem(qwen, replace(qwen, pre="qwen2")) is None
    # token texts from id 5 on, below the smaller size
    t = tuple(f"t{i}" for i in range(300))
    with_tokens = replace(qwen, n_vocab=300, tokens=t)
    assert vocab_problem(with_tokens, replace(with_tokens, tokens=("x",) * 5 + t[5:])) is None
    odd = replace(with_tokens, tokens=t[:7] + ("odd",) + t[8:])
    assert "token 7" in (vocab_problem(with_tokens, odd) or "")
    assert vocab_problem(with_tokens, replace(with_tokens, n_vocab=280, tokens=t[:280])) is None
    # a side whose tokenizer is unknown (a synthesized layout) is not refused for it
    assert vocab_problem(replace(qwen, model=""), Vocabulary("llama", "", 248320)) is None


def test_vocabulary_of_follows_llama_vocab_defaults() -> None:
    from quantpick.model.speculative import vocabulary_of

    spm = vocabulary_of({"tokenizer.ggml.model": "llama"}, 32000)
    assert (spm.bos, spm.eos, spm.add_bos, spm.add_eos) == (1, 2, True, False)
    bpe = vocabulary_of(
        {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.add_bos_token": False,
         "tokenizer.ggml.eos_token_id": 7}, 1024,
    )  # fmt: skip
    assert (bpe.eos, bpe.add_bos, bpe.add_eos) == (7, False, None)


def test_draft_siblings_by_family_and_vocabulary() -> None:
    assert [s.repo for s in draft_siblings("meta-llama/Llama-3.1-8B-Instruct")] == [
        "bartowski/Llama-3.2-1B-Instruct-GGUF"
    ]
    # Qwen3.6's 248320-token vocabulary is not Qwen3's 151936: no known draft
    qwen36 = Vocabulary("gpt2", "qwen35", 248320)
    assert draft_siblings("Qwen3-32B", qwen36) == ()
    assert draft_siblings("Qwen3-32B", Vocabulary("gpt2", "qwen2", 151936))


def test_sources_of_the_bundled_model_have_mtp() -> None:
    manifest = load_manifest_file(bundled_manifest_dir() / "qwen3.8-35b-a3b-distill.toml")
    layout = synthesize_layout(manifest.architecture, "Q4_K_M", 22 * 10**9)
    src = spec_sources(layout.view, manifest.id)
    assert src.nextn_layers == 1
    assert src.kinds == (SpecKind.MTP, SpecKind.NGRAM)
    assert SpecKind.MTP.spec_type == "draft-mtp"
