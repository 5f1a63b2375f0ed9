"""Which keys may a query attend? Masks from positions (chapters 1 and 8).

Every causal rule in the library is :func:`position_mask`: the chapter-1
causal mask, chapter 8's sliding window and StreamingLLM's sink tokens,
the decode step over a cache and the tiles of FlashAttention all ask it.
Llama 4's chunked attention (chapter 11) is :func:`chunked_mask`, and
:class:`ChunkedMask` is that rule as a part a layer takes
(``mask_rule=``): a callable ``(q_positions, k_positions) -> [L_q, L_k]``
ANDed into the layer's mask.
Masks are boolean, True where a query may attend a key. A query whose
row of the mask is all False has nothing to attend: its output row is
zeros and it passes zero gradients to every input (not NaN); with a sink
logit (chapter 8) all its weight goes to the sink.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import check_count, check_positive_int, check_window

__all__ = [
    "ChunkedMask",
    "causal_mask",
    "check_window",
    "chunked_mask",
    "position_mask",
]


def causal_mask(L_q: int, L_k: int, *, window=None) -> np.ndarray:
    """Boolean ``[L_q, L_k]`` mask, True where query ``i`` may attend key
    ``j``.

    The last query aligns with the last key: query ``i`` sits at absolute
    position ``i + (L_k - L_q)`` and may attend every key up to and including
    that position. With ``L_q == L_k`` this is the usual lower triangle; with
    ``L_q < L_k`` (a chunk of new queries over a longer key/value cache)
    every query also sees the whole cache before the chunk. With
    ``window=W`` it sees only the last ``W`` of them, itself included.
    """
    L_q = check_count(L_q, "L_q", minimum=0)
    L_k = check_count(L_k, "L_k", minimum=0)
    window = check_window(window)
    offset = L_k - L_q
    # query positions [L_q] and key positions [L_k]
    return position_mask(
        np.arange(L_q) + offset, np.arange(L_k), window=window
    )


def position_mask(q_positions, k_positions, *, window=None, sink_tokens=0):
    """``[L_q, L_k]`` bool from absolute positions: may query i attend key
    j?

    Causal, ``j <= i``; with ``window=W`` also ``j > i - W`` (W keys,
    itself included: Hugging Face's ``sliding_window = W``,
    FlashAttention's ``window_size = (W - 1, 0)``). With ``sink_tokens=S``
    (StreamingLLM) positions ``j < S`` stay visible and the window keeps
    the last ``W - S`` keys, so a query still sees at most W keys.
    """
    window = check_window(window)
    sink_tokens = check_count(sink_tokens, "sink_tokens", minimum=0)
    if window is not None and sink_tokens >= window:
        raise ValueError(
            "sink_tokens must be smaller than window (the window holds "
            f"the sinks and the query itself), got sink_tokens="
            f"{sink_tokens} and window={window}"
        )
    i = _check_positions(q_positions, "q_positions")[:, None]  # [L_q, 1]
    j = _check_positions(k_positions, "k_positions")[None, :]  # [1, L_k]
    allowed = j <= i  # [L_q, L_k]
    if window is not None and i.size and j.size:
        # a window wider than every distance cuts nothing (and a Python
        # int such as 10**30 never meets int64 arithmetic)
        span = int(i.max()) - int(j.min()) + 1
        if window - sink_tokens <= span:
            sinks = min(sink_tokens, int(j.max()) + 1)
            allowed &= (j > i - (window - sink_tokens)) | (j < sinks)
    return allowed


def chunked_mask(q_positions, k_positions, chunk):
    """``[L_q, L_k]`` bool: query ``i`` sees key ``j`` iff ``j <= i`` and
    both lie in the same chunk, ``floor(i/C) == floor(j/C)``.

    Llama 4's local attention (``attention_chunk_size``). Not a sliding
    window: the first query of a chunk sees only itself, the last sees
    ``C`` keys, and no query sees across a chunk boundary.
    """
    chunk = check_positive_int(chunk, "chunk")
    i = _check_positions(q_positions, "q_positions")[:, None]  # [L_q, 1]
    j = _check_positions(k_positions, "k_positions")[None, :]  # [1, L_k]
    if i.size and j.size:
        # a chunk longer than every position is one chunk (and a Python
        # int such as 10**30 never meets int64 arithmetic)
        far = max(abs(int(i.min())), abs(int(i.max())))
        far = max(far, abs(int(j.min())), abs(int(j.max())))
        chunk = min(chunk, far + 1)
    return (j <= i) & (i // chunk == j // chunk)  # [L_q, L_k]


@dataclass(frozen=True)
class ChunkedMask:
    """:func:`chunked_mask` as a mask rule a layer takes (``mask_rule=``):
    called with the positions of its queries and keys."""

    chunk: int

    def __post_init__(self):
        check_positive_int(self.chunk, "chunk")

    def __call__(self, q_positions, k_positions):
        return chunked_mask(q_positions, k_positions, self.chunk)


def _check_positions(positions, name):
    """Integer positions ``[L]``, or raise naming ``name``."""
    p = np.asarray(positions)
    if (
        p.ndim != 1
        or p.dtype == np.bool_
        or not np.issubdtype(p.dtype, np.integer)
    ):
        raise ValueError(
            f"{name} must be a 1-D integer array of positions, got "
            f"{p.dtype} of shape {p.shape}"
        )
    if p.dtype.kind == "u":  # i - W on unsigned positions wraps round
        if p.size and int(p.max()) > np.iinfo(np.int64).max:
            raise ValueError(
                f"{name} must fit in int64, got a largest position of "
                f"{int(p.max())}"
            )
        p = p.astype(np.int64)
    return p
