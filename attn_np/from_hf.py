"""Any Hugging Face model's attention layer, from its ``config.json``
(chapter 10).

:func:`attention_from_hf` reads a config (a path, a folder or a dict; a
multimodal config's ``text_config``), picks layer ``layer_idx``'s type
(sliding or full, chunked, NoPE, Qwen3-Next's linear attention) and builds
a :class:`~attn_np.refinements.RefinedAttention` with that layer's details
(chapter 7's MLA for DeepSeek, chapter 13's sparse MLA for DeepSeek-V3.2,
chapter 12's Gated DeltaNet for a
``linear_attention`` layer; :func:`attention_layers_from_hf` builds them
all);
``state_dict`` (HF's names without the ``model.layers.{i}.self_attn.``
prefix, ``nn.Linear`` weights ``[out, in]``) fills its weights. The layer's
``to_hf(d)`` maps a dict in the layer's keys (``params`` or ``grads``) back
to HF's names and layout, so gradients compare name by name.

A key it does not understand, or a RoPE scaling it does not implement, is
a ``ValueError`` naming it: never a guess. Checked against HF
``transformers`` 5.24.0 in ``tests/test_from_hf.py``.

A checkpoint on disk loads without PyTorch: ``safetensors.numpy.load_file``
reads a shard as NumPy arrays (``safetensors`` is not a requirement of this
library); keep the keys that start with ``model.layers.{i}.self_attn.``,
strip that prefix, and pass them as ``state_dict``.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np

from .costs.hf_config import _language_model, _load, _windows
from .latent import MultiHeadLatentAttention
from .linear_attention import (
    HF_LINEAR_KEYS,
    GatedDeltaNet,
    gated_deltanet_from_hf,
    gated_deltanet_grads_to_hf,
)
from .long_context import (
    ChunkedKVCache,
    ScaledRotary,
    read_rope_scaling,
    softmax_scale,
)
from .refinements import ALiBi, RefinedAttention, SoftCap, alibi_slopes
from .sparse import SparseLatentAttention

# Keys that describe the rest of the model (embeddings, MLP, MoE, training,
# generation, bookkeeping): read by nobody here, refused by nobody.
_ELSEWHERE = {
    "_name_or_path",
    "architectures",
    "attention_dropout",
    "bos_token_id",
    "chunk_size_feed_forward",
    "dtype",
    "eos_token_id",
    "final_logit_softcapping",
    "hidden_act",
    "hidden_activation",
    "hidden_dropout",
    "id2label",
    "initializer_range",
    "intermediate_size",
    "intermediate_size_mlp",
    "is_encoder_decoder",
    "label2id",
    "max_position_embeddings",
    "mlp_bias",
    "model_type",
    "num_hidden_layers",
    "output_attentions",
    "output_hidden_states",
    "pad_token_id",
    "pretraining_tp",
    "problem_type",
    "return_dict",
    "tie_word_embeddings",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "vocab_size",
    # mixture of experts and MLP shapes
    "decoder_sparse_step",
    "interleave_moe_layer_step",
    "mlp_only_layers",
    "moe_intermediate_size",
    "moe_layers",
    "norm_topk_prob",
    "num_experts",
    "num_experts_per_tok",
    "num_local_experts",
    "output_router_logits",
    "router_aux_loss_coef",
    "router_jitter_noise",
    "shared_expert_intermediate_size",
    "swiglu_alpha",
    "swiglu_limit",
    "ffn_hidden_size",
    "activation",
    "layer_norm_epsilon",
    "num_ln_in_parallel_attn",
    "parallel_attn",
    # Qwen2/Qwen3: the window rule is spelled out in layer_types
    "use_sliding_window",
    "max_window_layers",
    "_sliding_window_pattern",
    "sliding_window_pattern",
    "use_bidirectional_attention",
    "no_rope_layer_interval",
    # DeepSeek's MoE and multi-token prediction
    "n_shared_experts",
    "n_routed_experts",
    "routed_scaling_factor",
    "n_group",
    "topk_group",
    "topk_method",
    "first_k_dense_replace",
    "num_nextn_predict_layers",
    "ep_size",
    "scoring_func",
    "aux_loss_alpha",
    "seq_aux",
    "moe_layer_freq",
    "mlp_layer_types",  # DeepSeek-V3.2: dense or MoE per layer
    # keys of released config.json files that do not shape attention
    "apply_residual_connection_post_layernorm",
    "cache_implementation",
    "experts_per_token",
    "initial_context_length",
    "quantization_config",
    "max_sequence_length",
}

_ATTENTION = {
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "attention_bias",
    "layer_types",
    "sliding_window",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "query_pre_attn_scalar",
    "attn_logit_softcapping",
    # Falcon
    "alibi",
    "bias",
    "multi_query",
    "new_decoder_architecture",
    "num_kv_heads",
    # Llama 4
    "attention_chunk_size",
    "no_rope_layers",
    "use_qk_norm",
    "attn_temperature_tuning",
    "floor_scale",
    "attn_scale",
    "text_config",
    # MLA (DeepSeek-V2/V3)
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "qk_head_dim",
    "v_head_dim",
    "rope_interleave",
    # DeepSeek-V3.2's lightning indexer (chapter 13)
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    # Qwen3-Next's linear-attention layers (chapter 12's GatedDeltaNet)
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "rope_local_base_freq",  # Gemma 3 before transformers 5
    "use_mrope",  # Qwen2.5: refused when true
}

FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3_text",
    "olmo2",
    "gpt_oss",
    "falcon",
    "qwen3_next",
    "llama4_text",
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
)
_ALIASES = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
_ROPE_KEYS = {"rope_theta", "rope_type", "type", "partial_rotary_factor"}


def attention_from_hf(
    config, layer_idx=0, state_dict=None, dtype=np.float64
):
    """Layer ``layer_idx``'s attention of a Hugging Face model.

    Families: Llama (2, 3.0), Mistral, Qwen2/2.5, Qwen3, Gemma 2, Gemma 3,
    OLMo 2, gpt-oss, DeepSeek-V2/V3 (MLA, on chapter 7's layer), Falcon
    (MQA, ``new_decoder_architecture``, ALiBi), DeepSeek-V3.2 (MLA with
    chapter 13's lightning indexer and top-k: ``index_n_heads``,
    ``index_head_dim``, ``index_topk``), Qwen3-Next (its
    ``linear_attention`` layers are chapter 12's Gated DeltaNet, its
    weights read by ``gated_deltanet_from_hf``; ``kv_cache`` is then a
    ``StateCache``) and Llama 4's attention (chunked and NoPE layers). RoPE
    as ``rope_theta``/``rope_scaling``/``partial_rotary_factor`` at the
    top level or under ``rope_parameters`` (transformers 5; per layer type
    for Gemma 3); ``rope_type`` ``default``, ``linear``, and chapter 11's
    ``llama3`` and ``yarn`` (Llama 3.1, gpt-oss, DeepSeek-V3: the factor
    on cos/sin, and ``mscale_all_dim`` in MLA's softmax scale). The layer's
    ``forward(x, kv_cache=layer.new_cache())`` continues positions from the
    cache.
    """
    cls, args, kw, layout = layer_settings(config, layer_idx)
    layer = cls(*args, dtype=dtype, **kw)
    layer.hf_layout = layout
    if layout["kind"] == "linear":
        layer.to_hf = lambda d: _linear_to_hf(layer, d)
        if state_dict is not None:
            _load_linear(layer, layout, state_dict, dtype)
        return layer
    layer.to_hf = lambda d: _to_hf(layout, layer, d)
    if state_dict is not None:
        _load_state(layer, layout, state_dict, dtype)
    return layer


def attention_layers_from_hf(config, state_dicts=None, dtype=np.float64):
    """Every layer's attention of a Hugging Face model, in order: one
    :func:`attention_from_hf` per layer of ``num_hidden_layers`` (a hybrid
    model such as Qwen3-Next mixes Gated DeltaNet and attention layers).
    ``state_dicts`` is None (random weights) or a sequence with one state
    dict per layer (HF's names without the layer's module prefix)."""
    data, _, _ = _load(config)
    cfg = _language_model(data)
    n = _count(cfg, "num_hidden_layers")
    if state_dicts is not None and len(state_dicts) != n:
        raise ValueError(
            f"state_dicts must have one entry per layer "
            f"(num_hidden_layers={n}), got {len(state_dicts)}"
        )
    return [
        attention_from_hf(
            cfg,
            i,
            None if state_dicts is None else state_dicts[i],
            dtype=dtype,
        )
        for i in range(n)
    ]


def layer_settings(config, layer_idx=0):
    """What :func:`attention_from_hf` builds, without building it:
    ``(cls, args, kwargs, layout)``, the layer class, its positional and
    keyword arguments, and how HF's state dict maps onto its ``params``.
    Reads and checks the config as :func:`attention_from_hf` does; costs
    nothing for a large model (no weights are drawn)."""
    data, _, _ = _load(config)
    cfg = _language_model(data)
    model_type = cfg.get("model_type")
    model_type = _ALIASES.get(model_type, model_type)
    if model_type not in FAMILIES:
        raise ValueError(
            f"config model_type={model_type!r} is not one attention_from_hf "
            f"builds; it builds {', '.join(FAMILIES)}"
        )
    if cfg.get("use_mrope"):
        raise ValueError(
            "config key use_mrope=True (multimodal RoPE sections) is not "
            "implemented by attention_from_hf"
        )
    unknown = sorted(set(cfg) - _ELSEWHERE - _ATTENTION)
    if unknown:
        raise ValueError(
            f"config keys {unknown} are not understood by "
            f"attention_from_hf ({model_type}); refusing to guess what they "
            "change"
        )
    if model_type == "falcon":
        return _falcon(cfg)
    if model_type in ("deepseek_v2", "deepseek_v3", "deepseek_v32"):
        layer_type = _layer_type(cfg, layer_idx)
        if layer_type not in (None, "full_attention", "indexed_attention"):
            raise ValueError(
                f"layer {layer_idx} has layer type {layer_type!r}, which "
                "attention_from_hf does not build for MLA"
            )
        return _latent(cfg, model_type)
    return _decoder(cfg, model_type, layer_idx)


# ---------------------------------------------------------------- configs
def _count(cfg, key, default=None):
    value = cfg.get(key, default)
    if value is None:
        raise ValueError(f"config needs {key}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"config key {key} must be a positive int, got {value!r}"
        )
    return value


def _layer_type(cfg, layer_idx):
    types = cfg.get("layer_types")
    n = cfg.get("num_hidden_layers")
    if isinstance(layer_idx, bool) or not isinstance(layer_idx, int):
        raise TypeError(f"layer_idx must be an int, got {layer_idx!r}")
    if n is not None and not 0 <= layer_idx < n:
        raise ValueError(
            f"layer_idx must be in [0, {n}) (num_hidden_layers), got "
            f"{layer_idx}"
        )
    if types is None:
        return None
    if layer_idx >= len(types):
        raise ValueError(
            f"layer_types has {len(types)} entries, no layer {layer_idx}"
        )
    return types[layer_idx]


def rope_settings(cfg, layer_type=None):
    """``(base, partial_rotary_factor, linear_factor)`` of a layer from
    either spelling: top-level ``rope_theta``/``rope_scaling``/
    ``partial_rotary_factor`` or ``rope_parameters`` (per layer type where
    its keys are layer types). Plain and linear RoPE only:
    :func:`layer_rope` routes chapter 11's scalings around it."""
    params = cfg.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ValueError(
            f"rope_parameters must be an object, got {params!r}"
        )
    if (
        params
        and layer_type in params
        and isinstance(params[layer_type], dict)
    ):
        params = params[layer_type]
    if params is None:
        params = {"rope_theta": cfg.get("rope_theta", 10000.0)}
        scaling = cfg.get("rope_scaling")
        if scaling:
            params.update(scaling)
    params = dict(params)
    if "partial_rotary_factor" in cfg:
        params.setdefault(
            "partial_rotary_factor", cfg["partial_rotary_factor"]
        )
    rope_type = params.get("rope_type", params.get("type", "default"))
    factor = 1.0
    if rope_type == "linear":
        factor = float(params.get("factor", 0) or 0)
        if not factor > 0:
            raise ValueError("rope_type linear needs a positive factor")
        extra = set(params) - _ROPE_KEYS - {"factor"}
    elif rope_type == "default":
        extra = set(params) - _ROPE_KEYS
    else:
        raise ValueError(
            f"rope_type {rope_type!r} is not read by rope_settings, which "
            "reads 'default' and 'linear' (layer_rope adds chapter 11's "
            "'llama3' and 'yarn')"
        )
    if extra:
        raise ValueError(
            f"rope keys {sorted(extra)} are not understood for rope_type "
            f"{rope_type!r}"
        )
    base = float(params.get("rope_theta", 10000.0))
    partial = float(params.get("partial_rotary_factor", 1.0))
    return base, partial, factor


# chapter 11's scalings that attention_from_hf builds exactly (checked
# against HF's llama3 and YaRN fixtures); rope_settings reads the others
_SCALED = ("llama3", "yarn")


def layer_rope(cfg, layer_type=None):
    """``(base, partial_rotary_factor, linear_factor, rope_scaling)`` of a
    layer: :func:`rope_settings`, and for ``rope_type`` ``llama3`` or
    ``yarn`` the scaling dict checked by chapter 11's
    :func:`~attn_np.long_context.read_rope_scaling` (a YaRN without
    ``factor`` takes ``max_position_embeddings /
    original_max_position_embeddings``), else None."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    if params is None:
        params = cfg.get("rope_scaling") or {}
    kind = "default"
    if isinstance(params, dict):
        kind = params.get("rope_type", params.get("type", "default"))
    if kind not in _SCALED:
        if kind not in ("default", "linear"):
            raise ValueError(
                f"rope_type {kind!r} is not implemented by "
                "attention_from_hf; it builds 'default', 'linear', "
                "'llama3' and 'yarn'"
            )
        return (*rope_settings(cfg, layer_type), None)
    base = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    partial = float(
        params.get(
            "partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)
        )
    )
    scaling = read_rope_scaling(
        params, max_position_embeddings=cfg.get("max_position_embeddings")
    )
    return base, partial, 1.0, scaling


def _heads(cfg):
    d_model = _count(cfg, "hidden_size")
    n_heads = _count(cfg, "num_attention_heads")
    n_kv = _count(cfg, "num_key_value_heads", n_heads)
    head_dim = cfg.get("head_dim")  # absent or null: d_model // n_heads
    head_dim = (
        d_model // n_heads if head_dim is None else _count(cfg, "head_dim")
    )
    return d_model, n_heads, n_kv, head_dim


def _gemma3_rope(cfg):
    """An older Gemma 3 file's top-level RoPE keys in transformers 5's
    per-layer-type form, as ``Gemma3TextConfig`` converts them: the global
    layers take ``rope_theta`` (default 1e6) and ``rope_scaling``, the
    local ones plain RoPE with ``rope_local_base_freq`` (default 1e4)."""
    if cfg.get("rope_parameters") is not None:
        if "rope_local_base_freq" in cfg:
            raise ValueError(
                "config is contradictory: rope_local_base_freq and "
                "rope_parameters both set the sliding layers' RoPE"
            )
        return cfg
    full = {"rope_type": "default", **(cfg.get("rope_scaling") or {})}
    full.setdefault("rope_theta", cfg.get("rope_theta", 1e6))
    local = cfg.get("rope_local_base_freq", 1e4)
    cfg = {
        k: v
        for k, v in cfg.items()
        if k not in ("rope_theta", "rope_scaling", "rope_local_base_freq")
    }
    cfg["rope_parameters"] = {
        "full_attention": full,
        "sliding_attention": {"rope_type": "default", "rope_theta": local},
    }
    return cfg


def _decoder(cfg, model_type, layer_idx):
    """Every family with q_proj/k_proj/v_proj/o_proj."""
    if model_type == "gemma3_text":
        cfg = _gemma3_rope(cfg)
    d_model, n_heads, n_kv, head_dim = _heads(cfg)
    layer_type = _layer_type(cfg, layer_idx)
    window = None
    if cfg.get("layer_types") is None and cfg.get("sliding_window"):
        # an older config: the window rule of chapter 8's calculator
        # (sliding_window_pattern, use_sliding_window with
        # max_window_layers, or the model_type's rule)
        n_layers = _count(cfg, "num_hidden_layers")
        window, types = _windows(cfg, n_layers, None)
        if types is not None:
            layer_type = types[layer_idx]
            if layer_type != "sliding_attention":
                window = None
    elif layer_type == "sliding_attention":
        window = cfg.get("sliding_window")
    elif layer_type == "linear_attention" and model_type == "qwen3_next":
        return _linear(cfg)
    elif layer_type not in (None, "full_attention", "chunked_attention"):
        raise ValueError(
            f"layer {layer_idx} has layer type {layer_type!r}, which "
            "attention_from_hf does not build"
        )
    base, partial, factor, scaling = layer_rope(cfg, layer_type)
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    bias = bool(cfg.get("attention_bias", False))
    kw = dict(
        biases=("q", "k", "v", "o") if bias else (),
        window=window,
        rope_base=base,
        rotary_dim=int(head_dim * partial) if partial != 1.0 else None,
        rope_factor=factor,
        rope_scaling=scaling,
        norm_eps=eps,
    )
    gate_rows = False
    if model_type == "qwen2":
        kw["biases"] = ("q", "k", "v")
    if model_type in ("qwen3", "qwen3_next", "gemma3_text"):
        kw["qk_norm"] = "head"
    if model_type in ("qwen3_next", "gemma3_text"):
        kw["qk_norm_offset"] = 1.0
    if model_type == "olmo2":
        kw["qk_norm"] = "proj"
    if model_type in ("gemma2", "gemma3_text"):
        scalar = cfg.get("query_pre_attn_scalar")
        if scalar is not None:
            kw["scale"] = float(scalar) ** -0.5
        cap = cfg.get("attn_logit_softcapping")
        if cap is not None:
            kw["score_mods"] = (SoftCap(cap),)
    if model_type == "gpt_oss":
        kw["sinks"] = True
    if model_type == "qwen3_next":
        kw["gate"] = "elementwise"
        gate_rows = True
    if model_type == "llama4_text":
        rope_flags = cfg.get("no_rope_layers")
        use_rope = bool(rope_flags[layer_idx]) if rope_flags else True
        kw["use_rope"] = use_rope
        kw["rope_layout"] = "interleaved"
        if cfg.get("use_qk_norm") and use_rope:
            kw.update(
                qk_norm="head",
                qk_norm_learned=False,
                qk_norm_after_rope=True,
            )
        if layer_type == "chunked_attention":
            kw["chunk"] = _count(cfg, "attention_chunk_size")
        if cfg.get("attn_temperature_tuning") and not use_rope:
            kw["query_temperature"] = (
                float(cfg["floor_scale"]),
                float(cfg["attn_scale"]),
            )
    layout = {"kind": "proj", "gate_rows": gate_rows}
    return HFAttention, (d_model, n_heads, n_kv, head_dim), kw, layout


def _falcon(cfg):
    d_model = _count(cfg, "hidden_size")
    n_heads = _count(cfg, "num_attention_heads")
    head_dim = d_model // n_heads
    if cfg.get("new_decoder_architecture"):
        n_kv, fused = _count(cfg, "num_kv_heads"), "grouped"
    elif cfg.get("multi_query", True):
        n_kv, fused = 1, "mqa"
    else:
        n_kv, fused = n_heads, "per_head"
    base, partial, factor, scaling = layer_rope(cfg)
    bias = bool(cfg.get("bias", False))
    kw = dict(
        biases=("q", "k", "v", "o") if bias else (),
        rope_base=base,
        rope_factor=factor,
        rope_scaling=scaling,
    )
    if cfg.get("alibi"):
        # HF's Falcon adds m_h * j before the 1/sqrt(d) scale
        slopes = alibi_slopes(n_heads) / math.sqrt(head_dim)
        kw.update(use_rope=False, score_mods=(ALiBi(slopes),))
    args = (d_model, n_heads, n_kv, head_dim)
    return HFAttention, args, kw, {"kind": "falcon", "fused": fused}


class HFAttention(RefinedAttention):
    """Chapter 10's layer as a Hugging Face decoder layer: a chunked
    layer (Llama 4's ``chunked_attention``) decodes with chapter 11's
    :class:`~attn_np.ChunkedKVCache`, which holds at most the chunk."""

    def new_cache(self):
        if self.chunk is None:
            return super().new_cache()
        return ChunkedKVCache(self.chunk)


def _linear(cfg):
    """Qwen3-Next's Gated DeltaNet layer (chapter 12)."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(
            "config key hidden_act must be 'silu' for a linear_attention "
            f"layer (its convolution and output gate), got {act!r}"
        )
    args = (
        _count(cfg, "hidden_size"),
        _count(cfg, "linear_num_value_heads"),
        _count(cfg, "linear_num_key_heads"),
    )
    kw = dict(
        d_k=_count(cfg, "linear_key_head_dim"),
        d_v=_count(cfg, "linear_value_head_dim"),
        conv_size=_count(cfg, "linear_conv_kernel_dim"),
        eps=float(cfg.get("rms_norm_eps", 1e-6)),
    )
    return GatedDeltaNet, args, kw, {"kind": "linear", "config": cfg}


def _load_linear(layer, layout, state_dict, dtype):
    """Chapter 12's :func:`~attn_np.gated_deltanet_from_hf` reads the
    weights; this layer takes them."""
    if not isinstance(state_dict, dict):
        raise TypeError(
            "state_dict must be a dict of arrays, got "
            f"{type(state_dict).__name__}"
        )
    extra = sorted(set(state_dict) - set(HF_LINEAR_KEYS))
    if extra:
        raise ValueError(
            f"state_dict does not fit this layer: unexpected {extra} "
            "(names without the 'model.layers.{i}.linear_attn.' prefix)"
        )
    src = gated_deltanet_from_hf(layout["config"], state_dict, dtype=dtype)
    layer.params, layer.grads = src.params, src.grads


def _linear_to_hf(layer, d):
    view = copy.copy(layer)  # the same layer, reading d as its grads
    view.grads = d
    return gated_deltanet_grads_to_hf(view)


class _HFLatentRope:
    """What an HF latent layer (MLA, DSA) takes of chapter 11:
    ``rope_scaling`` goes through chapter 7's two settings. ``rotary``
    turns ``q_R`` and ``k_R`` with the scaled frequencies
    (:class:`~attn_np.long_context.ScaledRotary`), and ``scale`` is
    :func:`~attn_np.long_context.softmax_scale` (YaRN's
    ``mscale(s, mscale_all_dim)^2`` over ``1/sqrt(d_head + d_rope)``, as
    DeepSeek's and HF's ``softmax_scale``)."""

    def __init__(self, *args, rope_scaling=None, **kw):
        super().__init__(*args, **kw)
        self.rope_scaling = (
            None if rope_scaling is None else read_rope_scaling(rope_scaling)
        )
        self.scale = softmax_scale(
            self.d_head + self.d_rope, self.rope_scaling
        )

    @property
    def rotary(self):
        if self.rope_scaling is None:
            return super().rotary
        return ScaledRotary(
            self.rope_base, self.rope_layout, rope_scaling=self.rope_scaling
        )


class HFLatentAttention(_HFLatentRope, MultiHeadLatentAttention):
    """Chapter 7's MLA as a Hugging Face decoder layer: causal, and
    continuing from its cache (the absorbed path) like HF's.
    ``rope_scaling`` (chapter 11) as :class:`_HFLatentRope` says."""

    def forward(self, x, causal=True, kv_cache=None):
        if not causal:
            raise ValueError("an HF decoder layer is causal")
        return super().forward(x, causal=True, kv_cache=kv_cache)


class HFSparseLatentAttention(_HFLatentRope, SparseLatentAttention):
    """Chapter 13's DSA (MLA with the lightning indexer) as Hugging
    Face's DeepSeek-V3.2 layer: causal, continuing from its
    :class:`~attn_np.IndexedLatentCache`. ``rope_scaling`` enters as in
    :class:`HFLatentAttention`, and the indexer turns its first
    ``d_rope`` features with the same frequencies (HF hands both the
    model's one ``cos``/``sin``), in the rotate-half layout. Its top-k
    has no gradient: ``backward`` is chapter 7's, for the main
    attention's parameters (HF runs the indexer under ``no_grad``)."""

    def __init__(self, *args, rope_scaling=None, **kw):
        super().__init__(*args, rope_scaling=rope_scaling, **kw)
        if self.rope_scaling is not None:
            ix = self.indexer
            ix.rotary = ScaledRotary(
                ix.rope_base,
                ix.rope_layout,
                ix.d_rope,
                rope_scaling=self.rope_scaling,
            )

    def forward(self, x, causal=True, kv_cache=None):
        if not causal:
            raise ValueError("an HF decoder layer is causal")
        return super().forward(x, kv_cache=kv_cache)


def _latent(cfg, model_type):
    """DeepSeek-V2/V3 multi-head latent attention; V3.2's with the
    lightning indexer (chapter 13)."""
    d_model = _count(cfg, "hidden_size")
    n_heads = _count(cfg, "num_attention_heads")
    q_lora = cfg.get("q_lora_rank")
    if cfg.get("attention_bias"):
        raise ValueError(
            "config key attention_bias=True for MLA is not implemented"
        )
    base, partial, factor, scaling = layer_rope(cfg)
    if partial != 1.0 or factor != 1.0:
        raise ValueError(
            "MLA with partial_rotary_factor or linear RoPE scaling is not "
            "implemented"
        )
    interleave = cfg.get("rope_interleave", True)
    args = (
        d_model,
        n_heads,
        _count(cfg, "qk_nope_head_dim"),
        _count(cfg, "kv_lora_rank"),
        _count(cfg, "qk_rope_head_dim"),
    )
    kw = dict(
        d_latent_q=None if q_lora is None else _count(cfg, "q_lora_rank"),
        d_head_v=_count(cfg, "v_head_dim"),
        rope_base=base,
        rope_layout="interleaved" if interleave else "half",
        latent_norm=True,
        rope_scaling=scaling,
    )
    if model_type == "deepseek_v32":
        if q_lora is None:
            raise ValueError(
                "config needs q_lora_rank for deepseek_v32 (its indexer "
                "reads the query latent)"
            )
        kw.update(
            index_n_heads=_count(cfg, "index_n_heads"),
            index_head_dim=_count(cfg, "index_head_dim"),
            index_topk=_count(cfg, "index_topk"),
            index_rope_layout="half",  # HF: "NON-interleaved"
        )
        layout = {"kind": "mla", "indexer": True}
        return HFSparseLatentAttention, args, kw, layout
    return HFLatentAttention, args, kw, {"kind": "mla"}


# ---------------------------------------------------------------- weights
def _hf_names(layout, layer):
    """HF name -> how it is made from the layer's keys."""
    p = layer.params
    if layout["kind"] == "mla":
        names = {
            "kv_a_proj_with_mqa.weight": None,
            "kv_a_layernorm.weight": "g_kv",
            "kv_b_proj.weight": None,
            "o_proj.weight": "W_o",
        }
        if "W_q" in p:
            names["q_proj.weight"] = None
        else:
            names.update(
                {
                    "q_a_proj.weight": "W_dq",
                    "q_a_layernorm.weight": "g_q",
                    "q_b_proj.weight": None,
                }
            )
        return names
    if layout["kind"] == "falcon":
        names = {"query_key_value.weight": None, "dense.weight": "W_o"}
        if "b_q" in p:
            names.update({"query_key_value.bias": None, "dense.bias": "b_o"})
        return names
    names = {}
    for n in ("q", "k", "v", "o"):
        names[f"{n}_proj.weight"] = f"W_{n}"
        if f"b_{n}" in p:
            names[f"{n}_proj.bias"] = f"b_{n}"
    for n in ("q", "k"):
        if f"{n}_norm" in p:
            names[f"{n}_norm.weight"] = f"{n}_norm"
    if "sinks" in p:
        names["sinks"] = "sinks"
    return names


# DeepSeek-V3.2's indexer: HF name -> LightningIndexer's params key
_INDEXER = {
    "indexer.wq_b.weight": "W_qi",
    "indexer.wk.weight": "W_ki",
    "indexer.k_norm.weight": "g_k",
    "indexer.k_norm.bias": "b_k",
    "indexer.weights_proj.weight": "W_w",
}


def _store(p, key, a, entry):
    """``p[key] = a`` (``a`` in the layer's layout), or raise naming the
    state_dict ``entry`` with both shapes in HF's layout."""
    if a.shape != p[key].shape:
        hf_shape = a.T.shape if a.ndim == 2 else a.shape
        want = p[key].T.shape if a.ndim == 2 else p[key].shape
        raise ValueError(
            f"state_dict entry {entry} has shape {hf_shape}, the config "
            f"says {want}"
        )
    p[key] = np.ascontiguousarray(a)


def _load_indexer(layer, got):
    p = layer.indexer.params
    for hf, key in _INDEXER.items():
        a = got[hf]
        _store(p, key, a.T if a.ndim == 2 else a, hf)


def indexer_to_hf(layer):
    """A V3.2 layer's indexer weights under HF's names and layout."""
    p = layer.indexer.params
    return {
        hf: p[key].T if p[key].ndim == 2 else p[key]
        for hf, key in _INDEXER.items()
    }


def _falcon_split(layer, fused, w):
    """Falcon's fused rows ``[(...) * d, ...]`` -> q, k, v rows."""
    H, n_kv, G, d = layer.n_heads, layer.n_kv, layer.G, layer.d
    rest = w.shape[1:]
    if fused == "grouped":
        t = w.reshape(n_kv, G + 2, d, *rest)
        q, k, v = t[:, :G], t[:, G], t[:, G + 1]
    elif fused == "mqa":
        t = w.reshape(H + 2, d, *rest)
        q, k, v = t[:H], t[H], t[H + 1]
    else:
        t = w.reshape(H, 3, d, *rest)
        q, k, v = t[:, 0], t[:, 1], t[:, 2]
    return [a.reshape(-1, *rest) for a in (q, k, v)]


def _falcon_fuse(layer, fused, q, k, v):
    H, n_kv, G, d = layer.n_heads, layer.n_kv, layer.G, layer.d
    rest = q.shape[1:]
    if fused == "grouped":
        t = np.concatenate(
            [
                q.reshape(n_kv, G, d, *rest),
                k.reshape(n_kv, 1, d, *rest),
                v.reshape(n_kv, 1, d, *rest),
            ],
            axis=1,
        )
    elif fused == "mqa":
        t = np.concatenate([q, k, v], axis=0)
    else:
        t = np.stack([a.reshape(H, d, *rest) for a in (q, k, v)], axis=1)
    return t.reshape(-1, *rest)


def _gate_split(layer, w):
    """Qwen3-Next's q_proj rows: per head [query d, gate d]."""
    rest = w.shape[1:]
    t = w.reshape(layer.n_heads, 2, layer.d, *rest)
    return t[:, 0].reshape(-1, *rest), t[:, 1].reshape(-1, *rest)


def _load_state(layer, layout, state_dict, dtype):
    if not isinstance(state_dict, dict):
        raise TypeError(
            "state_dict must be a dict of arrays, got "
            f"{type(state_dict).__name__}"
        )
    names = _hf_names(layout, layer)
    if layout.get("gate_rows"):
        names.pop("q_proj.weight")
        names["q_proj.weight"] = None
    if layout.get("indexer"):
        names.update(dict.fromkeys(_INDEXER))
    extra = sorted(set(state_dict) - set(names))
    missing = sorted(set(names) - set(state_dict))
    if extra or missing:
        raise ValueError(
            f"state_dict does not fit this layer: unexpected {extra}, "
            f"missing {missing} (names without the "
            "'model.layers.{i}.self_attn.' prefix)"
        )
    p = layer.params
    got = {k: np.asarray(v, dtype=dtype) for k, v in state_dict.items()}
    for k, a in got.items():
        bad = a.size - int(np.isfinite(a).sum())
        if bad:
            raise ValueError(
                f"state_dict entry {k} has {bad} NaN or inf value(s) in "
                f"its {a.size}"
            )
    new = {}
    for hf, key in names.items():
        a = got[hf]
        if key is None:
            continue
        new[key] = a.T if a.ndim == 2 else a
    if layout["kind"] == "falcon":
        for part in ("weight", "bias"):
            hf = f"query_key_value.{part}"
            if hf in got:
                q, k, v = _falcon_split(layer, layout["fused"], got[hf])
                pre = "W" if part == "weight" else "b"
                for n, a in zip("qkv", (q, k, v)):
                    new[f"{pre}_{n}"] = a.T if a.ndim == 2 else a
    if layout["kind"] == "mla":
        new.update(_mla_split(layer, got))
    if layout.get("indexer"):
        _load_indexer(layer, got)
    if layout.get("gate_rows"):
        q, g = _gate_split(layer, got["q_proj.weight"])
        new["W_q"], new["W_g"] = q.T, g.T
    for key, a in new.items():
        _store(p, key, a, f"for {key}")


def _to_hf(layout, layer, d):
    """A dict in the layer's keys -> HF's names and layout."""
    names = _hf_names(layout, layer)
    out = {}
    for hf, key in names.items():
        if key is None:
            continue
        a = d[key]
        out[hf] = a.T if a.ndim == 2 else a
    if layout["kind"] == "falcon":
        out["query_key_value.weight"] = _falcon_fuse(
            layer, layout["fused"], d["W_q"].T, d["W_k"].T, d["W_v"].T
        )
        if "b_q" in d:
            out["query_key_value.bias"] = _falcon_fuse(
                layer, layout["fused"], d["b_q"], d["b_k"], d["b_v"]
            )
    if layout["kind"] == "mla":
        out.update(_mla_fuse(layer, d))
    if layout.get("gate_rows"):
        H, dd = layer.n_heads, layer.d
        q = d["W_q"].T.reshape(H, 1, dd, -1)
        g = d["W_g"].T.reshape(H, 1, dd, -1)
        out["q_proj.weight"] = np.concatenate([q, g], axis=1).reshape(
            2 * H * dd, -1
        )
    return out


def _head_split(w, n_heads, sizes):
    """Rows ``[n_heads * sum(sizes), in]`` -> one ``[n_heads * size, in]``
    block per size (each head's rows are the parts in order)."""
    t = w.reshape(n_heads, sum(sizes), -1)
    edges = np.cumsum([0, *sizes])
    return [
        t[:, a:b].reshape(n_heads * (b - a), -1)
        for a, b in zip(edges[:-1], edges[1:])
    ]


def _head_fuse(parts, n_heads):
    t = [a.reshape(n_heads, -1, a.shape[-1]) for a in parts]
    return np.concatenate(t, axis=1).reshape(-1, parts[0].shape[-1])


def _mla_split(layer, got):
    """HF's MLA weights -> chapter 7's (``W [in, out]``)."""
    h, d_c = layer.n_heads, layer.d_latent_kv
    dims = [layer.d_head, layer.d_rope]
    q_name = "q_proj.weight" if "q_proj.weight" in got else "q_b_proj.weight"
    q_c, q_r = _head_split(got[q_name], h, dims)
    kv_a = got["kv_a_proj_with_mqa.weight"]  # [d_c + d_R, d_model]
    k_c, v = _head_split(
        got["kv_b_proj.weight"], h, [dims[0], layer.d_head_v]
    )
    new = {"W_qr": q_r.T, "W_dkv": kv_a[:d_c].T, "W_kr": kv_a[d_c:].T}
    new.update({"W_uk": k_c.T, "W_uv": v.T})
    new["W_q" if q_name == "q_proj.weight" else "W_uq"] = q_c.T
    return new


def _mla_fuse(layer, d):
    h = layer.n_heads
    q = d["W_q"] if "W_q" in d else d["W_uq"]
    out = {
        "kv_a_proj_with_mqa.weight": np.concatenate(
            [d["W_dkv"].T, d["W_kr"].T], axis=0
        ),
        "kv_b_proj.weight": _head_fuse([d["W_uk"].T, d["W_uv"].T], h),
    }
    q_name = "q_proj.weight" if "W_q" in d else "q_b_proj.weight"
    out[q_name] = _head_fuse([q.T, d["W_qr"].T], h)
    return out


# ---------------------------------------------------------------- checks
def fixture_errors(path, layer_idx=0):
    """Compare ``attention_from_hf`` with a reference fixture.

    ``path`` is one of ``tests/fixtures/*.npz`` (written by
    ``scripts/record_hf_fixtures.py``: HF's config, the layer's state
    dict, an input ``x``, HF's output, the gradients of ``sum(out * dy)``
    and a chunked decode). Returns ``{"forward": e, "grad x": e,
    "grad NAME": e, ..., "decode": e}``, each the largest absolute error
    divided by the reference's largest entry.
    """
    f = np.load(path)
    config = json.loads(str(f["config"]))
    meta = json.loads(str(f["meta"]))
    i = layer_idx
    pre = f"layer{i}.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    layer = attention_from_hf(config, layer_idx=i, state_dict=state)

    def err(a, b):
        return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))

    x = f["x"]
    errors = {"forward": err(layer.forward(x), f[f"layer{i}.out"])}
    errors["grad x"] = err(layer.backward(f["dy"]), f[f"layer{i}.grad.x"])
    grads = layer.to_hf(layer.grads)
    gpre = f"layer{i}.grad."
    want = {k[len(gpre) :] for k in f.files if k.startswith(gpre)} - {"x"}
    if set(grads) != want:  # every parameter but V3.2's indexer (no_grad)
        raise ValueError(
            f"gradients {sorted(grads)} do not match the fixture's "
            f"{sorted(want)}"
        )
    for name, g in grads.items():
        errors[f"grad {name}"] = err(g, f[f"layer{i}.grad.{name}"])
    cache, outs, start = layer.new_cache(), [], 0
    for c in meta["chunks"]:
        outs.append(layer.forward(x[:, start : start + c], kv_cache=cache))
        start += c
    y = np.concatenate(outs, axis=1)
    errors["decode"] = err(y, f[f"layer{i}.decode.out"])
    return errors
