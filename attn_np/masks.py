"""Which keys may a query attend? Masks from positions (chapters 1 and 8).

Every causal rule in the library is :func:`position_mask`: the chapter-1
causal mask, chapter 8's sliding window and StreamingLLM's sink tokens,
the decode step over a cache and the tiles of FlashAttention all ask it.
Masks are boolean, True where a query may attend a key.
"""

from __future__ import annotations

import numpy as np

from ._checks import check_window

__all__ = ["causal_mask", "check_window", "position_mask"]


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
    i = np.asarray(q_positions)[:, None]  # [L_q, 1]
    j = np.asarray(k_positions)[None, :]  # [1, L_k]
    allowed = j <= i  # [L_q, L_k]
    if window is not None:
        allowed &= (j > i - (window - sink_tokens)) | (j < sink_tokens)
    return allowed
