"""Grouped-query and multi-query attention: equivalences with multi-head attention, a naive
reference that copies K/V per query head, gradient checks (conversion: test_convert.py)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_np import (
    TOLERANCE,
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiQueryAttention,
    check_layer_gradients,
)

EXACT = 1e-12


def _copy_params(dst, src):
    for name, p in src.params.items():
        assert dst.params[name].shape == p.shape
        dst.params[name] = p.copy()
    return dst


def naive_gqa(layer, x, *, causal=False, mask=None):
    """Reference GQA: copy each key/value head to its G query heads (np.repeat), then plain MHA math.

    Written from the definition, independent of attn_np.attention: it is what the layer must equal.
    """
    x3 = x[None] if x.ndim == 2 else x
    B, L, _ = x3.shape
    h, n_kv, G, d_k, d_v = (
        layer.n_heads,
        layer.n_kv_heads,
        layer.group_size,
        layer.d_k,
        layer.d_v,
    )
    W = layer.params
    q = (
        (x3 @ W["W_q"]).reshape(B, L, h, d_k).transpose(0, 2, 1, 3)
    )  # [B, h, L, d_k]
    k = (
        (x3 @ W["W_k"]).reshape(B, L, n_kv, d_k).transpose(0, 2, 1, 3)
    )  # [B, n_kv, L, d_k]
    v = (
        (x3 @ W["W_v"]).reshape(B, L, n_kv, d_v).transpose(0, 2, 1, 3)
    )  # [B, n_kv, L, d_v]
    k = np.repeat(k, G, axis=1)  # [B, h, L, d_k]: head i gets kv head i // G
    v = np.repeat(v, G, axis=1)  # [B, h, L, d_v]
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d_k)  # [B, h, L, L]
    allowed = np.ones((B, h, L, L), dtype=bool)
    if causal:
        allowed &= np.tril(np.ones((L, L), dtype=bool))
    if mask is not None:
        allowed &= np.broadcast_to(mask, allowed.shape)
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(allowed, np.exp(s - m), 0.0)
    z = e.sum(axis=-1, keepdims=True)
    p = np.divide(
        e, z, out=np.zeros_like(e), where=z > 0
    )  # empty rows -> zeros
    o = (
        (p @ v).transpose(0, 2, 1, 3).reshape(B, L, h * d_v)
    )  # concat heads: [B, L, h*d_v]
    y = o @ W["W_o"]
    return (y[0] if x.ndim == 2 else y), p


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# ------------------------------------------------------------------------ equivalences
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_with_h_kv_heads_is_mha(causal):
    mha = MultiHeadAttention(16, 4, seed=3)
    gqa = _copy_params(GroupedQueryAttention(16, 4, 4, seed=99), mha)
    x = _x((2, 6, 16))
    y1, y2 = mha.forward(x, causal=causal), gqa.forward(x, causal=causal)
    assert np.max(np.abs(y1 - y2)) < EXACT
    dy = _x(y1.shape, 1)
    dx1, dx2 = mha.backward(dy), gqa.backward(dy)
    assert np.max(np.abs(dx1 - dx2)) < EXACT
    for name in mha.grads:
        assert np.max(np.abs(mha.grads[name] - gqa.grads[name])) < EXACT


def test_mqa_is_gqa_with_one_kv_head():
    mqa = MultiQueryAttention(12, 6, seed=5)
    gqa = _copy_params(GroupedQueryAttention(12, 6, 1, seed=0), mqa)
    assert mqa.n_kv_heads == 1 and mqa.params["W_k"].shape == (12, 2)
    x = _x((3, 5, 12))
    assert (
        np.max(
            np.abs(mqa.forward(x, causal=True) - gqa.forward(x, causal=True))
        )
        < EXACT
    )
    dy = _x((3, 5, 12), 2)
    assert np.max(np.abs(mqa.backward(dy) - gqa.backward(dy))) < EXACT
    for name in mqa.grads:
        assert np.max(np.abs(mqa.grads[name] - gqa.grads[name])) < EXACT


def test_gqa_is_mha_with_repeated_kv_heads():
    """GQA(n_kv) equals an MHA whose key/value heads are copies: head i gets kv head i // G."""
    gqa = GroupedQueryAttention(16, 8, 2, d_k=3, d_v=5, seed=4)
    mha = MultiHeadAttention(16, 8, d_k=3, d_v=5, seed=0)
    mha.params["W_q"], mha.params["W_o"] = (
        gqa.params["W_q"].copy(),
        gqa.params["W_o"].copy(),
    )
    for name, d in (("W_k", 3), ("W_v", 5)):
        w = gqa.params[name].reshape(16, 2, d)
        mha.params[name] = np.repeat(w, 4, axis=1).reshape(16, 8 * d)
    x = _x((2, 7, 16))
    assert (
        np.max(
            np.abs(gqa.forward(x, causal=True) - mha.forward(x, causal=True))
        )
        < EXACT
    )
    assert (
        np.max(np.abs(gqa.attention_weights - mha.attention_weights)) < EXACT
    )


@pytest.mark.parametrize("n_kv", [1, 2, 3, 6])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_matches_naive_repeat_reference(n_kv, causal):
    layer = GroupedQueryAttention(12, 6, n_kv, seed=n_kv)
    x = _x((2, 5, 12), 7)
    mask = _x((2, 6, 5, 5), 8) > -0.8  # per-batch, per-head mask
    mask[1, 2, 3] = False  # a query row with nothing to attend
    y = layer.forward(x, causal=causal, mask=mask)
    y_ref, p_ref = naive_gqa(layer, x, causal=causal, mask=mask)
    assert np.max(np.abs(y - y_ref)) < EXACT
    assert np.max(np.abs(layer.attention_weights - p_ref)) < EXACT
    assert np.all(layer.attention_weights[1, 2, 3] == 0)


def test_naive_reference_unbatched_with_2d_mask():
    layer = GroupedQueryAttention(8, 4, 2, seed=1)
    x = _x((6, 8), 3)
    mask = _x((6, 6), 4) > 0
    y_ref, _ = naive_gqa(layer, x, mask=mask)
    assert np.max(np.abs(layer.forward(x, mask=mask) - y_ref)) < EXACT


@given(
    n_kv_and_G=st.sampled_from(
        [(1, 1), (1, 3), (2, 2), (3, 1), (1, 4), (2, 3)]
    ),
    B=st.integers(1, 2),
    L=st.integers(1, 5),
    d_k=st.integers(1, 3),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gqa_matches_naive_reference_property(
    n_kv_and_G, B, L, d_k, causal, seed
):
    n_kv, G = n_kv_and_G
    layer = GroupedQueryAttention(
        5, n_kv * G, n_kv, d_k=d_k, d_v=d_k + 1, seed=seed
    )
    x = _x((B, L, 5), seed)
    y_ref, p_ref = naive_gqa(layer, x, causal=causal)
    assert np.max(np.abs(layer.forward(x, causal=causal) - y_ref)) < EXACT
    assert np.max(np.abs(layer.attention_weights - p_ref)) < EXACT


def test_group_reads_one_kv_head():
    """Changing key/value head 1 changes the maps of query heads 4..7 only (G = 4)."""
    layer = GroupedQueryAttention(16, 8, 2, seed=2)
    x = _x((1, 6, 16), 5)
    layer.forward(x)
    before = layer.attention_weights.copy()
    layer.params["W_k"][:, 2:4] += 0.5  # d_k = 2: columns of kv head 1
    layer.forward(x)
    change = np.abs(layer.attention_weights - before).max(
        axis=(0, 2, 3)
    )  # per query head
    assert np.all(change[:4] == 0) and np.all(change[4:] > 1e-3)


# --------------------------------------------------------------------- gradient checks
@pytest.mark.parametrize("n_kv", [1, 2, 4])  # MQA, a proper divisor, MHA
def test_gradients_batched_causal_masked(n_kv):
    layer = GroupedQueryAttention(6, 4, n_kv, d_k=2, d_v=3, seed=n_kv)
    x = _x((2, 4, 6), 10 + n_kv)
    mask = np.ones((2, 1, 4, 4), dtype=bool)
    mask[1, :, :, 0] = False  # batch 1: key 0 is padding
    errors = check_layer_gradients(
        layer, x, seed=n_kv, causal=True, mask=mask
    )
    assert set(errors) == {"x", "W_q", "W_k", "W_v", "W_o"}
    assert max(errors.values()) < TOLERANCE, errors


@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_gradients_unbatched_per_head_mask_with_empty_row(n_kv):
    layer = GroupedQueryAttention(6, 4, n_kv, seed=20 + n_kv, d_k=2, d_v=2)
    x = _x((5, 6), 30 + n_kv)
    mask = _x((4, 5, 5), 40 + n_kv) > -0.5
    mask[2, 1] = (
        False  # head 2, query 1 attends nothing: zero output, zero gradient, no NaN
    )
    errors = check_layer_gradients(layer, x, seed=1, mask=mask)
    assert max(errors.values()) < TOLERANCE, errors


def test_kv_gradient_is_the_sum_over_the_group():
    """dW_k of GQA = dW_k of the repeated-head MHA summed over each group's copies."""
    gqa = GroupedQueryAttention(8, 4, 2, seed=6)
    mha = MultiHeadAttention(8, 4, seed=0)
    mha.params["W_q"], mha.params["W_o"] = (
        gqa.params["W_q"].copy(),
        gqa.params["W_o"].copy(),
    )
    for name in ("W_k", "W_v"):
        mha.params[name] = np.repeat(
            gqa.params[name].reshape(8, 2, 2), 2, axis=1
        ).reshape(8, 8)
    x, dy = _x((2, 5, 8), 1), _x((2, 5, 8), 2)
    gqa.forward(x, causal=True)
    mha.forward(x, causal=True)
    gqa.backward(dy)
    mha.backward(dy)
    for name in ("W_k", "W_v"):
        summed = (
            mha.grads[name].reshape(8, 2, 2, 2).sum(axis=2).reshape(8, 4)
        )  # sum the G copies
        assert np.max(np.abs(gqa.grads[name] - summed)) < EXACT


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("n_heads, n_kv", [(8, 3), (6, 4), (4, 8)])
def test_divisibility_error(n_heads, n_kv):
    with pytest.raises(
        ValueError,
        match=f"n_heads must be a multiple of n_kv_heads.*n_heads={n_heads}",
    ):
        GroupedQueryAttention(24, n_heads, n_kv)


def test_mask_of_wrong_shape_is_named():
    layer = GroupedQueryAttention(8, 4, 2)
    with pytest.raises(
        ValueError, match=r"mask must broadcast to \[B, n_heads, L_q, L_k\]"
    ):
        layer.forward(_x((2, 5, 8)), mask=np.ones((2, 2, 5, 5), dtype=bool))
