"""Bytes as a reader reads them: binary units (1 KiB = 1024 B).

Used by the cost models' reports (:mod:`attn_np.memory`) and the book's
figures (:mod:`attn_np.instruments.plotting` re-exports it).
"""

from __future__ import annotations

import numpy as np

BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float) -> str:
    """``1536 -> '1.50 KiB'``: bytes in binary units (1 KiB = 1024 B)."""
    real = (int, float, np.integer, np.floating)
    if isinstance(n, bool) or not isinstance(n, real):
        raise TypeError(f"n must be a number of bytes, got {n!r:.40}")
    if isinstance(n, int) and abs(n) >= 2**1000:
        raise ValueError("n is too large to print (2**1000 bytes or more)")
    n = float(n)
    if not np.isfinite(n):
        raise ValueError(f"n must be a finite number of bytes, got {n}")
    for unit in BINARY_UNITS:
        if abs(n) < 1024 or unit == BINARY_UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
