"""How many threads NumPy's BLAS may use (chapter 5's training runs on tiny
matrices).

A threaded matrix product splits its work and then waits for every thread.
For the ``[640, 32] @ [32, 64]`` products of a small model that wait costs
far more than the product: on a busy two-core machine one BLAS thread trains
the chapter-5 model an order of magnitude faster than two. One thread also
fixes the order of every floating-point sum, so a run repeats bit for bit.

NumPy has no public switch for this, so we call OpenBLAS's own
``set_num_threads`` through ``ctypes`` (found by :mod:`attn_np._blas`),
as the ``threadpoolctl`` package does. With a BLAS other than the
OpenBLAS that NumPy's wheels bundle, the functions do nothing and return
``None``.
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager

from .._blas import _LIB, _functions
from .._checks import check_count


def blas_kernels() -> str | None:
    """The set of kernels OpenBLAS chose for this CPU (its "core name":
    ``Haswell``, ``SkylakeX``, ``Zen``, ...), or ``None`` with another
    BLAS.

    A NumPy wheel's OpenBLAS holds kernels for many CPUs and picks one set
    when NumPy loads it. The environment variable ``OPENBLAS_CORETYPE``,
    set before Python starts, picks another. The choice matters most for
    products of a few rows with a large matrix (a decode step of a small
    batch), where the sets differ most."""
    fns = _functions("get_corename")
    if fns is None:
        return None
    fns[0].restype = ctypes.c_char_p
    name = fns[0]()
    return None if name is None else name.decode(errors="replace")


def get_blas_threads() -> int | None:
    """The number of threads OpenBLAS may use, or ``None`` if NumPy's BLAS is
    not a bundled OpenBLAS."""
    return None if _LIB is None else int(_LIB[0]())


def set_blas_threads(n: int) -> int | None:
    """Let OpenBLAS use ``n`` threads; return the previous number (``None``:
    nothing to set)."""
    n = check_count(n, "n")
    if _LIB is None:
        return None
    previous = int(_LIB[0]())
    _LIB[1](int(n))
    return previous


@contextmanager
def blas_threads(n: int):
    """``with blas_threads(1): ...`` runs the block with ``n`` BLAS threads,
    then restores the old number."""
    previous = set_blas_threads(n)
    try:
        yield
    finally:
        if previous is not None:
            set_blas_threads(previous)
