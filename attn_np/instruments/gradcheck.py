"""Gradient checking by central finite differences (shared by the tests and
the notebooks).

The standard the book holds every backward pass to:

* float64 throughout, step ``h = 1e-5``;
* a *random* upstream gradient ``dout``: all ones hides errors. Every softmax
  row sums to one, so with ``dout = 1`` the true gradient of the softmax is
  exactly zero and a backward that returns zeros would pass; a random
  ``dout`` has no such blind spot;
* the relative error ``max|a - b| / max(1e-8, max(|a| + |b|))`` below
  ``1e-7`` for every input and every parameter.

For a scalar loss ``f(x) = sum(F(x) * dout)`` the central difference is::

    df/dx_i ~ (f(x + h e_i) - f(x - h e_i)) / (2 h)       error O(h^2)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

TOLERANCE = 1e-7


def rel_error(a, b) -> float:
    """``max|a - b| / max(1e-8, max(|a| + |b|))``: the book's relative error
    between two arrays.

    A NaN or an infinity in either array gives ``inf``, never NaN: so
    ``max(errors.values()) < TOLERANCE`` fails for a backward that returns
    NaN (``max`` skips a NaN that is not first, and every comparison with NaN
    is False).
    """
    try:
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(
            "a and b must be arrays of real numbers, got "
            f"{type(a).__name__} and {type(b).__name__}"
        ) from None
    if a.shape != b.shape:
        raise ValueError(
            f"a and b must have the same shape, got {a.shape} and {b.shape}"
        )
    if a.size == 0:
        return 0.0
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("inf")
    with np.errstate(over="ignore", invalid="ignore"):
        err = float(
            np.max(np.abs(a - b))
            / max(1e-8, float(np.max(np.abs(a) + np.abs(b))))
        )
    return err if np.isfinite(err) else float("inf")


def numerical_gradient(
    f: Callable[[], np.ndarray],
    x: np.ndarray,
    dout: np.ndarray,
    h: float = 1e-5,
) -> np.ndarray:
    """Central-difference gradient of ``sum(f() * dout)`` with respect to
    ``x``.

    ``f`` takes no arguments and reads ``x``, which is perturbed in place one
    entry at a time and restored afterwards.
    """
    if not callable(f):
        raise TypeError(f"f must be callable, got {type(f).__name__}")
    if not isinstance(x, np.ndarray):
        raise TypeError(
            "x must be a float64 ndarray (it is perturbed in place), got "
            f"{type(x).__name__}"
        )
    if x.dtype != np.float64 or np.asarray(dout).dtype != np.float64:
        raise TypeError(
            f"gradient checks run in float64, got x of dtype {x.dtype} and "
            "dout of dtype "
            f"{np.asarray(dout).dtype}"
        )
    if not x.flags.writeable:
        raise ValueError("x must be writeable (it is perturbed in place)")
    try:
        h = float(h)
    except (TypeError, ValueError):
        h = float("nan")
    if not (np.isfinite(h) and 0 < h < 1):
        raise ValueError(f"h must be a small positive step, got {h!r}")
    dout = np.asarray(dout)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + h
        # a copy: f may reuse memory
        f_plus = np.array(f(), dtype=np.float64)
        x[idx] = old - h
        f_minus = f()
        x[idx] = old
        if np.shape(f_plus) != dout.shape:
            raise ValueError(
                f"f() must return an array of the shape of dout "
                f"{dout.shape}, got {np.shape(f_plus)}"
            )
        # difference the outputs before summing: their large common part
        # cancels exactly, so less rounding error enters the sum
        grad[idx] = np.sum((f_plus - f_minus) * dout) / (2 * h)
    return grad


def check_gradients(
    forward,
    backward,
    inputs: dict[str, np.ndarray],
    *,
    seed: int = 0,
    h: float = 1e-5,
    **kwargs,
) -> dict[str, float]:
    """Check a ``forward(**inputs, **kwargs) -> (out, cache)`` /
    ``backward(dout, cache)`` pair.

    ``backward`` returns the gradients in the order of ``inputs`` (a tuple)
    or a single array. Returns ``{name: relative error}`` for every input.
    """
    # copies we may perturb
    arrays = {
        name: np.array(val, dtype=np.float64) for name, val in inputs.items()
    }
    out, cache = forward(**arrays, **kwargs)
    dout = np.random.default_rng(seed).standard_normal(out.shape)
    analytic = backward(dout, cache)
    if isinstance(analytic, np.ndarray):
        analytic = (analytic,)
    if len(analytic) != len(arrays):
        raise ValueError(
            f"backward returned {len(analytic)} gradients for "
            f"{len(arrays)} inputs"
        )
    errors = {}
    for (name, x), g in zip(arrays.items(), analytic):
        num = numerical_gradient(
            lambda: forward(**arrays, **kwargs)[0], x, dout, h
        )
        errors[name] = rel_error(g, num)
    return errors


def check_layer_gradients(
    layer, x, *, seed: int = 0, h: float = 1e-5, **forward_kwargs
) -> dict[str, float]:
    """Check a layer's ``backward`` for its input (when it is a float array)
    and every parameter.

    The layer follows the book's protocol: ``forward(x, **kw) -> y``,
    ``backward(dy) -> dx`` (``None`` for integer inputs such as token ids),
    and ``params`` / ``grads`` dicts with the same keys. Returns ``{"x": err,
    "<param>": err, ...}``.
    """
    for name, p in layer.params.items():
        if p.dtype != np.float64:
            raise TypeError(
                f"gradient checks run in float64, got parameter {name} of "
                f"dtype {p.dtype}"
            )
    x = np.array(x)  # a copy we may perturb
    y = layer.forward(x, **forward_kwargs)
    dy = np.random.default_rng(seed).standard_normal(y.shape)
    dx = layer.backward(dy)
    analytic = {name: g.copy() for name, g in layer.grads.items()}

    def f():
        return layer.forward(x, **forward_kwargs)

    errors = {}
    if np.issubdtype(x.dtype, np.floating):
        errors["x"] = rel_error(dx, numerical_gradient(f, x, dy, h))
    for name, p in layer.params.items():
        errors[name] = rel_error(
            analytic[name], numerical_gradient(f, p, dy, h)
        )
    return errors
