"""``python -m attn_np.bench flash``: FlashAttention's memory and speed.

Measurements (chapter 9), every timing a ratio of two things measured in
the same run, in turns (``alternating_times`` of
:mod:`attn_np.instruments.measure`), printed as the median over rounds
with the quartiles and beside the run's own noise floor (the same code
timed against itself, "A/A"):

* **memory**: the peak bytes traced by tracemalloc during one forward +
  backward of :class:`attn_np.MultiHeadAttention` with ``flash=True``
  (``B=1, d_model=512, h=8, d_k=64``, float32, causal) at ``L = 4096``
  and ``16384``, as a multiple of the bytes of ``q``, beside the bytes
  of the ``[h, L, L]`` float32 array the dense path would hold. Goal:
  peak at most 8 times ``q`` at 16,384.
* **rate**: at ``L = 2048, 4096, 8192`` the tiled layer's forward +
  backward, and the tiled kernels alone on ``[1, 8, L, 64]``, as a
  fraction of the same round's matmul rate (a ``[2048, 2048]`` product,
  two BLAS threads), crediting only the FLOPs a causal kernel must do
  (:func:`causal_flops`: the projections, and half the score and value
  products). Goal: at least 0.6 at every ``L``.
* **ceiling** (``--ceiling``): beside the rates, the kernels' matrix
  products alone (:func:`products_step`: the same tiles, parts, shapes
  and worker threads, nothing else), credited the same way, and the
  kernels' time over theirs: what the elementwise work costs, and the
  most the kernels could reach with it free.
* **load**: the dense and the tiled layer at ``L = 2048``, each round
  once on the machine as it is and once with one more core kept busy by
  a background process (:func:`~attn_np.instruments.measure.busy_core`,
  bounded in time). Goal: the tiled layer's time grows no more than the
  dense one's, and flash / dense stays below 1.0 under the extra load.
* **why** (``--why-load``): one tile's product ``[256, 64] @ [64, 256]``
  called 2,000 times (about as many BLAS calls as one forward + backward
  at 2,048 tokens makes) with one and with two BLAS threads, with and
  without the extra load: the evidence for running the tiles on one BLAS
  thread per worker.
* **blocks** (``--sweep``): the tiled kernels alone on ``[1, h, L, d_k]``
  float32 arrays, forward + backward, for every pair of block sizes,
  in turns. The library's defaults come from this sweep.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ..costs import layer as costs
from ..flash import (
    BLOCK_K,
    BLOCK_Q,
    Tiles,
    flash_attention_backward,
    flash_attention_forward,
    in_parallel,
)
from ..instruments.measure import (
    alternating_times,
    best_times,
    blas_call_times,
    busy_core,
    capped_rounds,
    matmul_probe,
    measure_peak_bytes,
    ratio_spread,
)
from ..multihead import MultiHeadAttention
from ._help import description as _description

SWEEP_BLOCKS = (64, 128, 256, 512, 1024)


def layer_step(
    L, *, flash, B=1, d_model=512, n_heads=8, dtype=np.float32, causal=True
):
    """One forward + backward of the layer, as a function of nothing."""
    layer = MultiHeadAttention(
        d_model, n_heads, seed=0, dtype=dtype, flash=flash
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, L, d_model)).astype(dtype)
    dy = rng.standard_normal((B, L, d_model)).astype(dtype)

    def step():
        layer.forward(x, causal=causal)
        return layer.backward(dy)

    return step


def memory(
    Ls=(4096, 16384), *, B=1, d_model=512, n_heads=8, dtype=np.float32
):
    """Traced peak of one flash forward + backward at each ``L``.

    Returns ``{L: {"peak", "q bytes", "dense weights"}}``: the peak,
    the bytes of ``q = [B, h, L, d_k]`` and of the dense ``[B, h, L, L]``
    attention weights. Only allocations made during the call count
    (the input and the weights exist before it).
    """
    e = np.dtype(dtype).itemsize
    result = {}
    for L in Ls:
        step = layer_step(
            L, flash=True, B=B, d_model=d_model, n_heads=n_heads, dtype=dtype
        )
        result[L] = {
            "peak": measure_peak_bytes(step),
            "q bytes": B * L * d_model * e,  # h * d_k = d_model
            "dense weights": costs.attention_weights_bytes(
                B, L, n_heads, bytes_per_element=e
            ),
        }
    return result


def speed(
    L=2048, *, B=1, d_model=512, n_heads=8, dtype=np.float32, rounds=5
):
    """Dense and flash layer, forward + backward, in turns with matmul.

    Returns the seconds, the dense FLOPs, the reference rate, and each
    path's rate as a fraction of it.
    """
    mm, mm_flops = matmul_probe(dtype=dtype)
    fns = {
        "matmul": mm,
        "dense": layer_step(
            L,
            flash=False,
            B=B,
            d_model=d_model,
            n_heads=n_heads,
            dtype=dtype,
        ),
        "flash": layer_step(
            L, flash=True, B=B, d_model=d_model, n_heads=n_heads, dtype=dtype
        ),
    }
    best = best_times(fns, rounds=rounds)
    flops = costs.training_flops(B, L, d_model, n_heads)
    rate = mm_flops / best["matmul"]  # FLOP/s
    r = {"flops": flops, "matmul_gflops": rate / 1e9}
    for name in ("dense", "flash"):
        r[f"{name} seconds"] = best[name]
        r[f"{name} fraction"] = flops / best[name] / rate
    r["flash / dense"] = best["flash"] / best["dense"]
    return r


def kernel_step(
    L,
    block_q,
    block_k,
    *,
    n_heads=8,
    d_k=64,
    dtype=np.float32,
    causal=True,
    window=None,
):
    """Tiled forward + backward on ``[1, h, L, d_k]``, as a function."""
    rng = np.random.default_rng(0)
    q, k, v, do = (
        rng.standard_normal((1, n_heads, L, d_k)).astype(dtype)
        for _ in range(4)
    )

    def step():
        _, cache = flash_attention_forward(
            q,
            k,
            v,
            causal=causal,
            window=window,
            block_q=block_q,
            block_k=block_k,
        )
        return flash_attention_backward(do, cache)

    return step


def block_sweep(
    L=2048,
    blocks=SWEEP_BLOCKS,
    *,
    n_heads=8,
    d_k=64,
    dtype=np.float32,
    causal=True,
    rounds=3,
):
    """Seconds of the tiled kernels for every ``(block_q, block_k)``.

    All pairs take turns (with the matmul reference), so a busy moment
    slows a whole round rather than one pair. Returns
    ``(times {(block_q, block_k): s}, matmul GFLOP/s)``.
    """
    mm, mm_flops = matmul_probe(dtype=dtype)
    fns = {"matmul": mm}
    for bq in blocks:
        for bk in blocks:
            fns[(bq, bk)] = kernel_step(
                L,
                bq,
                bk,
                n_heads=n_heads,
                d_k=d_k,
                dtype=dtype,
                causal=causal,
            )
    best = best_times(fns, rounds=rounds)
    rate = mm_flops / best.pop("matmul") / 1e9
    return best, rate


def products_step(L, *, n_heads=8, d_k=64, dtype=np.float32):
    """The tiled kernels' matrix products alone on ``[1, h, L, d_k]``,
    causal, forward and backward: the same tiles and parts
    (:meth:`~attn_np.flash.Tiles.blocks`), shapes and worker threads,
    and nothing else. Its rate is the ceiling of the kernels' own."""
    rng = np.random.default_rng(0)
    q, k, v, do = (
        rng.standard_normal((1, n_heads, L, d_k)).astype(dtype)
        for _ in range(4)
    )
    tiles = Tiles(L, L, BLOCK_Q, BLOCK_K, causal=True, window=None)

    def share(take):
        qh, kh, vh, dh = take(q), take(k), take(v), take(do)
        s = np.empty(qh.shape[:-2] + tiles.shape, dtype)
        o = np.empty(qh.shape[:-2] + (max(tiles.shape), d_k), dtype)
        for i, j in zip(*np.nonzero(tiles.plan)):
            r0, c0 = tiles.rows[i][0], tiles.cols[j][0]
            for a, b, ca, cb, _ in tiles.blocks(i, j):
                qi, di = (
                    qh[..., r0 + a : r0 + b, :],
                    dh[..., r0 + a : r0 + b, :],
                )
                kj, vj = (
                    kh[..., c0 + ca : c0 + cb, :],
                    vh[..., c0 + ca : c0 + cb, :],
                )
                p = s[..., : b - a, : cb - ca]
                rows, keys = o[..., : b - a, :], o[..., : cb - ca, :]
                np.matmul(qi, kj.swapaxes(-1, -2), out=p)  # forward S
                np.matmul(p, vj, out=rows)  # P V
                np.matmul(qi, kj.swapaxes(-1, -2), out=p)  # backward S
                np.matmul(p.swapaxes(-1, -2), di, out=keys)  # dV
                np.matmul(di, vj.swapaxes(-1, -2), out=p)  # dP
                np.matmul(p, kj, out=rows)  # dQ
                np.matmul(p.swapaxes(-1, -2), qi, out=keys)  # dK

    def step():
        in_parallel(share, (1, n_heads), tiles.pairs * 7 * d_k)

    return step


def causal_flops(
    L, *, B=1, d_model=512, n_heads=8, kernel_only=False
) -> int:
    """Matmul FLOPs of a forward + backward that a causal kernel must do.

    Chapter 2's count (:func:`attn_np.costs.training_flops`) with half
    of each score and value product: a causal query attends half the
    keys on average, and a kernel that skips what the mask hides need
    not do the rest. ``kernel_only``: the attention products alone
    (the kernels on ``[B, h, L, d_model / h]``), no projections.
    """
    d_k = d_model // n_heads
    attention = 3 * 2 * B * n_heads * L * L * 2 * d_k  # QK^T, PV; 3 x
    if kernel_only:
        return attention // 2
    full = costs.training_flops(B, L, d_model, n_heads)
    return full - attention // 2


def rates(
    Ls=(2048, 4096, 8192), *, rounds=5, dtype=np.float32, ceiling=False
):
    """The tiled layer and kernels against the matmul rate, per ``L``.

    Per ``L``, five contenders in turns: the ``[2048, 2048]`` matmul,
    the layer twice and the kernels twice (the second of each is the
    same function again: the A/A noise floor). Returns ``{L: {name:
    (median, low, high)}}`` for ``"layer"``, ``"kernels"`` (fractions
    of the round's matmul rate, :func:`causal_flops` credited),
    ``"layer A/A"``, ``"kernels A/A"`` (time ratios) and
    ``"matmul GFLOP/s"``. ``ceiling=True`` adds ``"products"``: the
    kernels' matrix products alone (:func:`products_step`), credited the
    same way, and ``"kernels / products"`` (time).
    """
    mm, mm_flops = matmul_probe(2048, dtype)
    result = {}
    for L in Ls:
        layer = layer_step(L, flash=True, dtype=dtype)
        kernels = kernel_step(L, BLOCK_Q, BLOCK_K, dtype=dtype)
        fns = {
            "matmul": mm,
            "layer": layer,
            "kernels": kernels,
            "layer again": layer,
            "kernels again": kernels,
        }
        if ceiling:
            fns["products"] = products_step(L, dtype=dtype)
        t = alternating_times(fns, rounds=rounds)
        rate = mm_flops / t["matmul"]  # FLOP/s, round by round
        r = {"matmul GFLOP/s": _spread(rate / 1e9)}
        for name, flops in (
            ("layer", causal_flops(L)),
            ("kernels", causal_flops(L, kernel_only=True)),
        ):
            r[name] = _spread(flops / t[name] / rate)
            r[f"{name} A/A"] = ratio_spread(t[name], t[f"{name} again"])
        if ceiling:
            flops = causal_flops(L, kernel_only=True)
            r["products"] = _spread(flops / t["products"] / rate)
            r["kernels / products"] = ratio_spread(
                t["kernels"], t["products"]
            )
        result[L] = r
    return result


def under_load(L=2048, *, rounds=4, dtype=np.float32):
    """Dense and tiled layer, as the machine is and with one core more
    kept busy (:func:`busy_core`), round by round.

    Each round times both layers twice as the machine is (the second
    time: the A/A floor) and once under the extra load. Returns ``{name:
    (median, low, high)}``: ``"dense growth"``, ``"flash growth"``
    (loaded / unloaded time), ``"flash / dense"`` and ``"flash / dense
    loaded"``, and the A/A ratios.
    """
    fns = {
        "dense": layer_step(L, flash=False, dtype=dtype),
        "flash": layer_step(L, flash=True, dtype=dtype),
    }
    rounds = capped_rounds(rounds)
    quiet = {n: np.empty(rounds) for n in ("dense", "flash")}
    again = {n: np.empty(rounds) for n in quiet}
    loaded = {n: np.empty(rounds) for n in quiet}
    for fn in fns.values():
        fn()
    for i in range(rounds):
        order = ("dense", "flash") if i % 2 == 0 else ("flash", "dense")
        for table in (quiet, again):
            for name in order:
                table[name][i] = _seconds(fns[name])
        with busy_core(seconds=60):
            for name in order:
                loaded[name][i] = _seconds(fns[name])
    r = {}
    for name in ("dense", "flash"):
        r[f"{name} growth"] = ratio_spread(loaded[name], quiet[name])
        r[f"{name} A/A"] = ratio_spread(again[name], quiet[name])
    r["flash / dense"] = ratio_spread(quiet["flash"], quiet["dense"])
    r["flash / dense loaded"] = ratio_spread(
        loaded["flash"], loaded["dense"]
    )
    return r


def _seconds(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _spread(x):
    low, median, high = np.percentile(x, [25, 50, 75])
    return float(median), float(low), float(high)


def _fmt(m, digits=2):
    """``0.62 [0.60-0.64]``: median and quartiles."""
    a, b, c = (f"{x:.{digits}f}" for x in m)
    return f"{a} [{b}-{c}]"


def why_load(*, calls=2000):
    """:func:`blas_call_times` of one tile product with 1 and 2 BLAS
    threads, as the machine is and under :func:`busy_core`: ``{(loaded,
    threads): result}``."""
    result = {}
    for loaded in (False, True):
        for threads in (1, 2):
            if loaded:
                with busy_core(seconds=120):
                    r = blas_call_times(threads, calls=calls)
            else:
                r = blas_call_times(threads, calls=calls)
            result[loaded, threads] = r
    return result


def main(argv=()) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attn_np.bench flash",
        description=_description(__doc__),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--L",
        type=int,
        nargs="*",
        default=[2048, 4096, 8192],
        help="lengths for the rates",
    )
    parser.add_argument(
        "--memory-L",
        type=int,
        nargs="*",
        default=[16384],
        help="lengths whose traced peak of forward + backward is measured",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="timing rounds, the contenders alternating",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="also sweep the block sizes (slow)",
    )
    parser.add_argument(
        "--skip-memory", action="store_true", help="no memory tracing"
    )
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also time the kernels' matrix products alone",
    )
    parser.add_argument(
        "--why-load",
        action="store_true",
        help="also time one tile product with 1 and 2 BLAS threads",
    )
    parser.add_argument(
        "--skip-load", action="store_true", help="no extra-load rounds"
    )
    args = parser.parse_args(list(argv))
    print(
        "FlashAttention in NumPy: B=1 d_model=512 h=8 d_k=64 float32 "
        f"causal;\nblocks {BLOCK_Q} x {BLOCK_K}; median [quartiles] of "
        f"{args.rounds} rounds in turns"
    )

    if not args.skip_memory and args.memory_L:
        t0 = time.perf_counter()
        mem = memory(args.memory_L)
        print(
            f"\nmemory: traced peak of forward + backward, flash=True "
            f"({time.perf_counter() - t0:.0f} s)"
        )
        print(
            f"{'L':>6} {'peak MiB':>9} {'q MiB':>7} {'peak/q':>7} "
            f"{'dense [h,L,L] MiB':>18}"
        )
        for L, m in mem.items():
            print(
                f"{L:6d} {m['peak'] / 2**20:9.1f} "
                f"{m['q bytes'] / 2**20:7.1f} "
                f"{m['peak'] / m['q bytes']:7.2f} "
                f"{m['dense weights'] / 2**20:18.0f}"
            )
        worst = max(m["peak"] / m["q bytes"] for m in mem.values())
        print(
            f"largest peak / q: {worst:.2f} (a peak / q that stays flat as "
            "L grows is\nmemory linear in L; the dense weights grow with "
            "L^2)"
        )

    if args.L:
        t0 = time.perf_counter()
        res = rates(args.L, rounds=args.rounds, ceiling=args.ceiling)
        print(
            "\nrate: forward + backward as a fraction of the round's\n"
            "[2048, 2048] matmul rate, crediting the FLOPs a causal\n"
            f"kernel must do ({time.perf_counter() - t0:.0f} s)"
        )
        print(
            f"{'L':>6}  {'':8s}{'of matmul':>17} {'A/A time':>17} "
            f"{'matmul GFLOP/s':>17}"
        )
        worst = 1.0
        for L, r in res.items():
            for name in ("layer", "kernels"):
                print(
                    f"{L:6d}  {name:8s}{_fmt(r[name]):>17} "
                    f"{_fmt(r[name + ' A/A']):>17} "
                    f"{_fmt(r['matmul GFLOP/s'], 0):>17}"
                )
                worst = min(worst, r[name][0])
            if "products" in r:
                print(
                    f"{L:6d}  {'products':8s}{_fmt(r['products']):>17} "
                    f"{'kernels/products':>17} "
                    f"{_fmt(r['kernels / products']):>17}"
                )
        print(
            f"lowest fraction of the matmul rate at any L: {worst:.2f} "
            "(the rest of\nthe time goes to the softmax, masks and copies "
            "around the products)"
        )

    if not args.skip_load:
        t0 = time.perf_counter()
        r = under_load(2048, rounds=max(args.rounds, 4))
        print(
            "\nload: L=2048, as the machine is and with one more core\n"
            "kept busy by a background process "
            f"({time.perf_counter() - t0:.0f} s)"
        )
        for name in ("dense", "flash"):
            print(
                f"{name:6s} time grows x {_fmt(r[name + ' growth'])} "
                f"(A/A {_fmt(r[name + ' A/A'])})"
            )
        print(
            f"flash / dense: {_fmt(r['flash / dense'])} as it is, "
            f"{_fmt(r['flash / dense loaded'])} under the load"
        )
        print("a growth within its A/A spread is within this run's noise")

    if args.why_load:
        res = why_load()
        print("\nwhy: 2000 calls of one tile product [256, 64] @ [64, 256]")
        print(
            f"{'extra load':>10} {'threads':>7} {'total s':>8} "
            f"{'median us':>9} {'p90 us':>8} {'>1 ms':>6} "
            f"{'switches':>8} {'CPU s':>6}"
        )
        for (loaded, threads), r in res.items():
            t = r["seconds"]
            print(
                f"{'yes' if loaded else 'no':>10} {threads:7d} "
                f"{t.sum():8.2f} {np.median(t) * 1e6:9.0f} "
                f"{np.percentile(t, 90) * 1e6:8.0f} "
                f"{int(np.sum(t > 1e-3)):6d} {r['switches']:8d} "
                f"{r['cpu']:6.2f}"
            )
        print(
            "(switches: involuntary context switches of this process;\n"
            "CPU s: its user CPU time)"
        )

    if args.sweep:
        L = args.L[0] if args.L else 2048
        times, rate = block_sweep(L)
        blocks = sorted({b for b, _ in times})
        print(
            f"\nblock sweep: tiled kernels alone, [1, 8, {L}, 64] "
            f"float32 causal, seconds (matmul {rate:.0f} GFLOP/s)"
        )
        print("block_q \\ block_k" + "".join(f"{b:>8d}" for b in blocks))
        for bq in blocks:
            print(
                f"{bq:17d}"
                + "".join(f"{times[(bq, bk)]:8.3f}" for bk in blocks)
            )
        bq, bk = min(times, key=times.get)
        print(f"fastest: block_q={bq}, block_k={bk}")
    return 0
