"""Which keys may a query attend? Masks from positions (chapters 1 and 8).

Every causal rule in the library is :func:`position_mask`: the chapter-1
causal mask, chapter 8's sliding window and StreamingLLM's sink tokens,
the decode step over a cache and the tiles of FlashAttention all ask it.
Llama 4's chunked attention (chapter 11) is :func:`chunked_mask`, and
:class:`ChunkedMask` is that rule as a part a layer takes
(``mask_rule=``): a callable ``(q_positions, k_positions) -> [L_q, L_k]``
ANDed into the layer's mask.
Chapter 16 writes masks as functions, as PyTorch's FlexAttention does: a
``mask_mod(b, h, q_idx, kv_idx) -> bool`` per rule (causal, window, chunk,
sinks, padding, prefix-LM, packed documents, image blocks, a
bidirectional window, a drafted tree), composed with
:func:`and_masks` and :func:`or_masks` and evaluated on the grid by
:func:`create_mask`; an attention call takes one where it takes a mask.
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
    "and_masks",
    "causal_mask",
    "causal_mod",
    "check_window",
    "chunk_mod",
    "chunked_mask",
    "create_mask",
    "document_ids",
    "document_mod",
    "document_positions",
    "evaluate_mask",
    "image_block_ids",
    "image_block_mod",
    "mask_for",
    "or_masks",
    "padding_mod",
    "position_mask",
    "prefix_mod",
    "sink_mod",
    "symmetric_window_mod",
    "tree_ancestors",
    "tree_depths",
    "tree_mod",
    "window_mod",
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


# ------------------------------------------------------ masks as functions
# A mask function answers one question for every (batch, head, query, key):
# may this query attend this key? It is written for single indices and run
# on broadcast index arrays, as PyTorch's FlexAttention runs its mask_mod:
#     mask_mod(b, h, q_idx, kv_idx) -> bool
# q_idx and kv_idx are absolute positions, the last query aligned with the
# last key (the book's causal convention), so the same causal function
# serves a prefill and a decode step over a cache.


def create_mask(mask_mod, B, H, L_q, L_k) -> np.ndarray:
    """``mask_mod`` evaluated on the grid: bool ``[B, H, L_q, L_k]``.

    ``mask_mod(b, h, q_idx, kv_idx)`` gets index arrays that broadcast to
    ``[B, H, L_q, L_k]`` (``b [B, 1, 1, 1]`` ... ``kv_idx [1, 1, 1, L_k]``);
    query ``i`` sits at position ``i + L_k - L_q``. It must return booleans
    of that shape, or of one that broadcasts to it.
    """
    out = evaluate_mask(mask_mod, B, H, L_q, L_k)
    return np.broadcast_to(out, (B, H, L_q, L_k)).copy()


def evaluate_mask(mask_mod, B, H, L_q, L_k) -> np.ndarray:
    """What ``mask_mod`` returns on :func:`create_mask`'s index arrays,
    checked (booleans that broadcast to ``[B, H, L_q, L_k]``) but not
    broadcast: a function that never reads ``b`` or ``h`` answers with
    leading axes of 1, one mask for every batch row and head."""
    if not callable(mask_mod):
        raise TypeError(
            f"mask_mod must be a function (b, h, q_idx, kv_idx) -> bool, "
            f"got {type(mask_mod).__name__}"
        )
    B, H = check_positive_int(B, "B"), check_positive_int(H, "H")
    L_q = check_count(L_q, "L_q", minimum=0)
    L_k = check_count(L_k, "L_k", minimum=0)
    b = np.arange(B)[:, None, None, None]  # [B, 1, 1, 1]
    h = np.arange(H)[None, :, None, None]  # [1, H, 1, 1]
    q_idx = (np.arange(L_q) + (L_k - L_q))[None, None, :, None]
    kv_idx = np.arange(L_k)[None, None, None, :]  # [1, 1, 1, L_k]
    out = np.asarray(mask_mod(b, h, q_idx, kv_idx))
    if out.dtype != np.bool_:
        raise ValueError(
            f"mask_mod must return booleans (True: may attend), got "
            f"{out.dtype}"
        )
    shape = (B, H, L_q, L_k)
    try:
        fits = np.broadcast_shapes(out.shape, shape) == shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"mask_mod returned shape {out.shape}, which does not "
            f"broadcast to [B, H, L_q, L_k] = {list(shape)}"
        )
    return out


def mask_for(mask_mod, q_shape, L_k) -> np.ndarray:
    """A mask function as the array an attention call over ``q [...,
    L_q, d]`` (at most ``[B, H, L_q, d]``) takes: ``[..., L_q, L_k]``."""
    lead = tuple(q_shape[:-2])
    if len(lead) > 2:
        raise ValueError(
            "a mask function needs q of at most 4 axes [B, H, L_q, d], "
            f"got q of shape {tuple(q_shape)}"
        )
    B = lead[0] if len(lead) == 2 else 1
    H = lead[-1] if lead else 1
    m = create_mask(mask_mod, B, H, q_shape[-2], L_k)
    return m.reshape(lead + m.shape[2:])


def and_masks(*mask_mods):
    """A mask function true where every one of ``mask_mods`` is."""
    mods = _mods(mask_mods, "and_masks")

    def mask_mod(b, h, q_idx, kv_idx):
        out = np.asarray(True)
        for m in mods:
            out = out & _bool(m(b, h, q_idx, kv_idx), m)
        return out

    return mask_mod


def or_masks(*mask_mods):
    """A mask function true where any one of ``mask_mods`` is."""
    mods = _mods(mask_mods, "or_masks")

    def mask_mod(b, h, q_idx, kv_idx):
        out = np.asarray(False)
        for m in mods:
            out = out | _bool(m(b, h, q_idx, kv_idx), m)
        return out

    return mask_mod


def causal_mod(b, h, q_idx, kv_idx):
    """Causal: a query attends its own position and the ones before."""
    return kv_idx <= q_idx


def window_mod(window):
    """A sliding window of ``window`` keys, the query itself included (ANDed
    with :func:`causal_mod`, chapter 8's window)."""
    W = check_positive_int(window, "window")

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx > q_idx - W

    return mask_mod


def chunk_mod(chunk):
    """Llama 4's chunks: query and key in the same chunk of ``chunk``
    positions (ANDed with :func:`causal_mod`, it is :func:`chunked_mask`)."""
    C = check_positive_int(chunk, "chunk")

    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx // C == kv_idx // C

    return mask_mod


def sink_mod(sink_tokens):
    """StreamingLLM's sinks: the first ``sink_tokens`` positions, ORed into a
    window so that every query keeps them."""
    S = check_positive_int(sink_tokens, "sink_tokens")

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx < S

    return mask_mod


def padding_mod(lengths):
    """Padded batch: sequence ``b`` has ``lengths[b]`` real tokens, keys
    past them are padding."""
    n = _check_positions(np.asarray(lengths), "lengths")
    if (n < 0).any():
        raise ValueError(f"lengths must be non-negative, got {n.tolist()}")

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx < n[b]

    return mask_mod


def prefix_mod(prefix_length):
    """Prefix-LM: the first ``prefix_length`` positions are seen by every
    query (ORed with :func:`causal_mod`, the prefix is bidirectional)."""
    P = check_count(prefix_length, "prefix_length", minimum=0)

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx < P

    return mask_mod


def symmetric_window_mod(window):
    """A bidirectional window: keys fewer than ``window`` positions away
    on either side, ``|i - j| < W`` (EmbeddingGemma's sliding layers with
    ``use_bidirectional_attention``, Schechter Vera et al. 2025)."""
    W = check_positive_int(window, "window")

    def mask_mod(b, h, q_idx, kv_idx):
        return np.abs(q_idx - kv_idx) < W

    return mask_mod


def image_block_ids(token_type_ids) -> np.ndarray:
    """``[B, L]`` ints from ``token_type_ids [B, L]`` (1: an image token,
    0: text): each run of image tokens numbered ``0, 1, ...`` along its
    row, text ``-1`` (Gemma 3's blocks)."""
    t = np.asarray(token_type_ids)
    if t.ndim != 2 or not np.issubdtype(t.dtype, np.integer):
        raise ValueError(
            "token_type_ids must be [B, L] ints (1: image, 0: text), got "
            f"{t.dtype} of shape {t.shape}"
        )
    image = t == 1
    before = np.pad(image, ((0, 0), (1, 0)))[:, :-1]  # the token before
    starts = image & ~before  # [B, L]: where a run of image tokens starts
    return np.where(image, np.cumsum(starts, axis=1) - 1, -1)


def image_block_mod(token_type_ids):
    """Gemma 3's image tokens (Gemma Team 2025): a query sees every key of
    its own run of image tokens, before or after it. ORed with
    :func:`causal_mod`, text is causal and each image is bidirectional."""
    ids = image_block_ids(token_type_ids)  # [B, L]

    def mask_mod(b, h, q_idx, kv_idx):
        if (
            max(q_idx.max(initial=-1), kv_idx.max(initial=-1))
            >= ids.shape[1]
        ):
            raise ValueError(
                f"image_block_mod covers {ids.shape[1]} tokens, the "
                "attention call has more"
            )
        q_block, kv_block = ids[b, q_idx], ids[b, kv_idx]
        return (q_block == kv_block) & (q_block >= 0)

    return mask_mod


def document_ids(cu_seqlens) -> np.ndarray:
    """The document of each token of a packed row: ``cu_seqlens = [0, n_1,
    n_1 + n_2, ..., L]`` (FlashAttention's offsets) -> ``[L]`` ints."""
    cu = _check_offsets(cu_seqlens)
    return np.repeat(np.arange(cu.size - 1), np.diff(cu))  # [L]


def document_positions(cu_seqlens) -> np.ndarray:
    """Each token's position inside its own document (RoPE restarts at 0
    for every document of a packed row): ``[L]`` ints."""
    cu = _check_offsets(cu_seqlens)
    ids = np.repeat(np.arange(cu.size - 1), np.diff(cu))
    return np.arange(cu[-1]) - cu[:-1][ids]  # [L]


def document_mod(cu_seqlens):
    """Packed documents: a query attends only keys of its own document
    (AND it with :func:`causal_mod` for causal documents)."""
    ids = document_ids(cu_seqlens)

    def mask_mod(b, h, q_idx, kv_idx):
        if (
            q_idx.max(initial=-1) >= ids.size
            or kv_idx.max(initial=-1) >= ids.size
        ):
            raise ValueError(
                f"document_mod covers {ids.size} tokens (cu_seqlens ends "
                f"at {ids.size}), the attention call has more"
            )
        return ids[q_idx] == ids[kv_idx]

    return mask_mod


def check_parents(parents) -> np.ndarray:
    """A tree given by parent indices: ``[N]`` ints, ``parents[i]`` an
    earlier node (``0 <= parents[i] < i``) or ``-1`` for a root."""
    p = np.asarray(parents)
    if p.ndim != 1 or (p.size and not np.issubdtype(p.dtype, np.integer)):
        raise ValueError(
            f"parents must be [N] ints (node i's parent index, -1 for a "
            f"root), got {p.dtype} of shape {p.shape}"
        )
    bad = np.flatnonzero((p < -1) | (p >= np.arange(p.size)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"parents[{i}] must be an earlier node (0 ... {i - 1}) or -1 "
            f"(a root), got {int(p[i])}: a tree lists a parent before "
            "its children"
        )
    return p.astype(np.int64)


def tree_ancestors(parents) -> np.ndarray:
    """``[N, N]`` bool for a tree of ``N`` nodes given by parent indices:
    ``[i, j]`` True where node ``j`` is node ``i`` or one of its
    ancestors."""
    p = check_parents(parents)
    anc = np.eye(p.size, dtype=bool)  # [N, N]
    for i in range(p.size):  # parents come first: their rows are done
        if p[i] >= 0:
            anc[i] |= anc[p[i]]
    return anc


def tree_depths(parents) -> np.ndarray:
    """``[N]`` ints: each node's depth (0 for a root)."""
    return tree_ancestors(parents).sum(axis=1) - 1  # ancestors, not self


def tree_mod(parents, start=0):
    """A drafted tree of ``N`` nodes (parent indices) at positions
    ``start ... start + N - 1`` after ``start`` cached ones: a node sees
    every cached key, its ancestors and itself, never a sibling's branch
    (Medusa's tree mask, Cai et al. 2024)."""
    anc = tree_ancestors(parents)  # [N, N]
    s = check_count(start, "start", minimum=0)
    N = anc.shape[0]

    def mask_mod(b, h, q_idx, kv_idx):
        i, j = q_idx - s, kv_idx - s  # indices in the tree (j < 0: cached)
        if (
            i.min(initial=0) < 0
            or max(i.max(initial=-1), j.max(initial=-1)) >= N
        ):
            raise ValueError(
                f"tree_mod covers {s} cached positions and {N} nodes, "
                "the attention call has other queries or more keys"
            )
        inside = anc[np.clip(i, 0, None), np.clip(j, 0, None)]
        return (j < 0) | inside

    return mask_mod


def _check_offsets(cu_seqlens):
    cu = _check_positions(np.asarray(cu_seqlens), "cu_seqlens")
    if cu.size < 2 or cu[0] != 0 or (np.diff(cu) <= 0).any():
        raise ValueError(
            "cu_seqlens must start at 0 and increase strictly (one offset "
            f"per document boundary, the row's length last), got "
            f"{cu.tolist()[:12]}"
        )
    return cu


def _mods(mask_mods, name):
    if not mask_mods:
        raise ValueError(f"{name} needs at least one mask function")
    for m in mask_mods:
        if not callable(m):
            raise TypeError(
                f"{name} takes mask functions, got {type(m).__name__}"
            )
    return mask_mods


def _bool(out, mod):
    out = np.asarray(out)
    if out.dtype != np.bool_:
        name = getattr(mod, "__name__", type(mod).__name__)
        raise ValueError(
            f"mask function {name} must return booleans, got {out.dtype}"
        )
    return out
