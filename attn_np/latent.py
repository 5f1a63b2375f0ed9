"""Multi-head latent attention, MLA (DeepSeek-AI 2024), chapter 7.

Row vectors, one token's input ``h`` (``x`` for a whole sequence)::

    c_Q  = h W_dq                  [d_model] -> [d_latent_q]
    q_C  = c_Q W_uq                n_heads heads of d_head
    q_R  = RoPE(c_Q W_qr)          n_heads heads of d_rope
    c_KV = h W_dkv                 [d_latent_kv]           (cached)
    k_C  = c_KV W_uk               n_heads heads of d_head
    v    = c_KV W_uv               n_heads heads of d_head_v
    k_R  = RoPE(h W_kr)            one key of d_rope       (cached)

Without query compression (``d_latent_q=None``): ``q_C = h W_q`` and
``q_R = RoPE(h W_qr)``. Head ``i`` attends with ``q_i = [q_C,i ; q_R,i]``
and ``k_i = [k_C,i ; k_R]`` at scale ``1 / sqrt(d_head + d_rope)``;
``y = [o_1 ... o_n] W_o``. Every head shares the one rotary key ``k_R``.

A decode step can take two paths over the cached ``[c_KV ; k_R]``:

* *naive*: rebuild ``k_C`` and ``v`` of every cached position;
* *absorbed*: ``q_C,i k_C,j^T = (q_C,i W_uk,i^T) c_KV,j^T``, so the query
  is moved into the latent space and scored against ``c_KV`` itself, and
  ``W_uv`` is applied after the weighted sum of latents. No per-head key
  or value is built: the step is multi-query attention whose one key is
  the cached row ``[c_KV ; k_R]`` and whose one value is ``c_KV``.
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import (
    check_cache_kind,
    check_flag,
    check_float_dtype,
    check_latent_dims,
    check_layer_input,
    check_overflow,
    check_unchanged,
    check_upstream,
    fingerprint,
)
from .grouped import (
    decode_step_parts,
    group_mask,
    grouped_attention_backward,
    grouped_attention_forward,
)
from .heads import flat, merge_heads, split_heads
from .kv_cache import CacheBuffer
from .norms import rmsnorm_backward, rmsnorm_forward
from .rope import Rotary, check_rope_settings, check_rotary


class LatentKVCache(CacheBuffer):
    """The latent cache of one MLA layer: ``c_KV`` and ``k_R`` per position.

    One buffer holds both, and :attr:`rows` shows it as ``[B, len,
    d_latent_kv + d_rope]``: row ``j`` is ``[c_KV,j ; k_R,j]``, the key
    that the absorbed path scores against (its first ``d_latent_kv``
    columns are also the value). Nothing per head is stored. It is a
    :class:`~attn_np.kv_cache.CacheBuffer`, as :class:`attn_np.KVCache`
    is: kept *transposed*, ``[B, d_latent_kv + d_rope, capacity]``, one
    row per feature, so that a decode step's two products stream along
    rows ``len`` numbers long; :attr:`rows` is a transposed view.
    Capacity doubles when it runs out.
    """

    names = ("batch", "d_latent_kv", "d_rope")

    def __repr__(self) -> str:
        return f"LatentKVCache({self._describe()})"

    @property
    def rows(self) -> np.ndarray:
        """View of the rows ``[c_KV ; k_R]``: ``[B, len, d_c + d_R]``
        (stored transposed; no copy)."""
        if self._buf is None:
            raise ValueError("the cache is empty: it holds no latents yet")
        return self._buf[..., : self._len].swapaxes(-1, -2)

    @property
    def latents(self) -> np.ndarray:
        """View of the cached ``c_KV``: ``[B, len, d_latent_kv]``."""
        return self._part(0)

    @property
    def rope_keys(self) -> np.ndarray:
        """View of the cached rotary keys ``k_R``: ``[B, len, d_rope]``."""
        return self._part(1)

    def append(self, c_kv, k_r) -> np.ndarray:
        """Add a chunk's ``c_KV [B, L, d_c]`` and ``k_R [B, L, d_R]``.

        Returns :attr:`rows`, the chunk included (a view, no copy).
        """
        self.append_parts({"c_kv": c_kv, "k_r": k_r})
        return self.rows


class MultiHeadLatentAttention:
    """Multi-head latent attention with decoupled RoPE (DeepSeek-V2/V3).

    Parameters, no biases (head ``i`` owns columns ``i*d_head:(i+1)*d_head``
    of ``W_uq`` and ``W_uk``, ``i*d_rope:...`` of ``W_qr`` and
    ``i*d_head_v:...`` of ``W_uv``)::

        W_dq  [d_model, d_latent_q]     (W_q  [d_model, n_heads*d_head]
        W_uq  [d_latent_q, n_heads*d_head]  without query compression)
        W_qr  [d_latent_q or d_model, n_heads*d_rope]
        W_dkv [d_model, d_latent_kv]    W_kr [d_model, d_rope]
        W_uk  [d_latent_kv, n_heads*d_head]
        W_uv  [d_latent_kv, n_heads*d_head_v]
        W_o   [n_heads*d_head_v, d_model]

    ``latent_norm=True`` adds the RMSNorm that DeepSeek's released code
    applies to ``c_Q`` and ``c_KV``, with gains ``g_q`` and ``g_kv``.
    ``rotary`` is a position part that replaces the rotation of
    ``rope_base`` and ``rope_layout`` (the protocol of
    :class:`~attn_np.rope.Rotary`, as for the other layers).
    ``latent_eps`` is the epsilon of those norms.
    """

    latent_eps = 1e-6

    def __init__(
        self,
        d_model,
        n_heads,
        d_head,
        d_latent_kv,
        d_rope,
        d_latent_q=None,
        d_head_v=None,
        rope_base=10000.0,
        rope_layout="half",
        seed=0,
        dtype=np.float64,
        *,
        latent_norm=False,
        rotary=None,
    ):
        d_model, h, d_head, d_c, d_r, d_cq, d_v = check_latent_dims(
            d_model,
            n_heads,
            d_head,
            d_latent_kv,
            d_rope,
            d_latent_q,
            d_head_v,
        )
        if rope_base is None:
            raise ValueError(
                "rope_base must be a positive number: the decoupled key "
                "k_R exists to carry RoPE, got None"
            )
        if d_r % 2:
            raise ValueError(
                f"d_rope must be even (RoPE turns pairs), got {d_r}"
            )
        # rope_base positive, rope_layout "half" or "interleaved"
        rope_base, rope_layout, _ = check_rope_settings(
            rope_base, rope_layout, None, d_r
        )
        dtype = check_float_dtype(dtype)
        self.d_model, self.n_heads, self.d_head = d_model, h, d_head
        self.d_latent_kv, self.d_rope = d_c, d_r
        self.d_latent_q, self.d_head_v = d_cq, d_v
        self.rope_base, self.rope_layout = rope_base, rope_layout
        self.latent_norm = check_flag(latent_norm, "latent_norm")
        self._rotary = check_rotary(rotary)  # a position part, or None
        self.dtype = dtype
        self.scale = 1.0 / math.sqrt(d_head + d_r)
        d_q_in = d_model if d_cq is None else d_cq  # what W_uq, W_qr read
        shapes = {}
        if d_cq is None:
            shapes["W_q"] = (d_model, h * d_head)
        else:
            shapes["W_dq"] = (d_model, d_cq)
            shapes["W_uq"] = (d_cq, h * d_head)
        shapes["W_qr"] = (d_q_in, h * d_r)
        shapes["W_dkv"] = (d_model, d_c)
        shapes["W_uk"] = (d_c, h * d_head)
        shapes["W_uv"] = (d_c, h * d_v)
        shapes["W_kr"] = (d_model, d_r)
        shapes["W_o"] = (h * d_v, d_model)
        rng = np.random.default_rng(seed)
        # N(0, 1/fan_in), as for the other layers
        self.params = {
            k: (rng.standard_normal(s) / np.sqrt(s[0])).astype(dtype)
            for k, s in shapes.items()
        }
        if self.latent_norm:
            if d_cq is not None:
                self.params["g_q"] = np.ones(d_cq, dtype=dtype)
            self.params["g_kv"] = np.ones(d_c, dtype=dtype)
        self.grads = {k: np.zeros_like(p) for k, p in self.params.items()}
        self._att = None  # the core's cache of the last forward
        self._cache = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(d_model={self.d_model}, n_heads="
            f"{self.n_heads}, d_head={self.d_head}, d_latent_kv="
            f"{self.d_latent_kv}, d_rope={self.d_rope}, d_latent_q="
            f"{self.d_latent_q}, d_head_v={self.d_head_v}, "
            f"latent_norm={self.latent_norm}, dtype={self.dtype})"
        )

    @property
    def n_params(self) -> int:
        return sum(p.size for p in self.params.values())

    def new_cache(self):
        """An empty :class:`LatentKVCache` for this layer."""
        return LatentKVCache()

    @property
    def rotary(self):
        """The position part of the decoupled ``q_R`` and ``k_R``: the one
        given (``rotary=``, such as chapter 11's
        :class:`~attn_np.rope_scaling.ScaledRotary`), else chapter 6's
        rotation with this layer's RoPE settings (read each time, as for
        the other layers)."""
        if self._rotary is not None:
            return self._rotary
        return Rotary(self.rope_base, self.rope_layout)

    @property
    def attention_weights(self):
        """``[B, n_heads, L_q, L_k]`` weights of the last forward (None
        before the first)."""
        if self._att is None:
            return None
        B, n_kv, G, L_q, L_k = self._att.weights.shape
        return self._att.weights.reshape(B, n_kv * G, L_q, L_k)

    # ---------------------------------------------------------- forward
    def forward(
        self, x, *, causal=False, mask=None, kv_cache=None, absorb=None
    ):
        """``x`` is ``[L, d_model]`` or ``[B, L, d_model]``; returns ``y``.

        ``mask`` (bool, True = may attend) broadcasts to
        ``[B, n_heads, L_q, L_k]``. With ``kv_cache`` (a
        :class:`LatentKVCache`) ``x`` is the next chunk: it sits at the
        positions after the cached ones, attends causally over them and
        itself, and its ``c_KV`` and ``k_R`` are appended.

        ``absorb`` picks the path: ``True`` folds ``W_uk`` and ``W_uv``
        into the query and output sides (no per-head key or value is
        built; inference only), ``False`` builds every head's keys and
        values from the latents. Default: absorbed with a cache,
        expanded without one (training needs the expanded path).

        Finite inputs whose scores or output overflow the dtype raise a
        ``ValueError``. The layer keeps ``x`` itself for the backward (no
        copy): :meth:`backward` raises a ``ValueError`` if ``x`` was
        changed in place after the forward (a checksum is kept).
        """
        causal = check_flag(causal, "causal")
        name = "x" if kv_cache is None else "x_chunk"
        x3, unbatched = check_layer_input(x, self.d_model, name)
        B, L, _ = x3.shape
        absorb = (kv_cache is not None) if absorb is None else absorb
        absorb = check_flag(absorb, "absorb")
        self.check_cache(kv_cache, x3)
        start = 0 if kv_cache is None else len(kv_cache)
        causal = causal or kv_cache is not None
        pos = np.arange(start, start + L)  # absolute positions: [L]

        q_c, q_r, q_keep = self._queries(x3, pos)  # [B, h, L, d_h|d_R]
        c_kv, k_r, kv_keep = self._latents(x3, pos)  # [B, L, d_c|d_R]
        if kv_cache is not None:
            rows = kv_cache.append(c_kv, k_r)  # view: [B, L_k, d_c + d_R]
        else:
            rows = np.concatenate([c_kv, k_r], axis=-1)  # [B, L, d_c+d_R]
        L_k = rows.shape[1]
        where = dict(
            causal=causal,
            allowed=group_mask(mask, B, self.n_heads, 1, L, L_k),
            scale=self.scale,
            check_finite=False,  # x was checked once
        )
        if absorb:
            o, self._att = self._attend_absorbed(q_c, q_r, rows, where)
        else:
            d_c = self.d_latent_kv
            o, self._att = self._attend_expanded(
                q_c, q_r, rows[..., :d_c], rows[..., d_c:], where
            )
        o = merge_heads(o)  # [B, h, L, d_v] -> [B, L, h*d_v]
        with np.errstate(over="ignore", invalid="ignore"):  # checked:
            y = o @ self.params["W_o"]  # [B, L, h*d_v] @ [h*d_v, d]
        check_overflow(y, "y", "x or the weights are too large")
        self._cache = None  # the absorbed and cached paths: inference only
        if not absorb and kv_cache is None:
            self._cache = (
                x3,
                q_keep,
                kv_keep,
                c_kv,
                o,
                self._att,
                unbatched,
                fingerprint(x3),
            )
        return y[0] if unbatched else y

    def check_cache(self, kv_cache, x3):
        """Raise unless ``kv_cache`` (None, or a :class:`LatentKVCache`)
        can take ``x3``'s chunk from this layer."""
        if kv_cache is None:
            return
        check_cache_kind(kv_cache, LatentKVCache)
        dtype = np.result_type(x3.dtype, self.params["W_dkv"].dtype)
        layout = (x3.shape[0], self.d_latent_kv, self.d_rope)
        kv_cache.check_chunk(x3.shape, layout, dtype)
        kv_cache.check_owner(self, ("W_dkv", "W_kr"))

    def _queries(self, x3, pos):
        """``q_C [B, h, L, d_head]``, rotated ``q_R [B, h, L, d_rope]``."""
        W, h = self.params, self.n_heads
        c_q, norm = x3, None
        if self.d_latent_q is not None:
            c_q = x3 @ W["W_dq"]  # [B, L, d] @ [d, d_cq] -> [B, L, d_cq]
            if self.latent_norm:
                c_q, norm = rmsnorm_forward(
                    c_q, W["g_q"], eps=self.latent_eps
                )
            q_c = c_q @ W["W_uq"]  # [B, L, d_cq] @ [d_cq, h*d_h]
        else:
            q_c = x3 @ W["W_q"]  # [B, L, d] @ [d, h*d_h] -> [B, L, h*d_h]
        q_r = c_q @ W["W_qr"]  # [B, L, d_cq or d] @ [., h*d_R]
        q_c = split_heads(q_c, h, self.d_head)  # -> [B, h, L, d_h]
        q_r = split_heads(q_r, h, self.d_rope)  # -> [B, h, L, d_R]
        q_r, rope = self.rotary.forward(q_r, pos)  # rotated: [B, h, L, d_R]
        q_c, q_r, scaled = self.scale_queries(q_c, q_r, pos)
        return q_c, q_r, (c_q, norm, rope, scaled)

    def scale_queries(self, q_c, q_r, pos):
        """The queries' last step, after RoPE, on both paths: ``(q_c,
        q_r, saved)``. Chapter 7's layer changes nothing; a subclass
        multiplies each query by a scale of its head and position here
        (:meth:`scale_queries_backward` is the twin)."""
        return q_c, q_r, None

    def scale_queries_backward(self, dq, saved):
        """``dq [B, h, L, d_h + d_R]`` before :meth:`scale_queries`."""
        return dq

    def _latents(self, x3, pos):
        """``c_KV [B, L, d_latent_kv]``, rotated ``k_R [B, L, d_rope]``."""
        W = self.params
        c_kv = x3 @ W["W_dkv"]  # [B, L, d] @ [d, d_c] -> [B, L, d_c]
        norm = None
        if self.latent_norm:
            # [B, L, d_c]
            c_kv, norm = rmsnorm_forward(
                c_kv, W["g_kv"], eps=self.latent_eps
            )
        k_r = x3 @ W["W_kr"]  # [B, L, d] @ [d, d_R] -> [B, L, d_R]
        k_r, rope = self.rotary.forward(k_r, pos)  # rotated: [B, L, d_R]
        return c_kv, k_r, (norm, rope)

    def _attend_expanded(self, q_c, q_r, c_kv, k_r, where):
        """Every head's keys and values, rebuilt from the latents: the
        grouped core with one query head per key/value head (G = 1)."""
        W, h = self.params, self.n_heads
        B, L_k, _ = c_kv.shape
        k_c = c_kv @ W["W_uk"]  # [B, L_k, d_c] @ [d_c, h*d_h]
        v = c_kv @ W["W_uv"]  # [B, L_k, d_c] @ [d_c, h*d_v]
        k_c = split_heads(k_c, h, self.d_head)  # -> [B, h, L_k, d_h]
        v = split_heads(v, h, self.d_head_v)  # -> [B, h, L_k, d_v]
        k_r = np.broadcast_to(k_r[:, None], (B, h, L_k, self.d_rope))
        q = np.concatenate([q_c, q_r], axis=-1)  # [B, h, L, d_h + d_R]
        k = np.concatenate([k_c, k_r], axis=-1)  # [B, h, L_k, d_h + d_R]
        where = dict(where, allowed=_one_per_group(where["allowed"]))
        # [B, h, 1, L, d_h + d_R] -> o [B, h, 1, L, d_v]
        o, att = grouped_attention_forward(q[:, :, None], k, v, **where)
        return o[:, :, 0], att  # o: [B, h, L, d_v]

    def _absorbed_weights(self):
        """``W_uk`` per head ``[h, d_head, d_c]`` and ``W_uv`` per head
        ``[h, d_c, d_head_v]`` (views)."""
        W, h, d_c = self.params, self.n_heads, self.d_latent_kv
        w_uk = W["W_uk"].reshape(d_c, h, self.d_head).transpose(1, 2, 0)
        w_uv = W["W_uv"].reshape(d_c, h, self.d_head_v).transpose(1, 0, 2)
        return w_uk, w_uv

    def _attend_absorbed(self, q_c, q_r, rows, where):
        """Score against the cached rows ``[c_KV ; k_R]`` themselves: the
        grouped core with every head in one group (n_kv = 1, G = h)."""
        d_c = self.d_latent_kv
        w_uk, w_uv = self._absorbed_weights()
        q_lat = q_c @ w_uk  # [B, h, L, d_h] @ [h, d_h, d_c] -> [.., d_c]
        q = np.concatenate([q_lat, q_r], axis=-1)  # [B, h, L, d_c + d_R]
        kv = rows[:, None]  # [B, 1, L_k, d_c + d_R]: one key for all heads
        # [B, 1, h, L, d_c + d_R] -> o_lat [B, 1, h, L, d_c], a weighted
        # sum of latents per head
        o_lat, att = grouped_attention_forward(
            q[:, None], kv, kv[..., :d_c], **where
        )
        o = o_lat[:, 0] @ w_uv  # [B, h, L, d_c] @ [h, d_c, d_v] -> [.., d_v]
        return o, att

    # ------------------------------- the absorbed step, part by part
    # (a paged cache keeps the rows in its pages: chapter 15's engine)
    def project_latent(self, x3, positions):
        """``x [B, L, d_model]`` at ``positions [L]`` -> ``(q, rows)``:
        the absorbed queries ``q [B, 1, h, L, d_c + d_R]`` (one group of
        ``h`` heads over one key) and the rows a cache keeps, ``[c_KV ;
        k_R]`` ``[B, L, d_c + d_R]``."""
        q_c, q_r, _ = self._queries(x3, positions)  # [B, h, L, d_h|d_R]
        c_kv, k_r, _ = self._latents(x3, positions)  # [B, L, d_c|d_R]
        w_uk, _ = self._absorbed_weights()
        q_lat = q_c @ w_uk  # [B, h, L, d_h] @ [h, d_h, d_c] -> [.., d_c]
        q = np.concatenate([q_lat, q_r], axis=-1)  # [B, h, L, d_c + d_R]
        return q[:, None], np.concatenate([c_kv, k_r], axis=-1)

    def attend_latent(self, q, k, v, mask=None):
        """The absorbed core: ``q [B, 1, h, L, d_c + d_R]`` over the rows
        ``k [B, 1, L_k, d_c + d_R]`` (the last query at the last row),
        values ``v = k[..., :d_c]``, where ``mask`` (broadcasting to ``[B,
        h, L, L_k]``) allows; the latent outputs ``[B, 1, h, L, d_c]``."""
        B, _, h, L, _ = q.shape
        allowed = group_mask(mask, B, h, 1, L, k.shape[2])
        o_lat, _ = grouped_attention_forward(
            q, k, v, causal=True, allowed=allowed, scale=self.scale,
            check_finite=False,
        )  # fmt: skip
        return o_lat

    def output_latent(self, o_lat):
        """``o_lat [B, 1, h, L, d_c]`` -> ``y [B, L, d_model]``: each
        head's ``W_uv``, the heads side by side, ``W_o``."""
        _, w_uv = self._absorbed_weights()
        o = o_lat[:, 0] @ w_uv  # [B, h, L, d_c] @ [h, d_c, d_v] -> [.., d_v]
        return merge_heads(o) @ self.params["W_o"]  # [B, L, d_model]

    def step_parts(self, x_chunk, kv_cache) -> dict:
        """The parts of this layer's absorbed decode step of ``x_chunk [B,
        L, d_model]`` over ``kv_cache``, to be timed alone (the decode
        benchmark): ``{"weights": fn, "attention": fn, "softmax": fn}``.

        ``weights`` makes every product with a weight matrix, as the
        absorbed path does (queries, ``W_qr``, ``W_dkv``, ``W_kr``, the
        queries times ``W_uk`` per head, the latent outputs times ``W_uv``
        per head, ``W_o``); ``attention`` runs the grouped core of the
        ``h`` latent queries over the cached rows (values ``c_KV``), its
        softmax included; ``softmax`` the softmax alone over scores of
        that shape. The cache is read, never changed.
        """
        x3, _ = check_layer_input(x_chunk, self.d_model, "x_chunk")
        self.check_cache(kv_cache, x3)
        W, h, d_c = self.params, self.n_heads, self.d_latent_kv
        B, L, _ = x3.shape
        w_uk, w_uv = self._absorbed_weights()
        xf, dt = flat(x3), x3.dtype
        q_c = np.zeros((B, h, L, self.d_head), dtype=dt)
        o_lat = np.zeros((B, h, L, d_c), dtype=dt)
        o = np.zeros((B * L, h * self.d_head_v), dtype=dt)
        kv = kv_cache.rows[:, None]  # [B, 1, n, d_c + d_R]: one key for all
        q = np.zeros((B, 1, h, L, kv.shape[-1]), dtype=dt)
        s = np.zeros((B, 1, h, L, kv.shape[2]), dtype=dt)
        queries = ("W_q",) if self.d_latent_q is None else ("W_dq",)

        def weights():
            c_q = xf @ W[queries[0]]  # [B*L, d] @ [d, h*d_h or d_cq]
            if self.d_latent_q is not None:
                c_q = (c_q @ W["W_uq"], c_q @ W["W_qr"])  # [B*L, h*d]
            else:
                c_q = (c_q, xf @ W["W_qr"])  # [B*L, d] @ [d, h*d_R]
            return (
                *c_q,
                xf @ W["W_dkv"],  # [B*L, d] @ [d, d_c]
                xf @ W["W_kr"],  # [B*L, d] @ [d, d_R]
                q_c @ w_uk,  # [B, h, L, d_h] @ [h, d_h, d_c]
                o_lat @ w_uv,  # [B, h, L, d_c] @ [h, d_c, d_v]
                o @ W["W_o"],  # [B*L, h*d_v] @ [h*d_v, d]
            )

        def attention():  # -> [B, 1, h, L, d_c]
            return grouped_attention_forward(
                q, kv, kv[..., :d_c], scale=self.scale, check_finite=False
            )

        return decode_step_parts(weights, attention, s)

    # --------------------------------------------------------- backward
    def backward(self, dy):
        """Gradient with respect to ``x``; fills ``self.grads``."""
        if self._cache is None:
            raise RuntimeError(
                "backward needs a preceding forward without kv_cache and "
                "with absorb=False (the absorbed and cached paths are "
                "inference only)"
            )
        x3, q_keep, kv_keep, c_kv, o, att, unbatched, saved = self._cache
        B, L, _ = x3.shape
        want = (L, self.d_model) if unbatched else (B, L, self.d_model)
        dy = check_upstream(dy, "dy", want, "the layer's output")
        check_unchanged(saved, {"x": x3}, "backward")
        dy3 = dy[None] if unbatched else dy
        W, G, h = self.params, self.grads, self.n_heads
        d_h = self.d_head

        G["W_o"] = flat(o).T @ flat(dy3)  # [h*d_v, B*L] @ [B*L, d]
        do = dy3 @ W["W_o"].T  # [B, L, d] @ [d, h*d_v] -> [B, L, h*d_v]
        do = split_heads(do, h, self.d_head_v)  # -> [B, h, L, d_v]
        g = grouped_attention_backward(do[:, :, None], att)  # G = 1
        dq, dk, dv = g["q"][:, :, 0], g["k"], g["v"]  # [B, h, L(_k), ..]
        dq = self.scale_queries_backward(dq, q_keep[3])
        dk_c = merge_heads(dk[..., :d_h])  # [B, h, L, d_h] -> [B, L, h*d_h]
        dk_r = dk[..., d_h:].sum(axis=1)  # shared key: sum over heads
        dv = merge_heads(dv)  # [B, h, L, d_v] -> [B, L, h*d_v]

        # keys and values: c_KV feeds both k_C and v
        G["W_uk"] = flat(c_kv).T @ flat(dk_c)  # [d_c, h*d_h]
        G["W_uv"] = flat(c_kv).T @ flat(dv)  # [d_c, h*d_v]
        dc_kv = dk_c @ W["W_uk"].T + dv @ W["W_uv"].T  # [B, L, d_c]
        kv_norm, k_rope = kv_keep
        if kv_norm is not None:
            dc_kv, G["g_kv"] = rmsnorm_backward(dc_kv, kv_norm)
        dk_r = self.rotary.backward(dk_r, k_rope)  # un-rotate: [B, L, d_R]
        xf = flat(x3)  # [B*L, d]
        G["W_dkv"] = xf.T @ flat(dc_kv)  # [d, B*L] @ [B*L, d_c]
        G["W_kr"] = xf.T @ flat(dk_r)  # [d, B*L] @ [B*L, d_R]
        dx = dc_kv @ W["W_dkv"].T + dk_r @ W["W_kr"].T  # [B, L, d]

        # queries
        c_q, q_norm, q_rope, _ = q_keep
        dq_r = self.rotary.backward(dq[..., d_h:], q_rope)  # [B, h, L, d_R]
        dq_r = merge_heads(dq_r)  # -> [B, L, h*d_R]
        dq_c = merge_heads(dq[..., :d_h])  # -> [B, L, h*d_h]
        G["W_qr"] = flat(c_q).T @ flat(dq_r)  # [d_cq or d, h*d_R]
        w_qc = "W_q" if self.d_latent_q is None else "W_uq"
        G[w_qc] = flat(c_q).T @ flat(dq_c)  # [d_cq or d, h*d_h]
        dc_q = dq_c @ W[w_qc].T + dq_r @ W["W_qr"].T  # [B, L, d_cq or d]
        if self.d_latent_q is None:
            dx = dx + dc_q  # c_Q is x itself
        else:
            if q_norm is not None:
                dc_q, G["g_q"] = rmsnorm_backward(dc_q, q_norm)
            G["W_dq"] = xf.T @ flat(dc_q)  # [d, B*L] @ [B*L, d_cq]
            dx = dx + dc_q @ W["W_dq"].T  # [B, L, d_cq] @ [d_cq, d]
        return dx[0] if unbatched else dx


def _one_per_group(allowed):
    """A mask laid out for one group of all heads (``[.., 1, h, L_q,
    L_k]``) relaid for one head per group (``[.., h, 1, L_q, L_k]``)."""
    if allowed is None or allowed.ndim <= 2:
        return allowed
    return allowed.swapaxes(-4, -3)
