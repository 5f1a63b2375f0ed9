"""What real attention layers add (chapter 10), each as a forward/backward
pair, and a layer that composes them.

==================  =================================  =============
detail              models                             here
==================  =================================  =============
projection biases   Qwen2 (q, k, v), gpt-oss (all 4)   ``linear_*``
QK-norm, per head   Qwen3, Qwen3-Next, Gemma 3 (1+w)   ``qk_norm_*``
QK-norm, whole      OLMo 2                             ``qk_norm_*``
projection
logit soft-cap      Gemma 2                            ``SoftCap``
scale override      Gemma 2/3 query_pre_attn_scalar    ``scale=``
output gate         Qwen3-Next (elementwise);          ``gate_*``
                    headwise (Qiu et al. 2025)
ALiBi               Falcon-RW, BLOOM, MPT              ``ALiBi``
rope base per       Gemma 3 (local 1e4, global 1e6)    ``rope_base=``
layer type
==================  =================================  =============

The score modifications are *score mods*: objects with
``forward(s, ctx) -> (s2, saved)`` and ``backward(ds2, saved) -> ds``,
applied by the grouped core (:func:`~attn_np.grouped_attention_forward`)
to the scaled scores ``s = q k^T * scale`` before the mask and the
softmax. ``ctx`` is the core's :class:`~attn_np.grouped.ScoreContext`:
``q_positions [L_q]``, ``k_positions [L_k]``, ``n_kv_heads`` and
``group_size`` (query head ``h = kv * G + g``).

Backward formulas (``dy`` the upstream gradient):

* linear ``y = x W + b``: ``dx = dy W^T``, ``dW = x^T dy``, ``db = sum dy``;
* soft-cap ``y = c tanh(s / c)``: ``ds = dy (1 - tanh(s / c)^2)``;
* QK-norm ``y = (a + w) * x r``, ``r = 1 / sqrt(mean(x^2) + eps)``:
  with ``u = dy (a + w)``, ``dx = r (u - x r^2 mean(u x))``,
  ``dw = sum dy x r``;
* gate ``y = o sigmoid(g)``: ``do = dy sigmoid(g)``,
  ``dg = dy o sigmoid(g) (1 - sigmoid(g))`` (summed over a head's features
  for the headwise gate);
* ALiBi ``s + m_h (j - i)``: ``ds = dy`` (the slopes are fixed).
"""

from __future__ import annotations

import math

import numpy as np

from .grouped import grouped_attention_backward, grouped_attention_forward
from .kv_cache import KVCache
from .masks import position_mask
from .rope import (
    RopeCache,
    rope_backward,
    rope_forward,
    rope_frequencies,
    rotate_pairs,
)


# ------------------------------------------------------------ projections
def linear_forward(x, W, b=None):
    """``y = x W + b`` with ``W [d_in, d_out]`` and an optional bias
    ``b [d_out]``; returns ``(y, cache)``."""
    y = x @ W  # [..., d_in] @ [d_in, d_out] -> [..., d_out]
    if b is not None:
        y = y + b
    return y, (x, W, b is not None)


def linear_backward(dy, cache):
    """``(dx, dW, db)``; ``db`` is None without a bias."""
    x, W, has_bias = cache
    dx = dy @ W.T  # [..., d_out] @ [d_out, d_in] -> [..., d_in]
    x2 = x.reshape(-1, x.shape[-1])  # [N, d_in]
    dW = x2.T @ dy.reshape(-1, dy.shape[-1])  # [d_in, d_out]
    db = dy.reshape(-1, dy.shape[-1]).sum(axis=0) if has_bias else None
    return dx, dW, db


# ------------------------------------------------------------ QK-norm
def qk_norm_forward(t, w=None, *, eps=1e-6, offset=0.0):
    """RMSNorm over the last axis with gain ``offset + w``.

    ``offset=1`` is Gemma's form (``w`` starts at 0); ``w=None`` is the
    parameter-free form (Llama 4's L2Norm, ``y = x r``). Apply it to
    ``[..., n_heads, d_head]`` for the per-head form (Qwen3, Gemma 3) or to
    ``[..., n_heads * d_head]`` before the head split (OLMo 2).
    """
    r = 1.0 / np.sqrt(np.mean(t * t, axis=-1, keepdims=True) + eps)
    g = 1.0 if w is None else offset + w  # 1 or [d]
    return t * r * g, (t, r, g, w is not None)


def qk_norm_backward(dy, cache):
    """``(dt, dw)``; ``dw`` is None for the parameter-free form."""
    t, r, g, learned = cache
    u = dy * g
    dt = r * (u - t * (r * r) * np.mean(u * t, axis=-1, keepdims=True))
    dw = (
        (dy * t * r).reshape(-1, t.shape[-1]).sum(axis=0)
        if learned
        else None
    )
    return dt, dw


# ------------------------------------------------------------ score mods
def softcap_forward(s, cap):
    """Gemma 2's logit soft-cap ``cap * tanh(s / cap)``; ``(y, cache)``."""
    th = np.tanh(s / cap)
    return cap * th, th


def softcap_backward(dy, th):
    """``ds = dy (1 - tanh(s / cap)^2)``: 1 near 0, vanishing at the cap."""
    return dy * (1.0 - th * th)


class SoftCap:
    """Score mod for :func:`softcap_forward` (Gemma 2,
    ``attn_logit_softcapping``)."""

    params: dict = {}

    def __init__(self, cap):
        cap = float(cap)
        if not cap > 0 or not math.isfinite(cap):
            raise ValueError(f"cap must be a positive number, got {cap}")
        self.cap = cap

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
        self.slopes = np.asarray(slopes, dtype=np.float64).reshape(-1)

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


# ------------------------------------------------------------ output gate
def gate_forward(o, g):
    """``y = o * sigmoid(g)``; ``g`` has o's shape (elementwise, Qwen3-Next)
    or ``[..., n_heads, 1]`` against ``o [..., n_heads, d]`` (headwise)."""
    sg = 1.0 / (1.0 + np.exp(-g))
    return o * sg, (o, sg)


def gate_backward(dy, cache):
    """``(do, dg)``; ``dg`` summed to g's shape."""
    o, sg = cache
    do = dy * sg
    dg = dy * o * sg * (1.0 - sg)
    if dg.shape != sg.shape:
        dg = dg.sum(axis=-1, keepdims=True)
    return do, dg


# ------------------------------------------------------------ attention
class MaxLogit:
    """A score mod that changes nothing and keeps the largest ``|s|``
    over the entries ``allowed`` (``[L_q, L_k]``): what QK-norm bounds."""

    def __init__(self, allowed):
        self.allowed, self.value = allowed, None

    def forward(self, s, ctx):
        self.value = float(np.abs(np.where(self.allowed, s, 0.0)).max())
        return s, None

    def backward(self, ds2, saved):
        return ds2


def chunk_mask(q_positions, k_positions, chunk):
    """Llama 4's chunked attention: ``floor(i/C) == floor(j/C)`` and
    ``j <= i`` (a query sees only its own chunk)."""
    i = np.asarray(q_positions)[:, None]
    j = np.asarray(k_positions)[None, :]
    return (j <= i) & (i // chunk == j // chunk)


# ------------------------------------------------------------ the layer
class RefinedAttention:
    """Grouped-query attention with the details of released layers.

    Steps, each with a backward twin: project (``x W + b`` for q, k, v and
    the gate), QK-norm (per head or over the projection, before RoPE or,
    Llama 4, after), position (RoPE with its own base, rotary dimension
    and layout, or none: a NoPE layer, with Llama 4's query temperature),
    attend (scale, score mods, window or chunk, sinks), gate, output
    (``W_o``, ``b_o``).

    ``params`` keys: ``W_q [d_model, H d]``, ``W_k``, ``W_v [d_model,
    n_kv d]``, ``W_o [H d, d_model]``, and where enabled ``b_q``, ``b_k``,
    ``b_v``, ``b_o``, ``q_norm``, ``k_norm``, ``W_g``, ``sinks [H]``.
    """

    def __init__(
        self,
        d_model,
        n_heads,
        n_kv_heads=None,
        head_dim=None,
        *,
        biases=(),
        qk_norm=None,
        qk_norm_offset=0.0,
        qk_norm_learned=True,
        qk_norm_after_rope=False,
        norm_eps=1e-6,
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
        use_rope=True,
        query_temperature=None,
        seed=0,
        dtype=np.float64,
    ):
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        head_dim = d_model // n_heads if head_dim is None else head_dim
        if n_heads % n_kv_heads:
            raise ValueError(
                f"n_heads ({n_heads}) must be a multiple of n_kv_heads "
                f"({n_kv_heads})"
            )
        bad = set(biases) - {"q", "k", "v", "o"}
        if bad:
            raise ValueError(f"biases must be among q, k, v, o; got {bad}")
        if qk_norm not in (None, "head", "proj"):
            raise ValueError(
                f"qk_norm must be None, 'head' or 'proj', got {qk_norm!r}"
            )
        if gate not in (None, "elementwise", "headwise"):
            raise ValueError(
                "gate must be None, 'elementwise' or 'headwise', got "
                f"{gate!r}"
            )
        self.d_model, self.n_heads, self.n_kv = d_model, n_heads, n_kv_heads
        self.G, self.d = n_heads // n_kv_heads, head_dim
        self.biases = tuple(sorted(biases))
        self.qk_norm, self.qk_norm_offset = qk_norm, float(qk_norm_offset)
        self.qk_norm_learned = qk_norm_learned
        self.qk_norm_after_rope, self.norm_eps = qk_norm_after_rope, norm_eps
        self.scale = head_dim**-0.5 if scale is None else float(scale)
        self.score_mods = tuple(score_mods)
        self.gate, self.window, self.chunk = gate, window, chunk
        self.rope_base, self.rotary_dim = rope_base, rotary_dim or head_dim
        self.rope_layout, self.rope_factor = rope_layout, float(rope_factor)
        self.use_rope, self.query_temperature = use_rope, query_temperature
        rng = np.random.default_rng(seed)
        Hd, kd = n_heads * head_dim, n_kv_heads * head_dim

        def w(i, o):
            return (rng.standard_normal((i, o)) / math.sqrt(i)).astype(dtype)

        p = {
            "W_q": w(d_model, Hd),
            "W_k": w(d_model, kd),
            "W_v": w(d_model, kd),
            "W_o": w(Hd, d_model),
        }
        sizes = {"q": Hd, "k": kd, "v": kd, "o": d_model}
        for name in self.biases:
            p[f"b_{name}"] = np.zeros(sizes[name], dtype)
        if qk_norm and qk_norm_learned:
            nq = head_dim if qk_norm == "head" else Hd
            nk = head_dim if qk_norm == "head" else kd
            init = 0.0 if self.qk_norm_offset else 1.0
            p["q_norm"] = np.full(nq, init, dtype)
            p["k_norm"] = np.full(nk, init, dtype)
        if gate:
            p["W_g"] = w(d_model, Hd if gate == "elementwise" else n_heads)
        if sinks:
            p["sinks"] = np.zeros(n_heads, dtype)
        self.params = p
        self.grads = {k: np.zeros_like(v) for k, v in p.items()}
        self._cache = None

    # ---------------------------------------------------------- steps
    def project(self, x):
        """x -> q, k, v (flat), gate logits; with the backward cache."""
        P = self.params
        out, caches = {}, {}
        for n in ("q", "k", "v"):
            out[n], caches[n] = linear_forward(
                x, P[f"W_{n}"], P.get(f"b_{n}")
            )
        if self.gate:
            out["g"], caches["g"] = linear_forward(x, P["W_g"])
        return out, caches

    def norm(self, t, name, heads):
        """QK-norm of a flat ``[B, L, heads * d]`` projection."""
        w = self.params.get(f"{name}_norm")
        if self.qk_norm == "head":
            B, L, _ = t.shape
            y, c = qk_norm_forward(
                t.reshape(B, L, heads, self.d),
                w,
                eps=self.norm_eps,
                offset=self.qk_norm_offset,
            )
            return y.reshape(B, L, -1), c
        return qk_norm_forward(
            t, w, eps=self.norm_eps, offset=self.qk_norm_offset
        )

    def norm_backward(self, dy, c):
        dt, dw = qk_norm_backward(dy.reshape(c[0].shape), c)
        return dt.reshape(dy.shape), dw

    def position(self, t, positions):
        """RoPE on ``[B, h, L, d]`` with the layer's base, rotary
        dimension, layout and linear factor."""
        if self.rope_factor == 1.0:
            return rope_forward(
                t,
                positions,
                base=self.rope_base,
                layout=self.rope_layout,
                rotary_dim=self.rotary_dim,
            )
        # linear scaling (position interpolation): every angle / factor
        r = self.rotary_dim
        theta = rope_frequencies(r, base=self.rope_base) / self.rope_factor
        angles = positions[:, None] * theta[None, :]  # [L, r/2]
        cos, sin = np.cos(angles), np.sin(angles)
        y = rotate_pairs(t, cos, sin, layout=self.rope_layout)
        return y, RopeCache(cos, sin, self.rope_layout, r, t.shape)

    def temperature(self, positions):
        """Llama 4's NoPE query scale ``1 + a log(1 + floor((i + 1) / f))``
        ``[L, 1]``, or None."""
        if self.query_temperature is None:
            return None
        floor_scale, attn_scale = self.query_temperature
        i = np.asarray(positions, dtype=np.float64)
        return (
            np.log1p(np.floor((i + 1.0) / floor_scale)) * attn_scale + 1.0
        )[:, None]

    def mask(self, q_pos, k_pos):
        if self.chunk is not None:
            return chunk_mask(q_pos, k_pos, self.chunk)
        return position_mask(q_pos, k_pos, window=self.window)

    # ---------------------------------------------------------- forward
    def forward(self, x, causal=True, kv_cache=None):
        """``x [B, L, d_model]`` at positions ``start ... start + L - 1``
        (``start = len(kv_cache)``); returns ``[B, L, d_model]``."""
        if not causal:
            raise ValueError("RefinedAttention is a decoder layer: causal")
        x = np.asarray(x)
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must be [B, L, {self.d_model}], got shape {x.shape}"
            )
        B, L, _ = x.shape
        start = 0 if kv_cache is None else len(kv_cache)
        pos = np.arange(start, start + L)
        c = {"pos": pos, "shape": x.shape}
        proj, c["proj"] = self.project(x)
        q, k, v = proj["q"], proj["k"], proj["v"]
        pre = self.qk_norm and not self.qk_norm_after_rope
        if pre:
            q, c["qn"] = self.norm(q, "q", self.n_heads)
            k, c["kn"] = self.norm(k, "k", self.n_kv)
        q = q.reshape(B, L, self.n_heads, self.d).transpose(0, 2, 1, 3)
        k = k.reshape(B, L, self.n_kv, self.d).transpose(0, 2, 1, 3)
        v = v.reshape(B, L, self.n_kv, self.d).transpose(0, 2, 1, 3)
        if self.use_rope:
            q, c["rq"] = self.position(q, pos)
            k, c["rk"] = self.position(k, pos)
        if self.qk_norm and not pre:
            q, c["qn"] = qk_norm_forward(q, None, eps=self.norm_eps)
            k, c["kn"] = qk_norm_forward(k, None, eps=self.norm_eps)
        temp = self.temperature(pos)
        if temp is not None:
            q = q * temp
        c["temp"] = temp
        if kv_cache is not None:
            k_all, v_all = kv_cache.append(k, v)
            k_pos = kv_cache.positions
        else:
            k_all, v_all, k_pos = k, v, pos
        qg = q.reshape(B, self.n_kv, self.G, L, self.d)
        allowed = self.mask(pos, k_pos)  # [L, L_k]
        c["watch"] = watch = MaxLogit(allowed)
        sinks = self.params.get("sinks")
        # the grouped core (chapter 2's), with this layer's mods
        o, c["att"] = grouped_attention_forward(
            qg,
            np.ascontiguousarray(k_all),
            np.ascontiguousarray(v_all),
            allowed=allowed,
            q_positions=pos,
            k_positions=k_pos,
            scale=self.scale,
            sinks=None
            if sinks is None
            else sinks.reshape(self.n_kv, self.G, 1, 1),
            score_mods=(*self.score_mods, watch),
            check_finite=False,
        )
        o = o.reshape(B, self.n_heads, L, self.d).transpose(0, 2, 1, 3)
        if self.gate:
            g = proj["g"].reshape(B, L, self.n_heads, -1)
            o, c["gate"] = gate_forward(o, g)
        o = o.reshape(B, L, self.n_heads * self.d)
        y, c["out"] = linear_forward(
            o, self.params["W_o"], self.params.get("b_o")
        )
        self._cache = None if kv_cache is not None else c
        return y

    def backward(self, dy):
        """Gradients into ``self.grads``; returns ``dx``."""
        c = self._cache
        if c is None:
            raise RuntimeError(
                "backward needs a forward without kv_cache before it"
            )
        B, L, _ = c["shape"]
        g = self.grads
        do, g["W_o"], db = linear_backward(dy, c["out"])
        if "b_o" in g:
            g["b_o"] = db
        do = do.reshape(B, L, self.n_heads, self.d)
        if self.gate:
            do, dg = gate_backward(do, c["gate"])
            dgate = dg.reshape(B, L, -1)
        do = do.transpose(0, 2, 1, 3).reshape(
            B, self.n_kv, self.G, L, self.d
        )
        core = grouped_attention_backward(do, c["att"])
        dq, dk, dv = core["q"], core["k"], core["v"]
        if "sinks" in core:
            g["sinks"] = core["sinks"].reshape(-1)
        dq = dq.reshape(B, self.n_heads, L, self.d)
        if c["temp"] is not None:
            dq = dq * c["temp"]
        pre = self.qk_norm and not self.qk_norm_after_rope
        if self.qk_norm and not pre:
            dq, _ = qk_norm_backward(dq, c["qn"])
            dk, _ = qk_norm_backward(dk, c["kn"])
        if self.use_rope:
            dq = rope_backward(dq, c["rq"])
            dk = rope_backward(dk, c["rk"])
        dq = dq.transpose(0, 2, 1, 3).reshape(B, L, -1)
        dk = dk.transpose(0, 2, 1, 3).reshape(B, L, -1)
        dv = dv.transpose(0, 2, 1, 3).reshape(B, L, -1)
        if pre:
            dq, dwq = self.norm_backward(dq, c["qn"])
            dk, dwk = self.norm_backward(dk, c["kn"])
            if self.qk_norm_learned:
                g["q_norm"], g["k_norm"] = dwq, dwk
        dx = 0.0
        for n, dt in (("q", dq), ("k", dk), ("v", dv)):
            dxi, g[f"W_{n}"], db = linear_backward(dt, c["proj"][n])
            if f"b_{n}" in g:
                g[f"b_{n}"] = db
            dx = dx + dxi
        if self.gate:
            dxi, g["W_g"], _ = linear_backward(dgate, c["proj"]["g"])
            dx = dx + dxi
        return dx

    @property
    def attention_weights(self):
        """The last forward's weights ``[B, n_heads, L_q, L_k]``."""
        if self._cache is None:
            return None
        p = self._cache["att"].weights  # [B, n_kv, G, L_q, L_k]
        return p.reshape(p.shape[0], self.n_heads, *p.shape[3:])

    @property
    def max_logit(self):
        """The largest ``|score|`` (after score mods) of the last forward."""
        return None if self._cache is None else self._cache["watch"].value

    def new_cache(self):
        """An empty cache for this layer (keys after RoPE, and values)."""
        return KVCache()

    def __repr__(self):
        extras = [
            f"{k}={v!r}"
            for k, v in (
                ("biases", self.biases),
                ("qk_norm", self.qk_norm),
                ("gate", self.gate),
                ("window", self.window),
                ("chunk", self.chunk),
                ("score_mods", self.score_mods),
            )
            if v
        ]
        return (
            f"RefinedAttention(d_model={self.d_model}, n_heads="
            f"{self.n_heads}, n_kv_heads={self.n_kv}, head_dim={self.d}, "
            + ", ".join(extras)
            + ")"
        )
