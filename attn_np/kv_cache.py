"""A key/value cache for incremental decoding (chapter 4).

A decode step reads every cached key and value once, so the layout is chosen
for that read. Keys and values are kept *transposed*, in one buffer ``[B,
n_kv_heads, d_k + d_v, capacity]``: each head is ``d`` contiguous rows, one
per feature, ``len`` positions long.

* The scores ``q K^T`` are ``q`` times a ``[d_k, len]`` matrix stored row
  by row: BLAS adds up ``d_k`` long rows, scaled by the entries of ``q``.
* ``p V`` is computed as ``(V^T p^T)^T`` (the grouped core does so when
  ``V`` is stored transposed): BLAS takes dot products along the ``d_v``
  long rows.

Kept as ``[len, d]``, each product would walk ``len`` short rows of ``d``
numbers, which BLAS reads markedly more slowly (``python -m attn_np.bench
decode`` times a step). :attr:`KVCache.keys` and :attr:`KVCache.values`
still show them as ``[B, n_kv_heads, len, d]`` (transposed views, no copy);
appending a position writes one column. Capacity doubles when it runs out,
so appending ``n`` positions one at a time reallocates ``O(log n)`` times
and copies ``O(n)`` positions in total, not ``O(n^2)``.

Every cache of the library (this one, chapter 7's
:class:`~attn_np.LatentKVCache`) is a :class:`CacheBuffer`: the same
protocol, ``len(cache)``, ``cache.nbytes``, ``cache.truncate(n)``,
``cache.check_chunk(x_shape, layout, dtype)``, and the same errors.

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

:class:`ChunkedKVCache` (chapter 11) serves Llama 4's chunked layers: it
holds only the current chunk of ``C`` positions.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from ._checks import check_count, check_finite, check_positive_int
from .masks import chunked_mask, position_mask


class CacheBuffer:
    """Positions as the columns of one transposed buffer ``[*lead, width,
    capacity]``, ``width`` the sum of the parts' features: the growth,
    ``truncate``, ``check_chunk`` and the dtype and layout checks of every
    cache. A subclass names its layout (``names``: the leading axes, then
    each part's width) and may forget positions (``_evict``).

    ``allocate(shape, dtype)`` makes the buffer (``np.empty`` by default;
    the decode benchmark passes one that aligns rows).
    """

    names: tuple[str, ...] = ()
    window = None

    def __init__(self, initial_capacity: int = 16, *, allocate=None):
        self._initial_capacity = check_count(
            initial_capacity, "initial_capacity"
        )
        self._allocate = np.empty if allocate is None else allocate
        self._buf = None  # [*lead, width, capacity]
        self._widths = None  # each part's features
        self._len = 0  # positions held
        self._seen = 0  # positions appended since the start
        self._owner = None  # a weak reference to the layer filling it
        # how many times the buffer was reallocated (amortised growth is
        # tested on it)
        self.reallocations = 0

    def __len__(self) -> int:
        """Positions seen so far: the next chunk starts at this position
        (a rolling cache may hold fewer)."""
        return self._seen

    @property
    def layout(self) -> tuple[int, ...] | None:
        """The leading axes and each part's width (:attr:`names`), fixed
        by the first chunk; None while empty."""
        if self._buf is None:
            return None
        return self._buf.shape[:-2] + self._widths

    @property
    def batch_size(self) -> int | None:
        return None if self._buf is None else self._buf.shape[0]

    @property
    def dtype(self) -> np.dtype | None:
        return None if self._buf is None else self._buf.dtype

    @property
    def capacity(self) -> int:
        """Positions allocated (``>= len(self)``)."""
        return 0 if self._buf is None else self._buf.shape[-1]

    @property
    def storage(self) -> np.ndarray | None:
        """The whole transposed buffer, spare capacity included (read it,
        do not write it)."""
        return self._buf

    @property
    def nbytes(self) -> int:
        """Bytes of the positions held, not spare capacity or positions
        already forgotten: what a decode step has to read."""
        if self._buf is None:
            return 0
        lead = math.prod(self._buf.shape[:-2])
        return lead * sum(self._widths) * self._len * self._buf.itemsize

    def check_chunk(self, x_shape, layout, dtype) -> None:
        """Raise unless a layer's chunk ``x_chunk`` (of shape ``x_shape``)
        whose parts have ``layout`` and ``dtype`` fits this cache.

        The layers call this before any work, so a mismatch is reported in
        terms of ``x_chunk`` and ``kv_cache``, not as a broadcasting error
        deep inside NumPy.
        """
        self._check_fits(layout, dtype, f"x_chunk {tuple(x_shape)}")

    def check_owner(self, layer, keys=("W_k", "W_v")) -> None:
        """Raise unless ``layer`` is the one that filled this cache (the
        first to feed it while empty claims it), or makes the same keys
        and values (equal ``layer.params[key]`` for ``keys`` and the same
        RoPE: a copy of it, checked once). Two layers of the same shape
        would otherwise mix their keys and values without a word."""
        owner = None if self._owner is None else self._owner()
        if self._seen == 0 or owner is None:
            self._owner = weakref.ref(layer)
            self._copies = weakref.WeakSet()
            return
        if owner is layer or layer in self._copies:
            return
        same = getattr(owner, "rotary", None) == getattr(
            layer, "rotary", None
        ) and all(
            np.array_equal(owner.params[key], layer.params[key])
            for key in keys
        )
        if not same:
            raise ValueError(
                f"kv_cache was filled by another layer ({owner!r}) with "
                f"other {' and '.join(keys)}; a cache belongs to one "
                f"layer: give each layer its own cache ({self!r})"
            )
        self._copies.add(layer)

    def _check_fits(self, layout, dtype, got: str) -> None:
        """The one check that a chunk fits: ``ValueError`` for another
        layout, ``TypeError`` for another dtype."""
        if self._buf is None:
            return
        if tuple(layout) != self.layout:
            have = ", ".join(
                f"{n} {x}" for n, x in zip(self.names, self.layout)
            )
            want = ", ".join(f"{n} {x}" for n, x in zip(self.names, layout))
            raise ValueError(
                f"{got} gives {want}, but kv_cache holds {have}: a cache "
                f"belongs to one layer and one batch of sequences ({self!r})"
            )
        if np.dtype(dtype) != self.dtype:
            raise TypeError(
                f"{got} has dtype {np.dtype(dtype)}, but kv_cache holds "
                f"{self.dtype}; convert it or start a new cache"
            )

    def append_parts(self, parts: dict) -> None:
        """Write the chunk's parts ``{name: [*lead, L, width]}`` into the
        next columns, growing (or, for a rolling cache, shrinking) the
        buffer first."""
        names, arrays = " and ".join(parts), list(parts.values())
        if not all(isinstance(a, np.ndarray) for a in arrays):
            got = " and ".join(type(a).__name__ for a in arrays)
            raise TypeError(f"{names} must be NumPy arrays, got {got}")
        n_lead = len(self.names) - len(parts)
        lead_names = ("B",) + self.names[1:n_lead]
        form = "[" + ", ".join(lead_names) + ", L, d]"
        if (
            any(a.ndim != n_lead + 2 for a in arrays)
            or len({a.shape[:-1] for a in arrays}) != 1
        ):
            shapes = " and ".join(f"{n} {a.shape}" for n, a in parts.items())
            raise ValueError(
                f"{names} must be {form} with the same "
                f"{', '.join(lead_names)} and L, got {shapes}"
            )
        dt = arrays[0].dtype
        if not np.issubdtype(dt, np.floating) or any(
            a.dtype != dt for a in arrays
        ):
            dts = " and ".join(str(a.dtype) for a in arrays)
            raise TypeError(
                f"{names} must share one floating-point dtype, got {dts}"
            )
        for n, a in parts.items():  # a NaN kept would poison every step
            check_finite(a, n)
        lead, L = arrays[0].shape[:-2], arrays[0].shape[-2]
        widths = tuple(a.shape[-1] for a in arrays)
        if self._buf is None:
            cap = max(self._initial_capacity, L)
            if self.window is not None:
                cap = max(min(cap, self.window), L)
            self._buf = self._allocate(lead + (sum(widths), cap), dt)
            self._widths = widths
        else:
            shapes = " and ".join(f"{n} {a.shape}" for n, a in parts.items())
            self._check_fits(lead + widths, dt, shapes)
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
            new = self._allocate(self._buf.shape[:-1] + (cap,), dt)
            new[..., : self._len] = self._buf[..., : self._len]
            self._buf = new
            self.reallocations += 1
        row = 0
        for a, w in zip(arrays, widths):
            # [*lead, L, w] -> rows row ... row+w-1, columns len ... need-1
            cols = self._buf[..., row : row + w, self._len : need]
            cols[...] = a.swapaxes(-1, -2)
            row += w
        self._len = need
        self._seen += L

    def _part(self, i) -> np.ndarray:
        """Part ``i`` of every held position, ``[*lead, len, width_i]``
        (a transposed view, no copy)."""
        if self._buf is None:
            raise ValueError("the cache is empty: it holds nothing yet")
        row = sum(self._widths[:i])
        rows = self._buf[..., row : row + self._widths[i], : self._len]
        return rows.swapaxes(-1, -2)

    def _evict(self) -> None:
        """Forget what no later query may attend (a rolling cache)."""

    def _lowest(self) -> int:
        """The shortest length :meth:`truncate` may go back to."""
        return 0

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (keeps the memory; e.g.
        to reject drafted tokens). A rolling cache can only go back as far
        as the next query still finds its window held."""
        lowest = self._lowest()
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

    def keep(self, start, offsets) -> None:
        """Of the positions from ``start`` on, keep only ``start +
        offsets[i]``, moved to ``start + i`` (``offsets`` strictly
        increasing): chapter 16's accepted path through a drafted tree,
        whose nodes need not be neighbours in the cache. A cache that
        holds every position only (not a rolling one)."""
        if self.window is not None:
            raise ValueError(
                f"keep needs a cache that holds every position, got {self!r}"
            )
        if (
            isinstance(start, bool)
            or not isinstance(start, (int, np.integer))
            or not 0 <= start <= self._seen
        ):
            raise ValueError(
                f"start must be an integer in [0, {self._seen}], got "
                f"{start!r}"
            )
        off = np.asarray(offsets)
        if off.size and (
            off.ndim != 1
            or not np.issubdtype(off.dtype, np.integer)
            or off[0] < 0
            or (np.diff(off) <= 0).any()
            or start + off[-1] >= self._seen
        ):
            raise ValueError(
                "offsets must be strictly increasing ints in [0, "
                f"{self._seen - start}), got {off.tolist()}"
            )
        if off.size:  # [*lead, width, n] -> the columns start ... start+n-1
            cols = self._buf[..., start + off]  # a copy: overlap is safe
            self._buf[..., start : start + off.size] = cols
        self._len = self._seen = int(start) + off.size

    def _describe(self) -> str:
        if self._buf is None:
            return "empty"
        have = ", ".join(f"{n}={x}" for n, x in zip(self.names, self.layout))
        return (
            f"{have}, seen={self._seen}, held={self._len}, "
            f"capacity={self.capacity}, dtype={self.dtype}, "
            f"nbytes={self.nbytes}"
        )


class KVCache(CacheBuffer):
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

    names = ("batch", "n_kv_heads", "d_k", "d_v")

    def __init__(
        self,
        initial_capacity: int = 16,
        *,
        window=None,
        sink_tokens=0,
        allocate=None,
    ):
        super().__init__(initial_capacity, allocate=allocate)
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

    def __repr__(self) -> str:
        rolling = (
            ""
            if self.window is None
            else f"window={self.window}, sink_tokens={self.sink_tokens}, "
        )
        return f"KVCache({rolling}{self._describe()})"

    @property
    def keys(self) -> np.ndarray:
        """View of the cached keys, ``[B, n_kv_heads, len, d_k]`` (stored
        transposed; no copy)."""
        return self._part(0)

    @property
    def values(self) -> np.ndarray:
        """View of the cached values, ``[B, n_kv_heads, len, d_v]`` (stored
        transposed; no copy)."""
        return self._part(1)

    def append(
        self, k: np.ndarray, v: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Add a chunk's keys ``[B, n_kv, L, d_k]`` and values ``[B, n_kv, L,
        d_v]``.

        Returns views of all cached keys and values, the chunk included.
        Between reallocations no step copies the cache; a reallocation
        (``O(log n)`` of them) copies what it holds once.
        """
        self.append_parts({"k": k, "v": v})
        return self.keys, self.values

    def append_step(self, k, v, *, transposed=False):
        """:meth:`append` for a layer's decode step: one position's keys
        ``[B, n_kv, 1, d_k]`` and values ``[B, n_kv, 1, d_v]`` that the
        layer made itself from an input it checked, written into the next
        column without the checks of :meth:`append` when they fit the
        buffer as it is (its layout and dtype, a free column, no window);
        anything else goes through :meth:`append`. Returns every cached
        key and value (views); ``transposed=True``: as they are stored,
        ``K^T [B, n_kv, d_k, n]`` and ``V^T [B, n_kv, d_v, n]``, each head
        a block of contiguous rows (what a decode step's products
        read)."""
        buf, n = self._buf, self._len
        if (
            self.window is not None
            or buf is None
            or n >= buf.shape[-1]
            or k.dtype != buf.dtype
            or v.dtype != buf.dtype
            or k.shape[:-1] != buf.shape[:-2] + (1,)
            or v.shape[:-1] != k.shape[:-1]
            or (k.shape[-1], v.shape[-1]) != self._widths
        ):
            K, V = self.append(k, v)
            if transposed:
                return K.swapaxes(-1, -2), V.swapaxes(-1, -2)
            return K, V
        d_k = self._widths[0]
        buf[..., :d_k, n] = k[..., 0, :]  # [B, n_kv, d_k] into column n
        buf[..., d_k:, n] = v[..., 0, :]
        self._len, self._seen = n + 1, self._seen + 1
        if transposed:
            return buf[..., :d_k, : n + 1], buf[..., d_k:, : n + 1]
        return self.keys, self.values

    def step(self, q, k, v, rotary=None):
        """A layer's chunk over this cache: ``q [B, n_kv, G, L, d_k]`` and
        ``k`` rotated at the chunk's positions ``len(self) ...`` (by
        ``rotary``, a :class:`~attn_np.rope.Rotary`, or not at all), its
        keys and values appended.

        Returns ``(q, k, v, where)``: the queries, every held key and
        value (views), and the keywords of
        :func:`~attn_np.grouped.grouped_attention_forward` that say which
        keys each query may attend: causal, and for a rolling cache the
        positions held and the sink tokens (the layer's window equals the
        cache's).
        """
        positions = len(self) + np.arange(k.shape[2])  # the chunk's: [L]
        where = {}
        if rotary is not None and self.sink_tokens:
            k, v = self.append(k, v)  # keys kept unrotated
            q, k = self.rotate_by_slot(q, k, rotary)
            where["scale"] = 1.0 / np.sqrt(q.shape[-1] // 2)  # the true d_k
        else:
            if rotary is not None:  # chapter 6: keys cached rotated
                q, k = (
                    rotary.forward(q, positions)[0],
                    rotary.forward(k, positions)[0],
                )
            k, v = self.append(k, v)
        where["causal"] = True  # the last query aligned with the last key
        if self.window is not None:  # a rolling cache: the positions held
            where.update(
                q_positions=positions,
                k_positions=self.positions,
                sink_tokens=self.sink_tokens,
            )
        return q, k, v, where

    # -- chapter 8: rolling caches and StreamingLLM -------------------------
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

    def _evict(self) -> None:
        """Keep the sinks and the last ``W - 1 - S`` other positions: the
        ones the next chunk's first query may still attend."""
        if self.window is None:
            return
        n_sink = min(self.sink_tokens, self._seen)  # sinks held, in front
        recent = self._len - n_sink
        keep = min(recent, self.window - 1 - self.sink_tokens)
        if keep < recent:
            # move the survivors [len - keep, len) to [n_sink, n_sink+keep)
            src = slice(self._len - keep, self._len)
            dst = slice(n_sink, n_sink + keep)
            self._buf[..., dst] = self._buf[..., src]  # [B, n_kv, d, keep]
            self._len = n_sink + keep

    def _lowest(self) -> int:
        if self._len == self._seen:  # nothing forgotten
            return 0
        oldest = int(self.positions[min(self.sink_tokens, self._len)])
        return oldest + self.window - 1 - self.sink_tokens

    def rotate_by_slot(self, q, k, rotary):
        """StreamingLLM's positions inside the cache (Xiao et al. 2023).

        ``k [B, n_kv, n, d_k]`` holds unrotated keys: the sinks, then a
        contiguous run ending with the chunk. Key slot ``s`` turns by
        position ``s``. Query ``i`` (absolute) sees the sinks and the keys
        ``j > i - (W - S)``, ``min(i + 1, W)`` keys in all, and stands at
        position ``min(i, W - 1)`` among them: that is its position for
        the sink columns. For the other columns any common shift will do,
        so it turns by its own slot, and ``i - j`` is kept. The two query
        rotations sit side by side, ``[q_sink, q_recent]``, against keys
        ``[k, 0]`` (sinks) and ``[0, k]`` (the rest): one matmul gives
        both kinds of scores. ``q [B, n_kv, G, L, d_k]``; returns ``(q2,
        k2)`` with ``2 d_k`` features.
        """
        B, n_kv, G, L, d_k = q.shape
        n, S = k.shape[2], min(self.sink_tokens, len(self))
        k, _ = rotary.forward(k, np.arange(n))  # slots 0 ... n-1
        i = len(self) - L + np.arange(L)  # absolute positions [L]
        q_sink, _ = rotary.forward(q, np.minimum(i, self.window - 1))
        q_rest, _ = rotary.forward(q, n - L + np.arange(L))
        # [B, n_kv, G, L, 2*d_k]
        q2 = np.concatenate([q_sink, q_rest], axis=-1)
        k2 = np.zeros((B, n_kv, n, 2 * d_k), dtype=k.dtype)
        k2[:, :, :S, :d_k] = k[:, :, :S]  # sinks meet q_sink
        k2[:, :, S:, d_k:] = k[:, :, S:]  # the rest meet q_rest
        return q2, k2


# -- chapter 11: a chunked layer's cache (Llama 4) ------------------------
class ChunkedKVCache(KVCache):
    """A cache for a chunked layer: it holds only the current chunk.

    Before a chunk of new positions is appended, every position of an
    earlier chunk than the first new one is forgotten: ``floor(n/C) * C``
    on stay (``n = len(cache)``). Decoding one token at a time it holds at
    most ``C`` positions. ``len``, ``nbytes``, ``truncate`` and
    ``check_chunk`` follow the :class:`~attn_np.KVCache` protocol (its
    ``_evict`` and ``_lowest`` hooks are the chunked rule);
    :meth:`attention_mask` is the chunked rule on the held positions.
    """

    def __init__(self, chunk: int, initial_capacity: int = 16, **kw):
        self.chunk = check_positive_int(chunk, "chunk")
        super().__init__(min(initial_capacity, self.chunk), **kw)

    def __repr__(self) -> str:
        return f"ChunkedKVCache(chunk={self.chunk}, {self._describe()})"

    def step(self, q, k, v, rotary=None):
        """:meth:`KVCache.step`, and the absolute positions of the chunk's
        queries and of the keys held (they no longer start at 0)."""
        positions = len(self) + np.arange(k.shape[2])  # the chunk's: [L]
        q, k, v, where = super().step(q, k, v, rotary)
        where.update(q_positions=positions, k_positions=self.positions)
        return q, k, v, where

    def _evict(self) -> None:
        """Keep the positions of the current chunk, ``floor(n/C) * C``
        on, moved to the front of the buffer."""
        keep = self._seen - (self._seen // self.chunk) * self.chunk
        if keep < self._len:
            src = slice(self._len - keep, self._len)
            self._buf[..., :keep] = self._buf[..., src]  # [B, n_kv, d, keep]
            self._len = keep

    def _lowest(self) -> int:
        """It can go back to its oldest position held, no further."""
        return self._seen - self._len

    def attention_mask(self, n_queries: int) -> np.ndarray:
        """``[n_queries, held]``: the chunked rule for the last
        ``n_queries`` positions appended."""
        n_queries = check_positive_int(n_queries, "n_queries")
        if n_queries > self._len:
            raise ValueError(
                f"n_queries must be at most the {self._len} positions "
                f"held, got {n_queries}"
            )
        k_pos = self.positions  # [held]
        return chunked_mask(k_pos[-n_queries:], k_pos, self.chunk)
