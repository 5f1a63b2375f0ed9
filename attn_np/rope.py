"""Rotary position embeddings (RoPE), forward and backward (chapter 6).

Su et al. (RoFormer) rotate each pair of features of a query or a key by
an angle proportional to its position ``p``. With rotary dimension ``r``
(even, at most ``d``) there are ``r/2`` pairs; pair ``i`` turns at the
frequency ``theta_i = base^(-2i/r)``, ``i = 0 ... r/2 - 1``::

    y_a = x_a cos(p theta_i) - x_b sin(p theta_i)
    y_b = x_a sin(p theta_i) + x_b cos(p theta_i)

Features ``r ... d-1`` pass through unchanged (partial RoPE). Which two
features form pair ``i`` is the layout:

* ``"half"``: ``(a, b) = (i, i + r/2)``, the ``rotate_half`` of GPT-NeoX
  and Hugging Face Llama;
* ``"interleaved"``: ``(a, b) = (2i, 2i + 1)``, as in RoFormer, Meta's
  Llama reference code and DeepSeek.

A rotation is orthogonal, ``R(phi)^T = R(-phi)``, so the backward rotates
the upstream gradient by the opposite angle::

    dx_a =  dy_a cos(p theta_i) + dy_b sin(p theta_i)
    dx_b = -dy_a sin(p theta_i) + dy_b cos(p theta_i)

Because ``R(m theta)^T R(n theta) = R((n - m) theta)``, the score of a
rotated query at position ``m`` and a rotated key at position ``n``
depends on the positions only through ``n - m``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import (
    as_float_array,
    check_positive_int,
    check_positive_number,
    check_upstream,
)

LAYOUTS = ("half", "interleaved")


@dataclass
class RopeCache:
    """What :func:`rope_backward` needs: the angles' cosines and sines."""

    cos: np.ndarray  # [L, r/2]
    sin: np.ndarray  # [L, r/2]
    layout: str
    rotary_dim: int
    shape: tuple[int, ...]  # the shape of x (and of y)


def rope_frequencies(rotary_dim, *, base=10000.0) -> np.ndarray:
    """``theta_i = base^(-2i/r)`` for ``i = 0 ... r/2 - 1``: ``[r/2]``.

    Pair ``i`` turns by ``theta_i`` radians per position, so its
    wavelength is ``2 pi / theta_i`` positions: ``2 pi`` for the fastest
    pair, almost ``2 pi base`` for the slowest.
    """
    r = _check_rotary_dim(rotary_dim, None, "")
    base = check_positive_number(base, "base")
    i = np.arange(r // 2)  # [r/2]
    return base ** (-2.0 * i / r)  # [r/2], from 1 down to base^(-(r-2)/r)


def rope_forward(
    x, positions, *, base=10000.0, layout="half", rotary_dim=None
):
    """Rotate the features of ``x`` by their positions; ``(y, cache)``.

    ``x`` is ``[..., L, d]`` (one query or key head per leading index)
    and ``positions`` an integer array ``[L]`` of non-negative positions.
    ``rotary_dim`` (default ``d``) is even and at most ``d``: the first
    ``rotary_dim`` features turn, the rest pass through.
    """
    x = as_float_array(x, "x", min_ndim=2)
    L, d = x.shape[-2:]
    r = _check_rotary_dim(rotary_dim, d, "the last axis of x")
    base = check_positive_number(base, "base")
    _check_layout(layout)
    p = _check_positions(positions, L, x.shape)
    theta = rope_frequencies(r, base=base)  # [r/2]
    angles = p[:, None] * theta[None, :]  # [L, 1] * [1, r/2] -> [L, r/2]
    cos = np.cos(angles).astype(x.dtype)  # [L, r/2]
    sin = np.sin(angles).astype(x.dtype)  # [L, r/2]
    y = _rotate(x, cos, sin, layout, r)  # [..., L, d]
    return y, RopeCache(cos, sin, layout, r, x.shape)


def rope_backward(dy, cache: RopeCache) -> np.ndarray:
    """Gradient with respect to ``x``: ``dy`` rotated by minus the angle."""
    dy = check_upstream(dy, "dy", cache.shape, "the rotated x")
    r = cache.rotary_dim
    return _rotate(dy, cache.cos, -cache.sin, cache.layout, r)  # [..., L, d]


def rope(x, positions, *, base=10000.0, layout="half", rotary_dim=None):
    """The rotated ``x`` alone (see :func:`rope_forward`)."""
    y, _ = rope_forward(
        x, positions, base=base, layout=layout, rotary_dim=rotary_dim
    )
    return y


def rope_permutation(
    d_k, *, n_heads=1, rotary_dim=None, source="interleaved", target="half"
) -> np.ndarray:
    """Column order that turns ``source``-layout weights into ``target``.

    ``W_q_target = W_q_source[:, perm]`` (and the same for ``W_k``, with
    its own ``n_heads``) gives a layer that uses ``target`` the same
    outputs as the original layer that uses ``source``. Within each head
    of ``d_k`` columns, interleaved pair ``(2i, 2i+1)`` moves to
    ``(i, i + r/2)``; features from ``rotary_dim`` on stay put. Returns
    ``[n_heads * d_k]`` column indices.
    """
    n_heads = check_positive_int(n_heads, "n_heads")
    d_k = check_positive_int(d_k, "d_k")
    r = _check_rotary_dim(rotary_dim, d_k, "d_k")
    _check_layout(source, "source")
    _check_layout(target, "target")
    head = np.arange(d_k)  # [d_k]: identity outside the rotated part
    if source != target:
        to_half = np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2)])
        head[:r] = to_half if target == "half" else np.argsort(to_half)
    offsets = d_k * np.arange(n_heads)[:, None]  # [n_heads, 1]
    return (offsets + head[None, :]).reshape(-1)  # -> [n_heads * d_k]


# ------------------------------------------------------------------ helpers
def _pairs(t, layout, r):
    """Views of the two members of every pair: ``[..., L, r/2]`` each."""
    if layout == "half":
        return t[..., : r // 2], t[..., r // 2 : r]
    return t[..., 0:r:2], t[..., 1:r:2]


def _rotate(x, cos, sin, layout, r):
    """Turn every pair ``(a, b)`` of ``x`` by the angle of ``(cos, sin)``."""
    y = x.copy()  # [..., L, d]: features r ... d-1 pass through
    xa, xb = _pairs(x, layout, r)  # [..., L, r/2] each
    ya, yb = _pairs(y, layout, r)  # views into y
    ya[...] = xa * cos - xb * sin  # [..., L, r/2] * [L, r/2]
    yb[...] = xa * sin + xb * cos
    return y


def _check_layout(layout, name="layout"):
    if layout not in LAYOUTS:
        raise ValueError(f"{name} must be one of {LAYOUTS}, got {layout!r}")


def _check_rotary_dim(rotary_dim, d, what):
    if rotary_dim is None and d is not None:
        if d % 2:
            raise ValueError(
                f"{what} must be even to be rotated in pairs "
                f"(or pass an even rotary_dim < d), got d={d}"
            )
        return d
    if isinstance(rotary_dim, bool) or not isinstance(
        rotary_dim, (int, np.integer)
    ):
        raise ValueError(
            f"rotary_dim must be an even positive integer, got "
            f"{rotary_dim!r}"
        )
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"rotary_dim must be an even positive integer, got {rotary_dim}"
        )
    if d is not None and rotary_dim > d:
        raise ValueError(
            f"rotary_dim must be at most {what} (d={d}), "
            f"got rotary_dim={rotary_dim}"
        )
    return int(rotary_dim)


def _check_positions(positions, L, x_shape):
    p = np.asarray(positions)
    if p.dtype == np.bool_ or not np.issubdtype(p.dtype, np.integer):
        raise ValueError(
            f"positions must be an integer array, got dtype {p.dtype}"
        )
    if p.shape != (L,):
        raise ValueError(
            f"positions must have shape [L] = ({L},) to match x of shape "
            f"{tuple(x_shape)} ([..., L, d]), got {p.shape}"
        )
    if np.any(p < 0):
        raise ValueError(
            f"positions must be non-negative, got minimum {p.min()}"
        )
    return p.astype(np.float64)  # [L]


def check_rope_settings(base, layout, rotary_dim, d_k):
    """A layer's ``(rope_base, rope_layout, rope_dim)``, validated.

    ``base=None`` means no rotation; otherwise ``rope_dim`` defaults to
    ``d_k``.
    """
    _check_layout(layout, "rope_layout")
    if base is None:
        if rotary_dim is not None:
            raise ValueError(
                f"rope_dim={rotary_dim!r} needs rope_base (None means no "
                "rotation)"
            )
        return None, layout, None
    base = check_positive_number(base, "rope_base")
    try:
        r = _check_rotary_dim(rotary_dim, d_k, "d_k")
    except ValueError as e:
        raise ValueError(f"rope_dim: {e}") from None
    return base, layout, r
