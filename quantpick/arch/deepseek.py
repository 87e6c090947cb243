"""DeepSeek-V2/V3 and the models built on them (deepseek2, deepseek2-ocr): multi-head latent
attention (MLA). Pure.

Rules (llama.cpp b11312):
- MLA when `attention.key_length_mla` and `attention.value_length_mla` are both set
  (src/models/deepseek2.cpp:14-15, llama_hparams::is_mla): the cache then holds K only,
  key_length x head_count_kv per cell (the converter writes key_length = kv_lora_rank + rope
  dims = 576 and head_count_kv = 1 for DeepSeek-V3), and no V: `-ctv` changes nothing
  (src/llama-kv-cache.cpp:233-237, has_v = !is_mla);
- without the MLA keys (older GGUFs) it is a plain per-head cache;
- NextN blocks (DeepSeek-V3's MTP layer) are left out of the trunk's cache.
"""

from __future__ import annotations

from quantpick.arch.base import HParams
from quantpick.arch.family import Family


def configure(hp: HParams) -> None:
    hp.n_embd_head_k_mla = hp.int_key("attention.key_length_mla")
    hp.n_embd_head_v_mla = hp.int_key("attention.value_length_mla")


FAMILY = Family(
    name="deepseek",
    # mistral4's model class is deepseek2's (src/models/models.h:1399)
    architectures=("deepseek2", "deepseek2-ocr", "mistral4"),
    configure=configure,
    summary="multi-head latent attention: a K-only cache of kv_lora_rank + rope dims per token",
    rules=(
        "MLA: K only, key_length x head_count_kv per cell; V takes 0 bytes, -ctv has no effect "
        "(src/llama-kv-cache.cpp:233-237)",
    ),
    checked=frozenset(),
)
