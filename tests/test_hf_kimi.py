"""Kimi Linear (attn_np.hf.kimi): its Kimi Delta Attention layers with
Hugging Face's bias-free output gate, and its MLA without RoPE, against
transformers 5.24.0 (tests/fixtures/families/kimi_linear.npz: layer 0
KDA, layer 1 MLA); both parts gradient-checked in float64."""

from pathlib import Path

import numpy as np
import pytest
from helpers import check_linear_decode_state, close, family_fixture

from attn_np import KimiDeltaAttention, check_layer_gradients
from attn_np.hf.build import attention_from_hf
from attn_np.hf.families import layer_settings
from attn_np.hf.kimi import _Unrotated
from attn_np.hf.layers import HFLatentAttention
from attn_np.instruments.gradcheck import TOLERANCE

RELEASED = Path(__file__).parent / "data/hf_configs/kimi_linear_48b_a3b.json"


def _load(i):
    return family_fixture("kimi_linear", i)


_close = close


@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
def test_kda_without_gate_bias_gradients(mode):
    layer = KimiDeltaAttention(
        12, 4, 2, d_k=3, d_v=2, chunk_size=3, seed=1, mode=mode,
        gate_bias=False,
    )  # fmt: skip
    assert "b_g" not in layer.params
    x = np.random.default_rng(2).standard_normal((2, 7, 12))
    errs = check_layer_gradients(layer, x, seed=3, h=1e-6)
    assert set(errs) == {"x"} | set(layer.params)
    assert max(errs.values()) < TOLERANCE, errs


@pytest.mark.parametrize("d_latent_q", [None, 6])
def test_unrotated_mla_gradients(d_latent_q):
    layer = HFLatentAttention(
        16, 2, 4, 6, 2, d_latent_q=d_latent_q, d_head_v=3, seed=1,
        latent_norm=True, rotary=_Unrotated(),
    )  # fmt: skip
    x = np.random.default_rng(0).standard_normal((2, 5, 16))
    errs = check_layer_gradients(layer, x, seed=4)
    assert set(errs) == {"x"} | set(layer.params)
    assert max(errs.values()) < TOLERANCE, errs


def test_kda_decode_state_matches_hf_cache():
    """After the prefill, the layer's state and its convolution's last
    inputs are HF's (HF keeps K inputs per channel, the first never read
    again)."""
    f, cfg, state = _load(0)
    layer = attention_from_hf(cfg, 0, state)
    check_linear_decode_state(f, layer)


def test_weights_go_both_ways():
    _, cfg, state = _load(0)
    layer = attention_from_hf(cfg, 0, state)
    back = layer.to_hf(layer.params)
    assert set(back) == set(state)
    for k, a in state.items():
        assert back[k].shape == a.shape and np.array_equal(back[k], a), k


def test_the_mla_turns_nothing():
    """With RoPE on its shared key the layer misses HF's by far more than
    rounding: Kimi Linear's MLA is NoPE."""
    f, cfg, state = _load(1)
    layer = attention_from_hf(cfg, 1, state)
    assert isinstance(layer.rotary, _Unrotated)
    turned = HFLatentAttention(64, 4, 8, 16, 4, d_head_v=8, latent_norm=True)
    turned.params = layer.params
    assert np.abs(turned.forward(f["x"]) - f["layer1.out"]).max() > 1e-3


def test_released_config_spelling():
    """The released file's linear_attn_config (layers numbered from 1,
    num_heads, head_dim, short_conv_kernel_size) and mla_use_nope."""
    cls, args, kw, _ = layer_settings(RELEASED, 0)
    assert cls is KimiDeltaAttention and args == (2304, 32, 32)
    assert (kw["d_k"], kw["conv_size"], kw["gate_bias"]) == (128, 4, False)
    cls, args, kw, _ = layer_settings(RELEASED, 3)  # full_attn_layers: 4
    assert cls is HFLatentAttention and args == (2304, 32, 128, 512, 64)
    assert isinstance(kw["rotary"], _Unrotated)


def test_refusals_name_the_key():
    _, cfg, state = _load(0)
    with pytest.raises(ValueError, match="mla_use_nope"):
        layer_settings({**cfg, "mla_use_nope": False}, 1)
    with pytest.raises(ValueError, match="hidden_act"):
        layer_settings({**cfg, "hidden_act": "gelu"}, 0)
    lin = {"num_heads": 8, "head_dim": 8, "short_conv_kernel_size": 4}
    with pytest.raises(ValueError, match="contradictory.*num_heads"):
        layer_settings({**cfg, "linear_attn_config": lin}, 0)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        layer_settings({**cfg, "num_key_value_heads": 2}, 1)
    bad = dict(state)
    bad["forget_gate.A_log"] = state["forget_gate.A_log"].reshape(-1)
    with pytest.raises(
        ValueError, match=r"forget_gate.A_log.*\(1, 1, 4, 1\)"
    ):
        attention_from_hf(cfg, 0, bad)
    with pytest.raises(ValueError, match="missing.*o_norm.weight"):
        attention_from_hf(
            cfg, 0, {k: v for k, v in state.items() if k != "o_norm.weight"}
        )
    bad = dict(
        state, **{"b_proj.weight": state["b_proj.weight"].astype(int)}
    )
    with pytest.raises(TypeError, match="b_proj.weight"):
        attention_from_hf(cfg, 0, bad)
    with pytest.raises(TypeError, match="gate_bias"):
        KimiDeltaAttention(12, 4, gate_bias="no")
