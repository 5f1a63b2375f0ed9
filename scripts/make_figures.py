"""Draw the book's generated figures and favicon from the current attn_np code.

The pictures on the prose pages (book/*.md) are not committed: they are drawn again at every book
build, so the book can never show a figure that the code no longer draws. They land in
``book/_generated/`` (git-ignored by a ``.gitignore`` written there).

Two ways in:

- ``python scripts/make_figures.py`` draws them once (``make figures``);
- the book's Sphinx extension ``scripts/book_sphinx.py`` calls ``make_all`` when a build starts,
  so a plain ``jupyter-book build .`` is never stale either.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "_generated"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display: the build runs headless
    import matplotlib.pyplot as plt

    return plt


def head_grouping(path: Path, n_heads: int = 8, kv_heads=(8, 2, 1)) -> None:
    """The introduction's figure: which query head reads which key/value head in MHA, GQA and MQA."""
    plt = _pyplot()
    from attn_np.instruments.plotting import (
        plot_head_grouping,
        save_figure,
        use_book_style,
    )

    use_book_style()
    fig, axes = plt.subplots(
        len(kv_heads), 1, figsize=(6.4, 1.8 * len(kv_heads))
    )
    for ax, n_kv in zip(axes, kv_heads):
        plot_head_grouping(n_heads, n_kv, ax=ax)
    fig.tight_layout()
    save_figure(
        fig, path
    )  # 2x the CSS resolution, its smallest text recorded
    plt.close(fig)


def favicon(path: Path) -> None:
    """A 64x64 icon: a causal attention pattern in the three family colours (MHA, GQA, MQA)."""
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    from attn_np.instruments.plotting import FAMILY_COLOURS

    colours = list(FAMILY_COLOURS.values())
    fig = plt.figure(figsize=(1, 1), dpi=64)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    ax.set_xlim(0, 4)
    ax.set_ylim(0, 4)
    for q in range(4):  # a 4 x 4 causal mask: query q sees keys 0..q
        for k in range(q + 1):
            ax.add_patch(
                Rectangle(
                    (k + 0.08, 3 - q + 0.08),
                    0.84,
                    0.84,
                    color=colours[(q - k) % 3],
                )
            )
    fig.savefig(path, transparent=True, metadata={"Software": None})
    plt.close(fig)


FIGURES = {
    "head_grouping.png": head_grouping,
    "favicon.png": favicon,
}


def make_all(out: Path = OUT) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / ".gitignore").write_text(
        "# drawn at every book build by scripts/make_figures.py\n*\n"
    )
    paths = []
    for name, draw in FIGURES.items():
        draw(out / name)
        paths.append(out / name)
    return paths


def main(argv=None) -> int:
    argparse.ArgumentParser(
        prog="make_figures.py",
        description="Draw the prose pages' figures and the favicon into "
        "book/_generated/ (make figures). It takes no arguments.",
    ).parse_args(argv)
    for path in make_all():
        print(f"drew {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
