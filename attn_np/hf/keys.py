"""Which Hugging Face config keys :func:`~attn_np.attention_from_hf` reads,
which it ignores as harmless metadata, which it refuses by name, and which
families it refuses with the part they need (chapter 10).

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
    # encoders beside the language model, whose keys sit at the top
    # (Phi-4-multimodal): their own layers, not the decoder's attention
    "audio_config",
    "vision_config",
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
    "lambda_std_dev",  # DiffLlama: its lambda vectors' initial spread
    # OLMo Hybrid's Gated DeltaNet: how A_log and dt_bias are drawn
    "linear_a_log_min",
    "linear_a_log_max",
    "linear_dt_min",
    "linear_dt_max",
    "linear_dt_init_floor",
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
    # Kimi Linear's spellings of its MoE and of max_position_embeddings
    "model_max_length",
    "sep_token_id",  # HunYuan MoE's
    "moe_renormalize",
    "num_expert_group",
    "num_experts_per_token",
    # the MoE and vocabulary of Aria, EXAONE-MoE, Hunyuan V3, Apertus 1.5
    "moe_topk",
    "num_shared_experts",
    # AFMoE: its embedding's muP scale, dense MLP layers, router scale
    "mup_enabled",
    "num_dense_layers",
    "route_scale",
    "enable_moe_fp32_combine",
    # Laguna's router (its MoE outside the attention module)
    "moe_apply_router_weight_on_input",
    "moe_routed_scaling_factor",
    "moe_router_logit_softcapping",
    "router_scaling_factor",
    "output_vocab_size",
    # keys of released config.json files that do not shape attention
    "apply_residual_connection_post_layernorm",
    "cache_implementation",
    "experts_per_token",
    "initial_context_length",
    "quantization_config",
    "max_sequence_length",
    # the other families': MoE layouts, MTP heads, the embedding, the
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
    # Cohere 2 MoE's experts, MiniCPM3's and Youtu's scales and init
    "shared_expert_combination_strategy",
    "expert_selection_fn",
    "prefix_dense_intermediate_size",
    "scale_emb",
    "scale_depth",
    "dim_model_base",
    "embedding_initializer_range",
    # OPT, BioGPT, XGLM, CTRL, GPT-J, GPT-Neo: MLP widths, dropouts,
    # where the LayerNorms sit, the embedding's projection and scale
    "ffn_dim",
    "do_layer_norm_before",
    "_remove_final_layer_norm",
    "word_embed_proj_dim",
    "layer_norm_elementwise_affine",
    "dropout",
    "activation_function",
    "activation_dropout",
    "layerdrop",
    "init_std",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "scale_embedding",
    "decoder_start_token_id",
    "add_cross_attention",  # XGLM: a second module; self_attn unchanged
    "dff",
    "n_inner",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "resid_dropout",
    "embed_dropout",
    "classifier_dropout",
    # ModernBERT's decoder: its heads, norms, MLP and special tokens
    "classifier_activation",
    "classifier_bias",
    "cls_token_id",
    "decoder_bias",
    "initializer_cutoff_factor",
    "mlp_dropout",
    "norm_bias",
    "pooling",  # Cohere Compass: its classification head's pooling
    # LFM2: its convolutions and MLP
    "conv_bias",
    "conv_L_cache",
    "block_multiple_of",
    "block_ffn_dim_multiplier",
    "block_auto_adjust_ff_dim",
    "use_expert_bias",
    # Bamba, Jamba, Falcon-H1: their Mamba mixers, MoE and multipliers
    # outside the attention module (Falcon-H1's attention_in_multiplier
    # and attention_out_multiplier scale its input and output in the
    # decoder layer)
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_n_groups",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "mamba_chunk_size",
    "mamba_conv_bias",
    "mamba_proj_bias",
    "mamba_d_ssm",
    "mamba_norm_before_gate",
    "mamba_rms_norm",
    "mamba_dt_rank",
    "use_mamba_kernels",
    "use_mambapy",
    "use_associative_scan",
    "time_step_limit",
    "z_loss_coefficient",
    "num_logits_to_keep",
    "expert_layer_period",
    "expert_layer_offset",
    "projectors_bias",
    "lm_head_multiplier",
    "mlp_multipliers",
    "ssm_multipliers",
    "ssm_in_multiplier",
    "ssm_out_multiplier",
    "attention_in_multiplier",
    "attention_out_multiplier",
    # Nemotron-H's Mamba-2 mixers (and their older mamba_* spellings),
    # MoE, MLP and residual stream
    "ssm_state_size",
    "mamba_num_heads",
    "mamba_head_dim",
    "mamba_hidden_act",
    "mamba_ssm_cache_dtype",
    "mamba_dt_min",
    "mamba_dt_max",
    "mamba_dt_limit",
    "mamba_dt_init_floor",
    "n_groups",
    "conv_kernel",
    "expand",
    "time_step_min",
    "time_step_max",
    "time_step_floor",
    "use_conv_bias",
    "chunk_size",
    "moe_shared_expert_intermediate_size",
    "moe_latent_size",
    "moe_shared_expert_overlap",
    "mtp_layers_block_type",
    "mlp_hidden_act",
    "residual_in_fp32",
    "rescale_prenorm_residual",
    # the fused families (attn_np.hf.fused): MLP width and activation,
    # dropouts, GPT-2's sequence-summary head; cross-attention modules a
    # GPT-2 decoder may add beside its self-attention (left unchanged)
    "n_ctx",  # CodeGen's, unused by its model
    "afn",
    "emb_pdrop",
    "summary_type",
    "summary_use_proj",
    "summary_activation",
    "summary_proj_to_labels",
    "summary_first_dropout",
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
    # Gemma 3n and Gemma 4 outside attention: AltUp, LAuReL, per-layer
    # inputs, the MLP's sparsity and width, MoE blocks
    "activation_sparsity_pattern",
    "altup_active_idx",
    "altup_coef_clip",
    "altup_correct_scale",
    "altup_num_inputs",
    "laurel_rank",
    "hidden_size_per_layer_input",
    "vocab_size_per_layer_input",
    "enable_moe_block",
    "use_double_wide_mlp",
    "top_k_experts",
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
    # Mistral Large 4 (attn_np.hf.families_mistral): which layers share
    # latents and top-k selections, and the keys that fill them
    "indexer_types",
    "kv_source_layers",
    "index_topk_pattern",
    "index_topk_freq",
    "index_skip_topk_offset",
    # Qwen3-Next's linear-attention layers (chapter 12's GatedDeltaNet)
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_allow_neg_eigval",  # OLMo Hybrid's doubled beta
    # Kimi Linear's Kimi Delta Attention (attn_np.hf.kimi): its sizes in
    # either spelling, and its MLA's NoPE switch
    "linear_attn_config",
    "linear_num_heads",
    "linear_head_dim",
    "mla_use_nope",
    "rope_local_base_freq",  # Gemma 3 before transformers 5
    "full_attention_interval",  # Qwen3-Next: read by config.layer_types
    "num_hidden_layers",
    # biases under other keys, Granite's scale, what refuses
    "use_bias",
    "global_attn_every_n_layers",
    "local_attention",  # ModernBERT's decoder: twice its window
    "full_attn_idxs",  # LFM2's attention layers
    "qkv_bias",
    "use_qkv_bias",
    "attention_out_bias",
    "attention_multiplier",
    "clip_qkv",
    "qk_layernorm",
    "rotary_dim",  # MiniMax-M2's partial RoPE
    # attn_np.hf.families_more: which layers Cohere 2 MoE turns (dense
    # or MoE per layer; DeepSeek-V3.2 writes it too, and its layer does
    # not read it), Granite SWA's RoPE base per layer
    "mlp_layer_types",
    "prefix_dense_sliding_window_pattern",
    "layer_rope_theta",
    # OPT's biases; GPT-Neo's layer kinds and window
    "enable_bias",
    "attention_types",
    "attention_layers",
    "window_size",
    # which layers of Bamba and Jamba are attention; Falcon-H1's keys
    "attn_layer_indices",
    "attn_layer_period",
    "attn_layer_offset",
    "key_multiplier",
    "position_embedding_type",  # Granite 4: "rope" or null (NoPE)
    "hybrid_override_pattern",  # Nemotron-H's layer kinds, older files
    # the fused families (attn_np.hf.fused)
    "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx",
    "reorder_and_upcast_attn",
    "attn_config",  # MPT's, every key checked there
    # Phi-3: read by its LongRoPE only (a rope_type refused there)
    "original_max_position_embeddings",
    # Gemma 3n and Gemma 4 (attn_np.hf.families_gemma)
    "num_kv_shared_layers",
    "attention_k_eq_v",
    "global_head_dim",
    "num_global_key_value_heads",
    "per_layer_config",
    # MiMo-V2-Flash (attn_np.hf.families_mimo): its value scale, and the
    # window's older spelling, which its configuration class reads as
    # sliding_window = sliding_window_size + 1
    "attention_value_scale",
    "sliding_window_size",
    # Laguna (attn_np.hf.families_laguna): its gate's granularity and
    # its query heads per layer
    "gating",
    "num_attention_heads_per_layer",
}
_GEMMAS = ("gemma3n_text", "gemma4_text", "gemma4_unified_text")
# Keys only some families read: set (not null, false, 0 or empty) in
# another family's config, each is refused by name, since that family's
# layer would silently ignore it (a Llama config with qkv_bias: true).
_FAMILY_KEYS = {
    "linear_attn_config": ("kimi_linear",),
    "linear_num_heads": ("kimi_linear",),
    "linear_head_dim": ("kimi_linear",),
    "mla_use_nope": ("kimi_linear",),
    # Nemotron-H: the Mamba mixer's biases (its attention has none)
    "use_bias": ("ernie4_5", "ernie4_5_moe", "starcoder2", "nemotron_h"),
    "global_attn_every_n_layers": ("afmoe", "modernbert-decoder"),
    "local_attention": ("modernbert-decoder",),
    "full_attn_idxs": ("lfm2",),
    "qkv_bias": ("qwen2_moe",),
    "use_qkv_bias": ("stablelm",),
    "attention_out_bias": ("seed_oss",),
    "attention_multiplier": (
        "granite",
        "granitemoe",
        "granitemoeshared",
        "hyperclovax",
        "granite_swa",
        "granitemoe_swa",
        "granitemoehybrid",
    ),
    "clip_qkv": ("olmo", "olmoe"),  # the projection's clamp
    "linear_allow_neg_eigval": ("olmo_hybrid",),
    "qk_layernorm": ("stablelm", "phi", "persimmon"),  # refused by some
    "use_qk_norm": ("llama4_text", "cohere", "glm4_moe", "sarvam_moe"),
    "no_rope_layers": ("llama4_text", "smollm3", "mistral_large4_text"),
    **dict.fromkeys(
        (
            "indexer_types",
            "kv_source_layers",
            "index_topk_pattern",
            "index_topk_freq",
            "index_skip_topk_offset",
        ),
        ("mistral_large4_text",),
    ),
    "rotary_dim": ("minimax_m2", "gptj", "codegen"),
    "enable_bias": ("opt",),
    "attention_types": ("gpt_neo",),
    "attention_layers": ("gpt_neo",),
    "window_size": ("gpt_neo",),
    "attn_layer_indices": ("bamba",),
    "attn_layer_period": ("jamba",),
    "attn_layer_offset": ("jamba",),
    "key_multiplier": ("falcon_h1",),
    "position_embedding_type": ("granitemoehybrid",),
    "layer_rope_theta": ("granite_swa", "granitemoe_swa"),
    "prefix_dense_sliding_window_pattern": ("cohere2_moe",),
    "alibi": ("falcon",),
    "multi_query": ("falcon", "gpt_bigcode"),
    "scale_attn_weights": ("gpt2", "gpt_bigcode"),
    "scale_attn_by_inverse_layer_idx": ("gpt2",),
    "reorder_and_upcast_attn": ("gpt2",),
    "attn_config": ("mpt",),
    "original_max_position_embeddings": ("phi3", "phi4_multimodal"),
    "new_decoder_architecture": ("falcon",),
    "bias": ("falcon",),
    "num_kv_heads": ("falcon",),
    "num_kv_shared_layers": _GEMMAS,
    "attention_k_eq_v": _GEMMAS[1:],
    "global_head_dim": _GEMMAS[1:],
    "num_global_key_value_heads": _GEMMAS[1:],
    "per_layer_config": _GEMMAS[1:],
    "attention_value_scale": ("mimo_v2_flash",),
    "gating": ("laguna",),
    "num_attention_heads_per_layer": ("laguna",),
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


_GATE = "an output gate from its own "
# Decoder families examined in transformers 5.24.0 and refused,
# model_type -> the part (or config key) their attention needs.
_NOT_BUILT = {
    "doge": "a dynamic mask from the values (A, dt_proj)",
    "dory": (
        "nGPT's attention: queries and keys L2-normalised to unit length, "
        "the queries times sqk^2 per feature after RoPE, an output gate "
        "sigmoid(gate_proj(x) s_gate^2) and an L2 norm of the gated heads "
        "before o_proj (attn_sub_norm), in recurrent layers run "
        "n_recurrent_loops times over shared or per-loop caches"
    ),
    "zaya": (
        "convolutions on q and k (conv_qk_depthwise, conv_qk_grouped), "
        "a delayed value projection and a QK temperature"
    ),
    "zamba": (
        "an input and an output of different widths (q, k and v read 2 * "
        "hidden_size features, the hidden state beside the embeddings; "
        "o_proj writes hidden_size) in a block shared by several layers"
    ),
    "zamba2": (
        "an input and an output of different widths (q, k and v read 2 * "
        "hidden_size features; o_proj writes hidden_size) and LoRA "
        "adapters on q, k and v per use of the shared block"
    ),
    "axk2": (
        "a fused q_gate_proj reading the query latent before and after "
        "q_a_layernorm (2 * q_lora_rank features) for the queries and a "
        "sigmoid output gate, in DeepSeek-V3.2's indexed latent attention"
    ),
    "bailing_hybrid": (
        "Kimi Delta Attention layers (linear_attention: f_proj, A_log, "
        "dt_bias, b_proj, conv1d, a gated o_norm) beside latent attention "
        "with a per-head sigmoid output gate (g_proj)"
    ),
    "cpmant": (
        "a bucketed relative-position bias by segment (position_bias, "
        "segment_types, position_bias_num_buckets) added to the scores, "
        "under the names project_q, project_k, project_v, attention_out"
    ),
    "deepseek_v4": (
        "one key-value head read as both key and value (kv_proj), "
        "compressed layers (compressed_sparse_attention with an indexer, "
        "heavily_compressed_attention; compress_rates), sinks, RoPE at "
        "position -i on the output and a grouped low-rank output "
        "projection (o_a_proj, o_b_proj, o_groups)"
    ),
    "dots3_note_text": (
        "latent attention per layer (per_layer_config) with an RMSNorm on "
        "the shared RoPE key (k_rope_only_layernorm), latent scales "
        "sqrt(hidden_size / q_lora_rank) and sqrt(hidden_size / "
        "kv_lora_rank), a per-head sigmoid output gate (g_proj), sliding "
        "layers and an indexer on indexed_attention layers"
    ),
    "git": (
        "a prefix mask (the image tokens attend to one another both ways, "
        "the text tokens to them and causally to the text) and BERT's "
        "block (query, key, value, output.dense, a post-LayerNorm)"
    ),
    "glm_moe_dsa": (
        "top-k selections shared across layers (indexer_types: shared "
        "layers reuse the previous full layer's) and an indexer with "
        "interleaved RoPE, in DeepSeek-V3.2's indexed latent attention"
    ),
    "hrm_text": (
        _GATE + "gate_proj (one sigmoid per feature) in one stack of "
        "layers run H_cycles * (L_cycles + 1) times, each run caching at "
        "layer_idx + cycle_offset"
    ),
    "hy_v4": (
        "top-k selections shared across layers (indexer_types: shared "
        "layers reuse the previous full layer's), sinks "
        "(learnable_sink_init) and a sigmoid output gate (gate_proj), in "
        "DeepSeek-V3.2's indexed latent attention"
    ),
    "inkling_text": (
        "a relative-position bias computed from the tokens (r_proj, "
        "rel_logits_proj over rel_extent) instead of RoPE, short "
        "convolutions on keys and values (k_sconv, v_sconv), scale 1 / "
        "head_dim, a query temperature by log position (log_scaling_alpha) "
        "and other head counts on sliding layers (swa_num_attention_heads)"
    ),
    "inkling2_text": (
        "a relative-position bias computed from the tokens instead of "
        "RoPE, short convolutions on keys and values (dynamic on full "
        "layers), an L2 clip of queries and keys (qk_l2_clip_threshold), "
        "sinks from the tokens (sink_proj), an output gate "
        "(o_proj.gate_proj) and keys and values read from other hidden "
        "states on full layers"
    ),
    "inkling2_loop_text": (
        "Inkling 2's attention (a relative-position bias from the tokens, "
        "short convolutions on keys and values, an L2 clip, sink_proj, an "
        "output gate) in layers looped loop_num_passes times, their "
        "queries, keys and values read from gated messages of past passes"
    ),
    "jetmoe": (
        "a mixture of attention heads (experts.map, experts.reduce: a "
        "router picks num_experts_per_tok query and output projections) "
        "beside one shared kv_proj"
    ),
    "mamba": "no attention layer: Mamba's selective state-space mixer in "
    "every layer",
    "mamba2": "no attention layer: Mamba-2's state-space mixer (SSD) in "
    "every layer",
    "falcon_mamba": "no attention layer: Mamba's selective state-space "
    "mixer, with RMSNorms of B, C and dt, in every layer",
    "rwkv": "no attention layer: RWKV's time mixing (a WKV recurrence "
    "with time_decay, time_first and a receptance gate) in every layer",
    "minimax": (
        "lightning attention layers (linear_attention: qkv_proj, a decay "
        "per head from the slope rate, block_size, an RMSNorm and "
        "output_gate before out_proj)"
    ),
    "minimax_m3_vl_text": (
        "a block-sparse indexer on minimax_m3_sparse layers (index_n_heads, "
        "index_block_size, index_topk_blocks, index_local_blocks: per KV "
        "group, the top key blocks and the local ones)"
    ),
    "mllama_text_model": (
        "cross-attention layers to the vision states "
        "(cross_attention_layers: q_norm, k_norm, a tanh gate "
        "cross_attn_attn_gate) among its self-attention layers"
    ),
    "moshi": (
        "a depth decoder (depth_decoder_config) whose q, k, v and o "
        "projections hold one weight per codebook (MoshiFlexibleLinear) "
        "and use no RoPE, beside the temporal decoder"
    ),
    "qwen4_exp_text": (
        "a QSA indexer on indexed_attention layers (index_qk_proj; "
        "indexer_budget, indexer_compress_ratio: tokens chosen from "
        "compressed key blocks) on Qwen3-Next's gated attention"
    ),
    "xlm": (
        "bidirectional attention unless causal is set (causal=False by "
        "default: a masked or translation language model), under the names "
        "q_lin, k_lin, v_lin, out_lin"
    ),
    "xlnet": (
        "two-stream relative attention (content and query streams, "
        "relative keys through r with r_w_bias and r_r_bias, segment bias "
        "r_s_bias and seg_embed) over a permutation mask with memory"
    ),
}


# Where a file with a sliding_window but no layer_types has its windows,
# as the family's configuration class fills layer_types (None: every
# layer; n: every n-th layer full). Read here, for the layers only.
_CLASS_WINDOWS = {
    "phimoe": None,
    "phi3": None,
    "phi4_multimodal": None,
    "starcoder2": None,
    "cohere2": 4,
    "afmoe": 4,
    "exaone4": 4,
    "exaone_moe": 4,
    "kolibri1": 5,
    "cohere2_moe": 4,
}

# The RoPE base and partial_rotary_factor a family's configuration class
# gives a file that writes neither (its default_theta; the "assign
# default for BC" partial factors of Nemotron, GLM, StableLM).
_CLASS_ROPE = {
    "mixtral": (1e6, 1.0),
    "phimoe": (1e6, 1.0),
    "cwm": (1e6, 1.0),
    "solar_open": (1e6, 1.0),
    "helium": (1e5, 1.0),
    "ernie4_5": (5e5, 1.0),
    "ernie4_5_moe": (5e5, 1.0),
    "apertus": (1.2e7, 1.0),
    "olmo3": (5e5, 1.0),
    "flex_olmo": (5e5, 1.0),
    "minimax_m2": (5e6, 1.0),
    "smollm3": (2e6, 1.0),
    "cohere": (5e5, 1.0),
    "nemotron": (1e4, 0.5),
    "glm": (1e4, 0.5),
    "glm4": (1e4, 0.5),
    "glm4_moe": (1e4, 0.5),
    "stablelm": (1e4, 0.25),
    "persimmon": (1e4, 0.5),
    "exaone": (5e5, 1.0),
    "apertus1p5_text": (1.2e7, 1.0),
    "hy_v3": (11158840.0, 1.0),
    "sarvam_moe": (8e6, 1.0),
    "phi": (1e4, 0.5),
    "bamba": (1e4, 0.5),
    "emu3_text_model": (1e6, 1.0),
    "lfm2": (1e6, 1.0),
    "lfm2_moe": (1e6, 1.0),
}
