"""``python -m attn_np.bench mha``: multi-head attention, forward + backward,
against this machine's matmul.

For ``B=1, L=2048, d_model=512, h=8`` in float32 with a causal mask it prints
the seconds of one forward + backward pass of
:class:`attn_np.MultiHeadAttention`, the GFLOP/s that makes (matmul FLOPs
from :mod:`attn_np.costs`), and that rate as a fraction of the float32 matmul
rate measured in the same run, in turns with it (the product of
:func:`attn_np.instruments.measure.matmul_gflops`).

It times a second implementation next to it, for comparison only:
:func:`naive_mha_forward` and :func:`naive_mha_backward`
(:mod:`attn_np.instruments.naive_mha`) do the same math the obvious
way. They hand ``np.matmul`` the per-head *views* that ``x @ W``
reshaped to ``[B, L, h, d_k]`` and swapped to ``[B, h, L, d_k]`` gives, and
the transposed view ``k.swapaxes(-1, -2)``, without making anything
contiguous, and they make a fresh ``[B, h, L, L]`` array for every step of
the softmax. Chapter 2 imports both and measures which of these differences
costs what.
"""

from __future__ import annotations

import argparse

import numpy as np

from ..costs import layer as costs
from ..instruments.measure import best_times
from ..instruments.naive_mha import (  # noqa: F401 (chapter 2 imports them)
    forward_backward_step,
    naive_forward_backward_step,
    naive_mha_backward,
    naive_mha_forward,
)
from ..multihead import MultiHeadAttention
from ._help import description as _description


def run(
    B=1,
    L=2048,
    d_model=512,
    n_heads=8,
    dtype=np.float32,
    causal=True,
    repeat=5,
    naive=True,
) -> dict:
    """Time the layer, the naive variant and the reference matmul in turns;
    return the figures.

    The three take turns (:func:`attn_np.instruments.measure.best_times`), so
    a burst of other work on a shared machine slows a whole round, and each
    one's best time comes from a quiet moment. The matmul reference is the
    ``[1024, 1024] @ [1024, 1024]`` product of
    :func:`attn_np.instruments.measure.matmul_gflops`, in the same dtype.
    """
    layer = MultiHeadAttention(d_model, n_heads, seed=0, dtype=dtype)
    x = (
        np.random.default_rng(0)
        .standard_normal((B, L, d_model))
        .astype(dtype)
    )
    rng = np.random.default_rng(0)
    n = 1024
    a, b = (
        rng.standard_normal((n, n)).astype(dtype),
        rng.standard_normal((n, n)).astype(dtype),
    )
    out = np.empty((n, n), dtype=dtype)
    fns = {
        "matmul": lambda: np.matmul(a, b, out=out),
        "layer": forward_backward_step(layer, x, causal=causal),
    }
    if naive:
        fns["naive"] = naive_forward_backward_step(
            layer.params, n_heads, x, causal=causal
        )
    best = best_times(fns, rounds=repeat)
    flops = costs.training_flops(B, L, d_model, n_heads)
    reference = 2 * n**3 / best["matmul"] / 1e9
    result = {
        "flops": flops,
        "matmul_gflops": reference,
        "seconds": best["layer"],
    }
    result["gflops"] = flops / best["layer"] / 1e9
    result["fraction"] = result["gflops"] / reference
    if naive:
        result["naive_seconds"] = best["naive"]
        result["naive_gflops"] = flops / best["naive"] / 1e9
        result["naive_fraction"] = result["naive_gflops"] / reference
    return result


def main(argv=()) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attn_np.bench mha",
        description=_description(__doc__),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--B", type=int, default=1, help="batch size")
    parser.add_argument(
        "--L", type=int, default=2048, help="sequence length"
    )
    parser.add_argument(
        "--d-model", type=int, default=512, help="the layer's width"
    )
    parser.add_argument("--heads", type=int, default=8, help="query heads")
    parser.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default="float32",
        help="the arrays' dtype",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="timed runs per variant; the best is reported",
    )
    parser.add_argument(
        "--no-naive",
        action="store_true",
        help="skip the naive per-head-view variant",
    )
    args = parser.parse_args(list(argv))
    r = run(
        args.B,
        args.L,
        args.d_model,
        args.heads,
        np.dtype(args.dtype),
        True,
        args.repeat,
        not args.no_naive,
    )
    d_k = args.d_model // args.heads
    print(
        f"multi-head attention, forward + backward: B={args.B} L={args.L} "
        f"d_model={args.d_model} "
        f"h={args.heads} d_k=d_v={d_k} {args.dtype} causal"
    )
    print(
        "FLOPs (matmuls, the causal half computed densely): "
        f"{r['flops'] / 1e9:.2f} GFLOP"
    )
    print(
        f"matmul reference, [1024, 1024] @ [1024, 1024] {args.dtype}: "
        f"{r['matmul_gflops']:.1f} GFLOP/s"
    )
    print(f"{'':34s}{'seconds':>9s}{'GFLOP/s':>10s}{'of matmul':>11s}")
    print(
        f"{'attn_np.MultiHeadAttention':34s}{r['seconds']:9.3f}{r['gflops']:10.1f}{r['fraction']:11.2f}"
    )
    if "naive_seconds" in r:
        print(
            f"{'naive: non-contiguous head views':34s}"
            f"{r['naive_seconds']:9.3f}{r['naive_gflops']:10.1f}"
            f"{r['naive_fraction']:11.2f}"
        )
    print(
        f"the layer reaches {r['fraction']:.2f} of the matmul rate measured "
        "in the same run\n(the rest goes to the softmax, the head splits "
        "and the copies)"
    )
    return 0
