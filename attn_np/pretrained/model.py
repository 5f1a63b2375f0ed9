"""A real model assembled from the book's parts: SmolLM2-135M (chapter 14).

    ids [B, L] -> embedding E[ids] -> n_layers x block -> RMSNorm
               -> logits = h E^T (the head tied to the embedding)
    block:  x = x + attn(norm1(x))   chapter 3's GQA layer with chapter 6's
                                     RoPE, causal, cache via kv_cache=
            x = x + ffn(norm2(x))    SwiGLU (:mod:`attn_np.ffn`)

Nothing here computes attention, a norm or a rotation: the blocks hold
:class:`~attn_np.GroupedQueryAttention`, chapter 5's
:class:`~attn_np.training.layers.RMSNorm` and :class:`~attn_np.training.
layers.Embedding`, and :class:`~attn_np.ffn.SwiGLU`, with the checkpoint's
weights in their ``params``. A decode step gives every layer its own
:class:`~attn_np.KVCache` (chapter 4) through ``kv_cache=``.

``params`` and ``grads`` are flat dicts with the same keys
(``"embed.W"``, ``"block3.attn.W_q"``, ``"block3.ffn.W_up"``,
``"norm_f.g"``, ...), views of the layers' own arrays. The tied head has
no key of its own: its gradient is added to ``"embed.W"``.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from .._checks import (
    as_float_array,
    check_count,
    check_float_dtype,
    check_positive_int,
    check_token_ids,
    check_upstream,
)
from ..ffn import SwiGLU
from ..kv_cache import KVCache
from ..multihead import GroupedQueryAttention
from ..rope import rope_permutation
from ..training.layers import Composite, Embedding, RMSNorm
from .decode import _decode_step, _fusable
from .sampling import sampler


class DecoderBlock(Composite):
    """One pre-norm Llama block: ``x + attn(norm1(x))``, then ``x +
    ffn(norm2(x))``."""

    def __init__(self, attn, ffn, eps, dtype):
        d = attn.d_model
        self.norm1, self.attn = RMSNorm(d, eps=eps, dtype=dtype), attn
        self.norm2, self.ffn = RMSNorm(d, eps=eps, dtype=dtype), ffn

    def children(self):
        return {
            "norm1": self.norm1,
            "attn": self.attn,
            "norm2": self.norm2,
            "ffn": self.ffn,
        }

    def forward(self, x, *, kv_cache=None, **where):
        """``x [B, L, d]``; with ``kv_cache`` the next chunk over it
        (inference only: nothing kept for a backward). ``where``: the
        attention layer's ``mask`` and ``positions``."""
        if kv_cache is None:
            h = self.attn.forward(
                self.norm1.forward(x), causal=True, **where
            )
            x = x + h
            return x + self.ffn.forward(self.norm2.forward(x))
        # a decode step: the norms' step keeps and checks nothing (the
        # model checked its input once, at the token ids)
        h = self.norm1.step(x)
        x = x + self.attn.forward(h, kv_cache=kv_cache, **where)
        return x + self.ffn.forward(self.norm2.step(x), keep=False)

    def backward(self, dy):
        dx = dy + self.norm2.backward(self.ffn.backward(dy))
        return dx + self.norm1.backward(self.attn.backward(dx))


class ModelCache:
    """One :class:`~attn_np.KVCache` per layer (``caches[i]``), made by
    :meth:`CausalLM.new_cache`; ``len()`` is the positions seen."""

    def __init__(self, caches):
        self.caches = list(caches)

    def __len__(self) -> int:
        return len(self.caches[0])

    def __getitem__(self, i):
        return self.caches[i]

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values held, all layers."""
        return sum(c.nbytes for c in self.caches)

    def truncate(self, length) -> None:
        for c in self.caches:
            c.truncate(length)

    def __repr__(self) -> str:
        return (
            f"ModelCache(layers={len(self.caches)}, positions={len(self)}, "
            f"nbytes={self.nbytes})"
        )


def _zero_grads(layer) -> None:
    """``layer.grads``: zeros of its parameters' shapes and dtypes, from
    :func:`numpy.zeros`, whose large arrays the operating system hands
    out as zero pages when first written (the half gibibyte of a model's
    gradients costs nothing until a backward fills it)."""
    layer.grads = {
        k: np.zeros(v.shape, v.dtype) for k, v in layer.params.items()
    }


class CausalLM(Composite):
    """A decoder-only language model with real weights.

    Built by :func:`~attn_np.pretrained.load_gguf`; ``config`` holds the
    sizes, ``tokenizer`` the vocabulary (a :class:`~attn_np.pretrained.
    tokenizer.GGUFTokenizer`), ``blocks`` the layers.
    ``decode_by_rows``: whether a decode step of one token at one BLAS
    thread makes its vector-matrix products row by row (True) or with
    BLAS (False); None until the first such step measures which is
    faster here (:func:`~attn_np.pretrained.decode._by_rows`).
    """

    def __init__(self, config, *, dtype=np.float64, rope_layout="half"):
        c = self.config = config
        self.dtype = dtype = check_float_dtype(dtype)
        self.vocab_size, self.d_model = c.vocab_size, c.d_model
        # drawn at one row: load_gguf puts the checkpoint's [vocab, d] in
        self.embed = Embedding(1, c.d_model, dtype=dtype)
        self.embed.vocab_size = c.vocab_size
        self.blocks = [
            DecoderBlock(
                GroupedQueryAttention(
                    c.d_model,
                    c.n_heads,
                    c.n_kv_heads,
                    d_k=c.d_k,
                    d_v=c.d_k,
                    seed=i,
                    dtype=dtype,
                    rope_base=c.rope_base,
                    rope_layout=rope_layout,
                ),
                SwiGLU(c.d_model, c.d_ff, seed=None, dtype=dtype),
                c.rms_eps,
                dtype,
            )
            for i in range(c.n_layers)
        ]
        self.norm_f = RMSNorm(c.d_model, eps=c.rms_eps, dtype=dtype)
        self.head = None  # tied: logits = h E^T
        self.tokenizer = None
        self._saved = None  # what backward needs
        self.decode_by_rows = None  # measured at the first decode step

    def __repr__(self) -> str:
        c = self.config
        return (
            f"CausalLM(layers={c.n_layers}, d_model={c.d_model}, "
            f"n_heads={c.n_heads}, n_kv_heads={c.n_kv_heads}, "
            f"d_k={c.d_k}, d_ff={c.d_ff}, vocab={c.vocab_size}, "
            f"rope_layout={self.rope_layout!r}, dtype={self.dtype}, "
            f"params={self.n_params:,})"
        )

    # ------------------------------------------------------------ params
    def children(self):
        out = {"embed": self.embed}
        for i, blk in enumerate(self.blocks):
            out.update(
                {
                    f"block{i}.{n}": layer
                    for n, layer in blk.children().items()
                }
            )
        out["norm_f"] = self.norm_f
        if self.head is not None:  # an untied head
            out["head"] = self.head
        return out

    @property
    def n_params(self) -> int:
        return sum(p.size for p in self.params.values())

    @property
    def nbytes(self) -> int:
        """Bytes of the parameters (the tied matrix counted once)."""
        return sum(p.nbytes for p in self.params.values())

    @property
    def rope_layout(self) -> str:
        return self.blocks[0].attn.rope_layout

    @property
    def head_weight(self) -> np.ndarray:
        """``[vocab, d_model]``: the embedding (tied) or the head's own."""
        return (self.embed if self.head is None else self.head).params["W"]

    def astype(self, dtype) -> CausalLM:
        """A copy of the model with its parameters in ``dtype`` (float32
        to float64 is exact: the same model, for gradient checks)."""
        m = CausalLM(self.config, dtype=dtype, rope_layout=self.rope_layout)
        if self.head is not None:  # an untied head: a slot for it
            m.head = Embedding(1, self.d_model, dtype=dtype)
        for p, (layer, name) in zip(self.params.values(), m._param_slots()):
            layer.params[name] = p.astype(dtype, order="K")
        for layer in m.children().values():
            _zero_grads(layer)
        for mine, theirs in zip(self.blocks, m.blocks):  # packed alike
            if mine.attn.packed_qkv is not None:
                theirs.attn.pack_projections()
            if mine.ffn.packed_gate_up is not None:
                theirs.ffn.pack()
        m.tokenizer = self.tokenizer
        m.source = getattr(self, "source", None)
        return m

    def _param_slots(self):
        """``(layer, name)`` of every parameter, in ``params`` order."""
        return [
            (layer, name)
            for layer in self.children().values()
            for name in layer.params
        ]

    # ----------------------------------------------------------- forward
    def check_ids(self, ids, name="ids") -> np.ndarray:
        """``ids`` as an integer ``[B, L]`` array of the vocabulary."""
        ids = check_token_ids(ids, self.vocab_size, name)
        if ids.ndim != 2 or 0 in ids.shape:
            raise ValueError(
                f"{name} must be token ids of shape [B, L] with B, L >= 1, "
                f"got shape {ids.shape}"
            )
        return ids

    def forward(self, ids, *, kv_cache=None, mask=None, positions=None):
        """``logits [B, L, vocab]`` for ``ids [B, L]``. With ``kv_cache``
        (from :meth:`new_cache`) ``ids`` is the next chunk after the
        positions cached, and nothing is kept for :meth:`backward`.
        ``mask`` (ANDed with the causal mask) and ``positions`` (RoPE's,
        ``[L]``) go to every attention layer: chapter 16's drafted tree
        is verified with them."""
        ids = self.check_ids(ids)
        where = {
            k: v
            for k, v in (("mask", mask), ("positions", positions))
            if v is not None
        }
        if kv_cache is None:
            x = self.embed.forward(ids)  # [B, L, d]
            logits = self._forward(x, None, where)
            self._from_ids = True  # backward fills the embedding's rows
            return logits
        x = self.embed.params["W"][ids]  # [B, L, d], nothing kept
        return self._forward(x, kv_cache, where)

    def forward_embeddings(self, x, *, kv_cache=None):
        """The logits of embedded tokens ``x [B, L, d_model]`` (what
        :meth:`forward` does after the lookup; a gradient check perturbs
        ``x``). :meth:`backward` then returns ``x``'s gradient and leaves
        the embedding's rows out of ``grads["embed.W"]`` (the head's
        part stays)."""
        x = as_float_array(x, "x")
        if x.ndim != 3 or x.shape[-1] != self.d_model or 0 in x.shape:
            raise ValueError(
                f"x must be [B, L, d_model] with d_model={self.d_model}, "
                f"got shape {x.shape}"
            )
        logits = self._forward(x, kv_cache)
        self._from_ids = False
        return logits

    def _forward(self, x, kv_cache, where=None):
        """The blocks, the final norm and the tied head on ``x [B, L,
        d]`` (``where``: the layers' ``mask`` and ``positions``)."""
        where = where or {}
        if kv_cache is not None:
            self._check_cache(kv_cache, x.shape[0])
            self._saved = None
            if _fusable(self, x, kv_cache, where):  # one token: decode.py
                return _decode_step(self, x, kv_cache)
            for blk, cache in zip(self.blocks, kv_cache.caches):
                x = blk.forward(x, kv_cache=cache, **where)  # [B, L, d]
            h = self.norm_f.step(x)  # [B, L, d]
            return h @ self.head_weight.T  # [B, L, d] @ [d, V] -> [B, L, V]
        for blk in self.blocks:
            x = blk.forward(x, **where)  # [B, L, d]
        h = self.norm_f.forward(x)  # [B, L, d]
        self._saved = h
        return h @ self.head_weight.T  # [B, L, d] @ [d, V] -> [B, L, V]

    def backward(self, dlogits):
        """Fills ``grads`` (every key of ``params``) from ``dlogits [B, L,
        vocab]``; returns the gradient of the embedded input ``[B, L,
        d_model]``."""
        if self._saved is None:
            raise RuntimeError(
                "backward needs a preceding forward without kv_cache"
            )
        h = self._saved
        B, L, d = h.shape
        V = self.vocab_size
        dlogits = check_upstream(dlogits, "dlogits", (B, L, V), "the logits")
        W = self.head_weight
        dl = dlogits.reshape(-1, V)  # [B*L, V]
        dW_head = dl.T @ h.reshape(-1, d)  # [V, B*L] @ [B*L, d] -> [V, d]
        dx = self.norm_f.backward(dlogits @ W)  # [B, L, V] @ [V, d]
        for blk in reversed(self.blocks):
            dx = blk.backward(dx)  # [B, L, d]
        tied = self.head is None  # tied: both uses of E add up
        if self._from_ids:  # the rows of the tokens looked up
            self.embed.backward(dx)  # a fresh [V, d] array, added to
            if tied:
                self.embed.grads["W"] += dW_head
        elif tied:  # no lookup: the head's use alone
            self.embed.grads["W"] = dW_head
        else:
            self.embed.grads["W"] = np.zeros_like(self.embed.params["W"])
        if not tied:
            self.head.grads["W"] = dW_head
        return dx

    # ------------------------------------------------------------ caches
    def new_cache(self, initial_capacity=16, *, window=None, sink_tokens=0):
        """A :class:`ModelCache`: one :class:`~attn_np.KVCache` per layer
        (``window`` and ``sink_tokens``: chapter 8's rolling cache, for a
        model inside :meth:`sliding_window`)."""
        return ModelCache(
            KVCache(initial_capacity, window=window, sink_tokens=sink_tokens)
            for _ in self.blocks
        )

    def _check_cache(self, kv_cache, B):
        if not isinstance(kv_cache, ModelCache) or len(
            kv_cache.caches
        ) != len(self.blocks):
            raise TypeError(
                "kv_cache must be the ModelCache of this model's "
                f"new_cache() ({len(self.blocks)} layers), got "
                f"{type(kv_cache).__name__}"
            )
        held = kv_cache.caches[0].batch_size
        if held is not None and held != B:
            raise ValueError(
                f"kv_cache holds a batch of {held} sequences, the chunk "
                f"has {B}"
            )

    @contextmanager
    def sliding_window(self, window):
        """``with model.sliding_window(W): ...`` makes every layer a
        sliding-window layer of ``W`` positions (chapter 8) for the
        block; a cache must then be ``new_cache(window=W, ...)``."""
        window = (
            None if window is None else check_positive_int(window, "window")
        )
        before = [blk.attn.window for blk in self.blocks]
        for blk in self.blocks:
            blk.attn.window = window
        try:
            yield self
        finally:
            for blk, w in zip(self.blocks, before):
                blk.attn.window = w

    # -------------------------------------------------------- generation
    def generate(
        self,
        ids,
        max_new_tokens,
        *,
        temperature=0.0,
        top_k=None,
        top_p=None,
        seed=0,
    ):
        """``ids [B, L + max_new_tokens]``: ``ids`` and the tokens
        generated after it, one at a time with a cache (the prompt in one
        chunk, then one token per step). ``temperature=0``: greedy
        (argmax); else sampled from ``softmax(logits / temperature)``,
        cut to the ``top_k`` most likely and to the smallest set whose
        probability reaches ``top_p``, with ``np.random.default_rng(seed)``.
        """
        ids = self.check_ids(ids)
        n = check_count(max_new_tokens, "max_new_tokens", minimum=0)
        sample = sampler(
            temperature, top_k, top_p, seed, vocab=self.vocab_size
        )
        out = np.empty((ids.shape[0], ids.shape[1] + n), dtype=np.int64)
        out[:, : ids.shape[1]] = ids
        if n == 0:
            return out
        cache = self.new_cache(ids.shape[1] + n)
        logits = self.forward(ids, kv_cache=cache)[:, -1]  # [B, V]
        for t in range(ids.shape[1], ids.shape[1] + n):
            out[:, t] = sample(logits)
            if t + 1 < out.shape[1]:
                logits = self.forward(out[:, t : t + 1], kv_cache=cache)
                logits = logits[:, -1]  # [B, V]
        return out

    # ------------------------------------------------------------- maps
    def attention_weights(self, ids) -> np.ndarray:
        """``[layers, B, n_heads, L, L]``: every head's causal attention
        over ``ids [B, L]`` (one forward)."""
        ids = self.check_ids(ids)
        x = self.embed.params["W"][ids]  # [B, L, d]
        maps = []
        for blk in self.blocks:
            x = blk.forward(x)
            maps.append(blk.attn.attention_weights)  # [B, h, L, L]
        self._saved = None
        return np.stack(maps)

    def chat_prompt(self, messages) -> str:
        """The chat template's text for ``messages``, ending with the
        assistant's turn opened (:meth:`~attn_np.pretrained.tokenizer.
        GGUFTokenizer.chat_prompt`)."""
        return self.tokenizer.chat_prompt(messages)

    # ------------------------------------------------------ RoPE layout
    def unpermute_rope(self):
        """Turn the layers' query and key columns from llama.cpp's order
        (interleaved pairs) to Hugging Face's (rotate-half) and switch
        the layers to ``rope_layout="half"``: the same logits to
        rounding. In place; returns the model."""
        if self.rope_layout != "interleaved":
            raise ValueError(
                "unpermute_rope turns a model with rope_layout="
                f"'interleaved' to 'half'; this one has "
                f"{self.rope_layout!r}"
            )
        c = self.config
        for blk in self.blocks:
            a = blk.attn
            for key, h in (("W_q", c.n_heads), ("W_k", c.n_kv_heads)):
                a.params[key] = np.ascontiguousarray(
                    a.params[key][:, rope_permutation(c.d_k, n_heads=h)]
                )
            if a._packed is not None:  # side by side again
                a.pack_projections()
            _zero_grads(a)
            a.rope_layout = "half"
        return self
