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
    attention                            :mod:`.costs.model`
4   incremental decoding, KV cache       :mod:`.kv_cache`,
                                         :mod:`.costs.decode`, :mod:`.bench`
5   training MHA, GQA and MQA            :mod:`.training`, :mod:`.norms`
6   rotary position embeddings           :mod:`.rope`, :mod:`.rope_scaling`
                                         (its scalings: a position part
                                         chapter 11 shows)
7   multi-head latent attention          :mod:`.latent`,
                                         :mod:`.costs.latent`
8   sliding windows, rolling caches,     :mod:`.masks`, :mod:`.windows`,
    attention sinks                      :mod:`.kv_cache`, :mod:`.streaming`
9   FlashAttention                       :mod:`.flash` (called by
                                         :mod:`.grouped`)
10  real attention layers: biases,       :mod:`.refinements`,
    QK-norm, soft-caps, scales, gates,   :mod:`.hf` (:mod:`.hf.config`,
    ALiBi; any HF model's layer;         :mod:`.hf.families`,
    layers that share keys and values    :mod:`.hf.weights`,
                                         :mod:`.hf.layers`,
                                         :mod:`.hf.build`),
                                         :mod:`.shared_kv`
11  long context: RoPE scaling, NoPE     :mod:`.long_context`
    layers, chunked attention
12  linear attention, DeltaNet, Gated    :mod:`.linear` (per operation:
    DeltaNet, Kimi Delta Attention       :mod:`.linear.attention`,
                                         :mod:`.linear.recurrent`,
                                         :mod:`.linear.chunked`,
                                         :mod:`.linear.conv`,
                                         :mod:`.linear.gates`,
                                         :mod:`.linear.cache`,
                                         :mod:`.linear.layers`)
13  sparse attention on the latent       :mod:`.sparse`,
    cache (DSA's lightning indexer,      :mod:`.costs.sparse`
    top-k, block selection)
14  a real model: SmolLM2-135M from a    :mod:`.pretrained`, :mod:`.ffn`,
    GGUF file through the book's layers  :mod:`.pretrained.sampling`
15  serving many requests: a paged KV    :mod:`.serving` (:mod:`.serving.
    cache, continuous batching, chunked  paged`, :mod:`.serving.engine`)
    prefill, prefix caching
16  masks as functions, packed           :mod:`.masks`, :mod:`.cross`,
    documents, cross-attention, block    :mod:`.flash`,
    sparsity, speculative decoding       :mod:`.speculative`
A1  the KV cache of any model config     :mod:`.costs.hf_config`
                                         (through :mod:`.hf.config`),
                                         :mod:`.memory`,
                                         :mod:`.costs.units`
==  ===================================  ===================================

Every layer takes its cache through ``kv_cache=`` and makes a fresh one
with ``new_cache()``, so :func:`.streaming.stream_logits` and chapter 5's
:class:`~attn_np.Transformer` (whose layer kinds are a table,
:data:`.training.transformer.LAYER_KINDS`, that chapter 12 adds
``"linear"`` to) work on every layer type, hybrids included.

Four supporting subpackages: :mod:`.training` (the chapter-5 kit),
:mod:`.costs` (the cost formulas and the catalogue of released models),
:mod:`.hf` (Hugging Face, read in one place) and :mod:`.instruments`
(gradient checks, plotting, ``show_source``). The measuring lab,
:mod:`.instruments` (measurement, BLAS threads, the worker pool) and
:mod:`.bench`, is a sibling no mechanism imports: a kernel that can use
threads takes them from :mod:`._workers`, where the lab lends its pool
when ``attn_np`` is imported.

The checks that several modules share (array kinds and dtypes, masks,
counts, scales, windows, sink logits, flags, a layer's input and the kind
of its cache, upstream gradients) live in :mod:`._checks`, each rule
written once; a module raises itself only for
rules of its own (a cache's layout, RoPE's settings, a model config's
fields).
``python -m attn_np.bench NAME`` runs the benchmarks;
``python -m attn_np.memory CONFIG --seq-len N`` sizes the key/value cache
of any Hugging Face ``config.json`` (:func:`.costs.from_hf_config`,
appendix A1). :func:`.hf.build.attention_from_hf` builds the attention
layer of a Hugging Face model (Llama 2/3/3.1, Mistral, Qwen2/3, Gemma 2/3,
OLMo 2, gpt-oss, DeepSeek-V2/V3/V3.2, Falcon, Qwen3-Next's attention and
Gated DeltaNet layers, Llama 4) from its ``config.json`` and state dict,
checked against ``transformers`` (chapter 10, with the parts of chapters
11 to 13).

One attention layer, :class:`GroupedQueryAttention`, is assembled from
parts: a position part (``rotary=``), a mask rule (``mask_rule=``), score
mods (``score_mods=``) and a ``scale``, each defined in one module.
Chapter 10's ``RefinedAttention`` and chapter 11's
``LongContextAttention`` are recipes that assemble it (and override the
steps whose parameters they add); no module imports a later chapter's.

The options of chapters 10 to 12, one sentence each:

* ``RefinedAttention(biases=...)`` adds ``b_q``, ``b_k``, ``b_v``, ``b_o``
  to the projections (HF's ``attention_bias``).
* ``qk_norm="head"`` or ``"proj"`` RMS-normalises queries and keys per
  head or over the whole projection before RoPE (``qk_norm_offset=1``:
  Gemma's ``1 + w``).
* ``score_mods=(SoftCap(c),)`` caps the scores at ``c tanh(s / c)``
  (Gemma 2's ``attn_logit_softcapping``).
* ``scale=`` replaces ``1/sqrt(d)`` (Gemma's ``query_pre_attn_scalar``).
* ``gate="elementwise"`` or ``"headwise"`` multiplies the heads' output by
  ``sigmoid(x W_g)`` (Qwen3-Next).
* ``score_mods=(ALiBi(slopes),)`` adds ``m_h (j - i)`` to the scores
  instead of RoPE (Falcon's ``alibi``; HF adds ``m_h j``, the same after
  the softmax).
* ``attention_from_hf(config, layer_idx, state_dict)`` builds layer
  ``layer_idx``'s attention and ``to_hf`` maps its gradients back to HF's
  names.
* ``rope_scaling={"rope_type": ...}`` scales RoPE's frequencies: linear,
  NTK, dynamic NTK, YaRN (with its factor on cos/sin and DeepSeek's
  ``softmax_scale``) and Llama 3.1's ``llama3``.
* ``LongContextAttention(attention_chunk_size=C)`` attends within chunks
  of ``C`` positions, decoded with a ``ChunkedKVCache`` (Llama 4).
* ``use_rope=False`` makes a NoPE layer, and ``rope_layers(n,
  no_rope_layers=...)`` reads HF's per-layer flags (1 = RoPE).
* ``GatedDeltaNet(d_model, n_v_heads, n_k_heads, d_k, d_v, conv_size=)``
  is Qwen3-Next's linear-attention layer (``linear_num_value_heads``,
  ``linear_num_key_heads``, ``linear_key_head_dim``,
  ``linear_value_head_dim``, ``linear_conv_kernel_dim``), decoded with a
  ``StateCache``; ``Transformer(layer_pattern=...)`` mixes it with full
  attention.
"""

from . import costs, instruments, training
from ._workers import decode_workers
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
from .hf.build import attention_from_hf
from .hf.weights import gated_deltanet_from_hf
from .instruments import (
    TOLERANCE,
    check_gradients,
    check_layer_gradients,
    numerical_gradient,
    rel_error,
)
from .instruments.workers import lend as _lend_workers
from .kv_cache import KVCache
from .latent import LatentKVCache, MultiHeadLatentAttention
from .linear import (
    GatedDeltaNet,
    KimiDeltaAttention,
    StateCache,
    gated_delta_chunked_backward,
    gated_delta_chunked_forward,
    gated_delta_recurrent_backward,
    gated_delta_recurrent_forward,
    linear_attention_backward,
    linear_attention_forward,
)
from .long_context import (
    ChunkedKVCache,
    LongContextAttention,
    chunked_mask,
    scaled_frequencies,
    softmax_scale,
)
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
from .sparse import (
    IndexedLatentCache,
    LightningIndexer,
    SparseLatentAttention,
    block_top_n_mask,
    index_scores_backward,
    index_scores_forward,
    indexer_kl_backward,
    indexer_kl_forward,
    sparse_mqa_backward,
    sparse_mqa_forward,
    top_k_mask,
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
    "ChunkedKVCache",
    "FlashCache",
    "GatedDeltaNet",
    "GroupedQueryAttention",
    "IndexedLatentCache",
    "KVCache",
    "KimiDeltaAttention",
    "LatentKVCache",
    "LongContextAttention",
    "LightningIndexer",
    "MarkedCopy",
    "MODELS",
    "ModelConfig",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "MultiQueryAttention",
    "RopeCache",
    "SoftmaxCache",
    "SparseLatentAttention",
    "StateCache",
    "TOLERANCE",
    "Transformer",
    "attention_backward",
    "attention_from_hf",
    "attention_forward",
    "block_top_n_mask",
    "causal_mask",
    "chunked_mask",
    "check_gradients",
    "check_layer_gradients",
    "costs",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "decode_workers",
    "flash_attention_backward",
    "flash_attention_forward",
    "from_hf_config",
    "gated_delta_chunked_backward",
    "gated_delta_chunked_forward",
    "gated_delta_recurrent_backward",
    "gated_delta_recurrent_forward",
    "gated_deltanet_from_hf",
    "grouped_attention_backward",
    "grouped_attention_forward",
    "index_scores_backward",
    "index_scores_forward",
    "indexer_kl_backward",
    "indexer_kl_forward",
    "instruments",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "linear_attention_backward",
    "linear_attention_forward",
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
    "scaled_frequencies",
    "sink_softmax",
    "softmax",
    "softmax_backward",
    "softmax_forward",
    "softmax_scale",
    "sparse_mqa_backward",
    "sparse_mqa_forward",
    "stream_logits",
    "top_k_mask",
    "training",
    "unbroadcast",
]

# The measuring lab lends the kernels its worker threads: a kernel that
# can use threads takes them from its caller (attn_np._workers), and no
# mechanism imports the lab.
_lend_workers()
