"""Scaled dot-product attention, forward and backward (chapter 1).

Forward, for one head (leading axes broadcast)::

    S = Q K^T * scale          [L_q, d_k] @ [d_k, L_k] -> [L_q, L_k]
    P = softmax(S, mask)       row-wise over keys      -> [L_q, L_k]
    O = P V                    [L_q, L_k] @ [L_k, d_v] -> [L_q, d_v]

Backward, given dO = dL/dO::

    dV = P^T dO                [L_k, L_q] @ [L_q, d_v] -> [L_k, d_v]
    dP = dO V^T                [L_q, d_v] @ [d_v, L_k] -> [L_q, L_k]
    dS = P * (dP - rowsum(dO * O))                     -> [L_q, L_k]
    dQ = dS K * scale          [L_q, L_k] @ [L_k, d_k] -> [L_q, d_k]
    dK = dS^T Q * scale        [L_k, L_q] @ [L_q, d_k] -> [L_k, d_k]

``rowsum(P * dP)`` equals ``rowsum(dO * O)`` because ``sum_j P_ij dP_ij =
dO_i . sum_j P_ij V_j = dO_i . O_i``; the right-hand side costs O(L_q d_v)
instead of O(L_q L_k).

The layers call the grouped core (:mod:`attn_np.grouped`), which owns how
query heads meet key/value heads; sliding windows and sink logits are
chapter 8's (:mod:`attn_np.windows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import (
    all_finite,
    as_float_array,
    broadcast_shapes,
    check_finite,
    check_flag,
    check_mask,
    check_scale,
    check_scores,
    check_unchanged,
    check_upstream,
    check_window,
    fingerprint,
)
from .masks import causal_mask, mask_for, position_mask
from .softmax import masked_softmax

__all__ = [
    "AttentionCache",
    "attention_backward",
    "attention_forward",
    "causal_mask",
    "check_window",
    "position_mask",
    "unbroadcast",
]


@dataclass
class AttentionCache:
    """Everything :func:`attention_backward` needs; ``weights`` is P, ready
    to plot."""

    q: np.ndarray  # [..., L_q, d_k]
    k: np.ndarray  # [..., L_k, d_k]
    v: np.ndarray  # [..., L_k, d_v]
    out: np.ndarray  # [..., L_q, d_v]
    # [..., L_q, L_k], rows sum to 1 (or are all 0 where nothing is allowed)
    weights: np.ndarray
    scale: float
    # checksums of q, k and v: the backward refuses them changed in place
    inputs: tuple = ()


def attention_forward(q, k, v, *, mask=None, causal=False, scale=None):
    """Scaled dot-product attention; returns ``(out, cache)``.

    ``q [..., L_q, d_k]``, ``k [..., L_k, d_k]``, ``v [..., L_k, d_v]``:
    leading axes broadcast, so several query heads can share one
    key/value head without a copy. ``mask`` (bool, broadcastable to
    ``[..., L_q, L_k]``, or a mask function ``(b, h, q_idx, kv_idx) ->
    bool``, :func:`~attn_np.masks.create_mask`) is True where a query may
    attend a key;
    ``causal=True`` also forbids keys after each query (the last query
    aligned with the last key); ``scale`` defaults to ``1 / sqrt(d_k)``
    (Vaswani et al. 2017). A query with no key to attend gets a zero
    output row and zero gradients. Scores that overflow the dtype (finite
    inputs whose products exceed it) raise a ``ValueError``.

    The cache keeps ``q``, ``k`` and ``v`` themselves, not copies: the
    returned ``out`` (and ``cache.weights``) are read-only, and
    :func:`attention_backward` raises a ``ValueError`` if ``q``, ``k`` or
    ``v`` were changed in place after the forward (a checksum of each is
    kept), instead of returning wrong gradients.
    """
    if callable(mask):  # a mask function (chapter 16): on the grid
        mask = mask_for(mask, np.shape(q), np.shape(k)[-2])
    q, k, v, allowed, scale = _check_inputs(q, k, v, mask, causal, scale)
    with np.errstate(over="ignore", invalid="ignore"):  # checked below
        # [..., L_q, d_k] @ [..., d_k, L_k] -> [..., L_q, L_k]
        scores = (q * scale) @ k.swapaxes(-1, -2)
    check_scores(scores, scale)
    # [..., L_q, L_k]: the scores' own memory becomes P
    p = masked_softmax(scores, allowed, -1, overwrite=True)
    out = p @ v  # [..., L_q, L_k] @ [..., L_k, d_v] -> [..., L_q, d_v]
    out.flags.writeable = p.flags.writeable = False
    saved = fingerprint(q, k, v)
    return out, AttentionCache(q, k, v, out, p, scale, saved)


def attention_backward(dout, cache: AttentionCache):
    """Gradients ``(dq, dk, dv)``, each with the shape of its input
    (broadcast axes summed)."""
    if not isinstance(cache, AttentionCache):
        raise TypeError(
            "cache must be the AttentionCache of attention_forward, got "
            f"{type(cache).__name__}"
        )
    dout = check_upstream(
        dout, "dout", cache.out.shape, "the attention output"
    )
    check_unchanged(
        cache.inputs,
        {"q": cache.q, "k": cache.k, "v": cache.v},
        "attention_backward",
    )
    p, q, k, v, scale = cache.weights, cache.q, cache.k, cache.v, cache.scale
    # [..., L_k, L_q] @ [..., L_q, d_v] -> [..., L_k, d_v]
    dv = p.swapaxes(-1, -2) @ dout
    # dP: [..., L_q, d_v] @ [..., d_v, L_k] -> [..., L_q, L_k]
    ds = dout @ v.swapaxes(-1, -2)
    # rowsum(P*dP) = rowsum(dO*O): [..., L_q, 1]
    ds -= np.sum(dout * cache.out, axis=-1, keepdims=True)
    # dS = P * (dP - rowsum): zero wherever P is zero (masked keys, empty
    # rows)
    ds *= p
    # [..., L_q, L_k] @ [..., L_k, d_k] -> [..., L_q, d_k]
    dq = (ds @ k) * scale
    # [..., L_k, L_q] @ [..., L_q, d_k] -> [..., L_k, d_k]
    dk = (ds.swapaxes(-1, -2) @ q) * scale
    return (
        unbroadcast(dq, q.shape),
        unbroadcast(dk, k.shape),
        unbroadcast(dv, v.shape),
    )


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the axes that broadcasting added or stretched,
    giving it ``shape``.

    This is the backward of broadcasting: an input used by several outputs
    (one key/value head read by several query heads) receives the sum of
    their gradients.
    """
    grad = as_float_array(grad, "grad")
    try:
        shape = tuple(int(n) for n in shape)
    except TypeError:
        raise TypeError(
            f"shape must be a tuple of ints, got {shape!r}"
        ) from None
    try:
        fits = np.broadcast_shapes(shape, grad.shape) == grad.shape
    except ValueError:
        fits = False
    if not fits or min(shape, default=0) < 0:
        raise ValueError(
            f"shape {shape} must broadcast to the shape of grad "
            f"{grad.shape} (the input's shape before broadcasting)"
        )
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(
        i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1
    )
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    if not all_finite(grad):  # NaN and inf survive the sums: 2 reductions
        check_finite(grad, "grad")
    return grad


def _check_inputs(q, k, v, mask, causal, scale, finite=True, window=None):
    """The checks of :func:`attention_forward` (and of chapter 8's and 9's
    kernels, which take the same inputs): ``(q, k, v, allowed, scale)``
    with the causal (or window) rule folded into ``allowed``."""
    causal = check_flag(causal, "causal")
    q = as_float_array(q, "q", min_ndim=2)
    k = as_float_array(k, "k", min_ndim=2)
    v = as_float_array(v, "v", min_ndim=2)
    for name, t in (("q", q), ("k", k), ("v", v)) if finite else ():
        check_finite(t, name)
    (L_q, d_k), (L_k, d_k2), L_v = q.shape[-2:], k.shape[-2:], v.shape[-2]
    if d_k != d_k2:
        raise ValueError(
            f"q and k must have the same last axis d_k, got q {q.shape} "
            f"and k {k.shape}"
        )
    if L_k != L_v:
        raise ValueError(
            "k and v must have the same number of keys L_k (axis -2), got "
            f"k {k.shape} and v {v.shape}"
        )
    if L_k == 0:
        raise ValueError(
            f"k and v must hold at least one key, got k {k.shape} and v "
            f"{v.shape}"
        )
    if d_k == 0:
        raise ValueError(
            f"q and k must have d_k >= 1, got q {q.shape} and k {k.shape}"
        )
    batch = broadcast_shapes(
        {"q": q.shape[:-2], "k": k.shape[:-2], "v": v.shape[:-2]},
        "the leading (batch/head) axes of q, k and v",
    )
    scale = check_scale(scale, d_k)
    allowed = None
    if mask is not None:
        allowed = check_mask(
            mask,
            batch + (L_q, L_k),
            f"[..., L_q, L_k] (from q {q.shape} and k {k.shape})",
        )
    window = check_window(window, causal)
    # a single query aligned with the last key may attend every key
    if causal and (L_q > 1 or (window is not None and window < L_k)):
        c = causal_mask(L_q, L_k, window=window)
        allowed = c if allowed is None else allowed & c
    return q, k, v, allowed, scale
