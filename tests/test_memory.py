"""attn_np.costs.catalogue: real model configurations and the key/value cache they need."""

import dataclasses

import numpy as np
import pytest

from attn_np.costs import (
    GB,
    MODELS,
    GiB,
    ModelConfig,
    get_model,
    kv_bytes_per_token,
    kv_cache_bytes,
    max_concurrent_sequences,
    weight_bytes,
)

# (n_layers, n_heads, n_kv_heads, head_dim, d_model) as read from each model's config.json.
EXPECTED = {
    "llama-2-7b": (32, 32, 32, 128, 4096),
    "llama-2-13b": (40, 40, 40, 128, 5120),
    "llama-2-70b": (80, 64, 8, 128, 8192),
    "mistral-7b": (32, 32, 8, 128, 4096),
    "llama-3-8b": (32, 32, 8, 128, 4096),
    "llama-3-70b": (80, 64, 8, 128, 8192),
    "qwen2.5-7b": (28, 28, 4, 128, 3584),
    "falcon-7b": (32, 71, 1, 64, 4544),
}

# fp16 bytes per token, by hand: 2 (K and V) * layers * kv heads * head_dim * 2 bytes.
HAND_BYTES_PER_TOKEN = {
    "llama-2-7b": 2 * 32 * 32 * 128 * 2,  # 524288 = 512 KiB
    "llama-2-13b": 2 * 40 * 40 * 128 * 2,  # 819200 = 800 KiB
    "llama-2-70b": 2 * 80 * 8 * 128 * 2,  # 327680 = 320 KiB
    "mistral-7b": 2 * 32 * 8 * 128 * 2,  # 131072 = 128 KiB
    "llama-3-8b": 2 * 32 * 8 * 128 * 2,  # 131072 = 128 KiB
    "llama-3-70b": 2 * 80 * 8 * 128 * 2,  # 327680 = 320 KiB
    "qwen2.5-7b": 2 * 28 * 4 * 128 * 2,  # 57344 = 56 KiB
    "falcon-7b": 2 * 32 * 1 * 64 * 2,  # 8192 = 8 KiB
}


def test_models_are_the_expected_set():
    assert set(MODELS) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_model_shapes(name):
    cfg = MODELS[name]
    assert cfg.name == name
    assert (
        cfg.n_layers,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        cfg.d_model,
    ) == EXPECTED[name]
    assert (
        cfg.n_heads * cfg.head_dim == cfg.d_model
    )  # head_dim = hidden_size / num_attention_heads
    assert cfg.source and cfg.cite


def test_families():
    fam = {name: cfg.family for name, cfg in MODELS.items()}
    assert fam["llama-2-7b"] == fam["llama-2-13b"] == "MHA"
    assert fam["falcon-7b"] == "MQA"
    assert {
        fam[n]
        for n in (
            "llama-2-70b",
            "mistral-7b",
            "llama-3-8b",
            "llama-3-70b",
            "qwen2.5-7b",
        )
    } == {"GQA"}
    assert MODELS["llama-2-70b"].group_size == 8
    assert MODELS["qwen2.5-7b"].group_size == 7
    assert MODELS["falcon-7b"].group_size == 71


def _llama_params(vocab, d, layers, h, kv, hd, ffn, *, qkv_bias=False):
    per_layer = (
        d * h * hd
        + 2 * d * kv * hd
        + h * hd * d
        + 3 * d * ffn
        + 2 * d
        + ((h + 2 * kv) * hd if qkv_bias else 0)
    )
    return (
        2 * vocab * d + layers * per_layer + d
    )  # untied embedding and output layer, final norm


def test_parameter_counts_from_configs():
    # vocab_size and intermediate_size from each config.json; the formula is the Llama block.
    assert MODELS["llama-2-7b"].n_params == _llama_params(
        32000, 4096, 32, 32, 32, 128, 11008
    )
    assert MODELS["llama-2-13b"].n_params == _llama_params(
        32000, 5120, 40, 40, 40, 128, 13824
    )
    assert MODELS["llama-2-70b"].n_params == _llama_params(
        32000, 8192, 80, 64, 8, 128, 28672
    )
    assert MODELS["mistral-7b"].n_params == _llama_params(
        32000, 4096, 32, 32, 8, 128, 14336
    )
    assert MODELS["llama-3-8b"].n_params == _llama_params(
        128256, 4096, 32, 32, 8, 128, 14336
    )
    assert MODELS["llama-3-70b"].n_params == _llama_params(
        128256, 8192, 80, 64, 8, 128, 28672
    )
    assert MODELS["qwen2.5-7b"].n_params == _llama_params(
        152064, 3584, 28, 28, 4, 128, 18944, qkv_bias=True
    )
    # Falcon-7B: fused QKV (71 query heads + 1 key + 1 value head of 64), 4x GELU MLP, LayerNorm with
    # bias, output layer tied to the 65024-token embedding.
    d = 4544
    falcon = (
        65024 * d
        + 32 * (d * (71 * 64 + 2 * 64) + d * d + 2 * d * 4 * d + 2 * d)
        + 2 * d
    )
    assert MODELS["falcon-7b"].n_params == falcon


@pytest.mark.parametrize("name", sorted(HAND_BYTES_PER_TOKEN))
def test_bytes_per_token_by_hand(name):
    assert kv_bytes_per_token(MODELS[name]) == HAND_BYTES_PER_TOKEN[name]
    assert (
        kv_bytes_per_token(name) == HAND_BYTES_PER_TOKEN[name]
    )  # by name too
    assert (
        kv_bytes_per_token(name, bytes_per_element=1)
        == HAND_BYTES_PER_TOKEN[name] // 2
    )
    assert (
        kv_bytes_per_token(name, bytes_per_element=4)
        == HAND_BYTES_PER_TOKEN[name] * 2
    )


def test_llama_2_7b_fp16_numbers():
    assert kv_cache_bytes("llama-2-7b", 1) == 524288
    assert (
        kv_cache_bytes("llama-2-7b", 4096) == 2 * GiB
    )  # 4096 tokens * 512 KiB
    assert kv_cache_bytes("llama-2-7b", 4096, batch=8) == 16 * GiB
    assert kv_cache_bytes("llama-2-7b", 0) == 0
    assert isinstance(kv_cache_bytes("llama-2-7b", np.int64(7)), int)


def test_gqa_divides_the_cache_by_the_group_size():
    assert (
        kv_cache_bytes("llama-2-70b", 1000) * 8
        == 2 * 80 * 64 * 128 * 2 * 1000
    )
    assert kv_bytes_per_token("mistral-7b") * 4 == kv_bytes_per_token(
        "llama-2-7b"
    )


def test_max_concurrent_sequences_by_hand():
    # llama-2-7b: 80e9 - 2 * 6738415616 bytes of weights, 2 GiB of cache per 4096-token sequence.
    free = 80 * GB - 2 * 6_738_415_616
    assert (
        max_concurrent_sequences("llama-2-7b", 4096)
        == free // (2 * GiB)
        == 30
    )
    # falcon-7b at 128k tokens: 8 KiB/token -> 1 GiB per sequence.
    assert (
        max_concurrent_sequences("falcon-7b", 131072)
        == (80 * GB - 2 * 6_921_720_704) // GiB
    )
    # 70B models in fp16 do not fit on one 80 GB accelerator, with any cache.
    assert weight_bytes("llama-2-70b") > 80 * GB
    assert max_concurrent_sequences("llama-2-70b", 1) == 0
    assert max_concurrent_sequences(
        "llama-2-70b", 4096, memory_bytes=2 * 80 * GB
    ) == ((160 * GB - 2 * 68_976_648_192) // (327680 * 4096))


def test_units():
    assert GB == 1_000_000_000 and GiB == 1_073_741_824


def test_configs_are_frozen_and_validated():
    cfg = MODELS["llama-2-7b"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n_kv_heads = 8
    with pytest.raises(ValueError, match="n_kv_heads"):
        dataclasses.replace(cfg, n_kv_heads=3)
    with pytest.raises(ValueError, match="n_layers"):
        dataclasses.replace(cfg, n_layers=0)
    assert isinstance(get_model("mistral-7b"), ModelConfig)


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: kv_cache_bytes("gpt-5", 10),
            "config 'gpt-5' is not in MODELS",
        ),
        (lambda: kv_cache_bytes(42, 10), "config must be"),
        (lambda: kv_cache_bytes("llama-2-7b", -1), "seq_len"),
        (lambda: kv_cache_bytes("llama-2-7b", 1.5), "seq_len"),
        (lambda: kv_cache_bytes("llama-2-7b", 10, batch=0), "batch"),
        (
            lambda: kv_cache_bytes("llama-2-7b", 10, bytes_per_element=0),
            "bytes_per_element",
        ),
        (
            lambda: kv_bytes_per_token("llama-2-7b", bytes_per_element=True),
            "bytes_per_element",
        ),
        (lambda: max_concurrent_sequences("llama-2-7b", 0), "seq_len"),
        (
            lambda: max_concurrent_sequences(
                "llama-2-7b", 10, memory_bytes=-1
            ),
            "memory_bytes",
        ),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
