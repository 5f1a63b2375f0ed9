"""What DeepSeek Sparse Attention costs: cache and FLOPs (chapter 13).

The shapes are those of :class:`attn_np.sparse.SparseLatentAttention`:
MLA's latent ``d_c`` (``d_latent_kv``) and rotary part ``d_R``
(``d_rope``), ``h`` heads, and the lightning indexer's ``H_I`` heads
(``index_n_heads``) of ``d_I`` features (``index_head_dim``) keeping the
top ``k`` (``index_topk``) cached tokens.

* the cache per token per layer: the latent row ``d_c + d_R`` beside one
  indexer key, ``d_I`` FP8 numbers and a float32 scale per 128 of them,
  as released (:func:`indexer_key_bytes`,
  :func:`dsa_cache_bytes_per_token`);
* a decode step's work that grows with the context: the indexer scores
  every cached token, the attention reads only ``k`` of them
  (:func:`sparse_decode_step_flops`).
"""

from __future__ import annotations

from .._checks import check_count


def indexer_key_bytes(
    index_head_dim, *, key_bytes=1, scale_bytes=4, scale_block=128
):
    """Bytes of one token's indexer key: FP8 numbers (``key_bytes = 1``)
    plus one float32 scale per ``scale_block`` of them, as released."""
    d = check_count(index_head_dim, "index_head_dim")
    blocks = -(-d // check_count(scale_block, "scale_block"))
    key_bytes = check_count(key_bytes, "key_bytes")
    scale_bytes = check_count(scale_bytes, "scale_bytes", minimum=0)
    return d * key_bytes + blocks * scale_bytes


def dsa_cache_bytes_per_token(
    d_latent_kv,
    d_rope,
    index_head_dim,
    *,
    n_layers=1,
    latent_bytes=2,
    key_bytes=1,
    scale_bytes=4,
    scale_block=128,
):
    """``{"latent": ..., "indexer": ...}``: bytes per token, all layers.

    The latent row ``d_c + d_R`` at ``latent_bytes`` (bfloat16: 2) and
    the indexer key (:func:`indexer_key_bytes`), per layer times
    ``n_layers``.
    """
    d_c = check_count(d_latent_kv, "d_latent_kv")
    d_r = check_count(d_rope, "d_rope", minimum=0)
    n_layers = check_count(n_layers, "n_layers")
    latent = (d_c + d_r) * check_count(latent_bytes, "latent_bytes")
    index = indexer_key_bytes(
        index_head_dim,
        key_bytes=key_bytes,
        scale_bytes=scale_bytes,
        scale_block=scale_block,
    )
    return {"latent": n_layers * latent, "indexer": n_layers * index}


def sparse_decode_step_flops(
    n_cached,
    n_heads,
    d_latent_kv,
    d_rope,
    *,
    index_n_heads,
    index_head_dim,
    index_topk,
):
    """FLOPs of one decode step that grow with the context, per layer.

    ``{"indexer": 2 L_k H_I d_I, "attention": 2 h k' (2 d_c + d_R)}``
    with ``L_k = n_cached + 1`` and ``k' = min(k, L_k)``; dense MLA's
    absorbed attention is the same with ``k' = L_k``. (The projections,
    the same for both, are left out.)
    """
    L_k = check_count(n_cached, "n_cached", minimum=0) + 1
    k = min(check_count(index_topk, "index_topk"), L_k)
    h = check_count(n_heads, "n_heads")
    d_c = check_count(d_latent_kv, "d_latent_kv")
    d_r = check_count(d_rope, "d_rope", minimum=0)
    H_I = check_count(index_n_heads, "index_n_heads")
    d_I = check_count(index_head_dim, "index_head_dim")
    per_row = 2 * h * (2 * d_c + d_r)
    return {
        "indexer": 2 * L_k * H_I * d_I,
        "attention": k * per_row,
    }
