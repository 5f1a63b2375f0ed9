"""What multi-head latent attention costs: cache, FLOPs, bytes (chapter 7).

The shapes are those of :class:`attn_np.MultiHeadLatentAttention`:
``d`` (``d_model``), ``h`` heads of ``d_h`` (``d_head``) for queries and
keys and ``d_v`` (``d_head_v``) for values, the latent ``d_c``
(``d_latent_kv``), the rotary part ``d_R`` (``d_rope``) and, with query
compression, the query latent ``d_cq`` (``d_latent_q``).

Cache per token per layer, in numbers:

* the latent cache: ``d_c + d_R`` (``c_KV`` and the shared ``k_R``);
* the same keys and values *decompressed*: ``h (d_h + d_R + d_v)``, every
  head's key ``[k_C,i ; k_R]`` and value. More than multi-head attention
  with the same heads, ``2 h d_h``, because ``k_R`` is copied per head.

A chunk of ``L_q`` new positions per sequence over ``n`` cached ones
(``L_k = n + L_q`` keys) takes one of the layer's two paths:

* naive (``absorb=False``): rebuild ``k_C`` and ``v`` of all ``L_k``
  positions, ``2 B L_k d_c h (d_h + d_v)`` FLOPs, then score
  ``d_h + d_R`` wide and sum ``d_v`` wide values per head;
* absorbed (``absorb=True``): move each query into the latent space,
  ``2 B L_q h d_h d_c``, score ``d_c + d_R`` wide and sum ``d_c`` wide
  latents per head, then ``W_uv``: ``2 B L_q h d_c d_v``.

The rebuilding is paid per *key*, the absorption per *query*: for a
decode step (``L_q = 1``) absorbing wins by far, for a long prompt
(``L_q = L_k``) the wider scores make it lose. FLOPs count matrix
products, ``2 m n k`` for ``[m, k] @ [k, n]``; bytes count what crosses
the memory bus at least once, as :mod:`attn_np.costs.decode` does.
"""

from __future__ import annotations

from .._checks import check_count, check_latent_dims
from .decode import ChunkCost, check_flag


def latent_cache_elements(
    n_heads,
    d_head,
    d_latent_kv,
    d_rope,
    d_head_v=None,
    *,
    decompressed=False,
) -> int:
    """Numbers cached per token per layer: ``d_c + d_R``.

    ``decompressed=True``: ``h (d_h + d_R + d_v)``, every head's key and
    value rebuilt from the latent and kept (the pitfall).
    """
    _, h, d_h, d_c, d_r, _, d_v = check_latent_dims(
        1, n_heads, d_head, d_latent_kv, d_rope, None, d_head_v
    )
    if decompressed:
        return h * (d_h + d_r + d_v)
    return d_c + d_r


def latent_param_count(
    d_model,
    n_heads,
    d_head,
    d_latent_kv,
    d_rope,
    d_latent_q=None,
    d_head_v=None,
) -> int:
    """Weights of the layer (no biases, no RMSNorm gains)."""
    d, h, d_h, d_c, d_r, d_cq, d_v = check_latent_dims(
        d_model, n_heads, d_head, d_latent_kv, d_rope, d_latent_q, d_head_v
    )
    if d_cq is None:
        query = d * h * (d_h + d_r)  # W_q, W_qr
    else:
        query = d * d_cq + d_cq * h * (d_h + d_r)  # W_dq, W_uq, W_qr
    kv = d * (d_c + d_r) + d_c * h * (d_h + d_v)  # W_dkv, W_kr, W_uk, W_uv
    return query + kv + h * d_v * d  # + W_o


def latent_chunk_cost(
    B,
    L_q,
    n_cached,
    d_model,
    n_heads,
    d_head,
    d_latent_kv,
    d_rope,
    d_latent_q=None,
    d_head_v=None,
    *,
    absorb,
    bytes_per_element=4,
    fused=False,
) -> ChunkCost:
    """FLOPs and bytes of ``L_q`` new positions over ``n_cached`` cached.

    ``absorb`` picks the layer's path. ``fused=True`` leaves out the
    scores written and read back (a fused kernel keeps them on chip).
    """
    B = check_count(B, "B")
    L_q = check_count(L_q, "L_q")
    n = check_count(n_cached, "n_cached", minimum=0)
    e = check_count(bytes_per_element, "bytes_per_element")
    absorb = check_flag(absorb, "absorb")
    fused = check_flag(fused, "fused")
    dims = (
        d_model,
        n_heads,
        d_head,
        d_latent_kv,
        d_rope,
        d_latent_q,
        d_head_v,
    )
    d, h, d_h, d_c, d_r, d_cq, d_v = check_latent_dims(*dims)
    N, L_k = B * L_q, n + L_q  # new positions, keys attended
    if d_cq is None:
        query = 2 * N * d * h * (d_h + d_r)  # x @ [W_q, W_qr]
    else:  # x @ W_dq, then c_Q @ [W_uq, W_qr]
        query = 2 * N * d * d_cq + 2 * N * d_cq * h * (d_h + d_r)
    flops = {
        "query projections": query,
        "c_KV and k_R projections": 2 * N * d * (d_c + d_r),
    }
    if absorb:
        flops["absorb W_uk: q_C W_uk^T"] = 2 * N * h * d_h * d_c
        flops["scores over [c_KV ; k_R]"] = (
            2 * B * h * L_q * L_k * (d_c + d_r)
        )
        flops["weights @ c_KV"] = 2 * B * h * L_q * L_k * d_c
        flops["absorb W_uv: o_lat W_uv"] = 2 * N * h * d_c * d_v
    else:
        flops["rebuild k_C and v"] = 2 * B * L_k * d_c * h * (d_h + d_v)
        flops["scores Q K^T"] = 2 * B * h * L_q * L_k * (d_h + d_r)
        flops["weights @ V"] = 2 * B * h * L_q * L_k * d_v
    flops["output projection"] = 2 * N * h * d_v * d
    nbytes = {
        "weights": e * latent_param_count(*dims),
        "latent cache read": e * B * L_k * (d_c + d_r),
        "new latents written": e * N * (d_c + d_r),
        "x read, y written": e * 2 * N * d,
    }
    if absorb:  # [q_C W_uk^T ; q_R], latent outputs, head outputs
        per_head = (d_c + d_r) + d_c + d_v
    else:  # every head's key [k_C ; k_R] and value, written and read
        nbytes["rebuilt keys and values"] = (
            e * 2 * B * L_k * h * (d_h + d_r + d_v)
        )
        per_head = (d_h + d_r) + d_v  # queries, head outputs
    nbytes["queries and head outputs"] = e * 2 * N * h * per_head
    nbytes["scores [B, h, L_q, L_k]"] = (
        0 if fused else e * 2 * B * h * L_q * L_k
    )
    return ChunkCost(flops, nbytes)


def latent_decode_step_cost(
    B,
    n_cached,
    d_model,
    n_heads,
    d_head,
    d_latent_kv,
    d_rope,
    d_latent_q=None,
    d_head_v=None,
    *,
    absorb,
    bytes_per_element=4,
    fused=False,
) -> ChunkCost:
    """One decode step: one new position per sequence over ``n_cached``."""
    return latent_chunk_cost(
        B,
        1,
        n_cached,
        d_model,
        n_heads,
        d_head,
        d_latent_kv,
        d_rope,
        d_latent_q,
        d_head_v,
        absorb=absorb,
        bytes_per_element=bytes_per_element,
        fused=fused,
    )
