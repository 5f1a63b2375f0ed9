"""Reference rates of this machine, measured in the same run as the benchmark that quotes them."""

from __future__ import annotations

import time

import numpy as np


def best_time(fn, *, repeat: int = 5, min_time: float = 0.0) -> float:
    """The smallest wall-clock time of ``repeat`` calls of ``fn()`` (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_gflops(n: int = 1024, dtype=np.float32, repeat: int = 5) -> float:
    """This machine's dense matmul rate, GFLOP/s: ``2 n^3`` FLOPs for an ``[n, n] @ [n, n]`` product."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    out = np.empty((n, n), dtype=dtype)
    t = best_time(lambda: np.matmul(a, b, out=out), repeat=repeat)
    return 2 * n**3 / t / 1e9


def best_times(fns: dict, *, rounds: int = 5) -> dict:
    """The smallest time of each ``fn()`` in ``fns``, measured in turns (after one warm-up round).

    Taking turns, rather than timing one function after the other, exposes every candidate to the
    same moments of the machine: on a shared machine a burst of someone else's work then slows a
    round of all of them, not only the one that happened to be running.
    """
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def read_probes(nbytes: int = 512 * 2**20) -> dict:
    """Two ways to stream-read ``nbytes`` of float32 once: ``{name: (fn, bytes read)}``.

    * ``np.sum``: one thread, one addition per element; the idea of McCalpin's STREAM benchmark,
      read-only here. One core alone may not saturate the memory bus.
    * ``BLAS gemv``: ``A @ x`` with ``A`` the same bytes as a ``[n, 1024]`` matrix. OpenBLAS splits
      the rows over all its threads, two multiply-adds per 8 bytes, so it is still memory-bound,
      and it is the very kind of call a decode step makes.
    """
    a = np.ones(nbytes // 4, dtype=np.float32)  # written once, so every page is really there
    A = a.reshape(-1, 1024)  # [n, 1024]
    x = np.ones(1024, dtype=np.float32)
    y = np.empty(A.shape[0], dtype=np.float32)
    return {
        "np.sum (1 thread)": (lambda: a.sum(), a.nbytes),
        "BLAS gemv (all threads)": (lambda: np.matmul(A, x, out=y), a.nbytes),
    }


def read_bandwidths(nbytes: int = 512 * 2**20, rounds: int = 5) -> dict:
    """Streaming-read bandwidth in bytes/s of each probe in :func:`read_probes`."""
    probes = read_probes(nbytes)
    times = best_times({name: fn for name, (fn, _) in probes.items()}, rounds=rounds)
    return {name: probes[name][1] / t for name, t in times.items()}


def read_bandwidth(nbytes: int = 512 * 2**20, repeat: int = 5) -> float:
    """Streaming-read bandwidth in bytes/s: the best of :func:`read_bandwidths` (an array far larger
    than the CPU caches, read once by one thread with ``np.sum`` and by all BLAS threads with a gemv).

    A reference for memory-bound kernels should be the strongest honest figure: a kernel reported
    as a fraction of a weak reference looks better than it is.
    """
    return max(read_bandwidths(nbytes, rounds=repeat).values())
