"""One decode step of chapter 14's model, its arithmetic written out once.

A decode step of SmolLM2 reads every weight once (some 540 MB in
float32) and does little arithmetic with each: its time should be those
bytes at the rate memory streams them. Through the layers, every one of
the thirty blocks also checks its input and its cache, builds its
rotation and its core's bookkeeping, and keeps what a backward would
need; at one token those steps cost about 150 us a block, a sixth of the
step. :func:`_decode_step` is the same step for one token over plain
caches (chapter 4's :class:`~attn_np.KVCache`), with the layers'
equations and weights and none of that:

    h = RMSNorm(x)                  (norm1's gain)
    q, k, v = h [W_q | W_k | W_v]   (the layer's packed projection)
    q, k turned by RoPE at the cache's length (the kept tables)
    k, v written into the cache's next column
    p = softmax(q K^T / sqrt(d))    (each group's G query heads stacked)
    x = x + (p V) W_o
    x = x + SwiGLU(RMSNorm(x))
    logits = RMSNorm(x) E^T

The model checks what enters once (the token ids, the cache), and the
logits once: a score or an output that overflowed shows there as a NaN
or inf, and is refused. ``tests/test_pretrained.py`` compares it with
the layers' own step (float64: to 1e-12; float32: to rounding).
"""

from __future__ import annotations

import numpy as np

from .._checks import all_finite, check_scale
from ..ffn import swiglu_step
from ..kv_cache import KVCache
from ..rope import _pairs
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
    """Chapter 5's RMSNorm of ``x [B, 1, d]`` with ``layer``'s gain: the
    numbers of :func:`~attn_np.norms.rmsnorm_step`."""
    ms = np.add.reduce(x * x, axis=-1, keepdims=True) / x.shape[-1]
    return x * (1.0 / np.sqrt(ms + layer.eps)) * layer.params["g"]


def _rotate(layer, t, position):
    """``t [B, heads, d]``, the heads of q and k side by side, turned by
    chapter 6's RoPE at ``position`` (the kept tables of
    :func:`~attn_np.rope.position_tables`, the arithmetic of
    :func:`~attn_np.rope.rope_step`), or None where the tables do not
    reach (the layer's own step then names what is wrong)."""
    r = layer.rotary
    if r is None:
        return t
    d = t.shape[-1]
    rd = d if r.rotary_dim is None else r.rotary_dim
    tables = _position_tables(r.base, r.layout, rd, position, t.dtype)
    if tables is None:
        return None
    cos_r, sin_r = tables[2][0], tables[3][0]  # [rd] each
    tr = t[..., :rd]
    swapped = np.empty(tr.shape, dtype=t.dtype)  # (a, b) -> (b, a)
    sa, sb = _pairs(swapped, r.layout, rd)
    ta, tb = _pairs(tr, r.layout, rd)
    sa[...], sb[...] = tb, ta
    swapped *= sin_r  # (-b sin, a sin)
    y = np.empty_like(t)
    y[..., rd:] = t[..., rd:]
    np.multiply(tr, cos_r, out=y[..., :rd])
    y[..., :rd] += swapped  # (a cos - b sin, a sin + b cos)
    return y


def _attention(layer, h, cache):
    """The attention half of a block for ``h [B, 1, d_model]`` (the
    normed input): ``[B, 1, d_model]``, the cache one column longer."""
    packed = layer.packed_qkv
    if packed is None:  # three matrices: the layer's own step
        return layer._decode_one(h, cache)
    B = h.shape[0]
    H, n_kv, d = layer.n_heads, layer.n_kv_heads, layer.d_k
    qkv = h.reshape(B, -1) @ packed  # [B, (H + 2 n_kv) d]
    qk = _rotate(layer, qkv[:, : (H + n_kv) * d].reshape(B, H + n_kv, d),
                 len(cache))  # fmt: skip
    if qk is None:
        return layer._decode_one(h, cache)
    k = qk[:, H:, None]  # [B, n_kv, 1, d]
    v = qkv[:, (H + n_kv) * d :].reshape(B, n_kv, 1, layer.d_v)
    K, V = cache.append_step(k, v)  # [B, n_kv, n, d], stored transposed
    q = qk[:, :H].reshape(B, n_kv, H // n_kv, d)  # heads kv * G + g
    # [B, n_kv, G, d] @ [B, n_kv, d, n] -> [B, n_kv, G, n]
    s = (q * check_scale(layer.scale, d)) @ K.swapaxes(-1, -2)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    # V^T [B, n_kv, d_v, n] @ P^T [B, n_kv, n, G] -> [B, n_kv, d_v, G]
    o = V.swapaxes(-1, -2) @ s.swapaxes(-1, -2)
    o = o.swapaxes(-1, -2).reshape(B, 1, -1)  # heads kv * G + g in order
    layer._att = None  # no weights kept: the layer's own forward keeps them
    return o @ layer.params["W_o"]  # [B, 1, h d_v] @ [h d_v, d_model]


def _swiglu(ffn, h):
    """SwiGLU of ``h [B, 1, d]``: ``(silu(h W_gate) * h W_up) W_down``,
    with ``silu(a) = a / (1 + e^-a)`` (an ``e^-a`` that overflows gives
    the limit 0; the step runs with overflow warnings off)."""
    f, packed = ffn.params, ffn.packed_gate_up
    if packed is None:
        return swiglu_step(h, f["W_gate"], f["W_up"], f["W_down"])
    ab = h @ packed  # [B, 1, 2 d_ff]: gate, then up
    n = f["W_gate"].shape[1]
    a, b = ab[..., :n], ab[..., n:]
    b *= a
    b /= 1.0 + np.exp(-a)
    return b @ f["W_down"]  # [B, 1, d_ff] @ [d_ff, d]


def _decode_step(model, x, kv_cache):
    """The logits ``[B, 1, vocab]`` of the next token for ``x [B, 1, d]``
    (its embedding) over ``kv_cache``, each layer's cache one column
    longer (:func:`_fusable` must hold)."""
    with np.errstate(over="ignore", invalid="ignore"):  # checked below
        for blk, cache in zip(model.blocks, kv_cache.caches):
            x = x + _attention(blk.attn, _norm(x, blk.norm1), cache)
            x = x + _swiglu(blk.ffn, _norm(x, blk.norm2))
        logits = _norm(x, model.norm_f) @ model.head_weight.T
    if not all_finite(logits):
        raise ValueError(
            "the decode step overflowed (inf or NaN in the logits) in "
            f"{np.dtype(model.dtype).name}: the weights or the input are "
            "too large for it"
        )
    return logits
