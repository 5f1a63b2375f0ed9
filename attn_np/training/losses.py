"""Softmax cross-entropy over a vocabulary, forward and backward (chapter 5).

Forward, for logits ``z [..., V]``, integer targets ``t [...]`` and a boolean
``mask [...]`` that selects the positions that count (``N`` of them)::

    log p = z - logsumexp(z)                              [..., V]
    loss  = -(1/N) sum_{masked n} log p[n, t_n]           a scalar

``logsumexp(z) = m + log sum exp(z - m)`` with ``m = max z`` never overflows.
Backward::

    dz = dloss * (softmax(z) - onehot(t)) * mask / N      [..., V]

The softmax's Jacobian and the log's ``1/p`` cancel, which is why the two are
fused here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import (
    as_bool_array,
    as_float_array,
    check_finite,
    check_upstream,
)
from .layers import check_token_ids


@dataclass
class CrossEntropyCache:
    p: np.ndarray  # [..., V] softmax of the logits
    targets: np.ndarray  # [...] int
    weight: np.ndarray  # [...] mask / N


def cross_entropy_forward(logits, targets, *, mask=None):
    """Mean cross-entropy over the positions where ``mask`` is True (all if
    ``mask`` is None).

    Returns ``(loss, cache)`` with ``loss`` a float. Targets at unmasked
    positions are not read, so they may hold any valid id (for instance 0).
    """
    z = as_float_array(logits, "logits", min_ndim=1)
    check_finite(z, "logits")
    t = np.asarray(targets)
    if t.shape != z.shape[:-1]:
        raise ValueError(
            "targets must have the shape of logits without the vocabulary "
            f"axis {z.shape[:-1]}, "
            f"got targets {t.shape} for logits {z.shape}"
        )
    t = check_token_ids(t, z.shape[-1], "targets")
    if mask is None:
        m = np.ones(t.shape, dtype=bool)
    else:
        m = as_bool_array(mask, "mask")
        if m.shape != t.shape:
            raise ValueError(
                f"mask must have the shape of targets {t.shape}, got "
                f"{m.shape}"
            )
    n = int(m.sum())
    if n == 0:
        raise ValueError(
            "mask selects no position: the mean loss over zero positions "
            "is undefined"
        )
    shifted = z - z.max(axis=-1, keepdims=True)  # [..., V], every entry <= 0
    # [..., V] - [..., 1]
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    # log p[n, t_n]: [...]
    picked = np.take_along_axis(log_p, t[..., None], axis=-1)[..., 0]
    loss = -float(np.sum(picked[m], dtype=np.float64)) / n
    weight = m.astype(z.dtype) / n  # [...]
    return loss, CrossEntropyCache(p=np.exp(log_p), targets=t, weight=weight)


def cross_entropy_backward(dloss, cache: CrossEntropyCache):
    """``dlogits = dloss * (p - onehot(t)) * mask / N``, shape
    ``[..., V]``."""
    dloss = check_upstream(dloss, "dloss", (), "the loss (a number)")
    dz = cache.p.copy()  # [..., V]
    np.put_along_axis(
        dz,
        cache.targets[..., None],
        np.take_along_axis(dz, cache.targets[..., None], -1) - 1,
        -1,
    )
    dz *= (float(dloss) * cache.weight)[..., None]  # [..., V] * [..., 1]
    return dz


def accuracy(logits, targets, *, mask=None) -> float:
    """Fraction of the (masked) positions whose most likely token is the
    target."""
    z = as_float_array(logits, "logits", min_ndim=1)
    check_finite(z, "logits")
    t = np.asarray(targets)
    if t.shape != z.shape[:-1]:
        raise ValueError(
            f"targets must have shape {z.shape[:-1]}, got {t.shape}"
        )
    t = check_token_ids(t, z.shape[-1], "targets")
    hit = z.argmax(axis=-1) == t
    if mask is None:
        return float(hit.mean())
    m = as_bool_array(mask, "mask")
    if m.shape != t.shape:
        raise ValueError(
            f"mask must have the shape of targets {t.shape}, got {m.shape}"
        )
    return float(hit[m].mean())
