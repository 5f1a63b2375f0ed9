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
1   scaled dot-product attention         :mod:`.softmax`, :mod:`.attention`,
                                         :mod:`.masks`
2   multi-head attention                 :mod:`.multihead`, :mod:`.heads`,
                                         :mod:`.grouped`,
                                         :mod:`.costs.layer`
3   multi-query and grouped-query        :mod:`.multihead`, :mod:`.convert`,
    attention                            :mod:`.costs.catalogue`
4   incremental decoding, KV cache       :mod:`.kv_cache`,
                                         :mod:`.costs.decode`, :mod:`.bench`
5   training MHA, GQA and MQA            :mod:`.training`, :mod:`.norms`
6   rotary position embeddings           :mod:`.rope`
7   multi-head latent attention          :mod:`.latent`,
                                         :mod:`.costs.latent`
8   sliding windows, rolling caches,     :mod:`.masks`, :mod:`.windows`,
    attention sinks                      :mod:`.kv_cache`, :mod:`.streaming`
9   FlashAttention                       :mod:`.flash` (called by
                                         :mod:`.grouped`)
A1  the KV cache of any model config     :mod:`.costs.catalogue`,
                                         :mod:`.memory`
==  ===================================  ===================================

Three supporting subpackages: :mod:`.training` (the chapter-5 kit),
:mod:`.costs` (the cost formulas and the catalogue of released models) and
:mod:`.instruments` (gradient checks, plotting, measurement, BLAS threads,
``show_source``). The checks that several modules share (array kinds and
dtypes, masks, counts, scales, windows, sink logits, flags, a layer's
input, upstream gradients) live in :mod:`._checks`, each rule written
once; a module raises itself only for rules of its own (a cache's layout,
RoPE's settings, a model config's fields).
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
from .grouped import grouped_attention_backward, grouped_attention_forward
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
    "grouped_attention_backward",
    "grouped_attention_forward",
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
