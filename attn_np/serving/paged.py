"""A paged key/value cache (chapter 15; Kwon et al. 2023, vLLM).

Chapter 4's :class:`~attn_np.KVCache` gives one sequence one contiguous
buffer. A server does not know how long a request will run, so a
contiguous buffer is either reserved for the longest possible answer
(memory reserved and never used) or grown and copied. A paged cache cuts
memory into pages of ``P`` positions, shared by every sequence::

    pool  k, v    [layers, pages, P, n_kv, d]   one page id, every layer
    table         [pages of one sequence]       e.g. [7, 2, 9]
    slot(pos)     table[pos // P] * P + pos % P

A sequence takes a page when it needs one and gives its pages back when it
ends: at most ``P - 1`` positions per sequence are reserved and not used.

Prefix caching (Zheng et al. 2024, SGLang; vLLM's automatic prefix
caching): a full page is named by a hash chained over its tokens and every
token before it, ``h_i = hash((h_{i-1}, tokens of page i))``. A request
whose prompt starts with pages already named takes them (a reference
count per page) instead of computing them. A page nobody references keeps
its keys and values and its name until the pool needs it back: it is
evicted least recently used first. Only full pages are shared, and a
sequence writes only to pages it alone holds.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from .._checks import (
    all_finite,
    as_float_array,
    check_count,
    check_finite,
    check_float_dtype,
    check_positive_int,
    check_scores,
    check_token_ids,
    check_window,
)


def page_hashes(tokens, page_size, parent=None) -> list[int]:
    """The chained hash of every full page of ``tokens``: ``h_i =
    hash((h_{i-1}, tokens of page i))``, ``h_{-1} = parent`` (None). Two
    pages get the same hash only if everything before them matches."""
    if len(tokens):
        check_token_ids(tokens, None, "tokens")
    out, h = [], parent
    P = page_size
    for i in range(len(tokens) // P):
        h = hash((h, tuple(int(t) for t in tokens[i * P : (i + 1) * P])))
        out.append(h)
    return out


class PagedKVCache:
    """A pool of ``n_pages`` pages of ``page_size`` positions, for
    ``n_layers`` attention layers of ``n_kv_heads`` heads (keys of
    ``d_k``, values of ``d_v`` features), and a block table per sequence.

    ``k[layer]`` is ``[pages, P, n_kv, d_k]`` and ``v[layer]`` ``[pages, P,
    n_kv, d_v]``: one array per kind, ``[layers, pages, P, n_kv, d]``.
    A sequence is any hashable id; :meth:`reserve` gives it the pages for
    its next positions, :meth:`write` stores a layer's keys and values,
    :meth:`gather` reads them back in order, :meth:`release` returns its
    pages.

    MLA layers (chapter 7) keep no keys and values but one row per
    position, ``[c_KV ; k_R]`` of ``d_latent`` numbers: ``n_latent_layers``
    of them are a third array, ``latent [latent layers, pages, P, 1,
    d_latent]``, in the same pages (a page id holds a position of every
    layer, whatever its kind).
    """

    def __init__(
        self,
        n_pages,
        page_size,
        *,
        n_layers=1,
        n_kv_heads=1,
        d_k=64,
        d_v=None,
        dtype=np.float64,
        n_latent_layers=0,
        d_latent=1,
    ):
        self.n_pages = check_positive_int(n_pages, "n_pages")
        self.page_size = check_positive_int(page_size, "page_size")
        self.n_layers = check_count(n_layers, "n_layers", minimum=0)
        self.n_kv_heads = check_positive_int(n_kv_heads, "n_kv_heads")
        self.d_k = check_positive_int(d_k, "d_k")
        self.d_v = (
            self.d_k if d_v is None else check_positive_int(d_v, "d_v")
        )
        self.dtype = check_float_dtype(dtype)
        P, n_kv = self.page_size, self.n_kv_heads
        # [layers, pages, P, n_kv, d]
        self.k = np.zeros((n_layers, n_pages, P, n_kv, self.d_k), dtype)
        self.v = np.zeros((n_layers, n_pages, P, n_kv, self.d_v), dtype)
        n_lat = check_count(n_latent_layers, "n_latent_layers", minimum=0)
        self.d_latent = check_positive_int(d_latent, "d_latent")
        # MLA's rows [c_KV ; k_R]: one "head" of d_latent numbers
        self.latent = np.zeros((n_lat, n_pages, P, 1, self.d_latent), dtype)
        self.refs = np.zeros(n_pages, dtype=np.int64)  # holders per page
        self.free = list(range(n_pages - 1, -1, -1))  # never named: pop()
        self.cached = OrderedDict()  # unreferenced named pages, LRU first
        self.by_hash = {}  # name -> page id
        self.name = {}  # page id -> name
        self.tables = {}  # sequence -> [page ids]
        self.lengths = {}  # sequence -> positions written
        self.evictions = 0

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(n_pages={self.n_pages}, "
            f"page_size={self.page_size}, layers={self.n_layers}, "
            f"latent layers={len(self.latent)}, "
            f"in use={self.pages_in_use}, cached={len(self.cached)}, "
            f"free={len(self.free)})"
        )

    # -- bookkeeping ------------------------------------------------------
    @property
    def pages_in_use(self) -> int:
        """Pages some sequence holds."""
        return int((self.refs > 0).sum())

    @property
    def pages_available(self) -> int:
        """Pages a sequence can take now: free, or cached and evictable."""
        return len(self.free) + len(self.cached)

    @property
    def bytes_per_page(self) -> int:
        """Keys and values (and MLA's rows) of one page in every layer."""
        per_pos = self.n_layers * self.n_kv_heads * (self.d_k + self.d_v)
        per_pos += len(self.latent) * self.d_latent
        return self.page_size * per_pos * self.dtype.itemsize

    def pages_for(self, n_positions) -> int:
        """Pages that hold ``n_positions`` positions: ``ceil(n / P)``."""
        return -(-int(n_positions) // self.page_size)

    def table(self, seq) -> list[int]:
        """The block table of ``seq`` (a copy)."""
        return list(self._table(seq))

    def _table(self, seq):
        if seq not in self.tables:
            raise ValueError(
                f"seq {seq!r} holds no pages of this cache (sequences: "
                f"{sorted(self.tables, key=repr)[:8]})"
            )
        return self.tables[seq]

    def slots(self, seq, start, stop) -> np.ndarray:
        """``[stop - start]`` slots of positions ``start ... stop-1``:
        ``table[pos // P] * P + pos % P``."""
        table = np.asarray(self._table(seq), dtype=np.int64)
        if not 0 <= start <= stop <= len(table) * self.page_size:
            raise ValueError(
                f"positions [{start}, {stop}) must lie in the "
                f"{len(table) * self.page_size} positions of seq {seq!r}'s "
                f"{len(table)} pages"
            )
        pos = np.arange(start, stop)
        return table[pos // self.page_size] * self.page_size + (
            pos % self.page_size
        )

    # -- pages in and out ------------------------------------------------
    def _take(self) -> int:
        """A page for writing: a free one, else the least recently used
        unreferenced named page (its name is forgotten)."""
        if self.free:
            page = self.free.pop()
        else:
            page, _ = self.cached.popitem(last=False)  # LRU
            del self.by_hash[self.name.pop(page)]
            self.evictions += 1
        self.refs[page] = 1
        return page

    def _drop(self, page) -> None:
        self.refs[page] -= 1
        if self.refs[page] == 0:
            if page in self.name:  # keep its keys and values for reuse
                self.cached[page] = True
            else:
                self.free.append(page)

    def reserve(self, seq, n_positions) -> bool:
        """Give ``seq`` (a new sequence, or one it holds) the pages for
        its next ``n_positions`` positions; False, and nothing taken, if
        the pool cannot."""
        n_positions = check_count(n_positions, "n_positions", minimum=0)
        table = self.tables.get(seq, [])
        length = self.lengths.get(seq, 0)
        need = self.pages_for(length + n_positions) - len(table)
        if need > self.pages_available:
            return False
        self.tables[seq] = table + [self._take() for _ in range(need)]
        self.lengths.setdefault(seq, 0)
        return True

    def advance(self, seq, n_positions) -> None:
        """Count ``n_positions`` more positions of ``seq`` as written."""
        new = self.lengths[seq] + int(n_positions)
        if new > len(self._table(seq)) * self.page_size:
            raise ValueError(
                f"seq {seq!r} has pages for "
                f"{len(self.tables[seq]) * self.page_size} positions, "
                f"not {new}: reserve them first"
            )
        self.lengths[seq] = new

    def release(self, seq) -> None:
        """Give back every page of ``seq`` (a named page stays cached
        until evicted)."""
        for page in reversed(self._table(seq)):  # the tail evicted first
            if page >= 0:  # -1: freed behind a window
                self._drop(page)
        del self.tables[seq], self.lengths[seq]

    # -- prefix caching --------------------------------------------------
    def lookup(self, seq, names) -> int:
        """Take, for ``seq`` (which holds no pages yet), the cached pages
        named by ``names`` (:func:`page_hashes` of its tokens), as far as
        they go; returns the positions they hold."""
        if self.tables.get(seq):
            raise ValueError(f"seq {seq!r} already holds pages")
        table = []
        for h in names:
            page = self.by_hash.get(h)
            if page is None:
                break
            if self.refs[page] == 0:
                del self.cached[page]
            self.refs[page] += 1
            table.append(page)
        self.tables[seq] = table
        self.lengths[seq] = len(table) * self.page_size
        return self.lengths[seq]

    def name_pages(self, seq, names) -> None:
        """Name the full pages of ``seq`` (``names[i]`` for page ``i``)
        written so far, so later requests can share them. A page whose
        name another page already has keeps no name."""
        table = self._table(seq)
        full = min(self.lengths[seq] // self.page_size, len(names))
        for i in range(full):
            page, h = table[i], names[i]
            if page in self.name or h in self.by_hash:
                continue
            self.name[page], self.by_hash[h] = h, page

    # -- keys and values -------------------------------------------------
    def store(self, layer, slots, k, v) -> None:
        """Store keys ``k [n_kv, T, d_k]`` and values ``v [n_kv, T, d_v]``
        at ``slots [T]`` of ``layer`` (:meth:`slots`): the rows of many
        sequences in one write."""
        for name, a in (("k", k), ("v", v)):
            check_finite(as_float_array(a, name, min_ndim=2), name)
        P = self.page_size
        kf = self.k[layer].reshape(self.n_pages * P, *self.k.shape[3:])
        vf = self.v[layer].reshape(self.n_pages * P, *self.v.shape[3:])
        kf[slots] = k.swapaxes(0, 1)  # [T, n_kv, d_k]
        vf[slots] = v.swapaxes(0, 1)  # [T, n_kv, d_v]

    def store_latent(self, layer, slots, rows) -> None:
        """Store MLA's rows ``[c_KV ; k_R]`` ``[T, d_latent]`` at ``slots
        [T]`` of latent ``layer``."""
        flat = self.latent[layer].reshape(-1, self.d_latent)  # [pages*P, d]
        flat[slots] = rows

    def write(self, layer, seq, start, k, v) -> None:
        """Store keys ``k [n_kv, L, d_k]`` and values ``v [n_kv, L, d_v]``
        of positions ``start ... start+L-1`` of ``seq`` in ``layer``."""
        self.store(layer, self.slots(seq, start, start + k.shape[1]), k, v)

    def gather(self, layer, seq, start, stop):
        """Keys ``[n_kv, n, d_k]`` and values ``[n_kv, n, d_v]`` of
        positions ``start ... stop-1`` (``n = stop - start``) of ``seq``:
        the dense gather. Whole pages are copied once into chapter 4's
        layout (each head's features in rows, positions along them) and
        the positions asked for are a view of them."""
        P = self.page_size
        first, last = start // P, -(-stop // P)
        self.slots(seq, start, stop)  # checks the range
        pages = np.asarray(self._table(seq)[first:last])  # [m]
        cut = slice(start - first * P, stop - first * P)
        out = []
        for pool in (self.k, self.v):
            # [m, P, n_kv, d] -> [n_kv, d, m*P], contiguous
            a = pool[layer, pages].transpose(2, 3, 0, 1)
            a = np.ascontiguousarray(a).reshape(*a.shape[:2], -1)
            out.append(a[..., cut].swapaxes(-1, -2))  # [n_kv, n, d]
        return out[0], out[1]

    def check(self) -> None:
        """Raise ``AssertionError`` unless the bookkeeping holds: every
        page is free, cached or held, its count equals its holders, and a
        page two sequences hold is full and named (nobody writes it)."""
        holders = np.zeros(self.n_pages, dtype=np.int64)
        for seq, table in self.tables.items():
            live = [p for p in table if p >= 0]
            assert len(set(live)) == len(live), f"{seq!r} repeats a page"
            assert self.lengths[seq] <= len(table) * self.page_size
            for page in table:
                if page >= 0:
                    holders[page] += 1
        assert np.array_equal(holders, self.refs), "reference counts"
        free, cached = set(self.free), set(self.cached)
        held = set(np.flatnonzero(self.refs).tolist())
        assert len(free) == len(self.free), "a page freed twice"
        assert not (free & cached or free & held or cached & held)
        assert len(free | cached | held) == self.n_pages, "a page leaked"
        assert all(p in self.name for p in cached), "cached without name"
        for seq, table in self.tables.items():
            n_written = self.pages_for(self.lengths[seq])
            for i, page in enumerate(table):
                if page < 0:
                    continue
                shared = self.refs[page] > 1
                full = (i + 1) * self.page_size <= self.lengths[seq]
                if shared:
                    assert full and page in self.name, (
                        f"page {page} is shared and written by {seq!r}"
                    )
            assert n_written <= len(table)


def padded_tables(tables) -> np.ndarray:
    """``[B, m]`` page ids of ``B`` block tables (lists), the shorter ones
    padded with ``-1`` (no page), as a page freed behind a window is."""
    m = max((len(t) for t in tables), default=0)
    out = np.full((len(tables), max(m, 1)), -1, dtype=np.int64)
    for b, t in enumerate(tables):
        out[b, : len(t)] = t
    return out


def gather_batch(pages, slots, width):
    """Keys (or values) ``[B, n_kv, n, d]`` at ``slots [B, n]`` of one
    layer's pool ``pages [pages, P, n_kv, d]``: one gather for every
    sequence, laid out as chapter 4's cache lays out one (each head's
    features in rows of ``width >= n`` positions), the ``n`` asked for a
    view of them."""
    flat = pages.reshape(-1, *pages.shape[2:])  # [pages*P, n_kv, d]
    rows = flat[slots]  # [B, n, n_kv, d]
    B, n, n_kv, d = rows.shape
    out = np.empty((B, n_kv, d, width), dtype=pages.dtype)
    out[..., :n] = rows.transpose(0, 2, 3, 1)  # [B, n_kv, d, n]
    return out[..., :n].swapaxes(-1, -2)  # [B, n_kv, n, d]


def paged_attention(
    q, k_pages, v_pages, tables, lengths, *, window=None, scale=None,
    attend=None,
):  # fmt: skip
    """Causal attention of ``B`` sequences, each over its own pages, in
    one call: ``q [B, n_kv, G, L, d_k]``, the last ``L`` of each
    sequence's ``lengths[b]`` positions (``L = 1``: a decode step of
    every sequence); ``k_pages [pages, P, n_kv, d_k]``, ``v_pages
    [pages, P, n_kv, d_v]`` one layer's pool; ``tables`` the sequences'
    block tables (lists, or :func:`padded_tables`). Returns ``o [B, n_kv,
    G, L, d_v]``.

    The dense gather, for a ragged batch: every sequence's keys and
    values are copied from its pages into one padded array ``[B, n_kv,
    L_k, d]``, **right-aligned** (each sequence's last position in the
    last column), and a mask ``[B, 1, 1, L_k]`` hides the columns before
    its first key. Aligned so, the causal rule (the last query at the
    last key) and a ``window`` (keys less than ``window`` positions
    behind the query) hold for every row as they hold for one
    sequence alone, and the batch is one product and one softmax. With a
    ``window``, only the keys some query can still see are gathered.

    ``attend(q, k, v, mask, positions) -> o`` does the attention on the
    gathered keys (``positions [B, L_k]``: each column's absolute
    position): by default :func:`masked_attention` (``scale``:
    ``1/sqrt(d_k)``); the engine passes its layer's own step (its window,
    sinks, score mods).
    """
    tables, lengths, L = _check_batch(q, k_pages, v_pages, tables, lengths)
    window = check_window(window)
    return _gathered_attention(
        q, k_pages, v_pages, tables, lengths, window, scale, attend
    )


def _gathered_attention(
    q, k_pages, v_pages, tables, lengths, window, scale, attend,
    check_read=True,
):  # fmt: skip
    """:func:`paged_attention` after its checks: ``tables`` a padded
    ``[B, m]`` int array, ``lengths`` ``[B]`` ints. The engine calls it
    with its own pool and tables (checked when it made them, and every
    key and value checked when stored), and ``check_read=False``: the
    positions read were written by its own checked stores."""
    L = q.shape[3]
    P = k_pages.shape[1]
    first = np.zeros_like(lengths)  # the first key a query can see
    if window is not None:
        first = np.maximum(0, lengths - L + 1 - window)
    L_k = int((lengths - first).max())
    # right-aligned: column c of row b holds position c + lengths[b] - L_k
    pos = np.arange(L_k) + (lengths - L_k)[:, None]  # [B, L_k]
    seen = pos >= first[:, None]  # [B, L_k]: False in the padding
    pos = np.where(seen, pos, first[:, None])  # a held position, hidden
    pages = np.take_along_axis(tables, pos // P, axis=1)  # [B, L_k]
    slots = pages * P + pos % P
    width = -(-L_k // P) * P  # rows of whole pages, as one gather has
    k = gather_batch(k_pages, slots, width)  # [B, n_kv, L_k, d_k]
    v = gather_batch(v_pages, slots, width)  # [B, n_kv, L_k, d_v]
    for name, a in (("k_pages", k), ("v_pages", v)) if check_read else ():
        if not all_finite(a):  # the positions read, not the whole pool
            check_finite(a, f"{name} (at the positions read)")
    mask = None if seen.all() else seen[:, None, None, :]  # [B, 1, 1, L_k]
    if attend is None:
        return masked_attention(q, k, v, mask, window=window, scale=scale)
    return attend(q, k, v, mask, pos)


def masked_attention(q, k, v, mask, *, window=None, scale=None):
    """``q [B, n_kv, G, L, d_k]`` over ``k [B, n_kv, L_k, d_k]``, ``v [B,
    n_kv, L_k, d_v]``: causal (the last query at the last key), within
    ``window``, and where ``mask`` (``[B, 1, 1, L_k]`` bool, or None)
    allows; ``o [B, n_kv, G, L, d_v]``. One softmax for the batch."""
    L, L_k = q.shape[3], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    # [B, n_kv, G, L, d_k] @ [B, n_kv, 1, d_k, L_k] -> [B, n_kv, G, L, L_k]
    with np.errstate(over="ignore", invalid="ignore"):  # checked below
        s = q @ k[:, :, None].swapaxes(-1, -2) * scale
    check_scores(s, scale)
    q_col = L_k - L + np.arange(L)  # [L]
    behind = q_col[:, None] - np.arange(L_k)  # [L, L_k]
    seen = behind >= 0
    if window is not None:
        seen &= behind < window
    if mask is not None:
        seen = seen & mask[:, :, None]  # [B, 1, 1, L, L_k]
    s = np.where(seen, s, -np.inf)  # every row sees its own key
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v[:, :, None]  # [B, n_kv, G, L, d_v]


def _check_batch(q, k_pages, v_pages, tables, lengths):
    """``(tables [B, m], lengths [B], L)``, checked against ``q``."""
    check_finite(as_float_array(q, "q"), "q")  # the pools: when stored
    for name, a in (("k_pages", k_pages), ("v_pages", v_pages)):
        as_float_array(a, name)
    for name, a in (("tables", tables), ("lengths", lengths)):
        if isinstance(a, np.ndarray) and a.size and a.dtype.kind not in "iu":
            raise TypeError(
                f"{name} must hold integers, got dtype {a.dtype}"
            )
    q_shape = getattr(q, "shape", None)
    if q_shape is None or len(q_shape) != 5:
        raise ValueError(
            f"q must be [B, n_kv, G, L, d_k], got shape {q_shape}"
        )
    B, n_kv, _, L, d_k = q.shape
    for name, a in (("k_pages", k_pages), ("v_pages", v_pages)):
        if (
            a.ndim != 4
            or a.shape[2] != n_kv
            or (name == "k_pages" and a.shape[3] != d_k)
        ):
            raise ValueError(
                f"{name} must be [pages, P, n_kv={n_kv}, d] (d = d_k = "
                f"{d_k} for keys) to meet q {q.shape}, got {a.shape}"
            )
    if not isinstance(tables, np.ndarray):
        tables = padded_tables(tables)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    P = k_pages.shape[1]
    if tables.ndim != 2 or len(tables) != B or lengths.shape != (B,):
        raise ValueError(
            f"tables and lengths must hold one entry per sequence of q "
            f"(B={B}), got tables {tables.shape}, lengths {lengths.shape}"
        )
    held = (tables >= 0).sum(axis=1) * P
    if (lengths < L).any() or (lengths > tables.shape[1] * P).any():
        raise ValueError(
            f"lengths must be at least L={L} (the queries are the last L "
            f"positions) and fit the tables' pages ({held.tolist()} "
            f"positions), got {lengths.tolist()}"
        )
    return tables, lengths, L


def _check_pages(q, k_pages, v_pages, table):
    """The arrays of :func:`paged_attention_by_page`, or raise naming
    one: ``q`` finite, the pools of floats (each page is checked as it
    is read), ``table`` of integer page numbers."""
    q = as_float_array(q, "q", min_ndim=4)
    check_finite(q, "q")
    k_pages = as_float_array(k_pages, "k_pages", min_ndim=4)
    v_pages = as_float_array(v_pages, "v_pages", min_ndim=4)
    if np.asarray(table).dtype.kind not in "iu" and np.size(table):
        raise TypeError(
            "table must hold integer page numbers, got dtype "
            f"{np.asarray(table).dtype}"
        )
    return q, k_pages, v_pages


def paged_attention_by_page(
    q, k_pages, v_pages, table, length, *, scale=None
):
    """One sequence's causal attention read page by page, as
    PagedAttention's GPU kernel reads it (Kwon et al. 2023), with chapter
    9's online softmax: ``q [n_kv, G, L, d_k]``, the
    last ``L`` of ``length`` positions; ``k_pages [pages, P, n_kv, d_k]``,
    ``v_pages [pages, P, n_kv, d_v]`` one layer's pool; ``table`` the
    sequence's pages. Returns ``o [n_kv, G, L, d_v]``.

    Each page updates a running maximum ``m``, denominator ``l`` and
    output ``acc`` of every query: ``m' = max(m, max s)``, ``l' = l
    e^(m - m') + sum e^(s - m')``, ``acc' = acc e^(m - m') + e^(s - m')
    V``. No ``[L, length]`` score matrix is ever held.
    """
    q, k_pages, v_pages = _check_pages(q, k_pages, v_pages, table)
    n_kv, G, L, d_k = q.shape
    P = k_pages.shape[1]
    scale = 1.0 / np.sqrt(d_k) if scale is None else scale
    q_pos = length - L + np.arange(L)  # [L] absolute positions
    m = np.full((n_kv, G, L, 1), -np.inf, dtype=q.dtype)
    den = np.zeros((n_kv, G, L, 1), dtype=q.dtype)
    acc = np.zeros((n_kv, G, L, v_pages.shape[-1]), dtype=q.dtype)
    for i, page in enumerate(table[: -(-length // P)]):
        n = min(P, length - i * P)  # positions held in this page
        k = k_pages[page, :n].transpose(1, 0, 2)  # [n_kv, n, d_k]
        v = v_pages[page, :n].transpose(1, 0, 2)  # [n_kv, n, d_v]
        for name, a in ((f"k_pages[{page}]", k), (f"v_pages[{page}]", v)):
            if not all_finite(a):  # the positions read, not the pool
                check_finite(a, name)
        # [n_kv, G, L, d_k] @ [n_kv, 1, d_k, n] -> [n_kv, G, L, n]
        s = q @ k[:, None].swapaxes(-1, -2) * scale
        seen = i * P + np.arange(n) <= q_pos[:, None]  # causal [L, n]
        s = np.where(seen, s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        safe = np.where(np.isfinite(m_new), m_new, 0.0)  # a row sees none
        p = np.exp(s - safe)  # [n_kv, G, L, n]
        alpha = np.exp(np.where(np.isfinite(m), m - safe, -np.inf))
        den = den * alpha + p.sum(axis=-1, keepdims=True)
        acc = acc * alpha + p @ v[:, None]  # [n_kv, G, L, d_v]
        m = m_new
    return acc / den
