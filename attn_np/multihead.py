"""Multi-head, grouped-query and multi-query attention layers (chapters 2 to
4).

One code path serves all three. ``n_kv_heads`` key/value heads are shared by
groups of ``G = n_heads // n_kv_heads`` query heads; query head ``i`` reads
key/value head ``i // G``. ``n_kv_heads = n_heads`` is multi-head attention
(Vaswani et al. 2017), ``n_kv_heads = 1`` is multi-query attention (Shazeer
2019), anything in between is grouped-query attention (Ainslie et al. 2023).

Layout. The ``G`` query heads of a group are stacked along the query axis, so
attention sees

    q: [B, n_kv, G*L_q, d_k]
    k: [B, n_kv, L_k, d_k]
    v: [B, n_kv, L_k, d_v]

and each key/value head meets *one* contiguous ``[G*L_q, d_k]`` query matrix
in a single matmul. Keys and values are never copied per query head, and in
the backward the matmul ``dS^T Q`` over the stacked rows sums the gradients
of the whole group into its one key/value head. A decode step of a group
(``G > 1``) with fewer than :attr:`GroupedQueryAttention.min_stacked_rows`
stacked rows views them as ``[B, n_kv, G, L_q, d_k]`` against ``[B, n_kv,
1, L_k, d]`` instead: one matrix-vector product per query head, which BLAS
may stream faster than a product with a handful of rows (chapter 4).

Rotary positions (chapter 6). With ``rope_base`` set, every query and key
head is rotated (:func:`~attn_np.rope_forward`) after the head split and
before the scores, at positions ``0 ... L-1``; with a
:class:`~attn_np.KVCache` a chunk's positions continue from ``len(cache)``,
and keys are cached after their rotation.

Chapter 8 adds ``window=W`` (sliding-window attention: a query sees the
last W positions, itself included) and ``sinks=True`` (one learned sink
logit per query head, ``params["sinks"]``, as in gpt-oss).

With ``flash=True`` (chapter 9) the same layer runs FlashAttention's tiled
kernels instead: the stacked queries are viewed as ``[B, n_kv, G, L_q, d_k]``
and the keys and values as ``[B, n_kv, 1, L_k, d]`` (free reshapes), so the
kernels see each query row's own position, and the ``[L_q, L_k]`` attention
weights are never built, nor kept.
"""

from __future__ import annotations

import numpy as np

from ._checks import (
    as_float_array,
    check_finite,
    check_float_dtype,
    check_head_dims,
    check_mask,
)
from .attention import (
    attention_backward,
    attention_forward,
    causal_mask,
    check_window,
)
from .flash import flash_attention_backward, flash_attention_forward
from .kv_cache import KVCache
from .rope import check_rope_settings, rope_backward, rope_forward


class GroupedQueryAttention:
    """Attention with ``n_heads`` query heads sharing ``n_kv_heads``
    key/value heads.

    Parameters (the document's shapes, no biases)::

        W_q [d_model, n_heads * d_k]      W_k [d_model, n_kv_heads * d_k]
        W_v [d_model, n_kv_heads * d_v]   W_o [n_heads * d_v, d_model]

    ``rope_base`` (None: no rotation) turns on rotary position embeddings
    with that base, in ``rope_layout`` (``"half"`` or ``"interleaved"``),
    over the first ``rope_dim`` features of each head (default ``d_k``).

    ``window=W`` makes it a sliding-window layer (always causal);
    ``sinks=True`` adds ``sinks [n_heads]``, one sink logit per query head,
    starting at 0.

    ``flash=True`` computes attention with
    :func:`~attn_np.flash_attention_forward` and its backward: the same
    outputs and gradients in O(L) memory, but no ``attention_weights``,
    no ``mask`` and no sinks (``causal`` and ``window`` only).
    """

    # A chunk decoded with a KVCache stacks its G*L query rows per key/value
    # head into one matrix product only from this many rows on; below, a
    # group of G > 1 heads makes one product per query head (L rows each:
    # matrix-vector products in a decode step), which BLAS may stream
    # faster than one product with very few rows (``python -m
    # attn_np.bench decode --levers`` measures it).
    min_stacked_rows = 8

    def __init__(
        self,
        d_model,
        n_heads,
        n_kv_heads,
        d_k=None,
        d_v=None,
        seed=0,
        dtype=np.float64,
        rope_base=None,
        rope_layout="half",
        rope_dim=None,
        window=None,
        sinks=False,
        flash=False,
    ):
        d_model, n_heads, n_kv_heads, d_k, d_v = check_head_dims(
            d_model, n_heads, n_kv_heads, d_k, d_v
        )
        self.rope_base, self.rope_layout, self.rope_dim = (
            check_rope_settings(rope_base, rope_layout, rope_dim, d_k)
        )
        self.d_model, self.n_heads = d_model, n_heads
        self.n_kv_heads, self.d_k, self.d_v = n_kv_heads, d_k, d_v
        self.group_size = n_heads // n_kv_heads
        self.dtype = dtype = check_float_dtype(dtype)
        if not isinstance(flash, (bool, np.bool_)):
            raise TypeError(f"flash must be True or False, got {flash!r}")
        if flash and sinks:
            raise ValueError(
                "sinks=True is not supported with flash=True: the tiled "
                "kernels have no sink column; use flash=False"
            )
        self.flash = bool(flash)
        rng = np.random.default_rng(seed)
        shapes = {
            "W_q": (d_model, n_heads * d_k),
            "W_k": (d_model, n_kv_heads * d_k),
            "W_v": (d_model, n_kv_heads * d_v),
            "W_o": (n_heads * d_v, d_model),
        }
        # N(0, 1/fan_in): keeps the variance of every projection's output
        # near that of its input.
        self.params = {
            name: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(
                dtype
            )
            for name, shape in shapes.items()
        }
        self.window = check_window(window)
        if sinks:  # a logit per query head, 0: the sink starts as one key
            self.params["sinks"] = np.zeros(n_heads, dtype=dtype)
        self.grads = {
            name: np.zeros_like(p) for name, p in self.params.items()
        }
        # [B, n_heads, L_q, L_k] after each forward (not with flash=True)
        self._weights = None
        self.sink_weights = None  # [B, n_heads, L_q]: mass on the sink
        self._cache = None

    def __repr__(self) -> str:
        extra = "" if self.window is None else f", window={self.window}"
        extra += ", sinks=True" if "sinks" in self.params else ""
        extra += ", flash=True" if self.flash else ""
        return (
            f"{type(self).__name__}(d_model={self.d_model}, "
            f"n_heads={self.n_heads}, "
            f"n_kv_heads={self.n_kv_heads}, d_k={self.d_k}, "
            f"d_v={self.d_v}, dtype={self.dtype}{self._rope_repr()}"
            f"{extra})"
        )

    def _rope_repr(self) -> str:
        if self.rope_base is None:
            return ""
        return (
            f", rope_base={self.rope_base:g}, "
            f"rope_layout={self.rope_layout!r}, rope_dim={self.rope_dim}"
        )

    @property
    def attention_weights(self):
        """``[B, n_heads, L_q, L_k]`` weights of the last forward (None
        before the first). Not kept with ``flash=True``: asking raises."""
        if self.flash:
            raise AttributeError(
                "attention_weights are not kept with flash=True: the tiled "
                "kernels never build the [B, n_heads, L_q, L_k] weights "
                "(that is their point); use a layer with flash=False, or "
                "attn_np.attention_forward, to look at them"
            )
        return self._weights

    @property
    def n_params(self) -> int:
        return sum(p.size for p in self.params.values())

    # ------------------------------------------------------------------
    # forward
    def forward(self, x, *, causal: bool = False, mask=None, kv_cache=None):
        """``x`` is ``[L, d_model]`` or ``[B, L, d_model]``; returns ``y`` of
        the same shape.

        ``mask`` (bool, True where a query may attend a key) broadcasts to
        ``[B, n_heads, L_q, L_k]``. With ``kv_cache`` (a
        :class:`~attn_np.KVCache`), ``x`` is the next chunk: it attends
        causally over every cached position plus itself, and its keys and
        values are added to the cache. A window layer needs
        ``causal=True`` and a cache with the same window.
        """
        x3, unbatched = self._check_x(
            x, "x" if kv_cache is None else "x_chunk"
        )
        B, L, _ = x3.shape
        h, n_kv, d_k, d_v = self.n_heads, self.n_kv_heads, self.d_k, self.d_v
        W = self.params
        start = 0  # the position of the chunk's first token
        if kv_cache is not None:
            if not isinstance(kv_cache, KVCache):
                raise TypeError(
                    "kv_cache must be an attn_np.KVCache, got "
                    f"{type(kv_cache).__name__}"
                )
            # the dtype of the keys and values
            dtype = np.result_type(x3.dtype, W["W_k"].dtype)
            kv_cache.check_chunk(
                x3.shape,
                batch=B,
                n_kv_heads=n_kv,
                d_k=d_k,
                d_v=d_v,
                dtype=dtype,
            )
            if kv_cache.window != self.window:
                raise ValueError(
                    f"kv_cache has window={kv_cache.window} but the layer "
                    f"has window={self.window}: give the layer a "
                    "KVCache(window=layer.window)"
                )
            if self.flash and kv_cache.sink_tokens:
                raise ValueError(
                    "a StreamingLLM cache (sink_tokens > 0) is not "
                    "supported with flash=True: its keys are rotated by "
                    "slot, which the tiled kernels do not do"
                )
            # the chunk attends over the cache and causally over itself
            causal = True
            start = len(kv_cache)
        elif self.window is not None and not causal:
            raise ValueError(
                f"a window layer (window={self.window}) is causal: call "
                "forward(x, causal=True)"
            )

        # the B*L positions as the rows of one matrix: one BLAS call per
        # projection (a stacked [B, L, d] product costs more per step)
        xf = _flat(x3)  # [B*L, d_model]
        # [B*L, d_model] @ [d_model, h*d_k] -> [B, L, h*d_k]
        q = (xf @ W["W_q"]).reshape(B, L, h * d_k)
        # [B*L, d_model] @ [d_model, n_kv*d_k] -> [B, L, n_kv*d_k]
        k = (xf @ W["W_k"]).reshape(B, L, n_kv * d_k)
        # [B*L, d_model] @ [d_model, n_kv*d_v] -> [B, L, n_kv*d_v]
        v = (xf @ W["W_v"]).reshape(B, L, n_kv * d_v)
        # [B, L, h*d_k] -> [B, n_kv, G*L, d_k]
        q = self._split_queries(q, d_k)
        k = split_kv(k, n_kv, d_k)  # [B, L, n_kv*d_k] -> [B, n_kv, L, d_k]
        v = split_kv(v, n_kv, d_v)  # [B, L, n_kv*d_v] -> [B, n_kv, L, d_v]
        rope, scale = None, None
        # StreamingLLM caches keys before rotation (see _rope_in_cache)
        in_cache = kv_cache is not None and kv_cache.sink_tokens > 0
        if self.rope_base is not None and not in_cache:
            # rotate q and k by their positions
            q, k, rope = self._rope_forward(q, k, start)
        if kv_cache is not None:
            # views of the cache: [B, n_kv, L_cached + L, d_k], [.., d_v]
            k, v = kv_cache.append(k, v)
        if self.rope_base is not None and in_cache:
            # [B, n_kv, G*L, 2*d_k] and [B, n_kv, L_k, 2*d_k]
            q, k = self._rope_in_cache(q, k, kv_cache)
            scale = 1.0 / np.sqrt(d_k)  # of the true d_k, not 2*d_k
        L_k = k.shape[2]

        if self.flash:  # chapter 9: the tiled kernels keep no weights
            # [B, n_kv, G*L, d_v]
            o, att = self._flash_forward(q, k, v, mask, causal, scale)
        else:
            # None or [..., G*L, L_k]
            allowed = self._group_mask(mask, causal, B, L, L_k, kv_cache)
            # None or [n_kv, G*L, 1]: head kv*G + g owns rows g*L ...
            sinks = self._sink_rows(L)
            if kv_cache is not None and self.per_head_rows(L):
                # a few query rows per key/value head (a decode step):
                # one matrix-vector product per query head, [B, n_kv, G,
                # L, d] against [B, n_kv, 1, L_k, d] (free reshapes)
                q, k, v, allowed, sinks = self._per_head(
                    q, k, v, allowed, sinks
                )
            # [B, n_kv, G*L, d_v], weights [B, n_kv, G*L, L_k] (or
            # [B, n_kv, G, L, ...] per head); x was checked finite once,
            # in _check_x
            o, att = attention_forward(
                q,
                k,
                v,
                mask=allowed,
                sinks=sinks,
                scale=scale,
                check_finite=False,
            )
            o = o.reshape(B, n_kv, self.group_size * L, d_v)
            # head i = kv*G + g
            self._weights = att.weights.reshape(B, h, L, L_k)
            if sinks is not None:  # [B, n_kv, G*L, 1] -> [B, h, L]
                self.sink_weights = att.sink_weights.reshape(B, h, L)
        # [B, n_kv, G*L, d_v] -> [B, L, h*d_v]
        o = self._merge_heads(o, L, d_v)
        # [B*L, h*d_v] @ [h*d_v, d_model] -> [B, L, d_model]
        y = (_flat(o) @ W["W_o"]).reshape(B, L, self.d_model)

        self._cache = (
            None if kv_cache is not None else (x3, o, att, rope, unbatched)
        )
        return y[0] if unbatched else y

    # -----------------------------------------------------------------
    # backward
    def backward(self, dy):
        """Gradient with respect to ``x``; fills ``self.grads`` (same keys as
        ``self.params``)."""
        if self._cache is None:
            raise RuntimeError(
                "backward needs a preceding forward without kv_cache "
                "(decoding with a cache is inference only)"
            )
        x3, o, att, rope, unbatched = self._cache
        B, L, _ = x3.shape
        dy = as_float_array(dy, "dy")
        want = (L, self.d_model) if unbatched else (B, L, self.d_model)
        if dy.shape != want:
            raise ValueError(
                f"dy must have the shape of the layer's output {want}, got "
                f"{dy.shape}"
            )
        dy3 = dy[None] if unbatched else dy
        W, d_k, d_v = self.params, self.d_k, self.d_v

        # [h*d_v, B*L] @ [B*L, d_model] -> [h*d_v, d_model]
        self.grads["W_o"] = _flat(o).T @ _flat(dy3)
        # [B, L, d_model] @ [d_model, h*d_v] -> [B, L, h*d_v]
        do = dy3 @ W["W_o"].T
        do = self._split_queries(do, d_v)  # -> [B, n_kv, G*L, d_v]
        # dk, dv already summed over each group's query heads
        if self.flash:
            dq, dk, dv = self._flash_backward(do, att)
            dsinks = ()
        else:
            dq, dk, dv, *dsinks = attention_backward(do, att)
        if dsinks:  # [n_kv, G*L, 1] -> [h, L] -> [h]
            ds = dsinks[0].reshape(self.n_heads, L).sum(axis=1)
            self.grads["sinks"] = ds
        if rope is not None:  # rotate the gradients back: by -theta
            dq, dk = self._rope_backward(dq, dk, rope)
        # [B, n_kv, G*L, d_k] -> [B, L, h*d_k]
        dq = self._merge_heads(dq, L, d_k)
        dk = merge_kv(dk)  # [B, n_kv, L, d_k] -> [B, L, n_kv*d_k]
        dv = merge_kv(dv)  # [B, n_kv, L, d_v] -> [B, L, n_kv*d_v]
        xf = _flat(x3)  # [B*L, d_model]
        # [d_model, B*L] @ [B*L, h*d_k] -> [d_model, h*d_k]
        self.grads["W_q"] = xf.T @ _flat(dq)
        self.grads["W_k"] = xf.T @ _flat(dk)  # -> [d_model, n_kv*d_k]
        self.grads["W_v"] = xf.T @ _flat(dv)  # -> [d_model, n_kv*d_v]
        # three paths into x: [B, L, d_model]
        dx = dq @ W["W_q"].T + dk @ W["W_k"].T + dv @ W["W_v"].T
        return dx[0] if unbatched else dx

    # ------------------------------------------------------------------
    # helpers
    def _check_x(self, x, name):
        x = as_float_array(x, name)
        check_finite(x, name)
        if x.ndim not in (2, 3) or x.shape[-1] != self.d_model:
            raise ValueError(
                f"{name} must have shape [L, d_model] or [B, L, d_model] "
                f"with d_model={self.d_model}, "
                f"got {x.shape}"
            )
        if x.shape[-2] == 0:
            raise ValueError(
                f"{name} must hold at least one position, got shape "
                f"{x.shape}"
            )
        return (x[None], True) if x.ndim == 2 else (x, False)

    def _rope_forward(self, q, k, start):
        """Rotate query heads ``[B, n_kv, G*L, d_k]`` and key heads ``[B,
        n_kv, L, d_k]`` at positions ``start ... start+L-1``."""
        B, n_kv, GL, d_k = q.shape
        L = k.shape[2]
        positions = start + np.arange(L)  # [L]
        kw = dict(
            base=self.rope_base,
            layout=self.rope_layout,
            rotary_dim=self.rope_dim,
        )
        # [B, n_kv, G*L, d_k] -> [B, n_kv, G, L, d_k]: a view, one head a row
        q, q_cache = rope_forward(
            q.reshape(B, n_kv, self.group_size, L, d_k), positions, **kw
        )
        k, k_cache = rope_forward(k, positions, **kw)  # [B, n_kv, L, d_k]
        # -> [B, n_kv, G*L, d_k]
        return q.reshape(B, n_kv, GL, d_k), k, (q_cache, k_cache)

    def _rope_in_cache(self, q, k, cache):
        """StreamingLLM's positions inside the cache (Xiao et al. 2023).

        ``k [B, n_kv, n, d_k]`` holds unrotated keys: the sinks, then a
        contiguous run ending with the chunk. Key slot ``s`` turns by
        position ``s``. Query ``i`` (absolute) sees the sinks and the keys
        ``j > i - (W - S)``, ``min(i + 1, W)`` keys in all, and stands at
        position ``min(i, W - 1)`` among them: that is its position for
        the sink columns. For the other columns any common shift will do,
        so it turns by its own slot, and ``i - j`` is kept. The two query
        rotations sit side by side, ``[q_sink, q_recent]``, against keys
        ``[k, 0]`` (sinks) and ``[0, k]`` (the rest): one matmul gives
        both kinds of scores. Returns ``(q2, k2)`` with ``2 d_k``
        features.
        """
        B, n_kv, GL, d_k = q.shape
        n, G = k.shape[2], self.group_size
        L, S = GL // G, min(cache.sink_tokens, len(cache))
        kw = dict(
            base=self.rope_base,
            layout=self.rope_layout,
            rotary_dim=self.rope_dim,
        )
        k, _ = rope_forward(k, np.arange(n), **kw)  # slots 0 ... n-1
        q = q.reshape(B, n_kv, G, L, d_k)  # one head a row
        i = len(cache) - L + np.arange(L)  # absolute positions [L]
        q_sink, _ = rope_forward(q, np.minimum(i, cache.window - 1), **kw)
        q_rest, _ = rope_forward(q, n - L + np.arange(L), **kw)
        # [B, n_kv, G, L, 2*d_k] -> [B, n_kv, G*L, 2*d_k]
        q2 = np.concatenate([q_sink, q_rest], axis=-1).reshape(
            B, n_kv, GL, 2 * d_k
        )
        k2 = np.zeros((B, n_kv, n, 2 * d_k), dtype=k.dtype)
        k2[:, :, :S, :d_k] = k[:, :, :S]  # sinks meet q_sink
        k2[:, :, S:, d_k:] = k[:, :, S:]  # the rest meet q_rest
        return q2, k2

    def _rope_backward(self, dq, dk, rope):
        """The backward of :meth:`_rope_forward`: ``R(-theta)`` on ``dq``
        and ``dk``."""
        q_cache, k_cache = rope
        # [B, n_kv, G*L, d_k] -> [B, n_kv, G, L, d_k] -> back
        dq5 = rope_backward(dq.reshape(q_cache.shape), q_cache)
        return dq5.reshape(dq.shape), rope_backward(dk, k_cache)

    def _split_queries(self, t, d):
        """[B, L, h*d] -> [B, n_kv, G*L, d]: query head kv*G + g goes to
        group kv, rows g*L ... g*L+L-1."""
        B, L, _ = t.shape
        # head index = kv*G + g
        t = t.reshape(B, L, self.n_kv_heads, self.group_size, d)
        t = t.transpose(0, 2, 3, 1, 4)  # [B, n_kv, G, L, d]
        return np.ascontiguousarray(t).reshape(
            B, self.n_kv_heads, self.group_size * L, d
        )

    def _merge_heads(self, t, L, d):
        """[B, n_kv, G*L, d] -> [B, L, h*d], the inverse of
        :meth:`_split_queries` (concatenate heads)."""
        B = t.shape[0]
        # [B, L, n_kv, G, d]
        t = t.reshape(B, self.n_kv_heads, self.group_size, L, d).transpose(
            0, 3, 1, 2, 4
        )
        return t.reshape(B, L, self.n_heads * d)

    def per_head_rows(self, L) -> bool:
        """Whether a cached chunk of ``L`` positions makes one product per
        query head: a group (``G > 1``) with fewer than
        :attr:`min_stacked_rows` stacked rows ``G * L``."""
        G = self.group_size
        return 1 < G and G * L < self.min_stacked_rows

    def _per_head(self, q, k, v, allowed, sinks):
        """The stacked layout split by query head: ``q [B, n_kv, G, L,
        d_k]``, ``k [B, n_kv, 1, L_k, d_k]``, ``v [B, n_kv, 1, L_k, d_v]``
        (views), the mask ``[..., G, L, L_k]`` and sinks ``[n_kv, G, L,
        1]``. Row ``g*L + l`` becomes ``[g, l]``: the same numbers, each
        query head its own product with its group's keys and values."""
        B, n_kv, GL, d_k = q.shape
        G = self.group_size
        L = GL // G
        q = q.reshape(B, n_kv, G, L, d_k)
        k, v = k[:, :, None], v[:, :, None]  # [B, n_kv, 1, L_k, d]
        if allowed is not None:  # [..., G*L, L_k] -> [..., G, L, L_k]
            allowed = allowed.reshape(
                allowed.shape[:-2] + (G, L, allowed.shape[-1])
            )
        if sinks is not None:  # [n_kv, G*L, 1] -> [n_kv, G, L, 1]
            sinks = sinks.reshape(n_kv, G, L, 1)
        return q, k, v, allowed, sinks

    def _flash_forward(self, q, k, v, mask, causal, scale):
        """The tiled kernels on the stacked layout: ``(o, cache)``."""
        if mask is not None:
            raise ValueError(
                "mask is not supported with flash=True: the tiled kernels "
                "take causal=True/False and the layer's window only; use a "
                "layer with flash=False"
            )
        B, n_kv, GL, d_k = q.shape
        G = self.group_size
        # [B, n_kv, G*L, d_k] -> [B, n_kv, G, L, d_k]: row g*L + l is
        # query head kv*G + g at position l (a view, no copy)
        q5 = q.reshape(B, n_kv, G, GL // G, q.shape[-1])
        # [B, n_kv, L_k, d] -> [B, n_kv, 1, L_k, d]: broadcast over G
        k5, v5 = k[:, :, None], v[:, :, None]
        o, cache = flash_attention_forward(
            q5,
            k5,
            v5,
            causal=causal,
            scale=scale,
            window=self.window,
            check_finite=False,
        )
        return o.reshape(B, n_kv, GL, v.shape[-1]), cache  # [B,n_kv,G*L,d_v]

    def _flash_backward(self, do, cache):
        """``(dq, dk, dv)`` in the stacked layout, by the tiled backward."""
        B, n_kv, GL, d_v = do.shape
        do5 = do.reshape(
            B, n_kv, self.group_size, GL // self.group_size, d_v
        )
        dq, dk, dv = flash_attention_backward(do5, cache)
        # [B, n_kv, G, L, d_k] -> [B, n_kv, G*L, d_k]; dk, dv: drop the 1
        return dq.reshape(B, n_kv, GL, -1), dk[:, :, 0], dv[:, :, 0]

    def _sink_rows(self, L):
        """``params["sinks"] [h]`` laid out like the stacked query rows:
        ``[n_kv, G*L, 1]`` (each head's logit repeated for its L rows)."""
        if "sinks" not in self.params:
            return None
        rows = np.repeat(self.params["sinks"], L)  # [h*L], head-major
        return rows.reshape(self.n_kv_heads, self.group_size * L, 1)

    def _group_mask(self, mask, causal, B, L_q, L_k, kv_cache=None):
        """Combine the caller's mask and the causal (or window) mask into
        one for the stacked query rows."""
        G, h, n_kv = self.group_size, self.n_heads, self.n_kv_heads
        allowed = None
        if mask is not None:
            full = (B, h, L_q, L_k)
            m = check_mask(mask, full, "[B, n_heads, L_q, L_k]")
            # the same mask for every head: repeat it for the G heads of a
            # group
            if m.ndim <= 2:
                # [G*L_q, L_k]
                allowed = np.tile(np.broadcast_to(m, (L_q, L_k)), (G, 1))
            # per-batch or per-head masks: lay them out like the stacked
            # queries
            else:
                m = np.broadcast_to(m, full).reshape(B, n_kv, G, L_q, L_k)
                allowed = m.reshape(B, n_kv, G * L_q, L_k)
        c = None
        if kv_cache is not None and kv_cache.window is not None:
            # a rolling cache knows which positions it holds: [L_q, L_k]
            c = kv_cache.attention_mask(L_q)
        elif causal and (L_q > 1 or self.window is not None):
            c = causal_mask(L_q, L_k, window=self.window)  # [L_q, L_k]
        if c is not None:
            c = np.tile(c, (G, 1))  # [G*L_q, L_k]
            allowed = c if allowed is None else allowed & c
        return allowed


class MultiHeadAttention(GroupedQueryAttention):
    """Multi-head attention (Vaswani et al. 2017): every query head has its
    own key/value head. ``options`` are :class:`GroupedQueryAttention`'s
    keywords (``rope_base``, ``rope_layout``, ``rope_dim``, ``window``,
    ``sinks``, ``flash``)."""

    def __init__(
        self,
        d_model,
        n_heads,
        d_k=None,
        d_v=None,
        seed=0,
        dtype=np.float64,
        **options,
    ):
        super().__init__(
            d_model, n_heads, n_heads, d_k, d_v, seed, dtype, **options
        )


class MultiQueryAttention(GroupedQueryAttention):
    """Multi-query attention (Shazeer 2019): all query heads share one
    key/value head. ``options`` as for :class:`MultiHeadAttention`."""

    def __init__(
        self,
        d_model,
        n_heads,
        d_k=None,
        d_v=None,
        seed=0,
        dtype=np.float64,
        **options,
    ):
        super().__init__(
            d_model, n_heads, 1, d_k, d_v, seed, dtype, **options
        )


def split_kv(t, n_kv, d):
    B, L, _ = t.shape
    # [B, n_kv, L, d]
    return np.ascontiguousarray(
        t.reshape(B, L, n_kv, d).transpose(0, 2, 1, 3)
    )


def merge_kv(t):
    B, n_kv, L, d = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, L, n_kv * d)  # [B, L, n_kv*d]


def _flat(t):
    return t.reshape(-1, t.shape[-1])  # [B, L, n] -> [B*L, n]
