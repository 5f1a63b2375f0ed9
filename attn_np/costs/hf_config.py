"""Reading a Hugging Face ``config.json`` into a
:class:`~attn_np.costs.model.ModelConfig` (appendix A1).

:func:`from_hf_config` is the KV calculator's reader; ``python -m
attn_np.memory`` is its command line. The file, its spellings, its layer
types, windows and RoPE are read by :mod:`attn_np.hf.config`, the one
reader of a ``config.json`` (the layer builder uses it too); this module
adds what the calculator needs: the recurrent state, the indexer, and
which layers use no RoPE.
"""

from __future__ import annotations

from ..hf.config import (  # noqa: F401 (importable here too)
    CHUNKED,
    FULL,
    LINEAR,
    MAX_CONFIG_BYTES,
    MAX_LAYERS,
    count,
    flag,
    kv_heads,
    language_model,
    layer_types,
    load_config,
    parse_config_text,
    rope_parameters,
    windows,
)
from .model import Indexer, LinearState, ModelConfig

# Keys of configs whose cache this calculator does not model: it refuses
# them rather than return a wrong number.
_UNMODELLED = {
    "num_kv_shared_layers": "layers that share another layer's cache",
    "global_head_dim": "full layers with their own head dimension",
    "num_global_key_value_heads": "full layers with their own kv heads",
    "hybrid_override_pattern": "state-space (Mamba) layers",
    "attn_layer_period": "state-space (Mamba) layers",
}
# Model types whose linear_attention layers are neither Gated DeltaNet nor
# Kimi Delta Attention (transformers' modelling code)
_OTHER_LINEAR = {
    "minimax": "MiniMax's lightning attention (MiniMaxLightningAttention)",
    "bailing_hybrid": "Ling's delta-rule attention "
    "(BailingHybridDeltaAttention, sized from num_attention_heads, "
    "head_dim and short_conv_kernel_size by its config class)",
}
# Model types whose cache follows a rule of the modelling code that no
# config key states.
_UNMODELLED_TYPES = {
    "mimo_v2_flash": "its sliding-window layers cache twice "
    "num_key_value_heads (transformers' MiMoV2FlashAttention)",
}
_STATE_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _state_dtype(cfg: dict) -> tuple[str, int]:
    """The recurrent state's dtype: ``mamba_ssm_dtype`` when the config
    writes it (Qwen3.5: ``"float32"``), else float32, the dtype Hugging
    Face's Gated DeltaNet and Kimi Delta Attention compute and keep it in.
    """
    dtype = cfg.get("mamba_ssm_dtype")
    if dtype is None:
        return "float32", 4
    if dtype not in _STATE_DTYPES:
        raise ValueError(
            f"config key mamba_ssm_dtype must be one of "
            f"{sorted(_STATE_DTYPES)}, got {dtype!r}"
        )
    return dtype, _STATE_DTYPES[dtype]


def _linear_state(cfg: dict) -> LinearState:
    """The state of a linear-attention layer: Kimi Linear's
    ``linear_attn_config`` (one head count for q, k and v, each with its own
    convolution), or Qwen3-Next's ``linear_*`` keys (q and k share the key
    heads; the convolution runs over q, k and v together)."""
    model_type = cfg.get("model_type")
    if model_type in _OTHER_LINEAR:
        raise ValueError(
            f"config model_type={model_type!r}: its linear_attention "
            f"layers are {_OTHER_LINEAR[model_type]}, whose state this "
            "calculator does not size"
        )
    dtype, nbytes = _state_dtype(cfg)
    lin = cfg.get("linear_attn_config")
    if lin is None and cfg.get("model_type") == "kimi_linear":
        lin = {  # transformers 5's spelling of the same numbers
            "num_heads": count(cfg, "linear_num_heads"),
            "head_dim": count(cfg, "linear_head_dim"),
            "short_conv_kernel_size": count(cfg, "linear_conv_kernel_dim"),
        }
    if lin is not None:
        h = count(lin, "num_heads")
        d = count(lin, "head_dim")
        k = count(lin, "short_conv_kernel_size")
        return LinearState(
            "Kimi Delta Attention", h, h, d, d, k, 3 * h * d, nbytes, dtype
        )
    n_k = count(cfg, "linear_num_key_heads")
    n_v = count(cfg, "linear_num_value_heads")
    d_k = count(cfg, "linear_key_head_dim")
    d_v = count(cfg, "linear_value_head_dim")
    k = count(cfg, "linear_conv_kernel_dim")
    if n_v % n_k:
        raise ValueError(
            f"config key linear_num_value_heads={n_v} must be a multiple "
            f"of linear_num_key_heads={n_k}"
        )
    conv_dim = 2 * n_k * d_k + n_v * d_v
    return LinearState(
        "Gated DeltaNet", n_k, n_v, d_k, d_v, k, conv_dim, nbytes, dtype
    )


def _indexer(cfg: dict, latent: dict) -> Indexer | None:
    keys = ("index_n_heads", "index_head_dim", "index_topk")
    if all(cfg.get(k) is None for k in keys):
        return None
    values = [count(cfg, k) for k in keys]
    if not latent:
        raise ValueError(
            "config has an indexer (index_n_heads, index_head_dim, "
            "index_topk) but no latent cache (kv_lora_rank)"
        )
    return Indexer(*values)


NOPE = {"rope_type": "none (NoPE)"}


def _rope_in_use(cfg: dict, types) -> dict | None:
    """:func:`rope_parameters`, with the layers that use no RoPE marked
    :data:`NOPE`: Llama 4's full layers beside its chunked ones, and Kimi
    Linear's MLA layers (``mla_use_nope``)."""
    rope = rope_parameters(cfg, types)
    kinds = set(types or (FULL,))
    if flag(cfg, "mla_use_nope"):
        rope = {k: NOPE for k in kinds - {LINEAR}}
    elif CHUNKED in kinds and FULL in kinds:
        rope = {**(rope or {}), FULL: NOPE}
    return rope


def from_hf_config(config, name: str | None = None) -> ModelConfig:
    """A :class:`ModelConfig` read from a Hugging Face ``config.json``.

    ``config`` is a path (to the file, or to a folder holding it) or the
    parsed dict. What it reads:

    * ``num_hidden_layers``, ``num_attention_heads``, ``hidden_size``;
      ``num_key_value_heads`` (absent: MHA; Falcon's ``multi_query`` and
      ``num_kv_heads`` too); ``head_dim`` (absent: ``hidden_size //
      num_attention_heads``); ``v_head_dim``, the values' (absent:
      ``head_dim``);
    * a multimodal config's ``text_config``, which holds the language
      model;
    * ``kv_lora_rank`` and ``qk_rope_head_dim`` (MLA): a latent cache;
      DeepSeek-V3.2's ``index_n_heads``, ``index_head_dim`` and
      ``index_topk``: the lightning indexer's own cache;
    * windows: ``sliding_window`` with ``layer_types``, or
      ``sliding_window_pattern`` (every n-th layer full), or the rule of the
      ``model_type`` (Mistral: every layer; Gemma 2, gpt-oss: every other);
      Qwen2's ``use_sliding_window: false`` means no window at all;
    * chunks (Llama 4): ``attention_chunk_size``, on the layers that use
      RoPE (``no_rope_layers[i] == 1``, or every layer but each
      ``no_rope_layer_interval``-th); the NoPE layers hold everything;
    * linear-attention layers: ``layer_types`` or
      ``full_attention_interval`` (Qwen3-Next, Qwen3.5) with the
      ``linear_*`` keys, or Kimi Linear's ``linear_attn_config``; the
      state's dtype from ``mamba_ssm_dtype`` (absent: float32);
    * RoPE in both spellings (:func:`rope_parameters`).

    Flags must be JSON booleans (``"false"`` is refused, not read as
    true). A missing or contradictory key raises a ``ValueError`` naming
    it; so does a feature that changes the cache in a way not modelled
    here. The result has ``n_params=None``: weights are not counted.
    """
    data, default_name, source = load_config(config)
    try:
        return _from_dict(data, name or default_name, source)
    except RecursionError:
        raise ValueError(
            "config is nested too deeply to be a config.json"
        ) from None


def _from_dict(data: dict, name: str, source: str) -> ModelConfig:
    cfg = language_model(data)
    for key, what in _UNMODELLED.items():
        if cfg.get(key):
            raise ValueError(
                f"config key {key}={cfg[key]!r} ({what}) changes the cache "
                "in a way this calculator does not model"
            )
    n_layers = count(cfg, "num_hidden_layers")
    n_heads = count(cfg, "num_attention_heads")
    d_model = count(cfg, "hidden_size")
    n_kv = kv_heads(cfg, n_heads)
    if cfg.get("model_type") in _UNMODELLED_TYPES:
        raise ValueError(
            f"config model_type={cfg['model_type']!r}: "
            f"{_UNMODELLED_TYPES[cfg['model_type']]}, which this "
            "calculator does not model"
        )
    d_head_v = count(cfg, "v_head_dim", required=False)  # None: head_dim
    latent = {}
    if cfg.get("kv_lora_rank") is not None:
        latent = dict(
            d_latent_kv=count(cfg, "kv_lora_rank"),
            d_rope=count(cfg, "qk_rope_head_dim"),
            d_latent_q=count(cfg, "q_lora_rank", required=False),
        )
        head_dim = count(cfg, "qk_nope_head_dim")
    elif cfg.get("qk_rope_head_dim") is not None:
        raise ValueError(
            "config has qk_rope_head_dim but no kv_lora_rank: a latent "
            "cache needs both"
        )
    else:
        head_dim = count(cfg, "head_dim", required=False)
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(
                    "config has no head_dim, and hidden_size="
                    f"{d_model} is not a multiple of "
                    f"num_attention_heads={n_heads}"
                )
            head_dim = d_model // n_heads
    types, chunk = layer_types(cfg, n_layers)
    window, types = windows(cfg, n_layers, types)
    linear = _linear_state(cfg) if types and LINEAR in types else None
    if types is not None and set(types) == {FULL}:
        types = None
    return ModelConfig(
        name,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        d_head_v=d_head_v,
        d_model=d_model,
        n_params=None,
        source=source,
        cite="",
        sliding_window=window,
        layer_types=types,
        attention_chunk_size=chunk if types and CHUNKED in types else None,
        linear=linear,
        indexer=_indexer(cfg, latent),
        rope=_rope_in_use(cfg, types),
        max_position_embeddings=count(
            cfg, "max_position_embeddings", required=False
        ),
        **latent,
    )
