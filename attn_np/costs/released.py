"""The attention shapes of released models (chapters 3, 4, 7, 8 and A1).

Each entry is a :class:`~attn_np.costs.model.ModelConfig` written from the
model's official ``config.json`` and, where the paper prints one, its
architecture table. :data:`CATALOGUE` holds them all by name.
"""

from __future__ import annotations

from .model import CATALOGUE, FULL, SLIDING, ModelConfig, _alternate


def _hf(repo: str) -> str:
    return f"config.json of {repo} on the Hugging Face Hub"


# Real configurations. Each field was checked against the model's official
# config.json (num_hidden_layers, num_attention_heads, num_key_value_heads,
# hidden_size; head_dim = hidden_size / num_attention_heads) and, where the
# paper prints one, its architecture table. n_params is computed from the
# same file (embeddings, attention, MLP, norms, untied output layer where
# there is one) and matches the published counts (6.74B, 13.0B, 69.0B,
# 7.24B, 8.03B, 70.6B, 7.62B). Falcon-7B ties its output layer to the
# embedding, so it counts 6.92B distinct weights; listings that store the
# output layer separately show 7.22B.
#
# These eight are counted with a full cache, as chapters 3 and 4 do: the
# window that Mistral 7B v0.1 was trained with is left out of "mistral-7b"
# (the same model with its window is "mistral-7b-v0.1" in WINDOW_MODELS).
MODELS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in (
        ModelConfig(
            "llama-2-7b",
            n_layers=32,
            n_heads=32,
            n_kv_heads=32,
            head_dim=128,
            d_model=4096,
            n_params=6_738_415_616,
            source=_hf("meta-llama/Llama-2-7b-hf"),
            cite="touvron2023llama2",
        ),
        ModelConfig(
            "llama-2-13b",
            n_layers=40,
            n_heads=40,
            n_kv_heads=40,
            head_dim=128,
            d_model=5120,
            n_params=13_015_864_320,
            source=_hf("meta-llama/Llama-2-13b-hf"),
            cite="touvron2023llama2",
        ),
        ModelConfig(
            "llama-2-70b",
            n_layers=80,
            n_heads=64,
            n_kv_heads=8,
            head_dim=128,
            d_model=8192,
            n_params=68_976_648_192,
            source=_hf("meta-llama/Llama-2-70b-hf")
            + "; GQA for 34B and 70B: Touvron et al. 2023, Table 1",
            cite="touvron2023llama2",
        ),
        ModelConfig(
            "mistral-7b",
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            head_dim=128,
            d_model=4096,
            n_params=7_241_732_096,
            source=_hf("mistralai/Mistral-7B-v0.1")
            + "; Jiang et al. 2023, Table 1; counted without its"
            " 4096-token window (see mistral-7b-v0.1)",
            cite="jiang2023mistral",
        ),
        ModelConfig(
            "llama-3-8b",
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            head_dim=128,
            d_model=4096,
            n_params=8_030_261_248,
            source=_hf("meta-llama/Meta-Llama-3-8B")
            + "; Grattafiori et al. 2024, Table 3",
            cite="grattafiori2024llama3",
        ),
        ModelConfig(
            "llama-3-70b",
            n_layers=80,
            n_heads=64,
            n_kv_heads=8,
            head_dim=128,
            d_model=8192,
            n_params=70_553_706_496,
            source=_hf("meta-llama/Meta-Llama-3-70B")
            + "; Grattafiori et al. 2024, Table 3",
            cite="grattafiori2024llama3",
        ),
        ModelConfig(
            "qwen2.5-7b",
            n_layers=28,
            n_heads=28,
            n_kv_heads=4,
            head_dim=128,
            d_model=3584,
            n_params=7_615_616_512,
            source=_hf("Qwen/Qwen2.5-7B") + "; Qwen Team 2024, Table 1",
            cite="qwen2024qwen25",
        ),
        ModelConfig(
            "falcon-7b",
            n_layers=32,
            n_heads=71,
            n_kv_heads=1,
            head_dim=64,
            d_model=4544,
            n_params=6_921_720_704,
            source=_hf("tiiuae/falcon-7b")
            + " (num_hidden_layers 32, num_attention_heads 71, "
            "hidden_size 4544, multi_query true)",
            cite="almazrouei2023falcon",
        ),
    )
}

# Multi-head latent attention (chapter 7), from config.json: kv_lora_rank
# (d_latent_kv), qk_rope_head_dim (d_rope), qk_nope_head_dim (head_dim),
# v_head_dim (d_head_v), q_lora_rank (d_latent_q). n_params counts the main
# model (DeepSeek-V3's multi-token-prediction module, 14B more, is left
# out): 235.7B and 671.0B, the papers' 236B and 671B.
LATENT_MODELS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in (
        ModelConfig(
            "deepseek-v2",
            n_layers=60,
            n_heads=128,
            n_kv_heads=128,
            head_dim=128,
            d_model=5120,
            n_params=235_741_434_880,
            source=_hf("deepseek-ai/DeepSeek-V2")
            + "; DeepSeek-AI 2024, section 3.1.2",
            cite="deepseek2024v2",
            d_latent_kv=512,
            d_rope=64,
            d_latent_q=1536,
            d_head_v=128,
        ),
        ModelConfig(
            "deepseek-v3",
            n_layers=61,
            n_heads=128,
            n_kv_heads=128,
            head_dim=128,
            d_model=7168,
            n_params=671_026_419_200,
            source=_hf("deepseek-ai/DeepSeek-V3")
            + "; DeepSeek-AI 2024, section 4.2",
            cite="deepseek2024v3",
            d_latent_kv=512,
            d_rope=64,
            d_latent_q=1536,
            d_head_v=128,
        ),
    )
}

# Sliding windows (chapter 8), from config.json: sliding_window and
# layer_types, or the rule Hugging Face applies when layer_types is absent
# (Gemma 2: sliding_window_pattern 2, Gemma 3: 6; layer i is full iff
# (i + 1) % pattern == 0). n_params: 7.24B, 9.24B, 27.4B (Gemma 3's 27.0B
# language model and its 0.42B vision encoder), 116.8B, the published
# counts.
WINDOW_MODELS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in (
        ModelConfig(
            "mistral-7b-v0.1",
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            head_dim=128,
            d_model=4096,
            n_params=7_241_732_096,
            source=_hf("mistralai/Mistral-7B-v0.1")
            + " (sliding_window 4096, every layer); Jiang et al. 2023",
            cite="jiang2023mistral",
            sliding_window=4096,
        ),
        ModelConfig(
            "gemma-2-9b",
            n_layers=42,
            n_heads=16,
            n_kv_heads=8,
            head_dim=256,
            d_model=3584,
            n_params=9_241_705_984,
            source=_hf("google/gemma-2-9b")
            + " (sliding_window 4096, window and full layers"
            " alternating); Gemma Team 2024, Table 1",
            cite="gemmateam2024gemma2",
            sliding_window=4096,
            layer_types=_alternate(42, 2),
        ),
        ModelConfig(
            "gemma-3-27b",
            n_layers=62,
            n_heads=32,
            n_kv_heads=16,
            head_dim=128,
            d_model=5376,
            n_params=27_432_406_640,
            source=_hf("google/gemma-3-27b-it")
            + " (text_config: sliding_window 1024, five window layers"
            " per full layer); Gemma Team 2025, section 2",
            cite="gemmateam2025gemma3",
            sliding_window=1024,
            layer_types=_alternate(62, 6),
        ),
        ModelConfig(
            "gpt-oss-120b",
            n_layers=36,
            n_heads=64,
            n_kv_heads=8,
            head_dim=64,
            d_model=2880,
            n_params=116_829_156_672,
            source=_hf("openai/gpt-oss-120b")
            + " (sliding_window 128, layer_types window and full"
            " alternating); OpenAI 2025, section 2",
            cite="openai2025gptoss",
            sliding_window=128,
            layer_types=(SLIDING, FULL) * 18,
        ),
    )
}

# every model in the catalogue, by name (CATALOGUE is model.py's dict)
CATALOGUE.update({**MODELS, **LATENT_MODELS, **WINDOW_MODELS})
