"""Bad input to the attention modules (issue 24): a ValueError or TypeError
whose message names the argument, or a correct finite result; never a
silent NaN, a wrong number or an error from deep inside NumPy."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_np import (
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    attention_backward,
    attention_forward,
    causal_mask,
    grouped_attention_backward,
    grouped_attention_forward,
    position_mask,
    rope_forward,
    softmax,
    softmax_backward,
    softmax_forward,
)
from attn_np.attention import unbroadcast
from attn_np.flash import block_plan, flash_attention_forward
from attn_np.latent import LatentKVCache, MultiHeadLatentAttention
from attn_np.norms import rmsnorm_forward
from attn_np.softmax import sink_softmax
from attn_np.windows import window_attention_forward

FAST = settings(max_examples=25, deadline=None)
rng = np.random.default_rng(0)


def qkv(L_q=3, L_k=4, d=4, dtype=np.float64):
    r = np.random.default_rng(1)
    return tuple(
        r.standard_normal(s).astype(dtype)
        for s in ((2, L_q, d), (2, L_k, d), (2, L_k, d))
    )


def grouped(G=2, L=3, d=4):
    r = np.random.default_rng(2)
    return (
        r.standard_normal((1, 2, G, L, d)),
        r.standard_normal((1, 2, L, d)),
        r.standard_normal((1, 2, L, d)),
    )


# ------------------------------------------- cause 2: overflow, float16
@given(big=st.sampled_from([1e155, 1e200, 1e300]))
@FAST
def test_scores_that_overflow_are_refused(big):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="scores.*overflowed.*float64"):
        attention_forward(q * big, k * big, v)
    gq, gk, gv = grouped()
    with pytest.raises(ValueError, match="scores.*overflowed.*scale="):
        grouped_attention_forward(gq * big, gk * big, gv)
    with pytest.raises(ValueError, match="scores.*overflowed"):
        window_attention_forward(q * big, k * big, v, causal=True, window=2)


def test_huge_scale_is_refused_naming_scale():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="scale=1e\\+308"):
        attention_forward(q * 10, k * 10, v, scale=1e308)
    with pytest.raises(ValueError, match="scale must be a positive finite"):
        attention_forward(q, k, v, scale=10**400)


def test_layers_refuse_overflowing_inputs():
    x = np.random.default_rng(3).standard_normal((5, 16))
    layer = MultiHeadAttention(16, 2)
    with pytest.raises(ValueError, match="overflowed"):
        layer.forward(x * 1e154)
    mla = MultiHeadLatentAttention(16, 2, 4, 8, 2)
    with pytest.raises(ValueError, match="overflowed"):
        mla.forward(x * 1e154)


@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.complex128])
def test_float16_and_other_dtypes_are_refused(dtype):
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q must be .*float32 or float64.*"):
        attention_forward(q.astype(dtype), k, v)


def test_float32_still_works():
    q, k, v = qkv(dtype=np.float32)
    out, _ = attention_forward(q, k, v)
    assert out.dtype == np.float32 and np.isfinite(out).all()


# ---------------------------------- cause 4: upstream gradients, caches
@given(bad=st.sampled_from([np.nan, np.inf, -np.inf]))
@FAST
def test_every_backward_refuses_a_non_finite_upstream(bad):
    q, k, v = qkv()
    out, c = attention_forward(q, k, v)
    d = np.ones_like(out)
    d[0, 0, 0] = bad
    with pytest.raises(ValueError, match="dout must be finite"):
        attention_backward(d, c)
    p, sc = softmax_forward(q)
    dp = np.ones_like(p)
    dp[0, 0, 0] = bad
    with pytest.raises(ValueError, match="dp must be finite"):
        softmax_backward(dp, sc)
    gq, gk, gv = grouped()
    o, gc = grouped_attention_forward(gq, gk, gv)
    do = np.ones_like(o)
    do.flat[0] = bad
    with pytest.raises(ValueError, match="do must be finite"):
        grouped_attention_backward(do, gc)
    layer = GroupedQueryAttention(16, 4, 2)
    y = layer.forward(np.ones((3, 16)))
    dy = np.ones_like(y)
    dy[0, 0] = bad
    with pytest.raises(ValueError, match="dy must be finite"):
        layer.backward(dy)
    x, g = np.ones((2, 4)), np.ones(4)
    _, rc = rmsnorm_forward(x, g)
    from attn_np.norms import rmsnorm_backward

    with pytest.raises(ValueError, match="dy must be finite"):
        rmsnorm_backward(np.full((2, 4), bad), rc)


def test_backward_refuses_a_wrong_shaped_upstream():
    q, k, v = qkv()
    out, c = attention_forward(q, k, v)
    with pytest.raises(ValueError, match="dout must have shape"):
        attention_backward(np.ones((2, 3, 5)), c)
    with pytest.raises(TypeError, match="cache must be the AttentionCache"):
        attention_backward(np.ones_like(out), object())


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_caches_refuse_non_finite_keys_and_values(bad):
    k = np.ones((1, 2, 3, 4))
    k[0, 0, 0, 0] = bad
    with pytest.raises(ValueError, match="k must be finite"):
        KVCache().append(k, np.ones((1, 2, 3, 4)))
    with pytest.raises(ValueError, match="v must be finite"):
        KVCache().append(np.ones((1, 2, 3, 4)), k)
    c = np.ones((1, 3, 4))
    c[0, 0, 0] = bad
    with pytest.raises(ValueError, match="c_kv must be finite"):
        LatentKVCache().append(c, np.ones((1, 3, 2)))


# ----------------------------------------- cause 5: aliasing the caller
def test_the_output_of_attention_forward_is_read_only():
    q, k, v = qkv()
    out, c = attention_forward(q, k, v)
    with pytest.raises(ValueError, match="read-only"):
        out += 1
    assert not c.weights.flags.writeable


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_changing_an_input_before_the_backward_is_refused(name):
    arrays = dict(zip("qkv", qkv()))
    out, c = attention_forward(**arrays)
    arrays[name][0, 0, 0] += 1.0
    with pytest.raises(ValueError, match=f"{name} was changed in place"):
        attention_backward(np.ones_like(out), c)


def test_changing_the_grouped_core_inputs_is_refused():
    gq, gk, gv = grouped()
    o, c = grouped_attention_forward(gq, gk, gv)
    assert not o.flags.writeable
    gk[0, 0, 0, 0] = 5.0
    with pytest.raises(ValueError, match="k was changed in place"):
        grouped_attention_backward(np.ones_like(o), c)


@pytest.mark.parametrize(
    "make",
    [
        lambda: GroupedQueryAttention(16, 4, 2),
        lambda: MultiHeadLatentAttention(16, 2, 4, 8, 2),
    ],
)
def test_changing_a_layers_x_before_the_backward_is_refused(make):
    layer = make()
    x = np.random.default_rng(4).standard_normal((3, 16))
    y = layer.forward(x, causal=True)
    x[1, 2] += 1.0
    with pytest.raises(ValueError, match="x was changed in place"):
        layer.backward(np.ones_like(y))


# -------------------------------------------- cause 10: public helpers
@pytest.mark.parametrize("window", [0, -2, 2.5, True, "3"])
def test_masks_refuse_bad_windows(window):
    with pytest.raises(ValueError, match="window must be a positive"):
        causal_mask(3, 3, window=window)
    with pytest.raises(ValueError, match="window must be a positive"):
        position_mask(np.arange(3), np.arange(3), window=window)


@pytest.mark.parametrize("L", [-1, 2.5, True, None])
def test_causal_mask_refuses_bad_lengths(L):
    with pytest.raises(ValueError, match="L_q must be a non-negative"):
        causal_mask(L, 3)
    with pytest.raises(ValueError, match="L_k must be a non-negative"):
        causal_mask(3, L)


def test_position_mask_refuses_bad_positions_and_sinks():
    with pytest.raises(ValueError, match="q_positions must be a 1-D"):
        position_mask(np.zeros((2, 2), int), np.arange(3))
    with pytest.raises(ValueError, match="k_positions must be a 1-D"):
        position_mask(np.arange(3), np.arange(3.0))
    with pytest.raises(ValueError, match="sink_tokens must be smaller"):
        position_mask(np.arange(3), np.arange(3), window=2, sink_tokens=2)


@given(window=st.integers(1, 10**30), L=st.integers(1, 6))
@FAST
def test_any_valid_window_gives_the_right_mask(window, L):
    """window=10**30 works (no OverflowError from int64 arithmetic)."""
    m = causal_mask(L, L, window=window)
    i, j = np.indices((L, L))
    np.testing.assert_array_equal(m, (j <= i) & (j > i - min(window, L)))
    q, k, v = qkv(L, L)
    out, _ = attention_forward(q, k, v, causal=True)
    ref, _ = window_attention_forward(q, k, v, causal=True, window=window)
    if window >= L:
        np.testing.assert_allclose(ref, out, rtol=0, atol=1e-15)


def test_sink_softmax_checks_its_inputs():
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match="sink must broadcast"):
        sink_softmax(x, np.zeros((3, 1)), None)
    with pytest.raises(ValueError, match="sink must be finite"):
        sink_softmax(x, np.full((2, 1), np.nan), None)
    with pytest.raises(TypeError, match="mask must be a boolean"):
        sink_softmax(x, np.zeros((2, 1)), np.ones((2, 3)))
    p, ps = sink_softmax(x, np.zeros((2, 1)), None)
    np.testing.assert_allclose(p.sum(-1) + ps[:, 0], 1.0)


@given(
    grad_shape=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=4),
)
@FAST
def test_unbroadcast_returns_the_shape_or_refuses(grad_shape, shape):
    grad = np.ones(grad_shape)
    try:
        fits = np.broadcast_shapes(shape, grad.shape) == grad.shape
    except ValueError:
        fits = False
    if fits:
        assert unbroadcast(grad, tuple(shape)).shape == tuple(shape)
    else:
        with pytest.raises(ValueError, match="must broadcast to the shape"):
            unbroadcast(grad, tuple(shape))


def test_softmax_on_an_empty_axis_or_a_ragged_list():
    with pytest.raises(ValueError, match="x must have at least one entry"):
        softmax(np.zeros((3, 0)))
    with pytest.raises(ValueError, match="x must be a rectangular array"):
        softmax([[1.0, 2.0], [3.0]])


# ----------------------------------------------- cause 11: real flags
@pytest.mark.parametrize("flag", ["no", 1.0, None, 1])
def test_flags_accept_only_booleans(flag):
    q, k, v = qkv()
    with pytest.raises(TypeError, match="causal must be True or False"):
        attention_forward(q, k, v, causal=flag)
    gq, gk, gv = grouped()
    with pytest.raises(TypeError, match="causal must be True or False"):
        grouped_attention_forward(gq, gk, gv, causal=flag)
    with pytest.raises(TypeError, match="tiled must be True or False"):
        grouped_attention_forward(gq, gk, gv, tiled=flag)
    with pytest.raises(TypeError, match="causal must be True or False"):
        flash_attention_forward(q, k, v, causal=flag)
    with pytest.raises(TypeError, match="sinks must be True or False"):
        GroupedQueryAttention(16, 4, 2, sinks=flag)
    with pytest.raises(TypeError, match="flash must be True or False"):
        GroupedQueryAttention(16, 4, 2, flash=flag)
    layer = GroupedQueryAttention(16, 4, 2)
    with pytest.raises(TypeError, match="causal must be True or False"):
        layer.forward(np.ones((3, 16)), causal=flag)
    with pytest.raises(TypeError, match="latent_norm must be True"):
        MultiHeadLatentAttention(16, 2, 4, 8, 2, latent_norm=flag)
    mla = MultiHeadLatentAttention(16, 2, 4, 8, 2)
    if flag is not None:  # absorb=None is the default: chosen by cache
        with pytest.raises(TypeError, match="absorb must be True or"):
            mla.forward(np.ones((3, 16)), absorb=flag)
    with pytest.raises(TypeError, match="causal must be True or False"):
        mla.forward(np.ones((3, 16)), causal=flag)


# ----------------------------------------- cause 13: one cache, one layer
def test_a_cache_fed_by_two_layers_is_refused():
    a = GroupedQueryAttention(16, 4, 2, seed=0)
    b = GroupedQueryAttention(16, 4, 2, seed=1)
    cache = KVCache()
    a.forward(np.ones((2, 16)), kv_cache=cache)
    with pytest.raises(ValueError, match="filled by another layer"):
        b.forward(np.ones((1, 16)), kv_cache=cache)
    copy = GroupedQueryAttention(16, 4, 2, seed=0)  # the same weights
    copy.forward(np.ones((1, 16)), kv_cache=cache)
    cache.truncate(0)  # empty again: any layer may claim it
    b.forward(np.ones((1, 16)), kv_cache=cache)


def test_a_latent_cache_fed_by_two_layers_is_refused():
    a = MultiHeadLatentAttention(16, 2, 4, 8, 2, seed=0)
    b = MultiHeadLatentAttention(16, 2, 4, 8, 2, seed=1)
    cache = LatentKVCache()
    a.forward(np.ones((2, 16)), kv_cache=cache)
    with pytest.raises(ValueError, match="filled by another layer"):
        b.forward(np.ones((1, 16)), kv_cache=cache)


# --------------------------------------- cause 9: ints beyond int64/float
def test_huge_python_ints_give_a_clear_error_or_the_answer():
    q, k, v = qkv(5, 5)
    ref, _ = flash_attention_forward(q, k, v, causal=True)
    out, _ = flash_attention_forward(q, k, v, causal=True, block_k=2**63)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-14)
    out, _ = flash_attention_forward(
        q, k, v, causal=True, window=10**30, block_q=2**70
    )
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-14)
    assert block_plan(5, 5, 2**63, 2**63, causal=True).shape == (1, 1)
    with pytest.raises(ValueError, match="base must be a positive finite"):
        rope_forward(q, np.arange(5), base=10**400)
    with pytest.raises(ValueError, match="rope_base must be a positive"):
        GroupedQueryAttention(16, 4, 2, rope_base=10**400)
    with pytest.raises(ValueError, match="scale must be a positive"):
        grouped_attention_forward(*grouped(), scale=10**400)
    big = position_mask(np.arange(3), np.arange(3), window=10**30)
    np.testing.assert_array_equal(big, np.tri(3, dtype=bool))


# -------------------------------------------------- cause 14: RoPE edges
def test_rope_edge_cases_name_their_argument():
    x = np.ones((2, 3, 4))
    with pytest.raises(ValueError, match="x must be finite"):
        rope_forward(np.full((3, 4), np.nan), np.arange(3))
    with pytest.raises(ValueError, match="positions must be non-negative"):
        rope_forward(x, np.array([0, -1, 2]))
    with pytest.raises(ValueError, match="positions must have shape"):
        rope_forward(x, np.arange(4))
    with pytest.raises(ValueError, match="rotary_dim must be an even"):
        rope_forward(x, np.arange(3), rotary_dim=3)
    with pytest.raises(ValueError, match="the last axis of x must be even"):
        rope_forward(np.ones((3, 5)), np.arange(3))
    y, _ = rope_forward(x, np.array([0, 2**40, 2**62]))
    assert np.isfinite(y).all()


def test_rmsnorm_refuses_what_it_cannot_use():
    with pytest.raises(ValueError, match="eps must be a positive"):
        rmsnorm_forward(np.ones((2, 4)), np.ones(4), eps=-1.0)
    with pytest.raises(ValueError, match="x must be finite"):
        rmsnorm_forward(np.full((2, 4), np.inf), np.ones(4))
    with pytest.raises(ValueError, match="mean\\(x\\^2\\) overflowed"):
        rmsnorm_forward(np.full((2, 4), 1e200), np.ones(4))


# ---------------------------------------------- a fully masked row: zeros
@given(L=st.integers(2, 5), row=st.integers(0, 4))
@FAST
def test_a_fully_masked_row_gives_zeros_and_zero_gradients(L, row):
    row = row % L
    q, k, v = qkv(L, L)
    mask = np.ones((L, L), bool)
    mask[row] = False
    out, c = attention_forward(q, k, v, mask=mask)
    assert np.all(out[:, row] == 0) and np.isfinite(out).all()
    dout = np.random.default_rng(5).standard_normal(out.shape)
    dq, dk, dv = attention_backward(dout, c)
    assert np.all(dq[:, row] == 0)
    assert np.isfinite(dk).all() and np.isfinite(dv).all()
    # the row adds nothing to dk, dv: the same as leaving its dout at 0
    d0 = dout.copy()
    d0[:, row] = 0
    _, dk0, dv0 = attention_backward(d0, c)
    np.testing.assert_allclose(dk, dk0, rtol=0, atol=1e-15)
    np.testing.assert_allclose(dv, dv0, rtol=0, atol=1e-15)


# -------------------------------------- hypothesis over bad shapes/values
bad_value = st.sampled_from([np.nan, np.inf, -np.inf])


@given(which=st.sampled_from("qkv"), bad=bad_value, pos=st.integers(0, 7))
@FAST
def test_non_finite_inputs_are_named(which, bad, pos):
    arrays = dict(zip("qkv", (a.copy() for a in qkv())))
    arrays[which].flat[pos] = bad
    with pytest.raises(ValueError, match=f"{which} must be finite"):
        attention_forward(**arrays)
    g = dict(zip("qkv", (a.copy() for a in grouped())))
    g[which].flat[pos] = bad
    with pytest.raises(ValueError, match=f"{which} must be finite"):
        grouped_attention_forward(**g)


@given(
    L_q=st.integers(0, 3),
    L_k=st.integers(0, 3),
    d_q=st.integers(0, 3),
    d_k=st.integers(0, 3),
)
@FAST
def test_shapes_either_fit_or_are_named(L_q, L_k, d_q, d_k):
    q = np.ones((L_q, d_q))
    k = np.ones((L_k, d_k))
    v = np.ones((L_k, 2))
    if d_q == d_k > 0 and L_k > 0:
        out, _ = attention_forward(q, k, v)
        assert out.shape == (L_q, 2) and np.isfinite(out).all()
    else:
        with pytest.raises(ValueError, match="q and k|k and v"):
            attention_forward(q, k, v)


def test_head_helpers_name_the_shape_they_need():
    from attn_np.heads import merge_groups, merge_heads, split_heads

    with pytest.raises(ValueError, match="t must be \\[B, L, n\\*d\\]"):
        split_heads(np.ones((1, 3, 7)), 2, 4)
    with pytest.raises(ValueError, match="t must be \\[B, n, L, d\\]"):
        merge_heads(np.ones((3, 4)))
    with pytest.raises(ValueError, match="t must be \\[B, n_kv, G, L, d\\]"):
        merge_groups(np.ones((1, 3, 4)))


def test_flash_refuses_scores_that_may_overflow():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="scores q k\\^T \\* scale may"):
        flash_attention_forward(q * 1e200, k * 1e200, v)
    out, _ = flash_attention_forward(q * 1e100, k * 1e-100, v)
    assert np.isfinite(out).all()
