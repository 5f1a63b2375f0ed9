"""attn_np.instruments.plotting.plot_head_grouping: the picture must say what the layer computes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attn_np.instruments.plotting import FAMILY_COLOURS, plot_head_grouping  # noqa: E402


def drawn_pairs(ax, n_heads, n_kv_heads):
    """(query head, key/value head) for every line: query boxes sit at x = i, key/value boxes under their group."""
    group = n_heads // n_kv_heads
    kv_x = np.arange(n_heads).reshape(n_kv_heads, group).mean(axis=1)
    pairs = []
    for line in ax.lines:
        (x_q, x_kv), _ = line.get_data()
        pairs.append((int(round(x_q)), int(np.argmin(np.abs(kv_x - x_kv)))))
    return sorted(pairs)


@pytest.mark.parametrize(
    "n_heads, n_kv_heads", [(8, 8), (8, 2), (8, 1), (6, 3), (1, 1)]
)
def test_lines_join_each_query_head_to_the_kv_head_it_reads(
    n_heads, n_kv_heads
):
    """The library's head layout: query head i reads key/value head i // (n_heads // n_kv_heads)."""
    fig, ax = plt.subplots()
    plot_head_grouping(n_heads, n_kv_heads, ax=ax)
    group = n_heads // n_kv_heads
    kv_labels = [
        t.get_text() for t in ax.texts if t.get_text().startswith("KV")
    ]
    assert kv_labels == [f"KV{j}" for j in range(n_kv_heads)]
    assert drawn_pairs(ax, n_heads, n_kv_heads) == [
        (i, i // group) for i in range(n_heads)
    ]
    plt.close(fig)


@pytest.mark.parametrize(
    "n_kv_heads, family", [(8, "MHA"), (4, "GQA"), (1, "MQA")]
)
def test_title_and_colour_name_the_family(n_kv_heads, family):
    fig, ax = plt.subplots()
    plot_head_grouping(8, n_kv_heads, ax=ax)
    assert ax.get_title().startswith(family)
    assert matplotlib.colors.same_color(
        ax.lines[0].get_color(), FAMILY_COLOURS[family]
    )
    plt.close(fig)


@pytest.mark.parametrize(
    "n_heads, n_kv_heads", [(8, 3), (8, 0), (0, 1), (4, 8)]
)
def test_kv_heads_that_do_not_divide_the_query_heads_raise(
    n_heads, n_kv_heads
):
    with pytest.raises(ValueError, match="n_kv_heads must divide n_heads"):
        plot_head_grouping(n_heads, n_kv_heads)


def test_non_integer_head_counts_raise_type_error():
    with pytest.raises(TypeError, match="integers"):
        plot_head_grouping(8.0, 2)
