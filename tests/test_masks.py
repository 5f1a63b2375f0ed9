"""attn_np.masks: the one causal rule (position_mask) and chapter 1's causal_mask, against their
definitions and the published conventions (FlashAttention's window_size, Hugging Face's
sliding_window, StreamingLLM's sink tokens)."""

import numpy as np
import pytest
from test_windows import window_by_definition

from attn_np import causal_mask, position_mask


def flash_window(L_q, L_k, left, right):
    """FlashAttention's window_size=(left, right) (docstring of flash_attn_func): query i attends
    keys in [i - left, i + right] inclusive, bottom-right aligned like our causal mask."""
    i = np.arange(L_q)[:, None] + L_k - L_q
    j = np.arange(L_k)[None, :]
    return (j >= i - left) & (j <= i + right)


def hf_sliding_window(L, sliding_window):
    """Hugging Face's eager mask for sliding_window (AttentionMaskConverter, issue #29623): causal
    and kv_idx > q_idx - sliding_window."""
    q = np.arange(L)[:, None]
    kv = np.arange(L)[None, :]
    return (kv <= q) & (kv > q - sliding_window)


# --------------------------------------------------------------------------- causal masks
def test_causal_mask_square_is_the_lower_triangle():
    np.testing.assert_array_equal(
        causal_mask(4, 4), np.tril(np.ones((4, 4), bool))
    )


def test_causal_mask_aligns_the_last_query_with_the_last_key():
    expected = np.array(
        [
            [1, 1, 1, 0, 0],  # query 0 sits at position 2 of 5
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1],  # the last query sees every key
        ],
        bool,
    )
    np.testing.assert_array_equal(causal_mask(3, 5), expected)
    np.testing.assert_array_equal(causal_mask(1, 5), np.ones((1, 5), bool))
    # more queries than keys: the first queries come before every key and see nothing
    np.testing.assert_array_equal(
        causal_mask(3, 2), np.array([[0, 0], [1, 0], [1, 1]], bool)
    )


# --------------------------------------------------------------------------- the window's semantics
@pytest.mark.parametrize(
    "L_q, L_k, W",
    [
        (6, 6, 1),
        (6, 6, 3),
        (6, 6, 6),
        (6, 6, 9),
        (2, 9, 4),
        (9, 4, 2),
        (1, 7, 3),
    ],
)
def test_window_mask_is_the_definition(L_q, L_k, W):
    m = causal_mask(L_q, L_k, window=W)
    np.testing.assert_array_equal(m, window_by_definition(L_q, L_k, W))
    # FlashAttention's window_size = (W - 1, 0) is the same mask; (W, 0) is one key wider
    np.testing.assert_array_equal(m, flash_window(L_q, L_k, W - 1, 0))
    if W < L_k:
        assert not np.array_equal(m, flash_window(L_q, L_k, W, 0))


@pytest.mark.parametrize("W", [1, 2, 5, 12])
def test_window_equals_hugging_face_sliding_window(W):
    np.testing.assert_array_equal(
        causal_mask(12, 12, window=W), hf_sliding_window(12, W)
    )
    # every row sees min(i + 1, W) keys, itself included
    np.testing.assert_array_equal(
        causal_mask(12, 12, window=W).sum(axis=1),
        np.minimum(np.arange(12) + 1, W),
    )


def test_position_mask_with_sinks_is_streaming_llm():
    """StreamingLLM: positions < S always visible, plus the last W - S, so W keys in all."""
    W, S, L = 5, 2, 11
    m = position_mask(np.arange(L), np.arange(L), window=W, sink_tokens=S)
    for i in range(L):
        want = {j for j in range(i + 1) if j < S or j > i - (W - S)}
        assert set(np.flatnonzero(m[i])) == want
        assert m[i].sum() == min(i + 1, W)
