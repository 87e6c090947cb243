"""Real model configurations as their GGUFs carry them: the `<arch>.*` keys convert_hf_to_gguf.py
(pinned tree, conversion/*.py) writes from each model's config.json, for the header-only files
of tests/arch_fixtures.py and the llama.cpp projections scripts/record_arch_real.py records
(tests/data/arch-real/<name>.json).

Only keys the loaders read are kept (src/models/<arch>.cpp load_arch_hparams and the shared
llama_model_base::load_hparams); each config cites the config.json it was taken from. Where a
value is the converter's own (a default, a derived width), the comment says which line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantpick.arch.base import Architecture, HValue


@dataclass(frozen=True)
class RealConfig:
    name: str  # the fixture's file stem: tests/data/arch-real/<name>.json
    arch: str  # general.architecture
    hparams: dict[str, HValue] = field(hash=False)  # GGUF key suffixes after "<arch>."
    vocab_size: int
    tied: bool  # no output.weight (the model ties lm_head to the embeddings)
    source: str  # where the numbers come from
    quant: str = "Q4_K_M"  # tests/arch_fixtures.QUANTS

    @property
    def architecture(self) -> Architecture:
        return Architecture.of(self.arch, self.hparams, self.vocab_size, not self.tied)

    @property
    def moe(self) -> bool:
        return int(self.hparams.get("expert_count", 0) or 0) > 0  # type: ignore[arg-type]


def _every(n: int, period: int, *, offset: int = 0) -> tuple[bool, ...]:
    """(il + 1 - offset) % period != 0 per layer: the "sliding" / "recurrent" flags of layer_types
    that repeat with one full-attention layer per period."""
    return tuple((il + 1 - offset) % period != 0 for il in range(n))


# Nemotron-H-8B's hybrid_override_pattern (M: Mamba2, *: attention, -: MLP): the NemotronH-v0.1
# default of vLLM's NemotronHConfig (jiayingsong2023/litevLLM vllm/transformers_utils/configs/
# nemotron_h.py, "similar configuration to that of the NemotronH-v0.1 model", 52 layers).
NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
# LFM2-1.2B's attention layers (full_attn_idxs; the others are "conv").
LFM2_1_2B_ATTENTION = (2, 5, 8, 10, 12, 14)

CONFIGS: tuple[RealConfig, ...] = (
    RealConfig(
        "llama-3.1-8b",
        "llama",
        {
            "block_count": 32, "context_length": 131072, "embedding_length": 4096,
            "feed_forward_length": 14336, "attention.head_count": 32,
            "attention.head_count_kv": 8, "rope.freq_base": 500000.0,
            "attention.layer_norm_rms_epsilon": 1e-5,
            "rope.dimension_count": 128,  # conversion/llama.py: hidden_size / num_attention_heads
        },
        vocab_size=128256,
        tied=False,
        source="meta-llama/Llama-3.1-8B config.json (copies: NbAiLab/nb-llama-3.1-8B, "
        "mlx-community/Meta-Llama-3.1-8B-bf16): rope_type llama3 -> rope_freqs tensor",
    ),
    RealConfig(
        "mistral-small-24b",
        "llama",  # MistralForCausalLM converts as LlamaModel (conversion/llama.py)
        {
            "block_count": 40, "context_length": 32768, "embedding_length": 5120,
            "feed_forward_length": 32768, "attention.head_count": 32,
            "attention.head_count_kv": 8, "attention.key_length": 128,
            "attention.value_length": 128, "rope.freq_base": 100000000.0,
            "attention.layer_norm_rms_epsilon": 1e-5, "rope.dimension_count": 128,
        },
        vocab_size=131072,
        tied=False,
        source="mistralai/Mistral-Small-24B-Instruct-2501 config.json "
        "(unsloth/Mistral-Small-24B-Instruct-2501-GGUF config.json)",
    ),
    RealConfig(
        "qwen2.5-7b",
        "qwen2",
        {
            "block_count": 28, "context_length": 32768, "embedding_length": 3584,
            "feed_forward_length": 18944, "attention.head_count": 28,
            "attention.head_count_kv": 4, "rope.freq_base": 1000000.0,
            "attention.layer_norm_rms_epsilon": 1e-6,
        },
        vocab_size=152064,
        tied=False,
        source="Qwen/Qwen2.5-7B-Instruct config.json (osllmai-community/Qwen2.5-7B-Instruct)",
    ),
    RealConfig(
        "qwen3-8b",
        "qwen3",
        {
            "block_count": 36, "context_length": 40960, "embedding_length": 4096,
            "feed_forward_length": 12288, "attention.head_count": 32,
            "attention.head_count_kv": 8, "attention.key_length": 128,
            "attention.value_length": 128, "rope.freq_base": 1000000.0,
            "attention.layer_norm_rms_epsilon": 1e-6,
        },
        vocab_size=151936,
        tied=False,
        source="Qwen/Qwen3-8B config.json (copied in thejaminator/qwen-hook-layer-9)",
    ),
    RealConfig(
        "qwen3-30b-a3b",
        "qwen3moe",
        {
            "block_count": 48, "context_length": 40960, "embedding_length": 2048,
            "feed_forward_length": 6144, "attention.head_count": 32,
            "attention.head_count_kv": 4, "attention.key_length": 128,
            "attention.value_length": 128, "rope.freq_base": 1000000.0,
            "attention.layer_norm_rms_epsilon": 1e-6, "expert_count": 128,
            "expert_used_count": 8, "expert_feed_forward_length": 768,
        },
        vocab_size=151936,
        tied=False,
        source="Qwen/Qwen3-30B-A3B config.json; same geometry in Ascend MindSpeed-RL "
        "configs/model/qwen3_30b_a3b.yaml (48 layers, 4 KV groups, kv_channels 128, 128 "
        "experts top-8, moe_ffn 768, vocab 151936, untied)",
    ),
    RealConfig(
        "qwen3.5-27b",
        "qwen35",
        {
            "block_count": 65, "nextn_predict_layers": 1, "context_length": 262144,
            "embedding_length": 5120, "feed_forward_length": 17408,
            "attention.head_count": 24, "attention.head_count_kv": 4,
            "attention.key_length": 256, "attention.value_length": 256,
            "rope.freq_base": 10000000.0, "rope.dimension_count": 64,  # 256 x partial 0.25
            "rope.dimension_sections": (11, 11, 10, 0),  # conversion/qwen.py:636-650
            "attention.layer_norm_rms_epsilon": 1e-6, "ssm.conv_kernel": 4,
            "ssm.state_size": 128, "ssm.group_count": 16, "ssm.time_step_rank": 48,
            "ssm.inner_size": 6144,  # linear_value_head_dim x linear_num_value_heads
            "full_attention_interval": 4,
            # layer_types -> recurrent_layers, the MTP block False (conversion/qwen.py:384-388)
            "attention.recurrent_layers": _every(64, 4) + (False,),
        },
        vocab_size=248320,
        tied=False,
        source="Qwen/Qwen3.5-27B text_config, ../shared/notes/model-and-hubs.md §1.2 "
        "(5120 hidden, 17408 FFN, 64 layers 48 linear + 16 full, 24/4 heads x 256, linear "
        "16/48 heads x 128, 1 MTP layer, untied)",
    ),
    RealConfig(
        "qwen3.6-35b-a3b",
        "qwen35moe",
        {
            "block_count": 41, "nextn_predict_layers": 1, "context_length": 262144,
            "embedding_length": 2048, "feed_forward_length": 512,
            "attention.head_count": 16, "attention.head_count_kv": 2,
            "attention.key_length": 256, "attention.value_length": 256,
            "rope.freq_base": 10000000.0, "rope.dimension_count": 64,
            "rope.dimension_sections": (11, 11, 10, 0),
            "attention.layer_norm_rms_epsilon": 1e-6, "expert_count": 256,
            "expert_used_count": 8, "expert_feed_forward_length": 512,
            "expert_shared_feed_forward_length": 512, "ssm.conv_kernel": 4,
            "ssm.state_size": 128, "ssm.group_count": 16, "ssm.time_step_rank": 32,
            "ssm.inner_size": 4096, "full_attention_interval": 4,
            "attention.recurrent_layers": _every(40, 4) + (False,),
        },
        vocab_size=248320,
        tied=False,
        source="Qwen/Qwen3.6-35B-A3B text_config, ../shared/notes/model-and-hubs.md §1.1 "
        "(40 layers 30 linear + 10 full, 16/2 heads x 256, linear 16/32 heads x 128, 256 "
        "experts top-8 x 512, shared 512, 1 MTP layer, untied)",
    ),
    RealConfig(
        "qwen3-next-80b-a3b",
        "qwen3next",
        {
            "block_count": 49, "nextn_predict_layers": 1, "context_length": 262144,
            "embedding_length": 2048, "feed_forward_length": 5120,
            "attention.head_count": 16, "attention.head_count_kv": 2,
            "attention.key_length": 256, "attention.value_length": 256,
            "rope.freq_base": 10000000.0, "rope.dimension_count": 64,
            "attention.layer_norm_rms_epsilon": 1e-6, "expert_count": 512,
            "expert_used_count": 10, "expert_feed_forward_length": 512,
            "expert_shared_feed_forward_length": 512, "ssm.conv_kernel": 4,
            "ssm.state_size": 128, "ssm.group_count": 16, "ssm.time_step_rank": 32,
            "ssm.inner_size": 4096, "full_attention_interval": 4,
        },
        vocab_size=151936,
        tied=False,
        source="Qwen/Qwen3-Next-80B-A3B-Instruct, ../shared/notes/model-and-hubs.md §1.3 "
        "(no layer_types: full_attention_interval 4; MTP shipped as mtp.*); vocab 151936 from "
        "vLLM's Qwen3NextConfig defaults (docs.vllm.ai transformers_utils/configs/qwen3_next)",
    ),
    RealConfig(
        "gemma-3-27b",
        "gemma3",
        {
            "block_count": 62, "context_length": 131072, "embedding_length": 5376,
            "feed_forward_length": 21504, "attention.head_count": 32,
            "attention.head_count_kv": 16, "attention.key_length": 128,
            "attention.value_length": 128, "attention.layer_norm_rms_epsilon": 1e-6,
            "rope.freq_base": 1000000.0, "rope.freq_base_swa": 10000.0,
            "rope.scaling.type": "linear", "rope.scaling.factor": 8.0,
            "attention.sliding_window": 1024,  # pattern 6: gemma3.cpp:7 default
        },
        vocab_size=262208,
        tied=True,
        source="google/gemma-3-27b-it text_config (62 layers, 5376 hidden, 32/16 heads x 128, "
        "21504 FFN, sliding_window 1024, vocab 262208, tied; public copies e.g. a "
        "gemma_3_27b SimpleNamespace and the gemma3_text FlopsCounter fixture)",
    ),
    RealConfig(
        "gemma-4-e2b",
        "gemma4",
        {
            "block_count": 35, "context_length": 131072, "embedding_length": 1536,
            # use_double_wide_mlp: 2x on the 20 KV-shared layers (conversion/gemma.py:707-713)
            "feed_forward_length": (6144,) * 15 + (12288,) * 20,
            "attention.head_count": 8, "attention.head_count_kv": 1,
            "attention.key_length": 512, "attention.value_length": 512,  # global_head_dim
            "attention.key_length_swa": 256, "attention.value_length_swa": 256,  # head_dim
            "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1000000.0,
            "rope.freq_base_swa": 10000.0, "rope.dimension_count": 512,
            "rope.dimension_count_swa": 256, "attention.sliding_window": 512,
            "attention.sliding_window_pattern": _every(35, 5),  # full every 5th layer
            "attention.shared_kv_layers": 20, "embedding_length_per_layer_input": 256,
            "final_logit_softcapping": 30.0,
        },
        vocab_size=262144,
        tied=True,
        source="google/gemma-4-E2B-it text_config as public parser tests copy it (35 layers, "
        "1536 hidden, 8/1 heads, head_dim 256, global_head_dim 512, no global KV heads, "
        "attention_k_eq_v false, sliding_window 512, PLE 256, num_kv_shared_layers 20, "
        "use_double_wide_mlp, intermediate 6144, full attention at 4, 9, ..., 34, tied)",
    ),
    RealConfig(
        "gpt-oss-20b",
        "gpt-oss",
        {
            "block_count": 24, "context_length": 131072, "embedding_length": 2880,
            "feed_forward_length": 2880, "attention.head_count": 64,
            "attention.head_count_kv": 8, "attention.key_length": 64,
            "attention.value_length": 64, "attention.layer_norm_rms_epsilon": 1e-5,
            "rope.freq_base": 150000.0, "rope.scaling.type": "yarn",
            "rope.scaling.factor": 32.0, "rope.scaling.original_context_length": 4096,
            "expert_count": 32, "expert_used_count": 4, "expert_feed_forward_length": 2880,
            "attention.sliding_window": 128,
        },
        vocab_size=201088,
        tied=False,
        source="openai/gpt-oss-20b config.json (cryptonaut/AltiMind-sft copy; vocab 201088 and "
        "sliding_window 128 from keras/gpt_oss_20b_en); experts ship MXFP4 "
        "(conversion/gpt_oss.py:49-62)",
        quant="MXFP4_MOE",
    ),
    RealConfig(
        "deepseek-v3",
        "deepseek2",
        {
            # the converter drops the MTP layer (conversion/deepseek.py:240 skip_mtp)
            "block_count": 61, "context_length": 163840, "embedding_length": 7168,
            "feed_forward_length": 18432, "attention.head_count": 128,
            "attention.head_count_kv": 1,  # MLA as MQA (conversion/deepseek.py:326)
            "attention.layer_norm_rms_epsilon": 1e-6, "leading_dense_block_count": 3,
            "attention.q_lora_rank": 1536, "attention.kv_lora_rank": 512,
            "attention.key_length": 576, "attention.value_length": 512,  # kv_lora + rope
            "attention.key_length_mla": 192, "attention.value_length_mla": 128,
            "expert_feed_forward_length": 2048, "expert_count": 256, "expert_used_count": 8,
            "expert_shared_count": 1, "expert_weights_scale": 2.5,
            "expert_weights_norm": True, "expert_gating_func": 2,  # scoring_func sigmoid
            "expert_group_count": 8, "expert_group_used_count": 4,
            "rope.dimension_count": 64, "rope.freq_base": 10000.0,
            "rope.scaling.type": "yarn", "rope.scaling.factor": 40.0,
            "rope.scaling.original_context_length": 4096,
            "rope.scaling.yarn_log_multiplier": 0.1,  # 0.1 x mscale_all_dim 1.0
        },
        vocab_size=129280,
        tied=False,
        source="deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json (7168 dim, 18432 "
        "inter, 2048 moe_inter, 61 layers, 3 dense, 128 heads, 256 routed + 1 shared experts "
        "top-8, 8 groups / 4, q_lora 1536, kv_lora 512, qk 128+64, v 128, vocab 129280) and "
        "vLLM's DeepseekV3Config (n_group, max_position_embeddings 163840 in the release)",
    ),
    RealConfig(
        "glm-4.5-air",
        "glm4moe",
        {
            "block_count": 47, "nextn_predict_layers": 1, "context_length": 131072,
            "embedding_length": 4096, "feed_forward_length": 10944,
            "attention.head_count": 96, "attention.head_count_kv": 8,
            "attention.key_length": 128, "attention.value_length": 128,
            "attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 1000000.0,
            "rope.dimension_count": 64,  # 128 x partial_rotary_factor 0.5 (conversion/glm.py)
            "expert_count": 128, "expert_used_count": 8, "expert_feed_forward_length": 1408,
            "expert_shared_count": 1, "leading_dense_block_count": 1,
            "expert_gating_func": 2, "expert_weights_scale": 1.0,
            "expert_weights_norm": True, "expert_group_count": 1,
            "expert_group_used_count": 1,
        },
        vocab_size=151552,
        tied=False,
        source="zai-org/GLM-4.5-Air config.json as PrimeIntellect/INTELLECT-3-Base (its "
        "fine-tune) ships it: 46 layers + 1 NextN, 4096 hidden, 10944 FFN, 96/8 heads x 128, "
        "128 experts top-8 x 1408, 1 shared, first_k_dense_replace 1, use_qk_norm false",
    ),
    RealConfig(
        "ministral-3-8b",
        "mistral3",
        {
            "block_count": 34, "context_length": 262144, "embedding_length": 4096,
            "feed_forward_length": 14336, "attention.head_count": 32,
            "attention.head_count_kv": 8, "attention.key_length": 128,
            "attention.value_length": 128, "attention.layer_norm_rms_epsilon": 1e-5,
            "rope.freq_base": 1000000.0, "rope.dimension_count": 128,
            "rope.scaling.type": "yarn", "rope.scaling.factor": 16.0,
            "rope.scaling.original_context_length": 16384,
            "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0,
            "rope.scaling.yarn_log_multiplier": 1.0,  # mscale_all_dim (conversion/mistral3.py:29)
            "attention.temperature_scale": 0.1,  # llama_4_scaling_beta
        },
        vocab_size=131072,
        tied=False,
        source="mistralai/Ministral-3-8B-Instruct-2512: transformers Ministral3Config defaults "
        "(huggingface/transformers models/ministral3/configuration_ministral3.py, 'similar "
        "configuration to that of mistralai/Ministral-3-8B')",
    ),
    RealConfig(
        "nemotron-h-8b",
        "nemotron_h",
        {
            "block_count": 52, "context_length": 8192, "embedding_length": 4096,
            # conversion/nemotron.py:337-340: the FFN width on MLP layers, 0 elsewhere
            "feed_forward_length": tuple(
                21504 if c == "-" else 0 for c in NEMOTRON_H_8B_PATTERN
            ),
            "attention.head_count": 32,
            # conversion/granite.py GraniteHybridModel: KV heads on attention layers only
            "attention.head_count_kv": tuple(8 if c == "*" else 0 for c in NEMOTRON_H_8B_PATTERN),
            "attention.key_length": 128, "attention.value_length": 128,
            "attention.layer_norm_epsilon": 1e-5, "ssm.conv_kernel": 4,
            "ssm.state_size": 128, "ssm.group_count": 8,
            "ssm.inner_size": 8192,  # mamba_num_heads x mamba_head_dim (conversion/nemotron.py:237)
            "ssm.time_step_rank": 128,  # mamba_num_heads (conversion/granite.py)
        },
        vocab_size=131072,
        tied=False,
        source="nvidia/Nemotron-H-8B-Base-8K: vLLM NemotronHConfig defaults ('NemotronH-v0.1'"
        ": 131072 vocab, 4096 hidden, 21504 MLP, 52 layers, 32/8 heads x 128, Mamba 128 heads "
        "x 64, 8 groups, state 128, conv 4); 8K context",
    ),
    RealConfig(
        "lfm2-1.2b",
        "lfm2",
        {
            "block_count": 16, "context_length": 128000, "embedding_length": 2048,
            # block_ff_dim 12288, auto-adjusted: 2/3 then a multiple of 256 (conversion/lfm2.py)
            "feed_forward_length": 8192,
            "attention.head_count": 32,
            "attention.head_count_kv": tuple(
                8 if il in LFM2_1_2B_ATTENTION else 0 for il in range(16)
            ),
            "attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 1000000.0,
            "shortconv.l_cache": 3,
        },
        vocab_size=65536,
        tied=True,
        source="LiquidAI/LFM2-1.2B config.json (FastFlowLM/LFM2-1.2B-NPU2 copy: 2048 hidden, "
        "16 layers, attention at 2,5,8,10,12,14, 32/8 heads, block_ff_dim 12288 -> 8192, "
        "conv_L_cache 3, vocab 65536; LFM2 ties its embeddings)",
    ),
)  # fmt: skip

BY_NAME = {c.name: c for c in CONFIGS}


# Models only benchmarks/speed_accuracy.py's published runs measure (no llama.cpp projection is
# recorded for them), as their GGUFs' <arch>.* keys.
SPEED_CONFIGS: tuple[RealConfig, ...] = (
    RealConfig(
        "qwen3.5-9b",
        "qwen35",
        {
            "block_count": 32, "context_length": 262144, "embedding_length": 4096,
            "feed_forward_length": 12288, "attention.head_count": 16,
            "attention.head_count_kv": 4, "attention.key_length": 256,
            "attention.value_length": 256, "rope.freq_base": 10000000.0,
            "rope.dimension_count": 64, "rope.dimension_sections": (11, 11, 10, 0),
            "attention.layer_norm_rms_epsilon": 1e-6, "ssm.conv_kernel": 4,
            "ssm.state_size": 128, "ssm.group_count": 16, "ssm.time_step_rank": 32,
            "ssm.inner_size": 4096, "full_attention_interval": 4,
            "attention.recurrent_layers": _every(32, 4),
        },
        vocab_size=248320,
        tied=False,
        source="Qwen/Qwen3.5-9B as a GGUF of it prints its header (llama_model_loader kv "
        "14-22: 32 layers, 4096 hidden, 12288 FFN, 16/4 heads x 256, ssm inner 4096, state 128, "
        "16 groups, dt rank 32, full attention every 4th; vocab 248320; model params 8.95 B, "
        "untied; no MTP block; search index id 61650305065); llama-bench prints 8.95 B",
    ),
    RealConfig(
        "qwen2.5-1.5b",
        "qwen2",
        {
            "block_count": 28, "context_length": 32768, "embedding_length": 1536,
            "feed_forward_length": 8960, "attention.head_count": 12,
            "attention.head_count_kv": 2, "rope.freq_base": 1000000.0,
            "attention.layer_norm_rms_epsilon": 1e-6,
        },
        vocab_size=151936,
        tied=True,
        source="Qwen/Qwen2.5-1.5B-Instruct config.json as public copies quote it (28 layers, "
        "1536 hidden, 8960 FFN, 12/2 heads, vocab 151936, rope 1e6, tie_word_embeddings true; "
        "search index ids 37302823430, 58222783563)",
    ),
    RealConfig(
        "gpt-oss-120b",
        "gpt-oss",
        {**BY_NAME["gpt-oss-20b"].hparams, "block_count": 36, "expert_count": 128},
        vocab_size=201088,
        tied=False,
        source="gpt-oss-20b's config with 36 layers and 128 experts: vLLM's and transformers' "
        "GptOssConfig defaults ('a similar configuration to that of the GPT-OSS-120B model': 36 "
        "layers, 128 experts top-4, 2880 hidden and expert width, 64/8 heads x 64, window 128, "
        "vocab 201088); llama-bench prints 116.83 B params for ggml-org's file",
        quant="MXFP4_MOE",
    ),
    RealConfig(
        "llama-3.2-1b",
        "llama",
        {
            "block_count": 16, "context_length": 131072, "embedding_length": 2048,
            "feed_forward_length": 8192, "attention.head_count": 32,
            "attention.head_count_kv": 8, "attention.key_length": 64,
            "attention.value_length": 64, "rope.freq_base": 500000.0,
            "attention.layer_norm_rms_epsilon": 1e-5, "rope.dimension_count": 64,
        },
        vocab_size=128256,
        tied=True,
        source="meta-llama/Llama-3.2-1B-Instruct config.json as kevinstephano/"
        "thunder_model_blocks hf_llama/llama_config.py copies it (16 layers, 2048 hidden, 8192 "
        "FFN, 32/8 heads x 64, rope 5e5 llama3 -> rope_freqs, vocab 128256, tied); llama-bench "
        "prints 1.24 B",
    ),
    RealConfig(
        "tinyllama-1.1b",
        "llama",
        {
            "block_count": 22, "context_length": 2048, "embedding_length": 2048,
            "feed_forward_length": 5632, "attention.head_count": 32,
            "attention.head_count_kv": 4, "rope.freq_base": 10000.0,
            "attention.layer_norm_rms_epsilon": 1e-5,
            "rope.dimension_count": 64,  # conversion/llama.py: hidden_size / num_attention_heads
        },
        vocab_size=32000,
        tied=False,
        source="TinyLlama/TinyLlama-1.1B-Chat-v1.0 config.json as public copies carry it (22 "
        "layers, 2048 hidden, 5632 FFN, 32/4 heads, rope 1e4, vocab 32000, untied; the 1T-token "
        "checkpoint's OpenOrca fine-tune has the same geometry); llama-bench prints 1.10 B",
    ),
    RealConfig(
        "llama-3.2-3b",
        "llama",
        {
            "block_count": 28, "context_length": 131072, "embedding_length": 3072,
            "feed_forward_length": 8192, "attention.head_count": 24,
            "attention.head_count_kv": 8, "rope.freq_base": 500000.0,
            "attention.layer_norm_rms_epsilon": 1e-5,
            "rope.dimension_count": 128,  # conversion/llama.py: hidden_size / num_attention_heads
        },
        vocab_size=128256,
        tied=True,
        source="meta-llama/Llama-3.2-3B config.json as public tables copy it (oumi's "
        "configs/recipes/llama3_2 README: 3072 hidden, 8192 MLP, 28 layers, 24/8 heads, tied, "
        "vocab 128256; rope 5e5 llama3 as the 1B); llama-bench prints 3.21 B",
    ),
    RealConfig(
        "gemma-3-4b",
        "gemma3",
        {
            "block_count": 34, "context_length": 131072, "embedding_length": 2560,
            "feed_forward_length": 10240, "attention.head_count": 8,
            "attention.head_count_kv": 4, "attention.key_length": 256,
            "attention.value_length": 256, "attention.layer_norm_rms_epsilon": 1e-6,
            "rope.freq_base": 1000000.0, "rope.freq_base_swa": 10000.0,
            "rope.scaling.type": "linear", "rope.scaling.factor": 8.0,
            "attention.sliding_window": 1024,
        },
        vocab_size=262208,
        tied=True,
        source="google/gemma-3-4b-it text_config as a public Gemma3Config table copies it (34 "
        "layers, 2560 dim, FFN 2560 x 8 / 2, 8/4 heads x 256, window 1024, vocab 262208, rope "
        "1e6 / 1e4 local, linear x8; search index id 44578680385); llama-bench prints 3.88 B",
    ),
    RealConfig(
        "glm-4.7-flash",
        "deepseek2",
        {
            # the measured files carry no MTP block: llama-bench's 29.94 B params are the 47
            # trunk layers (the pinned converter would add num_nextn_predict_layers 1)
            "block_count": 47, "context_length": 202752, "embedding_length": 2048,
            "feed_forward_length": 10240, "attention.head_count": 20,
            "attention.head_count_kv": 1,  # MLA as MQA (conversion/deepseek.py)
            "attention.layer_norm_rms_epsilon": 1e-5, "leading_dense_block_count": 1,
            "attention.q_lora_rank": 768, "attention.kv_lora_rank": 512,
            "attention.key_length": 576, "attention.value_length": 512,  # kv_lora + rope
            "attention.key_length_mla": 256, "attention.value_length_mla": 256,  # 192+64, 256
            "expert_feed_forward_length": 1536, "expert_count": 64, "expert_used_count": 4,
            "expert_shared_count": 1, "expert_weights_scale": 1.8, "expert_weights_norm": True,
            "expert_gating_func": 2,  # noaux_tc (arch/deepseek.py GATING_SIGMOID)
            "expert_group_count": 1, "expert_group_used_count": 1,
            "rope.dimension_count": 64, "rope.freq_base": 1000000.0,
        },
        vocab_size=154880,
        tied=False,
        source="zai-org/GLM-4.7-Flash config.json as blap/Mod src/inference_pio/models/"
        "glm_4_7_flash/config.py copies it (commit 06d6cd1e: 2048 hidden, 47 layers, 20 heads, "
        "10240 FFN, 64 routed + 1 shared experts top-4 x 1536, first_k_dense 1, q_lora 768, "
        "kv_lora 512, qk 192 + 64, v 256, vocab 154880, untied)",
    ),
)  # fmt: skip
