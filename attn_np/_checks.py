"""Input checks shared by every public function.

Each check raises a ``ValueError`` (or a ``TypeError`` for a wrong dtype) whose message names the
argument, the shape or dtype it got and what was expected, so that no broadcasting error from deep
inside NumPy ever reaches the reader.
"""

from __future__ import annotations

import numpy as np


def as_float_array(x, name: str, *, min_ndim: int = 0) -> np.ndarray:
    """Return ``x`` as a floating-point ndarray, or raise naming ``name``.

    Python lists of floats are accepted; integer, boolean and complex arrays are refused with a
    ``TypeError`` because silently promoting them hides bugs (integer attention weights are always a
    mistake).
    """
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        raise TypeError(
            f"{name} must be a floating-point array (float32 or float64), got dtype {arr.dtype}"
        )
    if arr.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} axes, got shape {arr.shape}"
        )
    return arr


def as_bool_array(x, name: str) -> np.ndarray:
    """Return a boolean mask as an ndarray, or raise naming ``name``."""
    arr = np.asarray(x)
    if arr.dtype != np.bool_:
        raise TypeError(
            f"{name} must be a boolean array (True where a query may attend a key), "
            f"got dtype {arr.dtype}"
        )
    return arr


def broadcast_shapes(named: dict[str, tuple[int, ...]], what: str) -> tuple[int, ...]:
    """``np.broadcast_shapes`` with an error message that names every argument."""
    try:
        return np.broadcast_shapes(*named.values())
    except ValueError:
        got = ", ".join(f"{k} {v}" for k, v in named.items())
        raise ValueError(f"{what} do not broadcast together: {got}") from None


def check_mask(mask, full: tuple[int, ...], layout: str) -> np.ndarray:
    """A boolean ``mask`` that broadcasts to ``full`` (described as ``layout``), or raise naming both."""
    m = as_bool_array(mask, "mask")
    try:
        ok = np.broadcast_shapes(m.shape, full) == full
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"mask must broadcast to {layout} = {full}, got mask of shape {m.shape}")
    return m


def check_same_shape(a: np.ndarray, name: str, expected: tuple[int, ...], expected_from: str) -> None:
    if a.shape != tuple(expected):
        raise ValueError(
            f"{name} must have shape {tuple(expected)} (the shape of {expected_from}), got {a.shape}"
        )


def check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)
