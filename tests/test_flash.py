"""flash_attention_forward / flash_attention_backward (chapter 9): equal to the dense kernels to
1e-12 in float64 in both directions, for every tiling, causal and not, chunks over a cache, broadcast
key/value heads and sliding windows; gradient checks; tile plans and FLOP counts; memory in O(L)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_np import (
    TOLERANCE,
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    MultiQueryAttention,
    attention_backward,
    attention_forward,
    check_gradients,
    check_layer_gradients,
)
from attn_np.flash import (
    FULL,
    MASKED,
    SKIP,
    FlashCache,
    block_plan,
    flash_attention_backward,
    flash_attention_flops,
    flash_attention_forward,
)
from attn_np.instruments.measure import measure_peak_bytes
from attn_np.windows import (
    window_attention_backward,
    window_attention_forward,
)

EXACT = (
    1e-12  # float64: the tiled and the dense kernels differ only by rounding
)


def window_mask(L_q, L_k, window):
    """Dense reference for ``window=W``, from its definition: the query at absolute position
    ``i = r + L_k - L_q`` attends key ``j`` iff ``i - W < j <= i``."""
    i = np.arange(L_q)[:, None] + (L_k - L_q)  # [L_q, 1]
    j = np.arange(L_k)[None, :]  # [1, L_k]
    return (j <= i) & (j > i - window)


def dense(q, k, v, dout, *, causal=False, window=None, scale=None):
    """The chapter-1 kernels: output and gradients."""
    mask = (
        None
        if window is None
        else window_mask(q.shape[-2], k.shape[-2], window)
    )
    out, cache = attention_forward(
        q, k, v, causal=causal, mask=mask, scale=scale
    )
    return out, attention_backward(dout, cache)


def flash(q, k, v, dout, **kw):
    out, cache = flash_attention_forward(q, k, v, **kw)
    return out, flash_attention_backward(dout, cache)


def assert_same(
    q,
    k,
    v,
    *,
    causal=False,
    window=None,
    scale=None,
    block_q=4,
    block_k=4,
    seed=0,
):
    """Forward and backward of the flash kernels equal the dense ones, shapes included."""
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    dout = np.random.default_rng(seed).standard_normal(
        batch + (q.shape[-2], v.shape[-1])
    )
    o_ref, g_ref = dense(
        q, k, v, dout, causal=causal, window=window, scale=scale
    )
    o, g = flash(
        q,
        k,
        v,
        dout,
        causal=causal,
        window=window,
        scale=scale,
        block_q=block_q,
        block_k=block_k,
    )
    assert o.shape == o_ref.shape and o.dtype == o_ref.dtype
    assert np.abs(o - o_ref).max() < EXACT
    for name, a, b, x in zip(("dq", "dk", "dv"), g, g_ref, (q, k, v)):
        assert a.shape == x.shape, name
        assert np.abs(a - b).max() < EXACT, name


def qkv(rng, lead_q, lead_kv, L_q, L_k, d_k=5, d_v=3):
    return (
        rng.standard_normal(lead_q + (L_q, d_k)),
        rng.standard_normal(lead_kv + (L_k, d_k)),
        rng.standard_normal(lead_kv + (L_k, d_v)),
    )


# ------------------------------------------------------------------------------- equality
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "L_q, L_k, block_q, block_k",
    [
        (16, 16, 4, 4),  # multiples of the blocks
        (37, 37, 8, 16),  # L not a multiple of either block
        (37, 37, 64, 64),  # one tile larger than the sequence
        (37, 37, 1, 1),  # one query and one key per tile
        (5, 40, 3, 7),  # a chunk of 5 new queries over a cache of 35 keys
        (1, 29, 4, 4),  # one decoding step
        (
            40,
            23,
            6,
            5,
        ),  # more queries than keys: the first ones see nothing when causal
        (13, 31, 13, 31),  # one tile for everything
    ],
)
def test_equals_dense(L_q, L_k, block_q, block_k, causal):
    q, k, v = qkv(
        np.random.default_rng(L_q * 100 + L_k), (2, 3), (2, 3), L_q, L_k
    )
    assert_same(q, k, v, causal=causal, block_q=block_q, block_k=block_k)


@pytest.mark.parametrize("causal", [False, True])
def test_broadcast_kv_heads_gqa(causal):
    """GQA's layout: q [B, n_kv, G, L, d_k] with k, v [B, n_kv, 1, L, d]; no copy of k or v,
    and dk, dv come back with k's and v's own shapes (summed over the G query heads)."""
    q, k, v = qkv(np.random.default_rng(1), (2, 2, 3), (2, 2, 1), 19, 19)
    assert_same(q, k, v, causal=causal, block_q=5, block_k=8)


def test_broadcast_every_way():
    """q shared by several key/value batches, v with fewer leading axes than k."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 11, 4))
    k = rng.standard_normal((3, 2, 14, 4))
    v = rng.standard_normal((2, 14, 6))
    for causal in (False, True):
        assert_same(q, k, v, causal=causal, block_q=3, block_k=5)


@pytest.mark.parametrize("scale", [None, 1.0, 0.05])
def test_scale(scale):
    q, k, v = qkv(np.random.default_rng(3), (2,), (2,), 9, 12)
    assert_same(q, k, v, causal=True, scale=scale, block_q=4, block_k=5)


def test_large_logits_do_not_overflow():
    """Scores of several hundred: the running maximum keeps every exponent <= 0."""
    q, k, v = qkv(np.random.default_rng(4), (2,), (2,), 20, 20)
    assert_same(30 * q, 30 * k, v, causal=True, block_q=6, block_k=7)


@pytest.mark.parametrize(
    "L_q, L_k, window, block_q, block_k",
    [
        (32, 32, 4, 8, 8),  # tiles entirely outside the window are skipped
        (32, 32, 1, 8, 8),  # each query sees only itself
        (37, 37, 10, 8, 16),
        (
            6,
            40,
            9,
            4,
            7,
        ),  # a chunk over a cache: the window ends at each query's position
        (40, 23, 5, 6, 5),  # more queries than keys
        (
            20,
            20,
            64,
            4,
            4,
        ),  # a window longer than the sequence is plain causal
    ],
)
def test_window_equals_dense_reference(L_q, L_k, window, block_q, block_k):
    q, k, v = qkv(np.random.default_rng(window), (2, 2), (2, 1), L_q, L_k)
    assert_same(
        q, k, v, causal=True, window=window, block_q=block_q, block_k=block_k
    )


def test_window_longer_than_sequence_is_causal():
    q, k, v = qkv(np.random.default_rng(5), (2,), (2,), 12, 15)
    o_w, _ = flash_attention_forward(
        q, k, v, causal=True, window=100, block_q=4, block_k=4
    )
    o_c, _ = flash_attention_forward(
        q, k, v, causal=True, block_q=4, block_k=4
    )
    assert np.abs(o_w - o_c).max() == 0


def test_empty_rows_are_zero_without_warnings():
    """Queries before the first key (L_q > L_k, causal) attend nothing: zero output and
    gradients, lse = -inf, and no RuntimeWarning (pytest turns those into errors)."""
    q, k, v = qkv(np.random.default_rng(6), (2,), (2,), 10, 4)
    dout = np.random.default_rng(7).standard_normal((2, 10, 3))
    out, cache = flash_attention_forward(
        q, k, v, causal=True, block_q=3, block_k=2
    )
    dq, dk, dv = flash_attention_backward(dout, cache)
    assert np.all(out[:, :6] == 0) and np.all(dq[:, :6] == 0)
    assert np.all(cache.lse[:, :6] == -np.inf) and np.all(
        np.isfinite(cache.lse[:, 6:])
    )
    assert np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))


def test_lse_is_the_log_sum_exp():
    q, k, v = qkv(np.random.default_rng(8), (3,), (3,), 9, 13)
    _, cache = flash_attention_forward(
        q, k, v, causal=True, block_q=4, block_k=5
    )
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])  # [3, 9, 13]
    s = np.where(
        window_mask(9, 13, 13), s, -np.inf
    )  # causal = a window as long as the keys
    m = s.max(axis=-1)
    assert (
        np.abs(
            cache.lse - (m + np.log(np.exp(s - m[..., None]).sum(axis=-1)))
        ).max()
        < EXACT
    )


# ----------------------------------------------------------------------- property tests
@st.composite
def flash_cases(draw):
    """Shapes, blocks, causal/window and broadcast leading axes, from a drawn seed."""
    L_q = draw(st.integers(1, 24))
    L_k = draw(st.integers(1, 24))
    block_q = draw(st.integers(1, 26))
    block_k = draw(st.integers(1, 26))
    d_k, d_v = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    heads = draw(
        st.sampled_from(
            [((), ()), ((2,), (2,)), ((2, 3), (2, 1)), ((1,), (3,))]
        )
    )
    causal = draw(st.booleans())
    window = (
        draw(st.one_of(st.none(), st.integers(1, 26))) if causal else None
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q, k, v = qkv(rng, heads[0], heads[1], L_q, L_k, d_k, d_v)
    return (
        q,
        k,
        v,
        {
            "causal": causal,
            "window": window,
            "block_q": block_q,
            "block_k": block_k,
        },
    )


@given(flash_cases())
def test_equals_dense_property(case):
    q, k, v, kw = case
    assert_same(q, k, v, **kw)


@given(flash_cases())
def test_block_plan_matches_dense_mask(case):
    """Every tile's state (skip, masked, full) is what the dense mask says of its pairs."""
    q, k, _, kw = case
    L_q, L_k, bq, bk = q.shape[-2], k.shape[-2], kw["block_q"], kw["block_k"]
    if kw["causal"]:
        allowed = window_mask(L_q, L_k, kw["window"] or L_k + L_q)
    else:
        allowed = np.ones((L_q, L_k), dtype=bool)
    plan = block_plan(
        L_q, L_k, bq, bk, causal=kw["causal"], window=kw["window"]
    )
    assert plan.shape == (-(-L_q // bq), -(-L_k // bk))
    for i, j in np.ndindex(plan.shape):
        tile = allowed[i * bq : (i + 1) * bq, j * bk : (j + 1) * bk]
        want = FULL if tile.all() else MASKED if tile.any() else SKIP
        assert plan[i, j] == want, (i, j)


# ----------------------------------------------------------------------- gradient checks
@pytest.mark.parametrize(
    "kw",
    [
        {"causal": False, "block_q": 3, "block_k": 4},
        {"causal": True, "block_q": 2, "block_k": 3},
        {"causal": True, "window": 3, "block_q": 2, "block_k": 2},
    ],
)
def test_gradients_against_finite_differences(kw):
    rng = np.random.default_rng(9)
    inputs = {
        "q": rng.standard_normal((2, 2, 5, 3)),
        "k": rng.standard_normal(
            (2, 1, 7, 3)
        ),  # one key/value head for two query heads
        "v": rng.standard_normal((2, 1, 7, 4)),
    }
    errors = check_gradients(
        flash_attention_forward,
        flash_attention_backward,
        inputs,
        seed=1,
        **kw,
    )
    assert max(errors.values()) < TOLERANCE, errors


# --------------------------------------------------------------------------------- memory
def test_cache_holds_nothing_of_size_L_q_by_L_k():
    q, k, v = qkv(
        np.random.default_rng(10), (2,), (2,), 64, 96, d_k=4, d_v=4
    )
    _, cache = flash_attention_forward(
        q, k, v, causal=True, block_q=16, block_k=16
    )
    assert isinstance(cache, FlashCache)
    arrays = [
        x
        for x in (getattr(cache, f.name) for f in dataclasses.fields(cache))
        if isinstance(x, np.ndarray)
    ]
    assert {id(a) for a in arrays} >= {
        id(q),
        id(k),
        id(v),
    }  # the inputs themselves, not copies
    for a in arrays:
        assert a.size < 64 * 96, a.shape
    assert cache.lse.shape == (2, 64)


def test_peak_memory_grows_linearly():
    """Forward + backward: the peak doubles (not quadruples) when L doubles, and stays far
    below one dense [h, L, L] array."""
    h, d = 2, 16
    peaks = {}
    for L in (512, 1024):
        rng = np.random.default_rng(L)
        q, k, v, do = (rng.standard_normal((h, L, d)) for _ in range(4))

        def run(q=q, k=k, v=v, do=do):
            _, cache = flash_attention_forward(
                q, k, v, causal=True, block_q=64, block_k=128
            )
            return flash_attention_backward(do, cache)

        peaks[L] = measure_peak_bytes(run)
    assert peaks[1024] / peaks[512] < 2.5
    assert (
        peaks[1024] < h * 1024 * 1024 * 8 / 4
    )  # under a quarter of the dense weights


# ------------------------------------------------------------------------- FLOPs, dtypes
def test_flops_without_causal_are_dense_plus_a_recompute():
    f = flash_attention_flops(37, 50, 8, 6, block_q=8, block_k=16)
    assert f["forward"] == f["dense forward"] == 2 * 37 * 50 * 14
    assert f["backward"] == 2 * 37 * 50 * (
        3 * 8 + 2 * 6
    )  # S again, dV, dP, dQ, dK
    assert (
        f["tiles computed"] == f["tiles"] == 5 * 4 and f["tiles masked"] == 0
    )


def test_causal_flops_count_the_computed_tiles():
    L, b = 64, 16
    f = flash_attention_flops(
        L, L, 8, 8, block_q=b, block_k=b, causal=True, batch=3
    )
    n = L // b
    assert f["tiles computed"] == n * (n + 1) // 2 and f["tiles masked"] == n
    assert f["forward"] == 3 * 2 * (n * (n + 1) // 2) * b * b * 16
    one = flash_attention_flops(
        L, L, 8, 8, block_q=1, block_k=1, causal=True
    )
    assert (
        one["forward"] == 2 * (L * (L + 1) // 2) * 16
    )  # tile 1: exactly the allowed pairs


def test_float32():
    q, k, v = qkv(np.random.default_rng(11), (2,), (2,), 30, 30)
    dout = np.random.default_rng(12).standard_normal((2, 30, 3))
    o64, g64 = flash(q, k, v, dout, causal=True, block_q=8, block_k=8)
    f32 = [x.astype(np.float32) for x in (q, k, v, dout)]
    o32, g32 = flash(*f32, causal=True, block_q=8, block_k=8)
    assert o32.dtype == np.float32 and all(
        g.dtype == np.float32 for g in g32
    )
    assert np.abs(o32 - o64).max() < 1e-5
    for a, b in zip(g32, g64):
        assert np.abs(a - b).max() < 1e-4


# --------------------------------------------------------------------------------- errors
def test_bad_arguments():
    q, k, v = qkv(np.random.default_rng(13), (), (), 4, 4)
    with pytest.raises(ValueError, match="window=3 needs causal=True"):
        flash_attention_forward(q, k, v, window=3)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="block_q"):
            flash_attention_forward(q, k, v, block_q=bad)
        with pytest.raises(ValueError, match="block_k"):
            flash_attention_forward(q, k, v, block_k=bad)
        with pytest.raises(ValueError, match="window"):
            flash_attention_forward(q, k, v, causal=True, window=bad)
    with pytest.raises(ValueError, match="same last axis d_k"):
        flash_attention_forward(q, k[:, :3], v)
    with pytest.raises(TypeError, match="floating-point"):
        flash_attention_forward(q.astype(int), k, v)
    _, cache = flash_attention_forward(q, k, v)
    with pytest.raises(ValueError, match=r"dout must have shape \(4, 3\)"):
        flash_attention_backward(np.zeros((4, 2)), cache)


# ------------------------------------------------------------------- the layers' flash=True
FAMILIES = {"MHA": 4, "GQA": 2, "MQA": 1}


def layer_pair(n_kv, **kw):
    return (
        GroupedQueryAttention(12, 4, n_kv, d_k=3, d_v=5, seed=3, **kw),
        GroupedQueryAttention(
            12, 4, n_kv, d_k=3, d_v=5, seed=3, flash=True, **kw
        ),
    )


def assert_same_pass(dense_layer, flash_layer, x, dy, causal):
    """One forward and backward of each layer: the same output, input
    gradient and parameter gradients, to EXACT."""
    y_d = dense_layer.forward(x, causal=causal)
    y_f = flash_layer.forward(x, causal=causal)
    dx_d, dx_f = dense_layer.backward(dy), flash_layer.backward(dy)
    assert np.abs(y_f - y_d).max() < EXACT
    assert np.abs(dx_f - dx_d).max() < EXACT
    for name in dense_layer.grads:
        assert (
            np.abs(flash_layer.grads[name] - dense_layer.grads[name]).max()
            < EXACT
        ), name


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(9, 12), (2, 9, 12)])
def test_layer_flash_equals_dense(family, causal, shape):
    """Same output, input gradient and parameter gradients as the dense layer."""
    dense_layer, flash_layer = layer_pair(FAMILIES[family])
    rng = np.random.default_rng(14)
    x = rng.standard_normal(shape)
    dy = rng.standard_normal(shape)
    assert_same_pass(dense_layer, flash_layer, x, dy, causal)


def test_layer_flash_kv_cache_chunks():
    """Prefill and decode through a KVCache: each chunk aligned to the end of the cache."""
    dense_layer, flash_layer = layer_pair(2)
    x = np.random.default_rng(15).standard_normal((2, 13, 12))
    full = dense_layer.forward(x, causal=True)
    cache, outs, start = KVCache(initial_capacity=1), [], 0
    for n in (5, 3, 1, 4):
        outs.append(
            flash_layer.forward(x[:, start : start + n], kv_cache=cache)
        )
        start += n
    assert np.abs(np.concatenate(outs, axis=1) - full).max() < EXACT


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_flash_gradients(family):
    layer = GroupedQueryAttention(
        8, 4, FAMILIES[family], d_k=3, d_v=2, seed=4, flash=True
    )
    x = np.random.default_rng(16).standard_normal((2, 6, 8))
    errors = check_layer_gradients(layer, x, seed=5, causal=True)
    assert max(errors.values()) < TOLERANCE, errors


def test_layer_flash_subclasses_and_errors():
    for cls in (MultiHeadAttention, MultiQueryAttention):
        layer = cls(8, 2, flash=True)
        assert layer.flash and "flash=True" in repr(layer)
        assert not cls(8, 2).flash
    layer = MultiHeadAttention(8, 2, flash=True)
    layer.forward(np.ones((3, 8)), causal=True)
    with pytest.raises(AttributeError, match="not kept with flash=True"):
        _ = layer.attention_weights
    per_head = np.ones((1, 2, 3, 3), dtype=bool)
    per_head[0, 1, 2, 0] = False  # the two heads' masks differ
    with pytest.raises(ValueError, match="same for every batch row"):
        layer.forward(np.ones((3, 8)), mask=per_head)
    with pytest.raises(TypeError, match="flash must be True or False"):
        MultiHeadAttention(8, 2, flash="yes")
    dense_layer = MultiHeadAttention(8, 2)
    assert dense_layer.attention_weights is None  # before the first forward
    dense_layer.forward(np.ones((3, 8)))
    assert dense_layer.attention_weights.shape == (1, 2, 3, 3)


# ------------------------------------------------- chapter 8's windows, RoPE and rolling caches
@pytest.mark.parametrize(
    "L_q, L_k, window", [(32, 32, 5), (7, 40, 9), (40, 23, 4), (16, 16, 64)]
)
def test_window_equals_attention_forward_window(L_q, L_k, window):
    """The same semantics as chapter 8's window_attention_forward(window=W)."""
    q, k, v = qkv(
        np.random.default_rng(L_q + window), (2, 2), (2, 1), L_q, L_k
    )
    dout = np.random.default_rng(17).standard_normal((2, 2, L_q, 3))
    o_ref, c_ref = window_attention_forward(
        q, k, v, causal=True, window=window
    )
    o, g = flash(
        q, k, v, dout, causal=True, window=window, block_q=6, block_k=8
    )
    assert np.abs(o - o_ref).max() < EXACT
    for a, b in zip(g, window_attention_backward(dout, c_ref)):
        assert np.abs(a - b).max() < EXACT


@pytest.mark.parametrize(
    "kw",
    [
        {"window": 5},
        {"rope_base": 10000.0, "rope_dim": 2},
        {"window": 4, "rope_base": 500.0, "rope_dim": 2},
    ],
)
def test_layer_flash_window_and_rope(kw):
    dense_layer, flash_layer = layer_pair(2, **kw)
    rng = np.random.default_rng(18)
    x, dy = (
        rng.standard_normal((2, 11, 12)),
        rng.standard_normal((2, 11, 12)),
    )
    assert_same_pass(dense_layer, flash_layer, x, dy, True)


def test_layer_flash_rolling_cache():
    """A window layer decoding through KVCache(window=W): the rolling cache holds a contiguous
    run of positions ending with the chunk, which is what the kernels' alignment assumes."""
    dense_layer, flash_layer = layer_pair(2, window=4)
    x = np.random.default_rng(19).standard_normal((2, 13, 12))
    full = dense_layer.forward(x, causal=True)
    cache, outs, start = KVCache(initial_capacity=1, window=4), [], 0
    for n in (5, 1, 3, 1, 1, 2):
        outs.append(
            flash_layer.forward(x[:, start : start + n], kv_cache=cache)
        )
        start += n
    assert np.abs(np.concatenate(outs, axis=1) - full).max() < EXACT


def test_layer_flash_refuses_a_streaming_cache():
    layer = GroupedQueryAttention(8, 2, 1, window=4, flash=True)
    cache = KVCache(window=4, sink_tokens=1)
    with pytest.raises(ValueError, match="sink_tokens > 0"):
        layer.forward(np.ones((1, 3, 8)), kv_cache=cache)
