"""attn_np.costs.hf_config on the configs of hybrid and sparse models.

The configs are in tests/data/hf_configs (abridged released files, see its
README). Every expected number is written out by hand below from the
shapes in the file, not computed by the function under test.
"""

import json
from pathlib import Path

import pytest

from attn_np.costs import (
    cache_bytes,
    cached_positions,
    from_hf_config,
    indexer_cache_bytes,
    kv_bytes_per_token,
    kv_cache_bytes,
    max_context,
    rope_parameters,
    state_bytes,
)
from attn_np.costs.model import CHUNKED, FULL, LINEAR, NO_CACHE, SLIDING

DATA = Path(__file__).parent / "data" / "hf_configs"
L = 131_072


def load(name):
    return json.loads((DATA / f"{name}.json").read_text())


def test_qwen3_next_by_hand():
    # 48 layers, full_attention_interval 4 and no layer_types: layers
    # 3, 7, ..., 47 full (12), the other 36 Gated DeltaNet.
    cfg = from_hf_config(DATA / "qwen3_next_80b_a3b.json")
    assert cfg.layer_counts == {LINEAR: 36, FULL: 12}
    assert [i for i, t in enumerate(cfg.layer_types) if t == FULL] == list(
        range(3, 48, 4)
    )
    full_kv = 12 * 2 * 2 * 256 * 2  # layers x (K, V) x kv heads x dim x bf16
    assert kv_bytes_per_token(cfg) == full_kv == 24_576
    assert kv_cache_bytes(cfg, L) == L * full_kv
    state = 36 * 32 * 128 * 128 * 4  # layers x value heads x d_k x d_v x f32
    conv = 36 * (2 * 16 * 128 + 32 * 128) * 4 * 2  # channels x kernel x bf16
    assert state_bytes(cfg) == (state, conv) == (75_497_472, 2_359_296)
    assert cfg.linear.state_dtype == "float32"
    for n in (1, 4096, L, 10**7):  # the state does not grow
        assert cache_bytes(cfg, n, 3) == 3 * (n * full_kv + state + conv)
    assert cfg.rope[FULL]["partial_rotary_factor"] == 0.25


def test_qwen3_next_written_with_layer_types_agrees():
    data = load("qwen3_next_80b_a3b")
    types = (["linear_attention"] * 3 + ["full_attention"]) * 12
    same = from_hf_config({**data, "layer_types": types})
    assert same.layer_types == from_hf_config(data).layer_types
    wrong = {**data, "layer_types": types[::-1]}
    with pytest.raises(ValueError, match="contradictory"):
        from_hf_config(wrong)
    # neither written: Qwen3NextConfig's default interval is 4
    bare = {k: v for k, v in data.items() if k != "full_attention_interval"}
    assert from_hf_config(bare).layer_counts == {LINEAR: 36, FULL: 12}


def test_qwen3_5_text_config_by_hand():
    cfg = from_hf_config(DATA / "qwen3_5_9b.json")
    assert cfg.layer_counts == {LINEAR: 24, FULL: 8}
    assert kv_cache_bytes(cfg, L, 2) == 2 * L * 8 * 2 * 4 * 256 * 2
    state = 2 * 24 * 32 * 128 * 128 * 4
    conv = 2 * 24 * (2 * 16 * 128 + 32 * 128) * 4 * 1  # an 8-bit cache
    assert state_bytes(cfg, 2, 1) == (state, conv)
    # transformers 5 spelling: rope_parameters inside text_config
    assert cfg.rope[FULL]["rope_theta"] == 10_000_000
    data = load("qwen3_5_9b")
    data["text_config"]["mamba_ssm_dtype"] = "bfloat16"
    half = from_hf_config(data)
    assert state_bytes(half)[0] == 24 * 32 * 128 * 128 * 2
    data["text_config"]["mamba_ssm_dtype"] = "int4"
    with pytest.raises(ValueError, match="mamba_ssm_dtype"):
        from_hf_config(data)


def test_kimi_linear_by_hand():
    cfg = from_hf_config(DATA / "kimi_linear_48b_a3b.json")
    # layers numbered from 1 in the file: 4, 8, ..., 24 and 27 are MLA
    full = [i for i, t in enumerate(cfg.layer_types) if t == FULL]
    assert full == [3, 7, 11, 15, 19, 23, 26]
    assert cfg.family == "MLA" and cfg.kv_numbers_per_layer == 512 + 64
    assert kv_cache_bytes(cfg, L) == L * 7 * (512 + 64) * 2
    state = 20 * 32 * 128 * 128 * 4
    conv = 20 * 3 * 32 * 128 * 4 * 2  # q, k and v convolved separately
    assert state_bytes(cfg) == (state, conv) == (41_943_040, 1_966_080)
    assert cfg.rope[FULL]["rope_type"] == "none (NoPE)"  # mla_use_nope


def test_kimi_linear_layer_lists_are_checked():
    data = load("kimi_linear_48b_a3b")
    lin = data["linear_attn_config"]
    for bad, match in (
        ({**lin, "kda_layers": lin["kda_layers"] + [4]}, "each listed once"),
        ({**lin, "kda_layers": lin["kda_layers"][:-1]}, r"\[26\]"),
        ({**lin, "full_attn_layers": [0]}, "numbered 1 to 27"),
        ({**lin, "kda_layers": "all"}, "must list layer numbers"),
    ):
        with pytest.raises(ValueError, match=match):
            from_hf_config({**data, "linear_attn_config": bad})
    with pytest.raises(ValueError, match="num_heads"):
        short = {k: v for k, v in lin.items() if k != "num_heads"}
        from_hf_config({**data, "linear_attn_config": short})


def test_kimi_linear_in_transformers_5_spelling():
    data = load("kimi_linear_48b_a3b")
    released = from_hf_config(data)
    lin = data.pop("linear_attn_config")
    data["layer_types"] = list(released.layer_types)
    data["linear_num_heads"] = lin["num_heads"]
    data["linear_head_dim"] = lin["head_dim"]
    data["linear_conv_kernel_dim"] = lin["short_conv_kernel_size"]
    assert from_hf_config(data).linear == released.linear
    del data["layer_types"]
    with pytest.raises(ValueError, match="kimi_linear"):
        from_hf_config(data)  # HF's default pattern is not guessed


def test_llama4_scout_by_hand():
    cfg = from_hf_config(DATA / "llama4_scout_17b_16e.json")
    # no_rope_layers is empty: every 4th layer is NoPE (full), the other
    # 36 use RoPE and are chunked at 8192.
    assert cfg.layer_counts == {CHUNKED: 36, FULL: 12}
    assert cfg.layer_types[:4] == (CHUNKED, CHUNKED, CHUNKED, FULL)
    per_layer = 2 * 8 * 128 * 2
    for n in (100, 8192, 8193, L):
        held = 36 * min(n, 8192) + 12 * n
        assert cached_positions(cfg, n) == held
        assert kv_cache_bytes(cfg, n) == held * per_layer
    assert cfg.rope[CHUNKED]["rope_type"] == "llama3"
    assert cfg.rope[FULL]["rope_type"] == "none (NoPE)"
    assert max_context(cfg, 12 * per_layer * 10_000 + 36 * per_layer * 8192)


def test_a_null_rope_entry_is_a_nope_layer_type():
    """Beam and Cohere Compass write ``null`` for a layer type without
    RoPE: sized as any other layer, its RoPE shown as NoPE."""
    data = {
        "model_type": "beam",
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_size": 64,
        "sliding_window": 8,
        "layer_types": [SLIDING, SLIDING, SLIDING, FULL],
        "rope_parameters": {
            SLIDING: {"rope_type": "default", "rope_theta": 1e4},
            FULL: None,
        },
    }
    cfg = from_hf_config(data)
    assert cfg.rope[FULL]["rope_type"] == "none (NoPE)"
    assert cfg.rope[SLIDING]["rope_theta"] == 1e4
    assert kv_cache_bytes(cfg, 4) == 4 * 4 * (2 * 2 * 16) * 2


def test_no_rope_layers_one_means_rope():
    # Hugging Face's trap: no_rope_layers[i] == 1 means layer i USES RoPE.
    data = load("llama4_scout_17b_16e")
    text = data["text_config"]
    flags = [1, 0] * 24
    cfg = from_hf_config({**text, "no_rope_layers": flags})
    assert cfg.layer_types[:2] == (CHUNKED, FULL)
    assert cfg.layer_counts == {CHUNKED: 24, FULL: 24}
    for bad in ([2] * 48, [1] * 3, [True] * 48):
        with pytest.raises(ValueError, match="no_rope_layers"):
            from_hf_config({**text, "no_rope_layers": bad})
    types = ["chunked_attention"] * 48
    no_chunk = {**text, "layer_types": types, "attention_chunk_size": None}
    with pytest.raises(ValueError, match="attention_chunk_size"):
        from_hf_config(no_chunk)


def test_deepseek_v3_2_indexer_by_hand():
    cfg = from_hf_config(DATA / "deepseek_v3_2_exp.json")
    latent = 61 * (512 + 64) * 2  # bf16 latent and rotary key
    indexer = 61 * (128 * 1 + 128 // 128 * 4)  # FP8 key + a float32 scale
    assert kv_bytes_per_token(cfg) == latent == 70_272
    assert indexer_cache_bytes(cfg, L, 2) == 2 * L * indexer
    assert indexer == 8052
    assert cache_bytes(cfg, L, 2) == 2 * L * (latent + indexer)
    assert cfg.indexer.topk == 2048 and cfg.indexer.n_heads == 64
    assert cfg.rope[FULL]["rope_type"] == "yarn"  # "type" read as rope_type
    no_latent = {k: v for k, v in load("deepseek_v3_2_exp").items()}
    for k in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim"):
        no_latent.pop(k)
    with pytest.raises(ValueError, match="no latent cache"):
        from_hf_config(no_latent)
    part = {**load("deepseek_v3_2_exp"), "index_topk": None}
    with pytest.raises(ValueError, match="index_topk"):
        from_hf_config(part)


def test_rope_both_spellings():
    old = {
        "rope_theta": 1e6,
        "rope_scaling": {"type": "linear", "factor": 8},
    }
    new = {"rope_parameters": {"rope_type": "linear", "factor": 8}}
    new["rope_parameters"]["rope_theta"] = 1e6
    assert rope_parameters(old) == rope_parameters(new)
    assert rope_parameters({}) is None
    both = {**old, **new}
    assert rope_parameters(both) == rope_parameters(new)
    clash = {**new, "rope_theta": 5e5}
    with pytest.raises(ValueError, match="contradictory: rope_theta"):
        rope_parameters(clash)
    # Gemma 3 in transformers 5: one dict per layer type
    per_type = {
        "rope_parameters": {
            FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            SLIDING: {"rope_type": "default", "rope_theta": 1e4},
        }
    }
    gemma_old = {
        "model_type": "gemma3_text",
        "rope_theta": 1e6,
        "rope_local_base_freq": 1e4,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    }
    kinds = (SLIDING, FULL)
    assert rope_parameters(per_type, kinds) == rope_parameters(
        gemma_old, kinds
    )
    for bad, match in (
        ({"rope_theta": -1}, "rope_theta"),
        ({"rope_theta": "1e4"}, "rope_theta"),
        ({"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
        ({"rope_parameters": [1]}, "rope_parameters"),
        ({"rope_scaling": "yarn"}, "rope_scaling"),
    ):
        with pytest.raises(ValueError, match=match):
            rope_parameters(bad)


def test_hybrid_max_context_counts_the_state():
    cfg = from_hf_config(DATA / "qwen3_next_80b_a3b.json")
    state = sum(state_bytes(cfg))
    per_token = kv_bytes_per_token(cfg)
    budget = state + 1000 * per_token
    assert max_context(cfg, budget) == 1000
    assert max_context(cfg, state - 1) == 0  # not even the state fits


def test_values_narrower_than_keys_are_sized_by_v_head_dim():
    # MiMo-V2-Flash's attention shapes (transformers' MiMoV2FlashConfig
    # defaults: head_dim 192 for queries and keys, v_head_dim 128 for
    # values, 4 key/value heads), written as a plain Llama-style config:
    # per token and layer 4 * (192 + 128) = 1,280 numbers, 2,560 bytes.
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 48,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "hidden_size": 4096,
        "head_dim": 192,
        "v_head_dim": 128,
    }
    assert kv_bytes_per_token(from_hf_config(cfg)) == 48 * 2_560
    assert kv_cache_bytes(from_hf_config(cfg), 10) == 10 * 48 * 2_560
    # without v_head_dim the values are as wide as the keys
    del cfg["v_head_dim"]
    assert kv_bytes_per_token(from_hf_config(cfg)) == 48 * 4 * 384 * 2


FIXTURE = Path(__file__).parent / "fixtures" / "cache_bytes.json"
HF = json.loads(FIXTURE.read_text())
ELEMENT = {"bfloat16": 2, "float16": 2, "float32": 4}[HF["dtype"]]


@pytest.mark.parametrize("name", sorted(HF["models"]))
def test_bytes_are_what_transformers_cache_holds(name):
    # scripts/record_hf_fixtures.py cache_bytes: a tiny random model of
    # each family, run by transformers 5.24.0 on 4 and on 8 tokens; the
    # bytes of every tensor its cache object then held
    hf = HF["models"][name]
    cfg = from_hf_config(hf["config"], name)
    assert kv_bytes_per_token(cfg, ELEMENT) == hf["bytes_per_token"]
    assert cache_bytes(cfg, 0, 1, ELEMENT) == hf["fixed_bytes"]
    assert sum(state_bytes(cfg, 1, ELEMENT)) == hf["fixed_bytes"]
    sizes = [cache_bytes(cfg, n, 1, ELEMENT) for n in HF["tokens"]]
    assert sizes == hf["bytes"]


def released(name, **changes):
    cfg = dict(HF["models"][name]["config"], **changes)
    return {k: v for k, v in cfg.items() if v is not None}


def test_released_spellings_read_as_transformers_5_writes_them():
    hf = HF["models"]
    # Nemotron-H's pattern string: M Mamba-2, * attention, - MLP, E MoE
    nem = released("nemotron_h", hybrid_override_pattern="M*-ME")
    del nem["layers_block_type"]
    cfg = from_hf_config(nem)
    assert cfg.layer_types == (LINEAR, FULL, NO_CACHE, LINEAR, NO_CACHE)
    assert kv_bytes_per_token(cfg, 2) == hf["nemotron_h"]["bytes_per_token"]
    # MiniMax-Text-01's attn_type_list: 0 lightning, 1 softmax
    mm = released("minimax", attn_type_list=[1, 0, 1, 0])
    del mm["layer_types"]
    assert from_hf_config(mm).layer_types == (FULL, LINEAR, FULL, LINEAR)
    # Gemma 4's released keys instead of transformers 5's per_layer_config
    g4 = released("gemma4", global_head_dim=48, num_global_key_value_heads=1)
    del g4["per_layer_config"]
    assert (
        kv_bytes_per_token(from_hf_config(g4), 2)
        == (hf["gemma4"]["bytes_per_token"])
    )
    # by hand: 2 window layers x 2 kv heads x (16 + 16), 2 full layers x
    # 1 kv head x (48 + 48), 2 shared layers x 0; bf16
    assert hf["gemma4"]["bytes_per_token"] == (2 * 64 + 2 * 96) * 2
    # keys equal to values still cache both (the value is normed apart)
    g4["attention_k_eq_v"] = False  # the full layers keep 2 kv heads
    assert (
        kv_bytes_per_token(from_hf_config(g4), 2)
        == (2 * 64 + 2 * 2 * 96) * 2
    )


@pytest.mark.parametrize(
    "name, changes, named",
    [
        ("nemotron_h", {"layers_block_type": ["mamba", "x"]}, "'x'"),
        ("nemotron_h", {"sliding_window": 8}, "sliding_window=8"),
        ("llama", {"num_kv_shared_layers": 1}, "num_kv_shared_layers=1"),
        ("gemma3n", {"num_kv_shared_layers": 5}, "num_kv_shared_layers=5"),
        ("jamba", {"attn_layer_offset": 2}, "attn_layer_offset=2"),
        ("minimax", {"attn_type_list": [1, 0]}, "attn_type_list"),
        ("mimo_v2_flash", {"swa_num_key_value_heads": 8}, "swa_num_key"),
        ("llama", {"layer_types": ["conv", "full_attention"]}, "'conv'"),
        ("llama", {"layer_types": ["hybrid"] * 2}, "'hybrid'"),
        (
            "llama",
            {"layer_types": ["indexed_attention"] * 2},
            "'indexed_attention'",
        ),
        (
            "gemma4",
            {"per_layer_config": {"1": {"sliding_window": 3}}},
            "per_layer_config.1",
        ),
    ],
)
def test_what_is_not_sized_is_refused_naming_the_key(name, changes, named):
    with pytest.raises(ValueError, match=named):
        from_hf_config(released(name, **changes))
