"""Whether the C allocator hands freed memory back to the operating system
between steps (chapter 12's benchmark).

glibc's ``malloc`` serves every block above 128 KiB (a threshold it raises
as blocks are freed, up to 32 MiB) with its own ``mmap`` and returns it on
``free``; the next array of that size gets fresh pages, and the kernel
zeroes each one on first touch. A step that allocates tens of MiB in
arrays (the per-token loop keeps ``T + 1`` states: 0.5 GiB at ``T =
4096``) spends a large share of its time there, in system time, the same
work at every step. PyTorch's caching allocator avoids it by keeping
freed blocks; :func:`keep_freed_memory` asks glibc to do the same
(``mallopt``: no ``mmap``, no trimming of the heap), through ``ctypes``
as :mod:`.blas` reaches OpenBLAS. Elsewhere (macOS, musl) it does
nothing. It changes no number a computation returns, and not what
:mod:`tracemalloc` counts (the arrays allocated), only whether the pages
behind them are new.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from contextlib import contextmanager

# glibc's <malloc.h>
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULT_TRIM, _DEFAULT_MMAP_MAX = 128 * 1024, 65536


def _glibc():
    """``(mallopt, malloc_trim)`` of glibc, or ``None``."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], int
    trim.argtypes, trim.restype = [ctypes.c_size_t], int
    return mallopt, trim


_LIBC = _glibc()


def allocator_tunable() -> bool:
    """True where :func:`keep_freed_memory` has an effect (glibc)."""
    return _LIBC is not None


@contextmanager
def keep_freed_memory(enabled: bool = True):
    """Within the block, glibc keeps freed blocks for the next
    allocation (every block from the heap, none trimmed); afterwards the
    heap is trimmed and glibc's default limits come back (a fixed
    threshold: the dynamic one is off once set). Yields whether it took
    effect (``enabled=False``: nothing changes)."""
    if _LIBC is None or not enabled:
        yield False
        return
    mallopt, trim = _LIBC
    ok = bool(mallopt(_M_MMAP_MAX, 0)) and bool(
        mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
    )
    try:
        yield ok
    finally:
        mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
        mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM)
        trim(0)
