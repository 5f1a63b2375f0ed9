"""BitNet: Llama's attention with attn_sub_norm, an RMSNorm (gain
[hidden_size]) of the heads' outputs side by side before o_proj, as an
output-step part of chapter 10's layer (attn_np.hf.layers.
_SubNormOutput), gradient-checked in float64 and against transformers
5.24.0's module (tests/fixtures/families/bitnet.npz)."""

import json
from pathlib import Path

import numpy as np
import pytest

from attn_np import check_layer_gradients
from attn_np.hf.build import attention_from_hf
from attn_np.hf.families import layer_settings
from attn_np.hf.layers import _SubNormAttention
from attn_np.instruments.gradcheck import TOLERANCE

FAMILIES = Path(__file__).parent / "fixtures" / "families"


@pytest.mark.parametrize("n_kv,biases", [(1, ()), (2, ("q", "o"))])
def test_sub_norm_gradients(n_kv, biases):
    layer = _SubNormAttention(8, 2, n_kv, 4, seed=1, biases=biases)
    r = np.random.default_rng(3)
    layer.params["o_norm"] = 1 + 0.5 * r.standard_normal(8)
    x = r.standard_normal((2, 5, 8))
    errs = check_layer_gradients(layer, x, seed=2)
    assert set(errs) == {"x"} | set(layer.params)
    assert "o_norm" in errs
    assert max(errs.values()) < TOLERANCE, errs


def test_sub_norm_matters_and_round_trips():
    f = np.load(FAMILIES / "bitnet.npz")
    cfg = json.loads(str(f["config"]))
    pre = "layer0.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    layer = attention_from_hf(cfg, 0, state)
    assert type(layer) is _SubNormAttention
    assert np.abs(layer.forward(f["x"]) - f["layer0.out"]).max() < 1e-12
    ones = {**state, "attn_sub_norm.weight": np.ones(64)}
    off = attention_from_hf(cfg, 0, ones).forward(f["x"])
    assert np.abs(off - f["layer0.out"]).max() > 1e-3
    back = layer.to_hf(layer.params)
    assert set(back) == set(state)
    assert all(np.array_equal(back[k], a) for k, a in state.items())


def test_heads_must_fill_the_width():
    f = np.load(FAMILIES / "bitnet.npz")
    cfg = {**json.loads(str(f["config"])), "head_dim": 8}
    with pytest.raises(ValueError, match="attn_sub_norm normalises"):
        layer_settings(cfg, 0)
