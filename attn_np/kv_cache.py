"""A key/value cache for incremental decoding (chapter 4).

A decode step reads every cached key and value once, so the layout is chosen
for that read. Keys and values are both kept *transposed*, ``[B,
n_kv_heads, d_k, capacity]`` and ``[B, n_kv_heads, d_v, capacity]``: each
head is ``d`` contiguous rows, one per feature, ``len`` positions long.

* The scores ``q K^T`` are ``q`` times a ``[d_k, len]`` matrix stored row
  by row: BLAS adds up ``d_k`` long rows, scaled by the entries of ``q``.
* ``p V`` is computed as ``(V^T p^T)^T`` (:func:`~attn_np.attention_forward`
  does so when ``V`` is stored transposed): BLAS takes dot products along
  the ``d_v`` long rows.

Kept as ``[len, d]``, each product would walk ``len`` short rows of ``d``
numbers, which BLAS reads markedly more slowly (``python -m attn_np.bench
decode`` times a step). :attr:`KVCache.keys` and :attr:`KVCache.values`
still show them as ``[B, n_kv_heads, len, d]`` (transposed views, no copy);
appending a position writes one column of each. Capacity doubles when it
runs out, so appending ``n`` positions one at a time reallocates ``O(log
n)`` times and copies ``O(n)`` positions in total, not ``O(n^2)``.

Rolling caches (chapter 8). ``KVCache(window=W)`` serves a sliding-window
layer: before a chunk is appended, every position but the last ``W - 1``
is forgotten (the survivors move to the front of the buffer), so a chunk
of ``C`` positions sees up to ``W - 1`` cached keys plus itself, the buffer
holds at most ``W + C - 1`` positions and, decoding one token at a time,
at most ``W`` (a buffer grown for a long chunk shrinks back).
``KVCache(window=W, sink_tokens=S)`` (StreamingLLM, Xiao et
al. 2023) also keeps positions ``0 ... S-1`` forever, in front, and the
last ``W - S - 1`` others. ``len(cache)`` counts every position seen;
:attr:`KVCache.positions` says which ones are held.
"""

from __future__ import annotations

import numpy as np

from ._checks import check_count, check_positive_int
from .attention import position_mask


class KVCache:
    """Keys and values of the positions seen so far, for one attention layer.

    Create it empty and hand it to ``layer.forward(x_chunk,
    kv_cache=cache)``: the first chunk fixes the batch size, the number of
    key/value heads, ``d_k``, ``d_v`` and the dtype. A cache belongs to one
    layer and one batch of sequences.

    ``initial_capacity`` is the number of positions to allocate at the first
    append (at least the first chunk's length); pass the final length to
    preallocate and never reallocate.

    ``window=W`` makes it a rolling cache for a layer with the same window;
    ``sink_tokens=S`` (``0 <= S < W``) also keeps the first S positions.
    """

    def __init__(
        self, initial_capacity: int = 16, *, window=None, sink_tokens=0
    ):
        initial_capacity = check_count(initial_capacity, "initial_capacity")
        sink_tokens = check_count(sink_tokens, "sink_tokens", minimum=0)
        if window is not None:
            window = check_positive_int(window, "window")
        if sink_tokens and (window is None or sink_tokens >= window):
            raise ValueError(
                "sink_tokens must be smaller than window (the window holds "
                f"the sinks and at least the query itself), got "
                f"sink_tokens={sink_tokens} and window={window}"
            )
        self.window, self.sink_tokens = window, sink_tokens
        self._kt = None  # [B, n_kv_heads, d_k, capacity]: keys, transposed
        self._vt = None  # [B, n_kv_heads, d_v, capacity]: values, transposed
        self._len = 0  # positions held
        self._seen = 0  # positions appended since the start
        self._initial_capacity = int(initial_capacity)
        # how many times the buffers were reallocated (amortised growth is
        # tested on it)
        self.reallocations = 0

    def __len__(self) -> int:
        """Positions seen so far: the next chunk starts at this position
        (a rolling cache may hold fewer)."""
        return self._seen

    def __repr__(self) -> str:
        rolling = (
            ""
            if self.window is None
            else f"window={self.window}, sink_tokens={self.sink_tokens}, "
        )
        if self._kt is None:
            return f"KVCache({rolling}empty)"
        B, n_kv, d_k, d_v = self.layout
        return (
            f"KVCache({rolling}batch={B}, n_kv_heads={n_kv}, d_k={d_k}, "
            f"d_v={d_v}, seen={self._seen}, held={self._len}, "
            f"capacity={self.capacity}, dtype={self.dtype}, "
            f"nbytes={self.nbytes})"
        )

    @property
    def positions(self) -> np.ndarray:
        """Absolute positions of the keys held, in buffer order: ``[held]``
        ints (the sinks first, then a contiguous run ending at
        ``len(self) - 1``)."""
        n_sink = min(self.sink_tokens, self._seen)
        recent = self._len - n_sink  # held positions after the sinks
        return np.concatenate(
            [np.arange(n_sink), np.arange(self._seen - recent, self._seen)]
        )

    def attention_mask(self, n_queries: int) -> np.ndarray:
        """``[n_queries, held]`` bool for the last ``n_queries`` positions
        appended: causal, within the window, sinks always visible."""
        n_queries = check_positive_int(n_queries, "n_queries")
        if n_queries > min(self._len, self._seen):
            raise ValueError(
                f"n_queries must be at most the {self._len} positions "
                f"held, got {n_queries}"
            )
        q_pos = np.arange(self._seen - n_queries, self._seen)  # [n_q]
        return position_mask(
            q_pos,
            self.positions,
            window=self.window,
            sink_tokens=self.sink_tokens,
        )

    @property
    def layout(self) -> tuple[int, int, int, int] | None:
        """``(batch, n_kv_heads, d_k, d_v)`` fixed by the first chunk, or
        None while empty."""
        if self._kt is None:
            return None
        B, n_kv, d_k, _ = self._kt.shape
        return B, n_kv, d_k, self._vt.shape[2]

    @property
    def batch_size(self) -> int | None:
        return None if self._kt is None else self._kt.shape[0]

    @property
    def dtype(self) -> np.dtype | None:
        return None if self._kt is None else self._kt.dtype

    @property
    def capacity(self) -> int:
        """Positions allocated (``>= len(self)``)."""
        return 0 if self._kt is None else self._kt.shape[3]

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values held: ``B * n_kv_heads * len * (d_k +
        d_v) * itemsize``.

        Positions held, not spare capacity or positions already forgotten:
        this is what a decode step has to read.
        """
        if self._kt is None:
            return 0
        B, n_kv, d_k, d_v = self.layout
        return B * n_kv * self._len * (d_k + d_v) * self._kt.itemsize

    @property
    def keys(self) -> np.ndarray:
        """View of the cached keys, ``[B, n_kv_heads, len, d_k]`` (stored
        transposed; no copy)."""
        if self._kt is None:
            raise ValueError("the cache is empty: it holds no keys yet")
        return self._kt[:, :, :, : self._len].swapaxes(-1, -2)

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
        if self._kt is None:
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

        Returns views of all cached keys and values, the chunk included.
        Between reallocations no step copies the cache; a reallocation
        (``O(log n)`` of them) copies what it holds once.
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
        if self._kt is None:
            cap = max(self._initial_capacity, L)
            if self.window is not None:
                cap = max(min(cap, self.window), L)
            self._kt = np.empty((B, n_kv, d_k, cap), dtype=k.dtype)
            self._vt = np.empty((B, n_kv, d_v, cap), dtype=v.dtype)
        else:
            self._check_layout(
                (B, n_kv, d_k, d_v), k.dtype, f"k {k.shape} and v {v.shape}"
            )
        if self.window is not None:
            self._evict()
        need = self._len + L
        # a rolling cache gives back what a long chunk took
        small = None if self.window is None else max(need, self.window)
        if need > self.capacity or (small and self.capacity > 2 * small):
            # doubling: O(log n) reallocations, O(n) copied in total; a
            # rolling cache stops at W (or W - 1 + the chunk)
            cap = max(need, 2 * self.capacity)
            if small:
                cap = min(cap, small)
            self._kt = _grow(self._kt, cap, self._len, axis=3)
            self._vt = _grow(self._vt, cap, self._len, axis=3)
            self.reallocations += 1
        # [B, n_kv, d_k, L] and [B, n_kv, d_v, L] into columns len ...
        self._kt[:, :, :, self._len : need] = k.swapaxes(-1, -2)
        self._vt[:, :, :, self._len : need] = v.swapaxes(-1, -2)
        self._len = need
        self._seen += L
        return self.keys, self.values

    def _evict(self) -> None:
        """Keep the sinks and the last ``W - 1 - S`` other positions: the
        ones the next chunk's first query may still attend."""
        n_sink = min(self.sink_tokens, self._seen)  # sinks held, in front
        recent = self._len - n_sink
        keep = min(recent, self.window - 1 - self.sink_tokens)
        if keep < recent:
            # move the survivors [len - keep, len) to [n_sink, n_sink+keep)
            src = slice(self._len - keep, self._len)
            dst = slice(n_sink, n_sink + keep)
            self._kt[..., dst] = self._kt[..., src]  # [B, n_kv, d_k, keep]
            self._vt[..., dst] = self._vt[..., src]  # [B, n_kv, d_v, keep]
            self._len = n_sink + keep

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (keeps the memory; e.g.
        to reject drafted tokens). A rolling cache can only go back as far
        as the next query still finds its window held."""
        lowest = 0
        if self._len < self._seen:  # a rolling cache forgot some
            oldest = int(self.positions[min(self.sink_tokens, self._len)])
            lowest = oldest + self.window - 1 - self.sink_tokens
        if (
            isinstance(length, bool)
            or not isinstance(length, (int, np.integer))
            or not lowest <= length <= self._seen
        ):
            raise ValueError(
                f"length must be an integer in [{lowest}, {self._seen}] "
                f"(positions the cache can go back to), got {length!r}"
            )
        self._len -= self._seen - int(length)
        self._seen = int(length)


def _grow(buf: np.ndarray, cap: int, n: int, axis: int) -> np.ndarray:
    """A copy of ``buf`` with capacity ``cap`` along ``axis``; its first
    ``n`` positions are kept."""
    shape = list(buf.shape)
    shape[axis] = cap
    new = np.empty(shape, dtype=buf.dtype)
    keep = (slice(None),) * axis + (slice(0, n),)
    new[keep] = buf[keep]
    return new
