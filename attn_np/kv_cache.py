"""A key/value cache for incremental decoding (chapter 4).

Keys and values are kept head-major, ``[B, n_kv_heads, capacity, d]``, so that every head's
``[L, d]`` block is contiguous and a decode step hands BLAS one contiguous matrix per head.
Capacity doubles when it runs out, so appending ``n`` positions one at a time copies
``O(n)`` elements in total (amortised), not ``O(n^2)``.
"""

from __future__ import annotations

import numpy as np


class KVCache:
    """Keys and values of the positions seen so far, for one attention layer."""

    def __init__(self, initial_capacity: int = 16):
        self._k = None  # [B, n_kv_heads, capacity, d_k]
        self._v = None  # [B, n_kv_heads, capacity, d_v]
        self._len = 0
        self._initial_capacity = max(1, int(initial_capacity))
        self.copies = 0  # how many times the buffers were reallocated (for the amortisation test)

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        if self._k is None:
            return "KVCache(empty)"
        B, n_kv, cap, d_k = self._k.shape
        return (
            f"KVCache(batch={B}, n_kv_heads={n_kv}, positions={self._len}, capacity={cap}, "
            f"d_k={d_k}, d_v={self._v.shape[-1]}, dtype={self._k.dtype}, nbytes={self.nbytes})"
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values held (positions stored, not spare capacity)."""
        if self._k is None:
            return 0
        B, n_kv, _, d_k = self._k.shape
        return B * n_kv * self._len * (d_k + self._v.shape[-1]) * self._k.itemsize

    @property
    def batch_size(self) -> int | None:
        return None if self._k is None else self._k.shape[0]

    @property
    def keys(self) -> np.ndarray:
        """View of the cached keys, ``[B, n_kv_heads, len, d_k]``."""
        if self._k is None:
            raise ValueError("the cache is empty: it holds no keys yet")
        return self._k[:, :, : self._len]

    @property
    def values(self) -> np.ndarray:
        """View of the cached values, ``[B, n_kv_heads, len, d_v]``."""
        if self._v is None:
            raise ValueError("the cache is empty: it holds no values yet")
        return self._v[:, :, : self._len]

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add a chunk's keys ``[B, n_kv, L, d_k]`` and values ``[B, n_kv, L, d_v]``.

        Returns views of all cached keys and values, the chunk included.
        """
        if k.ndim != 4 or v.ndim != 4 or k.shape[:3] != v.shape[:3]:
            raise ValueError(
                f"k and v must be [B, n_kv_heads, L, d] with the same B, n_kv_heads and L, "
                f"got k {k.shape} and v {v.shape}"
            )
        if self._k is None:
            cap = max(self._initial_capacity, k.shape[2])
            B, n_kv, _, d_k = k.shape
            self._k = np.empty((B, n_kv, cap, d_k), dtype=k.dtype)
            self._v = np.empty((B, n_kv, cap, v.shape[-1]), dtype=v.dtype)
        else:
            want_k = (self._k.shape[0], self._k.shape[1], k.shape[2], self._k.shape[3])
            want_v = (self._v.shape[0], self._v.shape[1], v.shape[2], self._v.shape[3])
            if k.shape != want_k or v.shape != want_v:
                raise ValueError(
                    f"chunk does not match the cache: expected k {want_k} and v {want_v} "
                    f"(batch, n_kv_heads, L, d), got k {k.shape} and v {v.shape}"
                )
            if k.dtype != self._k.dtype:
                raise TypeError(f"chunk dtype {k.dtype} does not match the cache dtype {self._k.dtype}")
        L = k.shape[2]
        need = self._len + L
        if need > self._k.shape[2]:
            cap = max(need, 2 * self._k.shape[2])  # doubling: amortised O(1) copies per position
            self._k = _grow(self._k, cap, self._len)
            self._v = _grow(self._v, cap, self._len)
            self.copies += 1
        self._k[:, :, self._len : need] = k
        self._v[:, :, self._len : need] = v
        self._len = need
        return self.keys, self.values


def _grow(buf: np.ndarray, cap: int, n: int) -> np.ndarray:
    new = np.empty(buf.shape[:2] + (cap,) + buf.shape[3:], dtype=buf.dtype)
    new[:, :, :n] = buf[:, :, :n]
    return new
