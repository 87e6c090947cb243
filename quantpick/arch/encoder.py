"""Models llama.cpp runs without a cache: encoders (BERT and kin, gemma-embedding) and diffusion
language models (dream, llada, llada-moe, rnd1). Pure.

create_memory returns no memory for them (src/llama-model.cpp:2356-2374): weights and compute
buffers only. They are not chat models; quantpick plans their memory and says so.
"""

from __future__ import annotations

from quantpick.arch.base import HParams, MemoryClass
from quantpick.arch.family import Family

ARCHS = (
    "bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert",
    "eurobert", "wavtokenizer-dec", "modern-bert", "gemma-embedding", "dream", "llada",
    "llada-moe", "rnd1",
)  # fmt: skip


def configure(hp: HParams) -> None:
    hp.memory = MemoryClass.NONE


FAMILY = Family(
    name="encoder",
    architectures=ARCHS,
    configure=configure,
    summary="no KV cache (encoders, diffusion LMs): weights and compute only",
    rules=("create_memory returns nullptr (src/llama-model.cpp:2356-2374)",),
    # the encoders: no llama.cpp test model or full-size recording: rules from the source only
    checked=frozenset({"dream", "llada", "llada-moe", "rnd1"}),
)
