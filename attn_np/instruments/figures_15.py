"""The figures of chapter 15 (serving), drawn for the book's column.

Each function draws at the width the book shows it (``COLUMN_INCHES``);
the chapter calls it and ends its cell with ``plt.show()``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .plotting import COLUMN_INCHES

_COLOURS = ["#2b5797", "#c0504d", "#4f9a3a", "#8064a2", "#d08a00"]


def plot_page_tables(cache, names=None):
    """The pool's pages in a row, each coloured by the sequence that holds
    it (grey: free; hatched: shared), and each sequence's block table
    below it, its entries pointing at pages."""
    seqs = list(cache.tables)
    names = names or {s: f"seq {s}" for s in seqs}
    n = cache.n_pages
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 1.3 + 0.55 * len(seqs)))
    ax.axis("off")
    owner = {}
    for j, s in enumerate(seqs):
        for p in cache.tables[s]:
            owner.setdefault(p, []).append(j)
    top = len(seqs) + 0.6
    for p in range(n):
        who = owner.get(p, [])
        colour = _COLOURS[who[0] % 5] if who else "#dddddd"
        ax.add_patch(
            plt.Rectangle(
                (p, top),
                0.9,
                0.8,
                fc=colour,
                ec="#333",
                hatch="//" if len(who) > 1 else None,
                alpha=0.85,
            )
        )
        ax.text(
            p + 0.45,
            top + 0.4,
            str(p),
            ha="center",
            va="center",
            fontsize=9,
            color="white" if who else "#333",
        )
    ax.text(-0.3, top + 0.4, "pool", ha="right", va="center", fontsize=10)
    for j, s in enumerate(seqs):
        y = len(seqs) - 1 - j
        table = cache.tables[s]
        L = cache.lengths[s]
        ax.text(
            -0.3,
            y + 0.4,
            f"{names[s]} ({L} pos.)",
            ha="right",
            va="center",
            fontsize=10,
        )
        for i, p in enumerate(table):
            ax.add_patch(
                plt.Rectangle(
                    (i, y), 0.9, 0.8, fc="white", ec=_COLOURS[j % 5]
                )
            )
            ax.text(
                i + 0.45,
                y + 0.4,
                str(p),
                ha="center",
                va="center",
                fontsize=9,
            )
            ax.annotate(
                "",
                (p + 0.45, top - 0.02),
                (i + 0.45, y + 0.82),
                arrowprops=dict(
                    arrowstyle="->", lw=0.6, color=_COLOURS[j % 5], alpha=0.7
                ),
            )
    ax.set_xlim(-4.2, n + 0.2)
    ax.set_ylim(-0.2, top + 1.0)
    ax.set_title(
        "Block tables (below) point into one pool of pages (above)",
        fontsize=10,
    )
    return fig


def plot_memory(trace, page_size):
    """Positions used, reserved by pages and by contiguous preallocation,
    step by step, in bytes per position (``trace`` of
    :func:`~.serving_lab.memory_trace`)."""
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 3.0))
    steps = np.arange(1, len(trace["used"]) + 1)
    ax.plot(
        steps,
        trace["contiguous"],
        label="contiguous (reserved)",
        color=_COLOURS[1],
    )
    ax.plot(
        steps,
        trace["paged"],
        label=f"paged, P={page_size} (reserved)",
        color=_COLOURS[0],
    )
    ax.plot(steps, trace["used"], label="used", color="#333", ls="--")
    ax.set_xlabel("engine step")
    ax.set_ylabel("positions (all layers)")
    ax.set_title("Reserved against used on a random workload")
    ax.legend(fontsize=9)
    return fig


def plot_schedule(plans, names):
    """Who computes how many positions in each step: one bar per step,
    one colour per request (``plans`` of :attr:`Engine.plans`)."""
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 2.8))
    seen = set()
    for t, plan in enumerate(plans):
        bottom = 0
        for rid, _, n in plan:
            label = names[rid] if rid not in seen else None
            seen.add(rid)
            ax.bar(
                t + 1,
                n,
                bottom=bottom,
                color=_COLOURS[rid % 5],
                label=label,
                width=0.8,
            )
            bottom += n
    ax.set_xlabel("engine step")
    ax.set_ylabel("tokens in the step")
    ax.set_title("Prefill chunks and decodes packed into each step")
    top = max(sum(n for _, _, n in plan) for plan in plans)
    ax.set_ylim(0, 1.45 * top)  # room for the legend above the bars
    ax.yaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.legend(fontsize=9, ncol=3, loc="upper center")
    return fig


def plot_throughput(batches, measured, roofline):
    """Tokens per second against the batch size: measured, and the decode
    step's roofline."""
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 3.0))
    ax.plot(batches, roofline, "o--", color="#777", label="roofline")
    ax.plot(batches, measured, "o-", color=_COLOURS[0], label="measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batches)
    ax.set_xticklabels([str(b) for b in batches])
    ax.set_xlabel("sequences decoded together (batch)")
    ax.set_ylabel("tokens per second")
    ax.set_title("Decode throughput against the batch size (this run)")
    ax.legend(fontsize=9)
    return fig
