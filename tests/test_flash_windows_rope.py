"""Chapter 9 meets chapters 6 and 8: the tiled kernels with a sliding window
equal the dense kernels' own window (not only a mask built in a test), and a
flash layer with RoPE and a window equals the dense layer, in both
directions and with a rolling cache."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_np import (
    GroupedQueryAttention,
    KVCache,
    flash_attention_backward,
    flash_attention_forward,
)
from attn_np.windows import (
    window_attention_backward,
    window_attention_forward,
)

EXACT = 1e-12


@given(
    L_q=st.integers(1, 40),
    extra=st.integers(0, 30),
    window=st.integers(1, 50),
    block_q=st.sampled_from([1, 3, 8, 16]),
    block_k=st.sampled_from([1, 5, 8, 32]),
    seed=st.integers(0, 2**16),
)
def test_flash_window_equals_attention_window(
    L_q, extra, window, block_q, block_k, seed
):
    rng = np.random.default_rng(seed)
    L_k = L_q + extra
    q = rng.standard_normal((2, 1, L_q, 4))
    k = rng.standard_normal((1, 3, L_k, 4))  # broadcast over the first axis
    v = rng.standard_normal((2, 3, L_k, 5))
    kw = dict(causal=True, window=window)
    o_d, c_d = window_attention_forward(q, k, v, **kw)
    o_f, c_f = flash_attention_forward(
        q, k, v, block_q=block_q, block_k=block_k, **kw
    )
    assert np.max(np.abs(o_d - o_f)) < EXACT
    dout = rng.standard_normal(o_d.shape)
    for a, b in zip(
        window_attention_backward(dout, c_d),
        flash_attention_backward(dout, c_f),
    ):
        assert a.shape == b.shape and np.max(np.abs(a - b)) < EXACT


@pytest.mark.parametrize("n_kv", [4, 2, 1])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("rope_base", [None, 10000.0])
def test_flash_layer_equals_dense_layer(n_kv, window, rope_base):
    kw = dict(seed=3, rope_base=rope_base, window=window)
    dense = GroupedQueryAttention(16, 4, n_kv, **kw)
    flash = GroupedQueryAttention(16, 4, n_kv, flash=True, **kw)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 13, 16))
    y_d, y_f = dense.forward(x, causal=True), flash.forward(x, causal=True)
    assert np.max(np.abs(y_d - y_f)) < EXACT
    dy = rng.standard_normal(y_d.shape)
    assert np.max(np.abs(dense.backward(dy) - flash.backward(dy))) < EXACT
    for name in dense.grads:
        diff = np.abs(dense.grads[name] - flash.grads[name])
        assert np.max(diff) < EXACT, name


def test_flash_layer_decodes_with_a_rolling_cache():
    kw = dict(seed=1, rope_base=10000.0, window=4)
    dense = GroupedQueryAttention(16, 4, 2, **kw)
    flash = GroupedQueryAttention(16, 4, 2, flash=True, **kw)
    x = np.random.default_rng(2).standard_normal((1, 17, 16))
    full = dense.forward(x, causal=True)
    cache = KVCache(window=4)
    start, steps = 0, []
    for size in (6, 1, 1, 5, 1, 3):
        steps.append(
            flash.forward(x[:, start : start + size], kv_cache=cache)
        )
        start += size
    assert np.max(np.abs(np.concatenate(steps, axis=1) - full)) < EXACT


def test_flash_refuses_what_its_kernels_cannot_do():
    layer = GroupedQueryAttention(
        8, 2, 1, rope_base=1e4, window=4, flash=True
    )
    with pytest.raises(ValueError, match="StreamingLLM cache"):
        layer.forward(
            np.ones((1, 2, 8)), kv_cache=KVCache(window=4, sink_tokens=1)
        )
    with pytest.raises(AttributeError, match="not kept with flash=True"):
        _ = layer.attention_weights
