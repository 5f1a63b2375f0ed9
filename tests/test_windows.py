"""Chapter 8: sliding windows and learned sink logits in window_attention_forward (attn_np.windows) and the layers.

The window's semantics (query at absolute position i attends key j iff i - W < j <= i) against
their definition and the two published conventions; sink logits against the gpt-oss reference
(softmax over [scores, sink], sink column dropped); gradient checks for every input and parameter."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_np import (
    TOLERANCE,
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiQueryAttention,
    causal_mask,
    check_gradients,
    check_layer_gradients,
)
from attn_np.windows import (
    window_attention_backward,
    window_attention_forward,
)


def window_by_definition(L_q, L_k, W):
    """Query row r sits at i = r + L_k - L_q and may attend j iff i - W < j <= i."""
    m = np.zeros((L_q, L_k), bool)
    for r in range(L_q):
        i = r + L_k - L_q
        for j in range(L_k):
            m[r, j] = i - W < j <= i
    return m


def sink_reference(q, k, v, sinks, allowed, scale):
    """gpt-oss's sdpa: softmax over the scores with the sink logit appended, last column dropped."""
    s = (q @ k.swapaxes(-1, -2)) * scale
    s = np.where(allowed, s, -np.inf)
    a = np.broadcast_to(sinks, s.shape[:-1] + (1,))
    z = np.concatenate([s, a], axis=-1)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    w = (z / z.sum(axis=-1, keepdims=True))[..., :-1]
    return w @ v, w


def test_window_longer_than_the_keys_is_causal():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, n, 3)) for n in (4, 7, 7))
    a, _ = window_attention_forward(q, k, v, causal=True, window=7)
    b, _ = window_attention_forward(q, k, v, causal=True)
    np.testing.assert_array_equal(a, b)


def test_a_single_query_is_windowed_too():
    """One query over a long cache (a decode step) must still forget keys outside the window."""
    rng = np.random.default_rng(1)
    q, k, v = (
        rng.standard_normal((1, 3)),
        rng.standard_normal((9, 3)),
        rng.standard_normal((9, 2)),
    )
    out, cache = window_attention_forward(q, k, v, causal=True, window=4)
    np.testing.assert_array_equal(cache.weights[0, :5], 0.0)
    ref, _ = window_attention_forward(q, k[5:], v[5:])
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-15)


@st.composite
def window_cases(draw):
    L_q = draw(st.integers(1, 6))
    L_k = draw(st.integers(1, 7))
    W = draw(st.integers(1, 8))
    heads = draw(st.sampled_from([(), (2,), (2, 3)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal(heads + (L_q, 3))
    k = rng.standard_normal(heads[:1] + (1,) * (len(heads) > 1) + (L_k, 3))
    v = rng.standard_normal(k.shape[:-1] + (2,))
    return q, k, v, W


@given(window_cases())
def test_window_equals_the_explicit_mask(case):
    q, k, v, W = case
    mask = window_by_definition(q.shape[-2], k.shape[-2], W)
    a, ca = window_attention_forward(q, k, v, causal=True, window=W)
    b, cb = window_attention_forward(q, k, v, mask=mask)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)
    np.testing.assert_allclose(ca.weights, cb.weights, rtol=0, atol=1e-15)


@settings(max_examples=30)
@given(window_cases())
def test_window_gradient_check(case):
    q, k, v, W = case
    errors = check_gradients(
        window_attention_forward,
        window_attention_backward,
        {"q": q, "k": k, "v": v},
        seed=2,
        causal=True,
        window=W,
    )
    assert max(errors.values()) < TOLERANCE, errors


@pytest.mark.parametrize("window", [0, -1, 2.5, True, "4"])
def test_bad_window_is_named(window):
    q = np.ones((3, 2))
    with pytest.raises(
        ValueError, match="window must be a positive integer"
    ):
        window_attention_forward(q, q, q, causal=True, window=window)


def test_window_without_causal_is_an_error():
    q = np.ones((3, 2))
    with pytest.raises(ValueError, match=r"window=2 needs causal=True"):
        window_attention_forward(q, q, q, window=2)


# --------------------------------------------------------------------------- sink logits
@st.composite
def sink_cases(draw):
    q, k, v, W = draw(window_cases())
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    L_q = q.shape[-2]
    kind = draw(st.sampled_from(["scalar", "per-row", "per-head", "full"]))
    shape = {
        "scalar": (),
        "per-row": (L_q, 1),
        "per-head": batch[:1] + (1,) * (len(batch) - 1) + (1, 1),
        "full": batch + (L_q, 1),
    }[kind]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sinks = 2.0 * rng.standard_normal(shape)
    windowed = draw(st.booleans())
    return q, k, v, sinks, (W if windowed else None)


@given(sink_cases())
def test_sinks_equal_the_gpt_oss_reference(case):
    q, k, v, sinks, W = case
    L_q, L_k = q.shape[-2], k.shape[-2]
    allowed = causal_mask(L_q, L_k, window=W)
    out, cache = window_attention_forward(
        q, k, v, causal=True, window=W, sinks=sinks
    )
    ref, w = sink_reference(q, k, v, sinks, allowed, 1 / math.sqrt(3))
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-13)
    np.testing.assert_allclose(cache.weights, w, rtol=0, atol=1e-14)
    # rows sum to 1 - p_sink
    np.testing.assert_allclose(
        cache.weights.sum(-1, keepdims=True) + cache.sink_weights,
        1.0,
        rtol=0,
        atol=1e-14,
    )


@given(sink_cases())
def test_sink_gradient_check(case):
    q, k, v, sinks, W = case
    errors = check_gradients(
        window_attention_forward,
        window_attention_backward,
        {"q": q, "k": k, "v": v, "sinks": sinks},
        seed=3,
        causal=True,
        window=W,
    )
    assert max(errors.values()) < TOLERANCE, errors


def test_sink_gradient_is_minus_p_sink_times_rowsum():
    """The derivation's closed form: da_i = -p_sink_i * sum_c dO_ic O_ic."""
    rng = np.random.default_rng(4)
    q, k, v = (
        rng.standard_normal((5, 4)),
        rng.standard_normal((6, 4)),
        rng.standard_normal((6, 3)),
    )
    a = rng.standard_normal((5, 1))
    out, cache = window_attention_forward(q, k, v, causal=True, sinks=a)
    dout = rng.standard_normal(out.shape)
    *_, da = window_attention_backward(dout, cache)
    np.testing.assert_allclose(
        da,
        -cache.sink_weights * np.sum(dout * out, axis=-1, keepdims=True),
        rtol=1e-14,
    )


def test_a_very_negative_sink_is_no_sink():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 4, 3)) for _ in range(3))
    a, _ = window_attention_forward(q, k, v, causal=True, sinks=-800.0)
    b, _ = window_attention_forward(q, k, v, causal=True)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-15)


def test_a_row_with_no_key_gives_everything_to_the_sink():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((3, 2)) for _ in range(3))
    mask = np.ones((3, 3), bool)
    mask[1] = False
    out, cache = window_attention_forward(
        q, k, v, mask=mask, sinks=np.ones((3, 1))
    )
    np.testing.assert_array_equal(out[1], 0.0)
    assert cache.sink_weights[1, 0] == 1.0
    dq, dk, dv, da = window_attention_backward(np.ones_like(out), cache)
    assert np.all(np.isfinite(da)) and da[1, 0] == 0.0 and np.all(dq[1] == 0)


def test_huge_logits_do_not_overflow_with_a_sink():
    q = np.array([[800.0, 0.0]])
    k = np.array([[1.0, 0.0], [0.5, 0.0]])
    v = np.array([[1.0], [2.0]])
    for a in (-900.0, 0.0, 900.0):
        out, cache = window_attention_forward(
            q, k, v, scale=1.0, sinks=np.array(a)
        )
        assert np.all(np.isfinite(out)) and np.all(
            np.isfinite(cache.sink_weights)
        )


@pytest.mark.parametrize(
    "sinks, match",
    [
        (
            np.zeros((3,)),
            r"sinks must broadcast to \[..., L_q, 1\] = \(2, 3, 1\)",
        ),
        (np.zeros((2, 3, 4)), r"got sinks of shape \(2, 3, 4\)"),
        (np.array([[[np.nan]]]), "sinks must be finite"),
    ],
)
def test_bad_sinks_are_named(sinks, match):
    q = np.ones((2, 3, 4))
    with pytest.raises(ValueError, match=match):
        window_attention_forward(q, q, q, sinks=sinks)


def test_integer_sinks_are_a_type_error():
    q = np.ones((3, 4))
    with pytest.raises(
        TypeError, match="sinks must be a floating-point array"
    ):
        window_attention_forward(q, q, q, sinks=np.zeros((3, 1), int))


# --------------------------------------------------------------------------- layers
FAMILIES = {
    "MHA": lambda **kw: MultiHeadAttention(12, 4, d_k=3, d_v=2, **kw),
    "GQA": lambda **kw: GroupedQueryAttention(12, 4, 2, d_k=3, d_v=2, **kw),
    "MQA": lambda **kw: MultiQueryAttention(12, 4, d_k=3, d_v=2, **kw),
}


def naive_layer(layer, x, allowed):
    """Head by head: query head i reads key/value head i // G; its sink logit joins its softmax."""
    P = layer.params
    h, G, d_k, d_v = layer.n_heads, layer.group_size, layer.d_k, layer.d_v
    heads = []
    for i in range(h):
        kv = i // G
        q = x @ P["W_q"][:, i * d_k : (i + 1) * d_k]
        k = x @ P["W_k"][:, kv * d_k : (kv + 1) * d_k]
        v = x @ P["W_v"][:, kv * d_v : (kv + 1) * d_v]
        a = P["sinks"][i] if "sinks" in P else -np.inf
        o, _ = sink_reference(
            q, k, v, np.array(a), allowed, 1 / math.sqrt(d_k)
        )
        heads.append(o)
    return np.concatenate(heads, axis=-1) @ P["W_o"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "window, sinks", [(3, False), (None, True), (3, True)]
)
def test_layer_matches_head_by_head_reference(family, window, sinks):
    rng = np.random.default_rng(7)
    layer = FAMILIES[family](window=window, sinks=sinks, seed=3)
    if sinks:
        assert np.array_equal(
            layer.params["sinks"], np.zeros(4)
        )  # starts at zero
        layer.params["sinks"][:] = rng.standard_normal(4)  # distinct heads
    x = rng.standard_normal((2, 7, 12))
    y = layer.forward(x, causal=True)
    ref = naive_layer(layer, x, causal_mask(7, 7, window=window))
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-13)
    if sinks:
        assert layer.sink_weights.shape == (2, 4, 7)
        np.testing.assert_allclose(
            layer.attention_weights.sum(-1) + layer.sink_weights,
            1.0,
            atol=1e-14,
        )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "window, sinks", [(2, False), (None, True), (3, True)]
)
def test_layer_gradient_check(family, window, sinks):
    rng = np.random.default_rng(8)
    layer = FAMILIES[family](window=window, sinks=sinks, seed=4)
    if sinks:
        layer.params["sinks"][:] = rng.standard_normal(4)
        assert set(layer.grads) == set(layer.params)
    x = rng.standard_normal((2, 6, 12))
    errors = check_layer_gradients(layer, x, seed=5, causal=True)
    assert set(errors) == {"x"} | set(layer.params)
    assert max(errors.values()) < TOLERANCE, errors


def test_layer_sink_gradient_with_a_mask_and_unbatched_input():
    rng = np.random.default_rng(9)
    layer = GroupedQueryAttention(
        12, 6, 3, d_k=2, d_v=3, sinks=True, window=4, seed=0
    )
    layer.params["sinks"][:] = rng.standard_normal(6)
    mask = rng.random((6, 5, 5)) < 0.7  # per head
    errors = check_layer_gradients(
        layer, rng.standard_normal((5, 12)), causal=True, mask=mask
    )
    assert max(errors.values()) < TOLERANCE, errors


def test_sink_layout_follows_the_stacked_query_heads():
    """Raising one head's sink logit changes that head's output columns only."""
    rng = np.random.default_rng(10)
    layer = GroupedQueryAttention(12, 4, 2, d_k=3, d_v=2, sinks=True, seed=1)
    layer.params["W_o"] = np.eye(
        8, 12
    )  # head i's output in columns 2i, 2i+1
    x = rng.standard_normal((1, 5, 12))
    y0 = layer.forward(x, causal=True)
    layer.params["sinks"][2] = 3.0
    changed = np.any(
        np.abs(layer.forward(x, causal=True) - y0) > 1e-12, axis=(0, 1)
    )
    np.testing.assert_array_equal(np.flatnonzero(changed), [4, 5])


def test_window_layer_must_be_causal():
    layer = GroupedQueryAttention(12, 4, 2, window=3)
    with pytest.raises(
        ValueError, match=r"window layer \(window=3\) is causal"
    ):
        layer.forward(np.zeros((2, 5, 12)))


def test_layer_window_is_checked():
    with pytest.raises(
        ValueError, match="window must be a positive integer"
    ):
        MultiQueryAttention(12, 4, window=0)


def test_repr_names_window_and_sinks():
    r = repr(MultiHeadAttention(12, 4, window=8, sinks=True))
    assert "window=8" in r and "sinks=True" in r
