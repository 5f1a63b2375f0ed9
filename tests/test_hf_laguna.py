"""Laguna against transformers 5.24.0: chapter 10's output gate with a
softplus in place of the sigmoid (attn_np.hf.families_laguna, its
backward gradient-checked in float64), one gate per head or per feature,
and each layer its own number of query heads."""

import numpy as np
import pytest
from helpers import family_fixture

from attn_np import check_layer_gradients
from attn_np.hf.build import attention_from_hf
from attn_np.hf.families import layer_settings
from attn_np.hf.families_laguna import (
    _softplus_gate,
    _softplus_gate_backward,
    _SoftplusGateAttention,
)
from attn_np.hf.layers import HFAttention
from attn_np.instruments.gradcheck import TOLERANCE


def _load(i):
    return family_fixture("laguna", i)


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_softplus_gate_gradients(gate):
    layer = _SoftplusGateAttention(
        8,
        4,
        2,
        4,
        gate=gate,
        qk_norm="head",
        biases=("q", "k", "v", "o"),
        window=3,
        seed=1,
    )
    r = np.random.default_rng(2)
    for name, p in layer.params.items():
        layer.params[name] = r.standard_normal(p.shape)
    x = r.standard_normal((2, 6, 8))
    errs = check_layer_gradients(layer, x, seed=3)
    assert set(errs) == {"x"} | set(layer.params)
    assert max(errs.values()) < TOLERANCE, errs


def test_softplus_gate_pair():
    """softplus(g) = log(1 + e^g), finite for large |g|; its backward
    sums a head's features for the per-head gate."""
    o = np.ones((1, 2, 3))
    g = np.array([[[-800.0], [800.0]]])
    y, cache = _softplus_gate(o, g)
    assert np.allclose(y[0, :, 0], [0.0, 800.0])
    do, dg = _softplus_gate_backward(np.ones_like(o), cache)
    assert dg.shape == g.shape and np.allclose(dg[0, :, 0], [0.0, 3.0])
    with pytest.raises(ValueError, match="dy"):
        _softplus_gate_backward(np.ones((1, 2)), cache)


def test_the_layers_are_read_as_hf_builds_them():
    _, cfg, state = _load(1)
    cls, args, kw, layout = layer_settings(cfg, 1)
    assert cls is _SoftplusGateAttention
    assert args == (64, 2, 2, 16)  # num_attention_heads_per_layer[1]
    assert kw["gate"] == "headwise" and layout["gate_proj"] == "g_proj"
    assert kw["rotary_dim"] == 8 and kw["rope_base"] == 5e5
    assert kw["biases"] == ("q", "k", "v", "o") and kw["qk_norm"] == "head"
    assert layer_settings(cfg, 0)[1][1] == 4
    assert layer_settings(cfg, 0)[2]["window"] == 4
    per = {**cfg, "gating": "per-element"}
    layer = attention_from_hf(per, 1)
    assert layer.gate == "elementwise"
    assert layer.params["W_g"].shape == (64, 2 * 16)


def test_a_sigmoid_gate_misses():
    """The same weights with chapter 10's sigmoid gate miss HF's output
    by far more than rounding."""
    f, cfg, state = _load(0)
    want = f["layer0.out"]
    layer = attention_from_hf(cfg, 0, state)
    assert np.abs(layer.forward(f["x"]) - want).max() < 1e-12
    _, args, kw, _ = layer_settings(cfg, 0)
    plain = HFAttention(*args, **kw)
    plain.params.update(layer.params)
    assert np.abs(plain.forward(f["x"]) - want).max() > 1e-3


def test_class_defaults():
    """Without layer_types every layer is full; without rope_parameters
    full layers turn half the head at base 5e5; gating true is per
    head; sizes are LagunaConfig's."""
    cfg = {
        "model_type": "laguna",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
    }
    cls, args, kw, _ = layer_settings(cfg, 1)
    assert args == (64, 4, 8, 128)
    assert kw["window"] is None and kw["rope_base"] == 5e5
    assert kw["rotary_dim"] == 64 and kw["gate"] == "headwise"
    slid = {**cfg, "layer_types": ["sliding_attention"] * 2}
    kw = layer_settings(slid, 0)[2]
    assert kw["window"] == 512 and kw["rope_base"] == 1e4
    assert kw["rotary_dim"] is None
    top = {**cfg, "rope_theta": 7.0}  # not read by LagunaRotaryEmbedding
    assert layer_settings(top, 1)[2]["rope_base"] == 5e5


@pytest.mark.parametrize(
    "change,match",
    [
        ({"gating": "per-token"}, "gating"),
        ({"num_attention_heads_per_layer": [4]}, "one head count"),
        ({"num_attention_heads_per_layer": [4, 0]}, r"per_layer\[1\]"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope"),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1.0}},
            "one entry per layer type",
        ),
    ],
)
def test_refusals_name_the_key(change, match):
    _, cfg, _ = _load(0)
    with pytest.raises(ValueError, match=match):
        layer_settings({**cfg, **change}, 1)


def test_gating_is_read_by_laguna_only():
    cfg = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "gating": True,
    }
    with pytest.raises(ValueError, match="gating"):
        layer_settings(cfg, 0)
