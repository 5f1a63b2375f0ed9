"""Multi-head, grouped-query and multi-query attention layers (chapters 2 to
4).

One code path serves all three. ``n_kv_heads`` key/value heads are shared by
groups of ``G = n_heads // n_kv_heads`` query heads; query head ``i`` reads
key/value head ``i // G``. ``n_kv_heads = n_heads`` is multi-head attention
(Vaswani et al. 2017), ``n_kv_heads = 1`` is multi-query attention (Shazeer
2019), anything in between is grouped-query attention (Ainslie et al. 2023).

The forward is four steps, each with a backward twin: :meth:`project` (x ->
q, k, v), :meth:`position` (RoPE, chapter 6), :meth:`attend` (the grouped
core, :mod:`attn_np.grouped`: how a group meets its key/value head, the
mask, chapter 8's window and sinks, chapter 9's tiles) and :meth:`output`
(merge the heads, ``W_o``). With a :class:`~attn_np.KVCache` the cache
takes the chunk (:meth:`~attn_np.KVCache.step`, chapter 4). A variant
overrides a step in a subclass; it never adds a branch to the forward.
"""

from __future__ import annotations

import numpy as np

from ._checks import (
    as_float_array,
    check_cache_kind,
    check_finite,
    check_flag,
    check_float_dtype,
    check_head_dims,
    check_layer_input,
    check_overflow,
    check_unchanged,
    check_window,
    fingerprint,
)
from .grouped import (
    MIN_STACKED_ROWS,
    decode_step_parts,
    group_mask,
    grouped_attention_backward,
    grouped_attention_forward,
    per_head_rows,
)
from .heads import flat, merge_groups, merge_heads, split_groups, split_heads
from .kv_cache import KVCache
from .rope import Rotary, check_rope_settings

# the chapter-2 names of the key/value head split (kept for old imports)
split_kv, merge_kv = split_heads, merge_heads


class GroupedQueryAttention:
    """Attention with ``n_heads`` query heads sharing ``n_kv_heads``
    key/value heads.

    Parameters (the document's shapes, no biases)::

        W_q [d_model, n_heads * d_k]      W_k [d_model, n_kv_heads * d_k]
        W_v [d_model, n_kv_heads * d_v]   W_o [n_heads * d_v, d_model]

    ``rope_base`` (None: no rotation) turns on rotary position embeddings
    with that base, in ``rope_layout`` (``"half"`` or ``"interleaved"``),
    over the first ``rope_dim`` features of each head (default ``d_k``).
    ``rope_scaling`` (chapter 11), a Hugging Face ``rope_scaling`` dict,
    scales its frequencies (:class:`~attn_np.long_context.ScaledRotary`).

    ``window=W`` makes it a sliding-window layer (always causal);
    ``sinks=True`` adds ``sinks [n_heads]``, one sink logit per query head,
    starting at 0.

    ``flash=True`` computes attention with FlashAttention's tiled kernels
    (:func:`~attn_np.flash_attention_forward`) and their backward: the same
    outputs and gradients in O(L) memory, but no ``attention_weights``
    and no ``mask`` (``causal``, ``window`` and ``sinks`` only).
    """

    # a chunk decoded with a KVCache stacks a group's G*L query rows into
    # one product from this many rows on (the grouped core's rule)
    min_stacked_rows = MIN_STACKED_ROWS

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
        rope_scaling=None,
    ):
        d_model, n_heads, n_kv_heads, d_k, d_v = check_head_dims(
            d_model, n_heads, n_kv_heads, d_k, d_v
        )
        self.rope_base, self.rope_layout, self.rope_dim = (
            check_rope_settings(rope_base, rope_layout, rope_dim, d_k)
        )
        # chapter 11: a Hugging Face rope_scaling dict scales the rotation
        self.rope_scaling = None
        if rope_scaling is not None:
            self._check_rope_scaling(rope_scaling)
        self.d_model, self.n_heads = d_model, n_heads
        self.n_kv_heads, self.d_k, self.d_v = n_kv_heads, d_k, d_v
        self.group_size = n_heads // n_kv_heads
        self.dtype = dtype = check_float_dtype(dtype)
        self.flash = check_flag(flash, "flash")
        sinks = check_flag(sinks, "sinks")  # with flash: chapter 9's lse
        self.window = check_window(window)
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
        if sinks:  # a logit per query head, 0: the sink starts as one key
            self.params["sinks"] = np.zeros(n_heads, dtype=dtype)
        self.grads = {
            name: np.zeros_like(p) for name, p in self.params.items()
        }
        self._att = None  # the core's cache of the last forward
        self._cache = None  # what backward needs (None after decoding)

    def __repr__(self) -> str:
        extra = "" if self.window is None else f", window={self.window}"
        extra += ", sinks=True" if "sinks" in self.params else ""
        extra += ", flash=True" if self.flash else ""
        rope = (
            ""
            if self.rope_base is None
            else f", rope_base={self.rope_base:g}, rope_layout="
            f"{self.rope_layout!r}, rope_dim={self.rope_dim}"
        )
        return (
            f"{type(self).__name__}(d_model={self.d_model}, "
            f"n_heads={self.n_heads}, "
            f"n_kv_heads={self.n_kv_heads}, d_k={self.d_k}, "
            f"d_v={self.d_v}, dtype={self.dtype}{rope}{extra})"
        )

    def _check_rope_scaling(self, rope_scaling):
        """Chapter 11: keep ``rope_scaling`` (Hugging Face's dict, read by
        :func:`~attn_np.long_context.read_rope_scaling`) for the position
        step."""
        from .long_context import read_rope_scaling

        if self.rope_base is None:
            raise ValueError(
                "rope_scaling needs rope_base (a layer without RoPE has "
                "nothing to scale)"
            )
        self.rope_scaling = read_rope_scaling(rope_scaling)

    @property
    def options(self) -> dict:
        """The constructor keywords that rebuild this layer's kind (not
        its weights): sizes, dtype, RoPE, window, sinks, flash."""
        return {
            "d_k": self.d_k,
            "d_v": self.d_v,
            "dtype": self.dtype,
            "rope_base": self.rope_base,
            "rope_layout": self.rope_layout,
            "rope_dim": self.rope_dim,
            "window": self.window,
            "sinks": "sinks" in self.params,
            "flash": self.flash,
            "rope_scaling": self.rope_scaling,
        }

    @property
    def rotary(self):
        """Chapter 6's rotation with this layer's RoPE settings (read each
        time, so that changing ``rope_base`` or ``rope_layout`` takes
        effect), or None without RoPE."""
        if self.rope_base is None:
            return None
        if self.rope_scaling is not None:  # chapter 11
            from .long_context import ScaledRotary

            return ScaledRotary(
                self.rope_base,
                self.rope_layout,
                self.rope_dim,
                rope_scaling=self.rope_scaling,
            )
        return Rotary(self.rope_base, self.rope_layout, self.rope_dim)

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
        return _head_view(self._att, "weights", self.n_heads)

    @property
    def sink_weights(self):
        """``[B, n_heads, L_q]``: each query's mass on its sink in the last
        forward (None without sinks)."""
        p = _head_view(self._att, "sink_weights", self.n_heads)
        return None if p is None else p[..., 0]

    @property
    def n_params(self) -> int:
        return sum(p.size for p in self.params.values())

    def per_head_rows(self, L) -> bool:
        """Whether a cached chunk of ``L`` positions makes one product per
        query head (the grouped core's rule,
        :func:`~attn_np.grouped.per_head_rows`)."""
        return per_head_rows(self.group_size, L, self.min_stacked_rows)

    # ------------------------------------------------------------------
    # forward
    def forward(self, x, *, causal: bool = False, mask=None, kv_cache=None):
        """``x`` is ``[L, d_model]`` or ``[B, L, d_model]``; returns ``y`` of
        the same shape.

        ``mask`` (bool, True where a query may attend a key) broadcasts to
        ``[B, n_heads, L_q, L_k]``. With ``kv_cache`` (a
        :class:`~attn_np.KVCache`), ``x`` is the next chunk: it attends
        causally over every cached position plus itself, and its keys and
        values are added to the cache.

        Finite inputs whose scores or output overflow the dtype raise a
        ``ValueError``. The layer keeps ``x`` itself for the backward (no
        copy): :meth:`backward` raises a ``ValueError`` if ``x`` was
        changed in place after the forward (a checksum is kept).
        """
        check_flag(causal, "causal")
        x3, unbatched = check_layer_input(x, self.d_model, _name(kv_cache))
        self.check_cache(kv_cache, x3)
        # [B, n_kv, G, L, d_k], [B, n_kv, L, d_k], [B, n_kv, L, d_v]
        q, k, v = self.project(x3)
        rope = None
        if kv_cache is None:  # one whole sequence, positions 0 ... L-1
            q, k, rope = self.position(q, k, np.arange(x3.shape[1]))
            where = {"causal": causal}
        else:  # chapter 4: the next chunk, over every cached position
            q, k, v, where = kv_cache.step(q, k, v, self.rotary)
        # [B, n_kv, G, L, d_v]
        o, self._att = self.attend(q, k, v, mask=mask, **where)
        with np.errstate(over="ignore", invalid="ignore"):  # checked:
            y, out = self.output(o, x3)  # [B, L, d_model]
        check_overflow(y, "y", "x or the weights are too large")
        self._cache = (
            None
            if kv_cache is not None
            else (x3, out, self._att, rope, unbatched, fingerprint(x3))
        )
        return y[0] if unbatched else y

    def project(self, x3):
        """Step 1: ``x [B, L, d_model]`` -> ``q [B, n_kv, G, L, d_k]``, ``k
        [B, n_kv, L, d_k]``, ``v [B, n_kv, L, d_v]``."""
        W, n_kv, G = self.params, self.n_kv_heads, self.group_size
        # the B*L positions as the rows of one matrix: one BLAS call each
        xf = flat(x3)  # [B*L, d_model]
        B, L = x3.shape[:2]
        # [B*L, d_model] @ [d_model, h*d_k] -> [B, L, h*d_k] -> heads
        q = split_groups(
            (xf @ W["W_q"]).reshape(B, L, -1), n_kv, G, self.d_k
        )
        k = split_heads((xf @ W["W_k"]).reshape(B, L, -1), n_kv, self.d_k)
        v = split_heads((xf @ W["W_v"]).reshape(B, L, -1), n_kv, self.d_v)
        return q, k, v

    def position(self, q, k, positions):
        """Step 2 (chapter 6): rotate ``q`` and ``k`` by their positions
        ``[L]`` (RoPE), or leave them; ``(q, k, saved)``."""
        if self.rotary is None:
            return q, k, None
        q, q_rope = self.rotary.forward(q, positions)  # [B, n_kv, G, L, d_k]
        k, k_rope = self.rotary.forward(k, positions)  # [B, n_kv, L, d_k]
        return q, k, (q_rope, k_rope)

    def attend(self, q, k, v, *, mask=None, **where):
        """Step 3: the grouped core with this layer's mask, window, sinks
        and kernels; ``(o [B, n_kv, G, L_q, d_v], cache)``."""
        if self.window is not None and not where.get("causal"):
            raise ValueError(
                f"a window layer (window={self.window}) is causal: call "
                "forward(x, causal=True)"
            )
        B, n_kv, G, L_q, _ = q.shape
        sinks = self.params.get("sinks")  # [h] -> [n_kv, G, 1, 1]
        return grouped_attention_forward(
            q,
            k,
            v,
            allowed=group_mask(mask, B, self.n_heads, n_kv, L_q, k.shape[2]),
            window=self.window,
            sinks=None if sinks is None else sinks.reshape(n_kv, G, 1, 1),
            tiled=self.flash,
            min_stacked_rows=self.min_stacked_rows,
            check_finite=False,  # x was checked once
            **where,
        )

    def output(self, o, x3):
        """Step 4: ``o [B, n_kv, G, L, d_v]`` -> heads concatenated, times
        ``W_o``: ``(y [B, L, d_model], saved)``. (``x3``, the layer's
        input, is for a step that reads it, such as an output gate.)"""
        o = merge_groups(o)  # [B, L, h*d_v]
        B, L, _ = o.shape
        # [B*L, h*d_v] @ [h*d_v, d_model] -> [B, L, d_model]
        y = (flat(o) @ self.params["W_o"]).reshape(B, L, self.d_model)
        return y, o

    # -----------------------------------------------------------------
    # backward
    def backward(self, dy):
        """Gradient with respect to ``x``; fills ``self.grads`` (same keys as
        ``self.params``)."""
        if self._cache is None:
            raise RuntimeError(
                "backward needs a preceding forward without kv_cache "
                "(decoding with a cache is inference only; with "
                "flash=True each forward serves one backward)"
            )
        x3, o, att, rope, unbatched, saved = self._cache
        B, L, _ = x3.shape
        want = (L, self.d_model) if unbatched else (B, L, self.d_model)
        dy = as_float_array(dy, "dy")
        if dy.shape != want:
            raise ValueError(
                f"dy must have the shape of the layer's output {want}, got "
                f"{dy.shape}"
            )
        check_finite(dy, "dy")
        check_unchanged(saved, {"x": x3}, "backward")
        do, dx_out = self.output_backward(dy.reshape(B, L, self.d_model), o)
        if self.flash:  # O(L) memory: the tiled core frees o once read,
            self._cache = o = None  # so this forward serves one backward
        # dk, dv summed per group
        g = grouped_attention_backward(do, att, release=self.flash)
        del do  # read: freed before the projections' gradients
        for name in g.keys() - {"q", "k", "v"}:  # sinks, score mods' params
            self.grads[name] = g.pop(name).reshape(self.params[name].shape)
        self.position_backward(g, rope)  # g["q"], g["k"] turned back
        dx = self.project_backward(x3, g)  # consumes g
        if dx_out is not None:  # an output step that reads x
            dx = dx + dx_out
        return dx[0] if unbatched else dx

    def output_backward(self, dy3, o):
        """The twin of :meth:`output`: fills ``dW_o``; returns ``(do [B,
        n_kv, G, L, d_v], dx)``, ``dx`` None (the step reads no ``x``)."""
        # [h*d_v, B*L] @ [B*L, d_model] -> [h*d_v, d_model]
        self.grads["W_o"] = flat(o).T @ flat(dy3)
        # [B, L, d_model] @ [d_model, h*d_v] -> [B, L, h*d_v] -> heads
        do = dy3 @ self.params["W_o"].T
        G, d_v = self.group_size, self.d_v
        return split_groups(do, self.n_kv_heads, G, d_v), None

    def position_backward(self, g, rope):
        """The twin of :meth:`position`: rotate the gradients ``g["q"]``
        and ``g["k"]`` back, by ``-theta`` (in ``g``, so that the old
        arrays are freed at once)."""
        if rope is None:
            return
        q_rope, k_rope = rope
        g["q"] = self.rotary.backward(g["q"], q_rope)
        g["k"] = self.rotary.backward(g["k"], k_rope)

    def project_backward(self, x3, g):
        """The twin of :meth:`project`: ``dW_q``, ``dW_k``, ``dW_v`` and
        ``dx [B, L, d_model]`` (three paths into x), from the gradients
        ``g`` of q, k and v (taken out of ``g`` as they are used)."""
        W = self.params
        # [B, n_kv, G, L, d_k] -> [B, L, h*d_k]; k, v: [B, n_kv, L, d] ->
        # [B, L, n_kv*d]
        xf = flat(x3)  # [B*L, d_model]
        dx = None
        for name, merge in (
            ("q", merge_groups),
            ("k", merge_heads),
            ("v", merge_heads),
        ):  # one at a time, each freed once used
            d = merge(g.pop(name))
            # [d_model, B*L] @ [B*L, h*d_k] -> [d_model, h*d_k]
            self.grads["W_" + name] = xf.T @ flat(d)
            part = d @ W["W_" + name].T  # [B, L, d_model]
            dx = part if dx is None else np.add(dx, part, out=dx)
            d = part = None
        return dx

    # ------------------------------------------------------------------
    def new_cache(self):
        """An empty cache for ``forward(x, kv_cache=...)``: a
        :class:`~attn_np.KVCache` rolling over the layer's window."""
        return KVCache(window=self.window)

    def check_cache(self, kv_cache, x3):
        """Raise unless ``kv_cache`` (None, or a :class:`~attn_np.KVCache`)
        can take ``x3``'s chunk from this layer."""
        if kv_cache is None:
            return
        check_cache_kind(kv_cache, KVCache)
        B = x3.shape[0]
        layout = (B, self.n_kv_heads, self.d_k, self.d_v)
        # the dtype of the keys and values
        dtype = np.result_type(x3.dtype, self.params["W_k"].dtype)
        kv_cache.check_chunk(x3.shape, layout, dtype)
        kv_cache.check_owner(self)
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

    def step_parts(self, x_chunk, kv_cache) -> dict:
        """The parts of this layer's decode step of ``x_chunk [B, L,
        d_model]`` over ``kv_cache``, to be timed alone (the decode
        benchmark): ``{"weights": fn, "attention": fn, "softmax": fn}``.

        ``weights`` makes the four products with the projection matrices
        (:meth:`project`'s and :meth:`output`'s), ``attention`` runs
        :meth:`attend` over the cached keys and values (its softmax
        included) and ``softmax`` the softmax alone over scores of that
        shape. The cache is read, never changed.
        """
        x3, _ = check_layer_input(x_chunk, self.d_model, "x_chunk")
        self.check_cache(kv_cache, x3)
        B, L, _ = x3.shape
        q, _, _ = self.project(x3)
        k, v = kv_cache.keys, kv_cache.values  # [B, n_kv, n, d]
        xf, W = flat(x3), self.params
        o = np.zeros((B * L, self.n_heads * self.d_v), dtype=q.dtype)
        # the scores' shape in the core: [B, n_kv, G, L, n]
        s = np.zeros(q.shape[:-1] + (k.shape[2],), dtype=q.dtype)
        where = {"causal": True}  # the queries at the last L positions

        def weights():  # [B*L, d] @ [d, n] three times, [B*L, h*d_v] @ W_o
            return (
                xf @ W["W_q"],
                xf @ W["W_k"],
                xf @ W["W_v"],
                o @ W["W_o"],
            )

        def attention():
            return self.attend(q, k, v, **where)

        return decode_step_parts(weights, attention, s)


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


def _name(kv_cache):
    return "x" if kv_cache is None else "x_chunk"


def _head_view(att, field, n_heads):
    """A core cache's ``[B, n_kv, G, L_q, n]`` field as ``[B, n_heads, L_q,
    n]`` (head ``kv*G + g``), or None."""
    a = None if att is None else getattr(att, field)
    if a is None:
        return None
    B, _, _, L_q, n = a.shape
    return a.reshape(B, n_heads, L_q, n)
