"""Learned sinks through the tiled kernels (chapter 9, issue 23 item 14).

The sink layer's output is the tiled output times w = sigmoid(lse - a),
and its backward is the tiled backward with upstream w * dO' and row term
w * rowsum(dO' * O'): no new kernel. These tests hold it to the dense sink
layer (chapter 8) and to finite differences."""

import numpy as np
import pytest

from attn_np import GroupedQueryAttention, KVCache
from attn_np.grouped import (
    grouped_attention_backward,
    grouped_attention_forward,
)
from attn_np.instruments.gradcheck import (
    check_gradients,
    check_layer_gradients,
)

EXACT = 1e-12  # float64 rounding of two orders of the same sums
TOLERANCE = 1e-7
FAMILIES = {"MHA": 4, "GQA": 2, "MQA": 1}


def layer_pair(n_kv, seed=3, **kw):
    """A dense and a flash sink layer with the same weights and sink
    logits (not the initial zeros: a random logit per head)."""
    dense, flash = (
        GroupedQueryAttention(
            12, 4, n_kv, d_k=3, d_v=5, seed=seed, sinks=True, flash=f, **kw
        )
        for f in (False, True)
    )
    a = np.random.default_rng(seed).normal(0.0, 1.5, 4)
    dense.params["sinks"][...] = a
    flash.params["sinks"][...] = a
    return dense, flash


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "causal, kw", [(False, {}), (True, {}), (True, {"window": 4})]
)
def test_flash_sinks_equal_dense_sinks(family, causal, kw):
    dense, flash = layer_pair(FAMILIES[family], **kw)
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((2, 9, 12)), rng.standard_normal((2, 9, 12))
    y_d, y_f = (
        dense.forward(x, causal=causal),
        flash.forward(x, causal=causal),
    )
    assert np.abs(y_f - y_d).max() < EXACT
    np.testing.assert_allclose(
        flash.sink_weights, dense.sink_weights, rtol=0, atol=EXACT
    )
    dx_d, dx_f = dense.backward(dy), flash.backward(dy)
    assert np.abs(dx_f - dx_d).max() < EXACT
    assert set(flash.grads) == set(dense.grads) >= {"sinks"}
    for name in dense.grads:
        err = np.abs(flash.grads[name] - dense.grads[name]).max()
        assert err < EXACT, (name, err)
    assert np.abs(dense.grads["sinks"]).max() > 1e-3  # a gradient to check


@pytest.mark.parametrize(
    "G, causal, window", [(1, False, None), (3, True, None), (2, True, 3)]
)
def test_core_sinks_over_many_tiles(G, causal, window):
    """The grouped core with small tiles (several per row and column) and
    a sink logit per query row, against its dense sink softmax."""
    rng = np.random.default_rng(G + 10)
    B, n_kv, L, d = 2, 2, 11, 4
    q = rng.standard_normal((B, n_kv, G, L, d))
    k, v = (rng.standard_normal((B, n_kv, L, d)) for _ in "kv")
    a = rng.normal(0.0, 2.0, (B, n_kv, G, L, 1))
    kw = dict(causal=causal, window=window, sinks=a)
    o_d, c_d = grouped_attention_forward(q, k, v, **kw)
    o_f, c_f = grouped_attention_forward(
        q, k, v, tiled=True, block_q=3, block_k=4, **kw
    )
    assert np.abs(o_f - o_d).max() < EXACT
    do = rng.standard_normal(o_d.shape)
    g_d = grouped_attention_backward(do, c_d)
    g_f = grouped_attention_backward(do, c_f)
    assert set(g_f) == {"q", "k", "v", "sinks"}
    for name in g_d:
        assert np.abs(g_f[name] - g_d[name]).max() < EXACT, name

    def fwd(q, k, v, a):
        return grouped_attention_forward(
            q,
            k,
            v,
            causal=causal,
            window=window,
            sinks=a,
            tiled=True,
            block_q=3,
            block_k=4,
        )

    def bwd(do, c):
        g = grouped_attention_backward(do, c)
        return g["q"], g["k"], g["v"], g["sinks"]

    errors = check_gradients(
        fwd, bwd, {"q": q, "k": k, "v": v, "a": a}, seed=G
    )
    assert all(np.isfinite(e) for e in errors.values()), errors
    assert max(errors.values()) < TOLERANCE, errors


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kw", [{}, {"window": 3}])
def test_flash_sink_layer_gradients(family, kw):
    """Finite differences through the flash layer: the input, every
    weight and the sinks parameter."""
    _, flash = layer_pair(FAMILIES[family], seed=7, **kw)
    x = np.random.default_rng(8).standard_normal((2, 7, 12))
    errors = check_layer_gradients(flash, x, seed=9, causal=True)
    assert "sinks" in errors and "x" in errors
    assert all(np.isfinite(e) for e in errors.values()), errors
    assert max(errors.values()) < TOLERANCE, errors


def test_a_row_with_nothing_to_attend_puts_all_mass_on_its_sink():
    """Three queries, one key, causal (the last query at the key): the
    first two attend nothing, lse = -inf, w = 0, p_sink = 1, no NaN."""
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 1, 2, 3, 2))
    k, v = rng.standard_normal((2, 1, 1, 1, 2))
    a = np.array([0.5])
    kw = dict(causal=True, sinks=a)
    with np.errstate(all="raise"):
        o, c = grouped_attention_forward(q, k, v, tiled=True, **kw)
        g = grouped_attention_backward(np.ones_like(o), c)
    assert np.all(o[..., :2, :] == 0) and np.all(
        c.sink_weights[..., :2, :] == 1
    )
    o_d, c_d = grouped_attention_forward(q, k, v, **kw)
    assert np.abs(o - o_d).max() < EXACT
    g_d = grouped_attention_backward(np.ones_like(o), c_d)
    for name in g_d:
        assert np.isfinite(g[name]).all()
        assert np.abs(g[name] - g_d[name]).max() < EXACT, name


def test_flash_still_refuses_a_streaming_cache():
    layer = GroupedQueryAttention(8, 2, 1, window=4, sinks=True, flash=True)
    with pytest.raises(ValueError, match="sink_tokens > 0"):
        layer.forward(
            np.ones((1, 3, 8)), kv_cache=KVCache(window=4, sink_tokens=1)
        )
    with pytest.raises(ValueError, match="sink_tokens"):
        grouped_attention_forward(
            np.ones((1, 1, 1, 2, 2)),
            np.ones((1, 1, 2, 2)),
            np.ones((1, 1, 2, 2)),
            causal=True,
            window=2,
            sink_tokens=1,
            sinks=np.zeros(()),
            tiled=True,
        )
