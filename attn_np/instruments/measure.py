"""Measuring on the reader's machine: memory traced by tracemalloc, time by
the best of several runs, and the machine's own reference rates (matmul,
streaming read), measured in the same run as what is
compared with them."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .blas import blas_threads


def best_time(fn, *, repeat: int = 5, min_time: float = 0.0) -> float:
    """The smallest wall-clock time of ``repeat`` calls of ``fn()`` (after
    one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_probe(n: int = 1024, dtype=np.float32):
    """``(fn, flops)``: an ``[n, n] @ [n, n]`` product (``2 n^3`` FLOPs)
    as a function of nothing, to time beside what is compared with it."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    out = np.empty((n, n), dtype=dtype)
    return (lambda: np.matmul(a, b, out=out)), 2 * n**3


def matmul_gflops(n: int = 1024, dtype=np.float32, repeat: int = 5) -> float:
    """This machine's dense matmul rate, GFLOP/s: ``2 n^3`` FLOPs for an
    ``[n, n] @ [n, n]`` product."""
    fn, flops = matmul_probe(n, dtype)
    return flops / best_time(fn, repeat=repeat) / 1e9


MAX_ROUNDS_VARIABLE = "ATTN_NP_MAX_ROUNDS"


def capped_rounds(rounds: int) -> int:
    """``rounds``, or at most ``$ATTN_NP_MAX_ROUNDS`` where that is set.

    Every timing loop of the library takes its number of rounds through
    here. ``make nbval`` sets the variable to 1: under nbval the timing
    cells' outputs are not compared (their tag is ``nbval-ignore-output``),
    so there they must run, every line of them, but need not measure well,
    and their rounds were about a fifth of nbval's time. The outputs the
    book shows come from ``make notebooks`` and a reader's own run, with
    every round.
    """
    cap = os.environ.get(MAX_ROUNDS_VARIABLE)
    if not cap:
        return rounds
    try:
        cap = int(cap)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ValueError(
            f"{MAX_ROUNDS_VARIABLE} must be a positive integer, got "
            f"{os.environ[MAX_ROUNDS_VARIABLE]!r}"
        )
    return min(rounds, cap)


def best_times(fns: dict, *, rounds: int = 5) -> dict:
    """The smallest time of each ``fn()`` in ``fns``, measured in turns
    (after one warm-up round).

    Taking turns, rather than timing one function after the other, exposes
    every candidate to the same moments of the machine: on a shared machine a
    burst of someone else's work then slows a round of all of them, not only
    the one that happened to be running.
    """
    return {
        name: min(ts) for name, ts in round_times(fns, rounds=rounds).items()
    }


def round_times(fns: dict, *, rounds: int = 5) -> dict:
    """Every round's time of each ``fn()`` in ``fns``, measured in turns
    (after one warm-up round): ``{name: array of rounds seconds}``.

    Round ``i`` of every candidate was measured within the same few
    milliseconds, so ``t[a] - t[b]`` round by round compares ``a`` with
    ``b`` under the same conditions (:func:`paired_difference`).
    """
    if not isinstance(fns, dict) or not all(map(callable, fns.values())):
        raise TypeError(
            f"fns must be a dict of callables, got {type(fns).__name__}"
            + ("" if not isinstance(fns, dict) else " with other values")
        )
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(
            f"rounds must be a positive integer, got {rounds!r}"
        )
    rounds = capped_rounds(rounds)
    for fn in fns.values():
        fn()
    times = {name: np.empty(rounds) for name in fns}
    for i in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name][i] = time.perf_counter() - t0
    return times


def paired_difference(a, b) -> tuple[float, float, float]:
    """``(median, low, high)`` of ``a - b`` round by round (two arrays of
    :func:`round_times`): ``low`` and ``high`` are the quartiles. A
    difference is real when the quartiles share its sign."""
    d = np.asarray(a) - np.asarray(b)
    low, median, high = np.percentile(d, [25, 50, 75])
    return float(median), float(low), float(high)


def alternating_times(fns: dict, *, rounds: int = 5) -> dict:
    """Like :func:`round_times`, but every other round runs the candidates
    in the reverse order (A B C, C B A, ...), so none is always the first
    after a pause or the last before one: ``{name: array of seconds}``.

    Time the same function under two names (``{"a": f, "a again": f}``)
    and their ratio round by round is the run's own noise floor
    (:func:`ratio_spread`): what a ratio of identical code looks like now.
    """
    rounds = capped_rounds(rounds)
    for fn in fns.values():
        fn()
    names = list(fns)
    times = {name: np.empty(rounds) for name in names}
    for i in range(rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            fns[name]()
            times[name][i] = time.perf_counter() - t0
    return times


def ratio_spread(a, b) -> tuple[float, float, float]:
    """``(median, low, high)`` of ``a / b`` round by round (two arrays of
    :func:`round_times` or :func:`alternating_times`); ``low`` and
    ``high`` are the quartiles."""
    r = np.asarray(a) / np.asarray(b)
    low, median, high = np.percentile(r, [25, 50, 75])
    return float(median), float(low), float(high)


_SPIN = (
    "import time\n"
    "end = time.monotonic() + {seconds}\n"
    "while time.monotonic() < end:\n"
    "    pass\n"
)


@contextmanager
def busy_core(seconds: float = 120.0):
    """Keep one core busy while the ``with`` block runs: a background
    Python process spinning in a loop. It stops itself after ``seconds``
    whatever happens, and is stopped when the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SPIN.format(seconds=float(seconds))]
    )
    try:
        time.sleep(0.05)  # let it start spinning
        yield proc
    finally:
        proc.terminate()
        proc.wait()


def blas_call_times(
    threads: int,
    *,
    calls: int = 2000,
    shape=(256, 64, 256),
    dtype=np.float32,
) -> dict:
    """Time ``calls`` short products ``[m, k] @ [k, n]`` one by one with
    ``threads`` BLAS threads: the calls a tiled kernel makes.

    Returns ``{"seconds": array of each call's time, "switches": the
    process's involuntary context switches meanwhile, "cpu": its user CPU
    seconds}``. A BLAS thread that has finished its share waits for the
    others, spinning; when they have no core, the call takes as long as
    the scheduler takes to give them one.
    """
    m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    out = np.empty((m, n), dtype)
    seconds = np.empty(calls)
    with blas_threads(threads):
        np.matmul(a, b, out=out)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        for i in range(calls):
            t0 = time.perf_counter()
            np.matmul(a, b, out=out)
            seconds[i] = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": seconds,
        "switches": r1.ru_nivcsw - r0.ru_nivcsw,
        "cpu": r1.ru_utime - r0.ru_utime,
    }


def read_probes(nbytes: int = 512 * 2**20) -> dict:
    """Five ways to stream-read ``nbytes`` of float32 once: ``{name: (fn,
    bytes read)}``. The fastest is the machine's streaming-read bandwidth.

    * ``np.sum``: one thread, one addition per element; in the spirit of
      McCalpin's STREAM benchmark, whose kernels read and write, but
      read-only. One core alone may not saturate the memory bus.
    * ``BLAS A @ x``: ``A`` the same bytes as a ``[n, 1024]`` matrix, one
      dot product per row. OpenBLAS splits the rows over all its threads,
      two multiply-adds per 8 bytes, so it is still memory-bound.
    * ``BLAS x @ A``: ``A`` as a ``[1024, n]`` matrix, ``x`` times each of
      its long rows added up (the output stays in cache). This is the
      product a decode step makes with ``x @ W`` and ``q @ K^T``, and on
      some machines the faster of the two: a kernel quoted against a
      slower reference would look better than it is.
    * ``einsum, row by row``: ``A`` as a ``[n, 1024]`` matrix, ``y = sum_i
      x_i A[i, :]`` with :func:`numpy.einsum`, one thread: each row added
      into a 4 KiB ``y`` that stays in the first-level cache, so the read
      is one stream front to back. Where it is the fastest, the others
      leave bandwidth unused; a decode step at batch 1 and one thread
      can make its products this way.
    * ``BLAS x @ A, rows of 1024``: the same ``[n, 1024]`` matrix
      through BLAS's kernel, several rows at a time into a ``y`` that
      stays in the first-level cache: a decode step's ``x @ W`` by BLAS
      (its rows 576 to 3,072 numbers). At one thread it can beat both
      of BLAS's reads above; with more, BLAS splits this shape between
      its threads less well than those.
    """
    # written once, so every page is really there
    a = np.ones(nbytes // 4, dtype=np.float32)
    A = a.reshape(-1, 1024)  # [n, 1024]
    x = np.ones(1024, dtype=np.float32)
    y = np.empty(A.shape[0], dtype=np.float32)
    At = a.reshape(1024, -1)  # [1024, n]
    z = np.empty(At.shape[1], dtype=np.float32)
    xr = np.ones(A.shape[0], dtype=np.float32)
    zr = np.empty(1024, dtype=np.float32)
    return {
        "np.sum (1 thread)": (lambda: a.sum(), a.nbytes),
        "BLAS A @ x (all threads)": (
            lambda: np.matmul(A, x, out=y),  # [n, 1024] @ [1024] -> [n]
            a.nbytes,
        ),
        "BLAS x @ A (all threads)": (
            lambda: np.matmul(x, At, out=z),  # [1024] @ [1024, n] -> [n]
            a.nbytes,
        ),
        "einsum, row by row (1 thread)": (  # [n] @ [n, 1024] -> [1024]
            lambda: np.einsum("i,ij->j", xr, A, out=zr),
            a.nbytes,
        ),
        "BLAS x @ A, rows of 1024 (all threads)": (
            lambda: np.matmul(xr, A, out=zr),  # [n] @ [n, 1024] -> [1024]
            a.nbytes,
        ),
    }


# ---------------------------------------------------------------------------
# -- measuring
@dataclass
class MemoryMeasurement:
    """Bytes allocated by a call, as traced by :mod:`tracemalloc` (NumPy
    reports its arrays to it)."""

    # the most bytes allocated at any moment during the call, above what
    # existed before
    peak: int
    # bytes still allocated when the call returned (what its result keeps
    # alive)
    retained: int
    # the call's return value, kept alive so that ``retained`` means
    # something
    result: object


def measure_memory(fn: Callable[[], object]) -> MemoryMeasurement:
    """Run ``fn()`` under :mod:`tracemalloc`; return the peak and retained
    bytes and the result.

    Only allocations made during the call count, so arrays that exist before
    it (the input, the weights) are not included. If tracemalloc is already
    tracing, it is restarted afterwards.
    """
    was_tracing = tracemalloc.is_tracing()
    if was_tracing:
        tracemalloc.stop()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        result = fn()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        if was_tracing:
            tracemalloc.start()
    return MemoryMeasurement(
        peak=peak - base, retained=current - base, result=result
    )


def measure_peak_bytes(fn: Callable[[], object]) -> int:
    """The peak bytes allocated while ``fn()`` runs, above what was allocated
    before it."""
    return measure_memory(fn).peak
