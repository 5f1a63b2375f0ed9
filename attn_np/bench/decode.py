"""``python -m attn_np.bench decode``: is a decode step as fast as memory
allows? (chapter 4)

One attention layer in float32 decodes one token per sequence over a
key/value cache of ``--context`` positions, as multi-head (``n_kv_heads =
n_heads``), grouped-query (``n_heads / 4``) and multi-query (1) attention,
and as chapter 7's multi-head latent attention on its absorbed decode path
(:func:`latent_dims`: DeepSeek-V2-Lite's attention shape at the defaults).
It prints one table, all from the same run:

* the streaming-read bandwidth of this machine, the reference: the fastest
  of :func:`~attn_np.instruments.measure.read_probes` over 256 MiB and of
  :func:`worker_probes` (the same read made as the step's workers make
  their products);
* for each family: the bytes a step must read (the four projection
  matrices and the cached keys and values), the best step time, the bytes
  per second and their fraction of the reference;
* ``roof``: the largest fraction the step could reach on this machine: its
  weights read at the reference, plus the longer of reading its cache at
  the reference and doing its attention's FLOPs at the measured matmul
  rate;
* ``best``: the most the step's own BLAS calls allow: its weights read at
  the reference, plus its attention timed right after itself;
* the gap, ``time - bytes / reference``, split by timing the parts of the
  step alone (:func:`step_parts`): the projections, the attention
  over the cache (its softmax apart) and the softmax; the rest of the step
  is the remainder.

Every candidate is timed in turns with the reference, the order reversed
every other round (:func:`flushed_rounds`), so a busy moment on a shared
machine slows all of them alike; the table keeps the best round of each.
A read of twice the last-level cache runs before each step and part, so
that none finds its data left in the CPU's caches by the one before.

How close each step comes to its roof is read from paired ratios: in every
round, the step's roof computed from that round's own probes
(:func:`roof_time`) over that round's step, with the median and quartiles
over the rounds, beside the run's own noise floor, the step timed twice in
the same round (A/A), and a line (:func:`roof_verdict`) that says how wide
that floor is.

``--levers`` adds a second table: each lever of a decode step (``LEVERS``)
timed beside the library's step (:func:`run_levers`).
"""

from __future__ import annotations

import argparse
import os
import textwrap
import time
from pathlib import Path

import numpy as np

from attn_np import decode_workers
from attn_np.costs.decode import decode_step_cost
from attn_np.costs.latent import latent_decode_step_cost
from attn_np.instruments import decode_ceiling as ceiling
from attn_np.instruments.blas import blas_threads
from attn_np.instruments.measure import (
    capped_rounds,
    paired_difference,
    read_probes,
)
from attn_np.instruments.plotting import format_bytes
from attn_np.instruments.workers import (
    row_products,
    run_tasks,
    split,
    worker_count,
)
from attn_np.kv_cache import KVCache
from attn_np.latent import LatentKVCache, MultiHeadLatentAttention
from attn_np.multihead import GroupedQueryAttention
from attn_np.softmax import masked_softmax

from ._help import description as _description

# the parts of a step timed alone
PARTS = ("weights", "attention", "softmax")
# an A/A floor whose quartiles stray further than this from 1 is wide
NOISE = 0.10


def cpu_cache_sizes() -> dict:
    """``{"L1d": bytes, "L2": bytes, "L3": bytes}`` of CPU 0 from Linux's
    sysfs (empty elsewhere)."""
    sizes = {}
    for index in sorted(
        Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")
    ):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1], 1)
        name = f"L{level}" + ("d" if kind == "Data" else "")
        sizes[name] = int(size.rstrip("KMG")) * scale
    return sizes


def decode_setup(
    d_model,
    n_heads,
    n_kv_heads,
    context,
    batch=1,
    seed=0,
    spare=1,
    allocate=None,
):
    """A float32 layer, a cache filled with ``context`` random positions, and
    a one-token step.

    ``step()`` decodes one token and then forgets it again
    (:meth:`KVCache.truncate`), so every call sees the same context and
    nothing is reallocated (the cache is preallocated ``spare >= 1``
    positions longer). ``allocate`` is the cache's buffer maker
    (:class:`~attn_np.KVCache`'s keyword).
    """
    layer = GroupedQueryAttention(
        d_model, n_heads, n_kv_heads, seed=seed, dtype=np.float32
    )
    rng = np.random.default_rng(seed)
    cache = KVCache(initial_capacity=context + spare, allocate=allocate)
    shape = (batch, n_kv_heads, context)
    cache.append(
        rng.standard_normal(shape + (layer.d_k,), dtype=np.float32),
        rng.standard_normal(shape + (layer.d_v,), dtype=np.float32),
    )
    x = rng.standard_normal((batch, 1, d_model), dtype=np.float32)
    return layer, cache, undone_step(layer, cache, x)


def undone_step(layer, cache, x):
    """``step()``: ``layer.forward(x, kv_cache=cache)``, one token ``x [B,
    1, d_model]`` over every cached position, then
    ``cache.truncate`` back, so that every call sees the same context."""
    context = len(cache)

    def step():
        layer.forward(x, kv_cache=cache)
        cache.truncate(context)

    return step


def step_parts(layer, cache, seed=0) -> dict:
    """The parts of a decode step of ``layer`` over ``cache``, to be timed
    alone: the layer's own :meth:`~GroupedQueryAttention.step_parts` (or
    :meth:`~attn_np.MultiHeadLatentAttention.step_parts`) for one random
    token, ``{"weights": fn, "attention": fn, "softmax": fn}``.

    Inputs are random: the times do not depend on the values.
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(
        (cache.batch_size, 1, layer.d_model), dtype=layer.dtype
    )  # [B, 1, d]
    return layer.step_parts(x, cache)


# -- the levers of a decode step, measured one at a time -------------------
LEVERS = {
    "nothing (A/A)": "the library's step itself: what a change that "
    "changes nothing reads as in this run, the noise floor of the table",
    "stacked products": "a group's G query rows in one product against "
    "its keys and values (min_stacked_rows = 1), not one product per query "
    "head",
    "per-head products": "one product per query head, its key/value head "
    "broadcast (min_stacked_rows above G), even where a group's rows "
    "would be stacked",
    "workers": "the step's attention dealt out to worker threads with "
    "one BLAS thread each (decode_workers()): its key/value heads (MQA: "
    "its cached positions), instead of each product in one piece on "
    "BLAS's own threads",
    "1 BLAS thread": "the whole step on one BLAS thread",
    "1 BLAS thread, attention": "the two products over the cache on one "
    "BLAS thread, the projections on all",
    "cache rows on 64 B": "the stored K^T and V^T in a buffer whose rows "
    "each start on a 64-byte line (KVCache(allocate=aligned_rows)), "
    "instead of np.empty's, rows context + 1 positions apart",
    "no temporaries": "the step's arithmetic alone, on a copy of the "
    "cache's buffer: no checks or head-split copies, outputs into arrays "
    "allocated once",
}


def aligned_rows(shape, dtype, alignment=64) -> np.ndarray:
    """``np.empty(shape, dtype)``, except that every row (the last axis)
    starts on an ``alignment``-byte boundary: the rows are padded to whole
    lines and the first is placed on one (a view into a slightly larger
    buffer). For the ``cache rows on 64 B`` lever: ``KVCache(allocate=
    aligned_rows)``."""
    dtype = np.dtype(dtype)
    per_line = max(1, alignment // dtype.itemsize)
    padded = -(-shape[-1] // per_line) * per_line  # round up
    count = int(np.prod(shape[:-1], dtype=np.int64)) * padded
    raw = np.empty(count * dtype.itemsize + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment  # first byte on a line
    flat = raw[start : start + count * dtype.itemsize].view(dtype)
    return flat.reshape(tuple(shape[:-1]) + (padded,))[..., : shape[-1]]


def no_temporaries_step(layer, cache, x):
    """A one-token step of ``layer`` (batch 1, no rope, window or sinks)
    that computes what :meth:`~GroupedQueryAttention.forward` computes
    and nothing else: no checks, no head-split copies, each output into
    an array allocated once. It is a yardstick for the rest of a step,
    not a second implementation: it works on its own copy of the cache's
    buffer (:attr:`~attn_np.KVCache.storage`), the same layout and bytes,
    and is timed, never used."""
    W = layer.params
    n_kv, G, d_k = layer.n_kv_heads, layer.group_size, layer.d_k
    n = len(cache)  # the step's own position
    buf = cache.storage[0].copy()  # [n_kv, d_k + d_v, cap], a copy
    kt, vt = buf[:, :d_k], buf[:, d_k:]  # [n_kv, d_k, cap], [n_kv, d_v, ..]
    q = np.empty((1, layer.n_heads * d_k), dtype=layer.dtype)
    s = np.empty((n_kv, G, 1, n + 1), dtype=layer.dtype)
    o = np.empty((n_kv, G, 1, layer.d_v), dtype=layer.dtype)
    per_head = layer.per_head_rows(1)
    scale = layer.dtype.type(1.0 / np.sqrt(d_k))

    def step():
        x1 = x.reshape(1, -1)  # [1, d]
        np.matmul(x1, W["W_q"], out=q)  # [1, h*d_k]
        # new key and value into column n: [1, d] @ [d, n_kv*d]
        kt[:, :, n] = (x1 @ W["W_k"]).reshape(n_kv, d_k)
        vt[:, :, n] = (x1 @ W["W_v"]).reshape(n_kv, -1)
        np.multiply(q, scale, out=q)
        qh = q.reshape(n_kv, G, 1, d_k)  # head kv*G + g
        K, V = kt[:, None, :, : n + 1], vt[:, None, :, : n + 1]
        if per_head:  # [n_kv, G, 1, d_k] @ [n_kv, 1, d_k, n+1]
            np.matmul(qh, K, out=s)
        else:  # [n_kv, 1, G, d_k] @ [n_kv, 1, d_k, n+1]
            np.matmul(
                qh.reshape(n_kv, 1, G, d_k),
                K,
                out=s.reshape(n_kv, 1, G, n + 1),
            )
        masked_softmax(s, None, -1, overwrite=True)
        if per_head:  # [n_kv, 1, d_v, n+1] @ [n_kv, G, n+1, 1]
            np.matmul(V, s.swapaxes(-1, -2), out=o.swapaxes(-1, -2))
        else:  # [n_kv, 1, d_v, n+1] @ [n_kv, 1, n+1, G]
            np.matmul(
                V,
                s.reshape(n_kv, 1, G, n + 1).swapaxes(-1, -2),
                out=o.reshape(n_kv, 1, G, -1).swapaxes(-1, -2),
            )
        return o.reshape(1, -1) @ W["W_o"]  # [1, h*d_v] @ [h*d_v, d]

    return step


def lever_steps(d_model, n_heads, n_kv_heads, context, seed=0) -> dict:
    """``{"library": step, lever: step, ...}``: the library's one-token
    step (:func:`decode_setup`) and, for each of :data:`LEVERS`, the same
    step with that one thing changed. Each step leaves its cache as it
    found it."""
    layer, cache, step = decode_setup(
        d_model, n_heads, n_kv_heads, context, seed=seed
    )
    x = np.random.default_rng(seed).standard_normal(
        (1, 1, d_model), dtype=np.float32
    )

    def within(make_context, fn=step):
        def run():
            with make_context():
                fn()

        return run

    # the same weights (the same seed), another rule or another step
    stacked = GroupedQueryAttention(
        d_model, n_heads, n_kv_heads, seed=seed, dtype=np.float32
    )
    stacked.min_stacked_rows = 1
    per_head = GroupedQueryAttention(
        d_model, n_heads, n_kv_heads, seed=seed, dtype=np.float32
    )
    per_head.min_stacked_rows = n_heads + 1
    one_thread = _AttendOnOneThread(
        d_model, n_heads, n_kv_heads, seed=seed, dtype=np.float32
    )
    aligned = decode_setup(
        d_model,
        n_heads,
        n_kv_heads,
        context,
        seed=seed,
        allocate=aligned_rows,
    )
    return {
        "library": step,
        "nothing (A/A)": step,
        "stacked products": undone_step(stacked, cache, x),
        "per-head products": undone_step(per_head, cache, x),
        "workers": within(decode_workers),
        "1 BLAS thread": within(lambda: blas_threads(1)),
        "1 BLAS thread, attention": undone_step(one_thread, cache, x),
        "cache rows on 64 B": aligned[2],
        "no temporaries": no_temporaries_step(layer, cache, x),
        "_keep": (layer, cache, aligned),
    }


class _AttendOnOneThread(GroupedQueryAttention):
    """The layer with its attention step (:meth:`attend`) on one BLAS
    thread, the projections on all: a subclass overriding one step."""

    def attend(self, q, k, v, **kw):
        with blas_threads(1):
            return super().attend(q, k, v, **kw)


def run_levers(
    d_model=2048, n_heads=16, context=8192, rounds=20, flush_bytes=None
) -> dict:
    """Time :func:`lever_steps` for every family: each lever beside a step
    of the library's, a read of ``flush_bytes`` before each step.

    Returns ``{family: {"library": seconds, lever: (median, low, high)}}``:
    the library's median step time, and each lever's time minus that of
    the library step beside it, round by round
    (:func:`paired_difference`: the median and the quartiles). The pair
    runs library first in even rounds and lever first in odd ones, so
    that whatever the second step of a pair gains or loses from the first
    cancels in the median.
    """
    if flush_bytes is None:
        flush_bytes = 2 * cpu_cache_sizes().get("L3", 32 * 2**20)
    flush = np.ones(max(1, flush_bytes // 4), dtype=np.float32)
    steps = {
        fam: lever_steps(d_model, n_heads, n_kv, context)
        for fam, n_kv in families(n_heads).items()
    }

    def timed(fn):
        flush.sum()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    rounds = capped_rounds(rounds)
    lib = {(f, n): [] for f in steps for n in LEVERS}
    lever = {(f, n): [] for f in steps for n in LEVERS}
    for fam_steps in steps.values():  # warm-up
        for name in ("library", *LEVERS):
            fam_steps[name]()
    for r in range(rounds):
        for fam, fam_steps in steps.items():
            for name in LEVERS:
                if r % 2 == 0:
                    lib[fam, name].append(timed(fam_steps["library"]))
                    lever[fam, name].append(timed(fam_steps[name]))
                else:
                    lever[fam, name].append(timed(fam_steps[name]))
                    lib[fam, name].append(timed(fam_steps["library"]))
    out = {}
    for fam in steps:
        all_lib = [t for name in LEVERS for t in lib[fam, name]]
        out[fam] = {"library": float(np.median(all_lib))}
        for name in LEVERS:
            out[fam][name] = paired_difference(
                lever[fam, name], lib[fam, name]
            )
    return out


def lever_table(levers) -> list[str]:
    """Lines of the levers table: the library's step time, then each
    lever's change to it, ms (negative: faster), in brackets where the
    quartiles of the change straddle 0 (no clear effect)."""
    fams = list(levers)
    out = [f"{'ms per step':28}" + "".join(f"{f:>10}" for f in fams)]
    out.append(
        f"{'library (median)':28}"
        + "".join(f"{levers[f]['library'] * 1e3:10.2f}" for f in fams)
    )
    for name in LEVERS:
        cells = []
        for f in fams:
            median, low, high = levers[f][name]
            text = f"{median * 1e3:+.2f}"
            clear = low > 0 or high < 0
            cells.append(
                f"{text:>9} " if clear else f"{'(' + text + ')':>10}"
            )
        out.append(f"{name:28}" + "".join(cells))
    return out


def lever_verdicts(levers) -> list[str]:
    """One line per family of :func:`run_levers`' result: the levers that
    changed its step beyond this run's noise floor (the quartiles of the
    change clear of 0 and of the ``nothing (A/A)`` row's quartiles),
    faster or slower, and those within the noise."""
    out = []
    for fam, lev in levers.items():
        _, aa_low, aa_high = lev["nothing (A/A)"]
        kinds = {"faster": [], "slower": [], "within the noise": []}
        for name in LEVERS:
            if name == "nothing (A/A)":
                continue
            median, low, high = lev[name]
            text = f"{name} ({median * 1e3:+.2f} ms)"
            if high < min(0.0, aa_low):
                kinds["faster"].append(text)
            elif low > max(0.0, aa_high):
                kinds["slower"].append(text)
            else:
                kinds["within the noise"].append(name)
        out.append(
            f"{fam}: "
            + "; ".join(
                f"{kind}: {', '.join(names)}"
                for kind, names in kinds.items()
                if names
            )
        )
    return out


def latent_dims(d_model, n_heads) -> dict:
    """The MLA layer of the table, as keywords of
    :class:`~attn_np.MultiHeadLatentAttention`: DeepSeek-V2-Lite's
    attention shape scaled to ``d_model`` and ``n_heads``. At the
    defaults (2048, 16) it
    is that model's (its config.json on Hugging Face: hidden_size 2048, 16
    heads, qk_nope_head_dim 128, qk_rope_head_dim 64, kv_lora_rank 512,
    v_head_dim 128, q_lora_rank null): ``d_head = d_model / n_heads``, a
    latent of 4 heads' width, a rotary key of half a head, no query
    compression."""
    d_head = d_model // n_heads
    return {
        "d_head": d_head,
        "d_latent_kv": 4 * d_head,
        "d_rope": max(2, d_head // 2 // 2 * 2),  # even: RoPE turns pairs
        "d_head_v": d_head,
    }


def latent_decode_setup(d_model, n_heads, context, batch=1, seed=0):
    """:func:`decode_setup` for multi-head latent attention (chapter 7): a
    float32 :class:`~attn_np.MultiHeadLatentAttention` of
    :func:`latent_dims`, a :class:`~attn_np.LatentKVCache` of ``context``
    random rows, and a one-token step on the absorbed path (the layer's
    default with a cache), undone after each call."""
    dims = latent_dims(d_model, n_heads)
    layer = MultiHeadLatentAttention(
        d_model, n_heads, **dims, seed=seed, dtype=np.float32
    )
    rng = np.random.default_rng(seed)
    cache = LatentKVCache(initial_capacity=context + 1)
    cache.append(
        rng.standard_normal(
            (batch, context, dims["d_latent_kv"]), dtype=np.float32
        ),
        rng.standard_normal(
            (batch, context, dims["d_rope"]), dtype=np.float32
        ),
    )
    x = rng.standard_normal((batch, 1, d_model), dtype=np.float32)
    return layer, cache, undone_step(layer, cache, x)  # absorbed


def latent_step_parts(layer, cache, seed=0) -> dict:
    """:func:`step_parts` for the absorbed MLA step: the layer's own
    :meth:`~attn_np.MultiHeadLatentAttention.step_parts`, ``weights``
    (every product with a weight matrix, as the layer makes them),
    ``attention`` (the grouped core of the ``h`` latent queries over the
    cached rows ``[c_KV ; k_R]``, values ``c_KV``) and ``softmax``."""
    return step_parts(layer, cache, seed)


def families(n_heads) -> dict:
    """``{"MHA": n_heads, "GQA": n_heads // 4, "MQA": 1}``: key/value heads
    of each family."""
    return {"MHA": n_heads, "GQA": max(1, n_heads // 4), "MQA": 1}


def step_case(family, d_model, n_heads, context, batch=1) -> dict:
    """One row of the table before it is timed: the setup of
    :func:`decode_setup` (or :func:`latent_decode_setup` for ``"MLA"``),
    its :func:`step_parts`, and the bytes and FLOPs that
    :mod:`attn_np.costs` counts for it: ``weight_bytes``, ``kv_bytes``
    (the cache read, the step's own position included) and
    ``attention_flops`` (the two products over the cache)."""
    if family == "MLA":  # chapter 7's absorbed decode path
        layer, cache, step = latent_decode_setup(
            d_model, n_heads, context, batch
        )
        parts = latent_step_parts(layer, cache)
        cost = latent_decode_step_cost(
            batch,
            context,
            d_model,
            n_heads,
            **latent_dims(d_model, n_heads),
            absorb=True,
        )
        nb, fl = cost.bytes_breakdown, cost.flops_breakdown
        # the cached rows [c_KV ; k_R], scored and summed
        kv_bytes = nb["latent cache read"]
        flops = fl["scores over [c_KV ; k_R]"] + fl["weights @ c_KV"]
    else:
        n_kv = families(n_heads)[family]
        layer, cache, step = decode_setup(
            d_model, n_heads, n_kv, context, batch
        )
        parts = step_parts(layer, cache)
        cost = decode_step_cost(batch, context, d_model, n_heads, n_kv)
        nb, fl = cost.bytes_breakdown, cost.flops_breakdown
        kv_bytes = nb["keys and values read"]
        flops = fl["scores Q K^T"] + fl["weights @ V"]
    return {
        "layer": layer,
        "cache": cache,
        "step": step,
        "parts": parts,
        "weight_bytes": nb["weights"],
        "kv_bytes": kv_bytes,
        "attention_flops": flops,
    }


def flushed_rounds(fns: dict, flush, *, rounds: int) -> dict:
    """Every round's time of each ``fn`` in ``fns`` (``{name: (fn,
    flushed)}``), in turns, the order reversed every other round (as
    :func:`~attn_np.instruments.measure.alternating_times`): ``{name:
    array of rounds seconds}``. Where ``flushed`` is true, ``flush()``
    runs just before ``fn``, untimed, so that the call finds none of its
    data left in the CPU's caches by the one before it."""
    rounds = capped_rounds(rounds)
    names = list(fns)
    for fn, _ in fns.values():  # warm-up
        fn()
    times = {name: np.empty(rounds) for name in names}
    for i in range(rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            fn, flushed = fns[name]
            if flushed:
                flush()
            t0 = time.perf_counter()
            fn()
            times[name][i] = time.perf_counter() - t0
    return times


def worker_probes(nbytes) -> dict:
    """The read probe of a decode step's workers (:mod:`attn_np._workers`),
    to time beside :func:`~attn_np.instruments.measure.read_probes`:
    ``x @ A`` over ``nbytes`` of float32, each worker on its own
    contiguous block of ``A``'s rows with one BLAS thread
    (:func:`~attn_np._workers.row_products`, as the layers' projections),
    ``{name: (fn, bytes read)}``. A reference that left out the step's own
    way of reading would flatter it."""
    a = np.ones(nbytes // 4, dtype=np.float32)  # written: every page there
    At = a.reshape(1024, -1)  # [1024, n], as the x @ A probe's
    x = np.ones((1, 1024), dtype=np.float32)
    return {
        "x @ A (workers)": (lambda: row_products(x, At), a.nbytes),
    }


def quartiles(x) -> tuple[float, float, float]:
    """``(median, lower quartile, upper quartile)`` of ``x``."""
    low, median, high = np.percentile(
        np.asarray(x, dtype=float), [25, 50, 75]
    )
    return float(median), float(low), float(high)


def roof_verdict(of_roof, a_a, noise=None) -> str:
    """What one family's paired fraction of the roof says: ``of_roof``
    and ``a_a`` are ``(median, low, high)`` of the paired fractions of the
    roof and of the step timed against itself (the run's noise floor).

    The step's time over its roof's, and how far the floor strays from 1:
    within ``noise`` (default :data:`NOISE`) the fraction is read to that
    precision; beyond it the floor is wide, and the line says so."""
    noise = NOISE if noise is None else noise
    median, low, high = of_roof
    spread = max(abs(a_a[1] - 1), abs(a_a[2] - 1))
    step = f"step time {1 / median:.2f}x its roof's"
    if not spread <= noise:
        return f"{step}; a wide floor ({spread:.0%} from 1)"
    return f"{step}; the floor within {spread:.0%} of 1"


def run(
    d_model=2048,
    n_heads=16,
    context=8192,
    batch=1,
    rounds=40,
    probe_bytes=256 * 2**20,
    flush_bytes=None,
    formulations=False,
):
    """Measure; returns a dict of every figure :func:`main` prints.

    ``formulations=True`` also times, in the same rounds, every
    formulation of each family's attention over its cache
    (:data:`~attn_np.instruments.decode_ceiling.FORMULATIONS`), in
    ``"ceiling"``.

    Everything is timed in turns, the order reversed every other round
    (:func:`flushed_rounds`), with ``flush_bytes`` (default: twice the
    last-level cache, or 64 MiB) read before each step and part, untimed.
    The table's figures are best times (the least disturbed round of
    each). The fractions of the roof are paired: in every round the roof
    is computed from that round's own probes and divided by that round's
    step, and their median and quartiles are kept (``"roof paired"``);
    the step timed a second time in the same round gives the run's own
    noise floor (``"A/A paired"``: the second time over the first).
    """
    fams = families(n_heads)
    if flush_bytes is None:
        flush_bytes = 2 * cpu_cache_sizes().get("L3", 32 * 2**20)
    flush = np.ones(max(1, flush_bytes // 4), dtype=np.float32)
    probes = read_probes(probe_bytes)
    probes.update(worker_probes(probe_bytes))
    fns = {name: (fn, False) for name, (fn, _) in probes.items()}
    # the matmul rate, in turns too: [n, n] @ [n, n], 2 n^3 FLOPs, as
    # BLAS's threads make it and as the step's workers would
    n_mm = 1024
    a = np.ones((n_mm, n_mm), dtype=np.float32)
    c = np.empty_like(a)
    fns["matmul"] = (lambda: np.matmul(a, a, out=c), False)
    halves = split(n_mm, max(2, worker_count()))

    def matmul_in_workers():  # each worker its block of rows of c
        run_tasks(
            lambda sl=sl: np.matmul(a[sl], a, out=c[sl]) for sl in halves
        )

    fns["matmul (workers)"] = (matmul_in_workers, False)
    cases = {
        fam: step_case(fam, d_model, n_heads, context, batch)
        for fam in (*fams, "MLA")
    }
    for fam, case in cases.items():
        fns[fam] = (case["step"], True)
        for part, fn in case["parts"].items():
            fns[f"{fam} {part}"] = (fn, True)
            if part == "attention":
                # right after itself, with no read between: its cache is
                # still in the CPU's caches where it fits (MQA's, not
                # MHA's)
                fns[f"{fam} attention (again)"] = (fn, False)
        # the step again, after its parts: the same code timed against
        # itself, this run's noise floor for the step's time
        fns[f"{fam} (A/A)"] = (case["step"], True)
    if formulations:  # the attention over the cache, every way we know
        caches = cpu_cache_sizes()
        sizes = {"l2": caches.get("L2", 2**20), "l1": caches.get("L1d")}
        sizes["l1"] = sizes["l1"] or 32 * 2**10
        for fam, case in cases.items():
            for name, fn in ceiling.formulations(case, **sizes).items():
                fns[f"{fam} ~ {name}"] = (fn, True)
    per_round = flushed_rounds(fns, flush.sum, rounds=rounds)
    times = {name: float(ts.min()) for name, ts in per_round.items()}
    bandwidths = {
        name: nbytes / times[name] for name, (_, nbytes) in probes.items()
    }
    ref_name = max(bandwidths, key=bandwidths.get)
    ref = bandwidths[ref_name]
    # FLOP/s: the faster of the two ways
    matmul_rate = (
        2 * n_mm**3 / min(times["matmul"], times["matmul (workers)"])
    )
    # round by round: the fastest probe of the round, its matmul rate
    ref_r = np.max(
        [nbytes / per_round[name] for name, (_, nbytes) in probes.items()],
        axis=0,
    )
    mm_r = (
        2
        * n_mm**3
        / np.minimum(per_round["matmul"], per_round["matmul (workers)"])
    )
    rows = {}
    for fam, case in cases.items():
        w_bytes, kv_bytes = case["weight_bytes"], case["kv_bytes"]
        att_flops = case["attention_flops"]
        t = times[fam]
        part = {p: times[f"{fam} {p}"] for p in PARTS}
        part["attention (again)"] = times[f"{fam} attention (again)"]
        # the most this step could reach on this machine
        best = roof_time(w_bytes, kv_bytes, att_flops, ref, matmul_rate)
        # the same, round by round, over that round's step
        roof_r = roof_time(w_bytes, kv_bytes, att_flops, ref_r, mm_r)
        step_bytes = w_bytes + kv_bytes
        rows[fam] = {
            "n_kv_heads": fams.get(fam),  # None for MLA
            "cache_bytes": case["cache"].nbytes,
            "step_bytes": step_bytes,
            "weight_bytes": w_bytes,
            "kv_bytes": kv_bytes,
            "attention_flops": att_flops,
            "time": t,
            "bytes_per_s": step_bytes / t,
            "fraction": step_bytes / t / ref,
            "roof": step_bytes / ref / best,
            "roof time": best,
            # the roof's time over the step's: 1 at the roof
            "of roof": best / t,
            # the same step timed again in each round: best over best
            "A/A": times[f"{fam} (A/A)"] / t,
            # paired, round by round: (median, lower, upper quartile)
            "roof paired": quartiles(roof_r / per_round[fam]),
            "A/A paired": quartiles(
                per_round[f"{fam} (A/A)"] / per_round[fam]
            ),
            # weights at the reference, the attention as fast as it runs
            # right after itself: the most this step's BLAS calls allow
            "best": step_bytes
            / ref
            / (w_bytes / ref + part["attention (again)"]),
            "parts": part,
            # time - bytes / ref, part by part; they add up to the gap
            "gap": {
                "weights": part["weights"] - w_bytes / ref,
                "keys and values": part["attention"]
                - part["softmax"]
                - kv_bytes / ref,
                "softmax": part["softmax"],
                "rest": t - part["weights"] - part["attention"],
            },
        }
        row = rows[fam]
        row["verdict"] = roof_verdict(row["roof paired"], row["A/A paired"])
        # the step with its attention over the cache taking no more than
        # the cache's bytes at the reference, the rest as measured: how
        # far a perfect attention kernel alone would take it
        row["of roof, no K/V gap"] = best / (
            t - max(0.0, row["gap"]["keys and values"])
        )
    mha, mqa = rows["MHA"], rows["MQA"]
    found = None
    if formulations:
        found = ceiling.ceiling_rows(
            {
                (fam, name): per_round[f"{fam} ~ {name}"]
                for fam in cases
                for name in ceiling.FORMULATIONS
            },
            cases,
            ref_r,
        )
        for fam, frows in found.items():
            row = rows[fam]
            fastest = min(
                (n for n in frows if n != "library (A/A)"),
                key=lambda n: frows[n]["time"],
            )
            # the step with its weights at the reference and its attention
            # as fast as the fastest formulation makes it
            row["fastest formulation"] = fastest
            row["of roof, fastest"] = row["roof time"] / (
                row["weight_bytes"] / ref + frows[fastest]["time"]
            )
    return {
        "config": {
            "d_model": d_model,
            "n_heads": n_heads,
            "context": context,
            "batch": batch,
            "rounds": rounds,
            "probe_bytes": probe_bytes,
        },
        "bandwidths": bandwidths,
        "reference": ref,
        "reference_name": ref_name,
        "matmul_rate": matmul_rate,
        "rows": rows,
        "ceiling": found,
        "mha_over_mqa": mha["time"] / mqa["time"],
        "bytes_mha_over_mqa": mha["step_bytes"] / mqa["step_bytes"],
        "load": _load(),
    }


def roof_time(weight_bytes, kv_bytes, flops, reference, matmul_rate):
    """The shortest time a decode step could take on this machine (its
    roof), in seconds: its weights read at the ``reference`` bandwidth
    (bytes/s), then its attention, which cannot take less than the longer
    of reading its cache at the reference and doing its FLOPs at the
    ``matmul_rate`` (FLOP/s): a product streams its operand while it
    computes, but the attention needs the projected query first and the
    output projection needs the attention. Works on arrays of rates too
    (one per round)."""
    return weight_bytes / reference + np.maximum(
        kv_bytes / reference, flops / matmul_rate
    )


def roof_lines(r) -> list[str]:
    """The lines of the paired summary: per family, the fraction of the
    roof (median and quartiles over the rounds; ``best``: the best round
    of the roof over the best round of the step), the A/A floor beside it
    and the verdict, at most 77 characters each."""
    out = [
        f"{'':5}{'of its roof, paired':19}{'best':>6}"
        f"{'':3}{'A/A, paired (noise)':19}"
    ]
    for fam, row in r["rows"].items():
        f, aa = row["roof paired"], row["A/A paired"]
        out.append(
            f"{fam:4} {f[0]:4.2f} [{f[1]:4.2f}, {f[2]:4.2f}]"
            f"  {row['of roof']:4.2f}"
            f"   {aa[0]:4.2f} [{aa[1]:4.2f}, {aa[2]:4.2f}]"
        )
        out.append(f"{'':5}{row['verdict']}")
    return out


def _load():
    """The 1-minute load average (None where the OS does not tell)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _ms(seconds, sign="") -> str:
    """Milliseconds in five characters: two decimals, fewer when a busy
    machine makes the number too wide for its column."""
    for decimals in (2, 1, 0):
        text = f"{seconds * 1e3:{sign}5.{decimals}f}"
        if len(text) <= 5:
            return text
    return text


def table(r) -> list[str]:
    """The lines of the printed table, at most 77 characters each."""
    out = [
        f"{'':35}{'of':>4}{'':12}  time - bytes/ref, ms",
        f"{'':4}{'n_kv':>4}{'bytes':>9}{'time':>9}{'GiB/s':>7}"
        f"{'ref':>6}{'roof':>6}{'best':>6} |{'wts':>6}{'K/V':>6}"
        f"{'smax':>6}{'rest':>6}",
    ]
    for fam, row in r["rows"].items():
        g = row["gap"]
        # each field after a space, so that none runs into the next
        gaps = (g["weights"], g["keys and values"], g["softmax"], g["rest"])
        out.append(
            f"{fam:4}{row['n_kv_heads'] or '-':>4}"
            f" {row['step_bytes'] / 2**20:4.0f} MiB"
            f" {_ms(row['time'])} ms"
            f" {row['bytes_per_s'] / 2**30:6.1f}"
            f" {row['fraction']:5.2f} {row['roof']:5.2f}"
            f" {row['best']:5.2f} |"
            + "".join(
                f" {_ms(x, '' if k == 2 else '+')}"
                for k, x in enumerate(gaps)
            )
        )
    return out


LEGEND = (
    "bytes: the four projection matrices and the cached keys and values, "
    "read once (MLA: its seven weight matrices and its cached rows [c_KV ; "
    "k_R]; n_kv does not apply). of ref: bytes per second over the "
    "reference. roof: the most a step could reach here: its weights read "
    "at the reference, plus "
    "the longer of reading its cache at the reference and doing its "
    "attention's FLOPs at the matmul rate. best: the most its BLAS calls "
    "allow: its weights read at the reference, plus its attention "
    "(softmax included) as fast as it runs right after itself, its cache "
    "still in the CPU's caches where it fits. "
    "The gap, time - bytes/reference, split by timing parts of the step "
    "alone, in turns: wts, the projections over their bytes at the "
    "reference; K/V, the attention over the cache without its softmax, "
    "over the cache's bytes; smax, the softmax; rest, the remainder "
    "(head splits, cache append, checks)."
)


def main(argv) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attn_np.bench decode",
        description=_description(__doc__),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--d-model", type=int, default=2048, help="the layer's width"
    )
    parser.add_argument(
        "--heads", type=int, default=16, help="query heads (MHA, GQA, MQA)"
    )
    parser.add_argument(
        "--context",
        type=int,
        default=8192,
        help="cached positions (default 8192)",
    )
    parser.add_argument(
        "--batch", type=int, default=1, help="sequences decoded together"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=40,
        help="timing rounds, the contenders alternating",
    )
    parser.add_argument(
        "--formulations",
        action="store_true",
        help="also time every formulation of the attention over the "
        "cache (where its ceiling is)",
    )
    parser.add_argument(
        "--levers",
        action="store_true",
        help="also time each lever of a step alone (LEVERS)",
    )
    args = parser.parse_args(argv)
    busy = busy_warning()
    r = run(
        args.d_model,
        args.heads,
        args.context,
        args.batch,
        args.rounds,
        formulations=args.formulations,
    )
    c = r["config"]
    d_k = c["d_model"] // c["n_heads"]
    say = _printer()
    say(
        "decode step of one attention layer, float32: "
        f"d_model={c['d_model']}, n_heads={c['n_heads']}, "
        f"d_k=d_v={d_k}, batch {c['batch']}, context {c['context']} "
        f"positions; best of {c['rounds']} rounds, in turns"
    )
    caches = cpu_cache_sizes()
    if caches:
        say(
            "CPU caches: "
            + ", ".join(f"{k} {format_bytes(v)}" for k, v in caches.items())
        )
    bw = ", ".join(
        f"{k} {v / 2**30:.1f}" for k, v in r["bandwidths"].items()
    )
    say(f"streaming read of {format_bytes(c['probe_bytes'])}, GiB/s: {bw}")
    say(
        f"reference: {r['reference'] / 2**30:.1f} GiB/s "
        f"({r['reference_name']}, the fastest); matmul rate "
        f"{r['matmul_rate'] / 1e9:.0f} GFLOP/s"
    )
    print()
    for line in table(r):
        print(line)
    print()
    say(LEGEND)
    print()
    rows = r["rows"]
    load = r["load"]
    say(
        f"of its roof, paired: in each of the "
        f"{c['rounds']} rounds the roof from that round's own probes over "
        "that round's step; the median and [quartiles] over the rounds. "
        "A/A: the same step timed again in the same round over the first, "
        "this run's noise floor (1 = no noise)"
        + (
            f"; load average {load:.1f} at the end"
            if load is not None
            else ""
        )
        + ":"
    )
    for line in roof_lines(r):
        print(line)
    say(
        "with its attention over the cache at the cache's bytes at the "
        "reference (no K/V gap) and the rest of the step as measured, "
        "each step would reach this fraction of its roof (best rounds): "
        + ", ".join(
            f"{f} {w['of roof, no K/V gap']:.2f}" for f, w in rows.items()
        )
    )
    say(
        f"time MHA / MQA: {r['mha_over_mqa']:.2f}, against "
        f"{r['bytes_mha_over_mqa']:.2f} for their bytes: MQA saves less "
        "time than bytes, since its weights, its softmax over every "
        "head's scores and the rest of its step cost what MHA's do"
    )
    if r["ceiling"] is not None:
        print()
        for line in ceiling_lines(r):
            print(line)
    if args.levers:
        print()
        say(
            "levers, one at a time: each family's step as the library "
            "makes it (its median), and the change in its time when "
            "one thing is done differently: the median over "
            f"{args.rounds} rounds of the lever's time minus the "
            "library's in the same round (in brackets where the quartiles "
            "of that difference straddle 0: no clear effect):"
        )
        lev = run_levers(args.d_model, args.heads, args.context, args.rounds)
        print()
        for line in lever_table(lev):
            print(line)
        print()
        for name, what in LEVERS.items():
            say(f"{name}: {what}.")
    busy = busy or busy_warning()
    if busy:
        say(busy)
    return 0


def ceiling_lines(r) -> list[str]:
    """The printed formulations table of ``run(formulations=True)`` and,
    per family, the fraction of its roof the step could reach with the
    fastest of them, at most 77 characters each."""
    say = []

    def wrap(text):
        say.extend(textwrap.wrap(text, 77, subsequent_indent="  "))

    wrap(
        "the attention over the cache, every formulation (--formulations;"
        f" in the same {r['config']['rounds']} rounds, each after the "
        "flush): its best time, the cache's bytes at the reference over "
        "that time (of ref), and its time over the library's round by "
        "round, median [quartiles]; faster/slower only beyond the A/A "
        "row's quartiles:"
    )
    say.extend(ceiling.ceiling_table(r["ceiling"]))
    wrap(
        "; ".join(
            f"{name}: {what}" for name, what in ceiling.FORMULATIONS.items()
        )  # fmt: skip
        + "."
    )
    wrap(
        "with its attention as fast as the fastest formulation and its "
        "weights read at the reference, each step would reach this "
        "fraction of its roof: "
        + ", ".join(
            f"{fam} {row['of roof, fastest']:.2f}"
            f" ({row['fastest formulation']})"
            for fam, row in r["rows"].items()
        )
    )
    return say


def _printer():
    """``print`` wrapped at 77 columns (the width of the book's page)."""

    def say(text):
        print(textwrap.fill(text, 77, subsequent_indent="  "))

    return say


def busy_warning() -> str:
    """A warning when other processes compete for the cores (Unix load
    average above the CPU count).

    A decode step makes dozens of small BLAS calls, and at each one BLAS's
    threads must all get a core; on a busy machine they wait for one, and the
    step slows far more than one big read does.
    """
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return ""
    cpus = os.cpu_count() or 1
    if load <= cpus:
        return ""
    return (
        f"warning: load average {load:.1f} on {cpus} CPUs: other processes "
        "compete for the cores, and the many "
        "small BLAS calls of a decode step suffer far more than one large "
        "read; run this on an idle machine"
    )
