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


def plot_cache_against_context(names, contexts, *, styles=WINDOW_STYLES):
    """``kv_cache_bytes`` of one sequence (bf16) for each catalogue model
    in ``names`` at each context in ``contexts``, on log-log axes with
    binary-unit ticks; returns the figure."""
    colours = {**FAMILY_COLOURS, "MLA": "#CC79A7"}
    fig, ax = plt.subplots(figsize=(7.2, 4.8))
    for name in names:
        cfg = get_model(name)
        size = [kv_cache_bytes(cfg, int(n)) for n in contexts]
        ax.plot(
            contexts,
            size,
            styles.get(name, "-"),
            color=colours[cfg.family],
            lw=2.2,
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
    ax.legend(fontsize=7.5, loc="upper left")
    return fig
