"""attn_np.costs.catalogue: latent and window entries, and from_hf_config.

Every config dict below is written from the model's published config.json
(the Hugging Face Hub file named in its comment). Keys that do not shape the
cache (token ids, dropout, rope scaling, ...) are left out where noted; the
keys that do are copied as published, including the ones that must be
ignored (Qwen2's sliding_window with use_sliding_window false).
"""

import dataclasses
import json
from pathlib import Path

import pytest

from attn_np.costs import (
    CATALOGUE,
    LATENT_MODELS,
    MODELS,
    WINDOW_MODELS,
    GiB,
    ModelConfig,
    cached_positions,
    from_hf_config,
    get_model,
    kv_bytes_per_token,
    kv_cache_bytes,
    max_concurrent_sequences,
    max_context,
    weight_bytes,
)
from attn_np.costs.model import FULL, SLIDING

L128K = 131_072

# --- configs, written from the published files ---------------------------

# huggyllama/llama-65b config.json (LLaMA 1, converted with transformers
# 4.28, before num_key_value_heads existed: its absence means MHA).
LLAMA_65B = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 8192,
    "initializer_range": 0.02,
    "intermediate_size": 22016,
    "max_sequence_length": 2048,
    "model_type": "llama",
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.28.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}

# meta-llama/Meta-Llama-3-8B config.json (no head_dim: 4096 / 32 = 128).
LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}

# mistralai/Mistral-7B-v0.1 config.json: sliding_window alone, which for
# model_type "mistral" means a window in every layer.
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}

# Qwen/Qwen2.5-7B config.json: sliding_window holds a number, and
# use_sliding_window false says it is not used.
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_mrope": False,
    "use_sliding_window": False,
    "vocab_size": 152064,
}

# tiiuae/falcon-7b config.json: no num_key_value_heads, multi_query true
# (one key/value head); no head_dim: 4544 / 71 = 64.
FALCON_7B = {
    "alibi": False,
    "apply_residual_connection_post_layernorm": False,
    "architectures": ["FalconForCausalLM"],
    "attention_dropout": 0.0,
    "bias": False,
    "bos_token_id": 11,
    "eos_token_id": 11,
    "hidden_dropout": 0.0,
    "hidden_size": 4544,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "falcon",
    "multi_query": True,
    "new_decoder_architecture": False,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "parallel_attn": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 65024,
}

# google/gemma-2-9b config.json: sliding_window with no layer_types; for
# model_type "gemma2" Hugging Face alternates window and full layers,
# starting with a window layer.
GEMMA_2_9B = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "torch_dtype": "float32",
    "vocab_size": 256000,
}

# google/gemma-3-27b-it config.json: the language model nested under
# text_config (vision_config abridged); no sliding_window_pattern, so
# gemma3_text's default of 6 applies (five window layers, then a full one).
GEMMA_3_27B_IT = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}

# google/gemma-3-1b-it config.json: sliding_window_pattern spelled out, and
# one key/value head (MQA).
GEMMA_3_1B_IT = {
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": [1, 106],
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "initializer_range": 0.02,
    "intermediate_size": 6912,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 262144,
}

# openai/gpt-oss-120b config.json: layer_types spelled out, 18 x (window,
# full); quantization_config abridged.
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "num_local_experts": 128,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {"quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "transformers_version": "4.55.0.dev0",
    "use_cache": True,
    "vocab_size": 201088,
}

# deepseek-ai/DeepSeek-V2 config.json (auto_map and rope_scaling
# abridged): MLA, kv_lora_rank 512 and qk_rope_head_dim 64.
DEEPSEEK_V2 = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "ep_size": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v2",
    "moe_intermediate_size": 1536,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 160,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 128,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 60,
    "num_key_value_heads": 128,
    "pretraining_tp": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "routed_scaling_factor": 16.0,
    "scoring_func": "softmax",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 3,
    "topk_method": "group_limited_greedy",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 102400,
}

# deepseek-ai/DeepSeek-V3 config.json (auto_map, quantization_config and
# rope_scaling abridged).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}

# name: (config, catalogue entry or None, kind, bf16 bytes per token,
#        bf16 bytes of one sequence of 131,072 tokens), all by hand.
CASES = {
    "llama-65b": (
        LLAMA_65B,
        None,
        "MHA",
        2 * 80 * 64 * 128 * 2,  # 2.5 MiB
        2 * 80 * 64 * 128 * 2 * L128K,  # 320 GiB
    ),
    "llama-3-8b": (
        LLAMA_3_8B,
        "llama-3-8b",
        "GQA",
        2 * 32 * 8 * 128 * 2,  # 128 KiB
        16 * GiB,
    ),
    "mistral-7b-v0.1": (
        MISTRAL_7B_V01,
        "mistral-7b-v0.1",
        "GQA, window 4096 in every layer",
        2 * 32 * 8 * 128 * 2,
        2 * 32 * 8 * 128 * 2 * 4096,  # 512 MiB: the window caps it
    ),
    "qwen2.5-7b": (
        QWEN25_7B,
        "qwen2.5-7b",
        "GQA",
        2 * 28 * 4 * 128 * 2,  # 56 KiB
        7 * GiB,
    ),
    "falcon-7b": (
        FALCON_7B,
        "falcon-7b",
        "MQA",
        2 * 32 * 1 * 64 * 2,  # 8 KiB
        1 * GiB,
    ),
    "gemma-2-9b": (
        GEMMA_2_9B,
        "gemma-2-9b",
        "GQA, window 4096 in 21 of 42 layers",
        2 * 42 * 8 * 256 * 2,  # 336 KiB
        2 * 8 * 256 * 2 * (21 * L128K + 21 * 4096),
    ),
    "gemma-3-27b": (
        GEMMA_3_27B_IT,
        "gemma-3-27b",
        "GQA, window 1024 in 52 of 62 layers",
        2 * 62 * 16 * 128 * 2,  # 496 KiB
        2 * 16 * 128 * 2 * (10 * L128K + 52 * 1024),
    ),
    "gemma-3-1b": (
        GEMMA_3_1B_IT,
        None,
        "MQA, window 512 in 22 of 26 layers",
        2 * 26 * 1 * 256 * 2,  # 26 KiB
        2 * 1 * 256 * 2 * (4 * L128K + 22 * 512),
    ),
    "gpt-oss-120b": (
        GPT_OSS_120B,
        "gpt-oss-120b",
        "GQA, window 128 in 18 of 36 layers",
        2 * 36 * 8 * 64 * 2,  # 72 KiB
        2 * 8 * 64 * 2 * (18 * L128K + 18 * 128),
    ),
    "deepseek-v2": (
        DEEPSEEK_V2,
        "deepseek-v2",
        "MLA",
        60 * (512 + 64) * 2,  # 67.5 KiB
        60 * (512 + 64) * 2 * L128K,
    ),
    "deepseek-v3": (
        DEEPSEEK_V3,
        "deepseek-v3",
        "MLA",
        61 * (512 + 64) * 2,  # 68.625 KiB
        61 * (512 + 64) * 2 * L128K,
    ),
}

SHAPE = ("n_layers", "n_heads", "n_kv_heads", "head_dim", "d_model")
SHAPE += ("sliding_window", "layer_windows", "d_latent_kv", "d_rope")
SHAPE += ("d_latent_q", "d_head_v")


def shape(cfg: ModelConfig) -> dict:
    return {k: getattr(cfg, k) for k in SHAPE}


# --- the catalogue's new entries -----------------------------------------


def test_catalogue_holds_every_table():
    assert set(MODELS) | set(LATENT_MODELS) | set(WINDOW_MODELS) == set(
        CATALOGUE
    )
    assert len(CATALOGUE) == 8 + 2 + 4
    for name, cfg in CATALOGUE.items():
        assert cfg.name == name and cfg.source and cfg.cite
        assert get_model(name) is cfg


def test_chapter_3_models_keep_a_full_cache():
    # Chapters 3 and 4 print these: no window, numbers unchanged.
    for cfg in MODELS.values():
        assert cfg.n_window_layers == 0 and cfg.family != "MLA"
        assert kv_cache_bytes(cfg, L128K) == kv_bytes_per_token(cfg) * L128K
    assert kv_cache_bytes("mistral-7b", L128K) == 16 * GiB


def test_mistral_7b_is_v0_1_counted_without_its_window():
    # The entry's parameter count is v0.1's (vocabulary 32000); v0.3's
    # vocabulary of 32768 would add 2 * 768 * 4096 weights.
    old, new = MODELS["mistral-7b"], WINDOW_MODELS["mistral-7b-v0.1"]
    assert "Mistral-7B-v0.1" in old.source
    assert old.n_params == new.n_params == 7_241_732_096
    assert dataclasses.replace(new, name="mistral-7b", source=old.source)
    assert shape(old) == shape(new.without_windows())
    assert kv_cache_bytes(new, L128K) * 32 == kv_cache_bytes(old, L128K)


@pytest.mark.parametrize("name", ["deepseek-v2", "deepseek-v3"])
def test_latent_entries(name):
    cfg = LATENT_MODELS[name]
    layers = {"deepseek-v2": 60, "deepseek-v3": 61}[name]
    assert (cfg.n_layers, cfg.n_heads, cfg.head_dim) == (layers, 128, 128)
    assert (cfg.d_latent_kv, cfg.d_rope, cfg.d_latent_q) == (512, 64, 1536)
    assert cfg.family == "MLA" and cfg.kind == "MLA"
    assert cfg.kv_numbers_per_layer == 576
    # n_layers * (d_latent_kv + d_rope) * bytes
    assert kv_bytes_per_token(cfg) == layers * 576 * 2
    assert kv_bytes_per_token(cfg, bytes_per_element=1) == layers * 576
    assert kv_cache_bytes(cfg, 1000, batch=3) == 3 * 1000 * layers * 576 * 2
    # The paper's comparison (DeepSeek-V2, Table 1): 4.5 head dims per
    # layer, against 2 * 128 for MHA with the same heads.
    assert cfg.kv_numbers_per_layer / cfg.head_dim == 4.5
    mha = dataclasses.replace(
        cfg, d_latent_kv=None, d_rope=None, d_latent_q=None
    )
    assert mha.family == "MHA"
    assert kv_bytes_per_token(mha) / kv_bytes_per_token(cfg) == 256 / 4.5


@pytest.mark.parametrize(
    "name, window, n_window, first_full",
    [
        ("mistral-7b-v0.1", 4096, 32, None),
        ("gemma-2-9b", 4096, 21, 1),
        ("gemma-3-27b", 1024, 52, 5),
        ("gpt-oss-120b", 128, 18, 1),
    ],
)
def test_window_entries(name, window, n_window, first_full):
    cfg = WINDOW_MODELS[name]
    assert cfg.sliding_window == window
    assert cfg.n_window_layers == n_window
    wins = cfg.layer_windows
    assert len(wins) == cfg.n_layers and set(wins) <= {window, None}
    if first_full is not None:
        assert wins.index(None) == first_full
        assert all(w == window for w in wins[:first_full])
    # Below the window every layer holds every position.
    assert kv_cache_bytes(cfg, window) == kv_bytes_per_token(cfg) * window
    # Past it, window layers stop growing and full layers go on.
    n_full = cfg.n_layers - n_window
    grow = kv_cache_bytes(cfg, 5 * window) - kv_cache_bytes(cfg, 4 * window)
    per_layer = cfg.kv_numbers_per_layer * 2
    assert grow == n_full * per_layer * window
    assert cached_positions(cfg, 10**6) == n_full * 10**6 + n_window * window
    full = cfg.without_windows()
    assert full.n_window_layers == 0 and full.kind == "GQA"
    assert kv_cache_bytes(full, L128K) == kv_bytes_per_token(cfg) * L128K


def test_window_patterns_by_layer():
    g2 = WINDOW_MODELS["gemma-2-9b"].layer_types
    assert g2[:4] == (SLIDING, FULL, SLIDING, FULL)
    g3 = WINDOW_MODELS["gemma-3-27b"].layer_types
    assert g3[:6] == (SLIDING,) * 5 + (FULL,)
    assert [i for i, t in enumerate(g3) if t == FULL] == list(
        range(5, 62, 6)
    )
    assert g3[-2:] == (SLIDING, SLIDING)
    assert WINDOW_MODELS["gpt-oss-120b"].layer_types[:2] == (SLIDING, FULL)


def test_new_parameter_counts_from_configs():
    # DeepSeek: MLA projections (q_a, q_b, kv_a, kv_b, o and their two
    # norms), dense MLP layers first, then MoE layers (routed and shared
    # experts, router), untied embedding and output layer, main model only.
    def mla(d):
        return (
            d * 1536
            + 1536
            + 1536 * 128 * 192
            + d * 576
            + 512
            + 512 * 128 * 256
            + 128 * 128 * d
            + 2 * d
        )

    d = 7168
    v3 = (
        2 * 129280 * d
        + 61 * mla(d)
        + 3 * 3 * d * 18432
        + 58 * (257 * 3 * d * 2048 + 256 * d + 256)
        + d
    )
    assert LATENT_MODELS["deepseek-v3"].n_params == v3  # 671.0B
    d = 5120
    v2 = (
        2 * 102400 * d
        + 60 * mla(d)
        + 3 * d * 12288
        + 59 * (162 * 3 * d * 1536 + 160 * d)
        + d
    )
    assert LATENT_MODELS["deepseek-v2"].n_params == v2  # 235.7B
    # Gemma 2 9B: four norms per layer, tied embedding.
    d = 3584
    g2 = (
        256000 * d
        + 42 * (d * 4096 + 2 * d * 2048 + 4096 * d + 3 * d * 14336 + 4 * d)
        + d
    )
    assert WINDOW_MODELS["gemma-2-9b"].n_params == g2
    # Gemma 3 27B: the language model (q/k norms of 128) and SigLIP's 27
    # layers of 1152 with the projection into the model width.
    d = 5376
    text = (
        262208 * d
        + 62
        * (d * 4096 + 2 * d * 2048 + 4096 * d + 256 + 4 * d + 3 * d * 21504)
        + d
    )
    e, i = 1152, 4304
    vision = (
        3 * 14 * 14 * e
        + e
        + 64 * 64 * e
        + 27 * (4 * (e * e + e) + e * i + i + i * e + e + 4 * e)
        + 2 * e
    )
    g3 = text + vision + e * d + e
    assert WINDOW_MODELS["gemma-3-27b"].n_params == g3
    assert round(vision / 1e6) == 417  # Gemma Team 2025, Table 1
    # gpt-oss-120b: biased attention with 64 sink logits per layer, 128
    # experts with biases, untied embedding.
    d = 2880
    attn = d * 4096 + 4096 + 2 * (d * 512 + 512) + 4096 * d + d + 64
    moe = d * 128 + 128 + 128 * (d * 5760 + 5760 + 2880 * d + d)
    oss = 2 * 201088 * d + 36 * (attn + 2 * d + moe) + d
    assert WINDOW_MODELS["gpt-oss-120b"].n_params == oss  # 116.83B


def test_existing_functions_work_for_every_entry():
    for cfg in CATALOGUE.values():
        assert kv_bytes_per_token(cfg) > 0
        assert kv_cache_bytes(cfg, 4096, batch=2) > 0
        assert weight_bytes(cfg) == 2 * cfg.n_params
        n = max_concurrent_sequences(cfg, 4096, memory_bytes=2000 * 10**9)
        assert isinstance(n, int) and n >= 0


def test_model_config_validates_new_fields():
    base = MODELS["llama-3-8b"]
    with pytest.raises(ValueError, match="d_latent_kv and d_rope"):
        dataclasses.replace(base, d_latent_kv=512)
    with pytest.raises(ValueError, match="d_latent_q"):
        dataclasses.replace(base, d_latent_q=1536)
    with pytest.raises(ValueError, match="sliding_window must be"):
        dataclasses.replace(base, sliding_window=0)
    with pytest.raises(ValueError, match="layer_types must list 32"):
        dataclasses.replace(base, sliding_window=8, layer_types=(FULL,))
    with pytest.raises(ValueError, match="layer_types must list"):
        dataclasses.replace(
            base, sliding_window=8, layer_types=("chunked",) * 32
        )
    with pytest.raises(ValueError, match="sliding_window is None"):
        dataclasses.replace(base, layer_types=(SLIDING,) * 32)
    listed = dataclasses.replace(
        base, sliding_window=8, layer_types=[SLIDING, FULL] * 16
    )
    assert isinstance(listed.layer_types, tuple)  # stored as a tuple


def test_max_context():
    # Cache alone: 80 GiB / 128 KiB per token = 655,360 tokens.
    assert max_context("llama-3-8b", 80 * GiB) == 655_360
    assert max_context("llama-3-8b", 80 * GiB, batch=8) == 81_920
    assert max_context("llama-3-8b", 80 * GiB, bytes_per_element=1) == (
        1_310_720
    )
    assert max_context("llama-3-8b", 1) == 0
    # Every layer windowed: the cache stops at 512 MiB.
    assert max_context("mistral-7b-v0.1", 512 * 2**20) is None
    assert max_context("mistral-7b-v0.1", 512 * 2**20 - 1) == 4095
    # Mixed: the answer is the largest n that fits, checked around it.
    for name in ("gemma-3-27b", "gpt-oss-120b", "gemma-2-9b"):
        n = max_context(name, 20 * GiB)
        assert kv_cache_bytes(name, n) <= 20 * GiB
        assert kv_cache_bytes(name, n + 1) > 20 * GiB
    with pytest.raises(ValueError, match="memory_bytes"):
        max_context("llama-3-8b", 0)
    with pytest.raises(ValueError, match="batch"):
        max_context("llama-3-8b", GiB, batch=0)


def test_unknown_name_lists_the_catalogue():
    with pytest.raises(ValueError, match="deepseek-v3"):
        get_model("gpt-5")


# --- from_hf_config on the published configs ------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_published_configs(name):
    config, entry, kind, per_token, total = CASES[name]
    cfg = from_hf_config(config)
    assert cfg.kind == kind
    assert cfg.n_params is None
    assert kv_bytes_per_token(cfg) == per_token
    assert kv_cache_bytes(cfg, L128K) == total
    assert kv_cache_bytes(cfg, L128K, batch=8) == 8 * total
    assert kv_cache_bytes(cfg, L128K, bytes_per_element=1) * 2 == total
    if entry is not None:  # the catalogue agrees with the file
        assert shape(cfg) == shape(CATALOGUE[entry])


def test_text_config_is_the_language_model():
    cfg = from_hf_config(GEMMA_3_27B_IT)
    assert (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads) == (62, 32, 16)
    assert (cfg.head_dim, cfg.d_model) == (128, 5376)  # head_dim given
    # The same text config, flattened, reads the same.
    flat = dict(GEMMA_3_27B_IT["text_config"])
    assert shape(from_hf_config(flat)) == shape(cfg)
    # A top-level key that agrees with text_config is fine.
    same = {**GEMMA_3_27B_IT, "num_hidden_layers": 62}
    assert from_hf_config(same).n_layers == 62


def test_explicit_pattern_and_layer_types_agree():
    a = from_hf_config(GEMMA_3_1B_IT)
    types = ([SLIDING] * 5 + [FULL]) * 4 + [SLIDING] * 2
    b = from_hf_config({**GEMMA_3_1B_IT, "layer_types": types})
    assert a.layer_types == b.layer_types == tuple(types)
    c = dict(GEMMA_3_1B_IT)
    del c["sliding_window_pattern"]  # gemma3_text's default is 6 too
    assert from_hf_config(c).layer_types == a.layer_types


def test_qwen2_windows_only_when_used():
    off = from_hf_config(QWEN25_7B)
    assert off.sliding_window is None and off.n_window_layers == 0
    no_key = {
        k: v for k, v in QWEN25_7B.items() if k != "use_sliding_window"
    }
    assert from_hf_config(no_key).n_window_layers == 0  # Qwen2's default
    on = from_hf_config(
        {
            **QWEN25_7B,
            "use_sliding_window": True,
            "sliding_window": 4096,
            "max_window_layers": 20,
        }
    )
    # Hugging Face's Qwen2: layers from max_window_layers on have it.
    assert on.layer_windows == (None,) * 20 + (4096,) * 8


def test_head_dim_absent_and_given():
    assert from_hf_config(LLAMA_3_8B).head_dim == 128  # 4096 // 32
    assert from_hf_config(FALCON_7B).head_dim == 64  # 4544 // 71
    given = {**LLAMA_3_8B, "head_dim": 64}
    assert from_hf_config(given).head_dim == 64  # head_dim wins


def test_kv_heads_conventions():
    assert from_hf_config(LLAMA_65B).n_kv_heads == 64  # absent: MHA
    assert from_hf_config(FALCON_7B).n_kv_heads == 1  # multi_query
    falcon_40b = {  # tiiuae/falcon-40b's attention keys
        **FALCON_7B,
        "hidden_size": 8192,
        "num_attention_heads": 128,
        "num_hidden_layers": 60,
        "new_decoder_architecture": True,
        "num_kv_heads": 8,
    }
    assert from_hf_config(falcon_40b).n_kv_heads == 8
    null = {**LLAMA_3_8B, "num_key_value_heads": None}
    assert from_hf_config(null).n_kv_heads == 32


def test_gpt2_spellings():
    gpt2 = {  # openai-community/gpt2 config.json, attention keys
        "model_type": "gpt2",
        "n_ctx": 1024,
        "n_embd": 768,
        "n_head": 12,
        "n_layer": 12,
        "vocab_size": 50257,
    }
    cfg = from_hf_config(gpt2)
    assert (cfg.n_layers, cfg.n_heads, cfg.head_dim) == (12, 12, 64)
    assert kv_bytes_per_token(cfg) == 2 * 12 * 12 * 64 * 2


def test_path_and_folder(tmp_path):
    folder = tmp_path / "Mistral-7B-v0.1"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(MISTRAL_7B_V01))
    a = from_hf_config(folder / "config.json")
    b = from_hf_config(str(folder))
    assert a.name == b.name == "Mistral-7B-v0.1"
    assert str(folder) in a.source
    assert shape(a) == shape(WINDOW_MODELS["mistral-7b-v0.1"])
    assert from_hf_config(MISTRAL_7B_V01, name="m").name == "m"
    other = tmp_path / "gemma.json"
    other.write_text(json.dumps(GEMMA_2_9B))
    assert from_hf_config(other).name == "gemma"


def without(config: dict, key: str) -> dict:
    return {k: v for k, v in config.items() if k != key}


@pytest.mark.parametrize(
    "config, match",
    [
        (without(LLAMA_3_8B, "num_hidden_layers"), "no num_hidden_layers"),
        (
            without(LLAMA_3_8B, "num_attention_heads"),
            r"no num_attention_heads \(nor n_head\)",
        ),
        (without(LLAMA_3_8B, "hidden_size"), "no hidden_size"),
        ({**LLAMA_3_8B, "num_hidden_layers": 0}, "num_hidden_layers must"),
        ({**LLAMA_3_8B, "num_hidden_layers": 32.0}, "num_hidden_layers"),
        ({**LLAMA_3_8B, "num_hidden_layers": True}, "num_hidden_layers"),
        ({**LLAMA_3_8B, "num_key_value_heads": 5}, "multiple"),
        ({**LLAMA_3_8B, "num_key_value_heads": -1}, "num_key_value_heads"),
        ({**LLAMA_3_8B, "head_dim": "128"}, "head_dim"),
        ({**LLAMA_3_8B, "n_layer": 33}, "contradictory: num_hidden_layers"),
        ({**FALCON_7B, "hidden_size": 4545}, "no head_dim, and hidden_size"),
        (
            {**FALCON_7B, "num_key_value_heads": 8},
            "contradictory: num_key_value_heads=8",
        ),
        (
            {**GEMMA_3_27B_IT, "num_hidden_layers": 60},
            "contradictory: num_hidden_layers=60 at the top",
        ),
        ({**GEMMA_3_27B_IT, "text_config": [1]}, "text_config must be"),
        (without(DEEPSEEK_V3, "qk_rope_head_dim"), "no qk_rope_head_dim"),
        (without(DEEPSEEK_V3, "qk_nope_head_dim"), "no qk_nope_head_dim"),
        (without(DEEPSEEK_V3, "kv_lora_rank"), "no kv_lora_rank"),
        ({**DEEPSEEK_V3, "kv_lora_rank": 0}, "kv_lora_rank must"),
        (
            {**GPT_OSS_120B, "layer_types": ["sliding_attention"] * 35},
            "layer_types must list 36",
        ),
        (
            {**GPT_OSS_120B, "layer_types": ["chunked_attention"] * 36},
            "chunked_attention",
        ),
        (
            {**GPT_OSS_120B, "layer_types": "sliding_attention"},
            "layer_types must list",
        ),
        (without(GPT_OSS_120B, "sliding_window"), "no sliding_window"),
        (
            {**GPT_OSS_120B, "sliding_window_pattern": 6},
            "does not follow sliding_window_pattern=6",
        ),
        ({**GEMMA_3_1B_IT, "sliding_window_pattern": 0}, "pattern must"),
        (without(GEMMA_3_1B_IT, "sliding_window"), "no sliding_window"),
        (
            {**QWEN25_7B, "layer_types": ["sliding_attention"] * 28},
            "use_sliding_window is false",
        ),
        (
            {
                **QWEN25_7B,
                "use_sliding_window": True,
                "max_window_layers": None,
            },
            "no max_window_layers",
        ),
        (
            {**MISTRAL_7B_V01, "model_type": "somethingnew"},
            "says neither which layers use it",
        ),
        (without(MISTRAL_7B_V01, "model_type"), "model_type=None"),
        ({**MISTRAL_7B_V01, "sliding_window": -4}, "sliding_window must"),
        (
            {**GEMMA_2_9B, "sliding_window_size": 2048},
            "contradictory: sliding_window=4096, sliding_window_size=2048",
        ),
        (
            {**LLAMA_3_8B, "attention_chunk_size": 8192},
            "attention_chunk_size=8192 but says neither which layers",
        ),
        ({**GEMMA_3_1B_IT, "num_kv_shared_layers": 10}, "num_kv_shared"),
    ],
)
def test_errors_name_the_key(config, match):
    with pytest.raises(ValueError, match=match):
        from_hf_config(config)


def test_a_config_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="config must be a path"):
        from_hf_config([1, 2])


def test_harmless_keys_are_not_errors():
    # A zero or null value of an unmodelled feature changes nothing.
    ok = {**LLAMA_3_8B, "attention_chunk_size": None}
    ok["num_kv_shared_layers"] = 0
    assert kv_bytes_per_token(from_hf_config(ok)) == 131072
    # Gemma 2's first release spelled the window twice, equal.
    same = {**GEMMA_2_9B, "sliding_window_size": 4096}
    assert from_hf_config(same).sliding_window == 4096
    # sliding_window null (Mistral v0.2 and later): no window.
    v02 = {**MISTRAL_7B_V01, "sliding_window": None}
    assert from_hf_config(v02).n_window_layers == 0


def test_file_errors(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        from_hf_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        from_hf_config(bad)
    with pytest.raises(FileNotFoundError):
        from_hf_config(tmp_path / "missing.json")


def test_weights_unknown_for_a_read_config():
    cfg = from_hf_config(LLAMA_3_8B)
    with pytest.raises(ValueError, match="no parameter count"):
        weight_bytes(cfg)
    with pytest.raises(ValueError, match="no parameter count"):
        max_concurrent_sequences(cfg, 4096)
    assert max_context(cfg, 80 * GiB) == 655_360  # the cache alone works


# --- the command line: python -m attn_np.memory ----------------------------


def run_cli(capsys, *argv):
    from attn_np.memory import main

    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_on_a_config_file(tmp_path, capsys):
    path = tmp_path / "gemma-3-27b-it" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(GEMMA_3_27B_IT))
    status, out, err = run_cli(
        capsys,
        str(path),
        "--seq-len",
        "131072",
        "--batch",
        "8",
        "--budget",
        "80GiB",
    )
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert all(len(line) <= 77 for line in lines)
    total = kv_cache_bytes(from_hf_config(path), L128K, batch=8)
    fit = max_context(from_hf_config(path), 80 * GiB, batch=8)
    assert lines == [
        "model        gemma-3-27b-it",
        "kind         GQA, window 1024 in 52 of 62 layers",
        "shape        62 layers, 32 query heads, 16 key/value heads of 128",
        "rope         full: linear, factor 8; sliding: default, theta "
        "10,000",
        "per token    496.00 KiB = 507,904 bytes (2 per number)",
        "             (window layers stop growing at 1,024 tokens)",
        "             (counting the W a step holds; HF keeps W - 1 between"
        " steps)",
        f"KV cache     83.25 GiB = {total:,} bytes",
        "             for 8 sequences of 131,072 tokens",
        f"max context  {fit:,} tokens x 8 sequences in 80.00 GiB",
    ]


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_cli_lines_fit_the_page(name, capsys):
    status, out, _ = run_cli(
        capsys,
        name,
        "--seq-len",
        "131072",
        "--batch",
        "8",
        "--bytes-per-element",
        "1",
        "--budget",
        "80GB",
    )
    assert status == 0
    assert all(len(line) <= 77 for line in out.splitlines())
    assert "1 per number" in out and "in 74.51 GiB" in out  # 80e9 bytes


def test_cli_kinds_and_budgets(capsys):
    _, out, _ = run_cli(capsys, "deepseek-v3", "--seq-len", "131072")
    assert "kind         MLA\n" in out
    assert "caching a latent of 512 and a rotary key of 64" in out
    assert "68.62 KiB = 70,272 bytes" in out and "max context" not in out
    _, out, _ = run_cli(
        capsys, "mistral-7b-v0.1", "--seq-len", "10", "--budget", "1GiB"
    )
    assert "max context  any context x 1 sequence in 1.00 GiB" in out
    _, out, _ = run_cli(
        capsys, "llama-3-8b", "--seq-len", "1", "--budget", "80 GiB"
    )
    assert "655,360 tokens x 1 sequence" in out


@pytest.mark.parametrize(
    "text, value",
    [
        ("80GiB", 80 * 2**30),
        ("80 GB", 80 * 10**9),
        ("1.5TiB", 3 * 2**39),
        ("512MiB", 512 * 2**20),
        ("4096", 4096),
        ("2kB", 2000),
    ],
)
def test_parse_bytes(text, value):
    from attn_np.memory import parse_bytes

    assert parse_bytes(text) == value


@pytest.mark.parametrize(
    "argv, match",
    [
        (["nope", "--seq-len", "5"], "neither a file nor a model"),
        (["falcon-7b", "--seq-len", "5", "--budget", "80Gx"], "budget"),
        (["falcon-7b", "--seq-len", "5", "--budget", "0GB"], "budget"),
        (["falcon-7b", "--seq-len", "-5"], "--seq-len"),
        (["falcon-7b", "--seq-len", "5", "--batch", "0"], "batch"),
        (
            ["falcon-7b", "--seq-len", "5", "--bytes-per-element", "0"],
            "--bytes-per-element",
        ),
    ],
)
def test_cli_errors(argv, match, capsys):
    status, out, err = run_cli(capsys, *argv)
    assert status == 2 and out == ""
    assert err.startswith("error: ") and match in err


def test_cli_config_errors_name_the_key(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(without(LLAMA_3_8B, "num_hidden_layers")))
    status, _, err = run_cli(capsys, str(path), "--seq-len", "5")
    assert status == 2 and "no num_hidden_layers" in err
    status, _, err = run_cli(capsys, "falcon-7b")  # --seq-len is required
    assert status == 2 and err.count("\n") == 1 and "--seq-len" in err


def test_python_dash_m(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V2))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "attn_np.memory",
            str(path),
            "--seq-len",
            "131072",
            "--budget",
            "80GiB",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert "kind         MLA" in done.stdout
    assert "8.44 GiB = 9,059,696,640 bytes" in done.stdout


def test_cli_says_a_nope_latent_key_is_not_rotated(capsys):
    # Kimi Linear's MLA layers are NoPE: the 64 numbers beside the latent
    # are a shared key that no RoPE rotates
    path = Path(__file__).parent / "data/hf_configs/kimi_linear_48b_a3b.json"
    _, out, _ = run_cli(capsys, str(path), "--seq-len", "1024")
    assert "a latent of 512 and an unrotated key of 64" in out
    assert "rope         none (NoPE)" in out
    _, out, _ = run_cli(capsys, "deepseek-v3", "--seq-len", "1024")
    assert "a latent of 512 and a rotary key of 64" in out
