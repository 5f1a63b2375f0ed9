"""A softmax that cannot overflow, with an optional boolean mask, and its
backward.

Forward, along one axis of ``x``::

    p_j = exp(x_j - m) / sum_k exp(x_k - m),     m = max_k x_k

Subtracting the row maximum ``m`` changes nothing mathematically (it cancels
between numerator and denominator) but makes the largest exponent ``exp(0) =
1``, so nothing overflows, whatever the size of the logits.

With a mask (True where an entry takes part), masked entries get probability
exactly 0 and the maximum is taken over the unmasked entries only. A row with
no unmasked entry at all is defined to be all zeros (not NaN): nothing may be
attended, so nothing is.

Backward (the Jacobian-vector product of the softmax)::

    dx_j = p_j * (dp_j - sum_k p_k dp_k)

which is zero wherever ``p`` is zero, so masked entries and empty rows get
zero gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import (
    all_finite,
    as_bool_array,
    as_float_array,
    broadcast_shapes,
    broadcasts_to,
    check_finite,
    check_mask,
    check_upstream,
)


@dataclass
class SoftmaxCache:
    """What the backward needs: the probabilities and the axis they sum
    over."""

    p: np.ndarray
    axis: int


def softmax_forward(x, *, axis: int = -1, mask=None):
    """Softmax of ``x`` along ``axis``; returns ``(p, cache)``.

    ``mask`` is boolean and broadcastable to ``x.shape``; True marks the
    entries that take part.
    """
    x = as_float_array(x, "x", min_ndim=1)
    axis = _normalise_axis(axis, x.ndim)
    if x.shape[axis] == 0:
        raise ValueError(
            f"x must have at least one entry along axis={axis} (the axis "
            f"the softmax sums over), got shape {x.shape}"
        )
    if mask is None:
        _check_finite(x, None)
        p = masked_softmax(x, None, axis)
        return p, SoftmaxCache(p=p, axis=axis)

    mask = as_bool_array(mask, "mask")
    broadcast_shapes({"x": x.shape, "mask": mask.shape}, "x and mask")
    if np.broadcast_shapes(x.shape, mask.shape) != x.shape:
        raise ValueError(
            f"mask must broadcast to the shape of x {x.shape}, got mask of "
            f"shape {mask.shape}"
        )
    _check_finite(x, mask)
    p = masked_softmax(x, mask, axis)
    return p, SoftmaxCache(p=p, axis=axis)


def softmax(x, *, axis: int = -1, mask=None) -> np.ndarray:
    """The softmax probabilities alone (see :func:`softmax_forward`)."""
    return softmax_forward(x, axis=axis, mask=mask)[0]


def softmax_backward(dp, cache: SoftmaxCache) -> np.ndarray:
    """Gradient of the loss with respect to the logits ``x`` given ``dp =
    dL/dp``."""
    dp = check_upstream(dp, "dp", cache.p.shape, "the softmax output")
    p, axis = cache.p, cache.axis
    # sum_k p_k dp_k: [..., 1, ...]
    inner = np.sum(p * dp, axis=axis, keepdims=True)
    return p * (dp - inner)  # zero wherever p is zero


def masked_softmax(
    x: np.ndarray,
    mask: np.ndarray | None,
    axis: int,
    *,
    overwrite: bool = False,
) -> np.ndarray:
    """Overflow-free softmax along ``axis``; masked entries get 0 and empty
    rows come out as zeros.

    Masked logits become ``-inf`` before the maximum is taken, so they never
    win it, and ``exp(-inf) = 0`` gives them probability exactly 0 without
    any sentinel like ``-1e9``. A row with no allowed entry has maximum
    ``-inf``; it is shifted by 0 instead, its exponentials are all 0, and it
    is divided by 1, not 0, so it stays all zeros instead of turning into
    NaN. With ``overwrite=True`` the work is done in ``x``'s own memory
    (attention passes a fresh score array it no longer needs), which saves
    two passes over an [..., L_q, L_k] array.
    """
    in_place = overwrite and (
        mask is None or np.broadcast_shapes(mask.shape, x.shape) == x.shape
    )
    if in_place:
        s = x
        if mask is not None:
            # masked logits -> -inf, in place: no second [L, L] array
            np.copyto(s, -np.inf, where=~mask)
    elif mask is not None:
        # a fresh array (as large as x and mask broadcast): masked -> -inf
        s = np.where(mask, x, -np.inf)
    else:
        s = x.copy()
    # [..., 1, ...]: maxima over allowed entries
    m = row_max(s, axis)
    if mask is not None:
        m[~np.isfinite(m)] = 0.0  # empty rows: any finite shift will do
    s -= m  # every allowed exponent <= 0, so nothing overflows
    np.exp(s, out=s)  # masked entries: exp(-inf) = 0
    # >= 1 on every row with an allowed entry
    denom = np.sum(s, axis=axis, keepdims=True)
    if mask is not None:
        denom[denom == 0] = 1.0  # empty rows: 0 / 1 = 0, not NaN
    s /= denom
    return s


def sink_softmax(
    x: np.ndarray,
    sink: np.ndarray,
    mask: np.ndarray | None,
    *,
    overwrite: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over the last axis of ``x`` plus one sink logit per row;
    returns ``(p, p_sink)``.

    ``sink`` broadcasts to ``[..., 1]``: each row is ``softmax([x_row,
    a])`` with the sink's column dropped (gpt-oss), so the row sums to
    ``1 - p_sink <= 1``. The sink is finite and always allowed, so the
    shift ``m = max(max_j x_j, a)`` is finite and even a row with every
    entry masked is well defined: all its mass goes to the sink.
    ``x`` must be finite where it takes part (the layers check it once).
    """
    x = as_float_array(x, "x", min_ndim=1)
    sink = as_float_array(sink, "sink")
    check_finite(sink, "sink")
    rows = x.shape[:-1] + (1,)
    if not broadcasts_to(sink.shape, rows):
        raise ValueError(
            f"sink must broadcast to [..., 1] = {rows} (one logit per row "
            f"of x {x.shape}), got sink of shape {sink.shape}"
        )
    if x.shape[-1] == 0:
        raise ValueError(f"x must hold at least one entry, got {x.shape}")
    if mask is not None:
        mask = check_mask(mask, x.shape, "the shape of x")
    if overwrite and (
        mask is None or np.broadcast_shapes(mask.shape, x.shape) == x.shape
    ):
        s = x
        if mask is not None:
            np.copyto(s, -np.inf, where=~mask)  # masked logits -> -inf
    else:
        s = x.copy() if mask is None else np.where(mask, x, -np.inf)
    # [..., 1]: the shift covers the sink too, so every exponent is <= 0
    m = np.maximum(np.max(s, axis=-1, keepdims=True), sink)
    if not all_finite(m):  # NaN or +inf in x where it takes part
        check_finite(np.where(s == -np.inf, 0.0, s), "x")
    s -= m
    np.exp(s, out=s)  # masked entries: exp(-inf) = 0
    e_sink = np.exp(sink - m)  # [..., 1]
    denom = np.sum(s, axis=-1, keepdims=True) + e_sink  # >= 1
    s /= denom
    return s, e_sink / denom


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + e^-x)``, the softmax of ``[x, 0]``, in ``x``'s dtype:
    ``e^min(x, 0) / (1 + e^-|x|)``.

    No exponent is positive, so nothing overflows, and each side is the
    accurate form for its sign: ``1 / (1 + e^-x)`` for ``x >= 0``,
    ``e^x / (1 + e^x)`` for ``x < 0`` (where ``1 / (1 + e^-x)`` would
    overflow and ``(1 + tanh(x/2)) / 2`` would lose the small values to
    cancellation). Two exponentials over the whole array and no
    ``np.where``: on a ``[128, 1536]`` float32 array (SwiGLU's gate at a
    prefill of 128 tokens) that was several times faster here than taking
    both branches and selecting, with the same numbers.
    """
    num = np.minimum(x, 0)  # x for x < 0, else 0
    np.exp(num, out=num)  # e^x, or 1
    den = np.abs(x)
    np.negative(den, out=den)
    np.exp(den, out=den)  # e^-|x| in (0, 1]
    den += 1.0
    num /= den
    return num


# Rows up to this long have their maxima taken column by column.
SHORT_ROWS = 32


def row_max(s: np.ndarray, axis: int) -> np.ndarray:
    """``np.max(s, axis=axis, keepdims=True)``, the same numbers, faster
    for many short rows.

    NumPy reduces along an axis one row at a time, about 60 ns a row
    whatever its length: for ``[B, h, L, L]`` scores at L = 18 that is
    most of the softmax. A maximum is exact in any order, so for rows of
    at most ``SHORT_ROWS`` entries it is taken column by column instead,
    ``L`` passes over the whole array of rows (NaN propagates the same).
    """
    n = s.shape[axis]
    if not 1 < n <= SHORT_ROWS or s.size < 64 * n:
        return np.max(s, axis=axis, keepdims=True)
    cols = np.moveaxis(s, axis, -1)  # a view: [..., n]
    m = cols[..., 0].copy()  # [...]
    for j in range(1, n):
        np.maximum(m, cols[..., j], out=m)
    return np.expand_dims(m, axis)  # [..., 1, ...]


def _check_finite(x: np.ndarray, mask: np.ndarray | None) -> None:
    """Refuse inf/NaN logits where they take part: exclude entries with
    ``mask``, not with ``-inf``."""
    taking_part = x if mask is None else np.where(mask, x, 0.0)
    if not np.all(np.isfinite(taking_part)):
        raise ValueError(
            "x must be finite wherever it takes part (exclude entries "
            "with mask=, not with -inf), "
            f"got inf or NaN in x of shape {x.shape}"
        )


def _normalise_axis(axis: int, ndim: int) -> int:
    if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        raise ValueError(
            f"axis must be an integer in [-{ndim}, {ndim}), got {axis!r}"
        )
    return int(axis) % ndim
