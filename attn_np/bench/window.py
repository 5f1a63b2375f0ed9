"""``python -m attn_np.bench window``: does a sliding window stop the decode
step from growing with the context? (chapter 8)

One float32 attention layer decodes one token over a context of ``n``
positions, with full attention (a plain :class:`~attn_np.KVCache`, which
holds all ``n``) and with a window of ``W`` (a rolling cache, which holds
``W``). Printed for each context: the bytes each cache holds and the median
step time of each; then, for each kind, the step at the longest context
over the step at the shortest one longer than ``W``, round by round (median
and quartiles), beside the run's own noise floor: the shortest context's
step timed against itself. The full step should grow with ``n``; the
windowed one should stay flat once ``n > W``.
"""

from __future__ import annotations

import argparse

import numpy as np

from attn_np.instruments.measure import alternating_times, ratio_spread
from attn_np.instruments.plotting import format_bytes
from attn_np.kv_cache import KVCache
from attn_np.multihead import GroupedQueryAttention

from ._help import description as _description


def window_decode_setup(
    d_model, n_heads, n_kv_heads, context, *, window=None, seed=0
):
    """A float32 layer (``window=None``: full attention), its cache after
    ``context`` random positions, and a one-token ``step()``.

    The full cache is preallocated one position longer and every step is
    undone (:meth:`KVCache.truncate`), so each call sees ``context``
    positions. The rolling cache is not undone: each step forgets the
    oldest position and moves the other ``W - 1``, as it does when a
    model decodes on and on; it holds ``W`` positions whatever the
    context.
    """
    layer = GroupedQueryAttention(
        d_model,
        n_heads,
        n_kv_heads,
        seed=seed,
        dtype=np.float32,
        window=window,
    )
    rng = np.random.default_rng(seed)
    cache = KVCache(initial_capacity=context + 1, window=window)
    shape = (1, n_kv_heads, context)
    cache.append(  # [1, n_kv, context, d_k] and [.., d_v]
        rng.standard_normal(shape + (layer.d_k,), dtype=np.float32),
        rng.standard_normal(shape + (layer.d_v,), dtype=np.float32),
    )
    x = rng.standard_normal((1, 1, d_model), dtype=np.float32)

    def step():
        layer.forward(x, kv_cache=cache)  # [1, 1, d_model]
        if window is None:
            cache.truncate(context)

    step()  # a rolling cache forgets all but its window here, once
    return layer, cache, step


def round_times_by_kind(
    d_model=512,
    n_heads=8,
    n_kv_heads=2,
    window=1024,
    contexts=(1024, 2048, 4096, 8192, 16384, 32768),
    rounds=10,
):
    """Measure; ``(held, times)``: ``held[kind, n]`` the bytes a cache
    holds, ``times[kind, n]`` every round's step time (seconds), with
    ``kind`` ``"full"`` or ``"window"``. ``times[kind, "A/A"]`` is the
    shortest context's step timed a second time under another name in the
    same rounds: its ratio to ``times[kind, contexts[0]]`` is the run's
    noise floor.

    The contexts of each kind are timed in alternating turns
    (:func:`~attn_np.instruments.measure.alternating_times`), so a busy
    moment of a shared machine slows all of them alike. The two kinds are
    timed apart: between two windowed steps, a full step over 32 MiB would
    push the window's 1 MiB out of the CPU caches.
    """
    times, held = {}, {}
    for kind, w in (("full", None), ("window", window)):
        fns = {}
        for n in contexts:
            _, cache, step = window_decode_setup(
                d_model, n_heads, n_kv_heads, n, window=w
            )
            fns[kind, n] = step
            held[kind, n] = cache.nbytes
        fns[kind, "A/A"] = fns[kind, contexts[0]]
        times.update(alternating_times(fns, rounds=rounds))
        del fns  # free this kind's caches before the next
    return held, times


def run(**kwargs):
    """Measure; ``{context: {"full": (bytes, s), "window": (bytes, s)}}``
    with ``s`` the median step time of :func:`round_times_by_kind`, which
    takes the same keywords."""
    held, times = round_times_by_kind(**kwargs)
    return {
        n: {
            k: (held[k, n], float(np.median(times[k, n])))
            for k in ("full", "window")
        }
        for n in sorted({n for _, n in held})
    }


def growth(times, kind, short, long):
    """``(ratio, floor)``: the ``kind`` step at context ``long`` over the
    step at ``short`` round by round, and the run's A/A floor (the first
    context against itself), each as ``(median, low, high)``
    (:func:`~attn_np.instruments.measure.ratio_spread`)."""
    first = min(n for k, n in times if k == kind and n != "A/A")
    return (
        ratio_spread(times[kind, long], times[kind, short]),
        ratio_spread(times[kind, "A/A"], times[kind, first]),
    )


def verdict(ratio, floor) -> str:
    """Say whether a ratio's quartiles stand clear of the noise floor's."""
    if ratio[1] > floor[2]:
        return "grows beyond the noise"
    if ratio[2] < floor[1]:
        return "shrinks beyond the noise"
    return "no change beyond the noise"


def main(argv) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attn_np.bench window",
        description=_description(__doc__),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--d-model", type=int, default=512, help="the layer's width"
    )
    parser.add_argument("--heads", type=int, default=8, help="query heads")
    parser.add_argument(
        "--kv-heads", type=int, default=2, help="key/value heads"
    )
    parser.add_argument(
        "--window", type=int, default=1024, help="the sliding window W"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=10,
        help="timing rounds, the contenders alternating",
    )
    args = parser.parse_args(argv)
    contexts = (1024, 2048, 4096, 8192, 16384, 32768)
    held, times = round_times_by_kind(
        args.d_model,
        args.heads,
        args.kv_heads,
        args.window,
        contexts,
        args.rounds,
    )
    print(
        f"one-token decode step, float32, d_model={args.d_model}, "
        f"{args.heads} query heads, {args.kv_heads} key/value heads, "
        f"window {args.window}, median of {args.rounds} rounds"
    )
    print(
        f"{'context':>8}{'full cache':>12}{'full step':>11}"
        f"{'window cache':>14}{'window step':>13}"
    )
    for n in contexts:
        ft, wt = (float(np.median(times[k, n])) for k in ("full", "window"))
        print(
            f"{n:>8}{format_bytes(held['full', n]):>12}{ft * 1e3:>8.3f} ms"
            f"{format_bytes(held['window', n]):>14}{wt * 1e3:>10.3f} ms"
        )
    short = min(n for n in contexts if n > args.window)
    for kind in ("full", "window"):
        (r, lo, hi), (f, flo, fhi) = growth(times, kind, short, contexts[-1])
        print(
            f"{kind} step {contexts[-1]} / {short}: {r:.2f}x "
            f"[{lo:.2f}, {hi:.2f}]; A/A floor {f:.2f}x [{flo:.2f}, "
            f"{fhi:.2f}]: {verdict((r, lo, hi), (f, flo, fhi))}"
        )
    return 0
