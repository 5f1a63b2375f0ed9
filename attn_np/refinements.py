"""What real attention layers add (chapter 10), each as a forward/backward
pair or a part, and the recipe that assembles chapter 3's layer from them.

==================  =================================  =============
detail              models                             here
==================  =================================  =============
projection biases   Qwen2 (q, k, v), gpt-oss (all 4)   ``linear_*``
QK-norm, per head   Qwen3 (w); Qwen3-Next, Gemma 3     ``qk_norm_*``
                    (1 + w)
QK-norm, whole      OLMo 2                             ``qk_norm_*``
projection
logit soft-cap      Gemma 2                            ``SoftCap``
scale override      Gemma 2/3 query_pre_attn_scalar    ``scale=``
output gate         Qwen3-Next (elementwise);          ``gate_*``
                    headwise (Qiu et al. 2025)
ALiBi               Falcon-RW, BLOOM, MPT              ``ALiBi``
rope base per       Gemma 3 (local 1e4, global 1e6)    ``rope_base=``
layer type
query temperature   Llama 4's NoPE layers              ``QueryTemperature``
narrower values     MiMo-V2-Flash (v_head_dim)         ``v_head_dim=``
==================  =================================  =============

The QK-norm pair lives in :mod:`attn_np.norms` (chapter 11's
parameter-free form is the same function) and the chunked rule in
:mod:`attn_np.masks`; both are importable from here.

The score modifications are *score mods*: objects with
``forward(s, ctx) -> (s2, saved)`` and ``backward(ds2, saved) -> ds``,
applied by the grouped core (:func:`~attn_np.grouped_attention_forward`)
to the scaled scores ``s = q k^T * scale`` before the mask and the
softmax. ``ctx`` is the core's :class:`~attn_np.grouped.ScoreContext`:
``q_positions [L_q]``, ``k_positions [L_k]``, ``n_kv_heads``,
``group_size`` (query head ``h = kv * G + g``) and ``allowed``, the mask
the softmax will apply.

Backward formulas (``dy`` the upstream gradient):

* linear ``y = x W + b``: ``dx = dy W^T``, ``dW = x^T dy``, ``db = sum dy``;
* soft-cap ``y = c tanh(s / c)``: ``ds = dy (1 - tanh(s / c)^2)``;
* QK-norm ``y = (a + w) * x r``, ``r = 1 / sqrt(mean(x^2) + eps)``:
  with ``u = dy (a + w)``, ``dx = r (u - x r^2 mean(u x))``,
  ``dw = sum dy x r``;
* gate ``y = o sigmoid(g)``: ``do = dy sigmoid(g)``,
  ``dg = dy o sigmoid(g) (1 - sigmoid(g))`` (summed over a head's features
  for the headwise gate);
* ALiBi ``s + m_h (j - i)``: ``ds = dy`` (the slopes are fixed);
* query temperature ``tau(i) s``: ``ds = dy tau(i)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import (
    all_finite,
    as_bool_array,
    as_float_array,
    check_backward_cache,
    check_count,
    check_finite,
    check_number,
    check_positive_number,
    check_upstream,
)
from ._refined_settings import _check_refined
from .heads import merge_groups, merge_heads, split_groups, split_heads
from .kv_cache import ChunkedKVCache
from .masks import ChunkedMask, chunked_mask, position_mask
from .multihead import GroupedQueryAttention
from .norms import qk_norm_backward, qk_norm_forward
from .rope_scaling import ScaledRotary, read_rope_scaling
from .softmax import sigmoid

# chapter 10's name of the chunked rule (one rule: attn_np.masks)
chunk_mask = chunked_mask


# ------------------------------------------------------------ projections
def linear_forward(x, W, b=None):
    """``y = x W + b`` with ``W [d_in, d_out]`` and an optional bias
    ``b [d_out]``; returns ``(y, cache)``."""
    x = as_float_array(x, "x", min_ndim=1)
    W = as_float_array(W, "W", min_ndim=2)
    named = [("x", x), ("W", W)]
    if b is not None:
        b = as_float_array(b, "b")
        named.append(("b", b))
    for name, a in named:
        check_finite(a, name)
    if W.ndim != 2 or x.shape[-1] != W.shape[0]:
        raise ValueError(
            f"W must have shape [d_in, d_out] with d_in = {x.shape[-1]} "
            f"(the last axis of x {x.shape}), got {W.shape}"
        )
    if b is not None and b.shape != W.shape[1:]:
        raise ValueError(
            f"b must have shape {W.shape[1:]} (d_out), got {b.shape}"
        )
    return _linear(x, W, b)


def _linear(x, W, b=None):
    """:func:`linear_forward` without its checks: the layers' weights and
    inputs are checked once, not at every projection."""
    y = x @ W  # [..., d_in] @ [d_in, d_out] -> [..., d_out]
    if b is not None:
        y = y + b
    return y, (x, W, b is not None)


def linear_backward(dy, cache):
    """``(dx, dW, db)``; ``db`` is None without a bias."""
    check_backward_cache(cache, tuple, "linear_forward", 3)
    x, W, has_bias = cache
    dy = check_upstream(
        dy, "dy", x.shape[:-1] + W.shape[1:], "the linear output"
    )
    dx = dy @ W.T  # [..., d_out] @ [d_out, d_in] -> [..., d_in]
    x2 = x.reshape(-1, x.shape[-1])  # [N, d_in]
    dW = x2.T @ dy.reshape(-1, dy.shape[-1])  # [d_in, d_out]
    db = dy.reshape(-1, dy.shape[-1]).sum(axis=0) if has_bias else None
    return dx, dW, db


# ------------------------------------------------------------ score mods
def softcap_forward(s, cap):
    """Gemma 2's logit soft-cap ``cap * tanh(s / cap)``; ``(y, cache)``.
    Scores that overflowed are refused: the cap would turn inf into a
    finite, wrong score."""
    s = as_float_array(s, "s")
    if not all_finite(s):
        raise ValueError(
            "s, the scores before the soft-cap, overflowed (inf or NaN) in "
            f"{s.dtype}: scale the queries and keys down"
            + (", or use float64" if s.dtype != np.float64 else "")
        )
    th = np.tanh(s / cap)
    return cap * th, th


def softcap_backward(dy, th):
    """``ds = dy (1 - tanh(s / cap)^2)``: 1 near 0, vanishing at the cap."""
    dy = check_upstream(dy, "dy", np.shape(th), "the soft-capped scores")
    return dy * (1.0 - th * th)


class SoftCap:
    """Score mod for :func:`softcap_forward` (Gemma 2,
    ``attn_logit_softcapping``)."""

    params: dict = {}

    def __init__(self, cap):
        self.cap = check_positive_number(cap, "cap")

    def forward(self, s, ctx):
        return softcap_forward(s, self.cap)

    def backward(self, ds2, saved):
        return softcap_backward(ds2, saved)

    def __repr__(self):
        return f"SoftCap({self.cap})"


def alibi_slopes(n_heads):
    """Press et al.'s head slopes: ``2^(-8h/n)`` for ``h = 1 ... n`` when
    ``n`` is a power of two; otherwise those of the next lower power ``p``
    and every other slope of ``2p`` (BLOOM's and Falcon's
    ``build_alibi_tensor``). ``[n_heads]``."""
    if isinstance(n_heads, bool) or not isinstance(
        n_heads, (int, np.integer)
    ):
        raise TypeError(f"n_heads must be an int, got {n_heads!r}")
    if n_heads < 1:
        raise ValueError(f"n_heads must be positive, got {n_heads}")
    p = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = 2.0 ** (-8.0 * np.arange(1, p + 1) / p)
    if p < n_heads:
        extra = 2.0 ** (-4.0 * np.arange(1, 2 * (n_heads - p), 2) / p)
        slopes = np.concatenate([slopes, extra])
    return slopes


class ALiBi:
    """Score mod ``s + m_h (j - i)``: a per-head linear penalty on
    distance (Press et al. 2022). Adding ``m_h j`` instead (HF's Falcon and
    BLOOM) differs by ``m_h i``, a constant per row, which the softmax
    removes. ``slopes [n_heads]`` in query-head order."""

    params: dict = {}

    def __init__(self, slopes):
        a = as_float_array(slopes, "slopes").astype(np.float64)
        if a.ndim != 1 or not a.size or not np.isfinite(a).all():
            raise ValueError(
                "slopes must be a 1-D array of finite numbers [n_heads], "
                f"got shape {a.shape}: {a.tolist()!r:.60}"
            )
        self.slopes = a

    def forward(self, s, ctx):
        n_kv, G = ctx.n_kv_heads, ctx.group_size
        if self.slopes.size != n_kv * G:
            raise ValueError(
                f"ALiBi has {self.slopes.size} slopes, the layer "
                f"{n_kv * G} query heads"
            )
        i = np.asarray(ctx.q_positions)[:, None]  # [L_q, 1]
        j = np.asarray(ctx.k_positions)[None, :]  # [1, L_k]
        m = self.slopes.reshape(n_kv, G, 1, 1)  # [n_kv, G, 1, 1]
        return s + m * (j - i), None  # [..., n_kv, G, L_q, L_k]

    def backward(self, ds2, saved):
        return ds2

    def __repr__(self):
        return f"ALiBi({np.round(self.slopes, 4).tolist()})"


# ------------------------------------------------- query temperature
@dataclass
class TemperatureCache:
    scale: np.ndarray  # [L, 1]: the factor on each query row


def query_temperature(
    positions, *, floor_scale=8192.0, attn_scale=0.1, offset=1
):
    """Llama 4's inference-time temperature for NoPE layers, ``[L]``:
    ``1 + attn_scale ln(floor((p + offset) / floor_scale) + 1)``. It is 1
    for the first ``floor_scale - offset`` positions. Llama 4 counts from
    ``p + 1`` (``offset=1``); Ministral 3's ``llama_4_scaling_beta``
    (``attn_scale``) over ``original_max_position_embeddings``
    (``floor_scale``) counts from ``p`` (``offset=0``), on every layer."""
    floor_scale = check_positive_number(floor_scale, "floor_scale")
    attn_scale = check_number(attn_scale, "attn_scale")
    if offset not in (0, 1) or isinstance(offset, bool):
        raise ValueError(f"offset must be 0 or 1, got {offset!r}")
    p = np.asarray(positions)
    if (
        p.ndim != 1
        or p.dtype == np.bool_
        or not np.issubdtype(p.dtype, np.integer)
        or (p.size and p.min() < 0)
    ):
        raise ValueError(
            "positions must be a 1-D array of non-negative integer "
            f"positions, got {p.dtype} of shape {p.shape}"
            + (
                f" with minimum {p.min()}"
                if p.size and p.ndim and p.dtype.kind in "iu"
                else ""
            )
        )
    p = p.astype(np.float64) + offset
    return 1.0 + attn_scale * np.log(np.floor(p / floor_scale) + 1.0)


def query_temperature_forward(
    q, positions, *, floor_scale=8192.0, attn_scale=0.1, offset=1
):
    """``q [..., L, d]`` times the temperature of each row's position;
    ``(q2, cache)``."""
    q = as_float_array(q, "q", min_ndim=2)
    if not all_finite(q):  # two reductions; the scores of a layer too
        check_finite(q, "q")
    t = query_temperature(
        positions,
        floor_scale=floor_scale,
        attn_scale=attn_scale,
        offset=offset,
    )
    if t.shape != (q.shape[-2],):
        raise ValueError(
            f"positions must have shape ({q.shape[-2]},) to match q "
            f"{q.shape}, got {np.shape(positions)}"
        )
    scale = t[:, None].astype(q.dtype)  # [L, 1]
    return q * scale, TemperatureCache(scale)  # [..., L, d] * [L, 1]


def query_temperature_backward(dq2, cache: TemperatureCache):
    """``dq = dq2 * t``: a constant per row."""
    check_backward_cache(
        cache, TemperatureCache, "query_temperature_forward"
    )
    dq2 = as_float_array(dq2, "dq2", min_ndim=2)
    check_finite(dq2, "dq2")
    if dq2.shape[-2:-1] != cache.scale.shape[:1]:
        raise ValueError(
            f"dq2 must have {cache.scale.shape[0]} rows (one per position"
            f" of the forward), got shape {dq2.shape}"
        )
    return dq2 * cache.scale


@dataclass(frozen=True)
class QueryTemperature:
    """Llama 4's query temperature as a score mod: the scores are linear
    in ``q``, so ``tau(p) q`` is ``tau(p)`` times row ``p`` of ``S``
    (:func:`query_temperature_forward` on the rows of ``S``)."""

    floor_scale: float = 8192.0
    attn_scale: float = 0.1
    offset: int = 1

    def forward(self, s, ctx):
        # [B, n_kv, G, L_q, L_k] * [L_q, 1]
        return query_temperature_forward(
            s,
            ctx.q_positions,
            floor_scale=self.floor_scale,
            attn_scale=self.attn_scale,
            offset=self.offset,
        )

    def backward(self, ds2, saved):
        return query_temperature_backward(ds2, saved)


# ------------------------------------------------------------ output gate
def gate_forward(o, g):
    """``y = o * sigmoid(g)``; ``g`` has o's shape (elementwise, Qwen3-Next)
    or ``[..., n_heads, 1]`` against ``o [..., n_heads, d]`` (headwise)."""
    o = as_float_array(o, "o", min_ndim=1)
    g = as_float_array(g, "g", min_ndim=1)
    check_finite(o, "o")
    check_finite(g, "g")
    if g.shape != o.shape and g.shape != o.shape[:-1] + (1,):
        raise ValueError(
            f"g must have the shape of o {o.shape} (elementwise) or "
            f"{o.shape[:-1] + (1,)} (headwise), got {g.shape}"
        )
    return _gate(o, g)


def _gate(o, g):
    """:func:`gate_forward` without its checks (the layer's)."""
    sg = sigmoid(g)
    return o * sg, (o, sg)


def gate_backward(dy, cache):
    """``(do, dg)``; ``dg`` summed to g's shape."""
    check_backward_cache(cache, tuple, "gate_forward", 2)
    o, sg = cache
    dy = check_upstream(dy, "dy", o.shape, "the gated output")
    do = dy * sg
    dg = dy * o * sg * (1.0 - sg)
    if dg.shape != sg.shape:
        dg = dg.sum(axis=-1, keepdims=True)
    return do, dg


# ------------------------------------------------------------ attention
class MaxLogit:
    """A score mod that changes nothing and keeps the largest ``|s|``
    over the entries ``allowed`` (``[L_q, L_k]``; None: the mask the core
    applies, ``ctx.allowed``): what QK-norm bounds."""

    def __init__(self, allowed=None):
        if allowed is not None:
            allowed = as_bool_array(allowed, "allowed")
        self.allowed, self.value = allowed, None

    def forward(self, s, ctx):
        allowed = ctx.allowed if self.allowed is None else self.allowed
        kept = s if allowed is None else np.where(allowed, s, 0.0)
        self.value = float(np.abs(kept).max()) if kept.size else 0.0
        return s, None

    def backward(self, ds2, saved):
        return ds2


# ------------------------------------------------------ the step parts
@dataclass(frozen=True)
class Projection:
    """The project step as a part: ``x W + b`` for q, k and v (a bias
    ``b_q``, ``b_k``, ``b_v`` for each name in ``biases``), then QK-norm
    before RoPE (``qk_norm``: ``"head"`` per head, ``"proj"`` over the
    whole projection, gain ``offset + w``; ``w`` the parameters
    ``q_norm`` and ``k_norm`` when ``learned``, else none), then with
    ``clip`` each of q, k and v clamped to ``[-clip, clip]`` (OLMo's
    ``clip_qkv``; its gradient passes where the value was kept and is 0
    where it was clamped). The protocol
    of a step part: ``add_params(layer, rng)``, ``forward(layer, x3) ->
    (q, k, v, saved)``, ``backward(layer, x3, g, saved) -> dx`` (it fills
    ``layer.grads``)."""

    biases: tuple = ()
    qk_norm: str | None = None
    offset: float = 0.0
    learned: bool = True
    eps: float = 1e-6
    clip: float | None = None

    def add_params(self, layer, rng):
        p, dtype = layer.params, layer.dtype
        n_kv, d_k = layer.n_kv_heads, layer.d_k
        sizes = {"q": layer.n_heads * d_k, "k": n_kv * d_k}
        sizes["v"] = n_kv * layer.d_v
        for name in self.biases:
            p[f"b_{name}"] = np.zeros(sizes[name], dtype)
        if self.qk_norm and self.learned:
            whole = self.qk_norm == "proj"
            init = 0.0 if self.offset else 1.0
            p["q_norm"] = np.full(sizes["q"] if whole else d_k, init, dtype)
            p["k_norm"] = np.full(sizes["k"] if whole else d_k, init, dtype)

    @property
    def kv_params(self) -> tuple:
        """Its parameters with a key/value head axis."""
        names = tuple(f"b_{n}" for n in self.biases if n in "kv")
        if self.qk_norm == "proj" and self.learned:  # a gain per feature
            names += ("k_norm",)
        return names

    def forward(self, layer, x3):
        """``x [B, L, d_model]`` -> ``q [B, n_kv, G, L, d_k]``, ``k, v
        [B, n_kv, L, d]`` and what the backward needs."""
        saved, (B, L), n_kv = {}, x3.shape[:2], layer.n_kv_heads
        t = self.linears(layer, x3, saved)  # [B, L, heads * d] each
        self.norms(layer, t, saved, B, L)
        if self.clip is not None:  # [B, L, heads * d], after the norms
            c = self.clip
            for n in ("q", "k", "v"):
                saved[f"{n}_kept"] = np.abs(t[n]) <= c  # slope 1 there
                t[n] = np.clip(t[n], -c, c)
        q = split_groups(t["q"], n_kv, layer.group_size, layer.d_k)
        k = split_heads(t["k"], n_kv, layer.d_k)
        return q, k, split_heads(t["v"], n_kv, layer.d_v), saved

    def linears(self, layer, x3, saved):
        """``{"q", "k", "v"}``: ``x W + b`` each, ``[B, L, heads * d]``."""
        P, t = layer.params, {}
        for n in ("q", "k", "v"):  # [B, L, d_model] -> [B, L, heads * d]
            t[n], saved[n] = _linear(x3, P[f"W_{n}"], P.get(f"b_{n}"))
        return t

    def norms(self, layer, t, saved, B, L):
        """QK-norm on ``t["q"]`` and ``t["k"]``, in place of them."""
        P = layer.params
        for n, heads in (("q", layer.n_heads), ("k", layer.n_kv_heads)):
            if self.qk_norm:  # [B, L, heads, d] or [B, L, heads * d]
                shape = (B, L, heads, -1) if self.qk_norm == "head" else None
                y, saved[f"{n}n"] = qk_norm_forward(
                    t[n] if shape is None else t[n].reshape(shape),
                    P.get(f"{n}_norm"),
                    eps=self.eps,
                    offset=self.offset,
                )
                t[n] = y.reshape(B, L, -1)

    def backward(self, layer, x3, g, saved):
        """``dx``; fills ``dW``, ``db`` and the norms' gains."""
        d = {
            "q": merge_groups(g.pop("q")),  # [B, L, h * d_k]
            "k": merge_heads(g.pop("k")),  # [B, L, n_kv * d_k]
            "v": merge_heads(g.pop("v")),
        }
        for n in ("q", "k", "v"):  # 0 where clamped
            if f"{n}_kept" in saved:
                d[n] = np.where(saved[f"{n}_kept"], d[n], 0.0)
        for n in ("q", "k", "v"):  # back through each norm there was
            if f"{n}n" in saved:
                c = saved[f"{n}n"]
                dt, dw = qk_norm_backward(d[n].reshape(c[0].shape), c)
                d[n] = dt.reshape(d[n].shape)
                if dw is not None:
                    layer.grads[f"{n}_norm"] = dw
        return self.linears_backward(layer, d, saved)

    def linears_backward(self, layer, d, saved):
        """``dx`` from the projections' gradients ``d``; fills ``dW``,
        ``db``."""
        grads, dx = layer.grads, 0.0
        for n, dn in d.items():
            dxi, grads[f"W_{n}"], db = linear_backward(dn, saved[n])
            if db is not None:
                grads[f"b_{n}"] = db
            dx = dx + dxi
        return dx


@dataclass(frozen=True)
class GatedOutput:
    """The output step as a part: the heads' output times ``sigmoid(x
    W_g)`` (``gate``: ``"elementwise"``, ``W_g [d_model, h d_v]``, or
    ``"headwise"``, ``[d_model, h]``; None: no gate), then ``W_o`` and,
    with ``bias``, ``b_o``. ``forward(layer, o, x3) -> (y, saved)``,
    ``backward(layer, dy3, saved) -> (do, dx)``. The nonlinearity is the
    pair :meth:`activate` and :meth:`activate_backward`, which a variant
    of the gate overrides."""

    gate: str | None = None
    bias: bool = False

    def activate(self, layer, o4, g4):
        """``(o * sigmoid(g), cache)`` (:func:`gate_forward`), ``o4 [B, L,
        h, d_v]``, ``g4 [B, L, h, d_v or 1]``."""
        return _gate(o4, g4)

    def activate_backward(self, layer, do4, cache):
        """``(do, dg)`` (:func:`gate_backward`)."""
        return gate_backward(do4, cache)

    def add_params(self, layer, rng):
        p, d_model = layer.params, layer.d_model
        if self.bias:
            p["b_o"] = np.zeros(d_model, layer.dtype)
        if self.gate:
            h = layer.n_heads
            n_g = h * layer.d_v if self.gate == "elementwise" else h
            w = rng.standard_normal((d_model, n_g)) / math.sqrt(d_model)
            p["W_g"] = w.astype(layer.dtype)

    def forward(self, layer, o, x3):
        P, (B, L), h = layer.params, x3.shape[:2], layer.n_heads
        gate = None
        o = merge_groups(o)  # [B, L, h * d_v]
        if self.gate:  # [B, L, h, d_v] * [B, L, h, d_v or 1]
            g, lin = _linear(x3, P["W_g"])
            o4, gc = self.activate(
                layer, o.reshape(B, L, h, -1), g.reshape(B, L, h, -1)
            )
            gate, o = (lin, gc), o4.reshape(B, L, -1)
        y, out = _linear(o, P["W_o"], P.get("b_o"))  # [B, L, d_model]
        return y, (out, gate)

    def backward(self, layer, dy3, saved):
        out, gate = saved
        grads = layer.grads
        do, grads["W_o"], db = linear_backward(dy3, out)  # [B, L, h*d_v]
        if db is not None:
            grads["b_o"] = db
        dx = None
        if gate is not None:
            lin, gc = gate
            B, L = dy3.shape[:2]
            do4 = do.reshape(B, L, layer.n_heads, -1)
            do, dg = self.activate_backward(layer, do4, gc)
            dx, grads["W_g"], _ = linear_backward(dg.reshape(B, L, -1), lin)
            do = do.reshape(B, L, -1)
        G, d_v = layer.group_size, layer.d_v
        return split_groups(do, layer.n_kv_heads, G, d_v), dx


# ------------------------------------------------------------ the layer
def _check_sizes(
    d_model, n_heads, n_kv_heads, head_dim, score_mods, window, chunk
):
    """RefinedAttention's sizes (defaults filled in), its score mods a
    sequence, and a window or chunks, not both."""
    d_model = check_count(d_model, "d_model")
    n_heads = check_count(n_heads, "n_heads")
    n_kv_heads = (
        n_heads
        if n_kv_heads is None
        else check_count(n_kv_heads, "n_kv_heads")
    )
    head_dim = (
        d_model // n_heads
        if head_dim is None
        else check_count(head_dim, "head_dim")
    )
    if not isinstance(score_mods, (tuple, list)):
        raise TypeError(
            "score_mods must be a tuple of score mods, got "
            f"{type(score_mods).__name__}"
        )
    if window is not None and chunk is not None:
        raise ValueError(
            "pass window= (a sliding window) or chunk= (Llama 4's "
            f"chunks), not both: got window={window!r} and chunk={chunk!r}"
        )
    return d_model, n_heads, n_kv_heads, head_dim


class RefinedAttention(GroupedQueryAttention):
    """Chapter 3's layer with the details of released layers: a recipe
    that assembles the one layer (:class:`~attn_np.GroupedQueryAttention`)
    from parts, with today's keywords. Its parts:

    * position (``rotary``): :class:`~attn_np.rope_scaling.ScaledRotary`,
      RoPE with the layer's base, dimension, layout and linear factor or
      ``rope_scaling`` (chapter 11: llama3, YaRN, ...), or NoPE; then
      Llama 4's post-RoPE norm;
    * projection: :class:`Projection`, ``x W + b`` for q, k and v, then
      QK-norm (per head or over the whole projection) before RoPE, then
      OLMo's clamp of q, k and v to ``[-clip_qkv, clip_qkv]``;
    * mask rule (``chunk``): :class:`~attn_np.masks.ChunkedMask`; the
      window and the sinks are chapter 8's;
    * score mods: Llama 4's :class:`QueryTemperature`, the caller's
      (:class:`SoftCap`, :class:`ALiBi`) and a :class:`MaxLogit` watch;
      the ``scale``;
    * output: :class:`GatedOutput`, the gate, ``W_o`` and ``b_o``.

    ``v_head_dim`` (None: ``head_dim``) is the width of a value head
    (MiMo-V2-Flash's are narrower than its key heads): ``W_v [d_model,
    n_kv v_head_dim]``, ``W_o [H v_head_dim, d_model]``.

    Extra ``params`` where enabled: ``b_q``, ``b_k``, ``b_v``, ``b_o``,
    ``q_norm``, ``k_norm``, ``W_g [d_model, H d]`` (elementwise) or
    ``[d_model, H]`` (headwise). Always causal: a decoder layer (the only
    step it overrides is the forward's check of that).
    """

    rebuilds_from_options = True

    def __init__(
        self,
        d_model,
        n_heads,
        n_kv_heads=None,
        head_dim=None,
        *,
        v_head_dim=None,
        biases=(),
        qk_norm=None,
        qk_norm_offset=0.0,
        qk_norm_learned=True,
        qk_norm_after_rope=False,
        norm_eps=1e-6,
        clip_qkv=None,
        scale=None,
        score_mods=(),
        gate=None,
        sinks=False,
        window=None,
        chunk=None,
        rope_base=10000.0,
        rotary_dim=None,
        rope_layout="half",
        rope_factor=1.0,
        rope_scaling=None,
        use_rope=True,
        query_temperature=None,
        seed=0,
        dtype=np.float64,
    ):
        d_model, n_heads, n_kv_heads, head_dim = _check_sizes(
            d_model, n_heads, n_kv_heads, head_dim, score_mods, window, chunk
        )
        v = v_head_dim
        d_v = head_dim if v is None else check_count(v, "v_head_dim")
        kw = _checked(
            biases=biases,
            qk_norm=qk_norm,
            qk_norm_offset=qk_norm_offset,
            qk_norm_learned=qk_norm_learned,
            qk_norm_after_rope=qk_norm_after_rope,
            norm_eps=norm_eps,
            clip_qkv=clip_qkv,
            gate=gate,
            chunk=chunk,
            rope_base=rope_base,
            rope_factor=rope_factor,
            rope_scaling=rope_scaling,
            use_rope=use_rope,
            query_temperature=query_temperature,
        )
        vars(self).update(kw)  # the settings the steps and parts read
        self.n_kv, self.d = n_kv_heads, head_dim
        temp = query_temperature
        self._temp = None if temp is None else QueryTemperature(*temp)
        self._watch = MaxLogit()
        super().__init__(
            d_model,
            n_heads,
            n_kv_heads,
            d_k=head_dim,
            d_v=d_v,
            seed=seed,
            dtype=dtype,
            rope_base=rope_base,
            rope_layout=rope_layout,
            rope_dim=rotary_dim,
            window=window,
            sinks=sinks,
            mask_rule=None if chunk is None else ChunkedMask(chunk),
            score_mods=(
                *(() if temp is None else (self._temp,)),
                *score_mods,
                self._watch,
            ),
            scale=head_dim**-0.5 if scale is None else scale,
            **self._step_parts(),
        )
        self.G = self.group_size

    def _step_parts(self) -> dict:
        """The parts of the project and output steps, from the settings:
        biases and QK-norm (before RoPE), then the gate and ``b_o``."""
        return {
            "projection": Projection(
                tuple(b for b in self.biases if b != "o"),
                None if self.qk_norm_after_rope else self.qk_norm,
                self.qk_norm_offset,
                self.qk_norm_learned,
                self.norm_eps,
                self.clip_qkv,
            ),
            "out_projection": GatedOutput(self.gate, "o" in self.biases),
        }

    @property
    def options(self) -> dict:
        """The keywords that rebuild this layer's kind (not its weights)."""
        return {
            "head_dim": self.d,
            "v_head_dim": self.d_v,
            "biases": self.biases,
            "qk_norm": self.qk_norm,
            "qk_norm_offset": self.qk_norm_offset,
            "qk_norm_learned": self.qk_norm_learned,
            "qk_norm_after_rope": self.qk_norm_after_rope,
            "norm_eps": self.norm_eps,
            "clip_qkv": self.clip_qkv,
            "scale": self.scale,
            "score_mods": self._mods,
            "gate": self.gate,
            "sinks": "sinks" in self.params,
            "window": self.window,
            "chunk": self.chunk,
            "rope_base": self.rope_base,
            "rotary_dim": self.rope_dim,
            "rope_layout": self.rope_layout,
            "rope_factor": self.rope_factor,
            "rope_scaling": self.rope_scaling,
            "use_rope": self.use_rope,
            "query_temperature": self.query_temperature,
            "dtype": self.dtype,
        }

    @property
    def _mods(self) -> tuple:
        """The score mods the caller gave (not the temperature part or
        the watch the layer adds)."""
        made = (self._temp, self._watch)
        return tuple(m for m in self.score_mods if m not in made)

    @property
    def rotary_dim(self):
        return self.rope_dim

    @property
    def rotary(self):
        """The position part (:class:`~attn_np.rope_scaling.ScaledRotary`,
        made from the settings each time), or None when it does
        nothing."""
        after = bool(self.qk_norm and self.qk_norm_after_rope)
        rotate = bool(self.use_rope and self.rope_base)
        if not (rotate or after):
            return None
        scaling = self.rope_scaling
        if scaling is None and self.rope_factor != 1.0:  # linear
            scaling = {"rope_type": "linear", "factor": self.rope_factor}
        return ScaledRotary(
            self.rope_base or 10000.0,  # not read when nothing rotates
            self.rope_layout,
            self.rope_dim,
            rope_scaling=scaling,
            use_rope=rotate,
            qk_norm=after,
            qk_norm_eps=self.norm_eps,
        )

    def temperature(self, positions):
        """Llama 4's NoPE query scale ``1 + a log(1 + floor((i + c) /
        f))``, ``[L, 1]`` (:func:`query_temperature`), or None."""
        if self.query_temperature is None:
            return None
        floor_scale, attn_scale, offset = self.query_temperature
        t = query_temperature(
            np.asarray(positions),
            floor_scale=floor_scale,
            attn_scale=attn_scale,
            offset=offset,
        )
        return t[:, None]

    def mask(self, q_pos, k_pos):
        """``[L_q, L_k]`` from positions: chapter 8's rule and the mask
        rule (the chunks)."""
        allowed = position_mask(q_pos, k_pos, window=self.window)
        if self.mask_rule is not None:
            allowed &= self.mask_rule(q_pos, k_pos)
        return allowed

    @property
    def max_logit(self):
        """The largest ``|score|`` (after score mods) of the last forward."""
        return self._watch.value

    def new_cache(self):
        """An empty cache for this layer (keys after RoPE, and values):
        rolling, holding only the window, for a window layer; holding
        only the current chunk (:class:`~attn_np.kv_cache.ChunkedKVCache`)
        for a chunked one."""
        if self.chunk is None:
            return super().new_cache()
        return ChunkedKVCache(self.chunk)

    # ---------------------------------------------------------- steps
    def forward(self, x, *, causal=True, mask=None, kv_cache=None):
        """``x [B, L, d_model]`` at positions ``len(kv_cache) ...``."""
        if not causal or mask is not None:
            raise ValueError(
                "RefinedAttention is a decoder layer: causal=True and no "
                "mask (its masks come from positions)"
            )
        return super().forward(x, causal=True, kv_cache=kv_cache)

    def __repr__(self):
        extras = [
            f"{k}={v!r}"
            for k, v in (
                ("biases", self.biases),
                ("qk_norm", self.qk_norm),
                ("gate", self.gate),
                ("window", self.window),
                ("chunk", self.chunk),
                ("score_mods", self._mods),
            )
            if v
        ]
        return (
            f"RefinedAttention(d_model={self.d_model}, n_heads="
            f"{self.n_heads}, n_kv_heads={self.n_kv}, head_dim={self.d}"
            + (f", v_head_dim={self.d_v}" if self.d_v != self.d else "")
            + "".join(", " + e for e in extras)
            + ")"
        )


def _checked(**kw):
    """The settings checked (:func:`~attn_np._refined_settings.
    _check_refined`), then the RoPE scaling read."""
    return _check_refined_rope(_check_refined(**kw))


def _check_refined_rope(kw):
    scaling = kw.pop("rope_scaling")
    if scaling is not None:
        if kw["rope_factor"] != 1.0:
            raise ValueError(
                "pass rope_factor (linear scaling) or rope_scaling, not "
                f"both: got {kw['rope_factor']} and {scaling!r}"
            )
        if kw["rope_base"] is None:
            raise ValueError(
                "rope_scaling needs rope_base (a layer without RoPE has "
                "nothing to scale)"
            )
        scaling = read_rope_scaling(scaling)
    kw["rope_scaling"] = scaling
    del kw["rope_base"]  # the layer's own (chapter 6)
    return kw
