"""``python -m attn_np.bench mha``: multi-head attention, forward + backward,
against this machine's matmul.

For ``B=1, L=2048, d_model=512, h=8`` in float32 with a causal mask it prints
the seconds of one forward + backward pass of
:class:`attn_np.MultiHeadAttention`, the GFLOP/s that makes (matmul FLOPs
from :mod:`attn_np.costs`), and that rate as a fraction of the float32 matmul
rate measured in the same run, in turns with it (the product of
:func:`attn_np.instruments.measure.matmul_gflops`).

It times a second implementation next to it, for comparison only:
:func:`naive_mha_forward` and :func:`naive_mha_backward` do the same math the
obvious way. They hand ``np.matmul`` the per-head *views* that ``x @ W``
reshaped to ``[B, L, h, d_k]`` and swapped to ``[B, h, L, d_k]`` gives, and
the transposed view ``k.swapaxes(-1, -2)``, without making anything
contiguous, and they make a fresh ``[B, h, L, L]`` array for every step of
the softmax. Chapter 2 imports both and measures which of these differences
costs what.
"""

from __future__ import annotations

import argparse

import numpy as np

from ..attention import causal_mask
from ..costs import layer as costs
from ..instruments.measure import best_times
from ..multihead import MultiHeadAttention
from ._help import description as _description


# ---------------------------------------------------------------------------
# ----------------- COMPARISON ONLY, not part of the library: multi-head
# attention written the obvious way, on non-contiguous per-head views, with a
# fresh array for every step of the softmax. --------------------------------
# ------------------------------------------------------------
def naive_mha_forward(x, params, n_heads, *, causal=False):
    """Multi-head attention on per-head views; returns ``(y, cache)``. For
    benchmarks only.

    ``x`` is ``[B, L, d_model]``; ``params`` holds ``W_q, W_k, W_v, W_o`` as
    in :class:`attn_np.MultiHeadAttention`. Every per-head array is a strided
    view of ``x @ W``, and every matmul gets the transposed *view*
    ``k.swapaxes(-1, -2)``, never a contiguous copy.
    """
    B, L, _ = x.shape
    W = params
    d_k, d_v = W["W_q"].shape[1] // n_heads, W["W_v"].shape[1] // n_heads
    # view [B, h, L, d_k], not contiguous
    q = (x @ W["W_q"]).reshape(B, L, n_heads, d_k).swapaxes(1, 2)
    # view [B, h, L, d_k]
    k = (x @ W["W_k"]).reshape(B, L, n_heads, d_k).swapaxes(1, 2)
    # view [B, h, L, d_v]
    v = (x @ W["W_v"]).reshape(B, L, n_heads, d_v).swapaxes(1, 2)
    # [B, h, L, d_k] @ [B, h, d_k, L] -> [B, h, L, L]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(d_k)
    if causal:
        # a new [B, h, L, L] array
        s = np.where(causal_mask(L, L), s, -np.inf)
    # two new [B, h, L, L] arrays
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)  # and another
    o = p @ v  # [B, h, L, L] @ [B, h, L, d_v] -> [B, h, L, d_v]
    # [B, L, h*d_v] (reshape has to copy)
    concat = o.swapaxes(1, 2).reshape(B, L, n_heads * d_v)
    # [B, L, h*d_v] @ [h*d_v, d_model] -> [B, L, d_model]
    y = concat @ W["W_o"]
    return y, (x, q, k, v, p, concat, params, n_heads)


def naive_mha_backward(dy, cache):
    """Backward of :func:`naive_mha_forward`: ``(dx, grads)``, again on
    per-head views."""
    x, q, k, v, p, concat, W, n_heads = cache
    B, L, d_model = x.shape
    d_k, d_v = q.shape[-1], v.shape[-1]
    scale = 1 / np.sqrt(d_k)
    # [h*d_v, d_model]
    grads = {
        "W_o": concat.reshape(-1, n_heads * d_v).T @ dy.reshape(-1, d_model)
    }
    # view [B, h, L, d_v]
    do = (dy @ W["W_o"].T).reshape(B, L, n_heads, d_v).swapaxes(1, 2)
    # [B, h, L, L] @ [B, h, L, d_v] -> [B, h, L, d_v]
    dv = p.swapaxes(-1, -2) @ do
    # [B, h, L, d_v] @ [B, h, d_v, L] -> [B, h, L, L]
    dp = do @ v.swapaxes(-1, -2)
    # three new [B, h, L, L] arrays
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = ds @ k * scale  # [B, h, L, L] @ [B, h, L, d_k] -> [B, h, L, d_k]
    # [B, h, L, L] @ [B, h, L, d_k] -> [B, h, L, d_k]
    dk = ds.swapaxes(-1, -2) @ q * scale
    dq = dq.swapaxes(1, 2).reshape(B, L, n_heads * d_k)  # [B, L, h*d_k]
    dk = dk.swapaxes(1, 2).reshape(B, L, n_heads * d_k)
    dv = dv.swapaxes(1, 2).reshape(B, L, n_heads * d_v)
    xf = x.reshape(-1, d_model)  # [B*L, d_model]
    for name, g in (("W_q", dq), ("W_k", dk), ("W_v", dv)):
        # [d_model, B*L] @ [B*L, h*d] -> [d_model, h*d]
        grads[name] = xf.T @ g.reshape(B * L, -1)
    # [B, L, d_model]
    dx = dq @ W["W_q"].T + dk @ W["W_k"].T + dv @ W["W_v"].T
    return dx, grads


# ---------------------------------------------------------------------------
# -----------------
def forward_backward_step(layer, x, *, causal=True):
    """A function that runs ``layer.forward(x)`` then ``layer.backward(dy)``
    (``dy`` fixed, seeded)."""
    dy = np.random.default_rng(1).standard_normal(x.shape).astype(x.dtype)

    def step():
        layer.forward(x, causal=causal)
        layer.backward(dy)

    return step


def naive_forward_backward_step(params, n_heads, x, *, causal=True):
    """The same for :func:`naive_mha_forward` and
    :func:`naive_mha_backward`."""
    dy = np.random.default_rng(1).standard_normal(x.shape).astype(x.dtype)

    def step():
        _, cache = naive_mha_forward(x, params, n_heads, causal=causal)
        naive_mha_backward(dy, cache)

    return step


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
