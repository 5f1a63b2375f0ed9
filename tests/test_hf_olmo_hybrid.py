"""OLMo Hybrid (olmo_hybrid) against transformers 5.24.0
(tests/fixtures/families/olmo_hybrid.npz: layer 0 its Gated DeltaNet,
beta doubled, q, k, v, g, b and a each their own projection; layer 1 full
attention with OLMo 2's QK-norm and RoPE). The fixture's forward,
gradients and decode are matched by test_hf_families.py; here, the
states HF caches, the details that make the match, and the rules of
OlmoHybridConfig."""

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import check_linear_decode_state, close, family_fixture

from attn_np import GatedDeltaNet, attention_from_hf
from attn_np.hf.build import fixture_errors
from attn_np.hf.families import layer_settings
from attn_np.hf.weights import gated_deltanet_from_hf

FIXTURE = Path(__file__).parent / "fixtures" / "families" / "olmo_hybrid.npz"


def _load(i):
    return family_fixture("olmo_hybrid", i)


_close = close


def _err(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def test_the_fixture_matches_both_layers():
    for i in (0, 1):
        errors = fixture_errors(FIXTURE, layer_idx=i)
        assert max(errors.values()) < 1e-13, errors


def test_decode_state_matches_hf_cache():
    """After the prefill, the layer's state and its convolution's last
    inputs are HF's (HF keeps K inputs per channel, the first never read
    again)."""
    f, cfg, state = _load(0)
    layer = attention_from_hf(cfg, 0, state)
    check_linear_decode_state(f, layer)


def test_the_linear_layer_is_a_gated_deltanet_of_doubled_beta():
    f, cfg, state = _load(0)
    layer = attention_from_hf(cfg, 0, state)
    assert isinstance(layer, GatedDeltaNet)
    assert layer.allow_neg_eigval and layer.eps == 1e-5
    assert (layer.n_k_heads, layer.n_v_heads, layer.d_k) == (2, 4, 8)
    # the weights go both ways, name by name
    back = layer.to_hf(layer.params)
    assert set(back) == set(state)
    for name, a in state.items():
        assert np.array_equal(back[name], a), name
    # gated_deltanet_from_hf reads the same layer
    alone = gated_deltanet_from_hf(cfg, state)
    assert np.array_equal(alone.forward(f["x"]), layer.forward(f["x"]))
    # beta in (0, 1) misses HF by far
    plain = dict(cfg, linear_allow_neg_eigval=False)
    off = attention_from_hf(plain, 0, state).forward(f["x"])
    assert _err(off, f["layer0.out"]) > 1e-3
    # Qwen3.5's names are not OLMo Hybrid's
    qwen = dict(state, **{"in_proj_z.weight": state["g_proj.weight"]})
    with pytest.raises(ValueError, match="unexpected.*in_proj_z"):
        attention_from_hf(cfg, 0, qwen)
    gone = {k: v for k, v in state.items() if k != "g_proj.weight"}
    with pytest.raises(ValueError, match="lacks g_proj.weight"):
        attention_from_hf(cfg, 0, gone)


def test_the_attention_layer_needs_its_norm_and_rope():
    f, cfg, state = _load(1)
    kw = layer_settings(cfg, 1)[2]
    assert kw["qk_norm"] == "proj" and kw.get("use_rope", True)
    nope = dict(cfg, rope_parameters={"rope_type": "default",
                                      "rope_theta": None})  # fmt: skip
    assert layer_settings(nope, 1)[2]["use_rope"] is False
    off = attention_from_hf(nope, 1, state).forward(f["x"])
    assert _err(off, f["layer1.out"]) > 1e-3
    # a top-level null base, with no base in rope_parameters: NoPE too
    bare = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    assert layer_settings(bare, 1)[2].get("use_rope", True)
    top = dict(bare, rope_theta=None)
    assert layer_settings(top, 1)[2]["use_rope"] is False


def test_olmo_hybrid_config_rules():
    """OlmoHybridConfig's defaults: every fourth layer full (the last
    when none is), the linear sizes from the heads and hidden_size."""
    _, cfg, _ = _load(0)
    base = {
        k: v
        for k, v in cfg.items()
        if not k.startswith("linear_") and k != "layer_types"
    }
    kinds = [
        layer_settings(dict(base, num_hidden_layers=8), i)[3]["kind"]
        for i in range(8)
    ]
    assert kinds == ["linear", "linear", "linear", "proj"] * 2
    two = [
        layer_settings(dict(base, num_hidden_layers=2), i)[3]["kind"]
        for i in range(2)
    ]
    assert two == ["linear", "proj"]
    args, kw = layer_settings(dict(base, num_hidden_layers=4), 0)[1:3]
    # 4 heads of 0.75 * 64 / 4 = 12 key features, values twice that
    assert args == (64, 4, 4)
    assert (kw["d_k"], kw["d_v"], kw["conv_size"]) == (12, 24, 4)
    assert kw["allow_neg_eigval"] is True


@pytest.mark.parametrize(
    "change, match",
    [
        ({"layer_types": ["linear_attention", "sliding_attention"]},
         "linear_attention and full_attention layers only"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                              "partial_rotary_factor": 0.5}},
         "partial_rotary_factor"),
        ({"linear_allow_neg_eigval": "yes"}, "true or false"),
    ],
)  # fmt: skip
def test_what_olmo_hybrid_does_not_build_is_refused(change, match):
    _, cfg, _ = _load(0)
    with pytest.raises(ValueError, match=match):
        layer_settings(dict(cfg, **change), 0)


def test_another_family_with_the_doubled_beta_is_refused():
    f = np.load(FIXTURE.parent / "qwen3_5_text.npz")
    cfg = json.loads(str(f["config"]))
    with pytest.raises(ValueError, match="linear_allow_neg_eigval"):
        layer_settings(dict(cfg, linear_allow_neg_eigval=True), 0)
