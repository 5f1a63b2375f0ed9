"""OLMo's clip_qkv: the projection part clamps q, k and v to [-c, c]
(after OLMoE's QK-norm, before RoPE); its gradient is 0 where clamped.
Gradient-checked in float64 away from the clamp's edges, and against
transformers 5.24.0's OLMo and OLMoE (tests/fixtures/families)."""

import json
from pathlib import Path

import numpy as np
import pytest

from attn_np import check_layer_gradients
from attn_np.hf.build import attention_from_hf
from attn_np.instruments.gradcheck import TOLERANCE
from attn_np.refinements import RefinedAttention

FAMILIES = Path(__file__).parent / "fixtures" / "families"


def _layer(qk_norm, clip):
    layer = RefinedAttention(
        8, 2, 1, 4, seed=3, qk_norm=qk_norm, clip_qkv=clip, rope_base=1e4
    )
    r = np.random.default_rng(7)
    for n in ("q_norm", "k_norm"):
        if n in layer.params:
            layer.params[n] = 1 + 0.3 * r.standard_normal(
                layer.params[n].shape
            )
    return layer, r.standard_normal((2, 5, 8))


@pytest.mark.parametrize("qk_norm", [None, "proj"])
def test_clip_gradients(qk_norm):
    """Some entries clamped, some kept; every one at least 1e-4 from the
    edges (test_clip_is_away_from_the_edges), so steps of 1e-5 never
    cross them and central differences see the true slope, 1 or 0."""
    layer, x = _layer(qk_norm, 0.6)
    layer.forward(x)
    kept = [layer._projected[f"{n}_kept"] for n in "qkv"]
    assert 0.1 < 1 - np.mean([k.mean() for k in kept]) < 0.9
    errs = check_layer_gradients(layer, x, seed=2)
    assert set(errs) == {"x"} | set(layer.params)
    assert max(errs.values()) < TOLERANCE, errs


def test_clip_is_away_from_the_edges():
    """The gradient check's input: no projected entry within 1e-4 of
    +-0.6, with and without the norm."""
    for qk_norm in (None, "proj"):
        layer, x = _layer(qk_norm, None)
        t = []
        P = layer.params
        for n in "qkv":
            y = x @ P[f"W_{n}"]
            if qk_norm and n != "v":
                ms = np.mean(y * y, axis=-1, keepdims=True)
                y = y / np.sqrt(ms + layer.norm_eps) * P[f"{n}_norm"]
            t.append(np.abs(np.abs(y) - 0.6).min())
        assert min(t) > 1e-4, t


@pytest.mark.parametrize("name", ["olmo", "olmoe"])
def test_the_clamp_matters(name):
    f = np.load(FAMILIES / f"{name}.npz")
    cfg = json.loads(str(f["config"]))
    assert cfg["clip_qkv"] == 1.0
    pre = "layer0.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    layer = attention_from_hf(cfg, 0, state)
    assert layer.clip_qkv == 1.0
    assert np.abs(layer.forward(f["x"]) - f["layer0.out"]).max() < 1e-12
    off = attention_from_hf({**cfg, "clip_qkv": None}, 0, state)
    assert np.abs(off.forward(f["x"]) - f["layer0.out"]).max() > 1e-2


@pytest.mark.parametrize("bad", [0, -1.0, "1", True, float("inf")])
def test_bad_clip_is_refused(bad):
    with pytest.raises(ValueError, match="clip_qkv"):
        RefinedAttention(8, 2, clip_qkv=bad)


def test_clip_survives_a_rebuild():
    layer = RefinedAttention(8, 2, clip_qkv=0.5)
    assert layer.options["clip_qkv"] == 0.5
    again = RefinedAttention(8, 2, **layer.options)
    assert again.projection.clip == 0.5
