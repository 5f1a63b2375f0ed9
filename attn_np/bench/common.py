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


def read_bandwidth(nbytes: int = 512 * 2**20, repeat: int = 5) -> float:
    """Streaming-read bandwidth in bytes/s: time to sum a float32 array far larger than the CPU caches.

    A sum reads every byte once and does one addition per element, so it is limited by memory
    bandwidth, not arithmetic (the idea of McCalpin's STREAM benchmark, read-only here).
    """
    a = np.ones(nbytes // 4, dtype=np.float32)
    t = best_time(lambda: a.sum(), repeat=repeat)
    return a.nbytes / t
