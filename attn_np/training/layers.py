"""The rest of a transformer: embedding, positions, RMSNorm, GELU, linear and
feed-forward (chapter 5).

Every piece is a ``thing_forward(...) -> (out, cache)`` /
``thing_backward(dout, cache)`` pair and a thin layer shell with ``params``
and ``grads`` dicts that share their keys. Backward formulas, with ``dy =
dL/dy`` of the output's shape (rows are positions; leading axes ``[B, L]``
are flattened)::

    embedding  y = W[ids]
               dW = scatter-add of dy into the rows ids
    linear     y = x W + b
               dx = dy W^T   dW = x^T dy   db = sum_rows dy
    RMSNorm    y = g * x * r,   r = 1 / sqrt(mean(x^2) + eps)
               dx = r * (dy*g - x * r^2 * mean(dy*g*x))
               dg = sum_rows dy * x * r
    GELU       y = x * Phi~(x) (tanh form)
               dx = dy * gelu'(x)
    residual   y = x + f(x)
               dx = dy + f's backward(dy)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import (
    all_finite,
    as_float_array,
    check_finite,
    check_float_dtype,
    check_positive_int,
    check_token_ids,
    check_upstream,
)
from ..norms import rmsnorm_backward, rmsnorm_forward, rmsnorm_step


def check_cache(cache, kind: type, forward: str):
    """``cache`` if it is what ``forward`` returns, else a ``TypeError``
    naming both (a cache from another function, or ``None``)."""
    if not isinstance(cache, kind):
        raise TypeError(
            f"cache must be the cache {forward} returned ({kind.__name__}), "
            f"got {type(cache).__name__}"
        )
    return cache


def check_forward_done(layer, cache) -> None:
    """A clear ``RuntimeError`` for a layer's backward called before its
    forward."""
    if cache is None:
        raise RuntimeError(
            f"{type(layer).__name__}.backward called before forward: there "
            "is no cache to differentiate"
        )


class EmbeddingCache(NamedTuple):
    ids: np.ndarray
    W_shape: tuple


class LinearCache(NamedTuple):
    x: np.ndarray
    W: np.ndarray


class GeluCache(NamedTuple):
    x: np.ndarray
    t: np.ndarray


# ---------------------------------------------------------------------------
# ------------ embedding


def embedding_forward(ids, W):
    """Look up rows of ``W [vocab, d]`` for integer ``ids [...]``: ``[...] ->
    [..., d]``."""
    W = as_float_array(W, "W", min_ndim=2)
    ids = check_token_ids(ids, W.shape[0])
    rows = W[ids]  # [...] -> [..., d]
    if not all_finite(rows):  # the rows read, not all of a vocabulary
        check_finite(rows, "W")
    return rows, EmbeddingCache(ids, W.shape)


def embedding_backward(dout, cache):
    """``dW``: each row of ``dout`` added into the row of its token (repeated
    tokens add up)."""
    ids, W_shape = check_cache(cache, EmbeddingCache, "embedding_forward")
    dout = check_upstream(
        dout, "dout", ids.shape + (W_shape[1],), "the embedding output"
    )
    dW = np.zeros(W_shape, dtype=dout.dtype)
    # [N, d] scattered into [vocab, d]
    np.add.at(dW, ids.reshape(-1), dout.reshape(-1, W_shape[1]))
    return dW


class Embedding:
    """Token embedding ``W [vocab_size, d_model]``, N(0, 1) so a token vector
    has norm about sqrt(d)."""

    def __init__(self, vocab_size, d_model, seed=0, dtype=np.float64):
        self.vocab_size = check_positive_int(vocab_size, "vocab_size")
        self.d_model = check_positive_int(d_model, "d_model")
        rng = np.random.default_rng(seed)
        self.params = {
            "W": rng.standard_normal((vocab_size, d_model)).astype(
                check_float_dtype(dtype)
            )
        }
        self.grads = {"W": np.zeros_like(self.params["W"])}
        self._cache = None

    def forward(self, ids):
        y, self._cache = embedding_forward(ids, self.params["W"])
        return y

    def backward(self, dy):
        """Fills ``grads["W"]``; returns ``None`` (token ids have no
        gradient)."""
        check_forward_done(self, self._cache)
        check_finite(as_float_array(dy, "dy"), "dy")
        self.grads["W"] = embedding_backward(dy, self._cache)
        return None


# ---------------------------------------------------------------------------
# ------------ positions
def sinusoidal_positions(
    L: int, d_model: int, dtype=np.float64
) -> np.ndarray:
    """Vaswani et al.'s fixed position code ``[L, d_model]``: pairs (sin,
    cos) at geometric frequencies.

    ``P[p, 2i] = sin(p / 10000^(2i/d))`` and ``P[p, 2i+1] = cos(p /
    10000^(2i/d))``. It is added to the token embeddings and has no
    parameters, so its backward is the identity: ``d(x + P)/dx = I``.
    """
    L = check_positive_int(L, "L")
    d_model = check_positive_int(d_model, "d_model")
    pos = np.arange(L)[:, None]  # [L, 1]
    freq = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)  # [ceil(d/2)]
    angle = pos * freq  # [L, 1] * [ceil(d/2)] -> [L, ceil(d/2)]
    P = np.empty((L, d_model))
    P[:, 0::2] = np.sin(angle)
    P[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return P.astype(dtype)


# ---------------------------------------------------------------------------
# --------------- linear
def linear_forward(x, W, b):
    """``y = x W + b``: ``[..., d_in] @ [d_in, d_out] + [d_out] -> [...,
    d_out]``."""
    x = as_float_array(x, "x", min_ndim=1)
    W = as_float_array(W, "W", min_ndim=2)
    b = as_float_array(b, "b", min_ndim=1)
    if x.shape[-1] != W.shape[0] or b.shape != (W.shape[1],):
        raise ValueError(
            "linear needs x [..., d_in], W [d_in, d_out], b [d_out]; got "
            f"x {x.shape}, W {W.shape}, b {b.shape}"
        )
    for name, a in (("x", x), ("W", W), ("b", b)):
        check_finite(a, name)
    y = x @ W + b  # [..., d_in] @ [d_in, d_out] -> [..., d_out]
    return y, LinearCache(x, W)


def linear_backward(dy, cache):
    """``(dx, dW, db)``: ``dy W^T``, ``x^T dy`` and the sum of ``dy`` over
    every row."""
    x, W = check_cache(cache, LinearCache, "linear_forward")
    dy = check_upstream(
        dy, "dy", x.shape[:-1] + (W.shape[1],), "the linear output"
    )
    dx = dy @ W.T  # [..., d_out] @ [d_out, d_in] -> [..., d_in]
    dy2 = dy.reshape(-1, W.shape[1])  # [N, d_out]
    # [d_in, N] @ [N, d_out] -> [d_in, d_out]
    dW = x.reshape(-1, W.shape[0]).T @ dy2
    db = dy2.sum(axis=0)  # [N, d_out] -> [d_out]
    return dx, dW, db


class Linear:
    """``y = x W + b`` with ``W ~ N(0, 1/d_in)`` and ``b = 0``."""

    def __init__(self, d_in, d_out, seed=0, dtype=np.float64):
        d_in, d_out = (
            check_positive_int(d_in, "d_in"),
            check_positive_int(d_out, "d_out"),
        )
        dtype = check_float_dtype(dtype)
        rng = np.random.default_rng(seed)
        self.params = {
            "W": (rng.standard_normal((d_in, d_out)) / np.sqrt(d_in)).astype(
                dtype
            ),
            "b": np.zeros(d_out, dtype=dtype),
        }
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self._cache = None

    def forward(self, x):
        y, self._cache = linear_forward(
            x, self.params["W"], self.params["b"]
        )
        return y

    def backward(self, dy):
        check_forward_done(self, self._cache)
        dx, self.grads["W"], self.grads["b"] = linear_backward(
            dy, self._cache
        )
        return dx


# ---------------------------------------------------------------------------
# -------------- RMSNorm
class RMSNorm:
    """RMSNorm with a learned gain ``g [d]`` (initialised to ones), no
    bias."""

    def __init__(self, d_model, eps=1e-6, dtype=np.float64):
        self.d_model = check_positive_int(d_model, "d_model")
        if (
            isinstance(eps, bool)
            or not isinstance(eps, (int, float, np.floating))
            or not (math.isfinite(eps) and eps > 0)
        ):
            raise ValueError(
                f"eps must be a positive finite number, got {eps!r}"
            )
        self.eps = float(eps)
        self.params = {"g": np.ones(d_model, dtype=check_float_dtype(dtype))}
        self.grads = {"g": np.zeros_like(self.params["g"])}
        self._cache = None

    def forward(self, x):
        y, self._cache = rmsnorm_forward(x, self.params["g"], eps=self.eps)
        return y

    def step(self, x):
        """``y`` for a decode step: nothing kept, nothing checked
        (:func:`~attn_np.norms.rmsnorm_step`)."""
        self._cache = None
        return rmsnorm_step(x, self.params["g"], eps=self.eps)

    def backward(self, dy):
        check_forward_done(self, self._cache)
        dx, self.grads["g"] = rmsnorm_backward(dy, self._cache)
        return dx


# ---------------------------------------------------------------------------
# ----------------- GELU
_GELU_C = math.sqrt(2.0 / math.pi)


def gelu_forward(x):
    """GELU, tanh form (Hendrycks & Gimpel 2016): ``0.5 x (1 + tanh(c (x +
    0.044715 x^3)))``."""
    x = as_float_array(x, "x")
    check_finite(x, "x")
    t = np.tanh(_GELU_C * (x + 0.044715 * (x * x * x)))
    return 0.5 * x * (1.0 + t), GeluCache(x, t)


def gelu_backward(dy, cache):
    """``dy * (0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2))``."""
    x, t = check_cache(cache, GeluCache, "gelu_forward")
    dy = check_upstream(dy, "dy", x.shape, "the GELU output")
    return dy * (
        0.5 * (1.0 + t)
        + 0.5 * x * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * x * x)
    )


# ---------------------------------------------------------------------------
# --------- feed-forward
class Composite:
    """``params``/``grads`` of a layer made of named children, keyed
    ``"child.param"`` (e.g. ``"attn.W_q"``).

    They are views of the children's own dicts, rebuilt on each access, so an
    optimiser that updates ``params[key]`` in place updates the child's
    array.
    """

    def children(self) -> dict:
        raise NotImplementedError

    @property
    def params(self) -> dict:
        return {
            f"{n}.{k}": p
            for n, layer in self.children().items()
            for k, p in layer.params.items()
        }

    @property
    def grads(self) -> dict:
        return {
            f"{n}.{k}": g
            for n, layer in self.children().items()
            for k, g in layer.grads.items()
        }


class FeedForward(Composite):
    """The position-wise MLP ``y = GELU(x W_up + b_up) W_down + b_down``:
    ``[..., d] -> [..., d_ff] -> [..., d]``. Its ``params`` are its two
    :class:`Linear` layers' own, keyed ``"up.W"``, ``"up.b"``, ``"down.W"``
    and ``"down.b"``."""

    def __init__(self, d_model, d_ff, seed=0, dtype=np.float64):
        rng = np.random.default_rng(seed)
        s1, s2 = rng.integers(2**31, size=2)
        self.up = Linear(d_model, d_ff, seed=s1, dtype=dtype)
        self.down = Linear(d_ff, d_model, seed=s2, dtype=dtype)
        self._gelu_cache = None

    def children(self):
        return {"up": self.up, "down": self.down}

    def forward(self, x):
        a = self.up.forward(x)  # [..., d] -> [..., d_ff]
        h, self._gelu_cache = gelu_forward(a)  # [..., d_ff]
        return self.down.forward(h)  # [..., d_ff] -> [..., d]

    def backward(self, dy):
        check_forward_done(self, self._gelu_cache)
        dh = self.down.backward(dy)  # [..., d] -> [..., d_ff]
        da = gelu_backward(dh, self._gelu_cache)  # [..., d_ff]
        return self.up.backward(da)  # [..., d_ff] -> [..., d]
