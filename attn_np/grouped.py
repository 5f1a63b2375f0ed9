"""The grouped attention core: how query heads meet their key/value heads
(chapters 2 to 4, 8 and 9; every layer calls it).

``n_kv`` key/value heads each serve a group of ``G`` query heads::

    q [B, n_kv, G, L_q, d_k]   k [B, n_kv, L_k, d_k]   v [B, n_kv, L_k, d_v]
    S = q k^T * scale          -> [B, n_kv, G, L_q, L_k]
    S = mod(S, ctx)            each score mod, in order (chapter 10)
    P = softmax(S, allowed)    (or with a sink column, chapter 8)
    O = P v                    -> [B, n_kv, G, L_q, d_v]

Keys and values are never copied per query head. The core picks how the
products are made: the group's ``G * L_q`` query rows stacked into one
``[G*L_q, d_k]`` matrix per key/value head (one matmul; the backward's
``dS^T Q`` sums the group's gradients into its key/value head), or, for a
decode step with few rows (:func:`per_head_rows`), one product per query
head against ``k [B, n_kv, 1, L_k, d_k]``, which BLAS may stream faster;
``tiled=True`` runs FlashAttention's kernels (:mod:`attn_np.flash`). Within
:func:`~attn_np.decode_workers` a decode step over a long cache deals
its heads out to worker threads with one BLAS thread each
(:mod:`attn_np._workers`; the same products, so the same numbers).
With ``causal=True`` the mask comes from positions
(:func:`~attn_np.position_mask`: the causal rule, windows and sink tokens).

A **score mod** changes the scaled scores before the mask and softmax: an
object with ``forward(s, ctx) -> (s2, saved)`` and ``backward(ds2, saved)
-> ds`` (or ``(ds, {name: grad})`` for a mod with parameters), where
``s`` is ``[B, n_kv, G, L_q, L_k]`` and ``ctx`` a :class:`ScoreContext`.
``s2`` may be ``s`` changed in place; nothing saved may alias ``s2``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._checks import (
    as_float_array,
    check_count,
    check_finite,
    check_flag,
    check_mask,
    check_scale,
    check_scores,
    check_sinks,
    check_unchanged,
    check_upstream,
    check_window,
    fingerprint,
)
from ._workers import run_tasks, sharing, split, worker_count
from .attention import unbroadcast
from .flash import (
    BLOCK_K,
    BLOCK_Q,
    backward_into,
    flash_attention_forward,
)
from .masks import create_mask, evaluate_mask, position_mask
from .softmax import masked_softmax, sink_softmax

# a group stacks its G * L_q query rows into one product from this many
# rows on; below, one product per query head (``python -m attn_np.bench
# decode --levers`` measures it)
MIN_STACKED_ROWS = 8


@dataclass(frozen=True)
class ScoreContext:
    """What a score mod may read: absolute positions and the head layout.
    Query head ``kv * group_size + g`` sits at ``[:, kv, g]`` of ``s``."""

    q_positions: np.ndarray  # [L_q] ints
    k_positions: np.ndarray  # [L_k] ints
    n_kv_heads: int
    group_size: int
    # the mask the softmax will apply, broadcasting to [B, n_kv, G, L_q,
    # L_k] (None: every key): for a mod that watches the scores
    allowed: np.ndarray | None = None


@dataclass
class GroupedCache:
    """What :func:`grouped_attention_backward` needs."""

    q: np.ndarray  # [B, n_kv, G, L_q, d_k]
    k: np.ndarray  # [B, n_kv, L_k, d_k]
    v: np.ndarray  # [B, n_kv, L_k, d_v]
    out: np.ndarray  # [B, n_kv, G, L_q, d_v]
    weights: np.ndarray | None  # [B, n_kv, G, L_q, L_k] (None if tiled)
    scale: float
    sinks: np.ndarray | None = None  # broadcasts to [B, n_kv, G, L_q, 1]
    sink_weights: np.ndarray | None = None  # [B, n_kv, G, L_q, 1]
    mods: list = field(default_factory=list)  # [(mod, saved), ...]
    tiled: object = None  # the FlashCache with tiled=True
    # checksums of q, k, v when the caller's own (check_finite=True)
    inputs: tuple | None = None


def per_head_rows(group_size, L_q, min_stacked_rows=MIN_STACKED_ROWS):
    """Whether a group (``G > 1``) makes one product per query head: when
    its stacked rows ``G * L_q`` are fewer than ``min_stacked_rows``."""
    return 1 < group_size and group_size * L_q < min_stacked_rows


def grouped_attention_forward(
    q,
    k,
    v,
    *,
    allowed=None,
    causal=False,
    window=None,
    sink_tokens=0,
    q_positions=None,
    k_positions=None,
    scale=None,
    sinks=None,
    score_mods=(),
    tiled=False,
    block_q=BLOCK_Q,
    block_k=BLOCK_K,
    min_stacked_rows=MIN_STACKED_ROWS,
    check_finite=True,
):
    """Attention of ``G`` query heads per key/value head; ``(o, cache)``.

    ``allowed`` (bool, True = may attend) broadcasts to ``[B, n_kv, G,
    L_q, L_k]``, or is a mask function (query head ``kv * G + g``).
    ``causal=True`` adds :func:`~attn_np.position_mask` of
    ``q_positions [L_q]`` and ``k_positions [L_k]`` (default: the last
    query aligned with the last key) with ``window`` and ``sink_tokens``.
    ``sinks`` (broadcastable to ``[B, n_kv, G, L_q, 1]``) are sink logits.
    ``score_mods`` change the scaled scores (module docstring).
    ``tiled=True`` runs FlashAttention's kernels: no weights kept, and only
    ``causal``, ``window``, ``sinks`` and a mask that is the same for
    every batch row and head (an array or a mask function; its empty
    tiles are skipped, chapter 16), no mods. ``check_finite``
    refuses NaN or inf in ``q``, ``k`` and ``v``; a layer checks its input
    once and passes False (a decode step would re-read its whole cache).
    A query with no key to attend gets zeros (with a sink: all mass on it).
    Scores that overflow the dtype raise a ``ValueError``. The output is
    read-only, and with ``check_finite=True`` (the caller's own arrays)
    the backward refuses ``q``, ``k`` or ``v`` changed in place since.
    """
    finite = check_flag(check_finite, "check_finite")
    q, k, v, scale = _check_qkv(q, k, v, scale, finite)
    tiled = check_flag(tiled, "tiled")
    if allowed is not None and tiled:  # one mask for the kernels
        allowed = shared_mask(allowed, q.shape, k.shape[2])
    elif callable(allowed):  # a mask function (chapter 16): on the grid
        B, n_kv, G, L_q = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
        allowed = create_mask(allowed, B, n_kv * G, L_q, k.shape[2])
        allowed = allowed.reshape(B, n_kv, G, L_q, k.shape[2])
    # overflow is not a warning but a ValueError naming the scores
    with np.errstate(over="ignore", invalid="ignore"):
        o, cache = _forward(
            q, k, v, allowed, causal, window, sink_tokens, q_positions,
            k_positions, scale, sinks, score_mods, tiled, block_q, block_k,
            min_stacked_rows,
        )  # fmt: skip
    check_scores(o, scale, "output P v (of the scores q k^T * scale)")
    o.flags.writeable = False  # the cache's own: not to be changed
    if finite:
        cache.inputs = fingerprint(q, k, v)
    return o, cache


def grouped_decode_step(q, k, v, scale=None, *, min_stacked_rows=None):
    """A decode step's core: one new query per head (``q [B, n_kv, G, 1,
    d_k]``) over every key of a cache, no mask, window, sink or score
    mod; ``(o, cache)``, the numbers of ``grouped_attention_forward(q, k,
    v, causal=True, scale=scale, check_finite=False)``.

    The last query sits at the last key, so the causal rule allows every
    key: the step is ``softmax(q k^T * scale) v`` and nothing else. What
    it skips is the general core's reading of its keywords (masks,
    positions, windows, tiles, workers), which for one query costs about
    as much as the two products over a short cache. Its products are the
    core's own (:func:`_scores`, :func:`_weighted_values`), in the same
    layout. Within :func:`~attn_np.decode_workers` it hands the step to
    the general core, which shares the heads out.
    """
    if sharing() or q.shape[3] != 1:
        return grouped_attention_forward(
            q,
            k,
            v,
            causal=True,
            scale=scale,
            check_finite=False,
            min_stacked_rows=min_stacked_rows or MIN_STACKED_ROWS,
        )
    G, d_k = q.shape[2], q.shape[-1]
    scale = check_scale(scale, d_k)
    per_head = per_head_rows(G, 1, min_stacked_rows or MIN_STACKED_ROWS)
    with np.errstate(over="ignore", invalid="ignore"):  # checked:
        s = _scores(q * scale, k, per_head)  # [B, n_kv, G, 1, L_k]
        p, _ = _softmax(s, None, None, scale)  # overflow: ValueError
        o = _weighted_values(p, v, per_head)  # [B, n_kv, G, 1, d_v]
    check_scores(o, scale, "output P v (of the scores q k^T * scale)")
    o.flags.writeable = False
    return o, GroupedCache(q, k, v, o, p, scale)


def _forward(
    q, k, v, allowed, causal, window, sink_tokens, q_positions,
    k_positions, scale, sinks, score_mods, tiled, block_q, block_k,
    min_stacked_rows,
):  # fmt: skip
    """:func:`grouped_attention_forward` after its input checks."""
    B, n_kv, G, L_q, d_k = q.shape
    L_k = k.shape[2]
    window = check_window(window, check_flag(causal, "causal"))
    sink_tokens = check_count(sink_tokens, "sink_tokens", minimum=0)
    pos = None  # None: the last query at the last key's position
    if q_positions is not None or k_positions is not None:
        pos = _positions(q_positions, k_positions, L_q, L_k)  # [L_q], [L_k]
    if check_flag(tiled, "tiled"):  # chapter 9: by tiles, O(L) memory
        check_tiled(allowed, score_mods, sink_tokens, pos)
        if sinks is not None:
            sinks = check_sinks(
                sinks, (B, n_kv, G, L_q, 1), "[B, n_kv, G, L_q, 1]"
            )
        return grouped_tiled_forward(
            q, k, v, causal, window, scale, block_q, block_k, sinks, allowed
        )
    full = (B, n_kv, G, L_q, L_k)
    if allowed is not None:
        allowed = check_mask(allowed, full, "[B, n_kv, G, L_q, L_k]")
    if causal:  # the causal rule, from positions: [L_q, L_k] or None
        c = _causal(pos, L_q, L_k, window, sink_tokens)
        if c is not None:
            allowed = c if allowed is None else allowed & c
    per_head = per_head_rows(G, L_q, min_stacked_rows)
    if sinks is not None:  # chapter 8: a sink logit per row
        sinks = check_sinks(sinks, full[:-1] + (1,), "[B, n_kv, G, L_q, 1]")
    qs = q * scale  # [B, n_kv, G, L_q, d_k]
    # a decode step (a few queries over a long cache): the heads shared
    # out to worker threads, the same products (:func:`decode_workers`)
    axis = None if score_mods else _decode_axis(q.shape, L_k, v.shape[-1])
    if axis == 2 and allowed is None and sinks is None:
        # one key/value head: its positions shared out instead, so that
        # each worker's products keep all the group's rows
        o, p = _attend_positions_in_workers(qs, k, v, scale, per_head)
        return o, GroupedCache(q, k, v, o, p, scale)
    if axis is not None:  # a decode step: the heads shared out
        o, p, p_sink = _attend_in_workers(
            qs, k, v, allowed, sinks, scale, per_head, axis
        )
        return o, GroupedCache(q, k, v, o, p, scale, sinks, p_sink)
    s = _scores(qs, k, per_head)  # [B, n_kv, G, L_q, L_k]
    mods = []
    if score_mods:  # chapter 10: soft caps, biases, ...
        pos = pos or _positions(None, None, L_q, L_k)
        ctx = ScoreContext(*pos, n_kv, G, allowed)
    for mod in score_mods:
        s, saved = mod.forward(s, ctx)
        mods.append((mod, saved))
    # after the mods (a soft cap may tame the scores): [B, n_kv, G, L_q,
    # L_k] in the scores' memory, and [.., 1] or None
    p, p_sink = _softmax(s, allowed, sinks, scale)
    o = _weighted_values(p, v, per_head)  # [B, n_kv, G, L_q, d_v]
    cache = GroupedCache(q, k, v, o, p, scale, sinks, p_sink, mods)
    return o, cache


def _scores(qs, k, per_head):
    """``qs k^T`` for scaled queries ``qs [B, n_kv, G, L_q, d_k]``: one
    product per query head, or a group's rows stacked."""
    B, n_kv, G, L_q, d_k = qs.shape
    if per_head:  # one product per query head, k broadcast over G:
        # [.., G, L_q, d_k] @ [.., 1, d_k, L_k] -> [.., G, L_q, L_k]
        return qs @ k[:, :, None].swapaxes(-1, -2)
    # a group's rows stacked, one product per key/value head:
    # [.., G*L_q, d_k] @ [.., d_k, L_k] -> [.., G*L_q, L_k]
    s = qs.reshape(B, n_kv, G * L_q, d_k) @ k.swapaxes(-1, -2)
    return s.reshape(B, n_kv, G, L_q, -1)  # a view: [.., G, L_q, L_k]


def _softmax(s, allowed, sinks, scale):
    """``(p, p_sink)``: the checked scores' softmax in their own memory,
    with a sink column (chapter 8) when ``sinks`` is not None."""
    check_scores(s, scale)
    if sinks is None:  # [B, n_kv, G, L_q, L_k]
        return masked_softmax(s, allowed, -1, overwrite=True), None
    return sink_softmax(s, sinks, allowed, overwrite=True)


# a decode step over a cache shares its heads out to worker threads from
# this many FLOPs of its two products on (:func:`_decode_axis`), and for
# chunks of at most DECODE_MAX_ROWS queries
DECODE_PARALLEL_MIN_FLOPS = 2**22
DECODE_MAX_ROWS = 16


def _decode_axis(q_shape, L_k, d_v):
    """The axis of ``q [B, n_kv, G, L_q, d_k]`` whose heads a decode step
    shares out to workers (:mod:`attn_np._workers`): the key/value heads
    (each worker streams its own part of the cache), else the query heads
    of the one group (they share it), else the batch; None for a call too
    short, or too many queries (not a decode step), or one worker."""
    B, n_kv, G, L_q, d_k = q_shape
    workers = worker_count()
    flops = 2 * B * n_kv * G * L_q * L_k * (d_k + d_v)
    if (
        not sharing()
        or workers < 2
        or L_q > DECODE_MAX_ROWS
        or flops < DECODE_PARALLEL_MIN_FLOPS
    ):
        return None
    return next((a for a in (1, 2, 0) if q_shape[a] >= 2), None)


def _attend_positions_in_workers(qs, k, v, scale, per_head):
    """A decode step over one key/value head (MQA, MLA's absorbed step)
    with no mask and no sink, its cached positions dealt out to the
    workers (FlashDecoding's split of the keys): worker ``i`` scores its
    keys, subtracts its rows' maxima ``m_i``, exponentiates and sums them
    (``l_i``) and weights its values (``o_i``). With ``m = max_i m_i`` and
    ``w_i = exp(m_i - m)``: ``o = sum_i w_i o_i / sum_i w_i l_i``, and
    worker ``i``'s exponentials times ``w_i / l`` are its part of ``p``.
    The same softmax, rounded in another order."""
    B, n_kv, G, L_q, _ = qs.shape
    L_k = k.shape[2]
    p = np.empty((B, n_kv, G, L_q, L_k), dtype=qs.dtype)
    parts = split(L_k, worker_count())

    def task(sl):
        def run():
            s = _scores(qs, k[:, :, sl], per_head)  # [.., G, L_q, n_i]
            check_scores(s, scale)
            m = s.max(axis=-1, keepdims=True)  # finite: [.., L_q, 1]
            s -= m
            np.exp(s, out=s)  # <= 1
            p[..., sl] = s
            l = s.sum(axis=-1, keepdims=True)  # >= 1
            return m, l, _weighted_values(s, v[:, :, sl], per_head)

        return run

    o, w, total = merge_partial_softmax(run_tasks(task(sl) for sl in parts))
    for sl, w_i in zip(parts, w):
        p[..., sl] *= w_i / total
    return o, p


def merge_partial_softmax(stats):
    """``(o, w, total)`` from the workers' ``(m_i, l_i, o_i)`` over parts
    of the keys (their rows' maxima, sums of ``exp(s - m_i)`` and
    unnormalised outputs): with ``m = max_i m_i`` and ``w_i = exp(m_i -
    m)``, ``o = sum_i w_i o_i / total``, ``total = sum_i w_i l_i``
    (FlashDecoding's merge)."""
    m = np.max([m_i for m_i, _, _ in stats], axis=0)  # [.., L_q, 1]
    w = [np.exp(m_i - m) for m_i, _, _ in stats]
    total = sum(w_i * l_i for w_i, (_, l_i, _) in zip(w, stats))
    o = sum(w_i * o_i for w_i, (_, _, o_i) in zip(w, stats)) / total
    return o, w, total


def _attend_in_workers(qs, k, v, allowed, sinks, scale, per_head, axis):
    """The dense core of a decode step with the heads of ``axis`` (of
    ``[B, n_kv, G, L_q, .]``) dealt out to the workers, each writing its
    part of ``o``, ``p`` (and the sink weights); the same numbers as in
    one piece (each head's products are the same products)."""
    B, n_kv, G, L_q, _ = qs.shape
    full = (B, n_kv, G, L_q)
    o = np.empty(full + (v.shape[-1],), dtype=qs.dtype)
    p = np.empty(full + (k.shape[2],), dtype=qs.dtype)
    p_sink = None if sinks is None else np.empty(full + (1,), qs.dtype)

    def part(x, sl, core=0):
        """``x``'s part along ``axis`` (``x`` broadcasts to ``[B, n_kv,
        G, L_q, ...]`` from the right, ``core`` axes beyond L_q; 4-D
        keys and values have no G axis)."""
        if x is None:
            return None
        a = axis - (4 + core - x.ndim)
        if a < 0 or x.shape[a] == 1:
            return x  # broadcast along the axis: every worker reads it
        return x[(slice(None),) * a + (sl,)]

    def kv_part(x, sl):  # [B, n_kv, L_k, d]: no G axis to split
        return x if axis == 2 else x[(slice(None),) * axis + (sl,)]

    def task(sl):
        def run():
            pi, ps = _softmax(
                _scores(part(qs, sl, 1), kv_part(k, sl), per_head),
                part(allowed, sl, 1),
                part(sinks, sl, 1),
                scale,
            )
            part(o, sl, 1)[...] = _weighted_values(
                pi, kv_part(v, sl), per_head
            )
            part(p, sl, 1)[...] = pi
            if ps is not None:
                part(p_sink, sl, 1)[...] = ps

        return run

    run_tasks(task(sl) for sl in split(qs.shape[axis], worker_count()))
    return o, p, p_sink


def grouped_attention_backward(
    do, cache: GroupedCache, *, release=False
) -> dict:
    """``{"q", "k", "v"}`` gradients with their inputs' shapes (``dk``,
    ``dv`` summed over each group), plus ``"sinks"`` and every score mod's
    parameter gradients when present. The stacked products throughout.
    ``release=True`` (a layer's backward, its cache's last): the tiled
    backward frees the cached output as soon as it has read it."""
    c = cache
    if not isinstance(c, GroupedCache):
        raise TypeError(
            "cache must be the GroupedCache of grouped_attention_forward, "
            f"got {type(c).__name__}"
        )
    release = check_flag(release, "release")
    if c.out is None:
        raise ValueError(
            "cache was released by a grouped_attention_backward with "
            "release=True (a layer's backward): run the forward again"
        )
    do = check_upstream(do, "do", c.out.shape, "the attention output")
    if c.inputs is not None:
        check_unchanged(
            c.inputs,
            {"q": c.q, "k": c.k, "v": c.v},
            "grouped_attention_backward",
        )
    if c.tiled is not None:  # FlashAttention's backward, by tiles
        return grouped_tiled_backward(do, c, release)
    B, n_kv, G, L_q, d_k = c.q.shape
    L_k, d_v = c.k.shape[2], c.v.shape[3]
    p = c.weights.reshape(B, n_kv, G * L_q, L_k)  # a view
    do4 = do.reshape(B, n_kv, G * L_q, d_v)
    # [.., L_k, G*L_q] @ [.., G*L_q, d_v] -> [.., L_k, d_v]: the group summed
    dv = p.swapaxes(-1, -2) @ do4
    # dP: [.., G*L_q, d_v] @ [.., d_v, L_k] -> [.., G*L_q, L_k]
    ds = do4 @ c.v.swapaxes(-1, -2)
    # rowsum(P*dP) = rowsum(dO*O): [B, n_kv, G*L_q, 1]
    inner = np.sum(do4 * c.out.reshape(do4.shape), axis=-1, keepdims=True)
    ds -= inner
    ds *= p  # dS = P * (dP - rowsum), zero wherever P is zero
    grads = {}
    ds5 = ds.reshape(B, n_kv, G, L_q, L_k)
    for mod, saved in reversed(c.mods):
        ds5 = mod.backward(ds5, saved)
        if isinstance(ds5, tuple):  # a mod with parameters
            ds5, mod_grads = ds5
            grads.update(mod_grads)
    ds = ds5.reshape(B, n_kv, G * L_q, L_k)
    # [.., G*L_q, L_k] @ [.., L_k, d_k] -> [B, n_kv, G, L_q, d_k]
    dq = ((ds @ c.k) * c.scale).reshape(c.q.shape)
    # [.., L_k, G*L_q] @ [.., G*L_q, d_k] -> [.., L_k, d_k]: the group summed
    dk = (ds.swapaxes(-1, -2) @ c.q.reshape(B, n_kv, G * L_q, d_k)) * c.scale
    grads.update(q=dq, k=dk, v=dv)
    if c.sinks is not None:  # da = p_sink * (0 - rowsum): [.., G, L_q, 1]
        da = -c.sink_weights * inner.reshape(B, n_kv, G, L_q, 1)
        grads["sinks"] = unbroadcast(da, c.sinks.shape)
    return grads


def group_mask(mask, B, n_heads, n_kv, L_q, L_k):
    """A layer's ``mask`` (broadcastable to ``[B, n_heads, L_q, L_k]``) laid
    out for the core, ``[.., n_kv, G, L_q, L_k]`` (views, no copy); None
    stays None."""
    if mask is None:
        return None
    if callable(mask):  # a mask function (chapter 16): on the grid
        mask = create_mask(mask, B, n_heads, L_q, L_k)
    m = check_mask(mask, (B, n_heads, L_q, L_k), "[B, n_heads, L_q, L_k]")
    if m.ndim <= 2:  # the same for every head: broadcasts as it is
        return m
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)  # [B|1, h|1, L_q, L_k]
    if m.shape[1] == 1:  # the same for every head of a batch row
        return m[:, :, None]  # [B|1, 1, 1, L_q, L_k]
    # head i = kv*G + g: [B|1, n_kv, G, L_q, L_k]
    return m.reshape(m.shape[0], n_kv, n_heads // n_kv, *m.shape[2:])


def decode_step_parts(weights, attention, scores) -> dict:
    """A layer's decode step in the parts the decode benchmark times:
    ``{"weights": weights, "attention": attention, "softmax": fn}``, with
    ``fn`` the softmax alone over ``scores`` (an array of the core's
    score shape), in place as the core's: ``scores`` holds probabilities
    after the first call, still finite, and the work per call is the
    same."""

    def softmax():
        return masked_softmax(scores, None, -1, overwrite=True)

    return {"weights": weights, "attention": attention, "softmax": softmax}


def _weighted_values(p, v, per_head):
    """``O = P V`` for ``p [B, n_kv, G, L_q, L_k]``; with ``V`` stored
    transposed (a KV cache) as ``(V^T P^T)^T``, the same numbers: with few
    rows in P (a decode step) BLAS streams the rows of V^T far faster."""
    B, n_kv, G, L_q, L_k = p.shape
    if v.strides[-2] == v.itemsize:  # V stored transposed
        vt = v.swapaxes(-1, -2)  # [B, n_kv, d_v, L_k], contiguous rows
        if per_head:
            # [.., 1, d_v, L_k] @ [.., G, L_k, L_q] -> [.., G, d_v, L_q]
            return (vt[:, :, None] @ p.swapaxes(-1, -2)).swapaxes(-1, -2)
        p4 = p.reshape(B, n_kv, G * L_q, L_k)
        # [.., d_v, L_k] @ [.., L_k, G*L_q] -> [.., d_v, G*L_q], transposed
        o = (vt @ p4.swapaxes(-1, -2)).swapaxes(-1, -2)
        return o.reshape(B, n_kv, G, L_q, -1)  # a view
    if per_head:
        # [.., G, L_q, L_k] @ [.., 1, L_k, d_v] -> [.., G, L_q, d_v]
        return p @ v[:, :, None]
    # [.., G*L_q, L_k] @ [.., L_k, d_v] -> [.., G*L_q, d_v]
    o = p.reshape(B, n_kv, G * L_q, L_k) @ v
    return o.reshape(B, n_kv, G, L_q, -1)


def check_tiled(allowed, score_mods, sink_tokens, positions):
    """Refuse what the tiled kernels cannot do, naming it."""
    unsupported = {
        "a mask other than one [L_q, L_k] bool array": allowed is not None
        and np.ndim(allowed) != 2,
        "score_mods": len(score_mods) > 0,
        "sink_tokens (a StreamingLLM cache)": sink_tokens != 0,
        "positions that skip (keys) or end elsewhere (queries)": (
            positions is not None and not _consecutive(*positions)
        ),
    }
    for what, bad in unsupported.items():
        if bad:
            raise ValueError(
                f"{what} is not supported with flash=True (the core's "
                "tiled=True): the tiled kernels take causal=True/False, "
                "a window, sinks and one mask for every row and head only"
            )


def grouped_tiled_forward(
    q, k, v, causal, window, scale, block_q, block_k, sinks=None, mask=None
):
    """Chapter 9's kernels on the grouped layout: ``q [B, n_kv, G, L_q,
    d_k]`` against ``k, v [B, n_kv, 1, L_k, d]`` (views, no copy).

    With ``sinks`` (logits ``a`` broadcasting to ``[B, n_kv, G, L_q, 1]``)
    no new kernel: a row's keys hold ``e^lse`` of its softmax's mass and
    the sink ``e^a``, so the sink layer's output is the tiled output times
    ``w = e^lse / (e^lse + e^a) = sigmoid(lse - a)``. ``mask``: one
    ``[L_q, L_k]`` bool array for every batch row and head (chapter 16).

    The output is written in the layout the layer merges heads in,
    ``[B, L_q, n_kv, G, d_v]`` (``o`` is a view of it): the layer's
    ``merge_groups(o)`` is then a view too, not a second copy."""
    o = _merged(q.shape[:-1] + v.shape[-1:], np.result_type(q, k, v))
    o, fc = flash_attention_forward(
        q,
        k[:, :, None],
        v[:, :, None],
        causal=causal,
        scale=scale,
        window=window,
        block_q=block_q,
        block_k=block_k,
        check_finite=False,
        out=o,
        mask=mask,
    )  # [B, n_kv, G, L_q, d_v]
    if sinks is None:
        return o, GroupedCache(q, k, v, o, None, scale, tiled=fc)
    w, p_sink = _sink_split(fc.lse, sinks)  # [B, n_kv, G, L_q, 1] each
    o *= w  # O' = w O, in place: the backward reads O' (its D, below)
    return o, GroupedCache(q, k, v, o, None, scale, sinks, p_sink, tiled=fc)


def shared_mask(allowed, q_shape, L_k):
    """The one ``[L_q, L_k]`` bool mask the tiled kernels take, from a
    mask function or an array that broadcasts to ``[B, n_kv, G, L_q,
    L_k]``; a ``ValueError`` if it differs between batch rows or heads."""
    B, n_kv, G, L_q = q_shape[:4]
    full = (B, n_kv, G, L_q, L_k)
    if callable(allowed):  # its own answer: leading axes of 1 if shared
        m = evaluate_mask(allowed, B, n_kv * G, L_q, L_k)
        m = m.reshape((1,) * (4 - m.ndim) + m.shape)  # [B|1, H|1, ..]
    else:
        m = check_mask(allowed, full, "[B, n_kv, G, L_q, L_k]")
    m = m.reshape((1,) * max(0, 2 - m.ndim) + m.shape)  # at least 2-D
    m = np.broadcast_to(m, m.shape[:-2] + (L_q, L_k))
    flat = m.reshape(-1, L_q, L_k)  # [rows x heads, L_q, L_k]
    if flat.shape[0] > 1 and (flat[1:] != flat[:1]).any():
        raise ValueError(
            "mask must be the same for every batch row and head with "
            "tiled=True (flash=True): the tiled kernels take one [L_q, "
            f"L_k] mask; got one of shape {m.shape} that differs"
        )
    return np.ascontiguousarray(flat[0])  # [L_q, L_k]


def _merged(shape, dtype):
    """Zeros of ``shape`` ``[B, heads..., L, d]`` stored as ``[B, L,
    heads..., d]``, the order :func:`~attn_np.heads.merge_groups` and
    :func:`~attn_np.heads.merge_heads` put the heads in (a view)."""
    B, *heads, L, d = shape
    n = len(heads)
    stored = np.zeros((B, L, *heads, d), dtype)  # [B, L, heads..., d]
    return stored.transpose(0, *range(2, 2 + n), 1, 2 + n)


def grouped_tiled_backward(do, c: GroupedCache, release=False) -> dict:
    """The tiled backward; with sinks, of ``O' = w O``. Since ``P' = w P``,
    ``dS = P' * (dP' - D')`` with ``dP' = dO' V^T``, ``D' = rowsum(dO' *
    O')`` is ``P * ((w dO') V^T - w D')``: the tiled backward with upstream
    ``w dO'`` and row term ``w D'``, which is its own ``rowsum(dout * out)``
    when it reads ``out = O'``. The sink: ``da = -p_sink D'``.
    ``release=True``: the cache's output is freed once read (the caller's
    last backward); a second backward on the cache raises."""
    D = np.vecdot(do, c.out)[..., None]  # rowsum(dO' * O'): [.., L_q, 1]
    dt, grads = np.result_type(c.out, do), {}
    if c.sinks is not None:
        w, p_sink = _sink_split(c.tiled.lse, c.sinks)  # [.., L_q, 1] each
        grads["sinks"] = unbroadcast(-p_sink * D, c.sinks.shape)  # da
        do, D = w * do, w * D  # the tiled backward's upstream and D
    if release:  # the output's last reader was D
        c.out = c.tiled.out = None
    # the gradients, in the layout the layer merges them in (as o)
    dk, dv = _merged(c.k.shape, dt), _merged(c.v.shape, dt)
    dq, dk, dv = backward_into(
        do,
        c.tiled,
        D,
        (_merged(c.q.shape, dt), dk[:, :, None], dv[:, :, None]),
    )
    grads.update(q=dq, k=dk[:, :, 0], v=dv[:, :, 0])
    return grads


def _sink_split(lse, sinks):
    """``(w, p_sink) = (sigmoid(lse - a), sigmoid(a - lse))``, each
    ``[.., L_q, 1]`` and stable; ``lse = -inf`` (nothing to attend) gives
    ``(0, 1)``: all mass on the sink."""
    d = lse[..., None] - sinks  # lse - a: [B, n_kv, G, L_q, 1]
    return np.exp(-np.logaddexp(0.0, -d)), np.exp(-np.logaddexp(0.0, d))


def _causal(pos, L_q, L_k, window, sink_tokens):
    """:func:`~attn_np.position_mask` of the positions ``pos`` (None: the
    last query at the last key's), ``[L_q, L_k]``, or None where it allows
    every key (one query at the last key and no window cutting in)."""
    if pos is None and L_q == 1 and (window is None or window >= L_k):
        return None  # a decode step needs no mask
    q_pos, k_pos = pos or _positions(None, None, L_q, L_k)
    c = position_mask(q_pos, k_pos, window=window, sink_tokens=sink_tokens)
    return None if c.all() else c


def _consecutive(q_pos, k_pos):
    """Keys at consecutive positions, the last query at the last key's."""
    want_k = k_pos[0] + np.arange(len(k_pos))
    want_q = want_k[-1] + 1 - len(q_pos) + np.arange(len(q_pos))
    return np.array_equal(k_pos, want_k) and np.array_equal(q_pos, want_q)


def _positions(q_positions, k_positions, L_q, L_k):
    """Absolute positions ``[L_q]`` and ``[L_k]``; by default the last
    query sits at the last key's position."""
    k_pos = np.arange(L_k) if k_positions is None else k_positions
    if q_positions is None:
        q_positions = np.arange(L_q) + (k_pos[-1] + 1 - L_q)
    q_pos, k_pos = np.asarray(q_positions), np.asarray(k_pos)
    for name, pos, n in (
        ("q_positions", q_pos, L_q),
        ("k_positions", k_pos, L_k),
    ):
        if pos.shape != (n,) or not np.issubdtype(pos.dtype, np.integer):
            raise ValueError(
                f"{name} must be {n} integer positions, got "
                f"{pos.dtype} of shape {pos.shape}"
            )
    return q_pos, k_pos


def _check_qkv(q, k, v, scale, finite):
    """``q [B, n_kv, G, L_q, d_k]``, ``k [B, n_kv, L_k, d_k]``, ``v [B,
    n_kv, L_k, d_v]`` that fit together, and the scale."""
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    v = as_float_array(v, "v")
    ok = (
        q.ndim == 5
        and k.ndim == v.ndim == 4
        and q.shape[:2] == k.shape[:2] == v.shape[:2]
        and q.shape[-1] == k.shape[-1] > 0
        and k.shape[2] == v.shape[2] > 0
    )
    if not ok:
        raise ValueError(
            "q, k and v must be [B, n_kv, G, L_q, d_k], [B, n_kv, L_k, "
            "d_k] and [B, n_kv, L_k, d_v] with L_k, d_k >= 1, got q "
            f"{q.shape}, k {k.shape} and v {v.shape}"
        )
    for name, t in (("q", q), ("k", k), ("v", v)) if finite else ():
        check_finite(t, name)
    return q, k, v, check_scale(scale, q.shape[-1])
