"""Reading a Hugging Face ``config.json`` into a
:class:`~attn_np.costs.model.ModelConfig` (appendix A1).

:func:`from_hf_config` is the reader; ``python -m attn_np.memory`` is its
command line.
"""

from __future__ import annotations

import json
import os

from .model import FULL, SLIDING, ModelConfig, _alternate

# Keys of configs whose cache this calculator does not model: it refuses
# them rather than return a wrong number.
_UNMODELLED = {
    "attention_chunk_size": "chunked attention (Llama 4)",
    "num_kv_shared_layers": "layers that share another layer's cache",
    "global_head_dim": "full layers with their own head dimension",
    "num_global_key_value_heads": "full layers with their own kv heads",
    "linear_attn_config": "linear-attention layers",
    "hybrid_override_pattern": "state-space (Mamba) layers",
    "attn_layer_period": "state-space (Mamba) layers",
}
# model_type -> which layers a sliding_window applies to when the config
# has neither layer_types nor sliding_window_pattern: Hugging Face's
# defaults in each model's configuration class.
_EVERY_LAYER = {"mistral", "mixtral"}
_PATTERN = {"gemma2": 2, "gpt_oss": 2, "gemma3": 6, "gemma3_text": 6}
_OFF_UNLESS_USED = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}
# Older spellings of a key (GPT-2 style names, Gemma 2's first release).
_ALIASES = {
    "num_hidden_layers": ("n_layer",),
    "num_attention_heads": ("n_head",),
    "hidden_size": ("n_embd",),
    "sliding_window": ("sliding_window_size",),
}


def _get(cfg: dict, key: str, *, required: bool = False):
    """``cfg[key]`` under any of its spellings (``None`` if absent); two
    spellings that disagree, or a required key that is absent, raise."""
    found = {k: cfg[k] for k in (key, *_ALIASES.get(key, ())) if k in cfg}
    values = {json.dumps(v) for v in found.values()}
    if len(values) > 1:
        got = ", ".join(f"{k}={v!r}" for k, v in found.items())
        raise ValueError(f"config is contradictory: {got}")
    value = next(iter(found.values()), None)
    if value is None and required:
        also = " or ".join(_ALIASES.get(key, ()))
        raise ValueError(
            f"config has no {key}" + (f" (nor {also})" if also else "")
        )
    return value


def _count(
    cfg: dict, key: str, *, required: bool = True, minimum: int = 1
) -> int | None:
    value = _get(cfg, key, required=required)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
    ):
        kind = "a non-negative" if minimum == 0 else "a positive"
        raise ValueError(
            f"config key {key} must be {kind} integer, got {value!r}"
        )
    return value


def _load(config) -> tuple[dict, str, str]:
    """The config as a dict, its default name and its source."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None
        stem = os.path.basename(path)
        name = stem[:-5] if stem.endswith(".json") else stem
        if name == "config":
            parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
            name = parent or name
        source = where = path
    elif isinstance(config, dict):
        data, where = config, "config"
        name = str(config.get("_name_or_path") or "hf-config")
        source = "a config.json given as a dict"
    else:
        raise ValueError(
            "config must be a path to a config.json or a dict, got "
            f"{type(config).__name__}"
        )
    if not isinstance(data, dict):
        raise ValueError(f"{where} must hold a JSON object")
    return data, name, source


def _language_model(data: dict) -> dict:
    """The part of the config that describes the language model: the whole
    config, or its ``text_config`` (multimodal models)."""
    text = data.get("text_config")
    if text is None:
        return data
    if not isinstance(text, dict):
        raise ValueError(
            f"config key text_config must be an object, got {text!r}"
        )
    for key in (
        "num_hidden_layers",
        "num_attention_heads",
        "head_dim",
        "num_key_value_heads",
        "sliding_window",
        "layer_types",
        "kv_lora_rank",
    ):
        if key in data and key in text and data[key] != text[key]:
            raise ValueError(
                f"config is contradictory: {key}={data[key]!r} at the top "
                f"and {text[key]!r} in text_config"
            )
    text = dict(text)
    text.setdefault("model_type", data.get("model_type"))
    return text


def _kv_heads(cfg: dict, n_heads: int) -> int:
    """``num_key_value_heads`` (absent: MHA), or Falcon's ``multi_query``,
    ``new_decoder_architecture`` and ``num_kv_heads``."""
    kv = _count(cfg, "num_key_value_heads", required=False)
    if cfg.get("new_decoder_architecture"):
        falcon = _count(cfg, "num_kv_heads", required=False) or n_heads
    elif cfg.get("multi_query"):
        falcon = 1
    else:
        falcon = _count(cfg, "num_kv_heads", required=False)
    if kv is not None and falcon is not None and kv != falcon:
        raise ValueError(
            f"config is contradictory: num_key_value_heads={kv} but "
            "multi_query, new_decoder_architecture and num_kv_heads say "
            f"{falcon}"
        )
    kv = kv or falcon or n_heads
    if n_heads % kv:
        raise ValueError(
            f"num_attention_heads={n_heads} is not a multiple of the "
            f"number of key/value heads, {kv}"
        )
    return kv


def _windows(cfg: dict, n_layers: int):
    """``(sliding_window, layer_types)`` as :class:`ModelConfig` takes
    them."""
    window = _count(cfg, "sliding_window", required=False)
    types = cfg.get("layer_types")
    pattern = _count(cfg, "sliding_window_pattern", required=False)
    use = cfg.get("use_sliding_window")
    model_type = cfg.get("model_type")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise ValueError(
                f"config key layer_types must list {n_layers} layer types "
                f"(num_hidden_layers), got {types!r}"
            )
        bad = sorted(set(map(str, types)) - {SLIDING, FULL})
        if bad:
            raise ValueError(
                f"config key layer_types has {bad}: this calculator "
                f"knows {SLIDING!r} and {FULL!r} only"
            )
        types = tuple(types)
        if pattern is not None and types != _alternate(n_layers, pattern):
            raise ValueError(
                "config is contradictory: layer_types does not follow "
                f"sliding_window_pattern={pattern}"
            )
    if use is False:  # Qwen2: a window size is written, and not used
        if types is not None and SLIDING in types:
            raise ValueError(
                "config is contradictory: use_sliding_window is false but "
                f"layer_types has {SLIDING!r} layers"
            )
        return None, None
    if window is None:
        if (types is not None and SLIDING in types) or pattern or use:
            raise ValueError(
                "config asks for window layers (layer_types, "
                "sliding_window_pattern or use_sliding_window) but has "
                "no sliding_window"
            )
        return None, None
    if types is not None:
        return window, types
    if pattern is not None:
        return window, _alternate(n_layers, pattern)
    if use is True:  # Qwen2: layers from max_window_layers on
        first = _count(cfg, "max_window_layers", minimum=0)
        return window, tuple(
            SLIDING if i >= first else FULL for i in range(n_layers)
        )
    if model_type in _PATTERN:
        return window, _alternate(n_layers, _PATTERN[model_type])
    if model_type in _EVERY_LAYER:
        return window, None
    if model_type in _OFF_UNLESS_USED:
        return None, None
    raise ValueError(
        f"config has sliding_window={window} but says neither which "
        "layers use it (layer_types, sliding_window_pattern, "
        "use_sliding_window) nor a model_type whose rule is known "
        f"({', '.join(sorted(_EVERY_LAYER | set(_PATTERN)))}); got "
        f"model_type={model_type!r}"
    )


def from_hf_config(config, name: str | None = None) -> ModelConfig:
    """A :class:`ModelConfig` read from a Hugging Face ``config.json``.

    ``config`` is a path (to the file, or to a folder holding it) or the
    parsed dict. What it reads:

    * ``num_hidden_layers``, ``num_attention_heads``, ``hidden_size``;
      ``num_key_value_heads`` (absent: MHA; Falcon's ``multi_query`` and
      ``num_kv_heads`` too); ``head_dim`` (absent: ``hidden_size //
      num_attention_heads``);
    * a multimodal config's ``text_config``, which holds the language
      model;
    * ``kv_lora_rank`` and ``qk_rope_head_dim`` (MLA): a latent cache;
    * windows: ``sliding_window`` with ``layer_types``, or
      ``sliding_window_pattern`` (every n-th layer full), or the rule of the
      ``model_type`` (Mistral: every layer; Gemma 2, gpt-oss: every other);
      Qwen2's ``use_sliding_window: false`` means no window at all.

    A missing or contradictory key raises a ``ValueError`` naming it; so
    does a feature that changes the cache in a way not modelled here. The
    result has ``n_params=None``: weights are not counted.
    """
    data, default_name, source = _load(config)
    cfg = _language_model(data)
    for key, what in _UNMODELLED.items():
        if cfg.get(key):
            raise ValueError(
                f"config key {key}={cfg[key]!r} ({what}) changes the cache "
                "in a way this calculator does not model"
            )
    n_layers = _count(cfg, "num_hidden_layers")
    n_heads = _count(cfg, "num_attention_heads")
    d_model = _count(cfg, "hidden_size")
    n_kv = _kv_heads(cfg, n_heads)
    latent = {}
    if cfg.get("kv_lora_rank") is not None:
        latent = dict(
            d_latent_kv=_count(cfg, "kv_lora_rank"),
            d_rope=_count(cfg, "qk_rope_head_dim"),
            d_latent_q=_count(cfg, "q_lora_rank", required=False),
            d_head_v=_count(cfg, "v_head_dim", required=False),
        )
        head_dim = _count(cfg, "qk_nope_head_dim")
    elif cfg.get("qk_rope_head_dim") is not None:
        raise ValueError(
            "config has qk_rope_head_dim but no kv_lora_rank: a latent "
            "cache needs both"
        )
    else:
        head_dim = _count(cfg, "head_dim", required=False)
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(
                    "config has no head_dim, and hidden_size="
                    f"{d_model} is not a multiple of "
                    f"num_attention_heads={n_heads}"
                )
            head_dim = d_model // n_heads
    window, types = _windows(cfg, n_layers)
    return ModelConfig(
        name or default_name,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        d_model=d_model,
        n_params=None,
        source=source,
        cite="",
        sliding_window=window,
        layer_types=types,
        **latent,
    )
