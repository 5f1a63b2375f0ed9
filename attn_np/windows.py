"""Sliding windows and sink logits, for one attention call (chapter 8).

``window=W`` lets the query at position i attend keys ``i - W < j <= i``
only (:func:`~attn_np.position_mask`). A sink logit ``a_i`` joins row i's
softmax as one more column with no value (gpt-oss)::

    [P, p_sink] = softmax([S, a])  row-wise   -> [L_q, L_k], [L_q, 1]
    da = -p_sink * rowsum(dO * O)             -> [L_q, 1]

and dS keeps chapter 1's form: the sink's column of dP is 0. The layers
get both from the grouped core (:mod:`attn_np.grouped`); these two
functions are the chapter's formula on any leading axes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import check_scores, check_sinks, fingerprint
from .attention import (
    AttentionCache,
    _check_inputs,
    attention_backward,
    unbroadcast,
)
from .softmax import masked_softmax, sink_softmax


@dataclass
class WindowCache(AttentionCache):
    """:class:`~attn_np.AttentionCache` plus the sink logits and
    ``p_sink``."""

    sinks: np.ndarray | None = None  # broadcasts to [..., L_q, 1]
    sink_weights: np.ndarray | None = None  # [..., L_q, 1]: p_sink


def window_attention_forward(
    q, k, v, *, window=None, sinks=None, mask=None, causal=False, scale=None
):
    """:func:`~attn_np.attention_forward` with a sliding window ``W``
    (needs ``causal=True``) and sink logits ``sinks`` (broadcastable to
    ``[..., L_q, 1]``, one per query row); ``(out, cache)``. A row with no
    key to attend puts all its mass on the sink (zeros without one)."""
    q, k, v, allowed, scale = _check_inputs(
        q, k, v, mask, causal, scale, window=window
    )
    with np.errstate(over="ignore", invalid="ignore"):  # checked below
        # [..., L_q, d_k] @ [..., d_k, L_k] -> [..., L_q, L_k]
        scores = (q * scale) @ k.swapaxes(-1, -2)
    check_scores(scores, scale)
    p_sink = None
    if sinks is None:
        p = masked_softmax(scores, allowed, -1, overwrite=True)
    else:
        rows = scores.shape[:-1] + (1,)
        sinks = check_sinks(sinks, rows, "[..., L_q, 1]")
        # [..., L_q, L_k] and [..., L_q, 1]
        p, p_sink = sink_softmax(scores, sinks, allowed, overwrite=True)
    out = p @ v  # [..., L_q, L_k] @ [..., L_k, d_v] -> [..., L_q, d_v]
    out.flags.writeable = p.flags.writeable = False  # the cache's own
    saved = fingerprint(q, k, v)  # the backward refuses them changed
    return out, WindowCache(q, k, v, out, p, scale, saved, sinks, p_sink)


def window_attention_backward(dout, cache: WindowCache):
    """``(dq, dk, dv)``, and ``dsinks`` after them if the forward had
    sinks."""
    grads = attention_backward(dout, cache)  # dS keeps its form
    if cache.sinks is None:
        return grads
    inner = np.sum(dout * cache.out, axis=-1, keepdims=True)  # [.., L_q, 1]
    # the sink's dP is 0: da = p_sink * (0 - rowsum) -> [..., L_q, 1]
    dsinks = -cache.sink_weights * inner
    return grads + (unbroadcast(dsinks, cache.sinks.shape),)
