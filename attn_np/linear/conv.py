"""The short causal convolution and its SiLU (chapter 12), each with its
backward: a depthwise filter of ``K`` taps over each channel's last ``K``
inputs, as Qwen3-Next and FLA run on ``q``, ``k`` and ``v``."""

from __future__ import annotations

import numpy as np

from .._checks import (
    as_float_array,
    check_backward_cache,
    check_finite,
    check_upstream,
)
from ..softmax import sigmoid


def silu(x):
    """``x * sigmoid(x)``."""
    y = sigmoid(x)
    y *= x
    return y


def silu_backward(dy, x):
    """``d silu / dx = s (1 + x (1 - s))``, ``s = sigmoid(x)``."""
    s = sigmoid(x)
    d = np.subtract(1.0, s, dtype=s.dtype)  # 1 - s
    d *= x
    d += 1.0
    d *= s
    d *= dy
    return d


def causal_conv_forward(x, w, prev=None):
    """Depthwise causal convolution then SiLU, Qwen3-Next's short
    convolution.

    ``x [B, L, ch]``, ``w [K, ch]``, ``prev [B, K-1, ch]`` the inputs
    before the chunk (zeros: the sequence starts here). With ``xp =
    [prev, x]``, ``y_t = silu(sum_j w_j * xp_{t+j})``: ``w[K-1]`` weighs
    the current token. ``K`` shifted multiply-adds over whole arrays, no
    loop over tokens. Returns ``(y [B, L, ch], (xp, w, pre))``; the last
    ``K - 1`` rows of ``xp`` are the next chunk's ``prev``.
    """
    x = as_float_array(x, "x")
    w = as_float_array(w, "w")
    if x.ndim != 3 or w.ndim != 2 or w.shape[1] != x.shape[2] or not len(w):
        raise ValueError(
            "x must be [B, L, ch] and w [K, ch] with K >= 1, got x "
            f"{x.shape} and w {w.shape}"
        )
    check_finite(x, "x")
    check_finite(w, "w")
    if prev is not None:
        prev = as_float_array(prev, "prev")
        want = (x.shape[0], w.shape[0] - 1, x.shape[2])
        if prev.shape != want:
            raise ValueError(
                f"prev must have shape [B, K-1, ch] = {want}, got "
                f"{prev.shape}"
            )
        check_finite(prev, "prev")
    K = w.shape[0]
    B, L, ch = x.shape
    dtype = np.result_type(x, w)
    xp = np.empty((B, K - 1 + L, ch), dtype=dtype)  # [prev, x]
    xp[:, : K - 1] = 0.0 if prev is None else prev
    xp[:, K - 1 :] = x
    pre = np.multiply(xp[:, K - 1 :], w[K - 1])  # the current token
    tmp = np.empty_like(pre)
    for j in range(K - 1):  # the K - 1 earlier ones
        np.multiply(xp[:, j : j + L], w[j], out=tmp)  # [B, L, ch] * [ch]
        pre += tmp
    return silu(pre), (xp, w, pre)


def causal_conv_backward(dy, cache):
    """``(dx, dw)`` of :func:`causal_conv_forward` (``prev`` is a constant:
    a cached input). Input ``i`` feeds outputs ``i + m``, ``m = 0 .. K-1``,
    through ``w[K-1-m]``: ``dx_i = sum_m w[K-1-m] dpre_(i+m)``."""
    check_backward_cache(cache, tuple, "causal_conv_forward", 3)
    xp, w, pre = cache
    K, L = w.shape[0], pre.shape[1]
    dy = check_upstream(dy, "dy", pre.shape, "the convolution's output")
    dpre = silu_backward(dy, pre)  # [B, L, ch]
    dx = np.multiply(dpre, w[K - 1])
    tmp = np.empty_like(dpre)
    dw = np.empty_like(w)
    for j in range(K):
        np.multiply(dpre, xp[:, j : j + L], out=tmp)
        dw[j] = tmp.sum(axis=(0, 1))
        m = K - 1 - j
        if 0 < m < L:
            # [B, L-m, ch] += [ch] * [B, L-m, ch]
            np.multiply(dpre[:, m:], w[j], out=tmp[:, : L - m])
            dx[:, : L - m] += tmp[:, : L - m]
    return dx, dw
