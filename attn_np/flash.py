"""FlashAttention in NumPy: exact attention in O(L) memory (chapter 9).

Dao et al. (2022) compute exact attention without ever holding the
``[L_q, L_k]`` score matrix. The forward walks over tiles of keys with
an online softmax (Milakov & Gimelshein 2018): per query a shift
``m``, a running sum ``l`` and an unnormalised output, all rescaled by
``exp(m_old - m_new)`` whenever the shift moves. The rescaling is exact
for any shift; the shift only has to keep ``exp(S - m)`` in range. Here
it is the row's maximum over its first tile, and moves after that only
when a tile's sum outgrows ``2**BIG`` (:func:`_shift`), so later tiles
need no ``rowmax``. The scores are kept in base 2 (``S log2(e)``, with
``exp2``, as GPU FlashAttention kernels do). It keeps the output and,
per query, the log-sum-exp of its scores::

    lse_i = m_i + log(l_i) = log sum_j exp(S_ij)

The backward recomputes each tile's probabilities from it,
``P = exp(S - lse)``, and uses ``D = rowsum(dO * O)`` where the dense
backward uses ``rowsum(P * dP)`` (the two are equal, chapter 1).

The loops follow FlashAttention-2 (Dao 2023): the forward's outer loop
runs over query tiles, the backward's over key tiles. With
``causal=True`` (or a ``window``) tiles where no query may attend any
key are never computed; only tiles that straddle the diagonal (or the
window's edge) are masked. :func:`block_plan` says which is which.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ._checks import (
    check_count,
    check_flag,
    check_positive_int,
    check_upstream,
)
from ._workers import run_tasks, worker_count
from .attention import (
    _check_inputs,
    check_window,
    position_mask,
    unbroadcast,
)
from .masks import create_mask

BLOCK_Q = 256  # query rows per tile: the fastest in the chapter-9 sweep
BLOCK_K = 256  # keys per tile

SKIP, MASKED, FULL = 0, 1, 2  # the states of a tile in block_plan
SUB = 128  # a masked tile is worked in parts of SUB rows and keys
LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453  # log2(e), ln(2)
BIG = 16  # a row's shift moves when its tile sum passes 2**BIG


@dataclass
class FlashCache:
    """What the backward needs: nothing of size ``L_q x L_k``."""

    q: np.ndarray  # [..., L_q, d_k]
    k: np.ndarray  # [..., L_k, d_k]
    v: np.ndarray  # [..., L_k, d_v]
    out: np.ndarray  # [..., L_q, d_v]
    lse: np.ndarray  # [..., L_q], -inf where a query may attend nothing
    scale: float
    causal: bool
    window: int | None
    block_q: int
    block_k: int
    lse2: np.ndarray | None = None  # lse in base 2, as the kernels use it
    mask: np.ndarray | None = None  # [L_q, L_k] bool (chapter 16), or None
    block_sparse: bool = True  # tiles planned from the mask (chapter 16)


def block_plan(L_q, L_k, block_q, block_k, *, causal=False, window=None):
    """The state of every ``[block_q, block_k]`` tile of the scores.

    Returns an int array ``[ceil(L_q/block_q), ceil(L_k/block_k)]``
    holding ``SKIP`` (0: no query of the tile may attend any of its
    keys), ``MASKED`` (1: some pairs may) or ``FULL`` (2: all may).
    Query row ``r`` sits at position ``p = r + L_k - L_q`` (the last
    query aligns with the last key) and may attend key ``c`` iff
    ``c <= p`` (causal) and ``c > p - window`` (window).
    """
    L_q = check_count(L_q, "L_q", minimum=0)
    L_k = check_count(L_k, "L_k")
    block_q, block_k, window = _check_tiles(
        L_q, L_k, block_q, block_k, causal, window
    )
    r0 = np.arange(0, L_q, block_q)[:, None]  # first row of a tile
    r1 = np.minimum(r0 + block_q, L_q) - 1  # last row of a tile
    c0 = np.arange(0, L_k, block_k)[None, :]  # first key of a tile
    c1 = np.minimum(c0 + block_k, L_k) - 1  # last key of a tile
    p0, p1 = r0 + (L_k - L_q), r1 + (L_k - L_q)  # their positions
    some = np.ones((r0.size, c0.size), dtype=bool)  # [n_q, n_k]
    every = some.copy()
    if causal:
        some &= c0 <= p1  # the last query sees the tile's first key
        every &= c1 <= p0  # the first query sees its last key
    if window is not None:
        some &= c1 > p0 - window  # the first query sees its last key
        every &= c0 > p1 - window  # the last query sees its first
    return np.where(every, FULL, np.where(some, MASKED, SKIP))


def flash_attention_flops(
    L_q,
    L_k,
    d_k,
    d_v,
    *,
    block_q=BLOCK_Q,
    block_k=BLOCK_K,
    causal=False,
    window=None,
    batch=1,
):
    """Matmul FLOPs of the tiled kernels, and of the dense ones.

    Forward: ``S = Q K^T`` and ``P V`` on every computed tile,
    ``2 n_q n_k (d_k + d_v)``. Backward: ``S`` again, ``dV``, ``dP``,
    ``dQ`` and ``dK``, ``2 n_q n_k (3 d_k + 2 d_v)``. The dense kernels
    (chapter 1) compute every pair: ``2 L_q L_k (d_k + d_v)`` forward
    and twice that backward. ``batch`` multiplies everything.
    """
    L_q = check_count(L_q, "L_q", minimum=0)
    L_k = check_count(L_k, "L_k")
    d_k, d_v = check_count(d_k, "d_k"), check_count(d_v, "d_v")
    batch = check_count(batch, "batch")
    block_q, block_k, window = _check_tiles(
        L_q, L_k, block_q, block_k, causal, window
    )
    plan = block_plan(
        L_q, L_k, block_q, block_k, causal=causal, window=window
    )
    n_q = np.minimum(block_q, L_q - np.arange(0, L_q, block_q))
    n_k = np.minimum(block_k, L_k - np.arange(0, L_k, block_k))
    pairs = int(np.sum((plan != SKIP) * np.outer(n_q, n_k)))
    dense = batch * 2 * L_q * L_k * (d_k + d_v)
    return {
        "forward": batch * 2 * pairs * (d_k + d_v),
        "backward": batch * 2 * pairs * (3 * d_k + 2 * d_v),
        "dense forward": dense,
        "dense backward": 2 * dense,
        "tiles computed": int(np.sum(plan != SKIP)),
        "tiles masked": int(np.sum(plan == MASKED)),
        "tiles": plan.size,
    }


def flash_attention_forward(
    q,
    k,
    v,
    *,
    causal=False,
    scale=None,
    block_q=BLOCK_Q,
    block_k=BLOCK_K,
    window=None,
    check_finite=True,
    out=None,
    mask=None,
    block_sparse=True,
):
    """Attention by tiles with an online softmax; ``(out, cache)``.

    The same inputs, shapes and broadcasting as
    :func:`attn_np.attention_forward` (leading axes broadcast, so query
    heads can share a key/value head without a copy), and the same
    output. No mask argument: ``causal`` and ``window`` say which keys
    a query may attend. ``window=W`` (needs ``causal=True``): query at
    position ``p`` attends keys ``p - W < j <= p``. A query with no key
    to attend gets a zero row and ``lse = -inf``. ``check_finite`` as in
    :func:`attn_np.attention_forward`. The heads are shared out among
    worker threads (:func:`in_parallel`). ``out``: an array of the
    output's shape and dtype to write it into (any strides: the grouped
    core passes a view of the layout its layer merges the heads in).
    ``mask`` (chapter 16): a ``[L_q, L_k]`` bool array or a mask function
    (:func:`~attn_np.masks.create_mask`) that is the same for every head
    and batch row, ANDed with ``causal`` and ``window``; a tile it hides
    entirely is skipped, a tile it shows entirely needs no mask arithmetic
    (block sparsity: a packed row of documents computes only the tiles of
    each document). ``block_sparse=False`` computes every tile with the
    mask applied, as a kernel that takes a dense mask and never looks at
    it tile by tile (the benchmark's reference).
    """
    q, k, v, _, scale = _check_inputs(
        q, k, v, None, False, scale, check_finite
    )
    block_q, block_k, window = _check_tiles(
        q.shape[-2], k.shape[-2], block_q, block_k, causal, window
    )
    mask = tile_mask_of(mask, q.shape[-2], k.shape[-2])
    check_flag(block_sparse, "block_sparse")
    if check_finite:  # the caller's own call (the core checks its output)
        _check_score_bound(q, k, scale)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    L_q, L_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    dt = np.result_type(q, k, v)
    where = dict(causal=causal, window=window, mask=mask)
    tiles = Tiles(
        L_q, L_k, block_q, block_k, **where, block_sparse=block_sparse
    )
    out = _output_array(out, batch + (L_q, d_v), dt, "out")
    lse2 = np.full(batch + (L_q,), -np.inf, dt)  # [..., L_q], base 2

    def share(take):  # one worker's heads: take(x) is its part of x
        forward_tiles(
            take(q), take(k), take(v), take(out), take(lse2, 1), scale, tiles
        )

    in_parallel(share, batch, tiles.pairs * (q.shape[-1] + d_v))
    cache = FlashCache(
        q, k, v, out, lse2 * LN2, scale, causal, window, block_q, block_k,
        lse2, mask, block_sparse,
    )  # fmt: skip
    return out, cache


def forward_tiles(q, k, v, out, lse2, scale, tiles):
    """The forward's loops for the heads of ``out``: it writes ``out``
    and ``lse2 = lse log2(e)``. Scores are kept in base 2 (``S log2(e)``,
    so that
    ``exp2`` makes the weights: the same numbers, a faster ufunc). The
    shift ``m`` of a row is its exact maximum on the row's first tile;
    after that it moves only when a tile's row sum of ``2^(S - m)``
    passes ``2**BIG``, by ``log2`` of that sum (:func:`_shift`): no
    ``rowmax`` pass over the later tiles, and most need no rescaling."""
    batch, dt = out.shape[:-2], out.dtype
    bq, bk = tiles.shape
    qs_buf = np.empty(batch + (bq, q.shape[-1]), dt)  # Q scale log2(e)
    s_buf = np.empty(batch + (bq, bk), dt)  # one tile of scores
    pv_buf = np.empty(batch + (bq, v.shape[-1]), dt)  # one tile's P V
    rs_buf = np.empty(batch + (bq, 1), dt)  # one tile's row sums
    ones = np.ones((bk, 1), dt)  # rowsum(P) = P @ 1, one BLAS call
    for i, (r0, r1) in enumerate(tiles.rows):
        qs = np.multiply(
            q[..., r0:r1, :], scale * LOG2E, out=qs_buf[..., : r1 - r0, :]
        )
        m = np.full(batch + (r1 - r0, 1), -np.inf, dt)  # the shift
        l = np.zeros(batch + (r1 - r0, 1), dt)  # running sum
        acc = out[..., r0:r1, :]  # view: unnormalised output [.., n_q, d_v]
        for j in tiles.in_row(i):
            c0 = tiles.cols[j][0]
            for a, b, ca, cb, hidden in tiles.blocks(i, j):  # rows, keys
                s = s_buf[..., : b - a, : cb - ca]  # [..., n_q, n_k]
                kt = k[..., c0 + ca : c0 + cb, :].swapaxes(-1, -2)
                mb, lb, ab = m[..., a:b, :], l[..., a:b, :], acc[..., a:b, :]
                rs = rs_buf[..., : b - a, :]
                for exact in (np.isneginf(mb).any(), True):
                    np.matmul(qs[..., a:b, :], kt, out=s)  # [.., d_k, n_k]
                    if hidden is not None:  # a tile on the diagonal
                        np.copyto(s, -np.inf, where=hidden)
                    if _shift(s, ones[: cb - ca], rs, mb, lb, ab, exact):
                        break  # else 2^(S - m) overflowed: once more
                lb += rs  # l += rowsum(P~)
                pv = pv_buf[..., : b - a, :]
                vj = v[..., c0 + ca : c0 + cb, :]  # [..., n_k, d_v]
                ab += np.matmul(s, vj, out=pv)  # P~ V: [..., n_q, d_v]
        seen = l > 0  # [..., n_q, 1]: False where nothing may be attended
        acc /= np.where(seen, l, 1.0)  # O = acc / l; empty rows stay 0
        lse2[..., r0:r1] = np.where(  # lse2 = m + log2(l): [..., n_q]
            seen, m + np.log2(np.where(seen, l, 1.0)), -np.inf
        )[..., 0]


def _shift(s, ones, rs, m, l, acc, exact):
    """Turn a tile's base-2 scores ``s`` into ``P~ = 2^(s - m)`` in place
    and its row sums into ``rs``, moving the shift ``m`` of its rows (and
    rescaling their ``l`` and ``acc`` by ``2^(m_old - m_new)``) where it
    must. ``exact``: ``m`` becomes ``max(m, rowmax s)``, the online
    softmax itself (a row's first tile, or after an overflow). Else the
    old ``m`` is tried first; a row whose sum passes ``2**BIG`` shifts
    by its ``log2``. Returns False if ``2^(s - m)`` overflowed (``s`` is
    spoilt: make it again, with ``exact``)."""
    if exact:
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        _move(m, l, acc, m_new)
    s -= _safe(m)  # a row that may attend nothing yet: shifted by 0
    with np.errstate(over="ignore"):  # an overflow is seen in rs below
        np.exp2(s, out=s)  # P~ = 2^(S - m): masked pairs 0
    np.matmul(s, ones, out=rs)  # rowsum(P~) [..., n_q, 1], one product
    if not np.any(rs > 2.0**BIG):  # no row needs a new shift
        return True
    if exact or not np.all(np.isfinite(rs)):
        return exact  # (an exact shift keeps every entry at most 1)
    # the rows past 2**BIG, by a whole number (so that m + delta is exact,
    # and alpha = 2^(m - m_new) exactly the shift of what is kept); the
    # other rows keep theirs (alpha = 1), whatever heads share the call
    big = rs > 2.0**BIG
    m_new = m + np.where(big, np.ceil(np.log2(np.where(big, rs, 1.0))), 0)
    alpha = np.exp2(m - m_new)  # [..., n_q, 1]
    s *= alpha
    rs *= alpha
    _move(m, l, acc, m_new, alpha)
    return True


def _move(m, l, acc, m_new, alpha=None):
    """Move a row's shift from ``m`` to ``m_new`` (in place): its sum
    ``l`` and output ``acc`` so far scale by ``2^(m - m_new)``, 0 for a
    row that saw nothing before."""
    if alpha is None:
        alpha = np.exp2(m - _safe(m_new))
    l *= alpha
    acc *= alpha  # what earlier tiles added
    m[...] = m_new


def _safe(m):
    """``m`` with 0 where it is ``-inf`` (a row that may attend nothing
    yet), so that ``S - m`` is ``-inf`` there rather than NaN."""
    return np.where(m == -np.inf, 0.0, m)


def flash_attention_backward(dout, cache: FlashCache):
    """Gradients ``(dq, dk, dv)``, each with the shape of its input.

    Outer loop over key tiles, inner over the query tiles that may
    attend them; ``P = exp(S - lse)`` is recomputed per tile and
    ``dS = P * (dP - D)`` with ``D = rowsum(dO * O)``. The heads are
    shared out among worker threads as in the forward
    (:func:`backward_into`).
    """
    c = cache
    if c.out is None:
        raise ValueError(
            "cache was released by a layer's backward (its output freed "
            "once read): run the forward again"
        )
    dout = check_upstream(dout, "dout", c.out.shape, "the attention output")
    dt = np.result_type(c.out, dout)
    D = np.vecdot(dout, c.out)[..., None]  # rowsum(dO * O): [..., L_q, 1]
    grads = tuple(np.zeros(x.shape, dt) for x in (c.q, c.k, c.v))
    return backward_into(dout, c, D, grads)


def backward_into(dout, cache: FlashCache, D, grads):
    """The tiled backward, given ``D = rowsum(dO * O)`` ``[..., L_q, 1]``
    and three zeroed arrays of the inputs' shapes (any strides) that it
    adds ``dq, dk, dv`` to; returns them. It reads neither ``cache.out``
    nor checks ``dout``: the grouped core frees the output before the
    gradients exist (:func:`attn_np.grouped.grouped_tiled_backward`)."""
    c = cache
    inputs = (c.q, c.k, c.v)
    dt = grads[0].dtype
    L_q, L_k = c.q.shape[-2], c.k.shape[-2]
    tiles = Tiles(
        L_q,
        L_k,
        c.block_q,
        c.block_k,
        causal=c.causal,
        window=c.window,
        mask=c.mask,
        block_sparse=c.block_sparse,
    )
    lock = threading.Lock()

    def share(take):  # one worker's heads: take(x) is its part of x
        # an input that other workers' heads share (a broadcast key/value
        # head) gets this worker's own sum, added to the total at the end
        mine = [
            take(g) if take.alone(x) else np.zeros(take(g).shape, dt)
            for g, x in zip(grads, inputs)
        ]
        backward_tiles(
            *(take(x) for x in inputs),
            take(D),
            take(dout),
            take(c.lse * LOG2E if c.lse2 is None else c.lse2, 1),
            *mine,
            c.scale,
            tiles,
        )
        with lock:
            for g, x, part in zip(grads, inputs, mine):
                if not take.alone(x):
                    g += part

    in_parallel(share, dout.shape[:-2], tiles.pairs * 5 * c.q.shape[-1])
    return tuple(grads)


def _output_array(a, shape, dt, name):
    """Zeros of ``shape``, or the caller's ``a`` (checked, zeroed)."""
    if a is None:
        return np.zeros(shape, dt)
    if not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != dt:
        raise ValueError(
            f"{name} must be an array of shape {shape} and dtype {dt}, got "
            f"{getattr(a, 'dtype', type(a).__name__)} of shape "
            f"{np.shape(a)}"
        )
    a[...] = 0
    return a


def backward_tiles(q, k, v, D, dout, lse2, dq, dk, dv, scale, tiles):
    """The backward's loops for the heads of ``dout``: it adds to ``dq``,
    ``dk`` and ``dv`` (each shaped like its input); ``D = rowsum(dO *
    O)``, ``[..., L_q, 1]``. As in the forward, ``P = exp2(S log2(e) -
    lse2)`` with ``lse2 = lse log2(e)``."""
    batch, dt = dout.shape[:-2], dq.dtype
    (L_q, d_k), d_v = q.shape[-2:], v.shape[-1]
    bq, bk = tiles.shape
    # +inf where a row attends nothing, so that P = 0: [..., L_q, 1]
    lse2 = np.where(lse2 == -np.inf, np.inf, lse2)[..., None]
    # dS K of every key tile, summed at the heads' shape [..., L_q, d_k]
    dq_all = dq
    if dq.shape != batch + (L_q, d_k):  # q broadcast: sum it at the end
        dq_all = np.zeros(batch + (L_q, d_k), dt)
    ks_buf = np.empty(k.shape[:-2] + (bk, d_k), dt)  # K * scale
    k2_buf = np.empty(k.shape[:-2] + (bk, d_k), dt)  # K scale log2(e)
    p_buf = np.empty(batch + (bq, bk), dt)  # P of one tile
    ds_buf = np.empty(batch + (bq, bk), dt)  # dP, then dS, of one tile
    dq_buf = np.empty(batch + (bq, d_k), dt)
    dk_buf = np.empty(batch + (bk, d_k), dt)
    dv_buf = np.empty(batch + (bk, d_v), dt)
    dk_sum = np.empty(batch + (bk, d_k), dt)  # one key tile's dK
    dv_sum = np.empty(batch + (bk, d_v), dt)  # and dV, summed over i
    for j, (c0, c1) in enumerate(tiles.cols):
        kj, vj = k[..., c0:c1, :], v[..., c0:c1, :]  # [.., n_k, d]
        ks = np.multiply(kj, scale, out=ks_buf[..., : c1 - c0, :])
        k2 = np.multiply(kj, scale * LOG2E, out=k2_buf[..., : c1 - c0, :])
        dk_j, dv_j = dk_sum[..., : c1 - c0, :], dv_sum[..., : c1 - c0, :]
        dk_j.fill(0)
        dv_j.fill(0)
        for i in tiles.in_col(j):
            r0 = tiles.rows[i][0]
            for a, b, ca, cb, hidden in tiles.blocks(i, j):  # rows, keys
                rows, keys = slice(r0 + a, r0 + b), slice(ca, cb)
                q_i, do_i = q[..., rows, :], dout[..., rows, :]
                p = p_buf[..., : b - a, : cb - ca]  # [..., n_q, n_k]
                # S log2(e) = Q (K scale log2(e))^T, minus lse2
                np.matmul(q_i, k2[..., keys, :].swapaxes(-1, -2), out=p)
                p -= lse2[..., rows, :]
                if hidden is not None:  # a tile on the diagonal
                    np.copyto(p, -np.inf, where=hidden)
                np.exp2(p, out=p)  # P: [..., n_q, n_k]
                pt = p.swapaxes(-1, -2)  # [..., n_k, n_q]
                dvb = dv_buf[..., : cb - ca, :]
                dv_j[..., keys, :] += np.matmul(pt, do_i, out=dvb)  # P^T dO
                ds = ds_buf[..., : b - a, : cb - ca]
                vt = vj[..., keys, :].swapaxes(-1, -2)  # [..., d_v, n_k]
                np.matmul(do_i, vt, out=ds)  # dP = dO V^T
                ds -= D[..., rows, :]  # dP - D
                ds *= p  # dS = P * (dP - D): [..., n_q, n_k]
                dq_i = dq_buf[..., : b - a, :]
                dq_all[..., rows, :] += np.matmul(  # dS (K scale)
                    ds, ks[..., keys, :], out=dq_i
                )
                dst = ds.swapaxes(-1, -2)  # [..., n_k, n_q]
                dkb = dk_buf[..., : cb - ca, :]
                dk_j[..., keys, :] += np.matmul(dst, q_i, out=dkb)
        dk_j *= scale  # dK = dS^T Q * scale
        # broadcast key/value heads: sum the query heads that shared them
        dk[..., c0:c1, :] += unbroadcast(
            dk_j, dk.shape[:-2] + dk_j.shape[-2:]
        )
        dv[..., c0:c1, :] += unbroadcast(
            dv_j, dv.shape[:-2] + dv_j.shape[-2:]
        )
    if dq_all is not dq:
        dq += unbroadcast(dq_all, dq.shape)


class Tiles:
    """The tiles of one call: their rows and columns, which are computed
    (:func:`block_plan`), and the mask of each masked one, made once."""

    def __init__(
        self,
        L_q,
        L_k,
        block_q,
        block_k,
        *,
        causal,
        window,
        mask=None,
        block_sparse=True,
    ):
        self.plan = block_plan(
            L_q, L_k, block_q, block_k, causal=causal, window=window
        )
        self.rows = [
            (r0, min(r0 + block_q, L_q)) for r0 in range(0, L_q, block_q)
        ]
        self.cols = [
            (c0, min(c0 + block_k, L_k)) for c0 in range(0, L_k, block_k)
        ]
        self.shape = (min(block_q, L_q), min(block_k, L_k))
        n_q = np.array([r1 - r0 for r0, r1 in self.rows])
        n_k = np.array([c1 - c0 for c0, c1 in self.cols])
        self.pairs = int(np.sum((self.plan != SKIP) * np.outer(n_q, n_k)))
        # [n_q, n_k] bool, True where a query may NOT attend; tiles at the
        # same distance from the diagonal share one
        self._hidden, self._blocks, made = {}, {}, {}
        if mask is not None:  # chapter 16: the mask decides every tile
            self._from_mask(mask, L_q, L_k, causal, window, block_sparse)
            self.pairs = int(
                np.sum((self.plan != SKIP) * np.outer(n_q, n_k))
            )
            return
        for i, j in zip(*np.nonzero(self.plan == MASKED)):
            (r0, r1), (c0, c1) = self.rows[i], self.cols[j]
            key = (r0 + L_k - L_q - c0, r1 - r0, c1 - c0)
            if key not in made:
                hidden = ~_tile_mask(r0, r1, c0, c1, L_q, L_k, window)
                made[key] = hidden, _parts(hidden)
            self._hidden[i, j], self._blocks[i, j] = made[key]

    def _from_mask(self, mask, L_q, L_k, causal, window, sparse=True):
        """Plan and masks from a ``[L_q, L_k]`` bool mask (ANDed with the
        causal rule): a tile with no True is skipped, one with no False
        is full, the rest are masked. ``sparse=False``: every tile is
        computed whole, its mask applied (no tile skipped or spared)."""
        if causal:
            pos = np.arange(L_k)
            mask = mask & position_mask(pos[L_k - L_q :], pos, window=window)
        for i, (r0, r1) in enumerate(self.rows):
            for j, (c0, c1) in enumerate(self.cols):
                tile = mask[r0:r1, c0:c1]
                if not sparse:  # one part, the whole tile, masked
                    self.plan[i, j] = MASKED
                    self._hidden[i, j] = hidden = ~tile
                    self._blocks[i, j] = ((0, r1 - r0, 0, c1 - c0, hidden),)
                elif not tile.any():
                    self.plan[i, j] = SKIP
                elif tile.all():
                    self.plan[i, j] = FULL
                else:
                    self.plan[i, j] = MASKED
                    hidden = ~tile
                    self._hidden[i, j] = hidden
                    self._blocks[i, j] = _parts(hidden)

    def in_row(self, i):
        """The key tiles computed for query tile ``i``."""
        return np.flatnonzero(self.plan[i])

    def in_col(self, j):
        """The query tiles computed for key tile ``j``."""
        return np.flatnonzero(self.plan[:, j])

    def hidden(self, i, j):
        """``[n_q, n_k]`` bool, True where the query may not attend, or
        ``None`` where it may attend every key of the tile."""
        return self._hidden.get((i, j))

    def blocks(self, i, j):
        """The parts of tile ``(i, j)`` to compute: ``(a, b, ca, cb,
        hidden)``, rows ``a:b`` and keys ``ca:cb`` of the tile and the
        part's mask (``None``: no mask). A full tile is one part; a
        masked one is cut into parts of ``SUB`` rows, each over the keys
        some of its rows may attend, so a diagonal tile of 256 computes
        three quarters of its pairs."""
        parts = self._blocks.get((i, j))
        if parts is None:
            (r0, r1), (c0, c1) = self.rows[i], self.cols[j]
            return ((0, r1 - r0, 0, c1 - c0, None),)
        return parts


def _parts(hidden, sub=None):
    """:meth:`Tiles.blocks` of a masked tile whose mask is ``hidden``:
    per ``sub`` rows, the span of ``sub``-key parts that any of them may
    attend (none: the rows are left out)."""
    sub = SUB if sub is None else sub
    n_q, n_k = hidden.shape
    parts = []
    for a in range(0, n_q, sub):
        b = min(a + sub, n_q)
        seen = ~hidden[a:b].all(axis=0)  # [n_k]: keys some row may see
        cuts = [c for c in range(0, n_k, sub) if seen[c : c + sub].any()]
        if not cuts:
            continue
        ca, cb = cuts[0], min(cuts[-1] + sub, n_k)
        part = np.ascontiguousarray(hidden[a:b, ca:cb])
        parts.append((a, b, ca, cb, part if part.any() else None))
    return tuple(parts)


def tile_mask_of(mask, L_q, L_k):
    """The tiled kernel's mask: None, or ``[L_q, L_k]`` bool from an array
    or a mask function of positions (evaluated for one head and row)."""
    if mask is None:
        return None
    if callable(mask):
        return create_mask(mask, 1, 1, L_q, L_k)[0, 0]
    m = np.asarray(mask)
    if m.dtype != np.bool_ or m.shape != (L_q, L_k):
        raise ValueError(
            "the tiled kernel's mask is one [L_q, L_k] bool array for "
            f"every head and row, [{L_q}, {L_k}], got {m.dtype} of shape "
            f"{m.shape}"
        )
    return m


def _check_tiles(L_q, L_k, block_q, block_k, causal, window):
    """Checked tile sizes and window, each cut to what the scores hold
    (a tile or window larger than them means the same thing, and a Python
    int beyond int64 such as ``2**63`` never reaches NumPy)."""
    window = check_window(window, check_flag(causal, "causal"))
    block_q = min(check_positive_int(block_q, "block_q"), max(L_q, 1))
    block_k = min(check_positive_int(block_k, "block_k"), max(L_k, 1))
    if window is not None:
        window = min(window, L_q + L_k)
    return block_q, block_k, window


def _check_score_bound(q, k, scale):
    """Refuse inputs whose scores could overflow inside the tiles, where
    no check looks: ``|s| <= scale * d_k * max|q| * max|k|``."""
    big = np.finfo(np.result_type(q, k)).max
    mq = max(abs(float(q.max(initial=0))), abs(float(q.min(initial=0))))
    mk = max(abs(float(k.max(initial=0))), abs(float(k.min(initial=0))))
    if scale * q.shape[-1] * mq * mk >= big:
        raise ValueError(
            f"the scores q k^T * scale may overflow in {q.dtype} (largest "
            f"{big:.3g}) with scale={scale!r}, max|q|={mq:.3g} and "
            f"max|k|={mk:.3g}: scale the queries and keys down"
        )


def _tile_mask(r0, r1, c0, c1, L_q, L_k, window):
    """``[n_q, n_k]`` bool: may query row r attend key c (causal tile)?
    Chapter 8's :func:`~attn_np.attention.position_mask`, on the tile's
    query positions (the last query aligned with the last key) and keys."""
    return position_mask(
        np.arange(r0, r1) + (L_k - L_q), np.arange(c0, c1), window=window
    )


# ---------------------------------------------------------------------------
# -- worker threads
PARALLEL_MIN_FLOPS = 2**24  # below this a call is too short to share out
PARTS_PER_WORKER = 1  # the heads are cut into this many parts per worker


def in_parallel(share, batch, flops):
    """Run ``share(take)`` once per worker thread, each on its own heads.

    The heads (one axis of the broadcast ``batch`` shape) are dealt out to
    as many workers as BLAS may use threads, and BLAS runs one thread in
    each: NumPy lets go of Python's lock in BLAS and in its ufuncs, so the
    workers' products *and* their elementwise work run at the same time.
    Two BLAS threads inside each of hundreds of short products would wait
    for each other at the end of every one; on a busy machine, for a
    core. ``take(x)`` gives a worker its part of ``x``. A call of fewer
    than ``PARALLEL_MIN_FLOPS`` matmul FLOPs runs in one piece.
    """
    workers = worker_count()  # the threads its caller lent
    axis = next((a for a, n in enumerate(batch) if n >= workers), None)
    if axis is None and batch:  # fewer heads than threads
        axis = int(np.argmax(batch))
    if workers < 2 or axis is None or batch[axis] < 2:
        return share(_Take(batch))
    if flops * int(np.prod(batch)) < PARALLEL_MIN_FLOPS:
        return share(_Take(batch))
    parts = min(workers * PARTS_PER_WORKER, batch[axis])
    edges = np.linspace(0, batch[axis], parts + 1)
    takes = [
        _Take(batch, axis, slice(int(a), int(b)))
        for a, b in zip(edges[:-1].round(), edges[1:].round())
    ]
    # a worker that is done takes the next part: a core the machine gives
    # less of does less of the work. The workers are kept between calls
    # (attn_np._workers), not started for each; the first part runs in the
    # calling thread
    queue, lock = iter(takes), threading.Lock()

    def worker():
        while (take := _next(queue, lock)) is not None:
            share(take)

    run_tasks([worker] * min(workers, len(takes)))  # raises what one raised
    return None


def _next(queue, lock):
    """The next item of the iterator ``queue`` (``None`` after the last),
    one thread at a time."""
    with lock:
        return next(queue, None)


class _Take:
    """One worker's part of the heads: ``part`` of batch axis ``axis``
    (``None``: all of them, one worker)."""

    def __init__(self, batch, axis=None, part=slice(None)):
        self.batch, self.axis, self.part = batch, axis, part

    def _own_axis(self, x, core):
        """``x``'s axis that is batch axis ``axis``, or ``None`` where
        ``x`` broadcasts along it (every worker reads all of ``x``)."""
        if self.axis is None:
            return None
        a = self.axis - (len(self.batch) - (x.ndim - core))
        return a if a >= 0 and x.shape[a] > 1 else None

    def __call__(self, x, core=2):
        """This worker's view of ``x`` (``core`` trailing axes per head)."""
        a = self._own_axis(x, core)
        return x if a is None else x[(slice(None),) * a + (self.part,)]

    def alone(self, x, core=2):
        """Does this worker alone write its view of ``x``'s gradient?"""
        return self.axis is None or self._own_axis(x, core) is not None
