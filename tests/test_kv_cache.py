"""KVCache and the layers' kv_cache path: prefill + decode equals the full causal forward."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_np import (
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    MultiQueryAttention,
)

FAMILIES = {"MHA": 8, "GQA": 2, "MQA": 1}


def run_chunks(layer, x, chunks, cache=None):
    """Feed ``x [B, L, d]`` through ``layer`` chunk by chunk; returns the outputs joined and the cache."""
    cache = KVCache(initial_capacity=1) if cache is None else cache
    outs, start = [], 0
    for n in chunks:
        outs.append(layer.forward(x[:, start : start + n], kv_cache=cache))
        start += n
    assert start == x.shape[1]
    return np.concatenate(outs, axis=1), cache


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "chunks",
    [
        [19],  # one prefill
        [1] * 19,  # pure decoding from the first token
        [7] + [1] * 12,  # prefill, then one-token decode steps
        [5, 3, 4]
        + [1]
        * 7,  # a prefill in several chunks that do not divide the length
        [6, 6, 6, 1],
    ],
)
def test_chunks_reproduce_full_causal_forward(family, chunks):
    rng = np.random.default_rng(3)
    layer = GroupedQueryAttention(32, 8, FAMILIES[family], seed=1)
    x = rng.standard_normal((3, 19, 32))
    full = layer.forward(x, causal=True)
    weights_full = layer.attention_weights  # [B, h, L, L]
    got, cache = run_chunks(layer, x, chunks)
    np.testing.assert_allclose(got, full, rtol=0, atol=1e-12)
    # the last chunk's attention weights are the last rows of the full causal map
    last = chunks[-1]
    np.testing.assert_allclose(
        layer.attention_weights,
        weights_full[:, :, -last:],
        rtol=0,
        atol=1e-12,
    )
    assert len(cache) == 19


@settings(max_examples=25)
@given(
    n_kv=st.sampled_from([1, 2, 4]),
    B=st.integers(1, 3),
    chunks=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    unbatched=st.booleans(),
)
def test_any_chunking_matches_full_forward(n_kv, B, chunks, unbatched):
    rng = np.random.default_rng(len(chunks) * 7 + B)
    layer = GroupedQueryAttention(16, 4, n_kv, d_k=3, d_v=5, seed=2)
    L = sum(chunks)
    x = rng.standard_normal((B, L, 16))
    full = layer.forward(x, causal=True)
    if unbatched:
        x, full = x[0], full[0]
        cache, outs, start = KVCache(), [], 0
        for n in chunks:
            outs.append(layer.forward(x[start : start + n], kv_cache=cache))
            start += n
        got = np.concatenate(outs, axis=0)
    else:
        got, cache = run_chunks(layer, x, chunks)
    np.testing.assert_allclose(got, full, rtol=0, atol=1e-12)
    assert len(cache) == L
    assert cache.nbytes == (1 if unbatched else B) * n_kv * L * (3 + 5) * 8


@pytest.mark.parametrize("cls", [MultiHeadAttention, MultiQueryAttention])
def test_subclasses_decode_in_float32(cls):
    rng = np.random.default_rng(0)
    layer = cls(32, 4, dtype=np.float32)
    x = rng.standard_normal((2, 9, 32)).astype(np.float32)
    full = layer.forward(x, causal=True)
    got, cache = run_chunks(layer, x, [4, 1, 1, 3])
    assert got.dtype == np.float32 and cache.dtype == np.float32
    np.testing.assert_allclose(got, full, rtol=0, atol=2e-5)


def test_len_nbytes_keys_values_against_formula():
    rng = np.random.default_rng(1)
    layer = GroupedQueryAttention(24, 6, 3, d_k=4, d_v=7, seed=0)
    x = rng.standard_normal((2, 10, 24))
    cache = KVCache()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.layout is None
    layer.forward(x[:, :6], kv_cache=cache)
    layer.forward(x[:, 6:], kv_cache=cache)
    B, n_kv, L, d_k, d_v, itemsize = 2, 3, 10, 4, 7, 8
    assert len(cache) == L
    assert cache.nbytes == B * n_kv * L * (d_k + d_v) * itemsize == 5280
    assert cache.layout == (B, n_kv, d_k, d_v)
    assert cache.keys.shape == (B, n_kv, L, d_k) and cache.values.shape == (
        B,
        n_kv,
        L,
        d_v,
    )
    # the cached keys and values are the projections of x, split into heads
    k = (
        (x @ layer.params["W_k"])
        .reshape(B, L, n_kv, d_k)
        .transpose(0, 2, 1, 3)
    )
    v = (
        (x @ layer.params["W_v"])
        .reshape(B, L, n_kv, d_v)
        .transpose(0, 2, 1, 3)
    )
    np.testing.assert_allclose(cache.keys, k, atol=1e-13)
    np.testing.assert_allclose(cache.values, v, atol=1e-13)


def test_growth_is_amortised():
    """Appending n positions one at a time reallocates O(log n) times, not n times."""
    layer = GroupedQueryAttention(8, 2, 1, seed=0)
    x = np.random.default_rng(0).standard_normal((1, 1, 8))
    cache = KVCache(initial_capacity=1)
    n = 1000
    for _ in range(n):
        layer.forward(x, kv_cache=cache)
    assert len(cache) == n
    assert cache.reallocations == int(
        np.ceil(np.log2(n))
    )  # 1 -> 2 -> 4 -> ... -> 1024: ten doublings
    assert cache.capacity == 1024


def test_preallocated_cache_never_reallocates():
    layer = GroupedQueryAttention(8, 2, 2, seed=0)
    x = np.random.default_rng(0).standard_normal((1, 50, 8))
    cache = KVCache(initial_capacity=50)
    run_chunks(layer, x, [10] + [1] * 40, cache)
    assert cache.reallocations == 0 and cache.capacity == 50


def test_decode_step_returns_views_not_copies():
    cache = KVCache(initial_capacity=8)
    k = np.ones((1, 2, 3, 4))
    keys, values = cache.append(k, 2 * k)
    keys2, values2 = cache.append(k[:, :, :1], 2 * k[:, :, :1])
    assert np.shares_memory(keys, keys2) and np.shares_memory(
        values, values2
    )
    assert keys2.shape == (1, 2, 4, 4) and values2.shape == (1, 2, 4, 4)


def test_truncate_forgets_positions():
    rng = np.random.default_rng(0)
    layer = GroupedQueryAttention(16, 4, 2, seed=0)
    x = rng.standard_normal((1, 8, 16))
    cache = KVCache()
    layer.forward(x[:, :5], kv_cache=cache)
    y_first = layer.forward(x[:, 5:6], kv_cache=cache)
    layer.forward(x[:, 6:8], kv_cache=cache)
    cache.truncate(5)
    assert len(cache) == 5
    np.testing.assert_allclose(
        layer.forward(x[:, 5:6], kv_cache=cache), y_first, atol=1e-14
    )
    with pytest.raises(
        ValueError, match="length must be an integer in \\[0, 6\\]"
    ):
        cache.truncate(7)


# ----------------------------------------------------------------------- mismatched chunks
def filled_cache(n_kv=2, B=2, dtype=np.float64):
    layer = GroupedQueryAttention(16, 4, n_kv, seed=0, dtype=dtype)
    cache = KVCache()
    layer.forward(np.zeros((B, 3, 16), dtype=dtype), kv_cache=cache)
    return layer, cache


def test_batch_mismatch_raises_naming_both():
    layer, cache = filled_cache(B=2)
    with pytest.raises(
        ValueError,
        match=r"x_chunk \(3, 1, 16\) gives batch 3.*kv_cache holds batch 2",
    ):
        layer.forward(np.zeros((3, 1, 16)), kv_cache=cache)
    with pytest.raises(
        ValueError, match=r"x_chunk \(1, 1, 16\) gives batch 1"
    ):
        layer.forward(
            np.zeros((1, 16)), kv_cache=cache
        )  # unbatched is batch 1
    assert len(cache) == 3  # nothing was appended


def test_width_mismatch_raises_naming_both():
    """A cache filled by one layer handed to a layer with other key/value widths."""
    _, cache = filled_cache(n_kv=2)
    other = GroupedQueryAttention(16, 4, 4, seed=0)
    with pytest.raises(
        ValueError,
        match=r"x_chunk .*n_kv_heads 4, d_k 4.*kv_cache holds .*n_kv_heads 2, d_k 4",
    ):
        other.forward(np.zeros((2, 1, 16)), kv_cache=cache)
    wide = GroupedQueryAttention(16, 4, 2, d_k=8, seed=0)
    with pytest.raises(
        ValueError, match=r"d_k 8, d_v 4, but kv_cache holds .*d_k 4, d_v 4"
    ):
        wide.forward(np.zeros((2, 1, 16)), kv_cache=cache)
    assert len(cache) == 3


def test_model_width_mismatch_names_x_chunk():
    layer, cache = filled_cache()
    with pytest.raises(
        ValueError,
        match=r"x_chunk must have shape .*d_model=16, got \(2, 1, 12\)",
    ):
        layer.forward(np.zeros((2, 1, 12)), kv_cache=cache)


def test_dtype_mismatch_raises_type_error():
    layer32, cache = filled_cache(dtype=np.float32)
    layer64 = GroupedQueryAttention(16, 4, 2, seed=0)
    with pytest.raises(TypeError, match="kv_cache"):
        layer64.forward(np.zeros((2, 1, 16)), kv_cache=cache)


def test_kv_cache_must_be_a_kvcache():
    layer = GroupedQueryAttention(16, 4, 2, seed=0)
    with pytest.raises(
        TypeError, match="kv_cache must be an attn_np.KVCache"
    ):
        layer.forward(np.zeros((1, 1, 16)), kv_cache={})


def test_append_checks_its_arguments():
    cache = KVCache()
    with pytest.raises(ValueError, match="same B, n_kv_heads and L"):
        cache.append(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 4, 4)))
    with pytest.raises(TypeError, match="floating-point"):
        cache.append(
            np.zeros((1, 2, 3, 4), dtype=int),
            np.zeros((1, 2, 3, 4), dtype=int),
        )
    cache.append(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 5)))
    with pytest.raises(
        ValueError,
        match=r"k \(1, 2, 1, 4\) and v \(1, 2, 1, 4\) gives .*d_v 4, but kv_cache holds .*d_v 5",
    ):
        cache.append(np.zeros((1, 2, 1, 4)), np.zeros((1, 2, 1, 4)))
    with pytest.raises(ValueError, match="initial_capacity"):
        KVCache(initial_capacity=0)


def test_empty_cache_has_no_keys():
    with pytest.raises(ValueError, match="empty"):
        _ = KVCache().keys
    assert repr(KVCache()) == "KVCache(empty)"


# ------------------------------------------------------------------------ inference only
def test_backward_after_cached_forward_raises():
    layer = GroupedQueryAttention(16, 4, 2, seed=0)
    x = np.random.default_rng(0).standard_normal((1, 4, 16))
    y = layer.forward(x, causal=True)
    layer.backward(np.ones_like(y))  # fine after an ordinary forward
    y = layer.forward(x, kv_cache=KVCache())
    with pytest.raises(RuntimeError, match="kv_cache"):
        layer.backward(np.ones_like(y))


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"rope_base": 10000.0},
        {"window": 5},
        {"window": 6, "sinks": True, "rope_base": 100.0},
    ],
)
@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_per_head_decode_equals_stacked_decode(options, n_kv, monkeypatch):
    """A decode step with few stacked rows makes one product per query
    head (min_stacked_rows); forcing the stacked products gives the same
    outputs and weights, for every family and layer option."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 15, 16))
    chunks = [6, 1, 1, 2, 1, 3, 1]
    runs = {}
    for rows in (1, 10**9):  # always stacked; always per head
        monkeypatch.setattr(GroupedQueryAttention, "min_stacked_rows", rows)
        layer = GroupedQueryAttention(16, 4, n_kv, seed=3, **options)
        if "sinks" in layer.params:  # distinct per head, not all 0
            layer.params["sinks"][:] = [0.5, -1.0, 2.0, 0.0]
        window = options.get("window")
        sinks = 2 if window and options.get("sinks") else 0
        cache = KVCache(window=window, sink_tokens=sinks)
        outs = []
        for start, n in zip(np.cumsum([0] + chunks[:-1]), chunks):
            y = layer.forward(
                x[:, start : start + n], causal=True, kv_cache=cache
            )
            outs.append((y, layer.attention_weights))
        runs[rows] = outs
    for (y1, w1), (y2, w2) in zip(runs[1], runs[10**9]):
        np.testing.assert_allclose(y2, y1, rtol=0, atol=1e-13)
        np.testing.assert_allclose(w2, w1, rtol=0, atol=1e-15)


def test_per_head_rows_rule():
    """One product per query head only for groups (G > 1) with fewer than
    min_stacked_rows stacked rows G * L."""
    mha, gqa, mqa = (GroupedQueryAttention(16, 16, n) for n in (16, 4, 1))
    assert not mha.per_head_rows(1)  # G = 1: nothing to stack
    assert gqa.per_head_rows(1) and not gqa.per_head_rows(2)  # 4, 8 rows
    assert not mqa.per_head_rows(1)  # G = 16 rows: one stacked product


@pytest.mark.parametrize("rope_layout", [None, "half", "interleaved"])
def test_one_token_step_equals_the_general_step(rope_layout):
    """A decode step of one token over a plain cache takes the layer's
    short path (:meth:`_decode_one`, :meth:`KVCache.append_step`); the
    same step at an explicit position takes the general one. Bit for bit
    the same outputs and caches, through the cache's growth."""
    rng = np.random.default_rng(5)
    kw = {} if rope_layout is None else dict(rope_layout=rope_layout)
    layer = GroupedQueryAttention(
        32,
        4,
        2,
        seed=1,
        rope_base=None if rope_layout is None else 1e4,
        **kw,
    )
    x = rng.standard_normal((2, 9, 32))
    short, general = KVCache(initial_capacity=2), KVCache(initial_capacity=2)
    for c in (short, general):
        layer.forward(x[:, :3], kv_cache=c)
    assert layer._one_token(short, x[:, 3:4])
    for t in range(3, 9):  # the capacity doubles at 4 and at 8
        y1 = layer.forward(x[:, t : t + 1], kv_cache=short)
        y2 = layer.forward(
            x[:, t : t + 1], kv_cache=general, positions=np.array([t])
        )
        assert np.array_equal(y1, y2)
        assert np.array_equal(short.keys, general.keys)
        assert np.array_equal(short.values, general.values)
    assert len(short) == len(general) == 9
    assert short.reallocations == general.reallocations > 0
    # a NaN in the input is still refused, naming it
    bad = x[:, :1].copy()
    bad[0, 0, 3] = np.nan
    with pytest.raises(ValueError, match="x_chunk"):
        layer.forward(bad, kv_cache=short)
