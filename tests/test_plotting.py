"""The book's figures are drawn for the column and record their smallest text.

The browser test computes what a reader sees from the record these functions
write (``TEXT_KEY`` in the PNG); these tests pin that the record is the
smallest text actually drawn, that hidden text is not counted, that a
notebook's PNG is twice the CSS size it asks to be shown at, and that the
library's own figures fit the column.
"""

import base64
import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from attn_np.instruments import plotting  # noqa: E402


@pytest.fixture(autouse=True)
def _style():
    with plt.rc_context():
        plt.rcParams.update(plotting.STYLE)
        yield
        plt.close("all")


def test_smallest_text_is_the_smallest_drawn_string():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="a line")
    ax.text(0.5, 0.5, "small", fontsize=6.5)
    ax.legend(fontsize=7)
    assert plotting.smallest_text(fig) == (6.5, "small")


def test_hidden_and_empty_text_is_not_counted():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    ax.text(0.5, 0.5, "hidden", fontsize=3).set_visible(False)
    ax.text(0.2, 0.2, "   ", fontsize=2)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title("title", fontsize=12)
    assert plotting.smallest_text(fig) == (12.0, "title")


def test_axes_switched_off_draw_no_tick_labels():
    fig, (a, b) = plt.subplots(1, 2)
    a.tick_params(labelsize=4)
    a.axis("off")
    b.plot([0, 1])
    pt, _ = plotting.smallest_text(fig)
    assert pt == plt.rcParams["font.size"]


def test_figure_png_is_twice_its_css_size_and_records_its_text():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1])
    ax.set_title("what to see", fontsize=9)
    ax.tick_params(labelsize=8)
    data, size = plotting.figure_png(fig)
    png = Image.open(io.BytesIO(base64.b64decode(data)))
    assert abs(png.size[0] - 2 * size["width"]) <= 1
    assert abs(png.size[1] - 2 * size["height"]) <= 1
    assert png.text[plotting.TEXT_KEY] == "8"
    assert png.text[plotting.DPI_KEY] == str(plotting.PNG_DPI)
    assert (
        "Software" not in png.text
    )  # the same bytes on a matplotlib upgrade
    # what a reader sees: 8 pt at 200 dpi shown at half its pixels
    px = 8 * plotting.PNG_DPI / 72 * 0.5
    assert px >= plotting.MIN_TEXT_PX


def test_figure_png_is_deterministic():
    def draw():
        fig, ax = plt.subplots()
        ax.plot(np.arange(5) ** 2, label="squares")
        ax.legend()
        out = plotting.figure_png(fig)
        plt.close(fig)
        return out

    assert draw() == draw()


def test_save_figure_records_its_text(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    ax.set_xlabel("x", fontsize=7)
    path = tmp_path / "f.png"
    plotting.save_figure(fig, path)
    with Image.open(path) as png:
        assert png.text[plotting.TEXT_KEY] == "7"


@pytest.mark.parametrize("n_heads", [2, 4, 8, 16])
def test_head_grid_fits_the_column(n_heads):
    w = np.full((n_heads, 6, 6), 1 / 6)
    fig = plotting.plot_head_grid(w, tokens=list("abcdef"))
    assert fig.get_size_inches()[0] <= plotting.COLUMN_INCHES + 1e-9


@pytest.mark.parametrize("length", [4, 16, 40])
def test_attention_map_fits_the_column(length):
    ax = plotting.plot_attention(np.full((length, length), 1 / length))
    assert ax.figure.get_size_inches()[0] <= plotting.COLUMN_INCHES + 1e-9
