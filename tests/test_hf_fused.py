"""The families whose attention keeps q, k and v in one weight
(attn_np.hf.fused): Phi-3, GPT-2, OpenAI GPT, GPT-BigCode, BLOOM, MPT,
CodeGen, Persimmon.

Their fixtures are checked with every other family's in
test_hf_families.py; here, the keys each one reads, the values it refuses
by name, the spellings of its configuration class and the state-dict
layouts both ways."""

import json
from pathlib import Path

import numpy as np
import pytest

from attn_np.hf.build import attention_from_hf, attention_layers_from_hf
from attn_np.hf.families import layer_settings
from attn_np.hf.layers import HFAttention
from attn_np.refinements import alibi_slopes

FIXTURES = Path(__file__).parent / "fixtures"
FUSED = (
    "phi3",
    "gpt2",
    "openai-gpt",
    "gpt_bigcode",
    "bloom",
    "mpt",
    "codegen",
    "persimmon",
)


def _fixture(name, i=0):
    f = np.load(FIXTURES / "families" / f"{name}.npz")
    pre = f"layer{i}.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    return json.loads(str(f["config"])), state, f


def _settings(config, i=0):
    cls, args, kw, layout = layer_settings(config, i)
    return args, kw, layout


@pytest.mark.parametrize("name", FUSED)
def test_the_weights_go_back_to_hf_unchanged(name):
    """to_hf(params) is the state dict it was loaded from, name by name
    and bit for bit (the split and the join are inverses)."""
    config, state, _ = _fixture(name)
    layer = attention_from_hf(config, 0, state)
    back = layer.to_hf(layer.params)
    assert set(back) == set(state)
    for k, a in state.items():
        np.testing.assert_array_equal(back[k], a, err_msg=k)


def test_gpt2_reads_its_scale_switches():
    config, _, _ = _fixture("gpt2")
    d = 16  # n_embd 64 over 4 heads
    assert config["scale_attn_by_inverse_layer_idx"] is True
    assert [_settings(config, i)[1]["scale"] for i in (0, 1)] == [
        d**-0.5,
        d**-0.5 / 2,
    ]
    plain = {**config, "scale_attn_by_inverse_layer_idx": False}
    assert _settings(plain, 1)[1]["scale"] == d**-0.5
    unscaled = {**plain, "scale_attn_weights": False}
    assert _settings(unscaled, 1)[1]["scale"] == 1.0
    # the same function in float64: only HF's eager precision changes
    upcast = {**config, "reorder_and_upcast_attn": True}
    assert _settings(upcast, 1) == _settings(config, 1)
    _, kw, layout = _settings(config)
    assert kw["use_rope"] is False and kw["biases"] == ("q", "k", "v", "o")
    assert layout["conv1d"] and layout["qkv"] == "c_attn"


@pytest.mark.parametrize(
    "key", ["reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx"]
)
def test_gpt2_switches_are_json_booleans(key):
    config, _, _ = _fixture("gpt2")
    with pytest.raises(ValueError, match=key):
        layer_settings({**config, key: "true"}, 0)


def test_the_configuration_class_spellings_are_read():
    """GPT-2's n_embd/n_head/n_layer, BLOOM's n_embed, MPT's d_model are
    read as HF's attribute_map reads them; two spellings that disagree
    are refused, and a bad value names the key the file wrote."""
    config, _, _ = _fixture("gpt2")
    assert _settings(config)[0] == (64, 4, 4, 16)
    same = {**config, "hidden_size": 64}
    assert _settings(same)[0] == (64, 4, 4, 16)
    with pytest.raises(ValueError, match="n_embd=64 and hidden_size=32"):
        layer_settings({**config, "hidden_size": 32}, 0)
    with pytest.raises(ValueError, match="n_head"):
        layer_settings({**config, "n_head": "4"}, 0)
    with pytest.raises(ValueError, match="layer_idx"):
        layer_settings(config, 2)  # n_layer 2
    bloom, _, _ = _fixture("bloom")
    renamed = {**bloom, "n_embed": bloom.pop("hidden_size")}
    assert _settings(renamed)[0] == (48, 6, 6, 8)
    mpt, _, _ = _fixture("mpt")
    assert _settings(mpt)[0] == (48, 6, 6, 8)
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        layer_settings({**mpt, "n_heads": 5}, 0)


def test_gpt_bigcode_reads_multi_query():
    config, _, _ = _fixture("gpt_bigcode")
    args, _, layout = _settings(config)
    assert args[2] == 1 and layout["rows"] == "blocks"
    mha = {**config, "multi_query": False, "num_key_value_heads": 4}
    args, _, layout = _settings(mha)
    assert args[2] == 4 and layout["rows"] == "per_head"
    with pytest.raises(ValueError, match="num_key_value_heads=4"):
        layer_settings({**config, "num_key_value_heads": 4}, 0)


def test_phi3_reads_llamas_keys_and_refuses_longrope():
    config, _, _ = _fixture("phi3")
    _, kw, layout = _settings(config)
    assert kw["rotary_dim"] == 8 and kw["window"] == 4  # 0.5 of 16
    assert layout["qkv"] == "qkv_proj" and layout["rows"] == "blocks"
    assert _settings({**config, "attention_bias": True})[1]["biases"] == ()
    for rope_type in ("longrope", "yarn"):
        rope = {**config["rope_parameters"], "rope_type": rope_type}
        rope.update(factor=2.0, original_max_position_embeddings=32)
        with pytest.raises(ValueError, match="rope"):
            layer_settings({**config, "rope_parameters": rope}, 0)


@pytest.mark.parametrize(
    "key,value",
    [
        ("clip_qkv", 8.0),
        ("qk_ln", True),
        ("alibi", False),
        ("alibi_bias_max", 16),
        ("attn_type", "multiquery_attention"),
        ("prefix_lm", True),
        ("attn_uses_sequence_id", True),
        ("some_new_key", 1),
    ],
)
def test_mpt_refuses_attn_config_values_it_does_not_build(key, value):
    config, _, _ = _fixture("mpt")
    config["attn_config"] = {**config["attn_config"], key: value}
    with pytest.raises(ValueError, match=f"attn_config.*{key}"):
        layer_settings(config, 0)


def _hf_mpt_slopes(n_heads):
    """HF's MPT rule, written out: ``2^(-8 h / p)`` over the power of two
    ``p`` at or above ``n_heads``, then the slopes at 1, 3, 5, ... before
    those at 0, 2, 4, ..., the first ``n_heads``."""
    p = 2 ** int(np.ceil(np.log2(n_heads)))
    s = 2.0 ** (-np.arange(1, p + 1) * (8 / p))
    return np.concatenate([s[1::2], s[::2]])[:n_heads] if p > n_heads else s


def test_mpt_reads_softmax_scale_and_slopes_by_blooms_rule():
    config, _, _ = _fixture("mpt")
    config["attn_config"] = {**config["attn_config"], "softmax_scale": 0.5}
    _, kw, _ = _settings(config)
    assert kw["scale"] == 0.5
    (alibi,) = kw["score_mods"]
    np.testing.assert_array_equal(alibi.slopes, alibi_slopes(6))
    for n in range(1, 41):  # the two rules give the same slopes
        np.testing.assert_allclose(
            _hf_mpt_slopes(n), alibi_slopes(n), rtol=1e-15, err_msg=str(n)
        )


def test_a_missing_detail_shows():
    """GPT-2's layer 1 without scale_attn_by_inverse_layer_idx misses HF
    by far more than rounding: the fixture checks the layer's scale."""
    config, state, f = _fixture("gpt2", 1)
    config["scale_attn_by_inverse_layer_idx"] = False
    layer = attention_from_hf(config, 1, state)
    err = np.max(np.abs(layer.forward(f["x"]) - f["layer1.out"]))
    assert err > 1e-3 * np.max(np.abs(f["layer1.out"]))


@pytest.mark.parametrize(
    "name,entry,change",
    [
        ("gpt2", "c_attn.weight", np.transpose),  # nn.Linear's layout
        ("gpt2", "c_proj.weight", lambda a: a[:-1]),
        ("bloom", "query_key_value.bias", lambda a: a[:-1]),
        ("mpt", "Wqkv.weight", lambda a: a[:, :-1]),
        ("phi3", "qkv_proj.weight", lambda a: a[:-16]),
        ("gpt_bigcode", "c_attn.weight", lambda a: a[:-8]),
    ],
)
def test_a_fused_entry_of_the_wrong_shape_is_named(name, entry, change):
    config, state, _ = _fixture(name)
    state[entry] = change(state[entry])
    with pytest.raises(ValueError, match=entry.replace(".", r"\.")):
        attention_from_hf(config, 0, state)


def test_a_missing_or_extra_fused_entry_is_named():
    config, state, _ = _fixture("gpt2")
    del state["c_attn.bias"]
    with pytest.raises(ValueError, match=r"missing \['c_attn\.bias'\]") as e:
        attention_from_hf(config, 0, state)
    assert "'h.{i}.attn.' prefix" in str(e.value)  # GPT2Model's names
    config, state, _ = _fixture("mpt")
    state["Wqkv.bias"] = np.zeros(3 * 48)  # HF's MptAttention has none
    with pytest.raises(ValueError, match=r"unexpected \['Wqkv\.bias'\]"):
        attention_from_hf(config, 0, state)


@pytest.mark.parametrize(
    "key,value",
    [
        ("scale_attn_weights", True),
        ("reorder_and_upcast_attn", True),
        ("multi_query", True),
        ("attn_config", {"clip_qkv": None}),
        ("original_max_position_embeddings", 4096),
    ],
)
def test_a_fused_familys_key_in_a_llama_config_is_refused(key, value):
    config = json.loads(str(np.load(FIXTURES / "llama.npz")["config"]))
    config[key] = value
    with pytest.raises(ValueError, match=key):
        layer_settings(config, 0)


def test_codegen_reads_rotary_dim():
    config, _, _ = _fixture("codegen")
    _, kw, layout = _settings(config)
    assert kw["rotary_dim"] == 8 and kw["rope_layout"] == "interleaved"
    assert layout["rows"] == "shards" and layout["qkv"] == "qkv_proj"
    assert _settings({**config, "rotary_dim": 16})[1]["rotary_dim"] is None
    absent = dict(config)
    del absent["rotary_dim"]  # CodeGenConfig's 64, wider than a head here
    for bad, match in (
        (absent, "rotary_dim=64"),
        ({**config, "rotary_dim": None}, "rotary_dim=None"),
        ({**config, "rotary_dim": 7}, "even"),
    ):
        with pytest.raises(ValueError, match=match):
            layer_settings(bad, 0)


@pytest.mark.parametrize(
    "name,key,value",
    [
        ("gpt2", "rope_theta", 10000.0),
        ("gpt2", "num_key_value_heads", 2),
        ("bloom", "sliding_window", 4),
        ("mpt", "attention_bias", True),
        ("codegen", "partial_rotary_factor", 0.5),
        ("openai-gpt", "head_dim", 8),
    ],
)
def test_a_key_the_fused_family_does_not_read_is_refused(name, key, value):
    config, _, _ = _fixture(name)
    with pytest.raises(ValueError, match=f"{key}={value!r}"):
        layer_settings({**config, key: value}, 0)
    head_dim = _settings(config)[0][3]
    layer_settings({**config, "head_dim": head_dim}, 0)  # what HF computes


def test_persimmon_reads_qk_layernorm_and_its_eps():
    config, state, f = _fixture("persimmon")
    cls, args, kw, layout = layer_settings(config, 0)
    assert cls.__name__ == "_QKLayerNormAttention" and "cls" not in layout
    assert kw["norm_eps"] == 1e-5 and kw["rotary_dim"] == 8  # 0.5 of 16
    assert layout["rows"] == "per_head"
    eps = {**config, "layer_norm_eps": 1e-3}
    assert layer_settings(eps, 0)[2]["norm_eps"] == 1e-3
    # without it: HF's class has no norms, nor does the layer
    plain = {**config, "qk_layernorm": False}
    assert type(attention_from_hf(plain, 0)).__name__ == "HFAttention"
    state = {k: a for k, a in state.items() if "layernorm" not in k}
    attention_from_hf(plain, 0, state)
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        layer_settings({**config, "num_key_value_heads": 2}, 0)


def test_persimmons_layernorm_is_not_rmsnorm():
    """The same weights with Qwen3's RMSNorm per head (no mean, no bias)
    in place of the LayerNorm miss HF by far more than rounding: the
    fixture checks the LayerNorm."""
    config, state, f = _fixture("persimmon")
    layer = attention_from_hf(config, 0, state)
    _, args, kw, _ = layer_settings(config, 0)
    rms = HFAttention(*args, **{**kw, "qk_norm": "head"})
    for k in rms.params:
        rms.params[k] = layer.params[k]
    err = np.max(np.abs(rms.forward(f["x"]) - f["layer0.out"]))
    assert err > 1e-3 * np.max(np.abs(f["layer0.out"]))


def test_transformers_default_configs_build():
    """Each family's default config as transformers 5.24.0 writes it
    (appendix A2's record, every key of the configuration class; GPT-SW3's
    says gpt2) is read without a refusal."""
    from attn_np.instruments import atlas

    rows = {r["model_type"]: r for r in atlas.load()["families"]}
    for name in (*FUSED, "gpt-sw3"):
        config = rows[name]["config"]
        cls, args, kw, layout = layer_settings(config, 0)
        assert layout["kind"] == "fused", name


def test_every_layer_of_a_gpt2_config_by_its_own_spellings():
    """attention_layers_from_hf counts GPT-2's layers by its n_layer (the
    one reader of the families' spellings)."""
    cfg = json.loads(
        str(np.load(FIXTURES / "families" / "gpt2.npz")["config"])
    )
    assert "num_hidden_layers" not in cfg and cfg["n_layer"] == 2
    assert len(attention_layers_from_hf(cfg)) == 2
