"""Which Hugging Face config keys :func:`~attn_np.attention_from_hf` reads,
which it ignores as harmless metadata, which it refuses by name, and which
families it refuses with the part they need (chapter 10, issue 44).

:mod:`attn_np.hf.families` reads these tables; they live here, one place
for every key, so that a key is never both read and ignored.
"""

from __future__ import annotations

# The one list of harmless metadata: keys that describe the rest of the
# model (embeddings, MLP, MoE, training, generation, bookkeeping), read by
# nobody here, refused by nobody. Every other key is read (_ATTENTION) or
# refused by name (_REFUSED).
_ELSEWHERE = {
    "_name_or_path",
    "auto_map",  # DeepSeek-V3: the remote code's class names
    "for_llm_compressor",  # Llama 4: a quantisation tool's marker
    "architectures",
    "attention_dropout",
    "bos_token_id",
    "chunk_size_feed_forward",
    "dtype",
    "eos_token_id",
    "final_logit_softcapping",
    "hidden_act",
    "hidden_activation",
    "hidden_dropout",
    "id2label",
    "initializer_range",
    "intermediate_size",
    "intermediate_size_mlp",
    "is_encoder_decoder",
    "label2id",
    "max_position_embeddings",
    "mlp_bias",
    "model_type",
    "num_hidden_layers",
    "output_attentions",
    "output_hidden_states",
    "pad_token_id",
    "pretraining_tp",
    "problem_type",
    "return_dict",
    "tie_word_embeddings",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "vocab_size",
    # mixture of experts and MLP shapes
    "decoder_sparse_step",
    "interleave_moe_layer_step",
    "mlp_only_layers",
    "moe_intermediate_size",
    "moe_layers",
    "norm_topk_prob",
    "num_experts",
    "num_experts_per_tok",
    "num_local_experts",
    "output_router_logits",
    "router_aux_loss_coef",
    "router_jitter_noise",
    "shared_expert_intermediate_size",
    "swiglu_alpha",
    "swiglu_limit",
    "ffn_hidden_size",
    "activation",
    "layer_norm_epsilon",
    "num_ln_in_parallel_attn",
    "parallel_attn",
    # Qwen2/Qwen3: the window rule is spelled out in layer_types
    "use_sliding_window",
    "max_window_layers",
    "_sliding_window_pattern",
    "sliding_window_pattern",
    "no_rope_layer_interval",
    # DeepSeek's MoE and multi-token prediction
    "n_shared_experts",
    "n_routed_experts",
    "routed_scaling_factor",
    "n_group",
    "topk_group",
    "topk_method",
    "first_k_dense_replace",
    "num_nextn_predict_layers",
    "ep_size",
    "scoring_func",
    "aux_loss_alpha",
    "seq_aux",
    "moe_layer_freq",
    "mlp_layer_types",  # DeepSeek-V3.2: dense or MoE per layer
    # the MoE and vocabulary of Aria, EXAONE-MoE, Hunyuan V3, Apertus 1.5
    "moe_topk",
    "num_shared_experts",
    "enable_moe_fp32_combine",
    "router_scaling_factor",
    "output_vocab_size",
    # keys of released config.json files that do not shape attention
    "apply_residual_connection_post_layernorm",
    "cache_implementation",
    "experts_per_token",
    "initial_context_length",
    "quantization_config",
    "max_sequence_length",
    # issue 44's families: MoE layouts, MTP heads, the embedding, the
    # residual stream and the logits (outside the attention module);
    # dropouts (an inference layer has none); the decoder's norms
    "moe_k",
    "moe_layer_end_index",
    "moe_layer_interval",
    "moe_layer_start_index",
    "moe_norm_min",
    "moe_num_experts",
    "moe_num_shared_experts",
    "shared_intermediate_size",
    "input_jitter_noise",
    "num_mtp_layers",
    "embedding_multiplier",
    "residual_multiplier",
    "logits_scaling",
    "logit_scale",
    "lm_head_bias",
    "use_post_norm",
    "use_parallel_residual",
    "eod_token_id",
    "residual_dropout",
    "embedding_dropout",
    "norm_eps",  # Nemotron's LayerNorm1P
    "norm_epsilon",  # StarCoder2's LayerNorm
    "layer_norm_eps",  # read in attention by Persimmon's QK LayerNorm
    "mtp_layer_types",
    "mtp_mlp_layer_types",
    # the fused families (attn_np.hf.fused): MLP width and activation,
    # dropouts, GPT-2's sequence-summary head; cross-attention modules a
    # GPT-2 decoder may add beside its self-attention (left unchanged)
    "n_inner",
    "n_ctx",  # CodeGen's, unused by its model
    "activation_function",
    "afn",
    "resid_pdrop",
    "embd_pdrop",
    "emb_pdrop",
    "attn_pdrop",
    "summary_type",
    "summary_use_proj",
    "summary_activation",
    "summary_proj_to_labels",
    "summary_first_dropout",
    "add_cross_attention",
    # switches of precision only: GPT-BigCode's float32 softmax, BLOOM's
    # output projection summed slice by slice (pretraining_tp)
    "attention_softmax_in_fp32",
    "scale_attention_softmax_in_fp32",
    "slow_but_exact",
    # MPT outside its attention: the MLP, the embedding, the norms; HF's
    # MptModel has no position table (learned_pos_emb) and no bias in
    # its attention (no_bias), whatever these say
    "expansion_ratio",
    "max_seq_len",
    "learned_pos_emb",
    "init_device",
    "no_bias",
    "embedding_fraction",
    "norm_type",
}

_ATTENTION = {
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "attention_bias",
    "layer_types",
    "sliding_window",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "query_pre_attn_scalar",
    "attn_logit_softcapping",
    # Falcon
    "alibi",
    "bias",
    "multi_query",
    "new_decoder_architecture",
    "num_kv_heads",
    # Llama 4
    "attention_chunk_size",
    "no_rope_layers",
    "use_qk_norm",
    "attn_temperature_tuning",
    "floor_scale",
    "attn_scale",
    "text_config",
    # MLA (DeepSeek-V2/V3)
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "qk_head_dim",
    "v_head_dim",
    "rope_interleave",
    # DeepSeek-V3.2's lightning indexer (chapter 13)
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    # Qwen3-Next's linear-attention layers (chapter 12's GatedDeltaNet)
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "rope_local_base_freq",  # Gemma 3 before transformers 5
    "full_attention_interval",  # Qwen3-Next: read by config.layer_types
    "num_hidden_layers",
    # issue 44: biases under other keys, Granite's scale, what refuses
    "use_bias",
    "qkv_bias",
    "use_qkv_bias",
    "attention_out_bias",
    "attention_multiplier",
    "clip_qkv",
    "qk_layernorm",
    "rotary_dim",  # MiniMax-M2's partial RoPE
    # the fused families (attn_np.hf.fused)
    "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx",
    "reorder_and_upcast_attn",
    "attn_config",  # MPT's, every key checked there
    # Phi-3: read by its LongRoPE only (a rope_type refused there)
    "original_max_position_embeddings",
}
# Keys only some families read: set (not null, false, 0 or empty) in
# another family's config, each is refused by name, since that family's
# layer would silently ignore it (a Llama config with qkv_bias: true).
_FAMILY_KEYS = {
    "use_bias": ("ernie4_5", "ernie4_5_moe", "starcoder2"),
    "qkv_bias": ("qwen2_moe",),
    "use_qkv_bias": ("stablelm",),
    "attention_out_bias": ("seed_oss",),
    "attention_multiplier": (
        "granite",
        "granitemoe",
        "granitemoeshared",
        "hyperclovax",
    ),
    "clip_qkv": ("olmo", "olmoe"),  # refused there too, when set
    "qk_layernorm": ("stablelm", "persimmon"),  # refused by StableLM
    "use_qk_norm": ("llama4_text", "cohere", "glm4_moe", "sarvam_moe"),
    "no_rope_layers": ("llama4_text", "smollm3"),
    "rotary_dim": ("minimax_m2", "codegen"),
    "alibi": ("falcon",),
    "multi_query": ("falcon", "gpt_bigcode"),
    "scale_attn_weights": ("gpt2", "gpt_bigcode"),
    "scale_attn_by_inverse_layer_idx": ("gpt2",),
    "reorder_and_upcast_attn": ("gpt2",),
    "attn_config": ("mpt",),
    "original_max_position_embeddings": ("phi3",),
    "new_decoder_architecture": ("falcon",),
    "bias": ("falcon",),
    "num_kv_heads": ("falcon",),
}
# Features attention_from_hf does not build: refused by name when on.
_REFUSED = {
    "use_mrope": "multimodal RoPE sections (Qwen2.5-VL)",
    "use_bidirectional_attention": (
        "bidirectional attention with a symmetric window, EmbeddingGemma's: "
        "built for gemma3_text only"
    ),
}
# The refused features a family builds after all.
_BUILT_BY = {"use_bidirectional_attention": ("gemma3_text",)}


_MLA_ELSEWHERE = (
    "DeepSeek's multi-head latent attention under another model_type "
    "(built for deepseek_v2/v3/v32 only; not yet checked against this "
    "family)"
)
_GATE = "an output gate from its own "
# Issue 44: decoder families examined in transformers 5.24.0 and refused,
# model_type -> the part (or config key) their attention needs.
_NOT_BUILT = {
    "ministral3": (
        "a query scale by position, rope_parameters' "
        "llama_4_scaling_beta (1 + beta * log(1 + floor(pos / "
        "original_max_position_embeddings)))"
    ),
    "hunyuan_v1_dense": (
        "a learned QK RMSNorm after RoPE (query_layernorm, "
        "key_layernorm) and rope_type dynamic with alpha"
    ),
    "hunyuan_v1_moe": (
        "a learned QK RMSNorm after RoPE (query_layernorm, "
        "key_layernorm) and rope_type dynamic with alpha"
    ),
    "bitnet": "attn_sub_norm, an RMSNorm of the heads before o_proj",
    "nanochat": (
        "RoPE turned the other way (its rotate_half gives (x2, -x1))"
    ),
    "diffllama": (
        "differential attention (two softmaxes, lambda_q1, lambda_k1, "
        "lambda_q2, lambda_k2)"
    ),
    "doge": "a dynamic mask from the values (A, dt_proj)",
    "phi": "an output projection named dense and qk_layernorm",
    "lfm2": "short-convolution layers, out_proj and q_layernorm names",
    "lfm2_moe": "short-convolution layers, out_proj and q_layernorm names",
    "afmoe": _GATE + "gate_proj (sigmoid) with NoPE full layers",
    "laguna": _GATE + "g_proj",
    "dory": _GATE + "gate_proj with sqk and s_gate",
    "beam": _GATE + "gate_proj with gate_bias",
    "granite_swa": "a RoPE base per layer or none (layer_rope_theta)",
    "granitemoe_swa": "a RoPE base per layer or none (layer_rope_theta)",
    "zaya": (
        "convolutions on q and k (conv_qk_depthwise, conv_qk_grouped), "
        "a delayed value projection and a QK temperature"
    ),
    "glm4_moe_lite": _MLA_ELSEWHERE,
    "minicpm3": _MLA_ELSEWHERE,
    "youtu": _MLA_ELSEWHERE,
    "mistral4": _MLA_ELSEWHERE,
}
