"""nbval settings for the book's notebooks.

By default nbval does not compare images. The book promises that every figure
it shows is one the current code produces, so PNG outputs are compared too:
matplotlib's Agg renderer is deterministic for a pinned matplotlib, and every
figure is drawn from seeded data. Cells whose output depends on the machine
(timings) carry the ``nbval-ignore-output`` tag and are not compared at all.

The notebooks run longest first. ``make nbval`` gives them to two
pytest-xdist workers one notebook at a time (``--dist loadscope
--no-loadscope-reorder``), in the order collected here: the slowest
chapters start at once, and the short ones fill in at the end, so that
neither worker waits long for the other (longest-processing-time-first). A
notebook's time is the one ``scripts/execute_notebooks.py`` recorded in its
metadata when it was last executed; for one with no record, a second per code
cell stands in (pytest-xdist's own order is by the number of cells).
"""

import json
from pathlib import Path

IMAGE_KEYS = {"image/png", "image/jpeg"}
SANITIZE = Path(__file__).with_name("nbval_sanitize.cfg")


def pytest_configure(config):
    """Rounding-level numbers (below 1e-7, in scientific notation) are
    compared as such, not digit by digit (nbval_sanitize.cfg says why), in
    every nbval run of these notebooks unless another file is given."""
    option = config.option
    if getattr(option, "nbval_sanitize_with", "absent") is None:
        option.nbval_sanitize_with = str(SANITIZE)


def recorded_seconds(path) -> float:
    """The execution time stored in a notebook's metadata; without one, its
    number of code cells (a second a cell)."""
    nb = json.loads(Path(path).read_text())
    try:
        return float(nb["metadata"]["attn_np"]["execution_seconds"])
    except (KeyError, TypeError, ValueError):
        return float(sum(c["cell_type"] == "code" for c in nb["cells"]))


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        parent = getattr(item, "parent", None)
        skip = getattr(parent, "skip_compare", None)
        if skip is not None and IMAGE_KEYS & set(skip):
            parent.skip_compare = tuple(
                k for k in skip if k not in IMAGE_KEYS
            )
    seconds = {}
    for item in items:
        if str(item.path).endswith(".ipynb"):
            seconds.setdefault(item.path, recorded_seconds(item.path))
    # a stable sort: the cells of one notebook keep their order
    items.sort(key=lambda item: -seconds.get(item.path, 0.0))
