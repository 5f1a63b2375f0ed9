"""Turn a multi-head attention layer into a grouped-query one (chapter 3).

Ainslie et al. (2023) convert a trained multi-head checkpoint by
*mean-pooling* the key and value projection heads of each group, then train a
little more ("uptraining"); they found pooling better than keeping one head
per group or starting the new heads from scratch. Queries and the output
projection are untouched: only the number of key/value heads changes.

The layer comes back of its own kind with every part it holds (its
``options``: RoPE and its scaling, window, sinks, mask rule, score mods,
scale, and a refined layer's biases, norms and gate), so that with as many
key/value heads as before the outputs are the same.
"""

from __future__ import annotations

import numpy as np

from ._checks import check_positive_int
from .multihead import (
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiQueryAttention,
)

METHODS = ("mean", "first")


def mha_to_gqa(
    mha, n_kv_heads, method: str = "mean"
) -> GroupedQueryAttention:
    """A layer like ``mha`` with ``n_kv_heads`` key/value heads made from
    ``mha``'s.

    ``mha`` is a :class:`~attn_np.MultiHeadAttention` (or any grouped-query
    layer whose number of key/value heads ``n_kv_heads`` divides). Its ``r =
    mha.n_kv_heads // n_kv_heads`` consecutive key/value heads ``g*r ... g*r
    + r - 1`` become head ``g``: their mean (``method="mean"``, Ainslie et
    al. 2023) or the first of them (``method="first"``). Query head ``i``
    read head ``i // G_old`` before and reads ``i // G_new = (i // G_old) //
    r`` after, so every query head is served by the pool of the heads it used
    to read. The parameters with a key/value head axis
    (:attr:`~GroupedQueryAttention.kv_params`: ``W_k``, ``W_v``, their
    biases, a whole-projection key norm) are pooled; every other one
    (``W_q``, ``W_o``, sinks, gates, query norms) is copied unchanged, and
    every option of the layer (:attr:`~GroupedQueryAttention.options`)
    carries over. A multi-head or multi-query layer becomes a
    :class:`GroupedQueryAttention`; any other layer stays of its kind,
    and a kind that does not say how to rebuild itself from its options
    is refused.
    """
    kind = _kind(mha)
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
    # with the rotation; its window, sinks, parts and kernels)
    gqa = kind(mha.d_model, mha.n_heads, n_kv_heads, **mha.options)
    pooled = set(mha.kv_params)
    for name in gqa.params.keys() - pooled:  # per query head: unchanged
        gqa.params[name] = mha.params[name].copy()
    for name in pooled:
        # [..., n_kv_old * d] -> [..., n_kv, r, d]
        w = mha.params[name]
        w = w.reshape(*w.shape[:-1], n_kv_heads, r, w.shape[-1] // old)
        # -> [..., n_kv, d]
        w = w.mean(axis=-2) if method == "mean" else w[..., 0, :]
        # -> [..., n_kv * d]
        gqa.params[name] = w.reshape(gqa.params[name].shape).astype(
            mha.params[name].dtype
        )
    gqa.grads = {k: np.zeros_like(v) for k, v in gqa.params.items()}
    return gqa


def _kind(layer):
    """The class that rebuilds ``layer`` as ``kind(d_model, n_heads,
    n_kv_heads, **layer.options)``, or a ``ValueError``."""
    if not isinstance(layer, GroupedQueryAttention):
        raise ValueError(
            "mha must be a MultiHeadAttention (a GroupedQueryAttention), "
            f"got {type(layer).__name__}"
        )
    cls = type(layer)
    if cls in (MultiHeadAttention, MultiQueryAttention):
        return GroupedQueryAttention
    if not cls.__dict__.get("rebuilds_from_options", False):
        raise ValueError(
            f"mha_to_gqa cannot convert a {cls.__name__}: it does not say "
            "how to rebuild it from its options (set "
            "rebuilds_from_options = True in the class when "
            f"{cls.__name__}(d_model, n_heads, n_kv_heads, **options) "
            "does), so its own steps and parameters would be lost"
        )
    return cls
