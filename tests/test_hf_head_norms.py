"""A LayerNorm per head on q and k before RoPE: one gain and bias shared
by the heads (Persimmon, Phi's qk_layernorm) or each head its own gain
and no bias (Cohere's use_qk_norm, StableLM's qk_layernorm, one module
per head), gradient-checked in float64 and matched against transformers
5.24.0's fixtures, with the weights read and written back."""

import json
from pathlib import Path

import numpy as np
import pytest

from attn_np import check_layer_gradients
from attn_np.hf.build import attention_from_hf, fixture_errors
from attn_np.hf.layers import _HeadGainLayerNormAttention
from attn_np.instruments.gradcheck import TOLERANCE

FAMILIES = Path(__file__).parent / "fixtures" / "families"


@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_head_gain_layernorm_gradients(n_kv):
    layer = _HeadGainLayerNormAttention(
        8, 4, n_kv, 4, seed=1, rope_base=1e4, biases=("q", "k", "v")
    )
    r = np.random.default_rng(7)
    for n, heads in (("q_norm", 4), ("k_norm", n_kv)):
        assert layer.params[n].shape == (heads, 4)
        layer.params[n] = r.standard_normal((heads, 4))
    x = r.standard_normal((2, 5, 8))
    errs = check_layer_gradients(layer, x, seed=3)
    assert set(errs) == {"x"} | set(layer.params)
    assert max(errs.values()) < TOLERANCE, errs


def _load(name):
    f = np.load(FAMILIES / f"{name}.npz")
    cfg = json.loads(str(f["config"]))
    pre = "layer0.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    return cfg, state


@pytest.mark.parametrize(
    ("name", "key", "norm"),
    [
        ("cohere", "use_qk_norm", "q_norm.weight"),
        ("stablelm", "qk_layernorm", "q_layernorm.norms.1.weight"),
        ("phi", "qk_layernorm", "q_layernorm.bias"),
    ],
)
def test_each_gain_is_read_and_matters(name, key, norm):
    cfg, state = _load(name)
    assert cfg[key] is True
    path = FAMILIES / f"{name}.npz"
    assert max(fixture_errors(path, layer_idx=0).values()) < 1e-12
    layer = attention_from_hf(cfg, 0, state_dict=state)
    back = layer.to_hf(layer.params)
    assert set(back) == set(state)
    for k, a in state.items():
        np.testing.assert_array_equal(back[k], a)
    x = np.random.default_rng(0).standard_normal((1, 5, cfg["hidden_size"]))
    y = layer.forward(x)
    other = dict(state, **{norm: state[norm] + 0.5})
    y2 = attention_from_hf(cfg, 0, state_dict=other).forward(x)
    assert np.abs(y2 - y).max() > 1e-3  # the gain (or bias) is used


def test_a_missing_head_gain_is_named():
    cfg, state = _load("stablelm")
    del state["k_layernorm.norms.1.weight"]
    with pytest.raises(ValueError, match=r"k_layernorm\.norms\.1\.weight"):
        attention_from_hf(cfg, 0, state_dict=state)
    cfg, state = _load("stablelm")
    state["q_layernorm.norms.0.weight"] = np.ones(3)
    with pytest.raises(ValueError, match="q_layernorm.norms.0.weight"):
        attention_from_hf(cfg, 0, state_dict=state)
