"""Where the ceiling of a decode step's attention is (``python -m
attn_np.bench decode --formulations``, chapter 4).

A decode step's attention over its cache is two products with few
stacked rows: ``G`` query heads (``G * L_q`` rows) against each
key/value head's ``T`` cached keys, then the same rows of weights
against its values. The roof counts the cache read once at the
streaming rate; a formulation that reads each key once per query head,
or that BLAS first copies, cannot reach it. This module times every
formulation of those products we know how to write with NumPy's BLAS
calls (:data:`FORMULATIONS`), in turns with the library's own (the
layer's ``step_parts()["attention"]``), each with the same flush before
it, and gives each as a fraction of the cache's bytes at the reference
bandwidth. The fastest of them is as near the roof as these BLAS calls
come on this machine.

Each formulation computes the same numbers as the library's attention
(the softmax included), to rounding; :func:`formulations` checks it
before anything is timed.
"""

from __future__ import annotations

import numpy as np

from attn_np.grouped import MIN_STACKED_ROWS, merge_partial_softmax
from attn_np.instruments.blas import blas_threads
from attn_np.instruments.workers import run_tasks, split
from attn_np.softmax import masked_softmax

FORMULATIONS = {
    "library": "the layer's own attention step (step_parts): one "
    "product per query head below 8 stacked rows (MHA, GQA-4), else "
    "the group's rows stacked (MQA, MLA), on BLAS's threads",
    "library (A/A)": "the same, timed again: this table's noise floor",
    "per head": "one product per query head, [1, d] @ [d, T], and "
    "V^T @ p^T per head: each key read G times",
    "stacked": "the group's G rows stacked, [G, d] @ [d, T] (K^T as "
    "cached), and V^T @ P^T",
    "K @ q^T": "the other orientation: scores as K [T, d] @ q^T [d, G] "
    "(M = T large, N = G small), and P @ V with V as [T, d]",
    "blocked": "the cache in blocks over T that fit in L2, one NumPy "
    "call for all blocks: each block's G per-head products one after "
    "another (read from memory once, then from L2; from 8 rows on, the "
    "block's rows stacked in one product), and V^T_b @ P^T_b "
    "per block with P^T contiguous (OpenBLAS's no-copy small kernel "
    "where it applies), summed over the blocks",
    "blocked, 1 thread": "the same on one BLAS thread",
    "blocked, 2 workers": "the same dealt out to two workers with one "
    "BLAS thread each: half the key/value heads each, or (one key/value "
    "head) half the positions each, combined as FlashDecoding does",
}


def block_sizes(d_k, d_v, rows, l2=2**20, l1=32 * 2**10):
    """``(keys, values)`` positions per block of :func:`blocked`: the
    largest power of two (at least 64, at most 4096) whose keys ``[d_k,
    n]`` fill at most half of ``l2`` bytes (float32); for the values the
    same with ``d_v``, and the block's weights ``[n, rows]`` at most half
    of ``l1``."""

    def fit(limit):
        n = 64
        while 2 * n <= 4096 and 2 * n <= limit:
            n *= 2
        return n

    keys = fit(l2 // 2 // (4 * d_k))
    values = fit(min(l2 // 2 // (4 * d_v), l1 // 2 // (4 * max(1, rows))))
    return keys, values


def _blocks(x, n):
    """``x [..., r, T]`` (last axis contiguous) as ``[..., T // n, r, n]``
    blocks of ``n`` positions: a view (the tail beyond is left out)."""
    nb = x.shape[-1] // n
    st = x.strides
    return np.lib.stride_tricks.as_strided(
        x,
        x.shape[:-2] + (nb, x.shape[-2], n),
        st[:-2] + (n * st[-1], st[-2], st[-1]),
        writeable=x.flags.writeable,
    )


def blocked_scores(qs, kt, n, out):
    """``out [B, n_kv, R, T] = qs [B, n_kv, R, d] @ kt [B, n_kv, d, T]`` by
    blocks of ``n`` positions: within a block its ``R`` rows one after
    another (``order="C"`` keeps NumPy from walking the blocks first),
    so the block is read from memory once and from L2 after; from
    :data:`~attn_np.grouped.MIN_STACKED_ROWS` rows on, the block's rows
    stacked into one product instead."""
    T = kt.shape[-1]
    e = T // n * n
    if qs.shape[2] >= MIN_STACKED_ROWS:  # [.., 1, R, d] @ [.., nb, d, n]
        np.matmul(qs[:, :, None], _blocks(kt, n), out=_blocks(out, n))
    else:
        np.matmul(
            qs[:, :, None, :, None],  # [B, n_kv, 1, R, 1, d]
            _blocks(kt, n)[:, :, :, None],  # [B, n_kv, nb, 1, d, n]
            out=_blocks(out, n)[..., None, :],  # [B, n_kv, nb, R, 1, n]
            order="C",
        )
    if e < T:  # the tail: [.., R, d] @ [.., d, T - e]
        np.matmul(qs, kt[..., e:], out=out[..., e:])
    return out


def blocked_values(p, vt, n):
    """``o [B, n_kv, R, d_v] = p [B, n_kv, R, T] @ V`` with ``vt [B, n_kv,
    d_v, T]`` (V stored transposed) by blocks of ``n`` positions: ``P^T``
    copied contiguous, ``V^T_b @ P^T_b`` per block, summed."""
    B, n_kv, R, T = p.shape
    e = T // n * n
    pt = np.ascontiguousarray(p.swapaxes(-1, -2))  # [B, n_kv, T, R]
    # [.., nb, d_v, n] @ [.., nb, n, R] -> [.., nb, d_v, R], summed
    o = np.matmul(
        _blocks(vt, n), pt[:, :, :e].reshape(B, n_kv, -1, n, R)
    ).sum(axis=2)
    if e < T:
        o += vt[..., e:] @ pt[:, :, e:]  # [.., d_v, R]
    return o.swapaxes(-1, -2)  # [B, n_kv, R, d_v]


def blocked(qs, kt, vt, sizes):
    """The attention of ``qs [B, n_kv, R, d]`` (scaled) over ``kt, vt``
    by blocks (``sizes``: :func:`block_sizes`); ``o [B, n_kv, R, d_v]``."""
    s = np.empty(qs.shape[:-1] + kt.shape[-1:], dtype=qs.dtype)
    blocked_scores(qs, kt, sizes[0], s)
    masked_softmax(s, None, -1, overwrite=True)
    return blocked_values(s, vt, sizes[1])


def blocked_in_workers(qs, kt, vt, sizes, workers=2):
    """:func:`blocked` dealt out to ``workers`` threads with one BLAS
    thread each: the key/value heads, or for one key/value head its
    positions, each worker's softmax unnormalised with its own maximum
    ``m_i`` and sum ``l_i``, combined as ``o = sum_i w_i o_i / sum_i w_i
    l_i`` with ``w_i = exp(m_i - max_i m_i)`` (FlashDecoding)."""
    n_kv = qs.shape[1]
    if n_kv >= workers:
        parts = split(n_kv, workers)
        outs = run_tasks(
            (lambda sl=sl: blocked(qs[:, sl], kt[:, sl], vt[:, sl], sizes))
            for sl in parts
        )
        return np.concatenate(outs, axis=1)

    def part(sl):
        def run():
            s = np.empty(
                qs.shape[:-1] + (sl.stop - sl.start,), dtype=qs.dtype
            )
            blocked_scores(qs, kt[..., sl], sizes[0], s)
            m = s.max(axis=-1, keepdims=True)  # [.., R, 1]
            s -= m
            np.exp(s, out=s)
            return (
                m,
                s.sum(axis=-1, keepdims=True),
                blocked_values(s, vt[..., sl], sizes[1]),
            )

        return run

    stats = run_tasks(part(sl) for sl in split(kt.shape[-1], workers))
    return merge_partial_softmax(stats)[0]


def formulations(case, l2=2**20, l1=32 * 2**10, seed=0) -> dict:
    """``{name: fn}`` for one row of the decode table (``case``:
    :func:`attn_np.bench.decode.step_case`), one per
    :data:`FORMULATIONS`: each ``fn()`` returns the attention output as
    ``[B, n_kv, R, d_v]`` (``R = G * L_q`` rows), over the case's own
    cached keys and values (transposed views of its buffer, no copy).
    Every formulation's output is checked against the library's
    arithmetic first (``ValueError`` if one differs beyond float32
    rounding)."""
    layer, cache = case["layer"], case["cache"]
    if hasattr(cache, "rows"):  # MLA: one key/value head of latent rows
        k = cache.rows[:, None]  # [B, 1, T, d_c + d_R]
        v = k[..., : layer.d_latent_kv]  # [B, 1, T, d_c]
        n_kv, G, scale = 1, layer.n_heads, layer.scale
    else:
        k, v = cache.keys, cache.values  # [B, n_kv, T, d]
        n_kv, G = layer.n_kv_heads, layer.group_size
        scale = 1.0 / np.sqrt(layer.d_k)
    B, _, T, d_k = k.shape
    kt, vt = k.swapaxes(-1, -2), v.swapaxes(-1, -2)  # [B, n_kv, d, T]
    rng = np.random.default_rng(seed)
    qs = rng.standard_normal(
        (B, n_kv, G, d_k), dtype=np.float32
    ) * np.float32(
        scale
    )  # scaled queries: [B, n_kv, R, d_k], R = G (one token)
    sizes = block_sizes(d_k, vt.shape[-2], G, l2, l1)

    def per_head():
        s = qs[:, :, :, None] @ kt[:, :, None]  # [.., G, 1, T]
        masked_softmax(s, None, -1, overwrite=True)
        # [.., 1, d_v, T] @ [.., G, T, 1] -> [.., G, d_v, 1]
        return (vt[:, :, None] @ s.swapaxes(-1, -2))[..., 0]

    def stacked():
        s = qs @ kt  # [.., G, d] @ [.., d, T] -> [.., G, T]
        masked_softmax(s, None, -1, overwrite=True)
        return (vt @ s.swapaxes(-1, -2)).swapaxes(-1, -2)

    def k_qt():
        st = k @ qs.swapaxes(-1, -2)  # [.., T, d] @ [.., d, G] -> [.., T, G]
        masked_softmax(st, None, -2, overwrite=True)
        return st.swapaxes(-1, -2) @ v  # [.., G, T] @ [.., T, d_v]

    def one_thread():
        with blas_threads(1):
            return blocked(qs, kt, vt, sizes)

    fns = {
        "library": case["parts"]["attention"],
        "library (A/A)": case["parts"]["attention"],
        "per head": per_head,
        "stacked": stacked,
        "K @ q^T": k_qt,
        "blocked": lambda: blocked(qs, kt, vt, sizes),
        "blocked, 1 thread": one_thread,
        "blocked, 2 workers": lambda: blocked_in_workers(qs, kt, vt, sizes),
    }
    want = stacked()
    for name, fn in fns.items():
        if name.startswith("library"):
            continue
        got = fn()
        if got.shape != want.shape or not np.allclose(
            got, want, rtol=1e-4, atol=1e-6
        ):
            raise ValueError(
                f"formulation {name!r} differs from the stacked products"
            )
    return fns


def ceiling_rows(per_round, cases, reference_r) -> dict:
    """Per family, per formulation: the best round's time, the fraction of
    the cache's bytes at the reference (best over best), and the paired
    ratio to the library's time (median and quartiles over the rounds).
    ``per_round``: ``{(family, name): array of seconds}``;
    ``reference_r``: the rounds' reference bandwidths (bytes/s)."""
    ref = float(np.max(reference_r))
    out = {}
    for fam, case in cases.items():
        lib = per_round[fam, "library"]
        rows = {}
        for name in FORMULATIONS:
            t = per_round[fam, name]
            low, med, high = np.percentile(t / lib, [25, 50, 75])
            rows[name] = {
                "time": float(t.min()),
                "of cache at ref": case["kv_bytes"] / ref / float(t.min()),
                "over library": (float(med), float(low), float(high)),
            }
        out[fam] = rows
    return out


def verdict(ratio, a_a) -> str:
    """``faster``, ``slower`` or ``noise``: a paired ratio to the library
    (median, low, high) against the table's A/A ratio: clear when its
    quartiles are beyond both 1 and the A/A quartiles."""
    if ratio[2] < min(1.0, a_a[1]):
        return "faster"
    if ratio[1] > max(1.0, a_a[2]):
        return "slower"
    return "noise"


def ceiling_table(rows) -> list[str]:
    """The lines of the formulations table, at most 77 characters each:
    per family a line per formulation with its best time, its fraction
    of the cache's bytes at the reference, and its paired ratio to the
    library's attention with the verdict against the A/A row."""
    out = [
        f"{'':4} {'formulation':20}{'best ms':>8}{'of ref':>7}"
        f"   {'/ library, paired':22}"
    ]
    for fam, frows in rows.items():
        a_a = frows["library (A/A)"]["over library"]
        fastest = min(
            (n for n in frows if not n.startswith("library (")),
            key=lambda n: frows[n]["time"],
        )
        for name, row in frows.items():
            med, low, high = row["over library"]
            mark = (
                ""
                if name == "library"
                else verdict(row["over library"], a_a)
            )
            if name == fastest:
                mark += " (fastest)" if mark else "(fastest)"
            out.append(
                f"{fam:4} {name:20}{row['time'] * 1e3:8.2f}"
                f"{row['of cache at ref']:7.2f}"
                f"   {med:4.2f} [{low:4.2f}, {high:4.2f}] {mark}".rstrip()
            )
    return out
