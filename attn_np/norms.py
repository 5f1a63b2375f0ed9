"""RMSNorm, forward and backward (chapter 5; MLA's latent norm in chapter 7).

Zhang & Sennrich (2019), over the last axis, with a learned gain ``g``::

    y = g * x * r,        r = 1 / sqrt(mean(x^2) + eps)
    dx = r * (u - x * r^2 * mean(u * x)),   u = dy * g
    dg = sum_rows dy * x * r
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import (
    as_float_array,
    check_backward_cache,
    check_finite,
    check_norm_input,
    check_overflow,
    check_positive_number,
    check_upstream,
)


@dataclass
class RMSNormCache:
    x: np.ndarray  # [..., d]
    r: np.ndarray  # [..., 1]: 1 / rms(x)
    g: np.ndarray  # [d]


def rmsnorm_forward(x, g, *, eps: float = 1e-6):
    """RMSNorm (Zhang & Sennrich 2019): ``y = g * x / sqrt(mean(x^2) + eps)``
    over the last axis."""
    x = as_float_array(x, "x", min_ndim=1)
    g = as_float_array(g, "g", min_ndim=1)
    check_finite(x, "x")
    check_finite(g, "g")
    eps = 0.0 if eps == 0 else check_positive_number(eps, "eps")
    if g.shape != x.shape[-1:]:
        raise ValueError(
            f"g must have shape {x.shape[-1:]} (the last axis of x "
            f"{x.shape}), got {g.shape}"
        )
    # [..., d] -> [..., 1]
    with np.errstate(over="ignore"):  # checked below
        ms = np.mean(x * x, axis=-1, keepdims=True) + eps
    check_overflow(ms, "mean(x^2)", "x is too large for the dtype")
    r = 1.0 / np.sqrt(ms)
    y = x * r * g  # [..., d] * [..., 1] * [d] -> [..., d]
    return y, RMSNormCache(x=x, r=r, g=g)


def rmsnorm_step(x, g, *, eps: float = 1e-6):
    """The forward alone, keeping nothing and checking nothing (a decode
    step): ``y``, the same numbers as :func:`rmsnorm_forward`'s.

    A decode step normalises one position of 576 numbers sixty times;
    at that size the checks of :func:`rmsnorm_forward` (finite input and
    gain, shapes, overflow) cost more than the arithmetic. The model that
    calls this has checked what enters it (its token ids; its weights
    when loaded), so the step does not check again.
    """
    ms = np.mean(x * x, axis=-1, keepdims=True) + eps  # [..., 1]
    return x * (1.0 / np.sqrt(ms)) * g  # [..., d]


def rmsnorm_backward(dy, cache: RMSNormCache):
    """``(dx, dg)``. With ``u = dy * g``: ``dx = r * (u - x * r^2 * mean(u *
    x))``, ``dg = sum dy * x * r``."""
    check_backward_cache(cache, RMSNormCache, "rmsnorm_forward")
    x, r, g = cache.x, cache.r, cache.g
    dy = check_upstream(dy, "dy", x.shape, "the RMSNorm output")
    u = dy * g  # dL/d(x r): [..., d]
    # [..., d]
    dx = r * (u - x * (r * r) * np.mean(u * x, axis=-1, keepdims=True))
    dg = (dy * x * r).reshape(-1, x.shape[-1]).sum(axis=0)  # [N, d] -> [d]
    return dx, dg


def qk_norm_forward(t, w=None, *, eps=1e-6, offset=0.0):
    """QK-norm (chapters 10 and 11): RMSNorm over the last axis with gain
    ``offset + w``; ``(y, cache)``.

    ``offset=1`` is Gemma's and Qwen3-Next's form (``w`` starts at 0);
    ``w=None`` is the parameter-free form (Llama 4's L2Norm, ``y = x r``).
    Apply it to ``[..., n_heads, d_head]`` for the per-head form (Qwen3,
    Qwen3-Next, Gemma 3) or to ``[..., n_heads * d_head]`` before the head
    split (OLMo 2).
    """
    t, eps = check_norm_input(t, "t", eps)
    # [..., d] -> [..., 1]
    with np.errstate(over="ignore"):  # checked below
        ms = np.mean(t * t, axis=-1, keepdims=True) + eps
    check_overflow(ms, "mean(t^2)", "t is too large for the dtype")
    r = 1.0 / np.sqrt(ms)
    if w is not None:
        w = as_float_array(w, "w", min_ndim=1)
        check_finite(w, "w")
        if w.shape != t.shape[-1:]:
            raise ValueError(
                f"w must have shape {t.shape[-1:]} (the last axis of t "
                f"{t.shape}), got {w.shape}"
            )
    g = 1.0 if w is None else offset + w  # 1 or [d]
    return t * r * g, (t, r, g, w is not None)


def qk_norm_backward(dy, cache):
    """``(dt, dw)``, ``dw`` None for the parameter-free form. With ``u =
    dy g``: ``dt = r (u - t r^2 mean(u t))``, ``dw = sum dy t r``."""
    check_backward_cache(cache, tuple, "qk_norm_forward", 4)
    t, r, g, learned = cache
    dy = check_upstream(dy, "dy", t.shape, "the normalised output")
    u = dy * g  # [..., d]
    dt = r * (u - t * (r * r) * np.mean(u * t, axis=-1, keepdims=True))
    dw = (
        (dy * t * r).reshape(-1, t.shape[-1]).sum(axis=0)
        if learned
        else None
    )
    return dt, dw
