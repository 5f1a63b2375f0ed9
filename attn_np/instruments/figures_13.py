"""The figures of chapter 13 (sparse attention), drawn for the book's column.

Each function takes what the chapter computed and draws it at the width the
book shows it (``COLUMN_INCHES``), so no text falls below the legibility
floor; the chapter calls it and ends its cell with ``plt.show()``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .plotting import COLUMN_INCHES, FAMILY_COLOURS


def plot_warmup_recall(curves, refs, *, every=25, lr=2e-2, k=8):
    """Recall curves of the indexer (one per seed) against the references.

    ``curves [n_seeds, n_points]``, ``refs`` a list (one per seed) of dicts
    ``{name: recall}``; the lines are the references' means over seeds.
    """
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 4.2))
    steps = np.arange(curves.shape[1]) * every
    for i, c in enumerate(curves):
        ax.plot(
            steps,
            c,
            color=FAMILY_COLOURS["MLA"],
            alpha=0.9,
            label=f"indexer ({len(curves)} seeds)" if i == 0 else None,
        )
    styles = (":", "--", "-.")
    for name, style in zip(refs[0], styles):
        mean = np.mean([r[name] for r in refs])
        ax.axhline(mean, color="0.3", ls=style, label=name)
    ax.set_xlabel(f"warm-up steps (Adam, lr {lr:g})")
    ax.set_ylabel(f"attention mass on the {k} keys")
    ax.set_ylim(0, 1)
    ax.set_title("The warm-up KL loss teaches the indexer the heavy keys")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def plot_step_flops(ctx, dense, sparse, crossover, *, k):
    """FLOPs of one decode step and layer against the context, log-log."""
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 4.2))
    ax.loglog(
        ctx, dense, color=FAMILY_COLOURS["MLA"], label="dense MLA (absorbed)"
    )
    ax.loglog(
        ctx, sparse, color=FAMILY_COLOURS["MQA"], label=f"DSA, k = {k:,}"
    )
    ax.axvline(
        crossover, color="0.4", ls=":", label=f"n* = {crossover:,.0f}"
    )
    ax.set_xlabel("cached positions n")
    ax.set_ylabel("FLOPs per step and layer")
    ax.set_title(
        "DeepSeek-V3.2's step: dense grows with n, sparse with n/17"
    )
    ax.legend()
    fig.tight_layout()
    return fig


def plot_decode_timings(ctx, median, ratio, floor, *, rounds):
    """The measured decode step: times (top) and paired ratios (bottom).

    ``median[n]`` maps ``"dense"``/``"sparse"`` to seconds; ``ratio[n]``
    and ``floor[n]`` are the quartiles ``[25, 50, 75]`` of sparse/dense and
    of dense/dense (the noise floor), taken round by round.
    """
    fig, axes = plt.subplots(2, 1, figsize=(COLUMN_INCHES, 7.0), sharex=True)
    for name, colour in (
        ("dense", FAMILY_COLOURS["MLA"]),
        ("sparse", FAMILY_COLOURS["MQA"]),
    ):
        axes[0].loglog(
            ctx,
            [median[n][name] * 1e3 for n in ctx],
            "o-",
            color=colour,
            label=f"{name} (median of {rounds})",
        )
    axes[0].set_ylabel("decode step (ms)")
    axes[0].set_title("One decode step, measured")
    axes[0].legend()
    r = np.array([ratio[n] for n in ctx])
    a = np.array([floor[n] for n in ctx])
    axes[1].fill_between(
        ctx, a[:, 0], a[:, 2], color="0.8", label="A/A quartiles"
    )
    axes[1].fill_between(
        ctx, r[:, 0], r[:, 2], color=FAMILY_COLOURS["MQA"], alpha=0.35
    )
    axes[1].semilogx(
        ctx,
        r[:, 1],
        "o-",
        color=FAMILY_COLOURS["MQA"],
        label="sparse / dense (quartiles shaded)",
    )
    axes[1].axhline(1.0, color="0.3", lw=1)
    axes[1].set_xlabel("cached positions n")
    axes[1].set_ylabel("time ratio, round by round")
    axes[1].set_title("Below 1: sparse is faster")
    axes[1].legend()
    fig.tight_layout()
    return fig


def plot_selection_maps(causal, maps):
    """Attended keys (black), causal but skipped (grey), future (white).

    ``maps`` is a list of ``(mask [L, L], title)``, drawn side by side.
    """
    fig, axes = plt.subplots(1, len(maps), figsize=(COLUMN_INCHES, 3.8))
    for ax, (m, title) in zip(np.atleast_1d(axes), maps):
        shade = np.where(causal, 0.25, 0.0) + 0.75 * m
        ax.imshow(shade, cmap="Greys", vmin=0, vmax=1)
        ax.set_title(title)
        ax.grid(False)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    fig.tight_layout()
    return fig


def plot_dsa_pipeline():
    """DeepSeek Sparse Attention for one decode step, as boxes and arrows:
    the indexer's three projections score every cached position, the top-k
    picks the rows, and chapter 7's absorbed MLA step reads only those."""
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 3.9))
    fig.subplots_adjust(left=0, right=1, top=0.9, bottom=0)
    box = dict(fc="#eef3fb", ec="#2b5797")
    cache = dict(fc="#fff4e0", ec="#a06000")

    def node(x, y, w, text, style=box):
        ax.add_patch(plt.Rectangle((x - w / 2, y - 0.32), w, 0.64, **style))
        ax.text(x, y, text, ha="center", va="center", fontsize=10)

    def arrow(a, b):
        ax.annotate(
            "", b, a, arrowprops=dict(arrowstyle="->", color="#444", lw=1)
        )

    # the indexer (top row) and the attention (bottom row)
    node(0.75, 2.6, 1.3, "token $t$:\n$h_t$, $c_Q(t)$")
    node(2.65, 3.35, 1.6, "queries $q^I_{t,j}$\n$H^I$ heads")
    node(2.65, 2.6, 1.6, "weights $w_{t,j}$")
    node(2.65, 1.85, 1.6, "key $k^I_t$\n(LN, RoPE)")
    node(4.6, 1.85, 1.5, "indexer keys\n$k^I_{1..t}$", cache)
    node(
        4.6,
        2.95,
        1.5,
        "$I_{t,s} = \\sum_j w_{t,j}$\nReLU$(q^I \\cdot k^I_s)$",
    )
    node(6.15, 2.95, 0.85, "top-$k$\n$S_t$")
    node(6.15, 0.7, 0.95, "output\n$o_t$")
    node(4.6, 0.7, 1.5, "latent rows\n$c_{KV}, k_R$", cache)
    node(2.65, 0.7, 1.6, "MLA query\n(absorbed)")
    for y in (3.35, 2.6, 1.85):
        arrow((1.42, 2.6), (1.83, y))
    arrow((0.75, 2.28), (1.83, 0.8))  # the token's MLA query
    arrow((3.47, 1.85), (3.83, 1.85))  # appended to the cache
    arrow((3.47, 3.35), (3.83, 3.1))
    arrow((3.47, 2.6), (3.83, 2.8))
    arrow((4.6, 2.18), (4.6, 2.62))  # every cached key is scored
    arrow((5.37, 2.95), (5.71, 2.95))
    arrow((6.15, 2.62), (5.38, 0.95))  # only the k selected rows
    arrow((3.47, 0.7), (3.83, 0.7))
    arrow((5.37, 0.7), (5.66, 0.7))
    ax.text(
        0.1,
        3.75,
        "indexer: cheap,\nevery position",
        fontsize=9.5,
        color="#2b5797",
        va="top",
    )
    ax.text(
        0.1,
        1.05,
        "attention: costly,\n$k$ positions",
        fontsize=9.5,
        color="#2b5797",
        va="top",
    )
    ax.set_xlim(0, COLUMN_INCHES)
    ax.set_ylim(0.2, 3.85)
    ax.axis("off")
    ax.set_title("One decode step of DeepSeek Sparse Attention", fontsize=11)
    return fig
