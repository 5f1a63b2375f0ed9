"""A key/value cache for incremental decoding (chapter 4).

A decode step reads every cached key and value once, so the layout is chosen
for that read:

* keys are kept as ``[B, n_kv_heads, capacity, d_k]``: the first ``len`` rows
  of each head are one contiguous ``[len, d_k]`` matrix, and the scores ``q
  K^T`` are one BLAS call per key/value head;
* values are kept *transposed*, ``[B, n_kv_heads, d_v, capacity]``: each head
  is ``d_v`` long contiguous rows, so ``p V = (V^T p^T)^T`` streams along
  those rows. (Kept as ``[len, d_v]``, the product ``p V`` would walk a
  narrow matrix column-wise.)

:attr:`KVCache.values` still shows the values as ``[B, n_kv_heads, len,
d_v]`` (a transposed view, no copy). Capacity doubles when it runs out, so
appending ``n`` positions one at a time reallocates ``O(log n)`` times and
copies ``O(n)`` positions in total, not ``O(n^2)``.
"""

from __future__ import annotations

import numpy as np

from ._checks import check_count


class KVCache:
    """Keys and values of the positions seen so far, for one attention layer.

    Create it empty and hand it to ``layer.forward(x_chunk,
    kv_cache=cache)``: the first chunk fixes the batch size, the number of
    key/value heads, ``d_k``, ``d_v`` and the dtype. A cache belongs to one
    layer and one batch of sequences.

    ``initial_capacity`` is the number of positions to allocate at the first
    append (at least the first chunk's length); pass the final length to
    preallocate and never reallocate.
    """

    def __init__(self, initial_capacity: int = 16):
        initial_capacity = check_count(initial_capacity, "initial_capacity")
        self._k = None  # [B, n_kv_heads, capacity, d_k]
        self._vt = None  # [B, n_kv_heads, d_v, capacity]: values, transposed
        self._len = 0
        self._initial_capacity = int(initial_capacity)
        # how many times the buffers were reallocated (amortised growth is
        # tested on it)
        self.reallocations = 0

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        if self._k is None:
            return "KVCache(empty)"
        B, n_kv, d_k, d_v = self.layout
        return (
            f"KVCache(batch={B}, n_kv_heads={n_kv}, d_k={d_k}, d_v={d_v}, "
            f"positions={self._len}, "
            f"capacity={self.capacity}, dtype={self.dtype}, "
            f"nbytes={self.nbytes})"
        )

    @property
    def layout(self) -> tuple[int, int, int, int] | None:
        """``(batch, n_kv_heads, d_k, d_v)`` fixed by the first chunk, or
        None while empty."""
        if self._k is None:
            return None
        B, n_kv, _, d_k = self._k.shape
        return B, n_kv, d_k, self._vt.shape[2]

    @property
    def batch_size(self) -> int | None:
        return None if self._k is None else self._k.shape[0]

    @property
    def dtype(self) -> np.dtype | None:
        return None if self._k is None else self._k.dtype

    @property
    def capacity(self) -> int:
        """Positions allocated (``>= len(self)``)."""
        return 0 if self._k is None else self._k.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values held: ``B * n_kv_heads * len * (d_k +
        d_v) * itemsize``.

        Positions stored, not spare capacity: this is what a decode step has
        to read.
        """
        if self._k is None:
            return 0
        B, n_kv, d_k, d_v = self.layout
        return B * n_kv * self._len * (d_k + d_v) * self._k.itemsize

    @property
    def keys(self) -> np.ndarray:
        """View of the cached keys, ``[B, n_kv_heads, len, d_k]``."""
        if self._k is None:
            raise ValueError("the cache is empty: it holds no keys yet")
        return self._k[:, :, : self._len]

    @property
    def values(self) -> np.ndarray:
        """View of the cached values, ``[B, n_kv_heads, len, d_v]`` (stored
        transposed; no copy)."""
        if self._vt is None:
            raise ValueError("the cache is empty: it holds no values yet")
        return self._vt[:, :, :, : self._len].swapaxes(-1, -2)

    def check_chunk(
        self, x_shape, *, batch, n_kv_heads, d_k, d_v, dtype
    ) -> None:
        """Raise unless a layer's chunk ``x_chunk`` (of shape ``x_shape``)
        fits this cache.

        The layers call this before any work, so a mismatch is reported in
        terms of ``x_chunk`` and ``kv_cache``, not as a broadcasting error
        deep inside NumPy.
        """
        self._check_layout(
            (batch, n_kv_heads, d_k, d_v), dtype, f"x_chunk {tuple(x_shape)}"
        )

    def _check_layout(self, layout, dtype, got: str) -> None:
        """The one check that a chunk fits the cache: ``layout`` is the
        chunk's ``(batch, n_kv_heads, d_k, d_v)``, ``got`` names it."""
        if self._k is None:
            return
        if tuple(layout) != self.layout:
            names = ("batch", "n_kv_heads", "d_k", "d_v")
            have = ", ".join(f"{n} {x}" for n, x in zip(names, self.layout))
            want = ", ".join(f"{n} {x}" for n, x in zip(names, layout))
            raise ValueError(
                f"{got} gives {want}, but kv_cache holds {have}: a cache "
                f"belongs to one layer and one batch of sequences ({self!r})"
            )
        if np.dtype(dtype) != self.dtype:
            raise TypeError(
                f"{got} has dtype {np.dtype(dtype)}, but kv_cache holds "
                f"{self.dtype}; convert it or start a new cache"
            )

    def append(
        self, k: np.ndarray, v: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Add a chunk's keys ``[B, n_kv, L, d_k]`` and values ``[B, n_kv, L,
        d_v]``.

        Returns views of all cached keys and values, the chunk included (no
        copy of the cache).
        """
        if not isinstance(k, np.ndarray) or not isinstance(v, np.ndarray):
            raise TypeError(
                f"k and v must be NumPy arrays, got {type(k).__name__} and "
                f"{type(v).__name__}"
            )
        if k.ndim != 4 or v.ndim != 4 or k.shape[:3] != v.shape[:3]:
            raise ValueError(
                "k and v must be [B, n_kv_heads, L, d] with the same B, "
                "n_kv_heads and L, "
                f"got k {k.shape} and v {v.shape}"
            )
        if not np.issubdtype(k.dtype, np.floating) or k.dtype != v.dtype:
            raise TypeError(
                "k and v must share one floating-point dtype, got "
                f"{k.dtype} and {v.dtype}"
            )
        B, n_kv, L, d_k = k.shape
        d_v = v.shape[3]
        if self._k is None:
            cap = max(self._initial_capacity, L)
            self._k = np.empty((B, n_kv, cap, d_k), dtype=k.dtype)
            self._vt = np.empty((B, n_kv, d_v, cap), dtype=v.dtype)
        else:
            self._check_layout(
                (B, n_kv, d_k, d_v), k.dtype, f"k {k.shape} and v {v.shape}"
            )
        need = self._len + L
        if need > self.capacity:
            # doubling: O(log n) reallocations, O(n) copied in total
            cap = max(need, 2 * self.capacity)
            self._k = _grow(self._k, cap, self._len, axis=2)
            self._vt = _grow(self._vt, cap, self._len, axis=3)
            self.reallocations += 1
        # [B, n_kv, L, d_k] into rows len .. len+L-1
        self._k[:, :, self._len : need] = k
        # [B, n_kv, d_v, L] into columns
        self._vt[:, :, :, self._len : need] = v.swapaxes(-1, -2)
        self._len = need
        return self.keys, self.values

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (keeps the memory; e.g.
        to reject drafted tokens)."""
        if (
            isinstance(length, bool)
            or not isinstance(length, (int, np.integer))
            or not 0 <= length <= self._len
        ):
            raise ValueError(
                f"length must be an integer in [0, {self._len}] (len of "
                f"the cache), got {length!r}"
            )
        self._len = int(length)


def _grow(buf: np.ndarray, cap: int, n: int, axis: int) -> np.ndarray:
    """A copy of ``buf`` with capacity ``cap`` along ``axis``; its first
    ``n`` positions are kept."""
    shape = list(buf.shape)
    shape[axis] = cap
    new = np.empty(shape, dtype=buf.dtype)
    keep = (slice(None),) * axis + (slice(0, n),)
    new[keep] = buf[keep]
    return new
