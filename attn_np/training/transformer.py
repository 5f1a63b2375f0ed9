"""A small decoder-only transformer built from the book's pieces (chapter 5).

    ids [B, L] -> embedding + sinusoidal positions -> n_layers x block
               -> RMSNorm -> linear -> logits [B, L, V]

With ``positions="rope"`` (chapter 6) no table is added: every attention
layer rotates its queries and keys instead (rotary position embeddings).
    block:  x = x + attn(norm1(x))   (causal self-attention: MHA/GQA/MQA)
            x = x + ffn(norm2(x))    (GELU MLP)

Pre-norm residual blocks (each sub-layer reads a normalised copy and adds to
the residual stream). ``params`` and ``grads`` are flat dicts keyed by layer,
e.g. ``"block0.attn.W_q"``; they hold the layers' own arrays, so an optimizer
that updates ``params`` in place trains the model.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_float_array, check_finite, check_positive_int
from ..multihead import GroupedQueryAttention
from .layers import (
    Composite,
    Embedding,
    FeedForward,
    Linear,
    RMSNorm,
    check_forward_done,
    check_token_ids,
    sinusoidal_positions,
)

POSITIONS = ("sinusoidal", "rope", "none")


def full_attention_layer(d_model, n_heads, n_kv_heads, **settings):
    """A ``"full"`` layer of the stack: chapter 3's
    :class:`~attn_np.GroupedQueryAttention` with the model's positions,
    window and sinks."""
    return GroupedQueryAttention(
        d_model,
        n_heads,
        n_kv_heads,
        d_k=settings["d_k"],
        d_v=settings["d_v"],
        seed=settings["seed"],
        dtype=settings["dtype"],
        rope_base=settings["rope_base"],
        rope_layout=settings["rope_layout"],
        window=settings["window"],
        sinks=settings["sinks"],
    )


# The layer kinds ``layer_pattern`` names: ``kind -> build(d_model,
# n_heads, n_kv_heads, **settings)``. A later chapter adds its kind here
# (chapter 12's ``"linear"``, :func:`register_layer_kind`): the model
# takes its layers from the table and imports no later chapter.
LAYER_KINDS = {"full": full_attention_layer}


def register_layer_kind(kind, build):
    """Let ``layer_pattern`` name ``kind``, built by ``build(d_model,
    n_heads, n_kv_heads, **settings)`` (``settings``: ``d_k, d_v, seed,
    dtype, rope_base, rope_layout, window, sinks, linear_options``)."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"kind must be a non-empty str, got {kind!r}")
    if not callable(build):
        raise TypeError(f"build must be callable, got {build!r}")
    LAYER_KINDS[kind] = build


class Block(Composite):
    """One pre-norm transformer block around any attention layer with the
    book's layer protocol."""

    def __init__(self, attn, d_ff, seed=0, dtype=np.float64):
        d = attn.d_model
        self.norm1, self.attn = RMSNorm(d, dtype=dtype), attn
        self.norm2, self.ffn = (
            RMSNorm(d, dtype=dtype),
            FeedForward(d, d_ff, seed=seed, dtype=dtype),
        )

    def children(self):
        return {
            "norm1": self.norm1,
            "attn": self.attn,
            "norm2": self.norm2,
            "ffn": self.ffn,
        }

    def forward(self, x):
        self._forward_done = True
        # [B, L, d]
        x = x + self.attn.forward(self.norm1.forward(x), causal=True)
        return x + self.ffn.forward(self.norm2.forward(x))  # [B, L, d]

    def backward(self, dy):
        check_forward_done(self, getattr(self, "_forward_done", None))
        # the residual passes dy straight through
        dx = dy + self.norm2.backward(self.ffn.backward(dy))
        return dx + self.norm1.backward(self.attn.backward(dx))


class Transformer(Composite):
    """Decoder-only language model: ``forward(ids [B, L]) -> logits [B, L,
    vocab_size]``.

    ``n_kv_heads`` picks the attention family: ``n_heads`` is MHA, 1 is MQA,
    anything dividing ``n_heads`` in between is GQA. ``d_k`` and ``d_v`` (per
    head) default to ``d_model // n_heads``. With the same ``seed``, the
    embedding, feed-forward and output layers start from the same weights
    whatever the attention family.

    ``positions`` says how the model knows where a token is:
    ``"sinusoidal"`` adds Vaswani et al.'s table to the embeddings,
    ``"rope"`` rotates queries and keys in every attention layer (base
    ``rope_base``, layout ``rope_layout``) and ``"none"`` gives no position
    at all (a causal model can still infer some).

    ``window`` and ``sinks`` go to every attention layer (chapter 8): a
    sliding window of ``window`` positions, and a learned sink logit per
    query head.

    ``layer_pattern`` (chapter 12) builds a hybrid stack: a sequence of
    layer kinds of :data:`LAYER_KINDS`, ``"full"`` and ``"linear"``,
    repeated over the layers (Qwen3-Next's ``("linear", "linear",
    "linear", "full")`` is three Gated DeltaNet layers per attention
    layer). A linear layer (chapter 12 adds the kind) is a
    :class:`~attn_np.GatedDeltaNet` with ``n_heads`` value heads and
    ``n_kv_heads`` key heads of ``d_k`` and ``d_v``; ``linear_options``
    (a dict) goes to it (``chunk_size``, ``conv_size``, ...).
    """

    def __init__(
        self,
        *,
        vocab_size,
        d_model,
        n_layers,
        n_heads,
        n_kv_heads,
        d_ff,
        max_len,
        seed=0,
        dtype=np.float64,
        d_k=None,
        d_v=None,
        positions="sinusoidal",
        rope_base=10000.0,
        rope_layout="half",
        window=None,
        sinks=False,
        layer_pattern=("full",),
        linear_options=None,
    ):
        pattern = tuple(layer_pattern)
        if not pattern or any(t not in LAYER_KINDS for t in pattern):
            raise ValueError(
                "layer_pattern must be a non-empty sequence of "
                f"{tuple(LAYER_KINDS)}, got {layer_pattern!r}"
            )
        if positions not in POSITIONS:
            raise ValueError(
                f"positions must be one of {POSITIONS}, got {positions!r}"
            )
        self.position_encoding = positions
        self.vocab_size = check_positive_int(vocab_size, "vocab_size")
        self.d_model = check_positive_int(d_model, "d_model")
        self.max_len = check_positive_int(max_len, "max_len")
        n_layers = check_positive_int(n_layers, "n_layers")
        self.dtype = np.dtype(dtype)
        seeds = np.random.default_rng(seed).integers(
            2**31, size=(n_layers + 2, 2)
        )
        self.embed = Embedding(
            vocab_size, d_model, seed=seeds[0, 0], dtype=dtype
        )
        # [max_len, d], fixed; None when positions enter in attention
        self.positions = (
            sinusoidal_positions(max_len, d_model, dtype=dtype)
            if positions == "sinusoidal"
            else None
        )
        settings = dict(
            d_k=d_k,
            d_v=d_v,
            dtype=dtype,
            rope_base=rope_base if positions == "rope" else None,
            rope_layout=rope_layout,
            window=window,
            sinks=sinks,
            linear_options=linear_options,
        )

        def attention(i, seed):
            build = LAYER_KINDS[pattern[i % len(pattern)]]
            return build(d_model, n_heads, n_kv_heads, seed=seed, **settings)

        self.layer_types = [
            pattern[i % len(pattern)] for i in range(n_layers)
        ]
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.blocks = [
            Block(attention(i, s_attn), d_ff, seed=s_ffn, dtype=dtype)
            for i, (s_attn, s_ffn) in enumerate(seeds[1:-1])
        ]
        self.norm_f = RMSNorm(d_model, dtype=dtype)
        self.head = Linear(
            d_model, vocab_size, seed=seeds[-1, 0], dtype=dtype
        )

    def __repr__(self) -> str:
        hybrid = (
            f"layer_types={self.layer_types}, "
            if "linear" in self.layer_types
            else ""
        )
        return (
            f"Transformer(vocab_size={self.vocab_size}, "
            f"d_model={self.d_model}, n_layers={len(self.blocks)}, "
            f"n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
            f"{hybrid}params={self.n_params})"
        )

    # -----------------------------------------------------------------
    # parameters
    def children(self):
        """``{name: layer}`` for every layer that owns parameters, in forward
        order."""
        out = {"embed": self.embed}
        for i, blk in enumerate(self.blocks):
            out.update(
                {
                    f"block{i}.{name}": layer
                    for name, layer in blk.children().items()
                }
            )
        out.update({"norm_f": self.norm_f, "head": self.head})
        return out

    @property
    def n_params(self) -> int:
        return sum(p.size for p in self.params.values())

    def kv_bytes_per_token(self, dtype=None) -> int:
        """Bytes of keys and values cached per generated token: sum over
        attention layers of n_kv (d_k + d_v) x itemsize (a linear layer's
        state does not grow with the tokens)."""
        item = np.dtype(self.dtype if dtype is None else dtype).itemsize
        return sum(
            b.attn.n_kv_heads * (b.attn.d_k + b.attn.d_v) * item
            for b, t in zip(self.blocks, self.layer_types)
            if t == "full"
        )

    # ------------------------------------------------------------
    # forward/backward
    def forward(self, ids):
        ids = check_token_ids(ids, self.vocab_size)
        if ids.ndim != 2 or not 1 <= ids.shape[1] <= self.max_len:
            raise ValueError(
                "ids must have shape [B, L] with 1 <= L <= "
                f"max_len={self.max_len}, got {ids.shape}"
            )
        self._forward_done = True
        x = self.embed.forward(ids)  # [B, L, d]
        if self.positions is not None:  # "rope" rotates inside attention
            x = x + self.positions[: ids.shape[1]]  # [B, L, d] + [L, d]
        for blk in self.blocks:
            x = blk.forward(x)  # [B, L, d]
        # [B, L, d] -> [B, L, V]
        return self.head.forward(self.norm_f.forward(x))

    def backward(self, dlogits):
        """Fills ``grads`` for every parameter; returns ``None`` (token ids
        have no gradient)."""
        check_forward_done(self, getattr(self, "_forward_done", None))
        check_finite(as_float_array(dlogits, "dlogits"), "dlogits")
        # [B, L, V] -> [B, L, d]
        dx = self.norm_f.backward(self.head.backward(dlogits))
        for blk in reversed(self.blocks):
            dx = blk.backward(dx)
        # positions are constants: their gradient is dropped
        return self.embed.backward(dx)

    def attention_maps(self) -> list[np.ndarray]:
        """The last forward's attention weights, one ``[B, n_heads, L, L]``
        array per layer (None for a linear layer: it has none)."""
        return [
            blk.attn.attention_weights if t == "full" else None
            for blk, t in zip(self.blocks, self.layer_types)
        ]
