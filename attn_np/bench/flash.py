"""``python -m attn_np.bench flash``: FlashAttention's memory and speed.

Three measurements (chapter 9):

* **memory**: the peak bytes traced by tracemalloc during one forward +
  backward of :class:`attn_np.MultiHeadAttention` with ``flash=True``
  (``B=1, d_model=512, h=8, d_k=64``, float32, causal) at ``L = 4096``
  and ``16384``, as a multiple of the bytes of ``q``, beside the bytes
  of the ``[h, L, L]`` float32 array the dense path would hold. Goals:
  peak at most 20 times ``q``, and ``peak(16384) / peak(4096) <= 4.5``.
* **speed**: the same layer's forward + backward at ``L = 2048`` with
  the dense and the tiled kernels, in turns with the matmul reference
  of :func:`attn_np.instruments.measure.matmul_gflops` (a
  ``[1024, 1024] @ [1024, 1024]`` product in the same dtype). Both
  paths are credited with the *dense* FLOPs (chapter 2's count, the
  causal half included), so the rates compare times. Goals: flash
  faster than dense, and at least 0.5 of the matmul rate.
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
    flash_attention_backward,
    flash_attention_forward,
)
from ..instruments.measure import best_times, measure_peak_bytes
from ..multihead import MultiHeadAttention

SWEEP_BLOCKS = (64, 128, 256, 512, 1024)


def _matmul_reference(n=1024, dtype=np.float32):
    """The product :func:`matmul_gflops` times, as a function to time."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    out = np.empty((n, n), dtype=dtype)
    return (lambda: np.matmul(a, b, out=out)), 2 * n**3


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
    mm, mm_flops = _matmul_reference(dtype=dtype)
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
    mm, mm_flops = _matmul_reference(dtype=dtype)
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


def main(argv=()) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attn_np.bench flash",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--L", type=int, default=2048, help="length for the speed comparison"
    )
    parser.add_argument(
        "--memory-L", type=int, nargs="*", default=[4096, 16384]
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="also sweep the block sizes (slow)",
    )
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args(list(argv))
    print(
        "FlashAttention in NumPy: B=1 d_model=512 h=8 d_k=64 float32 "
        f"causal; blocks {BLOCK_Q} x {BLOCK_K}"
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
        Ls = sorted(mem)
        worst = max(m["peak"] / m["q bytes"] for m in mem.values())
        print(
            f"goal: peak <= 20 x q: {'met' if worst <= 20 else 'NOT met'}"
            f" (worst {worst:.2f})"
        )
        if len(Ls) > 1:
            g = mem[Ls[-1]]["peak"] / mem[Ls[0]]["peak"]
            lim = 4.5 * Ls[-1] / Ls[0] / 4
            print(
                f"peak({Ls[-1]}) / peak({Ls[0]}) = {g:.2f}; goal <= "
                f"{lim:.1f}: {'met' if g <= lim else 'NOT met'}"
            )

    r = speed(args.L, rounds=args.rounds)
    print(
        f"\nspeed: MultiHeadAttention forward + backward, L={args.L}, "
        f"best of {args.rounds} rounds in turns"
    )
    print(
        f"FLOPs credited (dense, chapter 2): {r['flops'] / 1e9:.2f} "
        f"GFLOP; matmul reference {r['matmul_gflops']:.1f} GFLOP/s"
    )
    print(f"{'path':8s}{'seconds':>9s}{'GFLOP/s':>10s}{'of matmul':>11s}")
    for name in ("dense", "flash"):
        s = r[f"{name} seconds"]
        print(
            f"{name:8s}{s:9.3f}{r['flops'] / s / 1e9:10.1f}"
            f"{r[f'{name} fraction']:11.2f}"
        )
    ratio = r["flash / dense"]
    print(
        f"flash / dense time: {ratio:.2f} "
        f"({'faster' if ratio < 1 else 'NOT faster'})"
    )
    ok = r["flash fraction"] >= 0.5
    print(
        f"goal: flash at least 0.5 of the matmul rate: "
        f"{'met' if ok else 'NOT met'}"
    )

    if args.sweep:
        times, rate = block_sweep(args.L)
        blocks = sorted({b for b, _ in times})
        print(
            f"\nblock sweep: tiled kernels alone, [1, 8, {args.L}, 64] "
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
