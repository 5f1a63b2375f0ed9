"""MiMo-V2-Flash (mimo_v2_flash) against transformers 5.24.0: values
narrower than keys (chapter 10's v_head_dim=), scaled before the cache
(attn_np.hf.families_mimo._ScaledValues, gradient-checked in float64),
twice the key/value heads and gpt-oss's sinks on window layers, partial
RoPE per layer type; the KV calculator sizes its cache."""

from pathlib import Path

import numpy as np
import pytest
from helpers import family_fixture

from attn_np import check_layer_gradients
from attn_np.costs import from_hf_config, kv_bytes_per_token
from attn_np.hf.build import attention_from_hf
from attn_np.hf.families import layer_settings
from attn_np.hf.families_mimo import _MiMoAttention
from attn_np.instruments.gradcheck import TOLERANCE
from attn_np.refinements import RefinedAttention

FIXTURE = Path(__file__).parent / "fixtures" / "families"
FIXTURE = FIXTURE / "mimo_v2_flash.npz"


def _load(i):
    return family_fixture("mimo_v2_flash", i)


def _settings(cfg, i):
    return layer_settings(cfg, i)


@pytest.mark.parametrize("sinks,window", [(True, 3), (False, None)])
def test_scaled_narrow_values_gradients(sinks, window):
    layer = _MiMoAttention(
        8,
        4,
        2,
        6,
        v_head_dim=4,
        value_scale=0.6,
        biases=("q", "k", "v"),
        sinks=sinks,
        window=window,
        rotary_dim=2,
        seed=1,
    )
    r = np.random.default_rng(3)
    for name, p in layer.params.items():
        layer.params[name] = r.standard_normal(p.shape)
    x = r.standard_normal((2, 7, 8))
    errs = check_layer_gradients(layer, x, seed=4)
    assert set(errs) == {"x"} | set(layer.params)
    assert max(errs.values()) < TOLERANCE, errs


def test_refined_layer_with_narrow_values_and_a_gate_gradients():
    layer = RefinedAttention(
        8, 2, 1, 6, v_head_dim=3, gate="elementwise", seed=2
    )
    assert layer.params["W_v"].shape == (8, 3)
    assert layer.params["W_o"].shape == (6, 8)
    assert layer.params["W_g"].shape == (8, 6)
    x = np.random.default_rng(1).standard_normal((1, 5, 8))
    errs = check_layer_gradients(layer, x, seed=5)
    assert max(errs.values()) < TOLERANCE, errs
    again = RefinedAttention(8, 2, 1, **layer.options)
    assert again.d_v == 3 and "v_head_dim=3" in repr(again)


def test_the_layers_are_read_as_hf_builds_them():
    _, cfg, _ = _load(0)
    cls, args, kw, _ = _settings(cfg, 0)  # sliding
    assert cls is _MiMoAttention
    assert args == (64, 4, 2, 24)
    assert kw["v_head_dim"] == 16 and kw["value_scale"] == 0.5
    assert kw["sinks"] and kw["window"] == 4  # sliding_window_size + 1
    assert kw["rotary_dim"] == 8  # int(24 * 0.334)
    assert kw["biases"] == ("q", "k", "v")
    _, args, kw, _ = _settings(cfg, 1)  # full
    assert args == (64, 4, 1, 24)
    assert not kw["sinks"] and kw["window"] is None
    assert kw["rotary_dim"] == 12 and kw["rope_base"] == 5e5


@pytest.mark.parametrize(
    "i,change,drop",
    [
        (0, {"attention_value_scale": None}, ()),  # scale 1
        (0, {"sliding_window": 3}, ("sliding_window_size",)),
        (1, {}, ("rope_parameters",)),  # 8 features at 5e6, not 12 at 5e5
    ],
)
def test_each_detail_matters(i, change, drop):
    """Each part read off HF's class, changed, misses HF's output by far
    more than rounding."""
    f, cfg, state = _load(i)
    want = f[f"layer{i}.out"]
    layer = attention_from_hf(cfg, i, state)
    assert np.abs(layer.forward(f["x"]) - want).max() < 1e-12
    other = {k: v for k, v in {**cfg, **change}.items() if k not in drop}
    off = attention_from_hf(other, i, state).forward(f["x"])
    assert np.abs(off - want).max() > 1e-3


def test_class_defaults_and_layer_rule():
    """Without layer_types, layer 0 and every sixth layer are full; an
    absent attention_value_scale is 0.707, a null one 1; absent sizes
    are the class's (head_dim 192, v_head_dim 128, 4 KV heads)."""
    cfg = {
        "model_type": "mimo_v2_flash",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 7,
    }
    kinds = [_settings(cfg, i)[2]["sinks"] for i in range(7)]
    assert kinds == [False, True, True, True, True, False, True]
    cls, args, kw, _ = _settings(cfg, 1)
    assert args == (64, 4, 8, 192)
    assert kw["v_head_dim"] == 128 and kw["value_scale"] == 0.707
    assert kw["window"] == 129 and kw["rope_base"] == 1e4
    assert kw["rotary_dim"] == 64  # int(192 * 0.334)
    assert _settings(cfg, 0)[2]["rope_base"] == 5e6
    null = {**cfg, "attention_value_scale": None}
    assert _settings(null, 1)[2]["value_scale"] == 1.0
    # HF's rotary class reads rope_parameters only
    top = {**cfg, "rope_theta": 123.0, "partial_rotary_factor": 0.5}
    assert _settings(top, 1)[2] == kw


@pytest.mark.parametrize(
    "change,match",
    [
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
            "one entry per layer type",
        ),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope"),
        ({"head_dim": None}, "head_dim"),
        ({"attention_value_scale": -1.0}, "attention_value_scale"),
        ({"layer_types": ["linear_attention"] * 2}, "linear_attention"),
    ],
)
def test_refusals_name_the_key(change, match):
    _, cfg, _ = _load(0)
    with pytest.raises(ValueError, match=match):
        _settings({**cfg, **change}, 0)


def test_value_scale_is_checked():
    with pytest.raises(ValueError, match="value_scale"):
        _MiMoAttention(8, 2, 1, 4, value_scale=0.0)
    with pytest.raises(ValueError, match="v_head_dim"):
        RefinedAttention(8, 2, 1, 4, v_head_dim=0)


def test_weights_go_back_to_hf_names():
    _, cfg, state = _load(0)
    layer = attention_from_hf(cfg, 0, state)
    back = layer.to_hf(layer.params)
    assert set(back) == set(state)
    for k, a in state.items():
        assert np.array_equal(back[k], a), k


def test_the_calculator_sizes_its_cache():
    """Per token: keys head_dim wide, values v_head_dim wide, twice the
    KV heads on window layers (bfloat16: 2 bytes)."""
    _, cfg, _ = _load(0)
    m = from_hf_config(cfg)
    assert m.sliding_window == 4  # sliding_window_size + 1
    assert kv_bytes_per_token(m) == 2 * (2 * (24 + 16) + 1 * (24 + 16))
    flat = {
        k: v
        for k, v in cfg.items()
        if k not in ("layer_types", "head_dim", "v_head_dim")
    }
    flat["num_hidden_layers"] = 6
    m = from_hf_config(flat)
    assert m.layer_types[0] == m.layer_types[5] == "full_attention"
    # four window layers of 2 heads, two full of 1; keys 192, values 128
    assert kv_bytes_per_token(m) == 2 * (4 * 2 + 2 * 1) * (192 + 128)
