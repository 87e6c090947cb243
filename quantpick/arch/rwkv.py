"""RWKV (rwkv6, rwkv6qwen2, rwkv7, arwkv7): recurrent throughout, no KV cache. Pure.

Rules (llama.cpp b11312): llm_arch_is_recurrent (src/llama-arch.cpp:1070-1081); per sequence and
layer token_shift_count x n_embd (default 2) + n_embd x wkv.head_size f32 values
(src/llama-hparams.cpp:218-270, src/models/rwkv6.cpp, rwkv7.cpp).
"""

from __future__ import annotations

from quantpick.arch.base import HParams, MemoryClass
from quantpick.arch.family import Family

ARCHS = ("rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7")


def configure(hp: HParams) -> None:
    hp.memory = MemoryClass.RECURRENT
    hp.wkv_head_size = hp.int_key("wkv.head_size")
    hp.token_shift_count = hp.int_key("token_shift_count", 2)


FAMILY = Family(
    name="rwkv",
    architectures=ARCHS,
    configure=configure,
    summary="RWKV: recurrent state only, no KV cache",
    rules=("state F32: token_shift_count x n_embd + n_embd x wkv.head_size per sequence",),
    recurrent=frozenset(ARCHS),
    # test-llama-archs skips RWKV ("hang", tests/test-llama-archs.cpp:659-708): source rules
    checked=frozenset(),
)
