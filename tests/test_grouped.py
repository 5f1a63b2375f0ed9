"""The grouped attention core (attn_np.grouped): how G query heads meet their key/value head,
the mask, sinks, the causal rule, score mods and the tiled kernels, against chapter 1's formula."""

import numpy as np
import pytest
from helpers import SoftCap

from attn_np import (
    TOLERANCE,
    attention_forward,
    check_gradients,
    grouped_attention_backward,
    grouped_attention_forward,
)
from attn_np.grouped import group_mask, per_head_rows
from attn_np.windows import window_attention_forward


def grouped_inputs(B=2, n_kv=2, G=3, L_q=4, L_k=6, d_k=5, d_v=3, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, n_kv, G, L_q, d_k))
    k = rng.standard_normal((B, n_kv, L_k, d_k))
    v = rng.standard_normal((B, n_kv, L_k, d_v))
    return q, k, v


def test_check_finite_false_skips_the_check():
    """The layers pass check_finite=False (they checked x): the inputs are
    not scanned, but a NaN still cannot flow silently: the scores' check
    (one pass over S, which overflow needs anyway) refuses it."""
    q, k, v = grouped_inputs()
    q[:] = np.nan
    with pytest.raises(ValueError, match="scores q k\\^T \\* scale"):
        grouped_attention_forward(q, k, v, check_finite=False)
    with pytest.raises(ValueError, match="q must be finite"):
        grouped_attention_forward(q, k, v)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("G, L_q", [(1, 4), (3, 1), (3, 4), (4, 2)])
def test_core_is_chapter_one_per_query_head(causal, G, L_q):
    """Stacked or per-head products, the same numbers as attention_forward with k, v broadcast."""
    q, k, v = grouped_inputs(G=G, L_q=L_q)
    o, cache = grouped_attention_forward(q, k, v, causal=causal)
    ref, rc = attention_forward(
        q, k[:, :, None], v[:, :, None], causal=causal
    )
    np.testing.assert_allclose(o, ref, rtol=0, atol=1e-14)
    np.testing.assert_allclose(cache.weights, rc.weights, rtol=0, atol=1e-15)


def test_per_head_rule():
    assert not per_head_rows(1, 1)  # MHA: never
    assert per_head_rows(4, 1) and not per_head_rows(4, 2)
    assert per_head_rows(4, 2, min_stacked_rows=9)


@pytest.mark.parametrize("G, L_q", [(3, 1), (2, 5)])
def test_gradient_check_with_mask_sinks_and_window(G, L_q):
    q, k, v = grouped_inputs(G=G, L_q=L_q, seed=1)
    rng = np.random.default_rng(2)
    allowed = rng.random((2, 2, G, L_q, 6)) < 0.8
    sinks = rng.standard_normal((2, G, 1, 1))
    errors = check_gradients(
        lambda q, k, v, sinks: grouped_attention_forward(
            q, k, v, allowed=allowed, sinks=sinks, causal=True, window=3
        ),
        lambda do, c: tuple(
            grouped_attention_backward(do, c)[n]
            for n in ("q", "k", "v", "sinks")
        ),
        {"q": q, "k": k, "v": v, "sinks": sinks},
        seed=3,
    )
    assert all(np.isfinite(e) for e in errors.values()), errors
    assert max(errors.values()) < TOLERANCE, errors


def test_sinks_and_window_equal_chapter_eight():
    q, k, v = grouped_inputs(G=2, L_q=3, seed=4)
    sinks = np.array([0.3, -1.0]).reshape(2, 1, 1, 1)  # per key/value head
    o, c = grouped_attention_forward(
        q, k, v, causal=True, window=2, sinks=sinks
    )
    ref, rc = window_attention_forward(
        q, k[:, :, None], v[:, :, None], causal=True, window=2, sinks=sinks
    )
    np.testing.assert_allclose(o, ref, rtol=0, atol=1e-14)
    np.testing.assert_allclose(c.sink_weights, rc.sink_weights, atol=1e-15)


class HeadBias:
    """A learned bias per query head (a mod with a parameter): s + b[kv, g]."""

    def __init__(self, b):
        self.b = b

    def forward(self, s, ctx):
        assert ctx.n_kv_heads * ctx.group_size == self.b.size
        assert len(ctx.q_positions) == s.shape[-2]
        return s + self.b.reshape(ctx.n_kv_heads, ctx.group_size, 1, 1), None

    def backward(self, ds, saved):
        return ds, {
            "head_bias": ds.sum(axis=(0, 3, 4)).reshape(self.b.shape)
        }


def test_score_mods_forward_and_gradients():
    q, k, v = grouped_inputs(G=2, seed=5)
    b = np.random.default_rng(6).standard_normal(4)
    o, c = grouped_attention_forward(
        q, k, v, causal=True, score_mods=(HeadBias(b), SoftCap(1.5))
    )
    s = (q @ k[:, :, None].swapaxes(-1, -2)) / np.sqrt(5) + b.reshape(
        2, 2, 1, 1
    )
    ref, _ = attention_forward(q, k[:, :, None], v[:, :, None], causal=True)
    assert not np.allclose(o, ref)  # the mods changed something
    s = 1.5 * np.tanh(s / 1.5)
    s = np.where(np.tril(np.ones((4, 6), bool), 2), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(o, p @ v[:, :, None], rtol=0, atol=1e-13)

    def fwd(q, k, v, b):
        return grouped_attention_forward(
            q, k, v, causal=True, score_mods=(HeadBias(b), SoftCap(1.5))
        )

    def bwd(do, c):
        g = grouped_attention_backward(do, c)
        return g["q"], g["k"], g["v"], g["head_bias"]

    errors = check_gradients(
        fwd, bwd, {"q": q, "k": k, "v": v, "b": b}, seed=7
    )
    assert max(errors.values()) < TOLERANCE, errors


def test_tiled_equals_dense_and_refuses_what_tiles_cannot_do():
    q, k, v = grouped_inputs(G=2, L_q=6, L_k=6, seed=8)
    a, ca = grouped_attention_forward(q, k, v, causal=True, window=3)
    b, cb = grouped_attention_forward(
        q, k, v, causal=True, window=3, tiled=True, block_q=2, block_k=4
    )
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)
    do = np.random.default_rng(9).standard_normal(a.shape)
    ga, gb = (
        grouped_attention_backward(do, ca),
        grouped_attention_backward(do, cb),
    )
    for name in "qkv":
        np.testing.assert_allclose(ga[name], gb[name], rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="sinks must broadcast"):
        grouped_attention_forward(q, k, v, sinks=np.zeros(7), tiled=True)
    heads = np.ones((q.shape[1], 1, q.shape[3], k.shape[2]), bool)
    heads[0, 0, 0, 0] = False  # one key/value head's mask differs
    with pytest.raises(ValueError, match="same for every batch row"):
        grouped_attention_forward(q, k, v, allowed=heads, tiled=True)


def test_group_mask_lays_a_layer_mask_out_without_copies():
    rng = np.random.default_rng(10)
    m = rng.random((2, 6, 3, 5)) < 0.5  # [B, n_heads, L_q, L_k]
    g = group_mask(m, 2, 6, 3, 3, 5)
    assert g.shape == (2, 3, 2, 3, 5) and np.shares_memory(g, m)
    np.testing.assert_array_equal(g[1, 2, 1], m[1, 5])  # head kv*G + g
    assert group_mask(m[0, 0], 2, 6, 3, 3, 5).shape == (3, 5)
    assert group_mask(m[:, :1], 2, 6, 3, 3, 5).shape == (2, 1, 1, 3, 5)


@pytest.mark.parametrize(
    "kw, match",
    [
        (
            {"q": np.ones((1, 2, 3, 4))},
            r"q, k and v must be \[B, n_kv, G, L_q, d_k\]",
        ),
        ({"allowed": np.ones((7,), bool)}, "mask must broadcast"),
        ({"window": 2}, r"window=2 needs causal=True"),
        ({"tiled": "no"}, "tiled must be True or False"),
        (
            {"q_positions": np.arange(3.0)},
            "q_positions must be 2 integer positions",
        ),
    ],
)
def test_bad_core_arguments_are_named(kw, match):
    q, k, v = grouped_inputs(L_q=2)
    args = {"q": q, "k": k, "v": v}
    args.update({n: kw.pop(n) for n in list(kw) if n in args})
    with pytest.raises((ValueError, TypeError), match=match):
        grouped_attention_forward(args["q"], args["k"], args["v"], **kw)
