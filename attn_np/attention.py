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

Sliding windows and sink logits (chapter 8). ``window=W`` lets the query
at position i attend keys ``i - W < j <= i`` only. A sink logit ``a_i``
joins row i's softmax as one more column with no value (gpt-oss)::

    [P, p_sink] = softmax([S, a])  row-wise   -> [L_q, L_k], [L_q, 1]
    da = -p_sink * rowsum(dO * O)             -> [L_q, 1]

and dS keeps its form: the sink's column of dP is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import (
    as_float_array,
    broadcast_shapes,
    check_finite,
    check_mask,
    check_positive_int,
    check_same_shape,
)
from .softmax import masked_softmax, sink_softmax


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
    sinks: np.ndarray | None = None  # sink logits, -> [..., L_q, 1]
    sink_weights: np.ndarray | None = None  # [..., L_q, 1]: p_sink


def causal_mask(L_q: int, L_k: int, *, window=None) -> np.ndarray:
    """Boolean ``[L_q, L_k]`` mask, True where query ``i`` may attend key
    ``j``.

    The last query aligns with the last key: query ``i`` sits at absolute
    position ``i + (L_k - L_q)`` and may attend every key up to and including
    that position. With ``L_q == L_k`` this is the usual lower triangle; with
    ``L_q < L_k`` (a chunk of new queries over a longer key/value cache)
    every query also sees the whole cache before the chunk. With
    ``window=W`` it sees only the last ``W`` of them, itself included.
    """
    offset = L_k - L_q
    # query positions [L_q] and key positions [L_k]
    return position_mask(
        np.arange(L_q) + offset, np.arange(L_k), window=window
    )


def position_mask(q_positions, k_positions, *, window=None, sink_tokens=0):
    """``[L_q, L_k]`` bool from absolute positions: may query i attend key
    j?

    Causal, ``j <= i``; with ``window=W`` also ``j > i - W`` (W keys,
    itself included: Hugging Face's ``sliding_window = W``,
    FlashAttention's ``window_size = (W - 1, 0)``). With ``sink_tokens=S``
    (StreamingLLM) positions ``j < S`` stay visible and the window keeps
    the last ``W - S`` keys, so a query still sees at most W keys.
    """
    i = np.asarray(q_positions)[:, None]  # [L_q, 1]
    j = np.asarray(k_positions)[None, :]  # [1, L_k]
    allowed = j <= i  # [L_q, L_k]
    if window is not None:
        allowed &= (j > i - (window - sink_tokens)) | (j < sink_tokens)
    return allowed


def attention_forward(
    q,
    k,
    v,
    *,
    mask=None,
    causal: bool = False,
    scale: float | None = None,
    window: int | None = None,
    sinks=None,
    check_finite: bool = True,
):
    """Scaled dot-product attention; returns ``(out, cache)``.

    Parameters
    ----------
    q : float array ``[..., L_q, d_k]``
    k : float array ``[..., L_k, d_k]``
    v : float array ``[..., L_k, d_v]``
        Leading axes broadcast against each other, so several query heads
        can share one key/value head without a copy (give the key/value a
        size-1 axis there).
    mask : bool array broadcastable to ``[..., L_q, L_k]``, optional
        True where a query may attend a key.
    causal : bool
        Also forbid keys after each query's position, aligning the last
        query with the last key.
    scale : float, optional
        Multiplies the scores; defaults to ``1 / sqrt(d_k)`` (Vaswani et
        al. 2017).
    window : int, optional
        Sliding window ``W`` (needs ``causal=True``): the query at position
        ``i`` attends keys ``i - W < j <= i``, W keys including itself.
    sinks : float array broadcastable to ``[..., L_q, 1]``, optional
        One sink logit per query row: it joins the row's softmax as an
        extra column without a value, so a row may put mass on nothing.
    check_finite : bool
        Refuse NaN or inf in ``q``, ``k`` and ``v`` (as ``scipy.linalg``
        does). The layers check their input ``x`` once and pass False:
        a decode step would otherwise re-read the whole cache to check it.

    A query with no key to attend (all masked) gets a zero output row and
    zero gradients (with a sink, all its mass goes to the sink).
    """
    q, k, v, allowed, scale = _check_inputs(
        q, k, v, mask, causal, scale, check_finite, window=window
    )
    # [..., L_q, d_k] @ [..., d_k, L_k] -> [..., L_q, L_k]
    scores = (q * scale) @ k.swapaxes(-1, -2)
    p_sink = None
    if sinks is None:
        # [..., L_q, L_k]
        p = masked_softmax(scores, allowed, -1, overwrite=True)
    else:
        sinks = _check_sinks(sinks, scores.shape)
        # [..., L_q, L_k] and [..., L_q, 1]
        p, p_sink = sink_softmax(scores, sinks, allowed, overwrite=True)
    out = p @ v  # [..., L_q, L_k] @ [..., L_k, d_v] -> [..., L_q, d_v]
    return out, AttentionCache(
        q=q,
        k=k,
        v=v,
        out=out,
        weights=p,
        scale=scale,
        sinks=sinks,
        sink_weights=p_sink,
    )


def attention_backward(dout, cache: AttentionCache):
    """Gradients ``(dq, dk, dv)``, each with the shape of its input
    (broadcast axes summed); ``(dq, dk, dv, dsinks)`` if the forward had
    ``sinks``."""
    dout = as_float_array(dout, "dout")
    check_same_shape(dout, "dout", cache.out.shape, "the attention output")
    p, q, k, v, scale = cache.weights, cache.q, cache.k, cache.v, cache.scale
    # [..., L_k, L_q] @ [..., L_q, d_v] -> [..., L_k, d_v]
    dv = p.swapaxes(-1, -2) @ dout
    # dP: [..., L_q, d_v] @ [..., d_v, L_k] -> [..., L_q, L_k]
    ds = dout @ v.swapaxes(-1, -2)
    # rowsum(P*dP) = rowsum(dO*O): [..., L_q, 1]
    inner = np.sum(dout * cache.out, axis=-1, keepdims=True)
    ds -= inner
    # dS = P * (dP - rowsum): zero wherever P is zero (masked keys, empty
    # rows)
    ds *= p
    # [..., L_q, L_k] @ [..., L_k, d_k] -> [..., L_q, d_k]
    dq = (ds @ k) * scale
    # [..., L_k, L_q] @ [..., L_q, d_k] -> [..., L_k, d_k]
    dk = (ds.swapaxes(-1, -2) @ q) * scale
    grads = (
        unbroadcast(dq, q.shape),
        unbroadcast(dk, k.shape),
        unbroadcast(dv, v.shape),
    )
    if cache.sinks is None:
        return grads
    # the sink's dP is 0: da = p_sink * (0 - rowsum) -> [..., L_q, 1]
    dsinks = -cache.sink_weights * inner
    return grads + (unbroadcast(dsinks, cache.sinks.shape),)


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the axes that broadcasting added or stretched,
    giving it ``shape``.

    This is the backward of broadcasting: an input used by several outputs
    (one key/value head read by several query heads) receives the sum of
    their gradients.
    """
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(
        i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1
    )
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad


def _check_inputs(q, k, v, mask, causal, scale, finite=True, window=None):
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
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)
    elif (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float, np.floating, np.integer))
        or not (math.isfinite(scale) and scale > 0)
    ):
        raise ValueError(
            f"scale must be a positive finite number, got {scale!r}"
        )
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
    return q, k, v, allowed, float(scale)


def check_window(window, causal=True):
    """``None`` or a positive int ``W``; a window needs ``causal=True``."""
    if window is None:
        return None
    window = check_positive_int(window, "window")
    if not causal:
        raise ValueError(
            f"window={window} needs causal=True: a query attends the W "
            "keys that end at its own position"
        )
    return window


def _check_sinks(sinks, scores_shape):
    """Sink logits as a finite float array broadcastable to ``[..., L_q,
    1]``."""
    sinks = as_float_array(sinks, "sinks")
    check_finite(sinks, "sinks")
    rows = scores_shape[:-1] + (1,)
    try:
        ok = np.broadcast_shapes(sinks.shape, rows) == rows
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"sinks must broadcast to [..., L_q, 1] = {rows} (one logit "
            f"per query row), got sinks of shape {sinks.shape}"
        )
    return sinks
