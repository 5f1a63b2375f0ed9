"""Where a kernel gets its worker threads: from its caller (chapter 4).

The grouped core (:mod:`attn_np.grouped`) and the tiled kernels
(:mod:`attn_np.flash`) can deal a product out to worker threads. They
make no threads and touch no BLAS setting: they ask this module.

* :func:`run_tasks` runs a list of functions of nothing and returns their
  results in order: in one piece, one after the other, unless a caller
  lent threads with :func:`lend_threads` (the measuring lab's pool,
  :mod:`attn_np.instruments.workers`, does so when ``attn_np`` is
  imported);
* :func:`worker_count` is how many workers the lender has (1 without one);
* :func:`decode_workers` switches the grouped core's decode steps to the
  workers (off by default, as the lab's docstring says why);
  :func:`sharing` reads the switch.
"""

from __future__ import annotations

from contextlib import contextmanager

from ._checks import check_flag

_LENT = {"run": None, "count": None}  # lend_threads() fills them
_SHARED = {"on": False}  # decode_workers() switches it


def lend_threads(run, count) -> None:
    """Lend the kernels worker threads: ``run(tasks) -> results`` runs
    functions of nothing at the same time, ``count() -> int`` says how
    many workers it has. ``lend_threads(None, None)`` takes them back
    (every kernel then works in one piece)."""
    if (run is None) != (count is None) or not (
        run is None or (callable(run) and callable(count))
    ):
        raise TypeError(
            "run and count must both be callables (or both None), got "
            f"{run!r} and {count!r}"
        )
    _LENT["run"], _LENT["count"] = run, count


@contextmanager
def decode_workers(enabled: bool = True):
    """``with decode_workers(): ...`` deals the attention of every decode
    step in the block out to the lent worker threads, with one BLAS
    thread each (its heads, or one key/value head's positions) instead of
    making each product in one piece with BLAS's own threads (the
    default); ``decode_workers(False)`` switches it off again. The same
    numbers to rounding. Which is faster depends on the machine and how
    busy it is: ``python -m attn_np.bench decode --levers`` measures it.
    """
    before = _SHARED["on"]
    _SHARED["on"] = check_flag(enabled, "enabled")
    try:
        yield
    finally:
        _SHARED["on"] = before


def sharing() -> bool:
    """Whether decode steps are shared out (:func:`decode_workers`)."""
    return _SHARED["on"]


def worker_count() -> int:
    """How many workers a step can be shared out to: the lender's count
    (1 when no threads were lent)."""
    count = _LENT["count"]
    return 1 if count is None else max(1, int(count() or 1))


def run_tasks(tasks) -> list:
    """``[task() for task in tasks]``, at the same time on the lent
    threads where there are any; raises what a task raised."""
    tasks = list(tasks)
    run = _LENT["run"]
    if run is None or len(tasks) < 2:
        return [task() for task in tasks]
    return run(tasks)


def split(n: int, parts: int) -> list[slice]:
    """``n`` items as ``parts`` contiguous slices, as even as can be."""
    edges = [round(i * n / parts) for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
