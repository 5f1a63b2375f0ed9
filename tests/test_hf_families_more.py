"""Issue 44, continued: the families of attn_np.hf.families_more (Cohere 2
MoE, Granite SWA, MLA under other model types, OPT-style NoPE layers,
GPT-J, Phi, GPT-Neo, nanochat). Their fixtures are checked with every
other in tests/test_hf_families.py; here, that each key they read changes
the layer as HF's code does, and that what they lack is refused by name.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from attn_np.hf.build import attention_from_hf, attention_layers_from_hf
from attn_np.hf.families import layer_settings

FAMILY_FIXTURES = Path(__file__).parent / "fixtures" / "families"


def _config(name):
    f = np.load(FAMILY_FIXTURES / f"{name}.npz")
    return json.loads(str(f["config"]))


def _state(name, i=0):
    f = np.load(FAMILY_FIXTURES / f"{name}.npz")
    pre = f"layer{i}.param."
    return {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}


def _kw(config, i=0):
    return {"use_rope": True, **layer_settings(config, i)[2]}


def test_cohere2_moe_turns_window_and_dense_layers():
    cfg = _config("cohere2_moe")
    assert [_kw(cfg, i)["use_rope"] for i in range(3)] == [True, True, False]
    # HF's force_rope needs prefix_dense_sliding_window_pattern == 1
    other = {**cfg, "prefix_dense_sliding_window_pattern": 2}
    assert [_kw(other, i)["use_rope"] for i in range(3)] == [
        False,
        True,
        False,
    ]
    assert _kw(cfg)["rope_layout"] == "interleaved"


def test_cohere2_moe_refuses_unwritten_dense_layers():
    cfg = {**_config("cohere2_moe"), "first_k_dense_replace": 1}
    del cfg["mlp_layer_types"]
    with pytest.raises(ValueError, match="mlp_layer_types"):
        layer_settings(cfg, 0)
    bad = {**_config("cohere2_moe"), "mlp_layer_types": ["dense"]}
    with pytest.raises(ValueError, match="one entry per layer"):
        layer_settings(bad, 0)


@pytest.mark.parametrize("name", ["granite_swa", "granitemoe_swa"])
def test_granite_swa_reads_a_rope_base_per_layer(name):
    cfg = _config(name)
    kws = [_kw(cfg, i) for i in range(3)]
    assert [k["use_rope"] for k in kws] == [False, True, True]
    assert [k["rope_base"] for k in kws[1:]] == [1e4, 5e4]
    assert all(k["sinks"] and k["scale"] == 0.2 for k in kws)
    assert [k["window"] for k in kws] == [None, 4, 4]
    # GraniteSWAConfig's layer_types when none is written: i % 4 == 0 full
    flat = {**cfg, "num_hidden_layers": 5, "layer_rope_theta": None}
    del flat["layer_types"]
    assert [_kw(flat, i)["window"] for i in range(5)] == [
        None,
        4,
        4,
        4,
        None,
    ]
    for bad, match in [
        ([0, 1e4], "one RoPE base per layer"),
        ([0, "1e4", 1e4], r"layer_rope_theta\[1\]"),
        ([0, -1.0, 1e4], "0 or positive"),
    ]:
        with pytest.raises(ValueError, match=match):
            layer_settings({**cfg, "layer_rope_theta": bad}, 1)


def test_minicpm3_turns_halves_whatever_rope_interleave_says():
    cfg = {**_config("minicpm3"), "rope_interleave": True}
    assert layer_settings(cfg, 0)[2]["rope_layout"] == "half"
    assert _kw(_config("youtu"))["rope_layout"] == "interleaved"
    # MiniCPM3Config: v_head_dim defaults to hidden_size // heads
    bare = {**_config("minicpm3"), "v_head_dim": None}
    assert layer_settings(bare, 0)[2]["d_head_v"] == 64 // 4


@pytest.mark.parametrize("name", ["glm4_moe_lite", "youtu", "sarvam_mla"])
def test_mla_under_other_names_is_deepseek_v3s(name):
    cfg = _config(name)
    ds = {**cfg, "model_type": "deepseek_v3"}
    assert layer_settings(cfg, 0)[:3] == layer_settings(ds, 0)[:3]


def test_mistral4s_mla_is_refused_naming_its_query_scale():
    cfg = {**_config("youtu"), "model_type": "mistral4"}
    with pytest.raises(ValueError, match="llama_4_scaling_beta"):
        layer_settings(cfg, 0)


@pytest.mark.parametrize("name", ["opt", "biogpt", "xglm", "ctrl"])
def test_learned_position_families_are_nope_with_biases(name):
    kw = _kw(_config(name))
    assert kw["use_rope"] is False
    assert sorted(kw["biases"]) == ["k", "o", "q", "v"]


def test_opt_reads_enable_bias():
    cfg = {**_config("opt"), "enable_bias": False}
    assert _kw(cfg)["biases"] == ()
    with pytest.raises(ValueError, match="enable_bias"):
        layer_settings({**_config("gptj"), "enable_bias": True}, 0)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"num_key_value_heads": 2}, "num_key_value_heads=2"),
        ({"head_dim": 8}, "head_dim=8"),
        ({"sliding_window": 4}, "sliding_window=4"),
        ({"rope_theta": 1e4}, "rope_theta"),
    ],
)
@pytest.mark.parametrize("name", ["opt", "xglm", "gpt_neo"])
def test_what_a_class_never_reads_is_refused(name, change, match):
    with pytest.raises(ValueError, match=match):
        layer_settings({**_config(name), **change}, 0)


def test_family_spellings_are_read():
    """XGLM writes d_model, attention_heads, num_layers (HF's
    attribute_map); both spellings at once must agree."""
    cfg = _config("xglm")
    assert "d_model" in cfg and "hidden_size" not in cfg
    assert layer_settings(cfg, 0)[1] == (64, 4, 4, 16)
    assert len(attention_layers_from_hf(cfg)) == 2
    with pytest.raises(ValueError, match="contradictory: d_model=64"):
        layer_settings({**cfg, "hidden_size": 32}, 0)
    ctrl = _config("ctrl")
    assert layer_settings(ctrl, 0)[1] == (64, 4, 4, 16)
    assert "Wq.weight" in attention_from_hf(ctrl, 0, _state("ctrl")).to_hf(
        attention_from_hf(ctrl, 0, _state("ctrl")).params
    )


def test_gptj_turns_the_first_rotary_dim_features_in_pairs():
    kw = _kw(_config("gptj"))
    assert (kw["rotary_dim"], kw["rope_layout"]) == (8, "interleaved")
    assert kw["biases"] == ()
    assert _kw({**_config("gptj"), "rotary_dim": 16})["rotary_dim"] is None
    for bad, match in [(None, "rotary_dim is null"), (7, "even")]:
        with pytest.raises(ValueError, match=match):
            layer_settings({**_config("gptj"), "rotary_dim": bad}, 0)


def test_phi_partial_rope_and_its_qk_layernorm():
    cfg = _config("phi")
    bare = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    bare.pop("partial_rotary_factor", None)
    assert _kw(bare)["rotary_dim"] == 8  # PhiConfig's 0.5 of 16
    cls, _, kw, _ = layer_settings({**cfg, "qk_layernorm": True}, 0)
    assert cls.__name__ == "_QKLayerNormAttention"
    assert kw["norm_eps"] == cfg["layer_norm_eps"]
    cls, _, _, _ = layer_settings({**cfg, "qk_layernorm": False}, 0)
    assert cls.__name__ == "HFAttention"


def test_gpt_neo_layer_kinds():
    cfg = _config("gpt_neo")
    kws = [_kw(cfg, i) for i in (0, 1)]
    assert [k["window"] for k in kws] == [None, 4]
    assert all(k["scale"] == 1.0 and k["biases"] == ("o",) for k in kws)
    for change, match in [
        ({"attention_types": [[["global"], 1]]}, "must give 2"),
        ({"attention_types": [[["global", "near"], 1]]}, "must give 2"),
        ({"attention_types": [["global", "local"]]}, "repeats"),
        ({"attention_layers": ["local", "global"]}, "contradictory"),
    ]:
        with pytest.raises(ValueError, match=match):
            layer_settings({**cfg, **change}, 0)
    with pytest.raises(ValueError, match="window_size"):
        layer_settings({**_config("opt"), "window_size": 4}, 0)


def test_nanochat_needs_its_swap_of_halves():
    """Without the swap (a Llama 4-style layer: parameter-free QK norm
    after RoPE, turned the usual way) the layer misses HF's by far."""
    f = np.load(FAMILY_FIXTURES / "nanochat.npz")
    layer = attention_from_hf(_config("nanochat"), 0, _state("nanochat"))
    assert layer.hf_layout["swap_halves"]
    err = np.max(np.abs(layer.forward(f["x"]) - f["layer0.out"]))
    assert err < 1e-10 * np.max(np.abs(f["layer0.out"]))
    back = layer.to_hf(layer.params)
    for k, v in _state("nanochat").items():
        np.testing.assert_array_equal(back[k], v)
    layer.hf_layout = {**layer.hf_layout, "swap_halves": False}
    layer.params = {k: back[f"{k[2]}_proj.weight"].T for k in layer.params}
    err = np.max(np.abs(layer.forward(f["x"]) - f["layer0.out"]))
    assert err > 1e-3 * np.max(np.abs(f["layer0.out"]))
    partial = _config("nanochat")
    partial["rope_parameters"] = {
        **partial["rope_parameters"],
        "partial_rotary_factor": 0.5,
    }
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        layer_settings(partial, 0)


@pytest.mark.parametrize(
    "key, value",
    [
        ("layer_rope_theta", [0, 0]),
        ("prefix_dense_sliding_window_pattern", 2),
        ("attention_types", [[["global"], 2]]),
        ("attention_layers", ["global", "global"]),
        ("window_size", 4),
        ("enable_bias", True),
        ("attn_layer_indices", [1]),
        ("attn_layer_period", 2),
        ("attn_layer_offset", 1),
        ("key_multiplier", 0.5),
        ("position_embedding_type", "rope"),
    ],
)
def test_a_family_key_on_llama_is_refused(key, value):
    top = FAMILY_FIXTURES.parent / "llama.npz"
    config = json.loads(str(np.load(top)["config"]))
    with pytest.raises(ValueError, match=key):
        layer_settings({**config, key: value}, 0)


@pytest.mark.parametrize(
    "name,layer,match",
    [
        ("bamba", 0, "layer 0 of bamba is a Mamba-2 mixer layer"),
        ("jamba", 0, "layer 0 of jamba is a Mamba mixer layer"),
    ],
)
def test_a_hybrids_mamba_layers_are_refused_by_name(name, layer, match):
    with pytest.raises(ValueError, match=match):
        layer_settings(_config(name), layer)
    with pytest.raises(ValueError, match=match):
        attention_layers_from_hf(_config(name))


def test_hybrid_attention_layers_read_their_keys():
    bamba = _config("bamba")
    assert _kw(bamba, 1)["rotary_dim"] == 8  # 0.5 of 16
    bare = {**bamba, "rope_parameters": None, "partial_rotary_factor": 1.0}
    with pytest.raises(ValueError, match="replaced by 0.5"):
        layer_settings(bare, 1)
    del bare["partial_rotary_factor"]
    assert _kw(bare, 1)["rotary_dim"] == 8  # BambaConfig's 0.5
    with pytest.raises(ValueError, match="attn_layer_indices"):
        layer_settings({**bamba, "attn_layer_indices": "1"}, 1)
    with pytest.raises(ValueError, match="layer 1 of bamba is a Mamba-2"):
        layer_settings({**bamba, "attn_layer_indices": None}, 1)
    jamba = _config("jamba")
    assert (_kw(jamba, 1)["use_rope"], _kw(jamba, 1)["biases"]) == (
        False,
        (),
    )
    moved = {**jamba, "attn_layer_offset": 0}
    assert _kw(moved, 0)["use_rope"] is False
    with pytest.raises(ValueError, match="layer 1 of jamba"):
        layer_settings(moved, 1)
    falcon = _config("falcon_h1")
    assert _kw(falcon)["scale"] == 0.5 / 4
    with pytest.raises(ValueError, match="key_multiplier"):
        layer_settings({**falcon, "key_multiplier": -1.0}, 0)
    with pytest.raises(ValueError, match="key_multiplier"):
        layer_settings({**_config("opt"), "key_multiplier": 2.0}, 0)


@pytest.mark.parametrize(
    "model_type,match",
    [
        ("zamba", r"read 2 \* hidden_size"),
        ("zamba2", "LoRA adapters"),
    ],
)
def test_zamba_is_refused_with_what_it_needs(model_type, match):
    config = {**_config("jamba"), "model_type": model_type}
    with pytest.raises(ValueError, match=match):
        layer_settings(config, 1)


def test_granite_4_hybrid():
    cfg = _config("granitemoehybrid")
    kw = _kw(cfg, 1)
    assert (kw["scale"], kw["use_rope"]) == (0.2, True)
    nope = {**cfg, "position_embedding_type": None}
    assert _kw(nope, 1)["use_rope"] is False
    with pytest.raises(ValueError, match="position_embedding_type"):
        layer_settings({**cfg, "position_embedding_type": "alibi"}, 1)
    match = "layer 0 of granitemoehybrid is a Mamba-2 mixer layer"
    with pytest.raises(ValueError, match=match):
        layer_settings(cfg, 0)
    # an older file: layers_block_type with the legacy names
    old = {k: v for k, v in cfg.items() if k != "layer_types"}
    old["layers_block_type"] = ["mamba", "attention"]
    assert _kw(old, 1)["scale"] == 0.2
    with pytest.raises(ValueError, match="Mamba-2 mixer"):
        layer_settings(old, 0)
    # no layer_types at all: GraniteMoeHybridConfig makes every layer Mamba
    bare = {k: v for k, v in cfg.items() if k != "layer_types"}
    with pytest.raises(ValueError, match="Mamba-2 mixer"):
        layer_settings(bare, 1)


def test_nemotron_h():
    cfg = _config("nemotron_h")
    kw = _kw(cfg, 1)
    assert (kw["use_rope"], kw["biases"], kw["window"]) == (False, (), None)
    with pytest.raises(ValueError, match="layer 0 of nemotron_h is a Mamba"):
        layer_settings(cfg, 0)
    # an older file: hybrid_override_pattern, one character a layer; the
    # pattern's length is the number of layers
    old = {k: v for k, v in cfg.items() if k != "layers_block_type"}
    old.update(hybrid_override_pattern="M-E*", num_hidden_layers=2)
    assert _kw(old, 3)["use_rope"] is False
    for i, what in [(1, "an MLP layer"), (2, "a mixture-of-experts MLP")]:
        with pytest.raises(
            ValueError, match=f"layer {i} of nemotron_h is {what}"
        ):
            layer_settings(old, i)
    with pytest.raises(ValueError, match="hybrid_override_pattern"):
        layer_settings({**old, "hybrid_override_pattern": "M*X"}, 1)
    with pytest.raises(ValueError, match="sliding_window=4"):
        layer_settings({**cfg, "sliding_window": 4}, 1)
