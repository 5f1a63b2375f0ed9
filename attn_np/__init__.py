"""attn_np: attention in transformers, in NumPy, with hand-written
backpropagation.

The library behind the book *Learning Attention*. Every forward function has
a backward twin (``thing_forward(...) -> (out, cache)``,
``thing_backward(dout, cache) -> grads``); layer classes are thin shells over
them with ``params`` and ``grads`` dicts that share their keys.

The attention mechanisms sit at the top, one module per idea, in the order of
the chapters:

==  ===================================  ===================================
ch  chapter                              modules
==  ===================================  ===================================
1   scaled dot-product attention         :mod:`.softmax`, :mod:`.attention`
2   multi-head attention                 :mod:`.multihead`,
                                         :mod:`.costs.layer`
3   multi-query and grouped-query        :mod:`.multihead`, :mod:`.convert`,
    attention                            :mod:`.costs.model`
4   incremental decoding, KV cache       :mod:`.kv_cache`,
                                         :mod:`.costs.decode`, :mod:`.bench`
5   training MHA, GQA and MQA            :mod:`.training`
6   rotary position embeddings           :mod:`.rope`
7   multi-head latent attention          :mod:`.latent`,
                                         :mod:`.costs.latent`
8   sliding windows, rolling caches,     :mod:`.attention`, :mod:`.kv_cache`,
    attention sinks                      :mod:`.streaming`
9   FlashAttention                       :mod:`.flash`
A1  the KV cache of any model config     :mod:`.costs.hf_config`,
                                         :mod:`.memory`
==  ===================================  ===================================

Three supporting subpackages: :mod:`.training` (the chapter-5 kit),
:mod:`.costs` (the cost formulas and the catalogue of released models) and
:mod:`.instruments` (gradient checks, plotting, measurement, BLAS threads,
``show_source``). Argument validation lives in one module, :mod:`._checks`.
``python -m attn_np.bench NAME`` runs the benchmarks;
``python -m attn_np.memory CONFIG --seq-len N`` sizes the key/value cache
of any Hugging Face ``config.json`` (:func:`.costs.from_hf_config`,
appendix A1).
"""

from . import costs, instruments, training
from .attention import (
    AttentionCache,
    attention_backward,
    attention_forward,
    causal_mask,
    position_mask,
    unbroadcast,
)
from .convert import mha_to_gqa
from .costs import (
    MODELS,
    ModelConfig,
    from_hf_config,
    kv_bytes_per_token,
    kv_cache_bytes,
)
from .flash import (
    FlashCache,
    flash_attention_backward,
    flash_attention_forward,
)
from .instruments import (
    TOLERANCE,
    check_gradients,
    check_layer_gradients,
    numerical_gradient,
    rel_error,
)
from .kv_cache import KVCache
from .latent import LatentKVCache, MultiHeadLatentAttention
from .multihead import (
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiQueryAttention,
)
from .rope import (
    RopeCache,
    rope,
    rope_backward,
    rope_forward,
    rope_frequencies,
    rope_permutation,
    rotate_pairs,
)
from .softmax import (
    SoftmaxCache,
    sink_softmax,
    softmax,
    softmax_backward,
    softmax_forward,
)
from .streaming import MarkedCopy, stream_logits
from .training import (
    Adam,
    AssociativeRecall,
    Transformer,
    cross_entropy_backward,
    cross_entropy_forward,
)

__all__ = [
    "Adam",
    "AssociativeRecall",
    "AttentionCache",
    "FlashCache",
    "GroupedQueryAttention",
    "KVCache",
    "LatentKVCache",
    "MarkedCopy",
    "MODELS",
    "ModelConfig",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "MultiQueryAttention",
    "RopeCache",
    "SoftmaxCache",
    "TOLERANCE",
    "Transformer",
    "attention_backward",
    "attention_forward",
    "causal_mask",
    "check_gradients",
    "check_layer_gradients",
    "costs",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "flash_attention_backward",
    "flash_attention_forward",
    "from_hf_config",
    "instruments",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "mha_to_gqa",
    "numerical_gradient",
    "position_mask",
    "rel_error",
    "rope",
    "rope_backward",
    "rope_forward",
    "rope_frequencies",
    "rope_permutation",
    "rotate_pairs",
    "sink_softmax",
    "softmax",
    "softmax_backward",
    "softmax_forward",
    "stream_logits",
    "training",
    "unbroadcast",
]
