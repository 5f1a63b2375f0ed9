"""Which OpenBLAS NumPy bundles, found once (chapter 0).

NumPy has no public switch for its BLAS's threads, so the library calls
OpenBLAS's own functions through ``ctypes``, as the ``threadpoolctl``
package does. :mod:`attn_np.instruments.blas` reads and sets the count;
chapter 14's decode step reads it (:func:`_thread_count`) to choose how
it makes a vector-matrix product. With a BLAS other than the OpenBLAS
that NumPy's wheels bundle, nothing is found.
"""

from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

_PREFIXES = ("scipy_openblas", "openblas")
_SUFFIXES = ("64_", "")


def _functions(*names):
    """The functions ``names`` (``"get_num_threads"``, ...) of the
    OpenBLAS bundled with NumPy, all from one library under one naming
    (``scipy_openblas``/``openblas``, with or without the 64-bit
    suffix), or ``None``."""
    here = os.path.dirname(np.__file__)
    for path in glob.glob(
        os.path.join(here, "..", "numpy.libs", "*openblas*")
    ) + glob.glob(os.path.join(here, ".dylibs", "*openblas*")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                fns = [
                    getattr(lib, f"{prefix}_{name}{suffix}", None)
                    for name in names
                ]
                if all(fn is not None for fn in fns):
                    return fns
    return None


def _openblas():
    """``(get, set)`` functions of the OpenBLAS bundled with NumPy, or
    ``None``."""
    fns = _functions("get_num_threads", "set_num_threads")
    if fns is None:
        return None
    get, put = fns
    get.restype = ctypes.c_int
    put.argtypes = [ctypes.c_int]
    return get, put


_LIB = _openblas()


def _thread_count() -> int | None:
    """How many threads OpenBLAS may use, or None with another BLAS."""
    return None if _LIB is None else int(_LIB[0]())
