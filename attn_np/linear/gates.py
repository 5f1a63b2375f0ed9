"""The small per-token parts of a Gated DeltaNet layer (chapter 12), each
with its backward: the sigmoid of ``beta``, the softplus of the decay,
and the L2 norm of ``q`` and ``k``."""

from __future__ import annotations

import numpy as np

from .._checks import (
    check_backward_cache,
    check_norm_input,
    check_overflow,
    check_upstream,
)


def softplus(x):
    """``log(1 + e^x)``, computed without overflow."""
    return np.logaddexp(0.0, x)


def l2norm_forward(x, eps=1e-6):
    """``x / sqrt(sum(x^2) + eps)`` over the last axis (the ``l2norm`` of
    FLA and Hugging Face, ``eps`` inside the root)."""
    x, eps = check_norm_input(x, "x", eps)
    # [..., d] . [..., d] -> [..., 1]
    with np.errstate(over="ignore"):  # checked below
        r = np.einsum("...d,...d->...", x, x)[..., None]
    check_overflow(r, "sum(x^2) in l2norm", "x is too large for the dtype")
    r += eps
    np.sqrt(r, out=r)
    np.divide(1.0, r, out=r)
    y = x * r
    return y, (y, r)


def l2norm_backward(dy, cache):
    """``dx = r (dy - y (y . dy))``."""
    check_backward_cache(cache, tuple, "l2norm_forward", 2)
    y, r = cache
    dy = check_upstream(dy, "dy", y.shape, "the L2-normalised output")
    yd = np.einsum("...d,...d->...", y, dy)[..., None]  # [..., 1]
    dx = y * yd
    np.subtract(dy, dx, out=dx)
    dx *= r
    return dx
