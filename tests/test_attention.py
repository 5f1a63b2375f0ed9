"""attention_forward / attention_backward / causal_mask: values, gradients, broadcasting, masks,
causal chunks, stability, dtypes and input checks."""

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_np import (
    TOLERANCE,
    attention_backward,
    attention_forward,
    causal_mask,
    check_gradients,
    unbroadcast,
)

NUMPY_BROADCAST_MESSAGE = "could not be broadcast"


# --------------------------------------------------------------------------- strategies
@st.composite
def leading_shapes(draw):
    """Leading (batch/head) shapes for q, k and v that broadcast together, as attention allows.

    Each input may drop leading axes or have size 1 where the others have more: for example q
    [2, 3, ...] with k [2, 1, ...] and v [1, ...] (one key/value head read by three query heads).
    """
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))

    def one():
        n_drop = draw(st.integers(0, len(batch)))
        return tuple(1 if draw(st.booleans()) else n for n in batch[n_drop:])

    return one(), one(), one()


@st.composite
def attention_cases(draw, max_len=5):
    """q, k, v, mask, causal and scale for one attention call, from a drawn seed."""
    lq, lk, lv = draw(leading_shapes())
    L_q = draw(st.integers(1, max_len))
    L_k = draw(st.integers(1, max_len + 1))
    d_k = draw(st.integers(1, 4))
    d_v = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal(lq + (L_q, d_k))
    k = rng.standard_normal(lk + (L_k, d_k))
    v = rng.standard_normal(lv + (L_k, d_v))
    mask = None
    batch = np.broadcast_shapes(lq, lk, lv)
    kind = draw(st.sampled_from(["none", "2d", "full"]))
    if kind != "none":
        mshape = (L_q, L_k) if kind == "2d" else batch + (L_q, L_k)
        mask = rng.random(mshape) < 0.7
        if draw(st.booleans()):
            mask[..., draw(st.integers(0, L_q - 1)), :] = (
                False  # a query with no key at all
            )
    causal = draw(st.booleans())
    scale = draw(st.sampled_from([None, 1.0, 1.0 / d_k, 0.3]))
    return q, k, v, mask, causal, scale


def naive_attention(q, k, v, mask=None, causal=False, scale=None):
    """Reference: loops over every broadcast leading index and every query, in the plainest form."""
    d_k = q.shape[-1]
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    L_q, L_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    qb = np.broadcast_to(q, batch + q.shape[-2:])
    kb = np.broadcast_to(k, batch + k.shape[-2:])
    vb = np.broadcast_to(v, batch + v.shape[-2:])
    mb = (
        np.ones(batch + (L_q, L_k), bool)
        if mask is None
        else np.broadcast_to(mask, batch + (L_q, L_k))
    )
    out = np.zeros(batch + (L_q, d_v))
    weights = np.zeros(batch + (L_q, L_k))
    for b in np.ndindex(batch):
        for i in range(L_q):
            pos = (
                i + L_k - L_q
            )  # absolute position of query i: the last query sits on the last key
            allowed = [
                j
                for j in range(L_k)
                if mb[b][i, j] and (not causal or j <= pos)
            ]
            if not allowed:
                continue
            s = {
                j: scale * sum(qb[b][i, c] * kb[b][j, c] for c in range(d_k))
                for j in allowed
            }
            m = max(s.values())
            e = {j: math.exp(s[j] - m) for j in allowed}
            total = sum(e.values())
            for j in allowed:
                weights[b][i, j] = e[j] / total
                out[b][i] += weights[b][i, j] * vb[b][j]
    return out, weights


def _backward(q, k, v, seed=0, **kw):
    out, cache = attention_forward(q, k, v, **kw)
    dout = (
        np.random.default_rng(seed)
        .standard_normal(out.shape)
        .astype(out.dtype)
    )
    return out, cache, attention_backward(dout, cache)


# --------------------------------------------------------------------------- values
@given(attention_cases())
def test_matches_naive_reference(case):
    q, k, v, mask, causal, scale = case
    out, cache = attention_forward(
        q, k, v, mask=mask, causal=causal, scale=scale
    )
    ref_out, ref_w = naive_attention(q, k, v, mask, causal, scale)
    # weights carry the leading axes of q, k (and mask) only: v's extra axes never copy them
    np.testing.assert_allclose(
        np.broadcast_to(cache.weights, ref_w.shape),
        ref_w,
        rtol=1e-11,
        atol=1e-14,
    )
    np.testing.assert_allclose(out, ref_out, rtol=1e-11, atol=1e-13)


@given(attention_cases())
def test_weights_from_cache_are_probabilities(case):
    q, k, v, mask, causal, scale = case
    out, cache = attention_forward(
        q, k, v, mask=mask, causal=causal, scale=scale
    )
    w = cache.weights
    L_q, L_k = q.shape[-2], k.shape[-2]
    assert w.shape[-2:] == (L_q, L_k)
    assert (
        np.broadcast_shapes(w.shape[:-2], out.shape[:-2]) == out.shape[:-2]
    )
    assert np.all(w >= 0)
    sums = w.sum(axis=-1)
    assert np.all(np.isclose(sums, 1.0, rtol=1e-12) | (sums == 0.0))


def test_default_scale_is_one_over_sqrt_d_k():
    rng = np.random.default_rng(0)
    q, k, v = (
        rng.standard_normal((3, 16)),
        rng.standard_normal((5, 16)),
        rng.standard_normal((5, 2)),
    )
    out, cache = attention_forward(q, k, v)
    assert cache.scale == 0.25
    np.testing.assert_array_equal(
        out, attention_forward(q, k, v, scale=0.25)[0]
    )
    assert not np.allclose(
        out, attention_forward(q, k, v, scale=1 / 16)[0]
    )  # not the document's 1/d_k


def test_values_for_a_hand_computed_case():
    """Two keys, scores 0 and log 3 after scaling: weights 1/4 and 3/4."""
    q = np.array([[math.log(3.0), 0.0]])
    k = np.array([[0.0, 5.0], [1.0, 0.0]])
    v = np.array([[4.0], [8.0]])
    out, cache = attention_forward(q, k, v, scale=1.0)
    np.testing.assert_allclose(cache.weights, [[0.25, 0.75]], rtol=1e-15)
    np.testing.assert_allclose(out, [[7.0]], rtol=1e-15)


# --------------------------------------------------------------------------- gradients
@given(attention_cases())
def test_gradient_check(case):
    q, k, v, mask, causal, scale = case
    errors = check_gradients(
        attention_forward,
        attention_backward,
        {"q": q, "k": k, "v": v},
        seed=1,
        mask=mask,
        causal=causal,
        scale=scale,
    )
    assert max(errors.values()) < TOLERANCE, errors


@pytest.mark.parametrize(
    "q_lead, k_lead, v_lead",
    [
        ((2, 3), (2, 1), (1,)),
        ((2, 3), (1, 1), (3,)),
        ((4,), (), (1,)),
        ((2, 1), (1, 3), (2, 3)),
    ],
)
def test_gradient_check_with_broadcast_leading_axes(q_lead, k_lead, v_lead):
    rng = np.random.default_rng(1)
    q = rng.standard_normal(q_lead + (3, 4))
    k = rng.standard_normal(k_lead + (5, 4))
    v = rng.standard_normal(v_lead + (5, 2))
    _, _, (dq, dk, dv) = _backward(q, k, v)
    assert (
        dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    )
    errors = check_gradients(
        attention_forward,
        attention_backward,
        {"q": q, "k": k, "v": v},
        seed=2,
        causal=True,
    )
    assert max(errors.values()) < TOLERANCE, errors


def test_shared_key_value_head_gets_the_sum_of_its_query_heads_gradients():
    """Broadcasting one k/v head over 3 query heads equals copying it 3 times and summing the grads."""
    rng = np.random.default_rng(2)
    q, k, v = (
        rng.standard_normal((3, 4, 5)),
        rng.standard_normal((1, 6, 5)),
        rng.standard_normal((1, 6, 2)),
    )
    out, _, (dq, dk, dv) = _backward(q, k, v, seed=3, causal=True)
    out_c, _, (dq_c, dk_c, dv_c) = _backward(
        q, np.repeat(k, 3, 0), np.repeat(v, 3, 0), seed=3, causal=True
    )
    np.testing.assert_allclose(out, out_c, rtol=1e-14)
    np.testing.assert_allclose(dq, dq_c, rtol=1e-13)
    np.testing.assert_allclose(dk, dk_c.sum(0, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(dv, dv_c.sum(0, keepdims=True), rtol=1e-12)


@pytest.mark.parametrize("L_q, L_k", [(1, 7), (3, 7), (7, 7)])
def test_gradient_check_causal_chunk_over_a_longer_cache(L_q, L_k):
    rng = np.random.default_rng(3)
    q, k, v = (
        rng.standard_normal((2, L_q, 3)),
        rng.standard_normal((2, L_k, 3)),
        rng.standard_normal((2, L_k, 4)),
    )
    errors = check_gradients(
        attention_forward,
        attention_backward,
        {"q": q, "k": k, "v": v},
        seed=4,
        causal=True,
    )
    assert max(errors.values()) < TOLERANCE, errors


def test_unbroadcast_sums_over_added_and_stretched_axes():
    g = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(unbroadcast(g, (3, 4)), g.sum(0))
    np.testing.assert_array_equal(
        unbroadcast(g, (1, 4)), g.sum((0, 1))[None]
    )
    np.testing.assert_array_equal(
        unbroadcast(g, (2, 1, 4)), g.sum(1, keepdims=True)
    )
    np.testing.assert_array_equal(unbroadcast(g, (2, 3, 4)), g)


@given(st.integers(1, 6), st.integers(0, 6), st.integers(0, 2**32 - 1))
def test_causal_chunk_equals_the_last_rows_of_full_causal_attention(
    L_q, n_cached, seed
):
    """A chunk of L_q new queries over n_cached + L_q keys gives the last L_q rows of the full result."""
    rng = np.random.default_rng(seed)
    L = n_cached + L_q
    q, k, v = (
        rng.standard_normal((L, 3)),
        rng.standard_normal((L, 3)),
        rng.standard_normal((L, 2)),
    )
    full, full_cache = attention_forward(q, k, v, causal=True)
    chunk, chunk_cache = attention_forward(q[-L_q:], k, v, causal=True)
    np.testing.assert_allclose(chunk, full[-L_q:], rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(
        chunk_cache.weights,
        full_cache.weights[-L_q:],
        rtol=1e-13,
        atol=1e-15,
    )


def test_causal_and_mask_combine():
    rng = np.random.default_rng(4)
    q, k, v = (
        rng.standard_normal((4, 2)),
        rng.standard_normal((4, 2)),
        rng.standard_normal((4, 3)),
    )
    mask = np.array([[0, 1, 1, 1]] * 4, bool)  # key 0 is padding
    _, cache = attention_forward(q, k, v, mask=mask, causal=True)
    allowed = cache.weights > 0
    np.testing.assert_array_equal(allowed, mask & causal_mask(4, 4))
    assert np.all(
        cache.weights[0] == 0.0
    )  # query 0 may only see key 0, which is masked


# --------------------------------------------------------------------------- fully masked rows
def test_fully_masked_query_gets_zero_output_and_zero_gradients():
    rng = np.random.default_rng(5)
    q, k, v = (
        rng.standard_normal((2, 4, 3)),
        rng.standard_normal((2, 5, 3)),
        rng.standard_normal((2, 5, 2)),
    )
    mask = np.ones((4, 5), bool)
    mask[1] = False  # query 1 may attend nothing
    out, cache, (dq, dk, dv) = _backward(q, k, v, seed=6, mask=mask)
    assert np.all(out[:, 1] == 0.0) and np.all(cache.weights[:, 1] == 0.0)
    assert np.all(dq[:, 1] == 0.0)
    assert np.all(np.isfinite(out)) and all(
        np.all(np.isfinite(g)) for g in (dq, dk, dv)
    )
    # the empty query contributes nothing to dk and dv: removing it changes neither
    keep = [0, 2, 3]
    out2, cache2 = attention_forward(q[:, keep], k, v, mask=mask[keep])
    dout = np.random.default_rng(6).standard_normal(out.shape)
    _, dk_ref, dv_ref = attention_backward(dout[:, keep], cache2)
    _, dk_all, dv_all = attention_backward(dout, cache)
    np.testing.assert_allclose(dk_all, dk_ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(dv_all, dv_ref, rtol=1e-13, atol=1e-15)


def test_everything_masked_gives_zeros_not_nan():
    q, k, v = np.ones((3, 2)), np.ones((4, 2)), np.ones((4, 5))
    out, cache, grads = _backward(q, k, v, mask=np.zeros((3, 4), bool))
    assert np.all(out == 0.0) and all(np.all(g == 0.0) for g in grads)


# --------------------------------------------------------------------------- stability
@pytest.mark.parametrize("causal", [False, True])
def test_logits_of_1e4_give_finite_outputs_and_gradients_without_warnings(
    causal,
):
    q = np.array([[100.0, 0.0], [-100.0, 0.0], [0.0, 100.0]])
    k = np.array(
        [[100.0, 0.0], [-100.0, 0.0], [0.0, -100.0]]
    )  # scores q.k of +-1e4 and 0
    v = np.random.default_rng(7).standard_normal((3, 4))
    with warnings.catch_warnings():
        warnings.simplefilter(
            "error"
        )  # an overflow or a NaN on the way would raise here
        out, cache, (dq, dk, dv) = _backward(
            q, k, v, seed=8, causal=causal, scale=1.0
        )
    assert np.all(np.isfinite(out)) and all(
        np.all(np.isfinite(g)) for g in (dq, dk, dv)
    )
    w = cache.weights
    assert w[0, 0] == 1.0  # score 1e4 against -1e4 (and 0): all the weight
    if not causal:
        assert w[1, 1] == 1.0 and w[2, 2] == 0.0


# --------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_is_preserved(dtype):
    rng = np.random.default_rng(9)
    q, k, v = (
        rng.standard_normal(s).astype(dtype)
        for s in ((2, 3, 4), (2, 5, 4), (1, 5, 6))
    )
    out, cache, grads = _backward(q, k, v, causal=True)
    assert out.dtype == dtype and cache.weights.dtype == dtype
    assert all(g.dtype == dtype for g in grads)


def test_float32_agrees_with_float64():
    rng = np.random.default_rng(10)
    q, k, v = (
        rng.standard_normal((4, 8)),
        rng.standard_normal((6, 8)),
        rng.standard_normal((6, 3)),
    )
    out64, _, g64 = _backward(q, k, v)
    out32, _, g32 = _backward(
        q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)
    )
    np.testing.assert_allclose(out32, out64, rtol=1e-5, atol=1e-6)
    for a, b in zip(g32, g64):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- input checks
def _raises(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kwargs)
    assert NUMPY_BROADCAST_MESSAGE not in str(info.value)
    return info


def _qkv(lead=(2,), L_q=3, L_k=5, d_k=4, d_v=2):
    rng = np.random.default_rng(11)
    return (
        rng.standard_normal(lead + (L_q, d_k)),
        rng.standard_normal(lead + (L_k, d_k)),
        rng.standard_normal(lead + (L_k, d_v)),
    )


def test_q_and_k_with_different_d_k():
    q, k, v = _qkv()
    _raises(
        ValueError,
        r"q and k .* d_k, got q \(2, 3, 4\) and k \(2, 5, 3\)",
        attention_forward,
        q,
        k[..., :3],
        v,
    )


def test_k_and_v_with_different_number_of_keys():
    q, k, v = _qkv()
    _raises(
        ValueError,
        r"k and v .* L_k .* got k \(2, 5, 4\) and v \(2, 4, 2\)",
        attention_forward,
        q,
        k,
        v[:, :4],
    )


@pytest.mark.parametrize("mshape", [(3, 4), (5, 3), (3, 2, 3, 5), (4, 3, 5)])
def test_mask_that_does_not_broadcast(mshape):
    q, k, v = _qkv()
    shape = "\\(" + ", ".join(map(str, mshape)) + "\\)"
    _raises(
        ValueError,
        rf"mask must broadcast to .*\(2, 3, 5\).* got mask of shape {shape}",
        attention_forward,
        q,
        k,
        v,
        mask=np.ones(mshape, bool),
    )


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.uint8])
def test_non_boolean_mask(dtype):
    q, k, v = _qkv()
    _raises(
        TypeError,
        rf"mask must be a boolean array .* got dtype {np.dtype(dtype)}",
        attention_forward,
        q,
        k,
        v,
        mask=np.ones((3, 5), dtype),
    )


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_integer_arrays(which):
    args = dict(zip("qkv", _qkv()))
    args[which] = np.ones(args[which].shape, dtype=np.int64)
    _raises(
        TypeError,
        rf"{which} must be a floating-point array .* got dtype int64",
        attention_forward,
        **args,
    )


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_arrays_with_fewer_than_two_axes(which):
    args = dict(zip("qkv", _qkv(lead=())))
    args[which] = args[which][0]
    shape = "\\(" + str(args[which].shape[0]) + ",\\)"
    _raises(
        ValueError,
        rf"{which} must have at least 2 axes, got shape {shape}",
        attention_forward,
        **args,
    )


def test_empty_key_sequence():
    q, k, v = _qkv(L_k=0)
    _raises(
        ValueError,
        r"at least one key, got k \(2, 0, 4\) and v \(2, 0, 2\)",
        attention_forward,
        q,
        k,
        v,
    )


def test_leading_axes_that_do_not_broadcast():
    q, k, v = _qkv(lead=(2, 3))
    _raises(
        ValueError,
        r"leading .* q, k and v do not broadcast together: q \(2, 3\), k \(2, 2\), v \(2, 3\)",
        attention_forward,
        q,
        k[:, :2],
        v,
    )


def test_wrong_dout_shape():
    q, k, v = _qkv()
    out, cache = attention_forward(q, k, v)
    _raises(
        ValueError,
        r"dout must have shape \(2, 3, 2\) .* got \(3, 2\)",
        attention_backward,
        out[0],
        cache,
    )
    _raises(
        TypeError,
        r"dout must be a floating-point array",
        attention_backward,
        np.ones(out.shape, int),
        cache,
    )


@pytest.mark.parametrize(
    "scale",
    [0.0, -1.0, math.inf, math.nan, "0.5", True, np.array([0.5, 0.5])],
)
def test_bad_scale(scale):
    q, k, v = _qkv()
    _raises(
        ValueError,
        r"scale must be a positive finite number, got",
        attention_forward,
        q,
        k,
        v,
        scale=scale,
    )
