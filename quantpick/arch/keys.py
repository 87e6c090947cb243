"""The `<arch>.*` GGUF keys llama.cpp reads (src/llama-arch.cpp LLM_KV_NAMES at b11312, the
"%s."-prefixed entries, prefix stripped; ARCH_KEYS is written by scripts/record_arch_keys.py).
Pure data: a manifest's [architecture] table may hold only these (a typo is an error), and the
integer-valued ones must be integers."""

from __future__ import annotations

# -- ARCH_KEYS: written by scripts/record_arch_keys.py from b11312 (0c1e57098); do not edit --
ARCH_KEYS = frozenset(
    """
vocab_size context_length embedding_length embedding_length_out embedding_length_per_layer_input
features_length block_count leading_dense_block_count attn_res.block_size activation.situ_beta
activation.situ_linear_beta feed_forward_length expert_feed_forward_length
expert_shared_feed_forward_length expert_chunk_feed_forward_length swiglu_clamp_exp
swiglu_clamp_shexp use_parallel_residual tensor_data_layout expert_count expert_used_count
expert_shared_count expert_group_count expert_group_used_count expert_weights_scale
expert_weights_norm expert_latent_length expert_gating_func expert_group_scale experts_per_group
moe_every_n_layers moe_latent_size nextn_predict_layers n_deepstack_layers deepstack_mapping
hidden_activation pooling_type logit_scale decoder_start_token_id decoder_block_count
attn_logit_softcapping router_logit_softcapping final_logit_softcapping swin_norm
rescale_every_n_layers time_mix_extra_dim time_decay_extra_dim residual_scale embedding_scale
adapters.count adapters.token_ids_activate adapters.token_ids_substitute adapters.lora_rank
adapters.router_gain token_shift_count interleave_moe_layer_step full_attention_interval
num_loops skip_loop_final_norm hrm.layers_per_stack hrm.h_cycles hrm.l_cycles hrm.prefix_lm
attention.head_count attention.head_count_kv attention.max_alibi_bias attention.clamp_kqv
attention.key_length attention.value_length attention.layer_norm_epsilon
attention.layer_norm_rms_epsilon attention.group_norm_epsilon attention.group_norm_groups
attention.causal attention.q_lora_rank attention.kv_lora_rank attention.decay_lora_rank
attention.iclr_lora_rank attention.value_residual_mix_lora_rank attention.gate_lora_rank
attention.relative_buckets_count attention.sliding_window attention.sliding_window_pattern
attention.rope_pattern attention.scale attention.output_scale attention.value_scale
attention.temperature_length attention.temperature_scale attention.key_length_mla
attention.value_length_mla attention.key_length_swa attention.value_length_swa
attention.key_length_mla_swa attention.value_length_mla_swa attention.kv_lora_rank_swa
attention.indexer.head_count attention.indexer.key_length attention.indexer.top_k
attention.indexer.block_size attention.indexer.local_blocks attention.indexer.types
attention.indexer.kpool attention.indexer.kpool_select_tail attention.output_group_count
attention.output_lora_rank attention.compress_rope_freq_base attention.compress_ratios
attention.shared_kv_layers attention.recurrent_layers hyper_connection.count
hyper_connection.sinkhorn_iterations hyper_connection.epsilon hyper_connection.magnitude
hyper_connection.low_rank ple.layers ple.ngram_size ple.heads_per_ngram ple.conv_kernel
ple.layer_multipliers ple.head_offsets ple.head_vocab_sizes ple.eos_token_id ple.image_token_id
hash_layer_count rope.dimension_count rope.dimension_count_swa rope.dimension_sections
rope.freq_base rope.freq_base_swa rope.scale_linear rope.scaling.type rope.scaling.factor
rope.scaling.alpha rope.scaling.attn_factor rope.scaling.original_context_length
rope.scaling.finetuned rope.scaling.yarn_log_multiplier rope.scaling.yarn_ext_factor
rope.scaling.yarn_attn_factor rope.scaling.yarn_beta_fast rope.scaling.yarn_beta_slow
ssm.conv_kernel ssm.inner_size ssm.state_size ssm.time_step_rank ssm.group_count ssm.dt_b_c_rms
kda.head_dim kda.safe_gate kda.gate_lower_bound wkv.head_size posnet.embedding_length
posnet.block_count convnext.embedding_length convnext.block_count classifier.output_labels
classifier.pooling_type target_layers target_hidden_size norm_before_residual norm_before_fc
block_size conv_kernel_size conv_group_size selector_rank selector_top_k shortconv.l_cache
dense_2_feat_in dense_2_feat_out dense_3_feat_in dense_3_feat_out
""".split()
)
# -- end of ARCH_KEYS --

# Keys that size memory and must be whole numbers (a scalar, or one per layer where llama.cpp
# reads them with get_key_or_arr: PER_LAYER_KEYS).
INTEGER_KEYS = frozenset({
    "block_count", "nextn_predict_layers", "context_length", "embedding_length",
    "feed_forward_length", "expert_count", "expert_used_count", "expert_feed_forward_length",
    "expert_shared_feed_forward_length", "leading_dense_block_count", "full_attention_interval",
    "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.value_length", "attention.key_length_mla", "attention.value_length_mla",
    "attention.key_length_swa", "attention.value_length_swa", "attention.sliding_window",
    "attention.kv_lora_rank", "attention.q_lora_rank", "attention.shared_kv_layers",
    "ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank",
    "ssm.group_count", "wkv.head_size", "token_shift_count", "shortconv.l_cache",
    "kda.head_dim", "rope.dimension_count", "vocab_size",
})  # fmt: skip
PER_LAYER_KEYS = frozenset({
    "feed_forward_length", "attention.head_count", "attention.head_count_kv", "expert_used_count",
    "expert_feed_forward_length", "attention.sliding_window_pattern",
    "attention.recurrent_layers",
})  # fmt: skip
# Must be >= 1 where present.
POSITIVE_KEYS = frozenset({
    "block_count", "context_length", "embedding_length", "vocab_size", "full_attention_interval",
})  # fmt: skip
