"""Cost models: what attention costs in parameters, FLOPs, bytes and time, as
formulas.

* :mod:`~attn_np.costs.layer`: parameters, training FLOPs and activation
  memory of one attention layer (chapters 2 and 3);
* :mod:`~attn_np.costs.decode`: FLOPs, bytes and arithmetic intensity of a
  prefill and a decode step, the roofline and Shazeer's ratio (chapter 4);
* :mod:`~attn_np.costs.catalogue`: the attention shapes of released models
  and the size of their key/value caches (chapters 3, 4 and 7 to 9).

Every name is also available here, so ``from attn_np import costs`` then
``costs.forward_flops``.
"""

from .catalogue import (
    GB,
    MODELS,
    GiB,
    ModelConfig,
    get_model,
    kv_bytes_per_token,
    kv_cache_bytes,
    max_concurrent_sequences,
    weight_bytes,
)
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

__all__ = [
    "GB",
    "GiB",
    "MODELS",
    "ChunkCost",
    "ModelConfig",
    "activation_bytes",
    "attainable_flops",
    "attention_weights_bytes",
    "backward_flops",
    "backward_flops_breakdown",
    "chunk_cost",
    "decode_step_cost",
    "forward_flops",
    "forward_flops_breakdown",
    "forward_retained_bytes",
    "get_model",
    "head_dims",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_read_tokens_per_second",
    "matmul_flops",
    "max_concurrent_sequences",
    "param_count",
    "prefill_cost",
    "ridge_point",
    "roofline_time",
    "shazeer_ratio",
    "training_flops",
    "weight_bytes",
    "weights_crossover_length",
]
