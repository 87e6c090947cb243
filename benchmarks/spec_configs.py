"""Model configs of the draft-model and n-gram rows of benchmarks/data/spec-measurements.json that
tests/arch_configs.py does not carry: the Qwen2.5(-Coder) targets and drafts and Llama-3.2-1B, as
convert_hf_to_gguf.py writes their `<arch>.*` keys from each config.json (the same keys as the
qwen2.5-7b and llama-3.1-8b entries there). The Coder models share their base model's shapes
(Qwen/Qwen2.5-Coder-*-Instruct config.json). Benchmark data only: no test or plan reads them.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from arch_configs import RealConfig  # noqa: E402


def _qwen2(
    name: str, layers: int, width: int, ffn: int, heads: int, kv: int, vocab: int, tied: bool
) -> RealConfig:
    return RealConfig(
        name,
        "qwen2",
        {
            "block_count": layers, "context_length": 32768, "embedding_length": width,
            "feed_forward_length": ffn, "attention.head_count": heads,
            "attention.head_count_kv": kv, "rope.freq_base": 1000000.0,
            "attention.layer_norm_rms_epsilon": 1e-6,
        },
        vocab_size=vocab,
        tied=tied,
        source=f"Qwen/{name.replace('qwen', 'Qwen')}-Instruct config.json (tie_word_embeddings "
        f"{str(tied).lower()})",
    )  # fmt: skip


SPEC_CONFIGS: dict[str, RealConfig] = {
    c.name: c
    for c in (
        _qwen2("qwen2.5-0.5b", 24, 896, 4864, 14, 2, 151936, True),
        _qwen2("qwen2.5-1.5b", 28, 1536, 8960, 12, 2, 151936, True),
        _qwen2("qwen2.5-3b", 36, 2048, 11008, 16, 2, 151936, True),
        _qwen2("qwen2.5-14b", 48, 5120, 13824, 40, 8, 152064, False),
        _qwen2("qwen2.5-32b", 64, 5120, 27648, 40, 8, 152064, False),
        RealConfig(
            "llama-3.2-1b",
            "llama",
            {
                "block_count": 16,
                "context_length": 131072,
                "embedding_length": 2048,
                "feed_forward_length": 8192,
                "attention.head_count": 32,
                "attention.head_count_kv": 8,
                "rope.freq_base": 500000.0,
                "attention.layer_norm_rms_epsilon": 1e-5,
                "rope.dimension_count": 64,
            },
            vocab_size=128256,
            tied=True,
            source="meta-llama/Llama-3.2-1B-Instruct config.json (head_dim 64, "
            "tie_word_embeddings true)",
        ),  # fmt: skip
    )
}
