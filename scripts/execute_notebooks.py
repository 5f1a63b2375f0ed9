"""Execute notebooks in place, top to bottom, each in a fresh kernel (``make notebooks``).

Outputs are stored without per-cell timing metadata so that re-running an unchanged notebook
changes nothing but machine-dependent outputs (timings, in cells tagged ``nbval-ignore-output``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(
        nb,
        timeout=1200,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    elapsed = time.perf_counter() - start
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return elapsed


def main(paths: list[str]) -> int:
    if not paths:
        print(
            "usage: execute_notebooks.py NOTEBOOK.ipynb ...", file=sys.stderr
        )
        return 2
    for p in paths:
        elapsed = execute(Path(p))
        print(f"{p}: executed in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
