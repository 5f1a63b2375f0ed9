"""What a prefill and a decode step cost: FLOPs, bytes and arithmetic
intensity (chapter 4).

One attention layer (:class:`attn_np.GroupedQueryAttention`) processes a
*chunk* of ``L_q`` new positions for each of ``B`` sequences, over a
key/value cache that already holds ``n`` positions. A prefill is one chunk
over an empty cache (``L_q = L``, ``n = 0``); a decode step is one position
over a cache of ``n`` (``L_q = 1``). The keys the chunk attends over number
``L_k = n + L_q``.

FLOPs count matrix products only, ``2 m n k`` for ``[m, k] @ [k, n]``, as
:mod:`attn_np.costs` does.

Bytes count what must cross the memory bus at least once, each tensor read
once where it is an input and written once where it is an output:

* the weights ``W_q, W_k, W_v, W_o``, read once per chunk whatever ``B`` and
  ``L_q``;
* the cached keys and values, ``B n_kv L_k (d_k + d_v)`` numbers read, and
  the chunk's new ones written;
* the chunk's input ``x`` read and output ``y`` written, its queries and head
  outputs written and read back;
* the scores ``[B, h, L_q, L_k]``, written and read back once. NumPy
  materialises them; a fused kernel (FlashAttention, Dao et al. 2022) would
  not, so ``fused=True`` leaves them out.

Arithmetic intensity is FLOPs per byte. Shazeer (2019) states the same
accounting as a ratio the other way up, memory access over arithmetic, summed
over the ``n`` steps of incremental decoding with ``b`` sequences and model
width ``d``: ``Theta(n/d + 1/b)`` for multi-head attention and ``Theta(1/d +
n/(d h) + 1/b)`` for multi-query attention (:func:`shazeer_ratio`). Per step,
weights give the ``1/b`` term and the cache the ``n/d`` term.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._checks import (
    check_count,
    check_positive_int,
    check_positive_number,
)
from .layer import head_dims, matmul_flops, param_count
from .model import get_model, kv_cache_bytes, weight_bytes


def check_flag(value, name: str) -> bool:
    """``True`` or ``False``; a truthy string or number is refused."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_rate(value, name: str) -> float:
    """A positive finite real number (a rate, FLOP/s or bytes/s); a string
    is refused, not converted."""
    if isinstance(value, (str, bytes, bool)):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return check_positive_number(value, name)


def check_amount(value, name: str) -> float:
    """A non-negative finite real number (FLOPs or bytes of work)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not 0 <= value < float("inf"):
        raise ValueError(
            f"{name} must be a non-negative finite number, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class ChunkCost:
    """FLOPs and bytes of one chunk through one attention layer, term by
    term."""

    flops_breakdown: dict = field(repr=False)
    bytes_breakdown: dict = field(repr=False)

    @property
    def flops(self) -> int:
        return sum(self.flops_breakdown.values())

    @property
    def bytes(self) -> int:
        return sum(self.bytes_breakdown.values())

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per byte moved."""
        return self.flops / self.bytes

    def __repr__(self) -> str:
        return (
            f"ChunkCost(flops={self.flops}, bytes={self.bytes}, "
            f"intensity={self.intensity:.4g} FLOP/B)"
        )


def chunk_cost(
    B,
    L_q,
    n_cached,
    d_model,
    n_heads,
    n_kv_heads=None,
    d_k=None,
    d_v=None,
    *,
    bytes_per_element=4,
    fused=False,
) -> ChunkCost:
    """Cost of ``L_q`` new positions per sequence attending over ``n_cached``
    cached ones plus themselves."""
    B = check_positive_int(B, "B")
    L_q = check_positive_int(L_q, "L_q")
    n = check_count(n_cached, "n_cached", minimum=0)
    e = check_positive_int(bytes_per_element, "bytes_per_element")
    fused = check_flag(fused, "fused")
    d, h, n_kv, d_k, d_v = head_dims(d_model, n_heads, n_kv_heads, d_k, d_v)
    L_k = n + L_q
    flops = matmul_flops(B, L_q, L_k, d, h, n_kv, d_k, d_v)
    nbytes = {
        "weights": e * param_count(d, h, n_kv, d_k, d_v),
        "keys and values read": e * B * n_kv * L_k * (d_k + d_v),
        "new keys and values written": e * B * n_kv * L_q * (d_k + d_v),
        "x read, y written": e * 2 * B * L_q * d,
        # written, then read back
        "queries and head outputs": e * 2 * B * L_q * h * (d_k + d_v),
        # written, then read back
        "scores [B, h, L_q, L_k]": 0 if fused else e * 2 * B * h * L_q * L_k,
    }
    return ChunkCost(flops, nbytes)


def prefill_cost(
    B,
    L,
    d_model,
    n_heads,
    n_kv_heads=None,
    d_k=None,
    d_v=None,
    *,
    bytes_per_element=4,
    fused=False,
):
    """Cost of a prompt of ``L`` positions in one chunk (empty cache before,
    ``L`` cached after)."""
    return chunk_cost(
        B,
        L,
        0,
        d_model,
        n_heads,
        n_kv_heads,
        d_k,
        d_v,
        bytes_per_element=bytes_per_element,
        fused=fused,
    )


def decode_step_cost(
    B,
    n_cached,
    d_model,
    n_heads,
    n_kv_heads=None,
    d_k=None,
    d_v=None,
    *,
    bytes_per_element=4,
    fused=False,
):
    """Cost of one decode step: one new position per sequence over a cache of
    ``n_cached``."""
    return chunk_cost(
        B,
        1,
        n_cached,
        d_model,
        n_heads,
        n_kv_heads,
        d_k,
        d_v,
        bytes_per_element=bytes_per_element,
        fused=fused,
    )


def shazeer_ratio(n, d, b, *, n_heads, n_kv_heads) -> float:
    """Shazeer's (2019) memory-to-arithmetic ratio of incremental decoding,
    without its constants.

    ``n`` is the number of positions, ``d`` the model width, ``b`` the
    batch; ``n_heads`` and ``n_kv_heads`` say which of his two cases is
    meant, so that a head count can never be misread:

    * multi-head (``n_kv_heads == n_heads``): ``n/d + 1/b``;
    * multi-query (``n_kv_heads == 1``): ``1/d + n/(d h) + 1/b``.

    He states no ratio for grouped-query attention (it came later), so
    other values raise; :func:`decode_step_cost` counts every case
    exactly. A ratio near 1 or above means that memory traffic, not
    arithmetic, sets the pace.
    """
    n = check_positive_int(n, "n")
    d = check_positive_int(d, "d")
    b = check_positive_int(b, "b")
    h = check_positive_int(n_heads, "n_heads")
    n_kv = check_positive_int(n_kv_heads, "n_kv_heads")
    if n_kv == h:
        return n / d + 1 / b
    if n_kv == 1:
        return 1 / d + n / (d * h) + 1 / b
    raise ValueError(
        "Shazeer (2019) states the ratio for multi-head "
        "(n_kv_heads == n_heads) and multi-query (n_kv_heads == 1) "
        f"attention only, got n_heads={h} and n_kv_heads={n_kv}; "
        "decode_step_cost counts grouped-query attention exactly"
    )


# ---------------------------------------------------------------------------
# --- roofline
def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where a machine turns from memory-bound to
    compute-bound.

    Williams, Waterman and Patterson (2009): below ``peak_flops / bandwidth``
    FLOPs per byte a kernel cannot keep the arithmetic units busy, whatever
    its code.
    """
    peak = check_rate(peak_flops, "peak_flops")
    return peak / check_rate(bandwidth, "bandwidth")


def attainable_flops(
    intensity: float, peak_flops: float, bandwidth: float
) -> float:
    """The roofline: ``min(peak_flops, intensity * bandwidth)`` FLOP/s."""
    return min(
        check_rate(peak_flops, "peak_flops"),
        check_rate(intensity, "intensity")
        * check_rate(bandwidth, "bandwidth"),
    )


def roofline_time(
    flops: float, nbytes: float, peak_flops: float, bandwidth: float
) -> float:
    """The least time a kernel can take: ``max(flops / peak_flops, bytes /
    bandwidth)`` seconds."""
    return max(
        check_amount(flops, "flops") / check_rate(peak_flops, "peak_flops"),
        check_amount(nbytes, "nbytes") / check_rate(bandwidth, "bandwidth"),
    )


# -------------------------------------------------------------------------
# real models
def kv_read_tokens_per_second(
    config,
    seq_len,
    bandwidth,
    batch=1,
    bytes_per_element=2,
    include_weights=False,
):
    """Decode steps per second that reading the key/value cache alone allows,
    for one model.

    Each step every layer reads every cached key and value once:
    ``kv_cache_bytes(config, seq_len, batch)`` bytes. At ``bandwidth``
    bytes/s that takes at least ``kv_bytes / bandwidth`` seconds, so each of
    the ``batch`` sequences gets at most ``bandwidth / kv_bytes`` tokens per
    second. ``include_weights=True`` adds one read of the weights per step
    (shared by the batch).
    """
    cfg = get_model(config)
    need = kv_cache_bytes(cfg, seq_len, batch, bytes_per_element)
    if include_weights:
        need += weight_bytes(cfg, bytes_per_element)
    if need == 0:
        raise ValueError(
            "seq_len must be positive when include_weights is False "
            "(nothing to read)"
        )
    return check_rate(bandwidth, "bandwidth") / need
