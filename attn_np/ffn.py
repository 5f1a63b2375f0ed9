"""The gated feed-forward of Llama-family models: SwiGLU (chapter 14).

Shazeer (2020) replaces the MLP's first activation by a gated linear
unit. With ``silu(a) = a * sigmoid(a)`` and rows of ``x`` as positions::

    a = x W_gate   b = x W_up          [..., d] -> [..., d_ff] each
    h = silu(a) * b                    [..., d_ff]
    y = h W_down                       [..., d_ff] -> [..., d]

Backward, with ``s = sigmoid(a)`` and ``silu'(a) = s (1 + a (1 - s))``::

    dh = dy W_down^T      dW_down = h^T dy
    da = dh * b * silu'(a)            db = dh * silu(a)
    dW_gate = x^T da      dW_up = x^T db
    dx = da W_gate^T + db W_up^T

The weights are ``[d_in, d_out]`` (``x @ W``), as every layer of the
book; no biases (Llama's MLP has none).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._checks import (
    all_finite,
    as_float_array,
    check_finite,
    check_float_dtype,
    check_overflow,
    check_positive_int,
    check_upstream,
)
from .heads import side_by_side, still_side_by_side
from .softmax import sigmoid


class SwiGLUCache(NamedTuple):
    x: np.ndarray  # [N, d]
    a: np.ndarray  # [N, d_ff]: x W_gate
    b: np.ndarray  # [N, d_ff]: x W_up
    s: np.ndarray  # [N, d_ff]: sigmoid(a)
    h: np.ndarray  # [N, d_ff]: silu(a) * b
    shape: tuple  # the shape of x
    W_gate: np.ndarray
    W_up: np.ndarray
    W_down: np.ndarray


def _check_weights(x, W_gate, W_up, W_down):
    d = x.shape[-1]
    d_ff = W_gate.shape[1] if W_gate.ndim == 2 else None
    ok = (
        W_gate.ndim == W_up.ndim == W_down.ndim == 2
        and W_gate.shape == W_up.shape == (d, d_ff)
        and W_down.shape == (d_ff, d)
    )
    if not ok:
        raise ValueError(
            "swiglu needs x [..., d], W_gate and W_up [d, d_ff], W_down "
            f"[d_ff, d]; got x {x.shape}, W_gate {W_gate.shape}, W_up "
            f"{W_up.shape}, W_down {W_down.shape}"
        )


def swiglu_forward(x, W_gate, W_up, W_down):
    """``y = (silu(x W_gate) * (x W_up)) W_down``; ``(y, cache)``."""
    x = as_float_array(x, "x", min_ndim=1)
    W_gate = as_float_array(W_gate, "W_gate")
    W_up = as_float_array(W_up, "W_up")
    W_down = as_float_array(W_down, "W_down")
    _check_weights(x, W_gate, W_up, W_down)
    check_finite(x, "x")
    xf = x.reshape(-1, x.shape[-1])  # [N, d]
    a = xf @ W_gate  # [N, d] @ [d, d_ff] -> [N, d_ff]
    b = xf @ W_up  # [N, d] @ [d, d_ff] -> [N, d_ff]
    s = sigmoid(a).astype(a.dtype, copy=False)  # [N, d_ff]
    with np.errstate(over="ignore", invalid="ignore"):  # checked below
        h = a * s * b  # silu(a) * b: [N, d_ff]
        y = h @ W_down  # [N, d_ff] @ [d_ff, d] -> [N, d]
    if not all_finite(y):  # a NaN or inf weight reaches y: name it
        for name, W in (
            ("W_gate", W_gate),
            ("W_up", W_up),
            ("W_down", W_down),
        ):
            check_finite(W, name)
        check_overflow(y, "y", "x or the weights are too large")
    y = y.reshape(x.shape[:-1] + (W_down.shape[1],))  # [..., d]
    return y, SwiGLUCache(xf, a, b, s, h, x.shape, W_gate, W_up, W_down)


def swiglu_step(x, W_gate, W_up, W_down, W_gate_up=None):
    """The forward alone, keeping nothing (a decode step): ``y``. With
    ``W_gate_up``, ``[W_gate | W_up]`` in one buffer (:meth:`SwiGLU.
    pack`), the two products are one."""
    if W_gate_up is None:
        a = x @ W_gate  # [..., d] -> [..., d_ff]
        b = x @ W_up  # [..., d] -> [..., d_ff]
    else:  # [..., d] @ [d, 2 d_ff] -> [..., 2 d_ff], split as views
        ab = x @ W_gate_up
        a, b = ab[..., : W_gate.shape[1]], ab[..., W_gate.shape[1] :]
    return _gate_into(a, b) @ W_down  # [..., d_ff] -> [..., d]


def _gate_into(a, b):
    """``silu(a) * b = a b / (1 + e^-a)`` written into ``b`` (returned),
    with one exponential: an ``e^-a`` that overflows (``a`` below about
    -88 in float32) gives the limit 0. The steps that keep nothing for a
    backward use it (a prefill, a decode step)."""
    b *= a
    with np.errstate(over="ignore"):
        e = np.exp(np.negative(a))
    e += 1.0
    b /= e
    return b


def swiglu_backward(dy, cache: SwiGLUCache):
    """``(dx, {"W_gate", "W_up", "W_down"})``: the formulas of the module
    docstring."""
    if not isinstance(cache, SwiGLUCache):
        raise TypeError(
            "cache must be the SwiGLUCache swiglu_forward returned, got "
            f"{type(cache).__name__}"
        )
    c = cache
    dy = check_upstream(dy, "dy", c.shape, "the SwiGLU output")
    dyf = dy.reshape(-1, dy.shape[-1])  # [N, d]
    dW_down = c.h.T @ dyf  # [d_ff, N] @ [N, d] -> [d_ff, d]
    dh = dyf @ c.W_down.T  # [N, d] @ [d, d_ff] -> [N, d_ff]
    silu = c.a * c.s  # [N, d_ff]
    db = dh * silu  # [N, d_ff]
    da = dh * c.b * (c.s * (1.0 + c.a * (1.0 - c.s)))  # [N, d_ff]
    dW_gate = c.x.T @ da  # [d, N] @ [N, d_ff] -> [d, d_ff]
    dW_up = c.x.T @ db  # [d, N] @ [N, d_ff] -> [d, d_ff]
    # [N, d_ff] @ [d_ff, d] twice -> [N, d]
    dx = da @ c.W_gate.T + db @ c.W_up.T
    grads = {"W_gate": dW_gate, "W_up": dW_up, "W_down": dW_down}
    return dx.reshape(c.shape), grads


class SwiGLU:
    """The SwiGLU feed-forward, ``params`` ``W_gate``, ``W_up`` ``[d_model,
    d_ff]`` and ``W_down`` ``[d_ff, d_model]``, ``N(0, 1/fan_in)``
    (``seed=None``: zeros, for weights loaded from a checkpoint)."""

    def __init__(self, d_model, d_ff, seed=0, dtype=np.float64):
        d = check_positive_int(d_model, "d_model")
        f = check_positive_int(d_ff, "d_ff")
        dtype = check_float_dtype(dtype)
        shapes = {"W_gate": (d, f), "W_up": (d, f), "W_down": (f, d)}
        if seed is None:
            self.params = {k: np.zeros(s, dtype) for k, s in shapes.items()}
        else:
            rng = np.random.default_rng(seed)
            self.params = {
                k: (rng.standard_normal(s) / np.sqrt(s[0])).astype(dtype)
                for k, s in shapes.items()
            }
        self.grads = {k: np.zeros_like(p) for k, p in self.params.items()}
        self.d_model, self.d_ff = d, f
        self._cache = None
        self._packed = None  # pack()'s (buffer, views)

    def pack(self, out=None):
        """Keep ``W_gate`` and ``W_up`` side by side in one ``[d_model, 2
        d_ff]`` buffer (``out`` if given), ``params`` views of it: a decode
        step then makes both products as one (:meth:`~attn_np.
        GroupedQueryAttention.pack_projections` says why). Returns the
        layer."""
        names = ("W_gate", "W_up")
        self._packed = side_by_side(
            *(self.params[n] for n in names), out=out
        )
        self.params.update(zip(names, self._packed[1]))
        return self

    @property
    def packed_gate_up(self):
        """The buffer of :meth:`pack` while ``params`` still hold its
        views, else None (then two products)."""
        p = self.params
        return still_side_by_side(
            getattr(self, "_packed", None), (p["W_gate"], p["W_up"])
        )

    def forward(self, x, *, keep=True):
        """``y`` for ``x [..., d_model]``; ``keep=False`` (a decode step)
        keeps nothing for the backward."""
        p = self.params
        if not keep:
            self._cache = None
            return swiglu_step(
                x, p["W_gate"], p["W_up"], p["W_down"], self.packed_gate_up
            )
        y, self._cache = swiglu_forward(
            x, p["W_gate"], p["W_up"], p["W_down"]
        )
        return y

    def backward(self, dy):
        if self._cache is None:
            raise RuntimeError(
                "SwiGLU.backward needs a preceding forward with keep=True"
            )
        dx, g = swiglu_backward(dy, self._cache)
        self.grads.update(g)
        return dx
