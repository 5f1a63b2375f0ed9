"""HunYuan (hunyuan_v1_dense, hunyuan_v1_moe): a learned QK RMSNorm
after RoPE (attn_np.hf.layers._PostRopeGainAttention, gradient-checked
in float64) and rope_type "dynamic" with alpha, NTK's fixed stretch of
the base, against transformers 5.24.0's fixtures."""

import json
from pathlib import Path

import numpy as np
import pytest

from attn_np import check_layer_gradients
from attn_np.hf.build import attention_from_hf
from attn_np.hf.families import layer_settings
from attn_np.hf.layers import _PostRopeGainAttention
from attn_np.instruments.gradcheck import TOLERANCE

FAMILIES = Path(__file__).parent / "fixtures" / "families"


def _load(name):
    f = np.load(FAMILIES / f"{name}.npz")
    cfg = json.loads(str(f["config"]))
    pre = "layer0.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    return f, cfg, state


@pytest.mark.parametrize("n_kv", [1, 2])
def test_gains_after_rope_gradients(n_kv):
    layer = _PostRopeGainAttention(8, 2, n_kv, 4, seed=1, rope_base=1e4)
    r = np.random.default_rng(5)
    for n in ("q_norm", "k_norm"):
        layer.params[n] = r.standard_normal(4)
    x = r.standard_normal((2, 6, 8))
    errs = check_layer_gradients(layer, x, seed=2)
    assert set(errs) == {"x"} | set(layer.params)
    assert max(errs.values()) < TOLERANCE, errs


def test_gains_matter_and_decode_continues():
    f, cfg, state = _load("hunyuan_v1_dense")
    layer = attention_from_hf(cfg, 0, state)
    assert type(layer) is _PostRopeGainAttention
    y = layer.forward(f["x"])
    assert np.abs(y - f["layer0.out"]).max() < 1e-12
    ones = dict(state)
    ones["query_layernorm.weight"] = np.ones(16)
    ones["key_layernorm.weight"] = np.ones(16)
    off = attention_from_hf(cfg, 0, ones).forward(f["x"])
    assert np.abs(off - f["layer0.out"]).max() > 1e-3
    back = layer.to_hf(layer.params)
    assert set(back) == set(state)
    for k, a in state.items():
        assert np.array_equal(back[k], a), k


def test_alpha_stretches_the_base():
    """theta alpha^(d / (d - 2)); factor is not read; without the alpha
    the layer misses HF's."""
    f, cfg, state = _load("hunyuan_v1_dense")
    kw = layer_settings(cfg, 0)[2]
    assert kw["rope_base"] == pytest.approx(1e4 * 50.0 ** (16 / 14))
    cfg2 = dict(cfg, rope_parameters=dict(cfg["rope_parameters"], factor=4))
    assert layer_settings(cfg2, 0)[2]["rope_base"] == kw["rope_base"]
    plain = dict(cfg, rope_parameters={"rope_type": "default"})
    plain["rope_parameters"]["rope_theta"] = 1e4
    off = attention_from_hf(plain, 0, state).forward(f["x"])
    assert np.abs(off - f["layer0.out"]).max() > 1e-3


def test_released_spelling_and_refusals():
    """Older files: rope_theta and a rope_scaling with YaRN's keys beside
    the alpha (not read by HF under an alpha); a dynamic type without
    alpha changes with the length, and is refused."""
    _, cfg, _ = _load("hunyuan_v1_moe")
    old = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    old["rope_theta"] = 1e4
    old["rope_scaling"] = {
        "type": "dynamic", "alpha": 50.0, "factor": 1.0,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
        "mscale_all_dim": 1.0,
    }  # fmt: skip
    kw = layer_settings(old, 0)[2]
    assert kw["rope_base"] == pytest.approx(1e4 * 50.0 ** (16 / 14))
    bare = dict(cfg, rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    bare["rope_parameters"]["rope_theta"] = 1e4
    with pytest.raises(ValueError, match="dynamic"):
        layer_settings(bare, 0)
    with pytest.raises(ValueError, match="head_dim"):
        layer_settings({k: v for k, v in cfg.items() if k != "head_dim"}, 0)
