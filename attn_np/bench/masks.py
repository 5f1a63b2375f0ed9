"""``python -m attn_np.bench masks``: what block sparsity from a mask
saves in the tiled kernel, on a row of packed documents (chapter 16).

One row packs ``--docs`` documents of random lengths (seeded) into ``L``
tokens, causal inside each document; float32 heads ``[1, h, L, 64]``.
Forward and backward of three contenders, the same outputs and gradients
checked first:

* **sparse**: chapter 9's tiled kernel given the mask function: it sorts
  each tile into empty, full or partial, skips the empty ones and applies
  no mask to the full ones;
* **tiled**: the same kernel given the evaluated mask with
  ``block_sparse=False``: every tile computed, the mask applied in each;
* **dense**: :func:`~attn_np.attention_forward` and its backward with
  the mask array, holding the ``[h, L, L]`` scores.

Timed in alternating rounds (:func:`~attn_np.instruments.paired.
compare`); each ratio is the median over rounds with its quartiles,
beside the run's noise floor (the sparse kernel timed against itself).
Also printed: the tiles and score pairs each kernel computes. The ratio
follows the share of tiles the documents leave empty: fewer, longer
documents leave fewer.
"""

from __future__ import annotations

import argparse
import textwrap

import numpy as np

from ..attention import attention_backward, attention_forward
from ..flash import (
    BLOCK_K,
    BLOCK_Q,
    SKIP,
    Tiles,
    flash_attention_backward,
    flash_attention_forward,
)
from ..instruments.paired import compare, spread_text
from ..masks import and_masks, causal_mod, create_mask, document_mod
from ._help import description as _description


def packed_row(L, docs, *, seed=0):
    """``cu_seqlens`` of ``docs`` documents of random lengths in a row of
    ``L`` tokens (each at least one token)."""
    if docs > L:
        raise ValueError(
            f"--docs must be at most --L (a document holds a token at "
            f"least), got --docs {docs} and --L {L}"
        )
    rng = np.random.default_rng(seed)
    cut = np.sort(rng.choice(np.arange(1, L), docs - 1, replace=False))
    return [0, *cut.tolist(), L]


def contenders(L, cu, *, heads=4, d_k=64, seed=0):
    """``({name: step}, grid)``: forward + backward of each contender on
    the same seeded float32 inputs, and the mask they all apply."""
    mod = and_masks(causal_mod, document_mod(cu))
    grid = create_mask(mod, 1, 1, L, L)[0, 0]  # [L, L]
    rng = np.random.default_rng(seed)
    shape = (1, heads, L, d_k)
    q, k, v, dout = (
        rng.standard_normal(shape, dtype=np.float32) for _ in range(4)
    )

    def sparse():
        o, c = flash_attention_forward(q, k, v, mask=mod)
        return o, flash_attention_backward(dout, c)

    def tiled():
        o, c = flash_attention_forward(
            q, k, v, mask=grid, block_sparse=False
        )
        return o, flash_attention_backward(dout, c)

    def dense():
        o, c = attention_forward(q, k, v, mask=grid)
        return o, attention_backward(dout, c)

    return {"sparse": sparse, "tiled": tiled, "dense": dense}, grid


def check_same(steps, *, tol=1e-4):
    """The largest difference of any output or gradient from the sparse
    kernel's (float32); a ``RuntimeError`` beyond ``tol``."""
    o, g = steps["sparse"]()
    worst = 0.0
    for name in ("tiled", "dense"):
        o2, g2 = steps[name]()
        for a, b in zip((o, *g), (o2, *g2)):
            worst = max(worst, float(np.abs(a - b).max()))
    if worst > tol:
        raise RuntimeError(
            f"the three kernels disagree by {worst:.2e} (> {tol:g})"
        )
    return worst


def tile_counts(L, grid):
    """``{name: (tiles computed, tiles, score pairs)}`` of the tiled
    kernel with and without block sparsity."""
    out = {}
    for name, sparse in (("sparse", True), ("tiled", False)):
        t = Tiles(
            L,
            L,
            BLOCK_Q,
            BLOCK_K,
            causal=False,
            window=None,
            mask=grid,
            block_sparse=sparse,
        )
        out[name] = (int(np.sum(t.plan != SKIP)), t.plan.size, t.pairs)
    return out


def main(argv) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attn_np.bench masks",
        description=_description(__doc__),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--L", type=int, default=4096, help="row length")
    parser.add_argument(
        "--docs", type=int, default=8, help="documents packed in the row"
    )
    parser.add_argument("--heads", type=int, default=4, help="heads")
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="timing rounds, the contenders alternating",
    )
    args = parser.parse_args(argv)
    cu = packed_row(args.L, args.docs)
    steps, grid = contenders(args.L, cu, heads=args.heads)
    print(
        f"a row of L={args.L} packing {args.docs} documents, causal in "
        f"each; float32 [1, {args.heads}, {args.L}, 64]"
    )
    lengths = ", ".join(str(b - a) for a, b in zip(cu, cu[1:]))
    print(textwrap.fill(f"document lengths: {lengths}", 77))
    print(f"forward + backward, {args.rounds} rounds, in turns")
    worst = check_same(steps)
    print(f"outputs and gradients agree: largest difference {worst:.1e}")
    for name, (n, total, pairs) in tile_counts(args.L, grid).items():
        print(
            f"{name:7s} tiles computed {n:4d} of {total}; score pairs "
            f"{pairs:,}"
        )
    print(f"dense   score pairs {args.L * args.L:,} (every one)")
    run = compare(steps, baseline="sparse", rounds=args.rounds)
    print(f"noise floor (A/A, sparse twice): {spread_text(run.floor)}")
    for name, label in (
        ("tiled", "tiled, dense mask / sparse time"),
        ("dense", "dense attention / sparse time"),
    ):
        print(f"{label:34s} {spread_text(run.ratio(name))}")
    print(
        "a ratio above 1: sparse is faster by that factor; one whose "
        "quartiles"
    )
    print("overlap the floor's is not resolved by this run")
    return 0
