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

import functools
from dataclasses import dataclass

import numpy as np

from ._checks import (
    all_finite,
    as_float_array,
    check_finite,
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
    pair, almost ``2 pi base`` for the slowest. Chapter 11 scales them
    (:func:`~attn_np.rope_scaling.scaled_frequencies`).
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
    check_finite(x, "x")
    L, d = x.shape[-2:]
    r = _check_rotary_dim(rotary_dim, d, "the last axis of x")
    base = check_positive_number(base, "base")
    _check_layout(layout)
    p = _check_positions(positions, L, x.shape)
    theta = rope_frequencies(r, base=base)  # [r/2]
    with np.errstate(over="ignore"):  # checked below
        angles = p[:, None] * theta[None, :]  # [L, 1] * [1, r/2] -> [L, r/2]
    if not np.all(np.isfinite(angles)):
        raise ValueError(
            f"positions times the frequencies of base={base!r} overflow "
            f"(largest position {int(np.max(positions))}): use smaller "
            "positions or a larger base"
        )
    cos = np.cos(angles).astype(x.dtype)  # [L, r/2]
    sin = np.sin(angles).astype(x.dtype)  # [L, r/2]
    y = rotate_pairs(x, cos, sin, layout=layout)  # [..., L, d]
    return y, RopeCache(cos, sin, layout, r, x.shape)


def rope_backward(dy, cache: RopeCache) -> np.ndarray:
    """Gradient with respect to ``x``: ``dy`` rotated by minus the angle."""
    dy = check_upstream(dy, "dy", cache.shape, "the rotated x")
    # R(theta)^T = R(-theta): the same turn with the sine negated
    return rotate_pairs(dy, cache.cos, -cache.sin, layout=cache.layout)


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


def rotate_pairs(x, cos, sin, *, layout="half"):
    """Turn every pair ``(a, b)`` of ``x`` by the angles of ``cos, sin``.

    ``x`` is ``[..., L, d]``, ``cos`` and ``sin`` are ``[L, r/2]``: the
    first ``r`` features of ``x`` form ``r/2`` pairs (in ``layout``), the
    rest pass through. Written as ``x cos + swap(x) sin``, with
    ``swap(a, b) = (b, a)`` and the sine negated on ``a`` (the
    ``rotate_half`` form), every product runs over whole ``[..., L, r]``
    blocks, not over ``r/2``-wide slices (at ``r = 4`` those are several
    times slower in NumPy).
    """
    x = as_float_array(x, "x", min_ndim=2)
    r = _check_tables(cos, sin, x.shape)
    _check_layout(layout)
    for name, a in (("x", x), ("cos", cos), ("sin", sin)):
        if not all_finite(as_float_array(a, name)):  # two reductions
            check_finite(a, name)
    L = x.shape[-2]
    cos_r = np.empty((L, r), dtype=x.dtype)  # [L, r]: cos on a and on b
    sin_r = np.empty((L, r), dtype=x.dtype)  # [L, r]: -sin on a, sin on b
    cos_a, cos_b = _pairs(cos_r, layout, r)  # [L, r/2] views
    cos_a[...], cos_b[...] = cos, cos
    sin_a, sin_b = _pairs(sin_r, layout, r)
    sin_a[...], sin_b[...] = -sin, sin
    xr = x[..., :r]  # [..., L, r]
    swapped = np.empty(xr.shape, dtype=x.dtype)  # [..., L, r]
    sa, sb = _pairs(swapped, layout, r)
    xa, xb = _pairs(xr, layout, r)
    sa[...], sb[...] = xb, xa  # (a, b) -> (b, a)
    swapped *= sin_r  # (-b sin, a sin): [..., L, r] * [L, r]
    y = np.empty_like(x)  # [..., L, d]
    y[..., r:] = x[..., r:]  # features r ... d-1 pass through
    yr = y[..., :r]
    np.multiply(xr, cos_r, out=yr)  # (a cos, b cos)
    yr += swapped  # (a cos - b sin, a sin + b cos)
    return y


def _check_tables(cos, sin, x_shape):
    L, d = x_shape[-2:]
    cos = np.asarray(cos)
    if cos.ndim != 2 or cos.shape[0] != L or 2 * cos.shape[1] > d:
        raise ValueError(
            f"cos must be [L, r/2] with L={L} and r <= d={d} (x has shape "
            f"{tuple(x_shape)}), got cos of shape {cos.shape}"
        )
    if np.shape(sin) != cos.shape:
        raise ValueError(
            f"sin must have the shape of cos {cos.shape}, got "
            f"{np.shape(sin)}"
        )
    return 2 * cos.shape[1]


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


def check_rotary(rotary):
    """``rotary`` if it is a position part (None, or an object with
    :class:`Rotary`'s ``forward(t, positions)`` and ``backward(dy,
    saved)``), or raise a ``TypeError`` naming it."""
    if rotary is not None and not (
        callable(getattr(rotary, "forward", None))
        and callable(getattr(rotary, "backward", None))
    ):
        raise TypeError(
            "rotary must be a position part with forward(t, positions) "
            f"and backward(dy, saved) (a Rotary), got {rotary!r}"
        )
    return rotary


# -------------------------------------------------- one position (decode)
@functools.lru_cache(maxsize=512)
def position_tables(base, layout, rotary_dim, position, dtype):
    """The tables of one position, ``(cos, sin, cos_r, sin_r)``: ``cos``
    and ``sin`` ``[1, r/2]`` (what :class:`RopeCache` keeps), ``cos_r``
    and ``sin_r`` ``[1, r]`` spread over the pairs as
    :func:`rotate_pairs` spreads them (``-sin`` on ``a``, ``sin`` on
    ``b``); read-only, or None where the angles overflow. ``position``
    may also be a tuple of positions (``[L, r/2]`` and ``[L, r]``
    tables, :func:`positions_tables`).

    Kept (``functools.lru_cache``): a decode step turns the query and the
    key of every layer by the same position, sixty rotations at
    SmolLM2's thirty layers, and the angles need computing once.
    """
    if isinstance(position, tuple):
        return positions_tables(base, layout, rotary_dim, position, dtype)
    return _tables(base, layout, rotary_dim, (position,), dtype)


# a step of a batch turns every layer by the same few positions (one per
# sequence); tables of up to this many positions are kept
KEPT_POSITIONS = 256


@functools.lru_cache(maxsize=32)
def positions_tables(base, layout, rotary_dim, positions, dtype):
    """:func:`position_tables` of a tuple of ``L`` positions (at most
    :data:`KEPT_POSITIONS`): ``[L, r/2]`` and ``[L, r]`` tables, kept
    for the next layers of the same step (a serving engine's batch turns
    its rows, one per sequence, by the same positions in every layer)."""
    return _tables(base, layout, rotary_dim, positions, dtype)


def _tables(base, layout, rotary_dim, positions, dtype):
    """The tables of :func:`position_tables` for a tuple of positions,
    the angles as :func:`rope_forward` makes them (float64)."""
    theta = rope_frequencies(rotary_dim, base=base)  # [r/2]
    p = np.array(positions, dtype=np.float64)  # [L]
    with np.errstate(over="ignore"):
        angles = p[:, None] * theta[None, :]  # [L, r/2], float64
    if not np.all(np.isfinite(angles)):
        return None
    cos = np.cos(angles).astype(dtype)  # [L, r/2]
    sin = np.sin(angles).astype(dtype)
    cos_r = np.empty((len(p), rotary_dim), dtype=dtype)  # [L, r]
    sin_r = np.empty((len(p), rotary_dim), dtype=dtype)
    cos_a, cos_b = _pairs(cos_r, layout, rotary_dim)
    cos_a[...], cos_b[...] = cos, cos
    sin_a, sin_b = _pairs(sin_r, layout, rotary_dim)
    sin_a[...], sin_b[...] = -sin, sin
    for t in (cos, sin, cos_r, sin_r):
        t.flags.writeable = False
    return cos, sin, cos_r, sin_r


def rope_step(x, position, *, base, layout="half", rotary_dim=None):
    """:func:`rope_forward` for one position (a decode step), ``x [...,
    1, d]``, or for a few (``position`` a tuple of ``L`` ints, ``x [...,
    L, d]``: a batch's rows): ``(y, cache)``, the same numbers, from the
    kept tables of :func:`position_tables`, or None where
    :func:`rope_forward` must decide (it raises the errors).

    The arithmetic is :func:`rotate_pairs`' (``x cos + swap(x) sin``).
    What is left out is the work around it: turning one position of a
    few hundred numbers, rebuilding the angles and tables and checking
    the input took several times longer than the rotation itself.
    """
    d = x.shape[-1]
    r = d if rotary_dim is None else rotary_dim
    if not (isinstance(r, (int, np.integer)) and 0 < r <= d and r % 2 == 0):
        return None  # rope_forward names what is wrong
    L = len(position) if isinstance(position, tuple) else 1
    if x.ndim < 2 or x.shape[-2] != L:
        return None
    tables = position_tables(base, layout, r, position, x.dtype)
    if tables is None:
        return None
    cos, sin, cos_r, sin_r = tables
    xr = x[..., :r]  # [..., L, r]
    swapped = np.empty(xr.shape, dtype=x.dtype)  # [..., L, r]
    sa, sb = _pairs(swapped, layout, r)
    xa, xb = _pairs(xr, layout, r)
    sa[...], sb[...] = xb, xa  # (a, b) -> (b, a)
    swapped *= sin_r  # (-b sin, a sin)
    y = np.empty_like(x)  # [..., L, d]
    y[..., r:] = x[..., r:]  # features r ... d-1 pass through
    yr = y[..., :r]
    np.multiply(xr, cos_r, out=yr)  # (a cos, b cos): [..., L, r] * [L, r]
    yr += swapped  # (a cos - b sin, a sin + b cos)
    return y, RopeCache(cos, sin, layout, r, x.shape)


@dataclass(frozen=True)
class Rotary:
    """A layer's RoPE settings, ready to turn its heads: ``forward(x,
    positions) -> (y, cache)`` and ``backward(dy, cache) -> dx`` are
    :func:`rope_forward` and :func:`rope_backward` with them."""

    base: float
    layout: str = "half"
    rotary_dim: int | None = None

    def forward(self, x, positions):
        # a decode step's position, or a batch's few: kept tables
        one = _few_positions(x, positions)
        if one is not None:
            out = rope_step(
                x,
                one,
                base=self.base,
                layout=self.layout,
                rotary_dim=self.rotary_dim,
            )
            if out is not None:
                return out
        return rope_forward(
            x,
            positions,
            base=self.base,
            layout=self.layout,
            rotary_dim=self.rotary_dim,
        )

    def backward(self, dy, cache):
        return rope_backward(dy, cache)


def _few_positions(x, positions):
    """The position ``p`` (an int) when ``x [..., 1, d]`` is a float
    array of one position and ``positions`` is ``[p]``, or the tuple of
    ``L <= KEPT_POSITIONS`` positions of ``x [..., L, d]``, all ``>= 0``,
    with an even ``d`` (what :func:`rope_step` takes); else None, and
    :func:`rope_forward` checks everything."""
    if not (
        isinstance(x, np.ndarray)
        and x.dtype in (np.float32, np.float64)
        and x.ndim >= 2
        and x.shape[-1] % 2 == 0
        and isinstance(positions, np.ndarray)
        and positions.shape == x.shape[-2:-1]
        and 0 < positions.shape[0] <= KEPT_POSITIONS
        and positions.dtype.kind in "iu"
    ):
        return None
    if positions.shape == (1,):
        p = int(positions[0])
        return p if p >= 0 else None
    if positions.min() < 0 or not all_finite(x):  # rope_forward names it
        return None
    return tuple(positions.tolist())
