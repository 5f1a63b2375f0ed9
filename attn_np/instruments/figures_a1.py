"""The figure of appendix A1 (the KV cache calculator), drawn for the
book's column: the cache of one sequence against context for a list of
catalogue models. The appendix calls it and ends its cell with
``plt.show()``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..costs import get_model, kv_cache_bytes
from .plotting import FAMILY_COLOURS, format_bytes

# windowed models are drawn dashed and dotted
WINDOW_STYLES = {
    "gemma-3-27b": "--",
    "gpt-oss-120b": "-.",
    "mistral-7b-v0.1": ":",
}
# Four of the models are GQA: each also gets its own shade of the family's
# green and its own marker, so no two lines differ by their dashes alone.
GQA_LOOKS = {
    "llama-3-8b": ("#009E73", "o"),
    "gemma-3-27b": ("#00573F", "s"),
    "gpt-oss-120b": ("#33B890", "^"),
    "mistral-7b-v0.1": ("#7FD6BB", "D"),
}


def plot_cache_against_context(
    names, contexts, *, styles=WINDOW_STYLES, looks=GQA_LOOKS
):
    """``kv_cache_bytes`` of one sequence (bf16) for each catalogue model
    in ``names`` at each context in ``contexts``, on log-log axes with
    binary-unit ticks; returns the figure. A model in ``looks`` is drawn
    in its ``(colour, marker)``, the marker at every eighth context; the
    legend sits below the axes, where it hides no line."""
    colours = {**FAMILY_COLOURS, "MLA": "#CC79A7"}
    fig, ax = plt.subplots(figsize=(7.2, 4.8))
    for name in names:
        cfg = get_model(name)
        size = [kv_cache_bytes(cfg, int(n)) for n in contexts]
        colour, marker = looks.get(name, (colours[cfg.family], None))
        ax.plot(
            contexts,
            size,
            styles.get(name, "-"),
            color=colour,
            lw=2.2,
            marker=marker,
            ms=5,
            markevery=8,
            label=f"{name} ({cfg.kind})",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    yt = [2.0**k for k in range(22, 38, 2)]  # 4 MiB ... 64 GiB
    ax.set_yticks(yt, [format_bytes(t).replace(".00", "") for t in yt])
    ticks = np.asarray(contexts)[::8]
    ax.set_xticks(ticks, [f"{n // 1024}k" for n in ticks])
    ax.set_xlabel("context length (tokens, one sequence)")
    ax.set_ylabel("KV cache, bf16 (binary units)")
    ax.set_title("KV cache against context: windows bend the line down")
    ax.legend(
        fontsize=7.5,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=2,
        handlelength=3.5,
    )
    return fig
