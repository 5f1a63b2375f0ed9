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
takes the chunk (:meth:`~attn_np.KVCache.step`, chapter 4).

Later chapters add *parts*, never a branch in this forward: a position
part (``rotary=``: chapter 6's :class:`~attn_np.rope.Rotary` protocol,
such as chapter 11's scaled rotation), a mask rule (``mask_rule=``, such
as :class:`~attn_np.masks.ChunkedMask`), score mods (``score_mods=``,
chapter 10) and a softmax ``scale``. A variant that needs more (biases,
QK-norm, an output gate: chapter 10) overrides one step in a subclass.
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
    check_positive_number,
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
    grouped_decode_step,
    per_head_rows,
)
from .heads import (
    flat,
    merge_groups,
    merge_heads,
    side_by_side,
    split_groups,
    split_heads,
    still_side_by_side,
)
from .kv_cache import KVCache
from .rope import Rotary, check_rope_settings, check_rotary, rope_step

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

    The parts of later chapters: ``rotary``, a position part in the
    protocol of :class:`~attn_np.rope.Rotary` (``forward(t, positions) ->
    (t2, saved)``, ``backward(dt2, saved)``), in place of the rotation
    ``rope_base`` makes (chapter 11's
    :class:`~attn_np.rope_scaling.ScaledRotary`); ``mask_rule``, a
    callable ``(q_positions, k_positions) -> [L_q, L_k]`` bool ANDed into
    the mask (:class:`~attn_np.masks.ChunkedMask`: the layer is then
    causal); ``score_mods``, objects that change the scaled scores
    (chapter 10, :mod:`attn_np.refinements`); ``scale``, the softmax scale
    (default ``1/sqrt(d_k)``).

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
        rotary=None,
        mask_rule=None,
        score_mods=(),
        scale=None,
        projection=None,
        out_projection=None,
    ):
        d_model, n_heads, n_kv_heads, d_k, d_v = check_head_dims(
            d_model, n_heads, n_kv_heads, d_k, d_v
        )
        self.rope_base, self.rope_layout, self.rope_dim = (
            check_rope_settings(rope_base, rope_layout, rope_dim, d_k)
        )
        self._rotary, self.mask_rule, self.score_mods, self.scale = (
            check_parts(rotary, mask_rule, score_mods, scale)
        )
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
        self.projection, self.out_projection = projection, out_projection
        rng = np.random.default_rng([seed, 10])
        for part in check_step_parts(projection, out_projection):
            part.add_params(self, rng)  # biases, norm gains, a gate
        self.grads = {
            name: np.zeros_like(p) for name, p in self.params.items()
        }
        self._att = None  # the core's cache of the last forward
        self._cache = None  # what backward needs (None after decoding)
        self._packed = None  # pack_projections' (buffer, views)

    def __repr__(self) -> str:
        extra = "" if self.window is None else f", window={self.window}"
        extra += ", sinks=True" if "sinks" in self.params else ""
        extra += ", flash=True" if self.flash else ""
        parts = ("rotary", "mask_rule", "scale", "projection")
        for name in (*parts, "out_projection"):  # the parts given
            part = self.options[name]
            extra += "" if part is None else f", {name}={part!r}"
        extra += (
            f", score_mods={self.score_mods!r}" if self.score_mods else ""
        )
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

    # ``type(layer)(d_model, n_heads, n_kv_heads, **layer.options)``
    # rebuilds the layer's kind (mha_to_gqa relies on it); a subclass that
    # keeps it so says so in its own body
    rebuilds_from_options = True

    @property
    def options(self) -> dict:
        """The constructor keywords that rebuild this layer's kind (not
        its weights): sizes, dtype, RoPE, window, sinks, flash and the
        parts."""
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
            "rotary": self._rotary,
            "mask_rule": self.mask_rule,
            "score_mods": self.score_mods,
            "scale": self.scale,
            "projection": self.projection,
            "out_projection": self.out_projection,
        }

    @property
    def kv_params(self) -> tuple:
        """The parameters with a key/value head axis (their last), which
        :func:`~attn_np.mha_to_gqa` pools."""
        kv = ("W_k", "W_v")
        return (
            kv if self.projection is None else kv + self.projection.kv_params
        )

    @property
    def rotary(self):
        """The position part: the one given (``rotary=``), else chapter
        6's rotation with this layer's RoPE settings (read each time, so
        that changing ``rope_base`` or ``rope_layout`` takes effect), or
        None without RoPE."""
        if self._rotary is not None:
            return self._rotary
        if self.rope_base is None:
            return None
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
    def forward(
        self,
        x,
        *,
        causal: bool = False,
        mask=None,
        kv_cache=None,
        positions=None,
    ):
        """``x`` is ``[L, d_model]`` or ``[B, L, d_model]``; returns ``y`` of
        the same shape.

        ``mask`` (bool, True where a query may attend a key, or a mask
        function) broadcasts to ``[B, n_heads, L_q, L_k]``. With
        ``kv_cache`` (a :class:`~attn_np.KVCache`), ``x`` is the next
        chunk: it attends causally over every cached position plus
        itself, and its keys and values are added to the cache.
        ``positions`` (``[L]`` ints) are the positions RoPE rotates by
        instead of ``0 ...`` (or the cache's next ones): a drafted tree's
        nodes sit at the cache's length plus their depth (chapter 16).

        Finite inputs whose scores or output overflow the dtype raise a
        ``ValueError``. The layer keeps ``x`` itself for the backward (no
        copy): :meth:`backward` raises a ``ValueError`` if ``x`` was
        changed in place after the forward (a checksum is kept).
        """
        check_flag(causal, "causal")
        x3, unbatched = check_layer_input(x, self.d_model, _name(kv_cache))
        self.check_cache(kv_cache, x3)
        if (
            mask is None
            and positions is None
            and self._one_token(kv_cache, x3)
        ):
            y = self._decode_one(x3, kv_cache)  # [B, 1, d_model]
            self._cache = None
            return y[0] if unbatched else y
        # [B, n_kv, G, L, d_k], [B, n_kv, L, d_k], [B, n_kv, L, d_v]
        q, k, v = self.project(x3)
        rope, rotary = None, self.rotary
        pos = check_positions(positions, x3.shape[1], kv_cache)
        if kv_cache is None:  # one whole sequence, positions 0 ... L-1
            pos = np.arange(x3.shape[1]) if pos is None else pos
            q, k, rope = self.position(q, k, pos)
            where = {"causal": causal}
        else:  # chapter 4: the next chunk, over every cached position
            if pos is not None:  # rotated here, cached as they are
                q, k, _ = self.position(q, k, pos)
                rotary = None
            q, k, v, where = kv_cache.step(q, k, v, rotary)
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

    def _one_token(self, kv_cache, x3) -> bool:
        """Whether ``x3`` is a decode step of one token over a plain
        :class:`~attn_np.KVCache` (every position held, none rotated by
        slot) in a layer of the plain parts: :meth:`_decode_one` takes
        it."""
        return (
            x3.shape[1] == 1
            and type(kv_cache) is KVCache
            and kv_cache.window is None
            and len(kv_cache) > 0
            and self.projection is None
            and self.out_projection is None
            and type(self.rotary) in (Rotary, type(None))
            and self._plain_step({"causal": True})
        )

    def _decode_one(self, x3, kv_cache):
        """:meth:`forward`'s numbers for one token ``x3 [B, 1, d_model]``
        over a plain cache, with the steps in between left out: the
        position is the cache's length, the rotation the kept tables of
        :func:`~attn_np.rope.rope_step`, the keys and values written
        into the cache's next column without checking them again
        (:meth:`~attn_np.KVCache.append_step`: made here from the input
        just checked; an overflow shows in the scores, which are
        checked), and the core :func:`~attn_np.grouped.
        grouped_decode_step`. At SmolLM2's size these steps took longer
        than the layer's arithmetic."""
        q, k, v = self.project(x3)  # [B, n_kv, G, 1, d_k], [B, n_kv, 1, d]
        if self.rotary is not None:
            r, p = self.rotary, len(kv_cache)
            kw = dict(base=r.base, layout=r.layout, rotary_dim=r.rotary_dim)
            q, k = rope_step(q, p, **kw), rope_step(k, p, **kw)
            if q is None or k is None:  # rope_forward names the error
                q, k, _ = self.position(*self.project(x3)[:2], np.array([p]))
            else:
                q, k = q[0], k[0]
        K, V = kv_cache.append_step(k, v)  # [B, n_kv, n, d], views
        o, self._att = grouped_decode_step(
            q, K, V, self.scale, min_stacked_rows=self.min_stacked_rows
        )  # [B, n_kv, G, 1, d_v]
        with np.errstate(over="ignore", invalid="ignore"):  # checked:
            y, _ = self.output(o, x3)  # [B, 1, d_model]
        check_overflow(y, "y", "x or the weights are too large")
        return y

    def project(self, x3):
        """Step 1: ``x [B, L, d_model]`` -> ``q [B, n_kv, G, L, d_k]``, ``k
        [B, n_kv, L, d_k]``, ``v [B, n_kv, L, d_v]``. A projection part
        (chapter 10's biases and QK-norm) makes them instead."""
        if self.projection is not None:
            q, k, v, self._projected = self.projection.forward(self, x3)
            return q, k, v
        W, n_kv, G = self.params, self.n_kv_heads, self.group_size
        # the B*L positions as the rows of one matrix: one BLAS call each
        xf = flat(x3)  # [B*L, d_model]
        B, L = x3.shape[:2]
        packed = self.packed_qkv
        if packed is not None:  # one product for all three
            # [B*L, d_model] @ [d_model, (h + n_kv) d_k + n_kv d_v]
            qkv = (xf @ packed).reshape(B, L, -1)
            a, b = self.n_heads * self.d_k, (self.n_heads + n_kv) * self.d_k
            q = split_groups(qkv[..., :a], n_kv, G, self.d_k)
            k = split_heads(qkv[..., a:b], n_kv, self.d_k)
            return q, k, split_heads(qkv[..., b:], n_kv, self.d_v)
        # [B*L, d_model] @ [d_model, h*d_k] -> [B, L, h*d_k] -> heads
        q = split_groups(
            (xf @ W["W_q"]).reshape(B, L, -1), n_kv, G, self.d_k
        )
        k = split_heads((xf @ W["W_k"]).reshape(B, L, -1), n_kv, self.d_k)
        v = split_heads((xf @ W["W_v"]).reshape(B, L, -1), n_kv, self.d_v)
        return q, k, v

    def pack_projections(self, out=None):
        """Keep ``W_q``, ``W_k`` and ``W_v`` side by side in one buffer
        ``[d_model, (n_heads + n_kv_heads) d_k + n_kv_heads d_v]``, with
        ``params`` views of its columns (the same numbers and keys; an
        update in place reaches the buffer): :meth:`project` then makes
        ``q``, ``k`` and ``v`` with one product instead of three.

        This is for decoding. A step of one position multiplies a vector
        by each matrix, reading every weight once: the time is the bytes
        read at the rate memory gives, and one long read of the three
        matrices goes at a better rate than three shorter ones. (A
        projection part makes q, k and v itself: nothing to pack.)
        ``out``: the buffer to fill (:func:`~attn_np.heads.side_by_side`),
        for a model that keeps its weights in one allocation. Returns the
        layer.
        """
        if self.projection is None:
            names = ("W_q", "W_k", "W_v")
            self._packed = side_by_side(
                *(self.params[n] for n in names), out=out
            )
            self.params.update(zip(names, self._packed[1]))
        return self

    @property
    def packed_qkv(self):
        """The buffer of :meth:`pack_projections`, while ``params`` still
        hold its views (None if not packed, or if one of the matrices was
        replaced since: then three products)."""
        W = self.params
        return still_side_by_side(
            getattr(self, "_packed", None), (W["W_q"], W["W_k"], W["W_v"])
        )

    def position(self, q, k, positions):
        """Step 2 (chapter 6): rotate ``q`` and ``k`` by their positions
        ``[L]`` (RoPE), or leave them; ``(q, k, saved)``."""
        if self.rotary is None:
            return q, k, None
        q, q_rope = self.rotary.forward(q, positions)  # [B, n_kv, G, L, d_k]
        k, k_rope = self.rotary.forward(k, positions)  # [B, n_kv, L, d_k]
        return q, k, (q_rope, k_rope)

    def attend(self, q, k, v, *, mask=None, **where):
        """Step 3: the grouped core with this layer's mask, mask rule,
        window, sinks, scale, score mods and kernels; ``(o [B, n_kv, G,
        L_q, d_v], cache)``. ``where`` says which keys each query may
        attend (``causal``, and a cache's positions and sink tokens)."""
        if not where.get("causal"):
            for name, part in (
                ("window", self.window),
                ("mask_rule", self.mask_rule),
            ):
                if part is not None:
                    raise ValueError(
                        f"a {name} layer ({name}={part!r}) is causal: call "
                        "forward(x, causal=True)"
                    )
        B, n_kv, G, L_q, _ = q.shape
        if L_q == 1 and mask is None and self._plain_step(where):
            # a decode step of one token over a plain cache: every key
            # allowed, nothing to read but q, k and v
            return grouped_decode_step(
                q, k, v, self.scale, min_stacked_rows=self.min_stacked_rows
            )
        L_k = k.shape[2]
        allowed = group_mask(mask, B, self.n_heads, n_kv, L_q, L_k)
        if self.mask_rule is not None:  # e.g. chapter 11's chunks
            rule = self.mask_rule(*key_positions(where, L_q, L_k))
            allowed = rule if allowed is None else allowed & rule
        # a cache that rotates by slot doubles the features and says the
        # true scale; the layer's own scale wins
        scale = where.pop("scale", None)
        # a subclass's step may add mods of its own after the layer's
        mods = (*self.score_mods, *where.pop("score_mods", ()))
        sinks = self.params.get("sinks")  # [h] -> [n_kv, G, 1, 1]
        return grouped_attention_forward(
            q,
            k,
            v,
            allowed=allowed,
            window=self.window,
            scale=scale if self.scale is None else self.scale,
            sinks=None if sinks is None else sinks.reshape(n_kv, G, 1, 1),
            score_mods=mods,
            tiled=self.flash,
            min_stacked_rows=self.min_stacked_rows,
            check_finite=False,  # x was checked once
            **where,
        )

    def _plain_step(self, where) -> bool:
        """Whether a cached chunk's ``where`` (a :class:`~attn_np.KVCache`'s
        step: causal, nothing else) meets a layer with no part that
        changes which keys a query sees or how it scores them: no window,
        mask rule, sinks, score mods or tiled kernels."""
        return (
            where == {"causal": True}
            and self.window is None
            and self.mask_rule is None
            and not self.score_mods
            and not self.flash
            and "sinks" not in self.params
        )

    def output(self, o, x3):
        """Step 4: ``o [B, n_kv, G, L, d_v]`` -> heads concatenated, times
        ``W_o``: ``(y [B, L, d_model], saved)``. (``x3``, the layer's
        input, is for a step that reads it: an output part such as
        chapter 10's gate.)"""
        if self.out_projection is not None:
            return self.out_projection.forward(self, o, x3)
        o = merge_groups(o)  # [B, L, h*d_v]
        B, L, _ = o.shape
        # [B*L, h*d_v] @ [h*d_v, d_model] -> [B, L, d_model]
        y = (flat(o) @ self.params["W_o"]).reshape(B, L, self.d_model)
        return y, o

    # -----------------------------------------------------------------
    # backward
    def backward(self, dy, dkv=None):
        """Gradient with respect to ``x``; fills ``self.grads`` (same keys as
        ``self.params``). ``dkv = (dk, dv)``: gradients of the keys and
        values the forward attended (``[B, n_kv, L, d_k]``, ``[B, n_kv, L,
        d_v]``, after the rotation) from other uses of them: the layers
        that read them (:mod:`attn_np.shared_kv`), added to this layer's
        own before they go back through the rotation and ``W_k``, ``W_v``."""
        x3, o, att, rope, unbatched, dy3 = self.saved_forward(dy)
        do, dx_out = self.output_backward(dy3, o)
        if self.flash:  # O(L) memory: the tiled core frees o once read,
            self._cache = o = None  # so this forward serves one backward
        # dk, dv summed per group
        g = grouped_attention_backward(do, att, release=self.flash)
        del do  # read: freed before the projections' gradients
        for name in g.keys() - {"q", "k", "v"}:  # sinks, score mods' params
            self.grads[name] = g.pop(name).reshape(self.params[name].shape)
        if dkv is not None:  # every use of k and v adds up
            g["k"], g["v"] = _add_kv_grads(g["k"], g["v"], dkv)
        self.position_backward(g, rope)  # g["q"], g["k"] turned back
        dx = self.project_backward(x3, g)  # consumes g
        if dx_out is not None:  # an output step that reads x
            dx = dx + dx_out
        return dx[0] if unbatched else dx

    def saved_forward(self, dy):
        """What the last forward kept, ``(x3, o, att, rope, unbatched)``,
        and the upstream gradient ``dy`` as ``dy3 [B, L, d_model]``, both
        checked: a forward without a cache happened, ``dy`` has the
        output's shape and is finite, ``x`` was not changed since."""
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
        return x3, o, att, rope, unbatched, dy.reshape(B, L, self.d_model)

    def output_backward(self, dy3, o):
        """The twin of :meth:`output`: fills ``dW_o``; returns ``(do [B,
        n_kv, G, L, d_v], dx)``, ``dx`` None (the step reads no ``x``)."""
        if self.out_projection is not None:
            return self.out_projection.backward(self, dy3, o)
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
        if self.projection is not None:
            return self.projection.backward(self, x3, g, self._projected)
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
        """An empty cache for this layer (keys after RoPE, and values):
        rolling, holding only the window, for a window layer."""
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


def check_parts(rotary, mask_rule, score_mods, scale):
    """A layer's parts, checked: ``(rotary, mask_rule, score_mods,
    scale)``."""
    check_rotary(rotary)
    if mask_rule is not None and not callable(mask_rule):
        raise TypeError(
            "mask_rule must be a callable (q_positions, k_positions) -> "
            f"[L_q, L_k] bool (a ChunkedMask), got {mask_rule!r}"
        )
    try:
        score_mods = tuple(score_mods)
    except TypeError:
        raise TypeError(
            "score_mods must be a sequence of score mods, got "
            f"{score_mods!r}"
        ) from None
    for mod in score_mods:
        if not callable(getattr(mod, "backward", None)):
            raise TypeError(
                "score_mods must have forward(s, ctx) and backward(ds, "
                f"saved), got {mod!r}"
            )
    if scale is not None:
        scale = check_positive_number(scale, "scale")
    return rotary, mask_rule, score_mods, scale


def check_step_parts(*parts):
    """The parts given for the project and output steps (None: the
    plain step), each with ``add_params``, ``forward`` and ``backward``,
    or a ``TypeError`` naming it."""
    names = ("projection", "out_projection")
    for name, part in zip(names, parts):
        if part is not None and not all(
            callable(getattr(part, m, None))
            for m in ("add_params", "forward", "backward")
        ):
            raise TypeError(
                f"{name} must be a step part with add_params(layer, rng), "
                f"forward and backward, got {part!r}"
            )
    return [p for p in parts if p is not None]


def _add_kv_grads(dk, dv, dkv):
    """``dk + dkv[0]``, ``dv + dkv[1]``: the gradients of shared keys and
    values, checked against the layer's own."""
    if not (isinstance(dkv, tuple) and len(dkv) == 2):
        raise TypeError(
            f"dkv must be a tuple (dk, dv), got {type(dkv).__name__}"
        )
    out = []
    for name, mine, theirs in (("dk", dk, dkv[0]), ("dv", dv, dkv[1])):
        theirs = as_float_array(theirs, name)
        if theirs.shape != mine.shape:
            raise ValueError(
                f"{name} must have the shape of the layer's "
                f"{name[1:]} {mine.shape}, got {theirs.shape}"
            )
        check_finite(theirs, name)
        out.append(mine + theirs)
    return out


def check_positions(positions, L, kv_cache):
    """A forward's ``positions``: None, or ``[L]`` non-negative ints
    (over a plain cache, not a rolling one)."""
    if positions is None:
        return None
    p = np.asarray(positions)
    if p.shape != (L,) or not np.issubdtype(p.dtype, np.integer):
        raise ValueError(
            f"positions must be [L] = [{L}] ints, one per position of x, "
            f"got {p.dtype} of shape {p.shape}"
        )
    if L and p.min() < 0:
        raise ValueError(f"positions must be >= 0, got {p.min()}")
    if kv_cache is not None and getattr(kv_cache, "window", None):
        raise ValueError(
            "positions= needs a cache that holds every position (not a "
            f"rolling cache), got {kv_cache!r}"
        )
    return p


def key_positions(where, L_q, L_k):
    """The absolute positions ``([L_q], [L_k])`` of a step's queries and
    keys: a cache's (``where``), or the last query at the last key."""
    k_pos = where.get("k_positions")
    k_pos = np.arange(L_k) if k_pos is None else np.asarray(k_pos)
    q_pos = where.get("q_positions")
    if q_pos is None:
        q_pos = k_pos[-1] + 1 - L_q + np.arange(L_q)
    return np.asarray(q_pos), k_pos


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
