"""The figures of chapter 12 (linear attention), drawn for the book's column.

Each function draws at the width the book shows it (``COLUMN_INCHES``), so
no text falls below the legibility floor; the chapter calls it and ends its
cell with ``plt.show()``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .plotting import COLUMN_INCHES

_BOX = dict(fc="#eef3fb", ec="#2b5797")
_STATE = dict(fc="#fff4e0", ec="#a06000")


def plot_chunked_form(chunk=4, n_chunks=2):
    """The loop against the chunked form on ``n_chunks`` chunks of
    ``chunk`` tokens: the loop passes the state token by token (``chunk *
    n_chunks`` steps in a row); the chunked form computes each chunk's
    ``[C, C]`` lower-triangular products at once and passes the state
    only from chunk to chunk."""
    T = chunk * n_chunks
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(COLUMN_INCHES, 4.6),
        gridspec_kw={"height_ratios": [1.0, 2.1]},
    )
    for ax in (top, bottom):
        ax.set_xlim(-0.2, T + 1.6)
        ax.axis("off")

    def state(ax, x, y, text):
        ax.add_patch(plt.Rectangle((x - 0.35, y - 0.3), 0.7, 0.6, **_STATE))
        ax.text(x, y, text, ha="center", va="center", fontsize=10)

    def arrow(ax, a, b):
        ax.annotate(
            "", b, a, arrowprops=dict(arrowstyle="->", color="#444", lw=1)
        )

    # the loop: one state per token
    top.set_ylim(-0.7, 1.0)
    top.set_title(f"The loop: {T} steps, one after the other", fontsize=10)
    xs = np.linspace(0.3, T + 1.2, T + 1)
    for i, x in enumerate(xs):
        state(top, x, 0.25, f"$S_{{{i}}}$")
        if i:
            arrow(top, (xs[i - 1] + 0.37, 0.25), (x - 0.37, 0.25))
            top.text(
                (xs[i - 1] + x) / 2,
                -0.35,
                f"$t={i}$",
                ha="center",
                va="top",
                fontsize=9,
            )

    # the chunked form: a [C, C] block per chunk, the state per chunk
    bottom.set_ylim(-1.2, chunk + 1.0)
    bottom.set_title(
        f"Chunks of C = {chunk}: products within a chunk, "
        f"{n_chunks} state steps",
        fontsize=10,
    )
    cell = 0.55  # one token's column in a chunk's block
    width = chunk * cell
    step = width + 2.2  # a block, then the state it hands on
    y = chunk / 2
    state(bottom, 0.4, y, "$S_0$")
    for c in range(n_chunks):
        x0 = 1.2 + c * step
        for i in range(chunk):  # query row i reads keys j <= i
            for j in range(chunk):
                lower = j <= i
                bottom.add_patch(
                    plt.Rectangle(
                        (x0 + j * cell, chunk - 1 - i),
                        cell,
                        0.95,
                        fc="#2b5797" if lower else "#f0f0f0",
                        ec="white",
                        alpha=0.75 if lower else 1.0,
                    )
                )
        bottom.text(
            x0 + width / 2,
            -0.35,
            f"tokens {c * chunk + 1}-{(c + 1) * chunk}:\n"
            r"$\langle Q, K\rangle$, $\mathcal{T}$, $W$, $\tilde U$",
            ha="center",
            va="top",
            fontsize=9,
        )
        before = 0.4 if c == 0 else x0 - 1.1
        arrow(bottom, (before + 0.37, y), (x0 - 0.05, y))
        after = x0 + width + 1.1
        arrow(bottom, (x0 + width + 0.05, y), (after - 0.37, y))
        state(bottom, after, y, f"$S_{{{(c + 1) * chunk}}}$")
    return fig
