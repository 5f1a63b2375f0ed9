"""Heads: split a projection into heads and merge them back (chapters 2, 3
and 7).

Head ``i`` owns columns ``i*d:(i+1)*d`` of a projection. Grouped layouts
number query head ``kv*G + g``: group ``kv`` (the key/value head it reads),
member ``g``. Every split returns a contiguous array, so that the matrices
that meet in a matmul are contiguous (a strided 4-D view can fall off BLAS).
"""

from __future__ import annotations

import numpy as np


def split_heads(t, n, d):
    """``[B, L, n*d] -> [B, n, L, d]``: head ``i`` is columns ``i*d ...``."""
    if np.ndim(t) != 3 or t.shape[-1] != n * d:
        raise ValueError(
            f"t must be [B, L, n*d] with n*d = {n}*{d}, got shape "
            f"{np.shape(t)}"
        )
    B, L, _ = t.shape
    # [B, L, n, d] -> [B, n, L, d]
    return np.ascontiguousarray(t.reshape(B, L, n, d).transpose(0, 2, 1, 3))


def merge_heads(t):
    """``[B, n, L, d] -> [B, L, n*d]``: concatenate heads, the inverse of
    :func:`split_heads`."""
    _check_ndim(t, 4, "[B, n, L, d]")
    B, n, L, d = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, L, n * d)  # [B, L, n*d]


def split_groups(t, n_kv, G, d):
    """``[B, L, n_kv*G*d] -> [B, n_kv, G, L, d]``: query head ``kv*G + g``
    is member ``g`` of group ``kv``."""
    B, L, _ = t.shape
    # [B, n_kv*G, L, d] -> [B, n_kv, G, L, d], a view
    return split_heads(t, n_kv * G, d).reshape(B, n_kv, G, L, d)


def merge_groups(t):
    """``[B, n_kv, G, L, d] -> [B, L, n_kv*G*d]``, the inverse of
    :func:`split_groups`."""
    _check_ndim(t, 5, "[B, n_kv, G, L, d]")
    B, n_kv, G, L, d = t.shape
    return merge_heads(t.reshape(B, n_kv * G, L, d))  # [B, L, h*d]


def flat(t):
    """``[B, L, n] -> [B*L, n]``: positions as the rows of one matrix."""
    return t.reshape(-1, t.shape[-1])


def side_by_side(*matrices, out=None):
    """``(buffer, views)``: matrices ``[d, n_i]`` copied side by side into
    one contiguous ``[d, n_1 + n_2 + ...]`` buffer (``out``, a C-ordered
    array of that shape and the matrices' dtype, if given), and views of
    its columns that hold them (the same numbers).

    One product ``x @ buffer`` then makes every ``x @ matrix`` at once,
    the results split off as column views: a decode step's ``q``, ``k``
    and ``v`` (or SwiGLU's gate and up) in one call. With one position a
    product is a matrix-vector product that reads each weight once:
    fewer, longer calls stream the weights at a better rate.
    """
    if not matrices or any(
        np.ndim(m) != 2 or m.shape[0] != matrices[0].shape[0]
        for m in matrices
    ):
        shapes = ", ".join(str(np.shape(m)) for m in matrices)
        raise ValueError(
            f"matrices must be [d, n_i] with the same d, got {shapes}"
        )
    if out is None:
        buffer = np.concatenate(matrices, axis=1)  # [d, sum n_i]
    else:
        shape = (matrices[0].shape[0], sum(m.shape[1] for m in matrices))
        if (
            not isinstance(out, np.ndarray)
            or out.shape != shape
            or out.dtype != np.result_type(*matrices)
            or not out.flags.c_contiguous
        ):
            raise ValueError(
                f"out must be a C-ordered {shape} array of "
                f"{np.result_type(*matrices)}, got "
                f"{getattr(out, 'shape', type(out).__name__)}"
            )
        buffer = np.concatenate(matrices, axis=1, out=out)
    ends = np.cumsum([m.shape[1] for m in matrices])
    starts = ends - [m.shape[1] for m in matrices]
    views = [buffer[:, a:b] for a, b in zip(starts, ends)]
    return buffer, views


def still_side_by_side(packed, arrays):
    """``packed``'s buffer if ``arrays`` are still the views
    :func:`side_by_side` made (the same objects, so in-place updates
    reached the buffer), else None: a matrix replaced since is read on
    its own. ``packed`` is ``(buffer, views)`` or None."""
    if packed is None:
        return None
    buffer, views = packed
    # a view's base is the array that owns the memory (the buffer, or the
    # allocation the buffer is itself a view of)
    owner = buffer if buffer.base is None else buffer.base
    if all(a is v and a.base is owner for a, v in zip(arrays, views)):
        return buffer
    return None


def _check_ndim(t, n, form):
    if np.ndim(t) != n:
        raise ValueError(f"t must be {form}, got shape {np.shape(t)}")
