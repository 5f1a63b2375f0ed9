"""What real attention layers add (chapter 10), each as a forward/backward
pair, and a layer that composes them.

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

from ._checks import check_flag, check_positive_int, check_positive_number
from .grouped import grouped_attention_forward
from .heads import merge_groups, merge_heads, split_groups, split_heads
from .kv_cache import KVCache
from .long_context import scaled_rope_forward
from .masks import position_mask
from .multihead import GroupedQueryAttention
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

    ``offset=1`` is Gemma's and Qwen3-Next's form (``w`` starts at 0);
    ``w=None`` is the parameter-free form (Llama 4's L2Norm, ``y = x r``).
    Apply it to ``[..., n_heads, d_head]`` for the per-head form (Qwen3,
    Qwen3-Next, Gemma 3) or to ``[..., n_heads * d_head]`` before the head
    split (OLMo 2).
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
        try:
            a = np.asarray(slopes, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(
                f"slopes must be numbers [n_heads], got {slopes!r}"
            ) from None
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
    chunk = check_positive_int(chunk, "chunk")
    i = np.asarray(q_positions)[:, None]
    j = np.asarray(k_positions)[None, :]
    return (j <= i) & (i // chunk == j // chunk)


# ------------------------------------------------------------ the layer
class Position:
    """The position step of a refined layer, in the protocol of chapter
    6's :class:`~attn_np.rope.Rotary` (``forward(t, positions) -> (y,
    saved)``, ``backward(dy, saved)``), so that the layer's ``position``
    step and a cached decode (:meth:`~attn_np.KVCache.step`) run the same
    code: RoPE with its base, rotary dimension, layout and linear factor
    or chapter 11's ``rope_scaling`` (``scaled_rope_forward``), or none (a
    NoPE layer); then Llama 4's parameter-free QK-norm, then
    its query temperature (queries are the 5-D ``[B, n_kv, G, L, d]``)."""

    def __init__(self, layer):
        self.layer = layer

    def forward(self, t, positions):
        ly, saved = self.layer, {}
        if ly.use_rope:
            if ly.rope_scaling is not None:  # chapter 11's frequencies
                t, saved["rope"] = scaled_rope_forward(
                    t,
                    positions,
                    base=ly.rope_base,
                    rope_scaling=ly.rope_scaling,
                    layout=ly.rope_layout,
                    rotary_dim=ly.rope_dim,
                )
            elif ly.rope_factor == 1.0:
                t, saved["rope"] = rope_forward(
                    t,
                    positions,
                    base=ly.rope_base,
                    layout=ly.rope_layout,
                    rotary_dim=ly.rope_dim,
                )
            else:  # linear scaling: every angle divided by the factor
                r = ly.rope_dim
                theta = (
                    rope_frequencies(r, base=ly.rope_base) / ly.rope_factor
                )
                angles = positions[:, None] * theta[None, :]  # [L, r/2]
                cos, sin = np.cos(angles), np.sin(angles)
                saved["rope"] = RopeCache(
                    cos, sin, ly.rope_layout, r, t.shape
                )
                t = rotate_pairs(t, cos, sin, layout=ly.rope_layout)
        if ly.qk_norm and ly.qk_norm_after_rope:
            t, saved["norm"] = qk_norm_forward(t, None, eps=ly.norm_eps)
        temp = ly.temperature(positions)  # [L, 1] or None
        if temp is not None and t.ndim == 5:  # the queries only
            t, saved["temp"] = t * temp, temp
        return t, saved

    def backward(self, dy, saved):
        if "temp" in saved:
            dy = dy * saved["temp"]
        if "norm" in saved:
            dy, _ = qk_norm_backward(dy, saved["norm"])
        if "rope" in saved:
            dy = rope_backward(dy, saved["rope"])
        return dy


class RefinedAttention(GroupedQueryAttention):
    """Chapter 3's layer with the details of released layers, added by
    overriding its steps (never by branches in its forward):

    * ``project``: ``x W + b`` for q, k and v, then QK-norm (per head or
      over the whole projection) before RoPE;
    * ``rotary``/``position``: :class:`Position` (RoPE with the layer's
      base, dimension, layout and linear factor or ``rope_scaling``
      (chapter 11: llama3, YaRN, ...), or NoPE; Llama 4's
      post-RoPE norm and query temperature);
    * ``attend``: the grouped core with the layer's scale, score mods
      (:class:`SoftCap`, :class:`ALiBi`), window or chunk, and sinks;
    * ``output``: the output gate, ``W_o`` and ``b_o``.

    Extra ``params`` where enabled: ``b_q``, ``b_k``, ``b_v``, ``b_o``,
    ``q_norm``, ``k_norm``, ``W_g [d_model, H d]`` (elementwise) or
    ``[d_model, H]`` (headwise). Always causal: a decoder layer.
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
        rope_scaling=None,
        use_rope=True,
        query_temperature=None,
        seed=0,
        dtype=np.float64,
    ):
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        head_dim = d_model // n_heads if head_dim is None else head_dim
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
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(
                f"n_heads ({n_heads}) must be a multiple of n_kv_heads "
                f"({n_kv_heads})"
            )
        qk_norm_learned = check_flag(qk_norm_learned, "qk_norm_learned")
        qk_norm_after_rope = check_flag(
            qk_norm_after_rope, "qk_norm_after_rope"
        )
        use_rope = check_flag(use_rope, "use_rope")
        if chunk is not None:
            chunk = check_positive_int(chunk, "chunk")
        rope_factor = check_positive_number(rope_factor, "rope_factor")
        norm_eps = check_positive_number(norm_eps, "norm_eps")
        qk_norm_offset = float(qk_norm_offset)
        if not math.isfinite(qk_norm_offset):
            raise ValueError(
                "qk_norm_offset must be a finite number, got "
                f"{qk_norm_offset}"
            )
        if query_temperature is not None:
            try:
                floor_scale, attn_scale = query_temperature
            except (TypeError, ValueError):
                raise ValueError(
                    "query_temperature must be (floor_scale, attn_scale), "
                    f"got {query_temperature!r}"
                ) from None
            query_temperature = (
                check_positive_number(floor_scale, "floor_scale"),
                float(attn_scale),
            )
        super().__init__(
            d_model,
            n_heads,
            n_kv_heads,
            d_k=head_dim,
            d_v=head_dim,
            seed=seed,
            dtype=dtype,
            rope_base=rope_base,
            rope_layout=rope_layout,
            rope_dim=rotary_dim,
            window=window,
            sinks=sinks,
            rope_scaling=rope_scaling,
        )
        if rope_scaling is not None and rope_factor != 1.0:
            raise ValueError(
                "pass rope_factor (linear scaling) or rope_scaling, not "
                f"both: got {rope_factor} and {rope_scaling!r}"
            )
        self.n_kv, self.G, self.d = n_kv_heads, self.group_size, head_dim
        self.biases = tuple(sorted(biases))
        self.qk_norm, self.qk_norm_offset = qk_norm, float(qk_norm_offset)
        self.qk_norm_learned = qk_norm_learned
        self.qk_norm_after_rope, self.norm_eps = qk_norm_after_rope, norm_eps
        self.scale = head_dim**-0.5 if scale is None else float(scale)
        self.score_mods = tuple(score_mods)
        self.gate, self.chunk = gate, chunk
        self.rope_factor = float(rope_factor)
        self.use_rope, self.query_temperature = use_rope, query_temperature
        self._watch = None
        rng = np.random.default_rng([seed, 10])
        Hd, kd = n_heads * head_dim, n_kv_heads * head_dim
        p = self.params
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
            n_g = Hd if gate == "elementwise" else n_heads
            p["W_g"] = (
                rng.standard_normal((d_model, n_g)) / math.sqrt(d_model)
            ).astype(dtype)
        self.grads = {k: np.zeros_like(v) for k, v in p.items()}

    @property
    def rotary_dim(self):
        return self.rope_dim

    @property
    def rotary(self):
        """:class:`Position`, or None when the step does nothing."""
        moves = self.use_rope or self.query_temperature is not None
        moves = moves or (self.qk_norm and self.qk_norm_after_rope)
        return Position(self) if moves and self.rope_base else None

    def temperature(self, positions):
        """Llama 4's NoPE query scale ``1 + a log(1 + floor((i + 1) /
        f))``, ``[L, 1]``, or None."""
        if self.query_temperature is None:
            return None
        floor_scale, attn_scale = self.query_temperature
        i = np.asarray(positions, dtype=np.float64)
        scale = np.log1p(np.floor((i + 1.0) / floor_scale)) * attn_scale
        return (scale + 1.0)[:, None]

    def mask(self, q_pos, k_pos):
        """``[L_q, L_k]`` from positions: the chunk rule or chapter 8's."""
        if self.chunk is not None:
            return chunk_mask(q_pos, k_pos, self.chunk)
        return position_mask(q_pos, k_pos, window=self.window)

    @property
    def max_logit(self):
        """The largest ``|score|`` (after score mods) of the last forward."""
        return None if self._watch is None else self._watch.value

    def new_cache(self):
        """An empty cache for this layer (keys after RoPE, and values):
        rolling, holding only the window, for a window layer."""
        return KVCache(window=self.window)

    # ---------------------------------------------------------- steps
    def forward(self, x, *, causal=True, mask=None, kv_cache=None):
        """``x [B, L, d_model]`` at positions ``len(kv_cache) ...``."""
        if not causal or mask is not None:
            raise ValueError(
                "RefinedAttention is a decoder layer: causal=True and no "
                "mask (its masks come from positions)"
            )
        return super().forward(x, causal=True, kv_cache=kv_cache)

    def project(self, x3):
        P, B, L = self.params, *x3.shape[:2]
        saved = {}
        t = {}
        for n in ("q", "k", "v"):
            t[n], saved[n] = linear_forward(x3, P[f"W_{n}"], P.get(f"b_{n}"))
        if self.qk_norm and not self.qk_norm_after_rope:
            for n, heads in (("q", self.n_heads), ("k", self.n_kv)):
                shape = (
                    (B, L, heads, self.d) if self.qk_norm == "head" else None
                )
                y, saved[f"{n}n"] = qk_norm_forward(
                    t[n] if shape is None else t[n].reshape(shape),
                    P.get(f"{n}_norm"),
                    eps=self.norm_eps,
                    offset=self.qk_norm_offset,
                )
                t[n] = y.reshape(B, L, -1)
        self._project_saved = saved
        q = split_groups(t["q"], self.n_kv, self.G, self.d)
        return (
            q,
            split_heads(t["k"], self.n_kv, self.d),
            split_heads(t["v"], self.n_kv, self.d),
        )

    def project_backward(self, x3, g):
        saved, grads = self._project_saved, self.grads
        d = {
            "q": merge_groups(g.pop("q")),
            "k": merge_heads(g.pop("k")),
            "v": merge_heads(g.pop("v")),
        }
        for n in ("q", "k"):
            if f"{n}n" in saved:
                c = saved[f"{n}n"]
                dt, dw = qk_norm_backward(d[n].reshape(c[0].shape), c)
                d[n] = dt.reshape(d[n].shape)
                if dw is not None:
                    grads[f"{n}_norm"] = dw
        dx = 0.0
        for n in ("q", "k", "v"):
            dxi, grads[f"W_{n}"], db = linear_backward(d[n], saved[n])
            if db is not None:
                grads[f"b_{n}"] = db
            dx = dx + dxi
        return dx

    def attend(self, q, k, v, *, mask=None, **where):
        L_q, L_k = q.shape[3], k.shape[2]
        q_pos = where.get("q_positions", np.arange(L_k - L_q, L_k))
        k_pos = where.get("k_positions", np.arange(L_k))
        allowed = self.mask(q_pos, k_pos)  # [L_q, L_k]
        self._watch = MaxLogit(allowed)
        sinks = self.params.get("sinks")
        return grouped_attention_forward(
            q,
            np.ascontiguousarray(k),
            np.ascontiguousarray(v),
            allowed=allowed,
            q_positions=q_pos,
            k_positions=k_pos,
            scale=self.scale,
            sinks=None
            if sinks is None
            else sinks.reshape(self.n_kv, self.G, 1, 1),
            score_mods=(*self.score_mods, self._watch),
            check_finite=False,
        )

    def output(self, o, x3):
        P = self.params
        B, L = x3.shape[:2]
        gate = None
        if self.gate:
            g, lin = linear_forward(x3, P["W_g"])
            o4 = merge_groups(o).reshape(B, L, self.n_heads, self.d)
            o4, gc = gate_forward(o4, g.reshape(B, L, self.n_heads, -1))
            gate = (lin, gc)
            o = o4.reshape(B, L, -1)
        else:
            o = merge_groups(o)
        y, out = linear_forward(o, P["W_o"], P.get("b_o"))
        return y, (out, gate)

    def output_backward(self, dy3, saved):
        out, gate = saved
        do, self.grads["W_o"], db = linear_backward(dy3, out)
        if db is not None:
            self.grads["b_o"] = db
        dx = None
        if gate is not None:
            lin, gc = gate
            B, L = dy3.shape[:2]
            do, dg = gate_backward(
                do.reshape(B, L, self.n_heads, self.d), gc
            )
            dx, self.grads["W_g"], _ = linear_backward(
                dg.reshape(B, L, -1), lin
            )
            do = do.reshape(B, L, -1)
        return split_groups(do, self.n_kv, self.G, self.d), dx

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
            f"{self.n_heads}, n_kv_heads={self.n_kv}, head_dim={self.d}"
            + "".join(", " + e for e in extras)
            + ")"
        )
