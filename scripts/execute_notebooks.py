"""Execute notebooks in place, top to bottom, each in a fresh kernel (``make notebooks``).

Each notebook's name is printed as it starts and its time when it finishes, so that a reader
waiting for ``make notebooks`` knows what is running.

Cells tagged ``hide-input`` or ``hide-cell`` (folded in the HTML book) get JupyterLab's own
folding metadata, so a solution stays folded in JupyterLab too.

Outputs are stored without per-cell timing metadata so that re-running an unchanged notebook
changes nothing but machine-dependent outputs (timings, in cells tagged ``nbval-ignore-output``)
and the whole notebook's execution time in seconds (``metadata.attn_np.execution_seconds``), which
``notebooks/conftest.py`` reads to run the longest notebooks first under nbval.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def fold_like_the_book(cell) -> None:
    """Fold in JupyterLab what the HTML book folds: JupyterLab ignores the ``hide-input`` and
    ``hide-cell`` tags, but collapses a cell whose ``jupyter.source_hidden`` (and, for
    ``hide-cell``, ``jupyter.outputs_hidden``) is set. A solution's code then stays folded
    beside its exercise in JupyterLab too."""
    tags = set(cell.metadata.get("tags", []))
    if cell.cell_type != "code" or not tags & {"hide-input", "hide-cell"}:
        return
    jupyter = cell.metadata.setdefault("jupyter", {})
    jupyter["source_hidden"] = True
    if "hide-cell" in tags:
        jupyter["outputs_hidden"] = True


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
    for i, cell in enumerate(nb.cells):  # an error a display hook caught
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                raise CellExecutionError(
                    f"cell {i} stored an error: {out.get('ename')}: "
                    f"{str(out.get('evalue'))[:200]}",
                    out.get("ename", ""),
                    str(out.get("evalue", "")),
                )
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        fold_like_the_book(cell)
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    nb.metadata.pop("widgets", None)
    # how long it took, for notebooks/conftest.py: nbval starts the longest
    # notebooks first, so that its two workers finish together
    nb.metadata["attn_np"] = {"execution_seconds": round(elapsed)}
    nbformat.write(nb, path)
    return elapsed


def parse_args(argv: list[str]) -> list[Path]:
    """The notebooks to execute, each checked before any runs: a bad path
    is a usage error (exit code 2), not a traceback half-way through."""
    ap = argparse.ArgumentParser(
        prog="execute_notebooks.py",
        description="Execute notebooks in place, top to bottom, each in a "
        "fresh kernel (make notebooks).",
    )
    ap.add_argument(
        "notebooks", nargs="+", metavar="NOTEBOOK.ipynb", type=Path
    )
    args = ap.parse_args(argv)
    for path in args.notebooks:
        if path.suffix != ".ipynb":
            ap.error(f"{path}: not a notebook (expected a .ipynb file)")
        if not path.is_file():
            ap.error(f"{path}: no such notebook")
        try:
            nbformat.read(path, as_version=4)
        except (OSError, ValueError) as err:  # NotJSONError is a ValueError
            first = (
                str(err).splitlines()[0] if str(err) else type(err).__name__
            )
            ap.error(f"{path}: cannot be read as a notebook: {first[:200]}")
    return args.notebooks


def main(argv: list[str]) -> int:
    paths = parse_args(argv)
    for i, p in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {p}: executing...", flush=True)
        try:
            elapsed = execute(p)
        except CellExecutionError as err:
            # the failing cell and its traceback, as the kernel printed them;
            # the notebook on disk is left as it was
            print(
                f"[{i}/{len(paths)}] {p}: a cell failed:\n{err}",
                file=sys.stderr,
            )
            return 1
        print(
            f"[{i}/{len(paths)}] {p}: executed in {elapsed:.1f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
