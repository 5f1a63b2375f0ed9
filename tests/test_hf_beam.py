"""Beam against transformers 5.24.0: chapter 10's elementwise sigmoid
gate with a bias per head (gate_bias) and, on its NoPE full layers, the
query scale (1 + (p + 1) / 2048)^0.1 as a score mod
(attn_np.hf.families_beam, gradient-checked in float64)."""

import numpy as np
import pytest
from helpers import family_fixture

from attn_np import check_layer_gradients
from attn_np.hf.build import attention_from_hf
from attn_np.hf.families import layer_settings
from attn_np.hf.families_beam import _BeamAttention, _PowerQueryScale
from attn_np.instruments.gradcheck import TOLERANCE


def _load(i):
    return family_fixture("beam", i)


@pytest.mark.parametrize("query_scale", [True, False])
def test_biased_gate_and_query_scale_gradients(query_scale):
    layer = _BeamAttention(
        8,
        4,
        2,
        4,
        gate="elementwise",
        qk_norm="head",
        biases=("q", "k", "v", "o"),
        use_rope=not query_scale,
        query_scale=query_scale,
        window=None if query_scale else 3,
        seed=1,
    )
    r = np.random.default_rng(2)
    for name, p in layer.params.items():
        layer.params[name] = r.standard_normal(p.shape)
    # a scale that bites at these positions: (1 + (p + 1) / 2)^0.7
    layer.score_mods = tuple(
        _PowerQueryScale(2.0, 0.7) if isinstance(m, _PowerQueryScale) else m
        for m in layer.score_mods
    )
    assert (_PowerQueryScale(2.0, 0.7) in layer.score_mods) == query_scale
    x = r.standard_normal((2, 5, 8))
    errs = check_layer_gradients(layer, x, seed=3)
    assert set(errs) == {"x"} | set(layer.params)
    assert max(errs.values()) < TOLERANCE, errs


def test_the_layers_are_read_as_hf_builds_them():
    _, cfg, _ = _load(0)
    cls, args, kw, layout = layer_settings(cfg, 0)
    assert cls is _BeamAttention and args == (64, 4, 2, 16)
    assert kw["window"] == 4 and kw["use_rope"] and not kw["query_scale"]
    assert kw["gate"] == "elementwise" and kw["qk_norm"] == "head"
    assert layout["gate_proj"] == "gate_proj"
    kw = layer_settings(cfg, 1)[2]
    assert kw["window"] is None and not kw["use_rope"] and kw["query_scale"]


@pytest.mark.parametrize("i,part", [(0, "gate_bias"), (1, "query_scale")])
def test_each_part_matters(i, part):
    f, cfg, state = _load(i)
    want = f[f"layer{i}.out"]
    layer = attention_from_hf(cfg, i, state)
    assert np.abs(layer.forward(f["x"]) - want).max() < 1e-12
    if part == "gate_bias":
        off = attention_from_hf(
            cfg, i, {**state, "gate_bias": 0 * state[part]}
        )
        assert np.abs(off.forward(f["x"]) - want).max() > 1e-3
    else:  # at positions below 9 the scale is within 5e-4 of 1
        _, args, kw, _ = layer_settings(cfg, i)
        plain = _BeamAttention(*args, **{**kw, "query_scale": False})
        plain.params.update(layer.params)
        assert np.abs(plain.forward(f["x"]) - want).max() > 1e-6


def test_weights_go_back_to_hf_names():
    _, cfg, state = _load(1)
    layer = attention_from_hf(cfg, 1, state)
    back = layer.to_hf(layer.params)
    assert set(back) == set(state)
    for k, a in state.items():
        assert np.array_equal(back[k], a), k
    again = _BeamAttention(64, 4, 2, **layer.options)
    assert again.query_scale and len(again.score_mods) == len(
        layer.score_mods
    )


def test_class_defaults():
    """Without layer_types every sixth layer and the last are full, and
    without rope_parameters those are NoPE with the query scale."""
    cfg = {
        "model_type": "beam",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 8,
    }
    scaled = [layer_settings(cfg, i)[2]["query_scale"] for i in range(8)]
    assert scaled == [False] * 5 + [True, False, True]
    cls, args, kw, _ = layer_settings(cfg, 0)
    assert args == (64, 4, 8, 128) and kw["window"] == 512
    assert kw["rope_base"] == 1e4 and kw["rotary_dim"] is None
    both = {
        **cfg,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        },
    }
    kw = layer_settings(both, 5)[2]
    assert (
        kw["use_rope"] and not kw["query_scale"] and kw["rope_base"] == 1e6
    )


@pytest.mark.parametrize(
    "rope,match",
    [
        ({"sliding_attention": {"rope_type": "default"}}, "rope_theta"),
        (
            {
                "sliding_attention": {
                    "rope_type": "linear",
                    "rope_theta": 1e4,
                    "factor": 2.0,
                },
                "full_attention": None,
            },
            "rope_type",
        ),
    ],
)
def test_refusals_name_the_key(rope, match):
    _, cfg, _ = _load(0)
    with pytest.raises(ValueError, match=match):
        layer_settings({**cfg, "rope_parameters": rope}, 0)
