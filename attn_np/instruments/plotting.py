"""The book's one plotting style: attention maps, head grids and byte axes.

matplotlib only; every chapter imports these so that all figures look alike
and print well.

Figures are drawn for the width the book shows them at. The book's column
is about 670 CSS px wide at a 1280 px window, so a figure of
``COLUMN_INCHES`` (6.7 in at ``CSS_DPI`` = 100 CSS px per inch) is shown at
its own size, and one wider than that is shrunk to fit. A notebook figure
is saved at ``PNG_DPI`` = 200, twice the CSS resolution (sharp on HiDPI
screens), and displayed at half its pixel size. Each PNG records the
smallest text that was drawn in it (``TEXT_KEY``, in points), so the
browser test can compute what a reader sees: points x dpi / 72 x the scale
the page shows the image at, never below ``MIN_TEXT_PX``.
"""

from __future__ import annotations

import numpy as np

from ..costs.units import BINARY_UNITS, format_bytes  # noqa: F401

# : CSS px per inch of a figure as the book shows it (matplotlib's
# default figure.dpi, so ``figsize`` in inches x 100 is the CSS width).
CSS_DPI = 100
# : Pixels per inch of the PNG a notebook writes: twice the CSS resolution.
PNG_DPI = 2 * CSS_DPI
# : The book's column at a 1280 px window, in inches at ``CSS_DPI``.
COLUMN_INCHES = 6.7
# : The legibility floor: no figure text smaller than this many CSS px.
MIN_TEXT_PX = 9.0
# : PNG text chunks written by ``figure_png``: the smallest text drawn (in
# points), that text itself, and the PNG's dpi.
TEXT_KEY = "attn_np:smallest-text-pt"
WHAT_KEY = "attn_np:smallest-text"
DPI_KEY = "attn_np:dpi"

STYLE = {
    "figure.dpi": CSS_DPI,
    "savefig.dpi": PNG_DPI,
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

# : Colours for the attention families, used in every chapter (colour-
# blind safe); MLA (chapter 7) is the family of the latent caches.
FAMILY_COLOURS = {
    "MHA": "#0072B2",
    "GQA": "#009E73",
    "MQA": "#D55E00",
    "MLA": "#CC79A7",
}


def use_book_style() -> None:
    """Apply the book's matplotlib style (call once at the top of a
    notebook).

    In IPython it also makes every figure a notebook shows come out through
    ``figure_png``: twice the resolution, shown at its size in CSS px, with
    its smallest text recorded in the PNG.
    """
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)
    _show_figures_with_figure_png()


def smallest_text(fig) -> tuple[float, str]:
    """``(size in points, text)`` of the smallest text ``fig`` draws.

    The figure is drawn once into a renderer that records every string it
    is asked to draw (tick labels, legends, annotations, titles): text that
    is hidden or off the axes is never drawn, so it is not counted.
    ``(inf, "")`` when the figure draws no text.
    """
    from matplotlib.backends.backend_agg import RendererAgg

    class _Recorder(RendererAgg):
        def __init__(self, width, height, dpi):
            super().__init__(width, height, dpi)
            self.texts = []

        def draw_text(
            self, gc, x, y, s, prop, angle, ismath=False, mtext=None
        ):
            if str(s).strip():
                self.texts.append((float(prop.get_size_in_points()), str(s)))

        def draw_tex(self, gc, x, y, s, prop, angle, *, mtext=None):
            self.draw_text(gc, x, y, s, prop, angle, mtext=mtext)

    w, h = fig.get_size_inches() * fig.dpi
    renderer = _Recorder(int(w), int(h), fig.dpi)
    fig.draw(renderer)
    if not renderer.texts:
        return float("inf"), ""
    return min(renderer.texts, key=lambda t: t[0])


def text_metadata(fig, dpi: float = PNG_DPI) -> dict:
    """The PNG text chunks that record ``fig``'s smallest text and dpi."""
    pt, what = smallest_text(fig)
    return {
        "Software": None,  # no matplotlib version: the same bytes on upgrade
        TEXT_KEY: f"{pt:g}",
        WHAT_KEY: " ".join(what.split())[:60],
        DPI_KEY: f"{dpi:g}",
    }


def figure_png(fig):
    """A notebook's PNG of ``fig``: ``(base64 PNG, {"width", "height"})``.

    Drawn at ``PNG_DPI`` (twice the CSS resolution) with a tight bounding
    box; the width and height are the CSS size, half the pixels, which the
    book and JupyterLab use to show the image. The PNG carries
    ``text_metadata(fig)``. ``None`` for an empty figure (as IPython's own
    formatter).
    """
    from binascii import b2a_base64

    from IPython.core.pylabtools import _pngxy, print_figure

    if not fig.axes and not fig.lines:
        return None
    data = print_figure(
        fig, fmt="png", dpi=PNG_DPI, metadata=text_metadata(fig)
    )
    w, h = _pngxy(data)
    size = {
        "width": w * CSS_DPI // PNG_DPI,
        "height": h * CSS_DPI // PNG_DPI,
    }
    return b2a_base64(data, newline=False).decode("ascii"), size


def save_figure(fig, path, *, dpi: float = PNG_DPI) -> None:
    """Save ``fig`` as the book's prose pages do: a PNG at ``dpi`` that
    records its smallest text (``text_metadata``)."""
    fig.savefig(path, dpi=dpi, metadata=text_metadata(fig, dpi))


def _show_figures_with_figure_png() -> None:
    """Register ``figure_png`` as IPython's PNG formatter for figures.

    IPython's inline backend re-registers its own formatter only when
    ``InlineBackend.figure_formats`` changes; the notebooks' ``%config
    InlineBackend.figure_formats = ['png']`` sets the default again, which
    changes nothing, so this formatter stays.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "display_formatter"):
        return
    from matplotlib.figure import Figure

    formatter = shell.display_formatter.formatters["image/png"]
    formatter.for_type(Figure, figure_png)


def plot_attention(
    weights,
    ax=None,
    *,
    queries=None,
    keys=None,
    title=None,
    colorbar=True,
    vmax=None,
):
    """Draw one ``[L_q, L_k]`` attention map with labelled tokens.

    Rows are queries, columns keys; a brighter cell means more weight. Masked
    entries (exactly 0) are drawn in light grey so that a causal triangle is
    visible at a glance.
    """
    import matplotlib.pyplot as plt

    w = np.asarray(weights)
    if w.ndim != 2:
        raise ValueError(
            f"weights must be a [L_q, L_k] array, got shape {w.shape}"
        )
    if ax is None:
        # 0.45 in a cell, fewer when that would be wider than the column.
        cell = min(0.45, (COLUMN_INCHES - 2.0) / w.shape[1])
        _, ax = plt.subplots(
            figsize=(cell * w.shape[1] + 2.0, cell * w.shape[0] + 1.2)
        )
    cmap = plt.get_cmap("viridis").with_extremes(bad="#e8e8e8")
    shown = np.ma.masked_where(w == 0, w)
    im = ax.imshow(
        shown,
        cmap=cmap,
        vmin=0.0,
        vmax=vmax if vmax is not None else max(float(w.max()), 1e-12),
    )
    ax.grid(False)
    ax.set_xlabel("key position" if keys is None else "key")
    ax.set_ylabel("query position" if queries is None else "query")
    for axis, labels, n in (
        (ax.xaxis, keys, w.shape[1]),
        (ax.yaxis, queries, w.shape[0]),
    ):
        if labels is not None:
            if len(labels) != n:
                raise ValueError(
                    f"got {len(labels)} token labels for an axis of length "
                    f"{n}"
                )
            axis.set_ticks(range(n))
            axis.set_ticklabels(labels)
        else:  # whole positions only, never 2.5
            from matplotlib.ticker import MaxNLocator

            axis.set_major_locator(MaxNLocator(integer=True))
    if keys is not None:
        plt.setp(ax.get_xticklabels(), rotation=90)
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(
            im, ax=ax, fraction=0.046, pad=0.04, label="attention weight"
        )
    return ax


def plot_head_grid(
    weights,
    *,
    tokens=None,
    ncols=4,
    title=None,
    head_labels=None,
    colorbar=True,
    colorbar_label="attention weight",
):
    """Draw every head's ``[L_q, L_k]`` map of ``weights [n_heads, L_q,
    L_k]`` in one grid, on one colour scale (one colour bar beside the
    grid). Token labels sit on the outer panels only: the first column's
    queries and the bottom row's keys, so no label runs into a
    neighbouring map."""
    import matplotlib.pyplot as plt

    w = np.asarray(weights)
    if w.ndim != 3:
        raise ValueError(
            f"weights must be [n_heads, L_q, L_k], got shape {w.shape}"
        )
    n = w.shape[0]
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    panel = min(2.6, COLUMN_INCHES / ncols)  # the grid fits the column
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(panel * ncols, panel * nrows + 0.4),
        squeeze=False,
        layout="constrained",  # room for the titles and the colour bar
    )
    vmax = float(w.max())
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.axis("off")
            continue
        label = head_labels[i] if head_labels is not None else f"head {i}"
        plot_attention(
            w[i],
            ax=ax,
            queries=tokens,
            keys=tokens,
            title=label,
            colorbar=False,
            vmax=vmax,
        )
        if i % ncols:
            ax.set_ylabel("")
            ax.tick_params(labelleft=False)
        if i < n - ncols:
            ax.set_xlabel("")
            ax.tick_params(labelbottom=False)
    if title:
        fig.suptitle(title)
    if colorbar and n:
        fig.colorbar(
            axes.flat[0].images[0],
            ax=axes,
            shrink=0.8,
            label=colorbar_label,
        )
    return fig


def bytes_axis(ax, axis: str = "y") -> None:
    """Label a log-scaled axis in binary units (ticks at powers of 1024)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=1024))
    target.set_major_formatter(
        FuncFormatter(lambda val, _: format_bytes(val).replace(".00", ""))
    )


def plot_head_grouping(
    n_heads: int, n_kv_heads: int, ax=None, *, title=None, colour=None
):
    """Draw which query head reads which key/value head: MHA, GQA and MQA in
    one picture.

    Query heads sit on the top row, key/value heads on the bottom row, and a
    line joins query head ``i`` to the key/value head it reads, ``i //
    (n_heads // n_kv_heads)`` (the library's head layout). ``n_kv_heads ==
    n_heads`` is MHA, ``n_kv_heads == 1`` is MQA, anything between is GQA.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    if not (
        isinstance(n_heads, (int, np.integer))
        and isinstance(n_kv_heads, (int, np.integer))
    ):
        raise TypeError(
            f"n_heads and n_kv_heads must be integers, got {n_heads!r} and "
            f"{n_kv_heads!r}"
        )
    if n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(
            "n_kv_heads must divide n_heads (both >= 1), got "
            f"n_heads={n_heads}, n_kv_heads={n_kv_heads}"
        )
    group = n_heads // n_kv_heads  # query heads per key/value head
    family = (
        "MHA"
        if n_kv_heads == n_heads
        else "MQA"
        if n_kv_heads == 1
        else "GQA"
    )
    colour = colour or FAMILY_COLOURS[family]
    if ax is None:
        _, ax = plt.subplots(figsize=(0.6 * n_heads + 1.0, 2.4))

    q_x = np.arange(n_heads, dtype=float)  # query head i at x = i
    # under its group
    kv_x = np.array(
        [q_x[j * group : (j + 1) * group].mean() for j in range(n_kv_heads)]
    )
    q_y, kv_y, w, h = 1.0, 0.0, 0.72, 0.34
    for i in range(n_heads):
        j = i // group  # the key/value head that query head i reads
        ax.plot(
            [q_x[i], kv_x[j]],
            [q_y - h / 2, kv_y + h / 2],
            color=colour,
            lw=1.4,
            alpha=0.8,
            zorder=1,
        )
    for xs, y, face, text, label in (
        (q_x, q_y, "white", colour, "Q"),
        (kv_x, kv_y, colour, "white", "KV"),
    ):
        for k, x in enumerate(xs):
            ax.add_patch(
                FancyBboxPatch(
                    (x - w / 2, y - h / 2),
                    w,
                    h,
                    boxstyle="round,pad=0.02,rounding_size=0.08",
                    facecolor=face,
                    edgecolor=colour,
                    lw=1.4,
                    zorder=2,
                )
            )
            ax.text(
                x,
                y,
                f"{label}{k}",
                ha="center",
                va="center",
                fontsize=8,
                color=text,
                zorder=3,
            )
    ax.set_xlim(-0.7, n_heads - 0.3)
    ax.set_ylim(-0.45, 1.45)
    ax.set_yticks([kv_y, q_y], ["key/value\nheads", "query\nheads"])
    ax.set_xticks([])
    ax.grid(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    if title is None:
        title = (
            f"{family}: {n_heads} query heads, {n_kv_heads} key/value "
            f"head{'s' if n_kv_heads > 1 else ''}"
        )
    if title:
        ax.set_title(title, color=colour)
    return ax
