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
    as_float_array,
    check_count,
    check_finite,
    check_float_dtype,
    check_latent_dims,
    check_mask,
    check_upstream,
)
from .attention import attention_backward, attention_forward, causal_mask
from .kv_cache import _grow
from .multihead import merge_kv, split_kv
from .rope import check_rope_settings, rope_backward, rope_forward
from .training.layers import rmsnorm_backward, rmsnorm_forward


class LatentKVCache:
    """The latent cache of one MLA layer: ``c_KV`` and ``k_R`` per position.

    One buffer holds both, and :attr:`rows` shows it as ``[B, len,
    d_latent_kv + d_rope]``: row ``j`` is ``[c_KV,j ; k_R,j]``, the key
    that the absorbed path scores against (its first ``d_latent_kv``
    columns are also the value). Nothing per head is stored. As in
    :class:`attn_np.KVCache`, the buffer is kept *transposed*, ``[B,
    d_latent_kv + d_rope, capacity]``, one row per feature, so that a
    decode step's two products stream along rows ``len`` numbers long;
    :attr:`rows` is a transposed view. Capacity doubles when it runs out.
    """

    def __init__(self, initial_capacity: int = 16):
        self._initial_capacity = check_count(
            initial_capacity, "initial_capacity"
        )
        self._buf = None  # [B, d_latent_kv + d_rope, capacity]
        self._d_latent_kv = None
        self._len = 0
        self.reallocations = 0  # how many times the buffer grew

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        if self._buf is None:
            return "LatentKVCache(empty)"
        B, d_c, d_r = self.layout
        return (
            f"LatentKVCache(batch={B}, d_latent_kv={d_c}, d_rope={d_r}, "
            f"positions={self._len}, capacity={self.capacity}, "
            f"dtype={self.dtype}, nbytes={self.nbytes})"
        )

    @property
    def layout(self) -> tuple[int, int, int] | None:
        """``(batch, d_latent_kv, d_rope)``, or None while empty."""
        if self._buf is None:
            return None
        B, width, _ = self._buf.shape
        return B, self._d_latent_kv, width - self._d_latent_kv

    @property
    def dtype(self):
        return None if self._buf is None else self._buf.dtype

    @property
    def capacity(self) -> int:
        return 0 if self._buf is None else self._buf.shape[2]

    @property
    def nbytes(self) -> int:
        """``B * len * (d_latent_kv + d_rope) * itemsize``: what is held.

        Positions stored, not spare capacity. No ``n_heads`` anywhere.
        """
        if self._buf is None:
            return 0
        B, width, _ = self._buf.shape
        return B * self._len * width * self._buf.itemsize

    @property
    def rows(self) -> np.ndarray:
        """View of the rows ``[c_KV ; k_R]``: ``[B, len, d_c + d_R]``
        (stored transposed; no copy)."""
        if self._buf is None:
            raise ValueError("the cache is empty: it holds no latents yet")
        return self._buf[:, :, : self._len].swapaxes(1, 2)

    @property
    def latents(self) -> np.ndarray:
        """View of the cached ``c_KV``: ``[B, len, d_latent_kv]``."""
        return self.rows[..., : self._d_latent_kv]

    @property
    def rope_keys(self) -> np.ndarray:
        """View of the cached rotary keys ``k_R``: ``[B, len, d_rope]``."""
        return self.rows[..., self._d_latent_kv :]

    def check_chunk(self, x_shape, *, batch, d_latent_kv, d_rope, dtype):
        """Raise unless a layer's ``x_chunk`` of shape ``x_shape`` fits."""
        if self._buf is None:
            return
        Bc, d_c, d_r = self.layout
        if batch != Bc:
            raise ValueError(
                f"x_chunk has batch size {batch} (shape {tuple(x_shape)})"
                f" but kv_cache holds batch size {Bc} ({self!r})"
            )
        if (d_latent_kv, d_rope) != (d_c, d_r):
            raise ValueError(
                f"x_chunk (shape {tuple(x_shape)}) gives d_latent_kv="
                f"{d_latent_kv} and d_rope={d_rope} per position, but "
                f"kv_cache holds {d_c} and {d_r}: a cache belongs to one "
                f"layer ({self!r})"
            )
        if np.dtype(dtype) != self.dtype:
            raise TypeError(
                f"x_chunk (dtype {np.dtype(dtype)} after the projections) "
                f"does not match the dtype of kv_cache ({self.dtype})"
            )

    def append(self, c_kv, k_r) -> np.ndarray:
        """Add a chunk's ``c_KV [B, L, d_c]`` and ``k_R [B, L, d_R]``.

        Returns :attr:`rows`, the chunk included (a view, no copy).
        """
        for name, a in (("c_kv", c_kv), ("k_r", k_r)):
            if not isinstance(a, np.ndarray) or a.ndim != 3:
                raise ValueError(
                    f"{name} must be a NumPy array [B, L, d], got "
                    f"{getattr(a, 'shape', type(a).__name__)}"
                )
        if c_kv.shape[:2] != k_r.shape[:2]:
            raise ValueError(
                f"c_kv and k_r must share B and L, got c_kv {c_kv.shape} "
                f"and k_r {k_r.shape}"
            )
        if not np.issubdtype(c_kv.dtype, np.floating) or (
            c_kv.dtype != k_r.dtype
        ):
            raise TypeError(
                f"c_kv and k_r must share one floating-point dtype, got "
                f"{c_kv.dtype} and {k_r.dtype}"
            )
        B, L, d_c = c_kv.shape
        d_r = k_r.shape[2]
        if self._buf is None:
            cap = max(self._initial_capacity, L)
            self._buf = np.empty((B, d_c + d_r, cap), dtype=c_kv.dtype)
            self._d_latent_kv = d_c
        elif (B, d_c, d_r) != self.layout or c_kv.dtype != self.dtype:
            raise ValueError(
                f"chunk does not match the cache {self!r}: got c_kv "
                f"{c_kv.shape} {c_kv.dtype} and k_r {k_r.shape}"
            )
        need = self._len + L
        if need > self.capacity:
            cap = max(need, 2 * self.capacity)  # doubling: O(n) copied
            self._buf = _grow(self._buf, cap, self._len, axis=2)
            self.reallocations += 1
        # [B, L, d] into columns len ... len+L-1 of [B, d_c + d_R, cap]
        self._buf[:, :d_c, self._len : need] = c_kv.swapaxes(1, 2)
        self._buf[:, d_c:, self._len : need] = k_r.swapaxes(1, 2)
        self._len = need
        return self.rows

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (keeps the memory)."""
        ok = isinstance(length, (int, np.integer)) and not isinstance(
            length, bool
        )
        if not ok or not 0 <= length <= self._len:
            raise ValueError(
                f"length must be an integer in [0, {self._len}] (len of "
                f"the cache), got {length!r}"
            )
        self._len = int(length)


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
    """

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
        self.latent_norm, self.dtype = bool(latent_norm), dtype
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
        self.attention_weights = None  # [B, n_heads, L_q, L_k]
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
        """
        name = "x" if kv_cache is None else "x_chunk"
        x3, unbatched = self._check_x(x, name)
        B, L, _ = x3.shape
        absorb = (kv_cache is not None) if absorb is None else absorb
        if not isinstance(absorb, (bool, np.bool_)):
            raise TypeError(f"absorb must be True or False, got {absorb!r}")
        start = 0
        if kv_cache is not None:
            if not isinstance(kv_cache, LatentKVCache):
                raise TypeError(
                    "kv_cache must be an attn_np.LatentKVCache, got "
                    f"{type(kv_cache).__name__}"
                )
            dtype = np.result_type(x3.dtype, self.params["W_dkv"].dtype)
            kv_cache.check_chunk(
                x3.shape,
                batch=B,
                d_latent_kv=self.d_latent_kv,
                d_rope=self.d_rope,
                dtype=dtype,
            )
            start, causal = len(kv_cache), True
        pos = np.arange(start, start + L)  # absolute positions: [L]

        q_c, q_r, q_keep = self._queries(x3, pos)  # [B, h, L, d_h|d_R]
        c_kv, k_r, kv_keep = self._latents(x3, pos)  # [B, L, d_c|d_R]
        if kv_cache is not None:
            rows = kv_cache.append(c_kv, k_r)  # view: [B, L_k, d_c + d_R]
        else:
            rows = np.concatenate([c_kv, k_r], axis=-1)  # [B, L, d_c+d_R]
        L_k = rows.shape[1]
        allowed = None
        if mask is not None:
            full = (B, self.n_heads, L, L_k)
            allowed = check_mask(mask, full, "[B, n_heads, L_q, L_k]")
        if causal and L > 1:  # the last query aligns with the last key
            c = causal_mask(L, L_k)  # [L, L_k]
            allowed = c if allowed is None else allowed & c

        if absorb:
            o, weights = self._attend_absorbed(q_c, q_r, rows, allowed)
        else:
            d_c = self.d_latent_kv
            o, att = self._attend_expanded(
                q_c, q_r, rows[..., :d_c], rows[..., d_c:], allowed
            )
            weights = att.weights  # [B, h, L, L_k]
        o = merge_kv(o)  # [B, h, L, d_v] -> [B, L, h*d_v]
        y = o @ self.params["W_o"]  # [B, L, h*d_v] @ [h*d_v, d] -> [B, L, d]
        self.attention_weights = weights
        self._cache = None  # the absorbed and cached paths: inference only
        if not absorb and kv_cache is None:
            self._cache = (x3, q_keep, kv_keep, c_kv, o, att, unbatched)
        return y[0] if unbatched else y

    def _queries(self, x3, pos):
        """``q_C [B, h, L, d_head]``, rotated ``q_R [B, h, L, d_rope]``."""
        W, h = self.params, self.n_heads
        c_q, norm = x3, None
        if self.d_latent_q is not None:
            c_q = x3 @ W["W_dq"]  # [B, L, d] @ [d, d_cq] -> [B, L, d_cq]
            if self.latent_norm:
                c_q, norm = rmsnorm_forward(c_q, W["g_q"])  # [B, L, d_cq]
            q_c = c_q @ W["W_uq"]  # [B, L, d_cq] @ [d_cq, h*d_h]
        else:
            q_c = x3 @ W["W_q"]  # [B, L, d] @ [d, h*d_h] -> [B, L, h*d_h]
        q_r = c_q @ W["W_qr"]  # [B, L, d_cq or d] @ [., h*d_R]
        q_c = split_kv(q_c, h, self.d_head)  # -> [B, h, L, d_h]
        q_r = split_kv(q_r, h, self.d_rope)  # -> [B, h, L, d_R]
        q_r, rope = self._rope(q_r, pos)  # rotated: [B, h, L, d_R]
        return q_c, q_r, (c_q, norm, rope)

    def _latents(self, x3, pos):
        """``c_KV [B, L, d_latent_kv]``, rotated ``k_R [B, L, d_rope]``."""
        W = self.params
        c_kv = x3 @ W["W_dkv"]  # [B, L, d] @ [d, d_c] -> [B, L, d_c]
        norm = None
        if self.latent_norm:
            c_kv, norm = rmsnorm_forward(c_kv, W["g_kv"])  # [B, L, d_c]
        k_r = x3 @ W["W_kr"]  # [B, L, d] @ [d, d_R] -> [B, L, d_R]
        k_r, rope = self._rope(k_r, pos)  # rotated: [B, L, d_R]
        return c_kv, k_r, (norm, rope)

    def _rope(self, t, pos):
        return rope_forward(
            t, pos, base=self.rope_base, layout=self.rope_layout
        )

    def _attend_expanded(self, q_c, q_r, c_kv, k_r, allowed):
        """Every head's keys and values, rebuilt from the latents."""
        W, h = self.params, self.n_heads
        B, L_k, _ = c_kv.shape
        k_c = c_kv @ W["W_uk"]  # [B, L_k, d_c] @ [d_c, h*d_h]
        v = c_kv @ W["W_uv"]  # [B, L_k, d_c] @ [d_c, h*d_v]
        k_c = split_kv(k_c, h, self.d_head)  # -> [B, h, L_k, d_h]
        v = split_kv(v, h, self.d_head_v)  # -> [B, h, L_k, d_v]
        k_r = np.broadcast_to(k_r[:, None], (B, h, L_k, self.d_rope))
        q = np.concatenate([q_c, q_r], axis=-1)  # [B, h, L, d_h + d_R]
        k = np.concatenate([k_c, k_r], axis=-1)  # [B, h, L_k, d_h + d_R]
        # x was checked finite once, in _check_x
        o, att = attention_forward(
            q, k, v, mask=allowed, scale=self.scale, check_finite=False
        )
        return o, att  # o: [B, h, L, d_v]

    def _attend_absorbed(self, q_c, q_r, rows, allowed):
        """Score against the cached rows ``[c_KV ; k_R]`` themselves."""
        W, h, d_c = self.params, self.n_heads, self.d_latent_kv
        B, _, L, _ = q_c.shape
        L_k = rows.shape[1]
        w_uk = W["W_uk"].reshape(d_c, h, self.d_head).transpose(1, 2, 0)
        w_uv = W["W_uv"].reshape(d_c, h, self.d_head_v).transpose(1, 0, 2)
        q_lat = q_c @ w_uk  # [B, h, L, d_h] @ [h, d_h, d_c] -> [.., d_c]
        q = np.concatenate([q_lat, q_r], axis=-1)  # [B, h, L, d_c + d_R]
        q = q.reshape(B, 1, h * L, d_c + self.d_rope)  # heads stacked
        kv = rows[:, None]  # [B, 1, L_k, d_c + d_R]: one key for all heads
        # lay the mask out like the stacked rows: head i, query t -> i*L+t
        if allowed is not None and allowed.ndim <= 2:  # same for all heads
            allowed = np.tile(np.broadcast_to(allowed, (L, L_k)), (h, 1))
        elif allowed is not None:  # per batch or per head
            allowed = np.broadcast_to(allowed, (B, h, L, L_k))
            allowed = allowed.reshape(B, 1, h * L, L_k)
        o_lat, att = attention_forward(
            q,
            kv,
            kv[..., :d_c],
            mask=allowed,
            scale=self.scale,
            check_finite=False,
        )  # o_lat: [B, 1, h*L, d_c], a weighted sum of latents per head
        o_lat = o_lat.reshape(B, h, L, d_c)
        o = o_lat @ w_uv  # [B, h, L, d_c] @ [h, d_c, d_v] -> [B, h, L, d_v]
        return o, att.weights.reshape(B, h, L, L_k)

    # --------------------------------------------------------- backward
    def backward(self, dy):
        """Gradient with respect to ``x``; fills ``self.grads``."""
        if self._cache is None:
            raise RuntimeError(
                "backward needs a preceding forward without kv_cache and "
                "with absorb=False (the absorbed and cached paths are "
                "inference only)"
            )
        x3, q_keep, kv_keep, c_kv, o, att, unbatched = self._cache
        B, L, _ = x3.shape
        want = (L, self.d_model) if unbatched else (B, L, self.d_model)
        dy = check_upstream(dy, "dy", want, "the layer's output")
        dy3 = dy[None] if unbatched else dy
        W, G, h = self.params, self.grads, self.n_heads
        d_h = self.d_head

        G["W_o"] = _flat(o).T @ _flat(dy3)  # [h*d_v, B*L] @ [B*L, d]
        do = dy3 @ W["W_o"].T  # [B, L, d] @ [d, h*d_v] -> [B, L, h*d_v]
        do = split_kv(do, h, self.d_head_v)  # -> [B, h, L, d_v]
        dq, dk, dv = attention_backward(do, att)  # [B, h, L(_k), ...]
        dk_c = merge_kv(dk[..., :d_h])  # [B, h, L, d_h] -> [B, L, h*d_h]
        dk_r = dk[..., d_h:].sum(axis=1)  # shared key: sum over heads
        dv = merge_kv(dv)  # [B, h, L, d_v] -> [B, L, h*d_v]

        # keys and values: c_KV feeds both k_C and v
        G["W_uk"] = _flat(c_kv).T @ _flat(dk_c)  # [d_c, h*d_h]
        G["W_uv"] = _flat(c_kv).T @ _flat(dv)  # [d_c, h*d_v]
        dc_kv = dk_c @ W["W_uk"].T + dv @ W["W_uv"].T  # [B, L, d_c]
        kv_norm, k_rope = kv_keep
        if kv_norm is not None:
            dc_kv, G["g_kv"] = rmsnorm_backward(dc_kv, kv_norm)
        dk_r = rope_backward(dk_r, k_rope)  # un-rotate: [B, L, d_R]
        xf = _flat(x3)  # [B*L, d]
        G["W_dkv"] = xf.T @ _flat(dc_kv)  # [d, B*L] @ [B*L, d_c]
        G["W_kr"] = xf.T @ _flat(dk_r)  # [d, B*L] @ [B*L, d_R]
        dx = dc_kv @ W["W_dkv"].T + dk_r @ W["W_kr"].T  # [B, L, d]

        # queries
        c_q, q_norm, q_rope = q_keep
        dq_r = rope_backward(dq[..., d_h:], q_rope)  # [B, h, L, d_R]
        dq_r = merge_kv(dq_r)  # -> [B, L, h*d_R]
        dq_c = merge_kv(dq[..., :d_h])  # -> [B, L, h*d_h]
        G["W_qr"] = _flat(c_q).T @ _flat(dq_r)  # [d_cq or d, h*d_R]
        w_qc = "W_q" if self.d_latent_q is None else "W_uq"
        G[w_qc] = _flat(c_q).T @ _flat(dq_c)  # [d_cq or d, h*d_h]
        dc_q = dq_c @ W[w_qc].T + dq_r @ W["W_qr"].T  # [B, L, d_cq or d]
        if self.d_latent_q is None:
            dx = dx + dc_q  # c_Q is x itself
        else:
            if q_norm is not None:
                dc_q, G["g_q"] = rmsnorm_backward(dc_q, q_norm)
            G["W_dq"] = xf.T @ _flat(dc_q)  # [d, B*L] @ [B*L, d_cq]
            dx = dx + dc_q @ W["W_dq"].T  # [B, L, d_cq] @ [d_cq, d]
        return dx[0] if unbatched else dx

    # ---------------------------------------------------------- helpers
    def _check_x(self, x, name):
        x = as_float_array(x, name)
        check_finite(x, name)
        if x.ndim not in (2, 3) or x.shape[-1] != self.d_model:
            raise ValueError(
                f"{name} must have shape [L, d_model] or [B, L, d_model] "
                f"with d_model={self.d_model}, got {x.shape}"
            )
        if x.shape[-2] == 0:
            raise ValueError(
                f"{name} must hold at least one position, got {x.shape}"
            )
        return (x[None], True) if x.ndim == 2 else (x, False)


def _flat(t):
    return t.reshape(-1, t.shape[-1])  # [B, L, n] -> [B*L, n]
