"""What a Gated DeltaNet layer carries between chunks (chapter 12): its
:class:`StateCache`, and the bytes it holds per sequence."""

from __future__ import annotations

import weakref

import numpy as np

from .._checks import (
    check_count,
    check_float_dtype,
    check_positive_int,
)

# ---------------------------------------------------------------------------
# -- the state cache


class StateCache:
    """What a Gated DeltaNet layer carries from one chunk to the next, for
    one batch of sequences: the state ``[B, n_v_heads, d_k, d_v]`` and the
    last ``K - 1`` inputs of each short convolution.

    Unlike a :class:`~attn_np.KVCache` it does not grow: ``nbytes`` is the
    same after 10 tokens and after a million. ``len(cache)`` counts the
    positions seen. A state cannot forget its last tokens, so
    :meth:`truncate` only keeps everything or resets to empty.
    """

    def __init__(self):
        self.state = None  # [B, n_v_heads, d_k, d_v]
        self.conv = None  # (q, k, v) inputs: each [B, K-1, channels]
        self._seen = 0
        self._owner = None  # a weak reference to the layer filling it

    def __len__(self) -> int:
        return self._seen

    def __repr__(self) -> str:
        if self.state is None:
            return "StateCache(empty)"
        B, n_v, d_k, d_v = self.state.shape
        return (
            f"StateCache(batch={B}, n_v_heads={n_v}, d_k={d_k}, d_v={d_v}, "
            f"seen={self._seen}, dtype={self.state.dtype}, "
            f"nbytes={self.nbytes})"
        )

    @property
    def state_bytes(self) -> int:
        """``B n_v_heads d_k d_v x itemsize``."""
        return 0 if self.state is None else self.state.nbytes

    @property
    def conv_bytes(self) -> int:
        """``B (K - 1) (2 n_k d_k + n_v d_v) x itemsize``."""
        return 0 if self.conv is None else sum(c.nbytes for c in self.conv)

    @property
    def nbytes(self) -> int:
        """State and convolution inputs: the whole per-layer cache."""
        return self.state_bytes + self.conv_bytes

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions: only ``n = len(self)`` (nothing
        to do) or ``n = 0`` (start again) are possible; the state mixes
        every position into the same numbers."""
        n = check_count(n, "n", minimum=0)
        if n == self._seen:
            return
        if n:
            raise ValueError(
                f"a StateCache cannot be truncated to {n} of its "
                f"{self._seen} positions: the state holds no positions "
                "one by one (only n=0, a reset, or n=len(cache))"
            )
        self.state, self.conv, self._seen = None, None, 0

    def check_chunk(
        self, x_shape, *, batch, n_v_heads, d_k, d_v, conv_shapes, dtype
    ) -> None:
        """Raise unless a chunk ``x_chunk`` (of shape ``x_shape``) of a layer
        with this layout fits the cache (before any work)."""
        if self.state is None:
            return
        want = (batch, n_v_heads, d_k, d_v)
        if self.state.shape != want:
            raise ValueError(
                f"x_chunk {tuple(x_shape)} needs a state of shape [B, "
                f"n_v_heads, d_k, d_v] = {want}, but kv_cache holds "
                f"{self.state.shape}: use one StateCache per layer and batch"
            )
        got = tuple(c.shape for c in self.conv)
        if got != tuple(conv_shapes):
            raise ValueError(
                f"x_chunk {tuple(x_shape)} needs convolution inputs of "
                f"shapes {tuple(conv_shapes)}, but kv_cache holds {got}"
            )
        if np.dtype(dtype) != self.state.dtype:
            raise TypeError(
                f"x_chunk makes a state of dtype {np.dtype(dtype)}, but "
                f"kv_cache holds {self.state.dtype}"
            )

    def check_owner(self, layer) -> None:
        """Raise unless ``layer`` filled this cache (the first to feed
        it while empty claims it) or holds the same weights (a copy): a
        second layer's chunk would continue another layer's state
        without a word, as :meth:`attn_np.KVCache.check_owner` says."""
        owner = None if self._owner is None else self._owner()
        if self.state is None or owner is None:
            self._owner = weakref.ref(layer)
            return
        if owner is layer:
            return
        p, q = owner.params, layer.params
        if p.keys() != q.keys() or not all(
            np.array_equal(p[k], q[k]) for k in p
        ):
            raise ValueError(
                f"kv_cache was filled by another layer ({owner!r}) with "
                "other weights; a state cache belongs to one layer: give "
                f"each layer its own cache ({self!r})"
            )

    def update(self, state, conv, n_new: int) -> None:
        self.state, self.conv = state, tuple(conv)
        self._seen += n_new


def check_head_groups(n_v_heads: int, n_k_heads: int) -> None:
    """Each key head serves a group of value heads: ``n_v_heads`` must be
    a multiple of ``n_k_heads``."""
    if n_v_heads % n_k_heads:
        raise ValueError(
            "n_v_heads must be a multiple of n_k_heads (each key head "
            f"serves a group of value heads), got n_v_heads={n_v_heads} "
            f"and n_k_heads={n_k_heads}"
        )


def state_bytes(
    n_v_heads, n_k_heads, d_k, d_v, *, conv_size=4, dtype=np.float32
) -> int:
    """Bytes a Gated DeltaNet layer keeps per sequence, at any context:
    the state and the convolution's last inputs, ``(n_v d_k d_v + (K -
    1)(2 n_k d_k + n_v d_v)) x itemsize``."""
    item = check_float_dtype(dtype).itemsize
    n_v_heads = check_positive_int(n_v_heads, "n_v_heads")
    n_k_heads = check_positive_int(n_k_heads, "n_k_heads")
    d_k = check_positive_int(d_k, "d_k")
    d_v = check_positive_int(d_v, "d_v")
    conv_size = check_positive_int(conv_size, "conv_size")
    check_head_groups(n_v_heads, n_k_heads)
    state = n_v_heads * d_k * d_v
    conv = (conv_size - 1) * (2 * n_k_heads * d_k + n_v_heads * d_v)
    return (state + conv) * item
