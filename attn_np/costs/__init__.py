"""Cost models: what attention costs in parameters, FLOPs, bytes and time, as
formulas.

* :mod:`~attn_np.costs.layer`: parameters, training FLOPs and activation
  memory of one attention layer (chapters 2 and 3);
* :mod:`~attn_np.costs.decode`: FLOPs, bytes and arithmetic intensity of a
  prefill and a decode step, the roofline and Shazeer's ratio (chapter 4);
* :mod:`~attn_np.costs.latent`: the cache, FLOPs and bytes of multi-head
  latent attention, naive and absorbed (chapter 7);
* :mod:`~attn_np.costs.sparse`: the cache and decode FLOPs of DeepSeek
  Sparse Attention, its lightning indexer's keys (chapter 13);
* :mod:`~attn_np.costs.model`: :class:`ModelConfig`, the attention shapes
  of a model, and the size of its key/value cache (chapters 3, 4 and 7 to
  9);
* :mod:`~attn_np.costs.released`: the shapes of released models
  (``MODELS``, ``LATENT_MODELS``, ``WINDOW_MODELS``, ``CATALOGUE``);
* :mod:`~attn_np.costs.hf_config`: ``from_hf_config``, which reads them
  from a Hugging Face ``config.json`` (appendix A1).

Every name is also available here, so ``from attn_np import costs`` then
``costs.forward_flops``.
"""

from .decode import (
    ChunkCost,
    attainable_flops,
    chunk_cost,
    decode_step_cost,
    kv_read_tokens_per_second,
    prefill_cost,
    ridge_point,
    roofline_time,
    shazeer_ratio,
)
from .hf_config import from_hf_config, rope_parameters
from .latent import (
    latent_cache_elements,
    latent_chunk_cost,
    latent_decode_step_cost,
    latent_param_count,
)
from .layer import (
    activation_bytes,
    attention_weights_bytes,
    backward_flops,
    backward_flops_breakdown,
    forward_flops,
    forward_flops_breakdown,
    forward_retained_bytes,
    head_dims,
    matmul_flops,
    param_count,
    training_flops,
    weights_crossover_length,
)
from .model import (
    CATALOGUE,
    GB,
    GiB,
    Indexer,
    LinearState,
    ModelConfig,
    cache_bytes,
    cached_positions,
    get_model,
    indexer_cache_bytes,
    kv_bytes_per_token,
    kv_cache_bytes,
    max_concurrent_sequences,
    max_context,
    state_bytes,
    weight_bytes,
)
from .released import LATENT_MODELS, MODELS, WINDOW_MODELS
from .sparse import (
    dsa_cache_bytes_per_token,
    indexer_key_bytes,
    sparse_decode_step_flops,
)

__all__ = [
    "GB",
    "GiB",
    "MODELS",
    "CATALOGUE",
    "LATENT_MODELS",
    "WINDOW_MODELS",
    "ChunkCost",
    "Indexer",
    "LinearState",
    "ModelConfig",
    "activation_bytes",
    "attainable_flops",
    "attention_weights_bytes",
    "backward_flops",
    "backward_flops_breakdown",
    "cache_bytes",
    "cached_positions",
    "chunk_cost",
    "decode_step_cost",
    "dsa_cache_bytes_per_token",
    "forward_flops",
    "forward_flops_breakdown",
    "forward_retained_bytes",
    "from_hf_config",
    "get_model",
    "head_dims",
    "indexer_cache_bytes",
    "indexer_key_bytes",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_read_tokens_per_second",
    "latent_cache_elements",
    "latent_chunk_cost",
    "latent_decode_step_cost",
    "latent_param_count",
    "matmul_flops",
    "max_concurrent_sequences",
    "max_context",
    "param_count",
    "prefill_cost",
    "ridge_point",
    "rope_parameters",
    "roofline_time",
    "shazeer_ratio",
    "sparse_decode_step_flops",
    "state_bytes",
    "training_flops",
    "weight_bytes",
    "weights_crossover_length",
]
