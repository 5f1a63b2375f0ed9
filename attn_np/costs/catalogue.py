"""The catalogue's old home, kept so that ``attn_np.costs.catalogue.X``
still works.

It was one module of three parts, now one module each:

* :mod:`~attn_np.costs.model`: :class:`ModelConfig` and the cache formulas
  (``kv_bytes_per_token``, ``kv_cache_bytes``, ``max_context``, ...);
* :mod:`~attn_np.costs.released`: the released models (``MODELS``,
  ``LATENT_MODELS``, ``WINDOW_MODELS``, ``CATALOGUE``);
* :mod:`~attn_np.costs.hf_config`: ``from_hf_config``, the reader of a
  Hugging Face ``config.json``.
"""

from .hf_config import from_hf_config
from .model import (
    CATALOGUE,
    FULL,
    GB,
    SLIDING,
    GiB,
    ModelConfig,
    cached_positions,
    get_model,
    kv_bytes_per_token,
    kv_cache_bytes,
    max_concurrent_sequences,
    max_context,
    weight_bytes,
)
from .released import LATENT_MODELS, MODELS, WINDOW_MODELS

__all__ = [
    "CATALOGUE",
    "FULL",
    "GB",
    "LATENT_MODELS",
    "MODELS",
    "SLIDING",
    "WINDOW_MODELS",
    "GiB",
    "ModelConfig",
    "cached_positions",
    "from_hf_config",
    "get_model",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "max_concurrent_sequences",
    "max_context",
    "weight_bytes",
]
