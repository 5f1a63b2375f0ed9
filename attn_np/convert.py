"""Turn a multi-head attention layer into a grouped-query one (chapter 3).

Ainslie et al. (2023) convert a trained multi-head checkpoint by
*mean-pooling* the key and value projection heads of each group, then train a
little more ("uptraining"); they found pooling better than keeping one head
per group or starting the new heads from scratch. Queries and the output
projection are untouched: only the number of key/value heads changes.
"""

from __future__ import annotations

from ._checks import check_positive_int
from .multihead import GroupedQueryAttention

METHODS = ("mean", "first")


def mha_to_gqa(
    mha, n_kv_heads, method: str = "mean"
) -> GroupedQueryAttention:
    """A :class:`GroupedQueryAttention` with ``n_kv_heads`` key/value heads
    made from ``mha``'s.

    ``mha`` is a :class:`~attn_np.MultiHeadAttention` (or any grouped-query
    layer whose number of key/value heads ``n_kv_heads`` divides). Its ``r =
    mha.n_kv_heads // n_kv_heads`` consecutive key/value heads ``g*r ... g*r
    + r - 1`` become head ``g``: their mean (``method="mean"``, Ainslie et
    al. 2023) or the first of them (``method="first"``). Query head ``i``
    read head ``i // G_old`` before and reads ``i // G_new = (i // G_old) //
    r`` after, so every query head is served by the pool of the heads it used
    to read. ``W_q``, ``W_o`` and the sink logits are copied unchanged, and
    every option of the layer (:attr:`~GroupedQueryAttention.options`:
    RoPE, ``window``, ``sinks``, ``flash``) carries over.
    """
    if not isinstance(mha, GroupedQueryAttention):
        raise ValueError(
            "mha must be a MultiHeadAttention (a GroupedQueryAttention), "
            f"got {type(mha).__name__}"
        )
    n_kv_heads = check_positive_int(n_kv_heads, "n_kv_heads")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    old = mha.n_kv_heads
    if old % n_kv_heads:
        raise ValueError(
            f"n_kv_heads must divide the layer's {old} key/value heads "
            f"(n_heads={mha.n_heads}) "
            "so that each new head pools a whole group of old ones, got "
            f"n_kv_heads={n_kv_heads}"
        )
    r = old // n_kv_heads  # old key/value heads pooled into each new one
    # every option of the layer carries over (its RoPE: pooling commutes
    # with the rotation; its window, sinks and kernels)
    gqa = GroupedQueryAttention(
        mha.d_model, mha.n_heads, n_kv_heads, **mha.options
    )
    # W_q [d_model, h*d_k], W_o [h*d_v, d_model] and the sinks [h]: per
    # query head, unchanged
    for name in gqa.params.keys() - {"W_k", "W_v"}:
        gqa.params[name] = mha.params[name].copy()
    d_model = mha.d_model
    for name, d_head in (("W_k", mha.d_k), ("W_v", mha.d_v)):
        # -> [d_model, n_kv, r, d_head]
        w = mha.params[name].reshape(d_model, n_kv_heads, r, d_head)
        # -> [d_model, n_kv, d_head]
        pooled = w.mean(axis=2) if method == "mean" else w[:, :, 0]
        # -> [d_model, n_kv*d_head]
        pooled = pooled.reshape(d_model, n_kv_heads * d_head)
        gqa.params[name] = pooled.astype(mha.dtype)
    return gqa
