"""Worker threads, lent to the kernels (chapter 4; the measuring lab).

A decode step is a few dozen short BLAS calls: matrix-vector products with
the weights and, per head, over the cache. With two BLAS threads each call
splits its work and waits for both halves at its end; on a busy machine
the second thread waits for a core at every call. Within
:func:`decode_workers`, a step's attention is dealt out once to as many
workers as BLAS may use threads, and BLAS runs one thread in each: NumPy
lets go of Python's lock in BLAS and in its ufuncs, so the workers run at
the same time, each on its own part of the cache (half the key/value
heads, or half of one head's positions). :func:`row_products` deals a
product with a weight matrix out by its rows (the decode benchmark reads
memory that way too). Off by default: on a quiet two-core machine a step
dealt out took about 1.6 times as long as one on BLAS's own threads, on a
busy one a fraction (``python -m attn_np.bench decode --levers``).

The pool of workers is made once and kept, since starting threads for
every step would cost more than some steps take. A call made from inside
a worker runs its tasks in that worker, one after the other.

The kernels do not import this module: :func:`lend` hands its
:func:`run_tasks` and :func:`worker_count` to :mod:`attn_np._workers`,
where the kernels ask for threads (``import attn_np`` lends them).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .._workers import decode_workers, lend_threads, sharing, split
from .blas import blas_threads, get_blas_threads

__all__ = [
    "decode_workers",
    "lend",
    "row_products",
    "run_tasks",
    "sharing",
    "split",
    "worker_count",
]

_POOL = None  # the workers, made at the first call that shares out
_POOL_SIZE = 0
_LOCK = threading.Lock()
_INSIDE = threading.local()  # set in a thread running a shared task


def worker_count() -> int:
    """How many workers a step is shared out to: as many as BLAS may use
    threads (1 where NumPy's BLAS is not OpenBLAS)."""
    return get_blas_threads() or 1


def _pool(n):
    """The kept pool, with at least ``n`` threads."""
    global _POOL, _POOL_SIZE
    with _LOCK:
        if _POOL is None or _POOL_SIZE < n:
            _POOL = ThreadPoolExecutor(n, thread_name_prefix="attn_np")
            _POOL_SIZE = n
        return _POOL


def _forget_pool():
    """In a child made by ``fork``: the parent's threads are not there."""
    global _POOL, _POOL_SIZE, _LOCK
    _POOL, _POOL_SIZE, _LOCK = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _run(task, errstate):
    """``task()`` under the caller's floating-point error handling (NumPy
    keeps it per thread)."""
    _INSIDE.active = True
    try:
        with np.errstate(**errstate):
            return task()
    finally:
        _INSIDE.active = False


def run_tasks(tasks) -> list:
    """Run every function of nothing in ``tasks`` at the same time, BLAS
    on one thread in each (the first in the calling thread); returns
    their results in order, and raises what a task raised, after all of
    them have ended. Each task runs under the caller's
    :func:`numpy.errstate`."""
    tasks = list(tasks)
    if len(tasks) < 2 or getattr(_INSIDE, "active", False):
        return [task() for task in tasks]
    pool = _pool(len(tasks) - 1)
    errstate = np.geterr()
    with blas_threads(1):
        futures = [pool.submit(_run, t, errstate) for t in tasks[1:]]
        try:
            first = _run(tasks[0], errstate)
        finally:
            rest = [f.exception() for f in futures]  # waits for all
    for error in rest:
        if error is not None:
            raise error
    return [first] + [f.result() for f in futures]


# a product of a few rows with weights of at least this many bytes in all
# is shared out (:func:`row_products`)
SHARED_MIN_BYTES = 2**21
SHARED_MAX_ROWS = 16


def row_products(x, *weights) -> list:
    """``[x @ W for W in weights]`` for ``x [..., d]`` with a few rows (a
    decode step): each worker multiplies its own contiguous block of the
    rows of every ``W [d, n]`` by the matching columns of ``x``, and the
    blocks' sums are added. In one piece (BLAS's threads) for many rows,
    small weights or one worker."""
    rows = x.size // max(1, x.shape[-1])
    n = worker_count()
    if (
        n < 2
        or not sharing()
        or rows > SHARED_MAX_ROWS
        or sum(W.nbytes for W in weights) < SHARED_MIN_BYTES
        or getattr(_INSIDE, "active", False)
    ):
        return [x @ W for W in weights]

    def task(sl):  # [.., d_part] @ [d_part, n] for every W
        return lambda: [x[..., sl] @ W[sl] for W in weights]

    parts = run_tasks(task(sl) for sl in split(x.shape[-1], n))
    out = parts[0]  # fresh arrays: the other blocks are added in place
    for more in parts[1:]:
        for y, y_more in zip(out, more):
            y += y_more
    return out


def lend() -> None:
    """Lend this pool to the kernels (:func:`attn_np._workers.lend_threads`):
    as many workers as BLAS may use threads."""
    lend_threads(run_tasks, worker_count)
