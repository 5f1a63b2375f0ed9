"""A long input through a model, chunk by chunk, with one cache per layer
(chapter 8).

:func:`stream_logits` runs chapter 5's :class:`~attn_np.Transformer` the
way a server decodes: every layer keeps the cache its ``new_cache()``
makes (the one cache protocol: a :class:`~attn_np.KVCache` that matches
an attention layer's window, a linear layer's
:class:`~attn_np.StateCache`, ...). Layers without a window keep
everything (the result equals ``model.forward``); window layers keep a
rolling cache, and ``sink_tokens=S`` adds StreamingLLM's attention sinks
(Xiao et al. 2023): the first S positions stay in every rolling cache.
:class:`MarkedCopy` is the small task the chapter trains on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import check_count, check_positive_int, check_token_ids
from .kv_cache import KVCache
from .training.tasks import RecallBatch


def stream_logits(model, ids, *, sink_tokens=0, chunk=None):
    """Logits ``[B, L, vocab]`` of ``model`` for ``ids [B, L]``, fed
    ``chunk`` positions at a time (default: all at once).

    Each layer gets ``layer.new_cache()``; with ``sink_tokens=S`` a window
    layer gets ``KVCache(window=layer.window, sink_tokens=S)`` instead (no
    sinks for a layer without a window). The output does not depend on
    ``chunk``, and the input may be longer than ``model.max_len`` when
    the model rotates its positions (RoPE) instead of adding a table.
    """
    ids = check_token_ids(ids, model.vocab_size)
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"ids must have shape [B, L], got {ids.shape}")
    B, L = ids.shape
    if model.positions is not None and L > model.max_len:
        raise ValueError(
            f"ids has {L} positions but the model's position table holds "
            f"max_len={model.max_len}"
        )
    chunk = L if chunk is None else check_positive_int(chunk, "chunk")
    S = check_count(sink_tokens, "sink_tokens", minimum=0)
    caches = [_cache(blk.attn, S) for blk in model.blocks]
    out = []
    for start in range(0, L, chunk):
        x = model.embed.forward(ids[:, start : start + chunk])  # [B, C, d]
        if model.positions is not None:  # [B, C, d] + [C, d]
            x = x + model.positions[start : start + x.shape[1]]
        for blk, cache in zip(model.blocks, caches):
            # the pre-norm block of Block.forward, with a cache
            a = blk.attn.forward(blk.norm1.forward(x), kv_cache=cache)
            x = x + a  # [B, C, d]
            x = x + blk.ffn.forward(blk.norm2.forward(x))  # [B, C, d]
        # [B, C, d] -> [B, C, vocab]
        out.append(model.head.forward(model.norm_f.forward(x)))
    return np.concatenate(out, axis=1)  # [B, L, vocab]


def _cache(layer, sink_tokens):
    """``layer.new_cache()``, or a StreamingLLM cache for a window
    layer when ``sink_tokens`` asks for one."""
    window = getattr(layer, "window", None)
    if sink_tokens and window is not None:
        return KVCache(window=window, sink_tokens=sink_tokens)
    return layer.new_cache()


@dataclass(frozen=True)
class MarkedCopy:
    """A stream of random tokens in which a marker asks for the token
    ``lag`` positions back (the chapter-8 task).

    Position 0 holds ``BOS``. Elsewhere a token is one of ``n_tokens``
    ordinary tokens or, with probability ``p_marker``, the marker. At an
    ordinary token the target is a fixed permutation of that token (no
    attention needed); at a marker it is the token ``lag`` positions back
    (attention needed, within any window longer than ``lag``). So an
    attention head has work at markers and nothing to do elsewhere. Every
    position but 0 counts in the loss.
    """

    n_tokens: int = 16
    lag: int = 3
    p_marker: float = 0.15
    seq_len: int = 48

    def __post_init__(self):
        for name in ("n_tokens", "lag", "seq_len"):
            check_positive_int(getattr(self, name), name)
        p = self.p_marker
        if (
            isinstance(p, bool)
            or not isinstance(p, (int, float))
            or not 0 <= p <= 1
        ):
            raise ValueError(f"p_marker must be in [0, 1], got {p!r}")
        if self.seq_len <= self.lag:
            raise ValueError(
                "seq_len must be longer than lag (a marker asks for the "
                f"token lag positions back), got seq_len={self.seq_len} "
                f"and lag={self.lag}"
            )

    @property
    def marker(self) -> int:
        return self.n_tokens

    @property
    def bos(self) -> int:
        return self.n_tokens + 1

    @property
    def vocab_size(self) -> int:
        return self.n_tokens + 2

    def sample(self, n, seed, length=None) -> RecallBatch:
        """``n`` sequences of ``length`` (default ``seq_len``) tokens
        drawn from ``np.random.default_rng(seed)``."""
        n = check_positive_int(n, "n")
        L = (
            self.seq_len
            if length is None
            else check_positive_int(length, "length")
        )
        rng = np.random.default_rng(seed)
        perm = np.random.default_rng(0).permutation(self.n_tokens)
        z = rng.integers(self.n_tokens, size=(n, L))  # [n, L]
        marked = rng.random((n, L)) < self.p_marker  # [n, L]
        marked[:, : self.lag + 1] = False
        for t in range(self.lag + 1, L):  # a marker never copies a marker
            marked[:, t] &= ~marked[:, t - self.lag]
        inputs = np.where(marked, self.marker, z)  # [n, L]
        inputs[:, 0] = self.bos
        targets = perm[z]  # [n, L]
        # [n, L - lag]: the token lag positions back
        back = inputs[:, : L - self.lag]
        targets[:, self.lag :] = np.where(
            marked[:, self.lag :], back, targets[:, self.lag :]
        )
        mask = np.ones((n, L), dtype=bool)
        mask[:, 0] = False
        return RecallBatch(inputs=inputs, targets=targets, mask=mask)
