"""Input checks shared by every public function.

Each check raises a ``ValueError`` (or a ``TypeError`` for a wrong dtype)
whose message names the argument, the shape or dtype it got and what was
expected, so that no broadcasting error from deep inside NumPy ever reaches
the reader.
"""

from __future__ import annotations

import math
import zlib

import numpy as np


def as_float_array(x, name: str, *, min_ndim: int = 0) -> np.ndarray:
    """Return ``x`` as a floating-point ndarray, or raise naming ``name``.

    Python lists of floats are accepted; integer, boolean and complex arrays
    are refused with a ``TypeError`` because silently promoting them hides
    bugs (integer attention weights are always a mistake).
    """
    try:
        arr = np.asarray(x)
    except ValueError:  # a ragged list
        raise ValueError(
            f"{name} must be a rectangular array, got a ragged "
            f"{type(x).__name__} (rows of different lengths)"
        ) from None
    if arr.dtype not in (np.float32, np.float64):
        # float16's largest number is 65504: its scores overflow at once
        raise TypeError(
            f"{name} must be a floating-point array (float32 or float64), "
            f"got dtype {arr.dtype}"
        )
    if arr.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} axes, got shape "
            f"{arr.shape}"
        )
    return arr


def as_bool_array(x, name: str) -> np.ndarray:
    """Return a boolean mask as an ndarray, or raise naming ``name``."""
    arr = np.asarray(x)
    if arr.dtype != np.bool_:
        raise TypeError(
            f"{name} must be a boolean array (True where a query may "
            "attend a key), "
            f"got dtype {arr.dtype}"
        )
    return arr


def broadcast_shapes(
    named: dict[str, tuple[int, ...]], what: str
) -> tuple[int, ...]:
    """``np.broadcast_shapes`` with an error message that names every
    argument."""
    try:
        return np.broadcast_shapes(*named.values())
    except ValueError:
        got = ", ".join(f"{k} {v}" for k, v in named.items())
        raise ValueError(
            f"{what} do not broadcast together: {got}"
        ) from None


def broadcasts_to(shape: tuple[int, ...], full: tuple[int, ...]) -> bool:
    """Whether an array of ``shape`` broadcasts to exactly ``full``."""
    try:
        return np.broadcast_shapes(shape, full) == full
    except ValueError:
        return False


def check_mask(mask, full: tuple[int, ...], layout: str) -> np.ndarray:
    """A boolean ``mask`` that broadcasts to ``full`` (described as
    ``layout``), or raise naming both."""
    m = as_bool_array(mask, "mask")
    if not broadcasts_to(m.shape, full):
        raise ValueError(
            f"mask must broadcast to {layout} = {full}, got mask of shape "
            f"{m.shape}"
        )
    return m


def check_same_shape(
    a: np.ndarray, name: str, expected: tuple[int, ...], expected_from: str
) -> None:
    if a.shape != tuple(expected):
        raise ValueError(
            f"{name} must have shape {tuple(expected)} (the shape of "
            f"{expected_from}), got {a.shape}"
        )


def check_positive_int(value, name: str) -> int:
    """A positive integer, or raise naming ``name``."""
    return check_count(value, name, minimum=1)


def check_count(value, name: str, *, minimum: int = 1) -> int:
    """An integer ``>= minimum`` (1: a positive count, 0: a non-negative
    one), or raise naming ``name``. Booleans are refused: ``True`` is not a
    count."""
    if (
        isinstance(value, bool)
        or not hasattr(value, "__index__")
        or int(value) < minimum
    ):
        kind = "a non-negative" if minimum == 0 else "a positive"
        raise ValueError(f"{name} must be {kind} integer, got {value!r}")
    return int(value)


def check_positive_number(value, name: str) -> float:
    """A positive finite real number, or raise naming ``name``: a string
    such as ``"1e-6"`` is not a number."""
    try:
        x = float("nan") if isinstance(value, (str, bytes)) else float(value)
    except (TypeError, ValueError, OverflowError):  # 10**400 too
        x = float("nan")
    if isinstance(value, bool) or not (math.isfinite(x) and x > 0):
        raise ValueError(
            f"{name} must be a positive finite number, got {value!r}"
        )
    return x


def check_number(value, name: str) -> float:
    """A finite real number (a Python or NumPy int or float; not a
    string, not a bool), or raise naming ``name``."""
    ok = not isinstance(value, (bool, np.bool_)) and isinstance(
        value, (int, float, np.integer, np.floating)
    )
    try:
        x = float(value) if ok else float("nan")
    except OverflowError:
        x = float("nan")
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return x


def check_float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """A floating-point NumPy dtype, or raise a ``TypeError``."""
    dtype = np.dtype(dtype)
    if not np.issubdtype(dtype, np.floating):
        raise TypeError(f"{name} must be a floating-point type, got {dtype}")
    return dtype


def check_head_dims(d_model, n_heads, n_kv_heads=None, d_k=None, d_v=None):
    """Validated ``(d_model, n_heads, n_kv_heads, d_k, d_v)`` of an
    attention layer, defaults filled in: ``n_kv_heads = n_heads`` (MHA) and
    ``d_k = d_v = d_model // n_heads``."""
    d_model = check_count(d_model, "d_model")
    n_heads = check_count(n_heads, "n_heads")
    n_kv_heads = (
        n_heads
        if n_kv_heads is None
        else check_count(n_kv_heads, "n_kv_heads")
    )
    if n_heads % n_kv_heads:
        raise ValueError(
            "n_heads must be a multiple of n_kv_heads (each key/value head "
            f"serves a whole group of query heads), got n_heads={n_heads} "
            f"and n_kv_heads={n_kv_heads}"
        )
    if (d_k is None or d_v is None) and d_model % n_heads:
        raise ValueError(
            "d_model must be divisible by n_heads when d_k or d_v is not "
            "given (they default to d_model // n_heads), got "
            f"d_model={d_model} and n_heads={n_heads}"
        )
    d_k = d_model // n_heads if d_k is None else check_count(d_k, "d_k")
    d_v = d_model // n_heads if d_v is None else check_count(d_v, "d_v")
    return d_model, n_heads, n_kv_heads, d_k, d_v


def check_finite(x: np.ndarray, name: str) -> None:
    """Refuse NaN or inf in an input, naming it: a NaN that enters attention
    silently turns every output it touches into NaN."""
    if not np.isfinite(x).all():
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        raise ValueError(
            f"{name} must be finite, got {bad} NaN or inf value(s) in "
            f"{name} of shape {np.shape(x)}"
        )


def check_upstream(dout, name: str, expected, what: str) -> np.ndarray:
    """An upstream gradient ``dout`` with the shape of the output it belongs
    to (``what``), or raise naming both shapes."""
    dout = as_float_array(dout, name)
    check_same_shape(dout, name, expected, what)
    check_finite(dout, name)
    return dout


def check_token_ids(ids, vocab_size, name: str = "ids") -> np.ndarray:
    """``ids`` as an integer array of token ids in ``[0, vocab_size)``, or
    raise naming the bad values and the vocabulary (``vocab_size`` None:
    any id >= 0, where no vocabulary is at hand)."""
    ids = np.asarray(ids)
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(
            f"{name} must be an integer array of token ids, got dtype "
            f"{ids.dtype}"
        )
    top = np.inf if vocab_size is None else vocab_size
    if ids.size and (ids.min() < 0 or ids.max() >= top):
        raise ValueError(
            f"{name} must lie in [0, vocab_size) = [0, {vocab_size}), got "
            f"values from {ids.min()} to {ids.max()}"
        )
    return ids


def check_latent_dims(
    d_model,
    n_heads,
    d_head,
    d_latent_kv,
    d_rope,
    d_latent_q=None,
    d_head_v=None,
):
    """Validated sizes of a latent-attention layer,
    ``(d, h, d_h, d_c, d_R, d_cq, d_v)``, defaults filled in (``d_cq``
    stays None without query compression, ``d_v`` defaults to ``d_h``)."""
    d = check_count(d_model, "d_model")
    h = check_count(n_heads, "n_heads")
    d_h = check_count(d_head, "d_head")
    d_c = check_count(d_latent_kv, "d_latent_kv")
    d_r = check_count(d_rope, "d_rope")
    d_cq = None
    if d_latent_q is not None:
        d_cq = check_count(d_latent_q, "d_latent_q")
    d_v = d_h if d_head_v is None else check_count(d_head_v, "d_head_v")
    return d, h, d_h, d_c, d_r, d_cq, d_v


def check_flag(value, name: str) -> bool:
    """``True`` or ``False`` (NumPy's too), or raise a ``TypeError``: a
    truthy string such as ``'no'`` is not a flag."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_scale(scale, d_k: int) -> float:
    """The score scale: ``1 / sqrt(d_k)`` when None (Vaswani et al. 2017),
    else a positive finite number."""
    if scale is None:
        return 1.0 / math.sqrt(d_k)
    try:  # a Python int beyond float range is not a scale either
        x = float(scale)
    except (TypeError, ValueError, OverflowError):
        x = float("nan")
    if (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float, np.floating, np.integer))
        or not (math.isfinite(x) and x > 0)
    ):
        raise ValueError(
            f"scale must be a positive finite number, got {scale!r}"
        )
    return float(scale)


def check_window(window, causal=True):
    """``None`` or a positive int ``W``; a window needs ``causal=True``."""
    if window is None:
        return None
    window = check_positive_int(window, "window")
    if not causal:
        raise ValueError(
            f"window={window} needs causal=True: a query attends the W "
            "keys that end at its own position"
        )
    return window


def check_sinks(sinks, rows: tuple[int, ...], layout: str) -> np.ndarray:
    """Sink logits as a finite float array broadcastable to ``rows`` (one
    logit per query row, described as ``layout``)."""
    sinks = as_float_array(sinks, "sinks")
    check_finite(sinks, "sinks")
    if not broadcasts_to(sinks.shape, rows):
        raise ValueError(
            f"sinks must broadcast to {layout} = {rows} (one logit "
            f"per query row), got sinks of shape {sinks.shape}"
        )
    return sinks


def check_layer_input(x, d_model: int, name: str = "x"):
    """A layer's input ``[L, d_model]`` or ``[B, L, d_model]``, finite,
    with at least one position: returns ``(x3 [B, L, d_model],
    unbatched)``. Checked once per forward, so that a decode step never
    re-reads its whole cache to check it."""
    x = as_float_array(x, name)
    check_finite(x, name)
    if x.ndim not in (2, 3) or x.shape[-1] != d_model:
        raise ValueError(
            f"{name} must have shape [L, d_model] or [B, L, d_model] "
            f"with d_model={d_model}, got {x.shape}"
        )
    if x.shape[-2] == 0:
        raise ValueError(
            f"{name} must hold at least one position, got shape {x.shape}"
        )
    return (x[None], True) if x.ndim == 2 else (x, False)


def check_backward_cache(cache, kind: type, forward: str, size=None):
    """Refuse a backward's ``cache`` that is not what ``forward``
    returned (a ``kind``; a tuple of ``size`` for the small kernels),
    with a ``TypeError`` naming both, before any attribute is read."""
    if not isinstance(cache, kind) or (
        size is not None and len(cache) != size
    ):
        what = kind.__name__ if size is None else f"tuple of {size}"
        raise TypeError(
            f"cache must be what {forward} returned (a {what}), got "
            f"{type(cache).__name__}"
        )


def check_cache_kind(kv_cache, kind: type, why: str = "") -> None:
    """Refuse a ``kv_cache`` that is not a ``kind`` (a layer's cache
    class) with a ``TypeError`` naming the type it got; ``why``, when
    given, says in brackets what only that kind keeps."""
    if not isinstance(kv_cache, kind):
        note = f" ({why})" if why else ""
        raise TypeError(
            f"kv_cache must be an attn_np.{kind.__name__}{note}, got "
            f"{type(kv_cache).__name__}"
        )


def check_scores(
    s: np.ndarray, scale: float, what: str = "scores q k^T * scale"
) -> None:
    """Refuse scores that overflowed: finite ``q``, ``k`` and ``scale``
    whose products exceed the dtype's range give inf, and softmax turns
    inf into NaN. Named with the scale and the dtype's largest number."""
    if not all_finite(s):
        big = np.finfo(s.dtype).max
        wider = "" if s.dtype == np.float64 else ", or use float64"
        raise ValueError(
            f"the {what} overflowed (inf or NaN) in "
            f"{s.dtype} (largest {big:.3g}) with scale={scale!r}: scale "
            f"the queries and keys down{wider}"
        )


def all_finite(a: np.ndarray) -> bool:
    """No NaN or inf in ``a``, found by two reductions that allocate
    nothing as large as ``a`` (NaN propagates through max and min)."""
    return a.size == 0 or bool(np.isfinite(a.max()) and np.isfinite(a.min()))


def fingerprint(*arrays) -> tuple:
    """A cheap checksum of arrays a cache keeps without copying (one
    pass, Adler-32 of their bytes), so that a backward can tell whether
    the caller changed them in place after the forward."""
    out = []
    for a in arrays:
        a = np.ascontiguousarray(a)
        out.append(zlib.adler32(a.view(np.uint8).reshape(-1)))
    return tuple(out)


def check_unchanged(saved: tuple, arrays: dict, where: str) -> None:
    """Raise naming the array a caller changed in place between the
    forward and ``where`` (a backward), which would make it wrong."""
    now = fingerprint(*arrays.values())
    for name, a, b in zip(arrays, saved, now):
        if a != b:
            raise ValueError(
                f"{name} was changed in place after the forward: {where} "
                "reads the arrays the forward saw (they are not copied); "
                "copy them before changing them, or run the forward again"
            )


def check_norm_input(x, name: str, eps) -> tuple[np.ndarray, float]:
    """The input of a norm kernel and its ``eps``: a finite float array
    with a last axis, and ``eps`` zero or positive and finite (a negative
    one can take a root of a negative number). With ``eps = 0`` a row of
    zeros is refused: it would divide zero by zero."""
    x = as_float_array(x, name, min_ndim=1)
    check_finite(x, name)
    if isinstance(eps, (int, float, np.integer, np.floating)) and eps == 0:
        if x.size and not np.any(x, axis=-1).all():
            raise ValueError(
                f"{name} has a row of zeros and eps=0: its norm is 0/0; "
                "pass a positive eps"
            )
        return x, 0.0
    return x, check_positive_number(eps, "eps")


def check_overflow(a: np.ndarray, what: str, cause: str) -> None:
    """Refuse a result that overflowed to inf or NaN from finite inputs,
    naming it, the dtype and the input that was too large (``cause``)."""
    if not all_finite(a):
        raise ValueError(
            f"{what} overflowed (inf or NaN) in {a.dtype} (largest "
            f"{np.finfo(a.dtype).max:.3g}): {cause}"
        )
