"""Chapter 8: the rolling KV cache, KVCache(window=W) and KVCache(window=W, sink_tokens=S).

Decoding with any chunking (random chunk lengths, some longer than the window) equals the full
windowed causal forward; the buffer never holds more than W + C - 1 positions; memory stops growing;
the StreamingLLM cache equals the full forward under its mask (sinks + the last W - S positions)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_np import (
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    causal_mask,
    position_mask,
    rope,
)

WORST = {
    "window": 0.0,
    "sinks": 0.0,
}  # the worst errors seen, printed at the end (pytest -s)


@pytest.fixture(scope="module", autouse=True)
def report_worst():
    yield
    print(f"\nworst chunked-decoding error: {WORST}")


def decode(layer, x, chunks, cache):
    """Feed ``x [B, L, d]`` chunk by chunk; check the buffer bound after every chunk."""
    outs, start = [], 0
    for C in chunks:
        outs.append(layer.forward(x[:, start : start + C], kv_cache=cache))
        start += C
        held = cache.keys.shape[2]
        assert held == len(cache.positions) <= cache.window + C - 1
        assert (
            held == min(len(cache), cache.window - 1 + C)
            or cache.sink_tokens
        )
        # the layer's weights cover the held positions only; the rest were forgotten
        assert layer.attention_weights.shape[-1] == held
    assert start == x.shape[1] == len(cache)
    return np.concatenate(outs, axis=1)


chunkings = st.lists(st.integers(1, 11), min_size=1, max_size=7)


@settings(max_examples=40)
@given(
    n_kv=st.sampled_from([1, 2, 4]),
    W=st.integers(1, 7),
    B=st.integers(1, 2),
    chunks=chunkings,
    seed=st.integers(0, 2**16),
)
def test_any_chunking_equals_the_full_windowed_forward(
    n_kv, W, B, chunks, seed
):
    rng = np.random.default_rng(seed)
    layer = GroupedQueryAttention(
        16, 4, n_kv, d_k=3, d_v=5, window=W, seed=seed
    )
    x = rng.standard_normal((B, sum(chunks), 16))
    full = layer.forward(x, causal=True)
    weights_full = layer.attention_weights  # [B, h, L, L]
    cache = KVCache(initial_capacity=1, window=W)
    got = decode(layer, x, chunks, cache)
    err = float(np.max(np.abs(got - full)))
    WORST["window"] = max(WORST["window"], err)
    assert err < 1e-12
    # the last chunk's weights are the full map's rows at the held columns, zero elsewhere
    C = chunks[-1]
    np.testing.assert_allclose(
        layer.attention_weights,
        weights_full[:, :, -C:, cache.positions],
        rtol=0,
        atol=1e-13,
    )
    forgotten = np.setdiff1d(np.arange(x.shape[1]), cache.positions)
    assert np.all(weights_full[:, :, -C:, forgotten] == 0)


@settings(max_examples=30)
@given(
    W=st.integers(2, 7),
    S=st.integers(1, 3),
    chunks=chunkings,
    seed=st.integers(0, 2**16),
    sinks=st.booleans(),
)
def test_sink_cache_equals_the_streaming_llm_mask(W, S, chunks, seed, sinks):
    """Without positions inside attention, the StreamingLLM cache computes the full forward under
    position_mask(window=W, sink_tokens=S): sinks plus the last W - S positions."""
    S = min(S, W - 1)
    rng = np.random.default_rng(seed)
    layer = MultiHeadAttention(12, 3, window=W, sinks=sinks, seed=seed)
    if sinks:  # learned sink logits and StreamingLLM's sink tokens combine
        layer.params["sinks"][:] = rng.standard_normal(3)
    ref = MultiHeadAttention(
        12, 3, sinks=sinks, seed=seed
    )  # same weights, no window
    ref.params = layer.params
    L = sum(chunks)
    x = rng.standard_normal((2, L, 12))
    full = ref.forward(
        x,
        mask=position_mask(
            np.arange(L), np.arange(L), window=W, sink_tokens=S
        ),
    )
    cache = KVCache(window=W, sink_tokens=S)
    got = decode(layer, x, chunks, cache)
    err = float(np.max(np.abs(got - full)))
    WORST["sinks"] = max(WORST["sinks"], err)
    assert err < 1e-12
    held = cache.positions
    assert np.all(
        held[: min(S, L)] == np.arange(min(S, L))
    )  # the sinks stay, in front
    assert len(held) <= W - 1 + chunks[-1]


def test_memory_stops_growing():
    W = 8
    layer = GroupedQueryAttention(16, 4, 2, window=W, seed=0)
    rng = np.random.default_rng(0)
    cache = KVCache(initial_capacity=2, window=W)
    nbytes, capacity = [], []
    for _ in range(40):
        layer.forward(rng.standard_normal((1, 1, 16)), kv_cache=cache)
        nbytes.append(cache.nbytes)
        capacity.append(cache.capacity)
    per_position = 2 * (4 + 4) * 8  # n_kv (d_k + d_v) float64
    assert nbytes[:W] == [per_position * (t + 1) for t in range(W)]
    assert set(nbytes[W - 1 :]) == {
        per_position * W
    }  # W positions held from then on
    assert (
        set(capacity[W - 1 :]) == {W} and cache.reallocations == 2
    )  # 2 -> 4 -> 8
    assert len(cache) == 40 and list(cache.positions) == list(range(32, 40))


def test_a_long_chunk_grows_the_buffer_and_decoding_gives_it_back():
    W = 4
    layer = GroupedQueryAttention(16, 4, 2, window=W, seed=0)
    cache = KVCache(window=W)
    layer.forward(
        np.zeros((1, 10, 16)), kv_cache=cache
    )  # a prefill longer than the window
    assert cache.capacity == 10 and cache.keys.shape[2] == 10
    layer.forward(np.zeros((1, 1, 16)), kv_cache=cache)
    assert (
        cache.capacity == W
        and cache.keys.shape[2] == W
        and cache.reallocations == 1
    )
    layer.forward(
        np.zeros((1, 5, 16)), kv_cache=cache
    )  # W - 1 + 5 = 8: not more than 2 W
    layer.forward(np.zeros((1, 2, 16)), kv_cache=cache)
    assert cache.capacity == 8 and cache.reallocations == 2
    for _ in range(3):
        layer.forward(np.zeros((1, 1, 16)), kv_cache=cache)
    assert cache.capacity == 8 and cache.keys.shape[2] == W


@pytest.mark.parametrize("S", [0, 2])
def test_attention_mask_of_a_window_cache(S):
    W = 5
    layer = MultiHeadAttention(8, 2, window=W, seed=0)
    cache = KVCache(window=W, sink_tokens=S)
    for C in (3, 4, 1, 6, 2):
        layer.forward(np.zeros((1, C, 8)), kv_cache=cache)
        m = cache.attention_mask(C)
        held = cache.positions
        want = position_mask(
            np.arange(len(cache) - C, len(cache)),
            held,
            window=W,
            sink_tokens=S,
        )
        np.testing.assert_array_equal(m, want)
        if S == 0:  # contiguous positions: the aligned window mask
            np.testing.assert_array_equal(
                m, causal_mask(C, len(held), window=W)
            )
    with pytest.raises(ValueError, match="n_queries must be at most"):
        cache.attention_mask(len(cache.positions) + 1)


def test_truncate_a_rolling_cache():
    """Going back is allowed as far as the next query still finds its window held."""
    W = 4
    rng = np.random.default_rng(1)
    layer = GroupedQueryAttention(16, 4, 2, window=W, seed=0)
    x = rng.standard_normal((1, 12, 16))
    cache = KVCache(window=W)
    layer.forward(x[:, :9], kv_cache=cache)
    y9 = layer.forward(x[:, 9:10], kv_cache=cache)
    layer.forward(x[:, 10:12], kv_cache=cache)  # a chunk of 2 drafted tokens
    assert list(cache.positions) == [7, 8, 9, 10, 11]
    with pytest.raises(
        ValueError, match=r"length must be an integer in \[10, 12\]"
    ):
        cache.truncate(9)  # position 9 would need position 6, forgotten
    cache.truncate(10)
    assert len(cache) == 10 and list(cache.positions) == [7, 8, 9]
    y10 = layer.forward(x[:, 10:11], kv_cache=cache)
    full = layer.forward(x[:, :11], causal=True)
    np.testing.assert_allclose(y10, full[:, 10:], atol=1e-14)
    np.testing.assert_allclose(full[:, 9:10], y9, atol=1e-14)


# --------------------------------------------------------------------------- mismatches
def test_layer_and_cache_windows_must_agree():
    x = np.zeros((1, 2, 16))
    with pytest.raises(
        ValueError, match=r"kv_cache has window=4 but the layer has window=3"
    ):
        GroupedQueryAttention(16, 4, 2, window=3).forward(
            x, kv_cache=KVCache(window=4)
        )
    with pytest.raises(
        ValueError,
        match=r"kv_cache has window=4 but the layer has window=None",
    ):
        GroupedQueryAttention(16, 4, 2).forward(
            x, kv_cache=KVCache(window=4)
        )
    with pytest.raises(
        ValueError,
        match=r"kv_cache has window=None but the layer has window=3",
    ):
        GroupedQueryAttention(16, 4, 2, window=3).forward(
            x, kv_cache=KVCache()
        )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"window": 0}, "window must be a positive integer"),
        ({"window": 2.0}, "window must be a positive integer"),
        ({"sink_tokens": 2}, "sink_tokens must be smaller than window"),
        ({"window": 4, "sink_tokens": 4}, "sink_tokens=4 and window=4"),
        (
            {"window": 4, "sink_tokens": -1},
            "sink_tokens must be a non-negative integer",
        ),
    ],
)
def test_bad_rolling_cache_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KVCache(**kwargs)


def test_repr_of_a_rolling_cache():
    cache = KVCache(window=4, sink_tokens=1)
    assert repr(cache) == "KVCache(window=4, sink_tokens=1, empty)"
    MultiHeadAttention(8, 2, window=4).forward(
        np.zeros((1, 6, 8)), kv_cache=cache
    )
    assert "seen=6, held=6" in repr(cache)


# --------------------------------------------------------------------------- with RoPE
def streaming_reference(layer, x, W, S):
    """StreamingLLM, one query at a time, from its definition: query i sees V(i) = the sinks
    (j < S) and the keys i - (W - S) < j <= i; the keys turn by their rank in V(i) and the
    query by its own rank, len(V(i)) - 1 (the paper's "positions within the cache")."""
    P, h, G, d_k, d_v = (
        layer.params,
        layer.n_heads,
        layer.group_size,
        layer.d_k,
        layer.d_v,
    )
    kw = dict(
        base=layer.rope_base,
        layout=layer.rope_layout,
        rotary_dim=layer.rope_dim,
    )
    B, L, _ = x.shape
    heads = np.zeros((B, L, h * d_v))
    for i in range(L):
        seen = [j for j in range(i + 1) if j < S or j > i - (W - S)]
        for hd in range(h):
            kv = hd // G
            q = (
                x[:, i : i + 1] @ P["W_q"][:, hd * d_k : (hd + 1) * d_k]
            )  # [B, 1, d_k]
            k = (
                x[:, seen] @ P["W_k"][:, kv * d_k : (kv + 1) * d_k]
            )  # [B, n, d_k]
            v = x[:, seen] @ P["W_v"][:, kv * d_v : (kv + 1) * d_v]
            q = rope(q, np.array([len(seen) - 1]), **kw)
            k = rope(k, np.arange(len(seen)), **kw)
            s = (q @ k.swapaxes(-1, -2))[:, 0] / np.sqrt(d_k)  # [B, n]
            a = P["sinks"][hd] if "sinks" in P else -np.inf
            e = np.exp(s - np.maximum(s.max(-1, keepdims=True), a))
            z = e.sum(-1, keepdims=True) + np.exp(
                a - np.maximum(s.max(-1, keepdims=True), a)
            )
            heads[:, i, hd * d_v : (hd + 1) * d_v] = np.einsum(
                "bn,bnd->bd", e / z, v
            )
    return heads @ P["W_o"]


@settings(max_examples=25)
@given(
    n_kv=st.sampled_from([1, 2]),
    W=st.integers(1, 6),
    chunks=chunkings,
    layout=st.sampled_from(["half", "interleaved"]),
    seed=st.integers(0, 2**16),
)
def test_rope_window_cache_counts_true_positions(
    n_kv, W, chunks, layout, seed
):
    """With RoPE on, a chunk's positions continue from len(cache), the positions seen, not the
    positions held: decoding equals the full windowed forward."""
    rng = np.random.default_rng(seed)
    layer = GroupedQueryAttention(
        16,
        4,
        n_kv,
        d_k=4,
        d_v=3,
        window=W,
        rope_base=100.0,
        rope_layout=layout,
        seed=seed,
    )
    x = rng.standard_normal((2, sum(chunks), 16))
    full = layer.forward(x, causal=True)
    got = decode(layer, x, chunks, KVCache(window=W))
    err = float(np.max(np.abs(got - full)))
    WORST["window"] = max(WORST["window"], err)
    assert err < 1e-12


@settings(max_examples=25)
@given(
    W=st.integers(2, 6),
    S=st.integers(1, 3),
    chunks=st.lists(st.integers(1, 8), min_size=1, max_size=5),
    sinks=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rope_sink_cache_equals_streaming_llm_one_token_at_a_time(
    W, S, chunks, sinks, seed
):
    """The sink cache caches keys before rotation and turns them by their slot in the cache; any
    chunking gives the paper's token-by-token result."""
    S = min(S, W - 1)
    rng = np.random.default_rng(seed)
    layer = GroupedQueryAttention(
        12, 4, 2, d_k=4, d_v=3, window=W, sinks=sinks, rope_base=50.0
    )
    if sinks:
        layer.params["sinks"][:] = rng.standard_normal(4)
    x = rng.standard_normal((2, sum(chunks), 12))
    got = decode(layer, x, chunks, KVCache(window=W, sink_tokens=S))
    err = float(np.max(np.abs(got - streaming_reference(layer, x, W, S))))
    WORST["sinks"] = max(WORST["sinks"], err)
    assert err < 1e-12


def test_the_papers_example_of_positions_in_the_cache():
    """Xiao et al. (2023), section 3.2: with tokens [0, 1, 2, 3, 6, 7, 8] cached and token 9 being
    decoded, the positions are 0 ... 7. Our cache holds exactly those and the reference assigns
    exactly those positions; the one-token step equals it."""
    W, S = 8, 4
    rng = np.random.default_rng(3)
    layer = MultiHeadAttention(8, 2, window=W, rope_base=10.0)
    x = rng.standard_normal((1, 10, 8))
    cache = KVCache(window=W, sink_tokens=S)
    layer.forward(x[:, :9], kv_cache=cache)
    y = layer.forward(x[:, 9:], kv_cache=cache)
    assert list(cache.positions) == [0, 1, 2, 3, 6, 7, 8, 9]
    np.testing.assert_allclose(
        y, streaming_reference(layer, x, W, S)[:, 9:], rtol=0, atol=1e-13
    )


def test_before_anything_is_evicted_the_sink_cache_is_the_full_forward():
    W, S = 8, 2
    rng = np.random.default_rng(4)
    layer = GroupedQueryAttention(
        12, 4, 2, d_k=4, window=W, rope_base=10.0, seed=1
    )
    x = rng.standard_normal((2, W, 12))
    full = layer.forward(x, causal=True)
    got = decode(layer, x, [3, 1, 4], KVCache(window=W, sink_tokens=S))
    np.testing.assert_allclose(got, full, rtol=0, atol=1e-13)
