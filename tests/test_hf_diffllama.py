"""DiffLlama: differential attention (Ye et al. 2025) as HF spells it,
the same q and k against the two halves of the value heads, head p
minus lambda times head p + H/2, an RMSNorm without a gain, times
1 - lambda_init (attn_np.hf.families_diff), gradient-checked in float64
and against transformers 5.24.0's module
(tests/fixtures/families/diffllama.npz)."""

import json
from pathlib import Path

import numpy as np
import pytest

from attn_np import check_layer_gradients
from attn_np.hf.build import attention_from_hf
from attn_np.hf.families import layer_settings
from attn_np.hf.families_diff import (
    _LAMBDAS,
    _DiffAttention,
    _lambda_init,
    _value_pairs,
    _value_pairs_backward,
)
from attn_np.instruments.gradcheck import TOLERANCE

FIXTURE = Path(__file__).parent / "fixtures" / "families" / "diffllama.npz"


def _fixture(i):
    f = np.load(FIXTURE)
    pre = f"layer{i}.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    return f, json.loads(str(f["config"])), state


def _lambda(p, lambda_init):
    e1 = np.exp(p["lambda_q1"] @ p["lambda_k1"])
    return e1 - np.exp(p["lambda_q2"] @ p["lambda_k2"]) + lambda_init


@pytest.mark.parametrize(
    "n_heads,n_kv,biases",
    [(4, 2, ()), (8, 4, ("q", "k", "v", "o")), (4, 4, ("o",))],
)
def test_differential_attention_gradients(n_heads, n_kv, biases):
    layer = _DiffAttention(
        8, n_heads, n_kv, 4, seed=1, biases=biases, lambda_init=0.3
    )
    r = np.random.default_rng(3)
    for name in _LAMBDAS:  # lambda far from lambda_init
        layer.params[name] = 0.6 * r.standard_normal(4)
    assert abs(_lambda(layer.params, 0.3) - 0.3) > 0.1
    x = r.standard_normal((2, 5, 8))
    errs = check_layer_gradients(layer, x, seed=2)
    assert set(errs) == {"x"} | set(layer.params)
    assert set(_LAMBDAS) <= set(errs)
    assert max(errs.values()) < TOLERANCE, errs


def test_value_pairs_are_what_each_call_reads():
    """Query heads of group j read value heads j mod n/2 (HF's first
    call) and n/2 + j mod n/2 (its second); the backward is the
    adjoint."""
    r = np.random.default_rng(0)
    v = r.standard_normal((1, 4, 3, 2))  # 4 KV heads of 2 features
    w = _value_pairs(v)
    for j in range(4):
        assert np.array_equal(w[:, j, :, :2], v[:, j % 2])
        assert np.array_equal(w[:, j, :, 2:], v[:, 2 + j % 2])
    dw = r.standard_normal(w.shape)
    lhs = np.sum(dw * w)
    assert np.isclose(lhs, np.sum(_value_pairs_backward(dw) * v))


def _softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_the_layer_is_the_papers_equation():
    """Pair p: (softmax(q_p K_j) - lambda softmax(q_{p+H/2} K_{j+n/2}))
    [V_j, V_{j+n/2}], normalised, times 1 - lambda_init, then W_o."""
    H, n, d, li, eps = 8, 4, 4, 0.3, 1e-5
    layer = _DiffAttention(
        16, H, n, d, seed=1, lambda_init=li, use_rope=False, norm_eps=eps
    )
    P, r = layer.params, np.random.default_rng(5)
    for name in _LAMBDAS:
        P[name] = 0.6 * r.standard_normal(d)
    x = r.standard_normal((6, 16))
    q = (x @ P["W_q"]).reshape(6, H, d)
    k = (x @ P["W_k"]).reshape(6, n, d)
    v = (x @ P["W_v"]).reshape(6, n, d)
    causal = np.tril(np.ones((6, 6), bool))
    lam, G, out = _lambda(P, li), H // n, []
    for p in range(H // 2):
        j = p // G
        maps = [
            _softmax(np.where(causal, q[:, a] @ k[:, b].T / 2.0, -np.inf))
            for a, b in ((p, j), (p + H // 2, j + n // 2))
        ]
        pair = np.concatenate([v[:, j], v[:, j + n // 2]], axis=-1)
        c = (maps[0] - lam * maps[1]) @ pair  # [6, 2d]
        c = c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps)
        out.append((1 - li) * c)
    want = np.concatenate(out, axis=-1) @ P["W_o"]
    assert np.abs(layer.forward(x) - want).max() < 1e-12


@pytest.mark.parametrize("i", [0, 1])
def test_lambda_init_by_layer_and_its_factor_matter(i):
    f, cfg, state = _fixture(i)
    layer = attention_from_hf(cfg, i, state)
    assert type(layer) is _DiffAttention
    li = _lambda_init(i)
    assert layer.lambda_init == li
    # the fixture's lambda is far from lambda_init
    assert abs(_lambda(layer.params, li) - li) > 0.5
    want = f[f"layer{i}.out"]
    assert np.abs(layer.forward(f["x"]) - want).max() < 1e-12
    cls, args, kw, _ = layer_settings(cfg, i)
    for wrong in (0.8, _lambda_init(1 - i)):  # no layer dependence
        other = cls(*args, **{**kw, "lambda_init": wrong})
        other.params.update(layer.params)
        assert np.abs(other.forward(f["x"]) - want).max() > 1e-3
    # without the factor 1 - lambda_init: W_o without it
    layer.params["W_o"] = layer.params["W_o"] / (1 - li)
    assert np.abs(layer.forward(f["x"]) - want).max() > 1e-3


def test_lambdas_round_trip():
    _, cfg, state = _fixture(0)
    layer = attention_from_hf(cfg, 0, state)
    back = layer.to_hf(layer.params)
    assert set(back) == set(state) and set(_LAMBDAS) <= set(back)
    assert all(np.array_equal(back[k], a) for k, a in state.items())


@pytest.mark.parametrize(
    "change,match",
    [
        ({"num_key_value_heads": 3, "num_attention_heads": 3}, "even"),
        ({"attention_dropout": 0.1}, "attention_dropout"),
        (
            {
                "rope_parameters": {
                    "rope_theta": 1e4,
                    "rope_type": "default",
                    "partial_rotary_factor": 0.5,
                }
            },
            "partial_rotary_factor",
        ),
    ],
)
def test_what_hf_refuses_is_refused(change, match):
    _, cfg, _ = _fixture(0)
    with pytest.raises(ValueError, match=match):
        layer_settings({**cfg, **change}, 0)


def test_an_odd_layer_is_refused_and_a_file_without_eps_gets_1e_5():
    with pytest.raises(ValueError, match="even"):
        _DiffAttention(8, 3, 3, 4)
    _, cfg, _ = _fixture(0)
    cfg = {k: v for k, v in cfg.items() if k != "rms_norm_eps"}
    assert layer_settings(cfg, 0)[2]["norm_eps"] == 1e-5
