"""Chapter 9's timings: the tiled kernels against the dense ones, and the
parts of the difference, each measured as a paired ratio in one run.

* :func:`layer_speed`: the dense and the tiled layer, forward + backward,
  with the reference matmul in the same rounds.
* :func:`speedup_parts`: the kernels alone, and one measurement for each
  explanation of their difference: the tiles a causal mask skips, the
  worker threads, the dense kernels' time outside their products, an
  elementwise pass over the whole score matrix against the same pass tile
  by tile (in cache), and a fresh ``[h, L, L]`` array against writing in
  place.

Every function returns a :class:`~.paired.Paired` (with the run's A/A
floor) and the figures that go with it; the ``*_report`` functions give
the lines a cell prints, verdicts included, so that the prose can point
at them rather than quote a run.
"""

from __future__ import annotations

import numpy as np

from ..attention import attention_backward, attention_forward
from ..costs import layer as costs
from ..flash import (
    BLOCK_K,
    BLOCK_Q,
    flash_attention_backward,
    flash_attention_flops,
    flash_attention_forward,
)
from ..multihead import MultiHeadAttention
from .blas import blas_threads
from .measure import matmul_probe
from .paired import Paired, compare, spread_text


def _qkvd(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(4)]


def kernels_step(q, k, v, do, *, flash, causal=True, **kw):
    """Forward + backward of the dense (chapter 1) or the tiled kernels,
    as a function of nothing."""
    fwd, bwd = (
        (flash_attention_forward, flash_attention_backward)
        if flash
        else (attention_forward, attention_backward)
    )

    def step():
        _, cache = fwd(q, k, v, causal=causal, **kw)
        return bwd(do, cache)

    return step


def layer_step(L, *, flash, d_model=512, n_heads=8, dtype=np.float32):
    """One forward + backward of ``MultiHeadAttention`` (``B = 1``,
    causal), as a function of nothing."""
    layer = MultiHeadAttention(
        d_model, n_heads, seed=0, dtype=dtype, flash=flash
    )
    x, dy = _qkvd((1, L, d_model), dtype)[:2]

    def step():
        layer.forward(x, causal=True)
        return layer.backward(dy)

    return step


def layer_speed(L=1024, *, d_model=512, n_heads=8, rounds=5):
    """The dense and the tiled layer and the reference matmul, in
    alternating rounds (the dense layer twice: the A/A floor).

    Returns ``(paired, figures)`` with ``figures["fraction"][name]``
    each layer's rate as a fraction of the same round's matmul rate
    (chapter 2's dense FLOPs credited to both, so the fractions compare
    times), and ``figures["matmul GFLOP/s"]``, all ``(median, low,
    high)``."""
    mm, mm_flops = matmul_probe()
    p = compare(
        {
            "dense": layer_step(
                L, flash=False, d_model=d_model, n_heads=n_heads
            ),
            "flash": layer_step(
                L, flash=True, d_model=d_model, n_heads=n_heads
            ),
            "matmul": mm,
        },
        baseline="dense",
        rounds=rounds,
    )
    flops = costs.training_flops(1, L, d_model, n_heads)
    rate = mm_flops / p.times["matmul"]  # FLOP/s, round by round
    figures = {
        "L": L,
        "matmul GFLOP/s": _quartiles(rate / 1e9),
        "fraction": {
            n: _quartiles(flops / p.times[n] / rate)
            for n in ("dense", "flash")
        },
    }
    return p, figures


def layer_speed_report(p: Paired, figures) -> list[str]:
    """The lines chapter 9's layer timing prints."""
    lines = [
        p.floor_line(),
        p.line("flash", label=f"flash / dense layer, L = {figures['L']}"),
        f"matmul reference (same rounds): "
        f"{spread_text(figures['matmul GFLOP/s'], 0)} GFLOP/s",
    ]
    for n, f in figures["fraction"].items():
        lines.append(f"{n} layer: {spread_text(f)} of the matmul rate")
    return lines


def _passes(t):
    """The softmax's four elementwise passes over ``t`` (in place): a
    row maximum, a subtraction, an exponential, a row sum. Values stay in
    ``(0, 1]``, so the passes can be repeated for ever."""
    m = t.max(axis=-1, keepdims=True)
    t -= m
    np.exp(t, out=t)
    return t.sum(axis=-1)


def _passes_fresh(s):
    """The same four passes written the obvious way: fresh arrays."""
    t = np.exp(s - s.max(axis=-1, keepdims=True))
    return t.sum(axis=-1)


def _passes_by_tiles(s, b):
    """:func:`_passes` over ``s [h, L, L]`` one ``[h, b, b]`` tile at a
    time: the four passes over a tile run while it is in cache."""
    L = s.shape[-1]

    def run():
        for r in range(0, L, b):
            for c in range(0, L, b):
                _passes(s[..., r : r + b, c : c + b])

    return run


def speedup_parts(L=1024, *, n_heads=8, d_k=64, rounds=5, dtype=np.float32):
    """The tiled kernels against the dense ones on ``[1, h, L, d_k]``,
    causal, and one paired measurement per explanation, all in the same
    alternating rounds. Returns ``(paired, figures)``.

    Contenders: ``dense``, ``flash`` (the kernels as they are),
    ``flash, every tile`` (``causal=False``: no tile skipped),
    ``flash, one worker`` (one BLAS thread, so one worker thread),
    ``dense products`` (the dense kernels' six ``[h, L, L]``-sized
    matmuls alone, into preallocated outputs), and on a ``[h, L, L]``
    array of scores, the softmax's four elementwise passes (max, subtract,
    exp, sum): ``passes, whole`` (each over the whole array, in place),
    ``passes, by tiles`` (all four on one tile, then the next),
    ``passes, fresh`` (into new arrays, as the obvious code writes
    them). ``figures["skip FLOPs"]`` is the FLOP ratio the skipping
    alone would give.
    """
    q, k, v, do = _qkvd((1, n_heads, L, d_k), dtype)
    h = n_heads
    s = np.random.default_rng(1).standard_normal((h, L, L)).astype(dtype)
    p_buf, o_buf = np.empty_like(s), np.empty((1, h, L, d_k), dtype)
    kt, vt = k.swapaxes(-1, -2), v.swapaxes(-1, -2)

    def products():  # what the dense kernels multiply: 2 fwd + 4 bwd
        np.matmul(q, kt, out=p_buf[None])  # S = Q K^T
        np.matmul(p_buf[None], v, out=o_buf)  # O = P V
        np.matmul(p_buf[None].swapaxes(-1, -2), do, out=o_buf)  # dV
        np.matmul(do, vt, out=p_buf[None])  # dP = dO V^T
        np.matmul(p_buf[None], k, out=o_buf)  # dQ = dS K
        np.matmul(p_buf[None].swapaxes(-1, -2), q, out=o_buf)  # dK

    flash = kernels_step(q, k, v, do, flash=True)

    def flash_one():
        with blas_threads(1):
            flash()

    p = compare(
        {
            "dense": kernels_step(q, k, v, do, flash=False),
            "flash": flash,
            "flash, every tile": kernels_step(
                q, k, v, do, flash=True, causal=False
            ),
            "flash, one worker": flash_one,
            "dense products": products,
            "passes, whole": lambda: _passes(s),
            "passes, by tiles": _passes_by_tiles(s, BLOCK_Q),
            "passes, fresh": lambda: _passes_fresh(s),
        },
        baseline="dense",
        rounds=rounds,
    )
    f_c = flash_attention_flops(L, L, d_k, d_k, batch=h, causal=True)
    f_a = flash_attention_flops(L, L, d_k, d_k, batch=h)
    figures = {
        "L": L,
        "shape": (1, h, L, d_k),
        "skip FLOPs": (f_c["forward"] + f_c["backward"])
        / (f_a["forward"] + f_a["backward"]),
        "tile": (BLOCK_Q, BLOCK_K),
        "scores bytes": s.nbytes,
    }
    return p, figures


def speedup_parts_report(p: Paired, figures) -> list[str]:
    """The lines chapter 9's measurement of the parts prints."""
    bq, bk = figures["tile"]
    mib = figures["scores bytes"] / 2**20
    w = 44
    return [
        f"kernels alone on {list(figures['shape'])} float32, causal",
        p.floor_line(),
        p.line("flash", label="flash / dense", width=w),
        "1. tiles skipped: flash / flash computing every tile",
        p.line(
            "flash",
            "flash, every tile",
            label=f"   (its FLOPs alone: {figures['skip FLOPs']:.3f})",
            width=w,
            expect=figures["skip FLOPs"],
            words=("less than the FLOPs", "more than the FLOPs"),
        ),
        "2. worker threads: flash on one thread / flash",
        p.line("flash, one worker", "flash", label="", width=w),
        "3. dense: its six products alone / the dense kernels",
        p.line(
            "dense products",
            label="   (the rest: passes, masks, fresh arrays)",
            width=w,
        ),
        f"4. softmax passes over [h, L, L] ({mib:.0f} MiB): whole / "
        f"{bq} x {bk} tiles",
        p.line("passes, whole", "passes, by tiles", label="", width=w),
        "5. the same passes into fresh arrays / in place",
        p.line("passes, fresh", "passes, whole", label="", width=w),
    ]


def _quartiles(x):
    low, median, high = np.percentile(x, [25, 50, 75])
    return float(median), float(low), float(high)
