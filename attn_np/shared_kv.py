"""Layers that share keys and values across depth (chapter 10).

Gemma 3n (``num_kv_shared_layers``) and Gemma 4 give the last layers of a
model no key or value projection: each of them computes its queries from
its own input and attends to the keys and values of an earlier layer of
its kind (Hugging Face's ``kv_sharing_modes``: the producer "stores" its
rotated, normalised keys and values in ``shared_kv_states``, each consumer
"reuses" them). Mistral Large 4's MLA does the same with its latent rows
(``kv_source_layers``). The cache then holds one layer's keys and values
for several layers: the KV calculator (appendix A1) counts only the
producers.

Forward. Producer ``p`` with input ``x_p``, consumer ``c`` with input
``x_c``::

    K = rope(x_p W_k), V = x_p W_v            (the producer's own)
    y_p = attend(rope(x_p W_q^p), K, V) W_o^p
    y_c = attend(rope(x_c W_q^c), K, V) W_o^c  (no W_k, W_v of its own)

Backward. ``K`` and ``V`` feed the producer's attention and every
consumer's, so by the chain rule over all their uses::

    dK = dK_p + sum_c dK_c,   dV = dV_p + sum_c dV_c

and only then does the producer turn ``dK`` back through its rotation
and ``W_k`` (``dW_k = x_p^T rope^T(dK)``), and ``dV`` through ``W_v``. A
consumer's own gradient stops at its queries: ``dx_c`` comes from ``W_q^c``
and ``W_o^c`` alone, and ``K``, ``V`` carry the rest of its influence
back to ``x_p``. :class:`KVReader` is the consumer (its backward leaves
``dkv``); :meth:`GroupedQueryAttention.backward(dy, dkv=...)
<attn_np.GroupedQueryAttention.backward>` adds the consumers' sum;
:class:`SharedKVStack` is a residual stack of one producer and its
readers, to check the whole by finite differences.
"""

from __future__ import annotations

import numpy as np

from ._checks import (
    as_float_array,
    check_cache_kind,
    check_finite,
    check_flag,
    check_layer_input,
    fingerprint,
)
from .grouped import grouped_attention_backward
from .heads import flat, merge_groups, split_groups
from .kv_cache import KVCache
from .multihead import GroupedQueryAttention
from .training.layers import Composite


def shared_kv(layer):
    """``(k [B, n_kv, L, d_k], v [B, n_kv, L, d_v])``: the keys and values
    ``layer`` attended in its last forward without a cache (after its
    rotation and norms), which its readers share. Read-only views."""
    att = getattr(layer, "_att", None)
    if getattr(layer, "_cache", None) is None or att is None:
        raise RuntimeError(
            "shared_kv needs a preceding forward of the producer without "
            "kv_cache (its keys and values are read from it)"
        )
    k, v = att.k.view(), att.v.view()
    k.flags.writeable = v.flags.writeable = False
    return k, v


class KVReader(GroupedQueryAttention):
    """A query-only attention layer: ``W_q`` and ``W_o`` (no ``W_k``,
    ``W_v``), attending with its own queries to the keys and values of a
    producer layer (:func:`shared_kv`). The same arguments as
    :class:`~attn_np.GroupedQueryAttention`; ``n_kv_heads``, ``d_k`` and
    ``d_v`` must be the producer's.

    ``forward(x, kv, causal=True)`` with ``kv = shared_kv(producer)``
    (``kv`` left out: the keys of ``producer``, when the reader has one
    attached); ``backward(dy)`` returns ``dx`` and leaves ``dkv``, the
    gradients of the shared keys and values, for the producer's
    backward. Decoding, ``forward(x_chunk, kv_cache=c)`` reads ``c``,
    the producer's cache after the producer's step of the same chunk,
    and writes nothing: a reader keeps no cache of its own."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.projection is not None or self.out_projection is not None:
            raise ValueError(
                "a KVReader takes the plain projections only (no "
                "projection or output part)"
            )
        for name in ("W_k", "W_v"):
            del self.params[name], self.grads[name]
        self._packed = None
        self.dkv = None
        self.producer = None  # the layer whose keys it reads, if attached

    def forward(
        self, x, kv=None, *, causal=True, mask=None, kv_cache=None, **unused
    ):
        """``y`` for ``x [B, L, d_model]`` (or ``[L, d_model]``) attending
        to ``kv = (k [B, n_kv, L_k, d_k], v [B, n_kv, L_k, d_v])``, causal
        by default (the last query at the last key)."""
        if unused:
            raise TypeError(
                f"KVReader.forward takes x, kv, causal, mask and kv_cache, "
                f"got {sorted(unused)}"
            )
        check_flag(causal, "causal")
        x3, unbatched = check_layer_input(x, self.d_model, "x")
        if kv_cache is not None:
            y = self._decode(x3, kv, mask, kv_cache)
            return y[0] if unbatched else y
        if kv is None and self.producer is not None:
            kv = shared_kv(self.producer)
        k, v = self._check_kv(kv, x3)
        L = x3.shape[1]
        q, saved = self._queries(x3, np.arange(L))  # positions 0 ... L-1
        o, self._att = self.attend(q, k, v, mask=mask, causal=causal)
        y, out = self.output(o, x3)  # [B, L, d_model]
        self._cache = (x3, out, self._att, saved, unbatched, fingerprint(x3))
        self.dkv = None
        return y[0] if unbatched else y

    def _decode(self, x3, kv, mask, cache):
        """A chunk's queries at the cache's last ``L`` positions over the
        keys the producer's cache holds (inference: nothing kept)."""
        check_cache_kind(cache, KVCache, "the producer's cache")
        B, L = x3.shape[:2]
        n = len(cache)
        if kv is not None or mask is not None or n < L:
            raise ValueError(
                "a KVReader decodes over its producer's cache alone (no kv "
                f"or mask) after the producer's step of the same {L} "
                f"positions, got kv={type(kv).__name__}, a mask "
                f"{mask is not None} and a cache of {n} positions"
            )
        k, v = cache.keys, cache.values  # [B, n_kv, held, d]
        want = (B, self.n_kv_heads, self.d_k, self.d_v)
        got = (k.shape[0], k.shape[1], k.shape[3], v.shape[3])
        if got != want:
            raise ValueError(
                f"kv_cache must hold (B, n_kv_heads, d_k, d_v) = {want} "
                f"(the producer's, for x of shape {x3.shape}), got {got}"
            )
        if cache.window != self.window:
            raise ValueError(
                f"kv_cache has window={cache.window} but the reader has "
                f"window={self.window}: it reads a producer of its kind"
            )
        positions = n - L + np.arange(L)  # the chunk's: [L]
        where = {"causal": True}
        if cache.window is not None:  # a rolling cache: the keys held
            where.update(q_positions=positions, k_positions=cache.positions)
            where["sink_tokens"] = cache.sink_tokens
        q, _ = self._queries(x3, positions)
        o, self._att = self.attend(q, k, v, **where)
        self._cache = None
        return self.output(o, x3)[0]  # [B, L, d_model]

    def _queries(self, x3, positions):
        """``q [B, n_kv, G, L, d_k]``, turned to ``positions``, and what
        the backward needs."""
        B, L, _ = x3.shape
        # [B*L, d_model] @ [d_model, h*d_k] -> [B, L, h*d_k]
        q, saved = self.project_queries(x3)
        q = split_groups(q, self.n_kv_heads, self.group_size, self.d_k)
        rope = None
        if self.rotary is not None:
            q, rope = self.rotary.forward(q, positions)
        return q, (saved, rope)

    def project_queries(self, x3):
        """``x3 [B, L, d_model]`` -> ``(q [B, L, h*d_k], saved)``: the
        queries before their rotation (a subclass adds a norm here)."""
        B, L, _ = x3.shape
        return (flat(x3) @ self.params["W_q"]).reshape(B, L, -1), None

    def project_queries_backward(self, x3, dq, saved):
        """The twin of :meth:`project_queries`: fills ``grads["W_q"]``,
        returns ``dx``."""
        # [d_model, B*L] @ [B*L, h*d_k] -> [d_model, h*d_k]
        self.grads["W_q"] = flat(x3).T @ flat(dq)
        return dq @ self.params["W_q"].T  # [B, L, d_model]

    def _check_kv(self, kv, x3):
        if not (isinstance(kv, tuple) and len(kv) == 2):
            raise TypeError(
                "kv must be the producer's (k, v), shared_kv(producer), "
                f"got {type(kv).__name__}"
            )
        k, v = (as_float_array(a, n) for a, n in zip(kv, ("k", "v")))
        B, L = x3.shape[:2]
        want_k = (B, self.n_kv_heads, L, self.d_k)
        want_v = (B, self.n_kv_heads, L, self.d_v)
        if k.shape != want_k or v.shape != want_v:
            raise ValueError(
                f"kv must be k {want_k} and v {want_v} (the producer's, "
                f"for x of shape {x3.shape}), got {k.shape} and {v.shape}"
            )
        check_finite(k, "k")
        check_finite(v, "v")
        return k, v

    def new_cache(self):
        raise ValueError(
            "a KVReader keeps no cache: decode with its producer's "
            "(forward(x_chunk, kv_cache=c) after the producer's step)"
        )

    def backward(self, dy, dkv=None):
        """``dx``; fills ``grads`` (``W_q``, ``W_o``, ...) and leaves
        ``dkv = (dk, dv)`` for the producer."""
        if dkv is not None:
            raise ValueError(
                "a KVReader shares no keys of its own: pass dkv=None"
            )
        x3, o, att, saved, unbatched, dy3 = self.saved_forward(dy)
        do, _ = self.output_backward(dy3, o)
        g = grouped_attention_backward(do, att)  # dk, dv summed per group
        for name in g.keys() - {"q", "k", "v"}:  # sinks, score mods' params
            self.grads[name] = g.pop(name).reshape(self.params[name].shape)
        self.dkv = (g.pop("k"), g.pop("v"))  # [B, n_kv, L_k, d]
        dq = g.pop("q")
        projected, rope = saved
        if rope is not None:  # turned back by -theta
            dq = self.rotary.backward(dq, rope)
        dx = self.project_queries_backward(x3, merge_groups(dq), projected)
        return dx[0] if unbatched else dx


class SharedKVStack(Composite):
    """A residual stack of one producer and the readers of its keys and
    values: ``x1 = x + producer(x)``, then ``x_{i+1} = x_i + reader_i(x_i,
    kv)`` with ``kv = shared_kv(producer)``. Its backward sums the
    readers' ``dkv`` into the producer's (the module docstring); it has
    the layer protocol, so :func:`~attn_np.check_layer_gradients` checks
    it whole."""

    def __init__(self, producer, readers):
        if not isinstance(producer, GroupedQueryAttention) or isinstance(
            producer, KVReader
        ):
            raise TypeError(
                "producer must be a GroupedQueryAttention with W_k and W_v, "
                f"got {type(producer).__name__}"
            )
        readers = list(readers)
        for r in readers:
            if not isinstance(r, KVReader):
                raise TypeError(
                    f"readers must be KVReaders, got {type(r).__name__}"
                )
            mine = (producer.n_kv_heads, producer.d_k, producer.d_v)
            theirs = (r.n_kv_heads, r.d_k, r.d_v)
            if theirs != mine:
                raise ValueError(
                    "a reader's (n_kv_heads, d_k, d_v) must be its "
                    f"producer's {mine}, got {theirs}"
                )
        self.producer, self.readers = producer, readers

    def children(self):
        out = {"producer": self.producer}
        out.update({f"reader{i}": r for i, r in enumerate(self.readers)})
        return out

    def forward(self, x):
        x = x + self.producer.forward(x, causal=True)  # [B, L, d]
        kv = shared_kv(self.producer)
        for r in self.readers:
            x = x + r.forward(x, kv)
        return x

    def backward(self, dy):
        dk = dv = None
        for r in reversed(self.readers):
            dy = dy + r.backward(dy)
            dk = r.dkv[0] if dk is None else dk + r.dkv[0]
            dv = r.dkv[1] if dv is None else dv + r.dkv[1]
        dkv = None if dk is None else (dk, dv)
        return dy + self.producer.backward(dy, dkv=dkv)
