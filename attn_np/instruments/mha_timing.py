"""Chapter 2's timings, each a paired ratio measured in one run.

* :func:`layer_rates`: the float32 layer's forward + backward against the
  reference matmul at several lengths, in alternating rounds; the rate
  as a fraction of the same round's matmul rate, with the quartiles and
  the run's A/A floor.
* :func:`busy_effect`: the same pair as the machine is and with one more
  core kept busy (:func:`~.measure.busy_core`): what a busy machine does
  to the matmul rate, and to the fraction, measured in the same run.
* :func:`naive_ratio`: the layer against the naive per-head-view code of
  :mod:`attn_np.instruments.naive_mha`.
"""

from __future__ import annotations

import numpy as np

from ..costs import layer as costs
from ..multihead import MultiHeadAttention
from .measure import matmul_probe, ratio_spread
from .naive_mha import forward_backward_step, naive_forward_backward_step
from .paired import Paired, compare, spread_text, under_load


def _quartiles(x):
    low, median, high = np.percentile(x, [25, 50, 75])
    return float(median), float(low), float(high)


def _layer(L, d_model, n_heads, dtype=np.float32):
    layer = MultiHeadAttention(d_model, n_heads, seed=0, dtype=dtype)
    x = (
        np.random.default_rng(0)
        .standard_normal((1, L, d_model))
        .astype(dtype)
    )
    return layer, x


def layer_rates(Ls, *, d_model=512, n_heads=8, rounds=5):
    """For each ``L``: the layer (twice: the A/A floor) and the matmul
    probe in alternating rounds. Returns ``{L: {"paired", "seconds",
    "GFLOP/s", "matmul GFLOP/s", "fraction"}}``, each figure ``(median,
    low, high)`` over the rounds, the fraction taken round by round."""
    mm, mm_flops = matmul_probe()
    out = {}
    for L in Ls:
        layer, x = _layer(L, d_model, n_heads)
        p = compare(
            {"layer": forward_backward_step(layer, x), "matmul": mm},
            baseline="layer",
            rounds=rounds,
        )
        flops = costs.training_flops(1, L, d_model, n_heads)
        t, tm = p.times["layer"], p.times["matmul"]
        out[L] = {
            "paired": p,
            "flops": flops,
            "seconds": _quartiles(t),
            "GFLOP/s": _quartiles(flops / t / 1e9),
            "matmul GFLOP/s": _quartiles(mm_flops / tm / 1e9),
            "fraction": _quartiles((flops / t) / (mm_flops / tm)),
        }
    return out


def layer_rates_report(rates) -> list[str]:
    """The table chapter 2 prints: medians, the fraction's quartiles and
    each length's A/A floor."""
    lines = [
        f"{'L':>5} {'seconds':>8} {'GFLOP/s':>8} {'matmul GFLOP/s':>15} "
        f"{'of matmul [quartiles]':>22} {'A/A floor':>18}"
    ]
    for L, r in rates.items():
        p: Paired = r["paired"]
        flag = " noisy" if p.noisy else ""
        lines.append(
            f"{L:5d} {r['seconds'][0]:8.4f} {r['GFLOP/s'][0]:8.1f} "
            f"{r['matmul GFLOP/s'][0]:15.1f} "
            f"{spread_text(r['fraction']):>22} "
            f"{spread_text(p.floor):>18}{flag}"
        )
    return lines


def busy_effect(L=1024, *, d_model=512, n_heads=8, rounds=4):
    """The layer and the matmul probe, each round as the machine is
    (twice) and with one more core kept busy. Returns ``{"matmul
    loaded / quiet", "layer loaded / quiet"`` (time ratios),
    ``"fraction quiet"``, ``"fraction loaded"``, ``"A/A"``, ``"matmul
    GFLOP/s quiet"``, ``"matmul GFLOP/s loaded"}``, each ``(median,
    low, high)``."""
    mm, mm_flops = matmul_probe()
    layer, x = _layer(L, d_model, n_heads)
    t = under_load(
        {"layer": forward_backward_step(layer, x), "matmul": mm},
        rounds=rounds,
    )
    flops = costs.training_flops(1, L, d_model, n_heads)

    def fraction(key):
        return _quartiles(
            (flops / t[key]["layer"]) / (mm_flops / t[key]["matmul"])
        )

    return {
        "L": L,
        "A/A": ratio_spread(t["again"]["layer"], t["quiet"]["layer"]),
        "matmul loaded / quiet": ratio_spread(
            t["loaded"]["matmul"], t["quiet"]["matmul"]
        ),
        "layer loaded / quiet": ratio_spread(
            t["loaded"]["layer"], t["quiet"]["layer"]
        ),
        "matmul GFLOP/s quiet": _quartiles(
            mm_flops / t["quiet"]["matmul"] / 1e9
        ),
        "matmul GFLOP/s loaded": _quartiles(
            mm_flops / t["loaded"]["matmul"] / 1e9
        ),
        "fraction quiet": fraction("quiet"),
        "fraction loaded": fraction("loaded"),
    }


def busy_effect_report(r) -> list[str]:
    """The lines chapter 2 prints for :func:`busy_effect`."""
    aa = r["A/A"]
    spread = max(1 - aa[1], aa[2] - 1)
    s = spread_text
    return [
        f"L = {r['L']}, as the machine is, and with one more core busy:",
        f"noise floor (A/A, the layer twice): {s(aa)}"
        + (
            f"  wide: differences under {spread:.0%} are not resolved"
            if spread > 0.10
            else ""
        ),
        f"matmul GFLOP/s:       {s(r['matmul GFLOP/s quiet'], 0)} as is, "
        f"{s(r['matmul GFLOP/s loaded'], 0)} loaded",
        f"time, loaded / as is: matmul {s(r['matmul loaded / quiet'])}, "
        f"layer {s(r['layer loaded / quiet'])}",
        f"layer / matmul rate:  {s(r['fraction quiet'])} as is, "
        f"{s(r['fraction loaded'])} loaded",
    ]


def naive_ratio(L=2048, *, d_model=512, n_heads=8, rounds=3):
    """The naive per-head-view code against the layer (the layer twice:
    the A/A floor), in alternating rounds; a :class:`~.paired.Paired`."""
    layer, x = _layer(L, d_model, n_heads)
    return compare(
        {
            "layer": forward_backward_step(layer, x),
            "naive": naive_forward_backward_step(layer.params, n_heads, x),
        },
        baseline="layer",
        rounds=rounds,
    )
