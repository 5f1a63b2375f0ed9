"""The Hugging Face decoder layers :func:`~attn_np.attention_from_hf`
builds: the book's layers with what HF's layers add to them.

* :class:`HFAttention`: chapter 10's :class:`~attn_np.refinements.
  RefinedAttention`, whose ``new_cache()`` holds only the chunk of a
  chunked layer (Llama 4, chapter 11's :class:`~attn_np.ChunkedKVCache`);
* :class:`HFLatentAttention`, :class:`HFSparseLatentAttention`: chapter
  7's MLA and chapter 13's DSA, causal, with ``rope_scaling`` (chapter
  11) in the rotation and the softmax scale.

Persimmon's and Phi's layers are :class:`HFAttention` with a LayerNorm per
head on q and k, one gain and bias shared by the heads
(``_QKLayerNormAttention``, its project step ``_HeadLayerNorm``); Cohere's
and StableLM's, with a gain of each head's own and no bias
(``_HeadGainLayerNormAttention``, ``_HeadGainLayerNorm``).

A Qwen3-Next ``linear_attention`` layer is chapter 12's
:class:`~attn_np.GatedDeltaNet` itself: it takes the same ``kv_cache=``
and ``new_cache()`` as every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import check_flag
from ..heads import merge_groups, split_groups
from ..latent import MultiHeadLatentAttention
from ..long_context import (
    ChunkedKVCache,
    ScaledRotary,
    read_rope_scaling,
    softmax_scale,
)
from ..masks import symmetric_window_mod
from ..multihead import GroupedQueryAttention
from ..norms import qk_norm_backward, qk_norm_forward
from ..refinements import (
    GatedOutput,
    Projection,
    QueryTemperature,
    RefinedAttention,
    _linear,
    linear_backward,
)
from ..sparse import (
    SparseLatentAttention,
    layernorm_backward,
    layernorm_forward,
)
from .config import count


class HFAttention(RefinedAttention):
    """Chapter 10's layer as a Hugging Face decoder layer: a chunked
    layer (Llama 4's ``chunked_attention``) decodes with chapter 11's
    :class:`~attn_np.ChunkedKVCache`, which holds at most the chunk.

    ``bidirectional=True`` (EmbeddingGemma's ``use_bidirectional_attention``,
    chapter 16) makes it an encoder layer: every query sees every key, or
    on a sliding layer the keys fewer than ``window`` positions away on
    either side (:func:`~attn_np.masks.symmetric_window_mod`); it takes
    the whole sequence, no cache."""

    def __init__(self, *args, bidirectional=False, **kw):
        self.bidirectional = check_flag(bidirectional, "bidirectional")
        # an encoder's window is a mask, not chapter 8's causal window
        self.symmetric_window = (
            kw.pop("window", None) if bidirectional else None
        )
        super().__init__(*args, **kw)

    def forward(self, x, *, causal=True, mask=None, kv_cache=None):
        if not self.bidirectional:
            return super().forward(
                x, causal=causal, mask=mask, kv_cache=kv_cache
            )
        if kv_cache is not None or mask is not None or not causal:
            raise ValueError(
                "a bidirectional (encoder) layer takes the whole sequence: "
                "no kv_cache, mask or causal argument"
            )
        W = self.symmetric_window
        m = None if W is None else symmetric_window_mod(W)
        return GroupedQueryAttention.forward(self, x, mask=m)

    def new_cache(self):
        if self.bidirectional:
            raise ValueError(
                "a bidirectional (encoder) layer has no cache: it reads the "
                "whole sequence at once"
            )
        if self.chunk is None:
            return super().new_cache()
        return ChunkedKVCache(self.chunk)


class _HFLatentRope:
    """What an HF latent layer (MLA, DSA) takes of chapter 11:
    ``rope_scaling`` goes through chapter 7's two settings. ``rotary``
    turns ``q_R`` and ``k_R`` with the scaled frequencies
    (:class:`~attn_np.long_context.ScaledRotary`), and ``scale`` is
    :func:`~attn_np.long_context.softmax_scale` (YaRN's
    ``mscale(s, mscale_all_dim)^2`` over ``1/sqrt(d_head + d_rope)``, as
    DeepSeek's and HF's ``softmax_scale``)."""

    def __init__(self, *args, rope_scaling=None, **kw):
        super().__init__(*args, **kw)
        self.rope_scaling = (
            None if rope_scaling is None else read_rope_scaling(rope_scaling)
        )
        self.scale = softmax_scale(
            self.d_head + self.d_rope, self.rope_scaling
        )

    @property
    def rotary(self):
        if self.rope_scaling is None:
            return super().rotary
        return ScaledRotary(
            self.rope_base, self.rope_layout, rope_scaling=self.rope_scaling
        )


class HFLatentAttention(_HFLatentRope, MultiHeadLatentAttention):
    """Chapter 7's MLA as a Hugging Face decoder layer: causal, and
    continuing from its cache (the absorbed path) like HF's.
    ``rope_scaling`` (chapter 11) as :class:`_HFLatentRope` says."""

    def forward(self, x, causal=True, kv_cache=None):
        if not causal:
            raise ValueError("an HF decoder layer is causal")
        return super().forward(x, causal=True, kv_cache=kv_cache)


class HFSparseLatentAttention(_HFLatentRope, SparseLatentAttention):
    """Chapter 13's DSA (MLA with the lightning indexer) as Hugging
    Face's DeepSeek-V3.2 layer: causal, continuing from its
    :class:`~attn_np.IndexedLatentCache`. ``rope_scaling`` enters as in
    :class:`HFLatentAttention`, and the indexer turns its first
    ``d_rope`` features with the same frequencies (HF hands both the
    model's one ``cos``/``sin``), in the rotate-half layout. Its top-k
    has no gradient: ``backward`` is chapter 7's, for the main
    attention's parameters (HF runs the indexer under ``no_grad``)."""

    def __init__(self, *args, rope_scaling=None, **kw):
        super().__init__(*args, rope_scaling=rope_scaling, **kw)
        if self.rope_scaling is not None:
            ix = self.indexer
            ix.rotary = ScaledRotary(
                ix.rope_base,
                ix.rope_layout,
                ix.d_rope,
                rope_scaling=self.rope_scaling,
            )

    def forward(self, x, causal=True, kv_cache=None):
        if not causal:
            raise ValueError("an HF decoder layer is causal")
        return super().forward(x, kv_cache=kv_cache)


@dataclass(frozen=True)
class _HeadLayerNorm(Projection):
    """The project step with a LayerNorm per head on q and k, before RoPE
    (Persimmon's ``q_layernorm`` and ``k_layernorm``): over each head's
    ``d`` features, ``y = g (t - mean t) / sqrt(var t + eps) + b``, the
    gains ``q_norm``, ``k_norm`` and the biases ``q_norm_bias``,
    ``k_norm_bias`` (``[d]`` each, shared by the heads). Backward: with
    ``u = dy g``, ``dt = r (u - mean u - that mean(u that))``, ``r`` the
    inverse deviation and ``that`` the normalised ``t``."""

    def add_params(self, layer, rng):
        super().add_params(layer, rng)
        p, d = layer.params, layer.d_k
        for n in ("q", "k"):
            p[f"{n}_norm"] = np.ones(d, layer.dtype)
            p[f"{n}_norm_bias"] = np.zeros(d, layer.dtype)

    def forward(self, layer, x3):
        """``q [B, n_kv, G, L, d]``, ``k, v [B, n_kv, L, d]``, normalised
        over ``d``."""
        q, k, v, saved = super().forward(layer, x3)
        P, eps = layer.params, self.eps
        q, saved["q_ln"] = layernorm_forward(
            q, P["q_norm"], P["q_norm_bias"], eps=eps
        )
        k, saved["k_ln"] = layernorm_forward(
            k, P["k_norm"], P["k_norm_bias"], eps=eps
        )
        return q, k, v, saved

    def backward(self, layer, x3, g, saved):
        for n in ("q", "k"):
            g[n], dg, db = layernorm_backward(g[n], saved[f"{n}_ln"])
            layer.grads[f"{n}_norm"], layer.grads[f"{n}_norm_bias"] = dg, db
        return super().backward(layer, x3, g, saved)


class _QKLayerNormAttention(HFAttention):
    """:class:`HFAttention` whose project step is :class:`_HeadLayerNorm`
    (with the layer's ``norm_eps``); Persimmon's layer."""

    def _step_parts(self) -> dict:
        parts = super()._step_parts()
        biases = parts["projection"].biases
        parts["projection"] = _HeadLayerNorm(
            biases, None, 0.0, True, self.norm_eps
        )
        return parts


def _head_layernorm(t, g, eps):
    """``(y, saved)``: each head of ``t [..., heads, L, d]`` normalised over
    its ``d`` features, ``(t - mean t) / sqrt(var t + eps)``, times its
    own gain ``g [heads, 1, d]``, no bias."""
    mu = t.mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(((t - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    that = (t - mu) * r
    return that * g, (that, r, g)


def _head_layernorm_backward(dy, saved):
    """``(dt, dg)``: with ``u = dy g``, ``dt = r (u - mean u - that
    mean(u that))``; ``dg`` summed over everything but the head and the
    feature."""
    that, r, g = saved
    u = dy * g
    dt = r * (
        u
        - u.mean(axis=-1, keepdims=True)
        - that * (u * that).mean(axis=-1, keepdims=True)
    )
    lead = tuple(range(dy.ndim - g.ndim)) + (dy.ndim - 2,)  # not heads, d
    return dt, (dy * that).sum(axis=lead, keepdims=True)[0]


@dataclass(frozen=True)
class _HeadGainLayerNorm(Projection):
    """The project step with a LayerNorm per head on q and k, each head
    its own gain and no bias (Cohere's ``q_norm``, ``k_norm`` of shape
    ``[heads, d]``; StableLM's ``q_layernorm.norms.{h}``): over each
    head's ``d`` features, ``y = g_h (t - mean t) / sqrt(var t + eps)``,
    the gains ``q_norm [H, d]`` and ``k_norm [n_kv, d]``."""

    def add_params(self, layer, rng):
        super().add_params(layer, rng)
        p, d = layer.params, layer.d_k
        p["q_norm"] = np.ones((layer.n_heads, d), layer.dtype)
        p["k_norm"] = np.ones((layer.n_kv_heads, d), layer.dtype)

    def forward(self, layer, x3):
        """``q [B, n_kv, G, L, d]``, ``k, v [B, n_kv, L, d]``."""
        q, k, v, saved = super().forward(layer, x3)
        P, n_kv, d = layer.params, layer.n_kv_heads, layer.d_k
        gq = P["q_norm"].reshape(n_kv, -1, 1, d)  # head kv * G + g
        q, saved["q_ln"] = _head_layernorm(q, gq, self.eps)
        gk = P["k_norm"].reshape(n_kv, 1, d)
        k, saved["k_ln"] = _head_layernorm(k, gk, self.eps)
        return q, k, v, saved

    def backward(self, layer, x3, g, saved):
        for n in ("q", "k"):
            g[n], dg = _head_layernorm_backward(g[n], saved[f"{n}_ln"])
            layer.grads[f"{n}_norm"] = dg.reshape(
                layer.params[f"{n}_norm"].shape
            )
        return super().backward(layer, x3, g, saved)


class _HeadGainLayerNormAttention(HFAttention):
    """:class:`HFAttention` whose project step is
    :class:`_HeadGainLayerNorm` (with the layer's ``norm_eps``): Cohere's
    layer with ``use_qk_norm``, StableLM's with ``qk_layernorm``."""

    def _step_parts(self) -> dict:
        parts = super()._step_parts()
        parts["projection"] = _HeadGainLayerNorm(
            parts["projection"].biases, None, 0.0, True, self.norm_eps
        )
        return parts


class _PostRopeGainAttention(HFAttention):
    """HunYuan's layer: RoPE, then an RMSNorm of each head of q and k
    with learned gains ``q_norm``, ``k_norm`` (``[d]``, shared by the
    heads; HF's ``query_layernorm``, ``key_layernorm``). The norm without
    its gains is Llama 4's post-RoPE norm, the position part's. The gains
    meet feature by feature in a score: ``(w_q n(q)) . (w_k n(k)) = n(q)
    . (w_q w_k n(k))``, so :meth:`attend` multiplies the queries by ``w_q
    w_k`` and the keys (cached) keep none. Backward: with ``s = sum(dq
    n(q))`` over every query row, ``dw_q = s w_k``, ``dw_k = s w_q``."""

    def __init__(self, *args, **kw):
        kw.update(qk_norm="head", qk_norm_learned=False)
        super().__init__(*args, qk_norm_after_rope=True, **kw)
        for n in ("q_norm", "k_norm"):
            self.params[n] = np.ones(self.d_k, self.dtype)
            self.grads[n] = np.zeros(self.d_k, self.dtype)

    def attend(self, q, k, v, *, mask=None, **where):
        P = self.params
        self._turned = q  # [B, n_kv, G, L, d]: normalised and turned
        q = q * (P["q_norm"] * P["k_norm"])
        return super().attend(q, k, v, mask=mask, **where)

    def position_backward(self, g, rope):
        wq, wk = self.params["q_norm"], self.params["k_norm"]
        s = (g["q"] * self._turned).reshape(-1, wq.size).sum(axis=0)
        self.grads["q_norm"], self.grads["k_norm"] = s * wk, s * wq
        g["q"] = g["q"] * (wq * wk)
        super().position_backward(g, rope)


class _ScaledQueryLatentAttention(HFLatentAttention):
    """Mistral 4's layer: :class:`HFLatentAttention` whose every query
    (both its parts) is multiplied by ``1 + b ln(1 + floor(p / M))`` at
    its position ``p``: chapter 10's :class:`~attn_np.refinements.
    QueryTemperature` (``query_temperature = (M, b, 0)``), a score mod of
    the grouped core on either path (scaling a query scales its row of
    scores)."""

    def __init__(self, *args, query_temperature, **kw):
        super().__init__(*args, **kw)
        self.query_temperature = tuple(query_temperature)
        self._temp = QueryTemperature(*self.query_temperature)

    def _attend_expanded(self, q_c, q_r, c_kv, k_r, where):
        where = dict(where, score_mods=(self._temp,))
        return super()._attend_expanded(q_c, q_r, c_kv, k_r, where)

    def _attend_absorbed(self, q_c, q_r, rows, where):
        where = dict(where, score_mods=(self._temp,))
        return super()._attend_absorbed(q_c, q_r, rows, where)


@dataclass(frozen=True)
class _SubNormOutput(GatedOutput):
    """BitNet's output step (HF's ``attn_sub_norm``): the heads' outputs
    side by side, ``o [B, L, H d_v]``, RMS-normalised over all ``H d_v``
    features with a gain ``o_norm [H d_v]``, then ``W_o`` (and ``b_o``):
    ``y = (w * o / sqrt(mean(o^2) + eps)) W_o``. Backward: ``W_o``'s,
    then the norm's (chapter 10's QK-norm over the whole width)."""

    eps: float = 1e-6

    def add_params(self, layer, rng):
        super().add_params(layer, rng)
        n = layer.n_heads * layer.d_v
        layer.params["o_norm"] = np.ones(n, layer.dtype)

    def forward(self, layer, o, x3):
        P = layer.params
        o = merge_groups(o)  # [B, L, H d_v]
        o, norm = qk_norm_forward(o, P["o_norm"], eps=self.eps)
        y, out = _linear(o, P["W_o"], P.get("b_o"))  # [B, L, d_model]
        return y, (out, norm)

    def backward(self, layer, dy3, saved):
        out, norm = saved
        grads = layer.grads
        do, grads["W_o"], db = linear_backward(dy3, out)  # [B, L, H d_v]
        if db is not None:
            grads["b_o"] = db
        do, grads["o_norm"] = qk_norm_backward(do, norm)
        G, d_v = layer.group_size, layer.d_v
        return split_groups(do, layer.n_kv_heads, G, d_v), None


class _SubNormAttention(HFAttention):
    """BitNet's layer: :class:`HFAttention` whose output step is
    :class:`_SubNormOutput` (with the layer's ``norm_eps``)."""

    def _step_parts(self) -> dict:
        parts = super()._step_parts()
        if self.gate is not None:
            raise ValueError("BitNet's sub-norm layer has no output gate")
        parts["out_projection"] = _SubNormOutput(
            None, "o" in self.biases, self.norm_eps
        )
        return parts


def _bitnet(cfg, i, layer_type, kw, layout):
    """BitNet: Llama's layer with ``attn_sub_norm``, an RMSNorm of gain
    ``[hidden_size]`` over the heads' outputs side by side, before
    ``o_proj`` (so ``num_attention_heads * head_dim`` must equal
    ``hidden_size``, as HF's module assumes)."""
    width = count(cfg, "hidden_size")
    n_heads = count(cfg, "num_attention_heads")
    head_dim = cfg.get("head_dim") or width // n_heads
    if n_heads * head_dim != width:
        raise ValueError(
            f"bitnet's attn_sub_norm normalises hidden_size ({width}) "
            "features: num_attention_heads * head_dim must equal it, got "
            f"{n_heads} * {head_dim}"
        )
    layout["cls"] = _SubNormAttention
    layout["names"] = {"o_norm": "attn_sub_norm"}
