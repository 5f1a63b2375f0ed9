"""One decode step of chapter 14's model, its arithmetic written out once.

A decode step of SmolLM2 reads every weight once (some 540 MB in
float32) and does little arithmetic with each: its time should be those
bytes at the rate memory streams them. Through the layers, every one of
the thirty blocks also checks its input and its cache, builds its
rotation and its core's bookkeeping, and keeps what a backward would
need; at one token those steps take a good part of the step's time.
:func:`_decode_step` is the same step for one token over plain
caches (chapter 4's :class:`~attn_np.KVCache`), with the layers'
equations and weights and none of that:

    h = RMSNorm(x)                  (norm1's gain)
    q, k, v = h [W_q | W_k | W_v]   (the layer's packed projection)
    q, k turned by RoPE at the cache's length, q scaled by 1/sqrt(d)
                                    (one table for all the layers)
    k, v written into the cache's next column
    p = softmax(q K^T)              (each group's G query heads stacked)
    x = x + (p V) W_o
    x = x + SwiGLU(RMSNorm(x))
    logits = RMSNorm(x) E^T

At batch 1 every product of a block is a vector times a matrix, made
by :func:`decode_product`, by BLAS or with the rows of the matrix added
up one after the other, whichever streams the weights faster on the
machine (measured once, :func:`_by_rows`), and the model keeps those
matrices in one allocation (:func:`~attn_np.pretrained.load_gguf`).

The model checks what enters once (the token ids, the cache), and the
logits once: a score or an output that overflowed shows there as a NaN
or inf, and is refused. ``tests/test_pretrained.py`` compares it with
the layers' own step (float64: to 1e-12; float32: to rounding).
"""

from __future__ import annotations

import math
import time

import numpy as np

from .._blas import _thread_count
from .._checks import all_finite, check_scale
from ..ffn import _gate_into, swiglu_step
from ..kv_cache import KVCache
from ..rope import position_tables as _position_tables


def _fusable(model, x, kv_cache, where) -> bool:
    """Whether the step of ``x [B, 1, d]`` over ``kv_cache`` (a
    :class:`~attn_np.pretrained.model.ModelCache`) can take
    :func:`_decode_step`: one token, no mask or positions of the caller's
    (``where``), every layer's cache a plain :class:`~attn_np.KVCache`
    holding something, every attention layer chapter 3's plain one (no
    window, sinks, parts or kernels of later chapters), and the RoPE
    tables of the position kept."""
    if where or x.shape[1] != 1 or x.dtype != model.dtype:
        return False
    for blk, cache in zip(model.blocks, kv_cache.caches):
        if type(cache) is not KVCache or not blk.attn._one_token(cache, x):
            return False
    return True


def _norm(x, layer):
    """Chapter 5's RMSNorm of ``x [B, 1, d]`` with ``layer``'s gain,
    ``x g / sqrt(mean(x^2) + eps)``. One row's mean square is a Python
    number, its root taken by :mod:`math`: three NumPy calls."""
    d, eps = x.shape[-1], layer.eps
    if x.shape[0] == 1:
        row = x.reshape(d)
        r = 1.0 / math.sqrt(float(np.dot(row, row)) / d + eps)
    else:  # [B, 1, 1]
        r = 1.0 / np.sqrt(np.vecdot(x, x)[..., None] / d + eps)
    h = x * layer.params["g"]
    h *= r
    return h


def _turn_tables(layer, position, tables):
    """The tables that turn the query and key heads of ``layer`` side by
    side, ``[H + n_kv, d]`` in the pairs' shape (``[.., d/2, 2]``
    interleaved, ``[.., 2, d/2]`` rotate-half): ``(C, S)``, chapter 6's
    ``cos`` and signed ``sin`` at ``position`` (:func:`~attn_np.rope.
    position_tables`), the query heads' rows times the score scale, so
    that ``x C + swap(x) S`` turns and scales them in three operations.
    ``S`` is None without RoPE. Kept in ``tables`` for the other layers of
    the step; None where the tables do not reach ``position`` or the
    rotation is partial (the layer's own step then takes it)."""
    r, H, n_kv, d = layer.rotary, layer.n_heads, layer.n_kv_heads, layer.d_k
    scale = check_scale(layer.scale, d)
    spec = None if r is None else (r.base, r.layout, r.rotary_dim)
    key = (spec, H, n_kv, d, scale)
    if key not in tables:
        tables[key] = _tables(spec, H, n_kv, d, scale, position, layer.dtype)
    return tables[key]


def _tables(spec, H, n_kv, d, scale, position, dtype):
    scales = np.ones((H + n_kv, 1, 1), dtype=dtype)
    scales[:H] = scale
    if spec is None:  # no RoPE: the query heads scaled
        return scales, None
    base, layout, rd = spec
    if rd not in (None, d):
        return None
    t = _position_tables(base, layout, d, position, dtype)
    if t is None:
        return None
    pairs = (d // 2, 2) if layout == "interleaved" else (2, d // 2)
    cos_r, sin_r = t[2][0].reshape(pairs), t[3][0].reshape(pairs)
    return cos_r * scales, sin_r * scales  # [H + n_kv, *pairs] each


def _swap(t, layout):
    """``t [..., d/2, 2]`` (interleaved) or ``[..., 2, d/2]`` (rotate-half)
    with each pair's members swapped, ``(a, b) -> (b, a)``: a view."""
    return t[..., ::-1] if layout == "interleaved" else t[..., ::-1, :]


def _attention(layer, h, cache, tables, by_rows):
    """The attention half of a block for ``h [B, 1, d_model]`` (the
    normed input): ``[B, 1, d_model]``, the cache one column longer."""
    packed = layer.packed_qkv
    turn = (
        None if packed is None else _turn_tables(layer, len(cache), tables)
    )
    if turn is None:  # three matrices or a partial RoPE: the layer's step
        return layer._decode_one(h, cache)
    B = h.shape[0]
    H, n_kv, d = layer.n_heads, layer.n_kv_heads, layer.d_k
    # [B, d_model] @ [d_model, (H + 2 n_kv) d]
    qkv = decode_product(h.reshape(B, -1), packed, by_rows)
    C, S = turn
    qk = qkv[:, : (H + n_kv) * d].reshape((B,) + C.shape)
    qk_turned = qk * C  # the query heads scaled by 1/sqrt(d) too
    if S is not None:
        qk_turned += _swap(qk, layer.rotary.layout) * S
    qk_turned = qk_turned.reshape(B, H + n_kv, d)
    v = qkv[:, (H + n_kv) * d :].reshape(B, n_kv, 1, layer.d_v)
    # the cache as stored: K^T [B, n_kv, d, n], V^T [B, n_kv, d_v, n]
    Kt, Vt = cache.append_step(qk_turned[:, H:, None], v, transposed=True)
    q = qk_turned[:, :H].reshape(B, n_kv, H // n_kv, d)  # heads kv * G + g
    s = q @ Kt  # [B, n_kv, G, d] @ [B, n_kv, d, n] -> [B, n_kv, G, n]
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    o = s @ Vt.swapaxes(-1, -2)  # [B, n_kv, G, n] @ [B, n_kv, n, d_v]
    layer._att = None  # no weights kept: the layer's own forward keeps them
    # [B, 1, h d_v] (heads kv * G + g in order) @ [h d_v, d_model]
    return decode_product(
        o.reshape(B, -1), layer.params["W_o"], by_rows
    ).reshape(B, 1, -1)


def decode_product(x, W, by_rows):
    """``x [B, n] @ W [n, m]``. With ``by_rows``, one row and a C-ordered
    ``W``, made as ``y = sum_i x_i W[i, :]`` with :func:`numpy.einsum`:
    ``W``'s rows added into ``y`` one after the other, one read of ``W``
    front to back while ``y`` stays in the core's first-level cache.
    Otherwise BLAS's product, whose matrix-vector kernel reads several
    rows at a time. Which of the two streams a block's matrices faster
    depends on the machine's memory system (:func:`_by_rows` measures it
    once); with more threads, BLAS's product splits the rows between the
    cores, which one :func:`numpy.einsum` cannot."""
    if by_rows and x.shape[0] == 1 and W.flags.c_contiguous:
        return np.einsum("i,ij->j", x[0], W)[None]  # [1, m]
    return x @ W


def _by_rows(x, model) -> bool:
    """Whether the step of ``x [B, 1, d]`` makes its products row by row
    with :func:`numpy.einsum` (:func:`decode_product`): one row, one BLAS
    thread, and ``model.decode_by_rows``. Where that is None, it is set
    here, once: True where the row-by-row products of the first blocks'
    matrices (64 MiB or more: more than most CPUs' last-level cache, so
    that they come from memory, as in a step) took less time than
    BLAS's, in alternating rounds (:func:`_product_times`)."""
    if x.shape[0] != 1 or _thread_count() != 1:
        return False
    if model.decode_by_rows is None:
        t = _product_times(_first_matrices(model, 64 * 2**20))
        model.decode_by_rows = bool(t["row by row"] < t["BLAS"])
    return model.decode_by_rows


def _first_matrices(model, nbytes):
    """The matrices of a decode step's products in the first blocks of
    ``model``, block by block, until they hold ``nbytes`` or more."""
    out, held = [], 0
    for blk in model.blocks:
        a, f = blk.attn, blk.ffn
        for W in (a.packed_qkv, a.params["W_o"], f.packed_gate_up):
            if W is not None:
                out.append(W)
                held += W.nbytes
        out.append(f.params["W_down"])
        held += out[-1].nbytes
        if held >= nbytes:
            break
    return out


def _product_times(matrices, rounds=3):
    """``{"BLAS": s, "row by row": s}``: the median seconds over
    ``rounds`` alternating rounds (after one not counted) of ``x @ W``
    for every ``W`` of ``matrices``, made by :func:`decode_product` each
    way, ``x`` a row of ones."""
    xs = {W.shape[0]: np.ones((1, W.shape[0]), W.dtype) for W in matrices}
    times = {False: [], True: []}
    for _ in range(rounds + 1):
        for by_rows, t in times.items():
            start = time.perf_counter()
            for W in matrices:
                decode_product(xs[W.shape[0]], W, by_rows)
            t.append(time.perf_counter() - start)
    return {
        "BLAS": float(np.median(times[False][1:])),
        "row by row": float(np.median(times[True][1:])),
    }


def _swiglu(ffn, h, by_rows):
    """SwiGLU of ``h [B, 1, d]``: ``(silu(h W_gate) * h W_up) W_down``
    (SwiGLU's gate, :func:`~attn_np.ffn._gate_into`)."""
    f, packed = ffn.params, ffn.packed_gate_up
    if packed is None:
        return swiglu_step(h, f["W_gate"], f["W_up"], f["W_down"])
    # [B, d] @ [d, 2 d_ff]: the gate, then up
    ab = decode_product(h.reshape(h.shape[0], -1), packed, by_rows)
    n = f["W_gate"].shape[1]
    h_ff = _gate_into(ab[..., :n], ab[..., n:])  # silu(gate) * up
    # [B, d_ff] @ [d_ff, d] -> [B, 1, d]
    return decode_product(h_ff, f["W_down"], by_rows).reshape(h.shape)


def _decode_step(model, x, kv_cache):
    """The logits ``[B, 1, vocab]`` of the next token for ``x [B, 1, d]``
    (its embedding) over ``kv_cache``, each layer's cache one column
    longer (:func:`_fusable` must hold)."""
    tables = {}  # the step's RoPE tables, made once for all the layers
    rows = _by_rows(x, model)
    x = x.copy()  # the residual stream, added to in place
    with np.errstate(over="ignore", invalid="ignore"):  # checked below
        for blk, cache in zip(model.blocks, kv_cache.caches):
            h = _norm(x, blk.norm1)
            x += _attention(blk.attn, h, cache, tables, rows)
            x += _swiglu(blk.ffn, _norm(x, blk.norm2), rows)
        logits = _norm(x, model.norm_f) @ model.head_weight.T
    if not all_finite(logits):
        raise ValueError(
            "the decode step overflowed (inf or NaN in the logits) in "
            f"{np.dtype(model.dtype).name}: the weights or the input are "
            "too large for it"
        )
    return logits
