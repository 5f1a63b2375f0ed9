"""Mistral 4: DeepSeek-V3's MLA with Ministral 3's query scale by
position (attn_np.hf.layers._ScaledQueryLatentAttention, gradient-checked
in float64), against transformers 5.24.0's fixture."""

import numpy as np
import pytest
from helpers import family_fixture

from attn_np import check_layer_gradients
from attn_np.hf.build import attention_from_hf
from attn_np.hf.families import layer_settings
from attn_np.hf.layers import HFLatentAttention, _ScaledQueryLatentAttention
from attn_np.instruments.gradcheck import TOLERANCE


def _load():
    return family_fixture("mistral4")


@pytest.mark.parametrize("d_latent_q", [None, 6])
def test_scaled_query_mla_gradients(d_latent_q):
    layer = _ScaledQueryLatentAttention(
        16, 2, 4, 6, 2, d_latent_q=d_latent_q, d_head_v=3, seed=1,
        latent_norm=True, query_temperature=(2, 0.5, 0),
    )  # fmt: skip
    x = np.random.default_rng(0).standard_normal((2, 7, 16))
    errs = check_layer_gradients(layer, x, seed=4)
    assert set(errs) == {"x"} | set(layer.params)
    assert max(errs.values()) < TOLERANCE, errs


def test_the_query_scale_matters():
    f, cfg, state = _load()
    assert layer_settings(cfg, 0)[2]["query_temperature"] == (4, 0.1, 0)
    layer = attention_from_hf(cfg, 0, state)
    _, args, kw, _ = layer_settings(cfg, 0)
    del kw["query_temperature"]
    plain = HFLatentAttention(*args, **kw)  # the same MLA, no scale
    plain.params = layer.params
    off = plain.forward(f["x"])
    assert np.abs(off - f["layer0.out"]).max() > 1e-3


def test_refusals_name_the_key():
    _, cfg, _ = _load()
    rope = dict(cfg["rope_parameters"])
    del rope["llama_4_scaling_beta"]
    with pytest.raises(ValueError, match="llama_4_scaling_beta"):
        layer_settings(dict(cfg, rope_parameters=rope), 0)
    rope = dict(cfg["rope_parameters"], partial_rotary_factor=0.5)
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        layer_settings(dict(cfg, rope_parameters=rope), 0)
