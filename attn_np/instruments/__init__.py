"""The book's instruments: how the chapters check, draw, measure and show the
library.

* :mod:`~attn_np.instruments.gradcheck`: central finite differences, the
  book's gradient standard;
* :mod:`~attn_np.instruments.plotting`: the one plotting style (attention
  maps, head grids, bytes);
* :mod:`~attn_np.instruments.measure`: memory traced by tracemalloc,
  best-of-n times, and this machine's matmul and streaming-read rates;
* :mod:`~attn_np.instruments.blas`: how many threads NumPy's BLAS may use;
* :mod:`~attn_np.instruments.display`: ``show_source``, the library's own
  code in a notebook;
* :mod:`~attn_np.instruments.paired`: ``compare``, paired timings in
  alternating rounds beside the run's A/A noise floor, with verdicts;
* :mod:`~attn_np.instruments.mha_timing` (chapter 2) and
  :mod:`~attn_np.instruments.flash_parts` (chapter 9): the chapters'
  timings, built on ``compare``;
* :mod:`~attn_np.instruments.figures_a1`, ``figures_13``: figures drawn
  for the book's column.
"""

from .blas import blas_threads, get_blas_threads, set_blas_threads
from .display import show_source
from .gradcheck import (
    TOLERANCE,
    check_gradients,
    check_layer_gradients,
    numerical_gradient,
    rel_error,
)
from .measure import (
    MemoryMeasurement,
    best_time,
    best_times,
    matmul_gflops,
    measure_memory,
    measure_peak_bytes,
    paired_difference,
    read_probes,
    round_times,
)
from .plotting import (
    FAMILY_COLOURS,
    bytes_axis,
    format_bytes,
    plot_attention,
    plot_head_grid,
    plot_head_grouping,
    use_book_style,
)

__all__ = [
    "FAMILY_COLOURS",
    "TOLERANCE",
    "MemoryMeasurement",
    "best_time",
    "best_times",
    "paired_difference",
    "round_times",
    "blas_threads",
    "bytes_axis",
    "check_gradients",
    "check_layer_gradients",
    "format_bytes",
    "get_blas_threads",
    "matmul_gflops",
    "measure_memory",
    "measure_peak_bytes",
    "numerical_gradient",
    "plot_attention",
    "plot_head_grid",
    "plot_head_grouping",
    "read_probes",
    "rel_error",
    "set_blas_threads",
    "show_source",
    "use_book_style",
]
