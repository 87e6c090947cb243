"""The GGUF keys a manifest's [architecture] table may hold (quantpick/arch/keys.py): ARCH_KEYS is
llama.cpp's own LLM_KV_NAMES table, written by scripts/record_arch_keys.py."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from script_module import load_script

from quantpick.arch.keys import ARCH_KEYS, INTEGER_KEYS, PER_LAYER_KEYS, POSITIVE_KEYS


def _recorder() -> ModuleType:
    return load_script("record_arch_keys")


def test_the_typed_key_sets_name_only_keys_llama_cpp_reads() -> None:
    assert len(ARCH_KEYS) == 172
    for typed in (INTEGER_KEYS, PER_LAYER_KEYS, POSITIVE_KEYS):
        assert typed <= ARCH_KEYS, sorted(typed - ARCH_KEYS)


def test_the_recorder_reads_the_prefixed_entries_once_and_in_order() -> None:
    source = """
static const std::map<llm_kv, const char *> LLM_KV_NAMES = {
    { LLM_KV_GENERAL_ARCHITECTURE, "general.architecture" },
    { LLM_KV_VOCAB_SIZE,           "%s.vocab_size"        },
    { LLM_KV_ATTENTION_HEAD_COUNT, "%s.attention.head_count" },
    { LLM_KV_VOCAB_SIZE_AGAIN,     "%s.vocab_size"        },
};
static const char * OTHER = "%s.not_in_the_table";
"""
    assert _recorder().arch_keys(source) == ["vocab_size", "attention.head_count"]


def test_the_written_block_is_what_the_recorder_writes_for_its_own_keys() -> None:
    recorder = _recorder()
    text = recorder.KEYS_PY.read_text(encoding="utf-8")
    keys = sorted(ARCH_KEYS)
    namespace: dict[str, object] = {}
    exec(recorder.block(keys, recorder.pin()), namespace)  # the block is one assignment
    assert namespace["ARCH_KEYS"] == ARCH_KEYS
    assert recorder.BLOCK.search(text) is not None


@pytest.mark.llamacpp
def test_keys_py_matches_the_pinned_llama_cpp_source(llamacpp_bin: Path) -> None:
    """Re-record with `python scripts/record_arch_keys.py <bin>/../src` after a pin bump."""
    source = llamacpp_bin.parent / "src" / "src" / "llama-arch.cpp"
    if not source.is_file():
        pytest.skip(f"no llama.cpp source beside the tools ({source})")
    recorder = _recorder()
    keys = recorder.arch_keys(source.read_text(encoding="utf-8"))
    text = recorder.KEYS_PY.read_text(encoding="utf-8")
    assert recorder.rewritten(text, keys) == text
