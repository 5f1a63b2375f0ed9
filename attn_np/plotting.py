"""The book's one plotting style: attention maps, head grids and byte axes.

matplotlib only; every chapter imports these so that all figures look alike and print well.
"""

from __future__ import annotations

import numpy as np

STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "figure.figsize": (6.4, 4.0),
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "image.cmap": "viridis",
    "svg.hashsalt": "attn_np",
}

#: Colours for the three attention families, used in every chapter (colour-blind safe).
FAMILY_COLOURS = {"MHA": "#0072B2", "GQA": "#009E73", "MQA": "#D55E00"}


def use_book_style() -> None:
    """Apply the book's matplotlib style (call once at the top of a notebook)."""
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)


def plot_attention(weights, ax=None, *, queries=None, keys=None, title=None, colorbar=True, vmax=None):
    """Draw one ``[L_q, L_k]`` attention map with labelled tokens.

    Rows are queries, columns keys; a brighter cell means more weight. Masked entries (exactly 0)
    are drawn in light grey so that a causal triangle is visible at a glance.
    """
    import matplotlib.pyplot as plt

    w = np.asarray(weights)
    if w.ndim != 2:
        raise ValueError(f"weights must be a [L_q, L_k] array, got shape {w.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * w.shape[1] + 2.0, 0.45 * w.shape[0] + 1.2))
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("#e8e8e8")
    shown = np.ma.masked_where(w == 0, w)
    im = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=vmax if vmax is not None else max(float(w.max()), 1e-12))
    ax.grid(False)
    ax.set_xlabel("key position" if keys is None else "key")
    ax.set_ylabel("query position" if queries is None else "query")
    for axis, labels, n in ((ax.xaxis, keys, w.shape[1]), (ax.yaxis, queries, w.shape[0])):
        if labels is not None:
            if len(labels) != n:
                raise ValueError(f"got {len(labels)} token labels for an axis of length {n}")
            axis.set_ticks(range(n))
            axis.set_ticklabels(labels)
    if keys is not None:
        plt.setp(ax.get_xticklabels(), rotation=90)
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    return ax


def plot_head_grid(weights, *, tokens=None, ncols=4, title=None, head_labels=None):
    """Draw every head's ``[L_q, L_k]`` map of ``weights [n_heads, L_q, L_k]`` in one grid."""
    import matplotlib.pyplot as plt

    w = np.asarray(weights)
    if w.ndim != 3:
        raise ValueError(f"weights must be [n_heads, L_q, L_k], got shape {w.shape}")
    n = w.shape[0]
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.6 * ncols, 2.6 * nrows + 0.4), squeeze=False)
    vmax = float(w.max())
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.axis("off")
            continue
        label = head_labels[i] if head_labels is not None else f"head {i}"
        plot_attention(w[i], ax=ax, queries=tokens, keys=tokens, title=label, colorbar=False, vmax=vmax)
        if i % ncols:
            ax.set_ylabel("")
        if i < n - ncols:
            ax.set_xlabel("")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float) -> str:
    """``1536 -> '1.50 KiB'``: bytes in binary units (1 KiB = 1024 B)."""
    n = float(n)
    for unit in BINARY_UNITS:
        if abs(n) < 1024 or unit == BINARY_UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def bytes_axis(ax, axis: str = "y") -> None:
    """Label a log-scaled axis in binary units (ticks at powers of 1024)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=1024))
    target.set_major_formatter(FuncFormatter(lambda val, _: format_bytes(val).replace(".00", "")))
