"""attn_np: attention in transformers, in NumPy, with hand-written backpropagation.

The library behind the book *Learning Attention*. Every forward function has a backward twin
(``thing_forward(...) -> (out, cache)``, ``thing_backward(dout, cache) -> grads``); layer classes are
thin shells over them with ``params`` and ``grads`` dicts that share their keys.
"""

from .attention import AttentionCache, attention_backward, attention_forward, causal_mask, unbroadcast
from .convert import mha_to_gqa
from .gradcheck import (
    TOLERANCE,
    check_gradients,
    check_layer_gradients,
    format_errors,
    numerical_gradient,
    rel_error,
)
from .kv_cache import KVCache
from .layers import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention
from .losses import cross_entropy_backward, cross_entropy_forward
from . import memory
from .memory import MODELS, ModelConfig, kv_bytes_per_token, kv_cache_bytes
from .model import Transformer
from .optim import Adam
from .softmax import SoftmaxCache, softmax, softmax_backward, softmax_forward
from .tasks import AssociativeRecall

__all__ = [
    "Adam",
    "AssociativeRecall",
    "AttentionCache",
    "GroupedQueryAttention",
    "KVCache",
    "MODELS",
    "ModelConfig",
    "MultiHeadAttention",
    "MultiQueryAttention",
    "SoftmaxCache",
    "Transformer",
    "TOLERANCE",
    "attention_backward",
    "attention_forward",
    "causal_mask",
    "check_gradients",
    "check_layer_gradients",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "format_errors",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "memory",
    "mha_to_gqa",
    "numerical_gradient",
    "rel_error",
    "softmax",
    "softmax_backward",
    "softmax_forward",
    "unbroadcast",
]
