"""The one reader of a Hugging Face ``config.json`` (appendix A1, chapter
10).

Both users of a config read it here: the KV calculator
(:func:`attn_np.costs.from_hf_config`, ``python -m attn_np.memory``) and
the layer builder (:func:`attn_np.attention_from_hf`). What it reads:

* the file itself (:func:`load_config`: a path, a folder or a dict; no
  duplicate keys, no ``NaN``) and a multimodal config's ``text_config``
  (:func:`language_model`);
* the older spellings of a key (:func:`get`, :func:`count`, :func:`flag`);
* what each layer is (:func:`layer_types`: ``layer_types``,
  ``full_attention_interval``, Kimi Linear's ``linear_attn_config``,
  Llama 4's ``no_rope_layers``) and where the windows are
  (:func:`windows`);
* RoPE in both spellings, per layer type (:func:`rope_parameters`).

It imports nothing of the library's layers: the layer types are Hugging
Face's strings, defined here.
"""

from __future__ import annotations

import json
import math
import os

# Hugging Face's layer types
SLIDING, FULL = "sliding_attention", "full_attention"
CHUNKED, LINEAR = "chunked_attention", "linear_attention"
LAYER_TYPES = (FULL, SLIDING, CHUNKED, LINEAR)
# model_type -> the one its configuration class reads (a multimodal
# model's text part)
MODEL_TYPE_ALIASES = {"gemma3": "gemma3_text", "llama4": "llama4_text"}


def alternate(n_layers: int, every: int) -> tuple[str, ...]:
    """Hugging Face's rule: layer ``i`` is full iff ``(i + 1) % every ==
    0``, a window layer otherwise (``every=2``: window, full, window...)."""
    return tuple(
        FULL if (i + 1) % every == 0 else SLIDING for i in range(n_layers)
    )


#: The largest config file read, and the most layers for which the reader
#: builds a per-layer list.
MAX_CONFIG_BYTES = 16 * 2**20
MAX_LAYERS = 100_000

# model_type -> which layers a sliding_window applies to when the config
# has neither layer_types nor sliding_window_pattern: Hugging Face's
# defaults in each model's configuration class.
_EVERY_LAYER = {"mistral", "mixtral", "ministral3"}
# ... and where use_sliding_window puts it on every layer (Qwen3-MoE's
# configuration class keeps sliding_window only when it is true)
_EVERY_LAYER_WHEN_USED = {"qwen3_moe"}
_PATTERN = {"gemma2": 2, "gpt_oss": 2, "gemma3": 6, "gemma3_text": 6}
_OFF_UNLESS_USED = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}
# Hybrids whose configuration class fills layer_types from
# full_attention_interval (default 4) when neither is written.
_HYBRID_INTERVAL = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}
# Llama 4: no_rope_layers from no_rope_layer_interval (default 4).
_CHUNKED_MODELS = {"llama4", "llama4_text"}
# Keys that must agree when written both at the top and in text_config.
_TEXT_KEYS = (
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "num_key_value_heads",
    "sliding_window",
    "layer_types",
    "kv_lora_rank",
    "attention_chunk_size",
    "linear_attn_config",
    "full_attention_interval",
    "index_head_dim",
)
# Older spellings of a key (GPT-2 style names, Gemma 2's first release).
_ALIASES = {
    "num_hidden_layers": ("n_layer",),
    "num_attention_heads": ("n_head",),
    "hidden_size": ("n_embd",),
    "sliding_window": ("sliding_window_size",),
}


def get(cfg: dict, key: str, *, required: bool = False):
    """``cfg[key]`` under any of its spellings (``None`` if absent); two
    spellings that disagree, or a required key that is absent, raise."""
    found = {k: cfg[k] for k in (key, *_ALIASES.get(key, ())) if k in cfg}
    values = list(found.values())
    if any(v != values[0] for v in values[1:]):
        got = ", ".join(f"{k}={v!r}" for k, v in found.items())
        raise ValueError(f"config is contradictory: {got}")
    value = next(iter(found.values()), None)
    if value is None and required:
        also = " or ".join(_ALIASES.get(key, ()))
        raise ValueError(
            f"config has no {key}" + (f" (nor {also})" if also else "")
        )
    return value


def count(
    cfg: dict, key: str, *, required: bool = True, minimum: int = 1
) -> int | None:
    value = get(cfg, key, required=required)
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


def number(
    cfg: dict, key: str, default=None, *, positive: bool = True
) -> float | None:
    """``cfg[key]`` as a float (``default`` if absent or null): a JSON
    number, finite (and positive unless ``positive=False``); a string such
    as ``"1e-6"`` or a boolean is refused, as ``transformers``' typed
    configuration classes refuse it."""
    value = get(cfg, key)
    if value is None:
        return default
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if ok:
        try:
            x = float(value)
        except OverflowError:
            ok = False
        else:
            ok = math.isfinite(x) and (x > 0 or not positive)
    if not ok:
        kind = "a positive" if positive else "a finite"
        raise ValueError(
            f"config key {key} must be {kind} number, got {value!r}"
        )
    return x


def _no_duplicates(pairs) -> dict:
    """A JSON object, refusing a key written twice (``json`` would keep
    the last one silently)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(
                f"config has the key {key!r} twice; JSON keeps the last "
                "one silently, so the file is ambiguous"
            )
        out[key] = value
    return out


def _no_constant(name: str):
    raise ValueError(f"config holds {name}, which is not a JSON number")


def parse_config_text(text: str, where: str = "config") -> dict:
    """The JSON object in ``text``: duplicate keys, ``NaN``/``Infinity``
    and nesting deeper than Python can parse are errors naming ``where``."""
    try:
        data = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
        )
    except json.JSONDecodeError as err:
        raise ValueError(f"{where} is not valid JSON: {err}") from None
    except RecursionError:
        raise ValueError(
            f"{where} is nested too deeply to be a config.json"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{where} must hold a JSON object")
    return data


def read_file(path: str) -> dict:
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(
            f"{path} is not a regular file (a config.json is one)"
        )
    with open(path, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(
            f"{path} is larger than {MAX_CONFIG_BYTES // 2**20} MiB; a "
            "config.json is a few KiB"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    return parse_config_text(text, path)


def load_config(config) -> tuple[dict, str, str]:
    """The config as a dict, its default name and its source."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        data = read_file(path)
        stem = os.path.basename(path)
        name = stem[:-5] if stem.endswith(".json") else stem
        if name == "config":
            parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
            name = parent or name
        source = path
    elif isinstance(config, dict):
        data = config
        name = str(config.get("_name_or_path") or "hf-config")
        source = "a config.json given as a dict"
    else:
        raise TypeError(
            "config must be a path to a config.json or a dict, got "
            f"{type(config).__name__}"
        )
    return data, name, source


def flag(cfg: dict, key: str) -> bool | None:
    """A JSON boolean (``None`` if absent): the string ``"false"`` is not
    false."""
    value = cfg.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise ValueError(
        f"config key {key} must be true or false (a JSON boolean), got "
        f"{value!r}"
    )


def get_object(cfg: dict, key: str) -> dict | None:
    """``cfg[key]``, a nested object of the config, or None if absent."""
    value = cfg.get(key)
    if value is not None and not isinstance(value, dict):
        raise ValueError(
            f"config key {key} must be an object, got {value!r}"
        )
    return value


def language_model(data: dict) -> dict:
    """The part of the config that describes the language model: the whole
    config, or its ``text_config`` (multimodal models)."""
    text = get_object(data, "text_config")
    if text is None:
        return data
    for key in _TEXT_KEYS:
        if key in data and key in text and data[key] != text[key]:
            raise ValueError(
                f"config is contradictory: {key}={data[key]!r} at the top "
                f"and {text[key]!r} in text_config"
            )
    text = dict(text)
    text.setdefault("model_type", data.get("model_type"))
    return text


def kv_heads(cfg: dict, n_heads: int) -> int:
    """``num_key_value_heads`` (absent: MHA), or Falcon's ``multi_query``,
    ``new_decoder_architecture`` and ``num_kv_heads``."""
    kv = count(cfg, "num_key_value_heads", required=False)
    if flag(cfg, "new_decoder_architecture"):
        falcon = count(cfg, "num_kv_heads", required=False) or n_heads
    elif flag(cfg, "multi_query"):
        falcon = 1
    else:
        falcon = count(cfg, "num_kv_heads", required=False)
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


def check_listed(cfg: dict, n_layers: int, why: str) -> None:
    if n_layers > MAX_LAYERS:
        raise ValueError(
            f"config key num_hidden_layers={n_layers} is more than "
            f"{MAX_LAYERS:,} layers, and {why} needs one entry per layer"
        )


def _explicit_types(cfg: dict, n_layers: int):
    types = cfg.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != n_layers:
        raise ValueError(
            f"config key layer_types must list {n_layers} layer types "
            f"(num_hidden_layers), got {types!r:.200}"
        )
    bad = sorted(set(map(str, types)) - set(LAYER_TYPES))
    if bad:
        raise ValueError(
            f"config key layer_types has {bad}: attn_np reads "
            f"{', '.join(map(repr, LAYER_TYPES))} only"
        )
    return tuple(types)


def _kimi_types(cfg: dict, n_layers: int):
    """Kimi Linear's ``linear_attn_config``: ``kda_layers`` and
    ``full_attn_layers``, numbered from 1 (Hugging Face's configuration
    class subtracts one)."""
    lin = get_object(cfg, "linear_attn_config")
    if lin is None:
        return None
    given = [k for k in ("full_attn_layers", "kda_layers") if k in lin]
    if not given:  # the layer types are written as layer_types
        return None
    types = [None] * n_layers
    for key, kind in (("full_attn_layers", FULL), ("kda_layers", LINEAR)):
        layers = lin.get(key)
        if not isinstance(layers, list):
            raise ValueError(
                f"config key linear_attn_config.{key} must list layer "
                f"numbers (from 1), got {layers!r}"
            )
        for i in layers:
            if isinstance(i, bool) or not isinstance(i, int):
                raise ValueError(
                    f"config key linear_attn_config.{key} holds {i!r}, "
                    "not a layer number"
                )
            if not 1 <= i <= n_layers or types[i - 1] is not None:
                raise ValueError(
                    f"config key linear_attn_config.{key} holds {i}: "
                    f"layers are numbered 1 to {n_layers}, each listed once"
                )
            types[i - 1] = kind
    if None in types:
        missing = [i + 1 for i, t in enumerate(types) if t is None]
        raise ValueError(
            "config key linear_attn_config lists neither as kda_layers "
            f"nor as full_attn_layers the layers {missing[:10]}"
        )
    return tuple(types)


def _interval_types(cfg: dict, n_layers: int, explicit):
    """Qwen3-Next and Qwen3.5: layer ``i`` is full iff ``(i + 1) %
    full_attention_interval == 0``, linear otherwise."""
    every = count(cfg, "full_attention_interval", required=False)
    if every is None:
        if explicit is not None or cfg.get("model_type") not in (
            _HYBRID_INTERVAL
        ):
            return None
        every = 4  # the configuration class's default
    check_listed(cfg, n_layers, "full_attention_interval")
    return tuple(
        FULL if (i + 1) % every == 0 else LINEAR for i in range(n_layers)
    )


def rope_flags(cfg: dict, n_layers: int):
    """Llama 4's ``no_rope_layers``: one 0 (NoPE) or 1 (RoPE) per layer,
    as Hugging Face's configuration class reads it: absent or empty (the
    released Scout file), the default, layer ``i`` NoPE iff ``(i + 1) %
    no_rope_layer_interval == 0`` (interval 4). ``None`` for a model
    whose config has neither the list nor Llama 4's rule."""
    flags = cfg.get("no_rope_layers")
    if flags is None or flags == []:
        if cfg.get("model_type") not in _CHUNKED_MODELS:
            return None
        every = count(cfg, "no_rope_layer_interval", required=False) or 4
        check_listed(cfg, n_layers, "no_rope_layer_interval")
        return tuple(int((i + 1) % every != 0) for i in range(n_layers))
    if not isinstance(flags, list) or len(flags) != n_layers:
        raise ValueError(
            "config key no_rope_layers must list a 0 or 1 for each of "
            f"the {n_layers} layers (num_hidden_layers), got "
            f"{flags!r:.200}"
        )
    if any(isinstance(f, bool) or f not in (0, 1) for f in flags):
        raise ValueError(
            "config key no_rope_layers must hold 0 (NoPE) or 1 (RoPE), "
            f"got {flags!r:.200}"
        )
    return tuple(flags)


def _chunked_types(cfg: dict, n_layers: int, explicit):
    """Llama 4: a chunked layer on every layer that uses RoPE. Hugging
    Face's ``no_rope_layers[i] == 1`` means layer ``i`` *uses* RoPE
    (chunked); 0 is a NoPE layer (full attention)."""
    chunk = count(cfg, "attention_chunk_size", required=False)
    written = cfg.get("no_rope_layers") not in (None, [])
    if chunk is None:
        # SmolLM3's no_rope_layers say which layers are NoPE, not chunked
        if written and cfg.get("model_type") in _CHUNKED_MODELS:
            raise ValueError(
                "config has no_rope_layers but no attention_chunk_size"
            )
        return None, None
    if explicit is not None and not written:
        return chunk, None
    uses_rope = rope_flags(cfg, n_layers)
    if uses_rope is None:
        raise ValueError(
            f"config has attention_chunk_size={chunk} but says neither "
            "which layers are chunked (layer_types, no_rope_layers) nor a "
            f"model_type whose rule is known ({sorted(_CHUNKED_MODELS)}); "
            f"got model_type={cfg.get('model_type')!r}"
        )
    return chunk, tuple(CHUNKED if f else FULL for f in uses_rope)


def layer_types(cfg: dict, n_layers: int):
    """``(layer_types, attention_chunk_size)`` from every key that says
    what a layer is; keys that disagree are an error."""
    explicit = _explicit_types(cfg, n_layers)
    derived = {"linear_attn_config": _kimi_types(cfg, n_layers)}
    derived["full_attention_interval"] = _interval_types(
        cfg,
        n_layers,
        explicit if derived["linear_attn_config"] is None else True,
    )
    chunk, derived["no_rope_layers"] = _chunked_types(
        cfg, n_layers, explicit
    )
    types, source = explicit, "layer_types"
    for key, value in derived.items():
        if value is None:
            continue
        if types is None:
            types, source = value, key
        elif types != value:
            raise ValueError(
                f"config is contradictory: {source} and {key} give "
                "different layer types"
            )
    if types is None and cfg.get("model_type") == "kimi_linear":
        raise ValueError(
            "config of model_type 'kimi_linear' says neither which layers "
            "are linear (linear_attn_config.kda_layers and "
            "full_attn_layers) nor layer_types"
        )
    if types is not None and CHUNKED in types and chunk is None:
        raise ValueError(
            "config key layer_types has 'chunked_attention' layers but "
            "there is no attention_chunk_size"
        )
    return types, chunk


def windows(cfg: dict, n_layers: int, types):
    """``(sliding_window, layer_types)`` as :class:`ModelConfig` takes
    them, ``types`` being what the other keys said (or ``None``)."""
    window = count(cfg, "sliding_window", required=False)
    pattern = count(cfg, "sliding_window_pattern", required=False)
    use = flag(cfg, "use_sliding_window")
    model_type = cfg.get("model_type")
    if types is not None and pattern is not None:
        check_listed(cfg, n_layers, "sliding_window_pattern")
        if types != alternate(n_layers, pattern):
            raise ValueError(
                "config is contradictory: layer_types does not follow "
                f"sliding_window_pattern={pattern}"
            )
    has_sliding = types is not None and SLIDING in types
    if use is False:  # Qwen2: a window size is written, and not used
        if has_sliding:
            raise ValueError(
                "config is contradictory: use_sliding_window is false but "
                f"layer_types has {SLIDING!r} layers"
            )
        return None, types
    if window is None:
        if has_sliding or pattern or use:
            raise ValueError(
                "config asks for window layers (layer_types, "
                "sliding_window_pattern or use_sliding_window) but has "
                "no sliding_window"
            )
        return None, types
    if types is not None:
        if use and not has_sliding:
            raise ValueError(
                "config is contradictory: use_sliding_window is true but "
                f"no layer is {SLIDING!r}"
            )
        return (window if has_sliding else None), types
    if pattern is not None:
        check_listed(cfg, n_layers, "sliding_window_pattern")
        return window, alternate(n_layers, pattern)
    if use is True and model_type in _EVERY_LAYER_WHEN_USED:
        return window, None
    if use is True:  # Qwen2: layers from max_window_layers on
        first = count(cfg, "max_window_layers", minimum=0)
        check_listed(cfg, n_layers, "max_window_layers")
        return window, tuple(
            SLIDING if i >= first else FULL for i in range(n_layers)
        )
    if model_type in _PATTERN:
        check_listed(cfg, n_layers, f"{model_type}'s window pattern")
        return window, alternate(n_layers, _PATTERN[model_type])
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


_ROPE_KEYS = ("rope_theta", "rope_scaling", "partial_rotary_factor")
# the numbers of a RoPE scaling (Hugging Face's rope_type functions)
_ROPE_NUMBERS = (
    "factor",
    "original_max_position_embeddings",
    "low_freq_factor",
    "high_freq_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "attention_factor",
)


def _check_rope(params: dict, where: str) -> dict:
    if not isinstance(params, dict):
        raise ValueError(f"config key {where} must be an object")
    out = dict(params)
    if "type" in out and "rope_type" not in out:
        out["rope_type"] = out.pop("type")
    theta = out.get("rope_theta")
    if theta is not None and (
        isinstance(theta, bool)
        or not isinstance(theta, (int, float))
        or not (math.isfinite(theta) and theta > 0)
    ):
        raise ValueError(
            f"config key {where}.rope_theta must be a positive number, got "
            f"{theta!r}"
        )
    f = out.get("partial_rotary_factor")
    if f is not None and (
        isinstance(f, bool)
        or not isinstance(f, (int, float))
        or not 0 < f <= 1
    ):
        raise ValueError(
            f"config key {where}.partial_rotary_factor must be in (0, 1], "
            f"got {f!r}"
        )
    for key in _ROPE_NUMBERS:
        value = out.get(key)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise ValueError(
                f"config key {where}.{key} must be a number, got {value!r}"
            )
    kind = out.setdefault("rope_type", "default")
    if not isinstance(kind, str):
        raise ValueError(
            f"config key {where}.rope_type must be a string, got {kind!r}"
        )
    return out


def rope_parameters(cfg: dict, layer_types=None) -> dict | None:
    """The rotary embedding's parameters per layer type, ``{layer_type:
    {"rope_type": ..., "rope_theta": ..., ...}}``, read from either of
    Hugging Face's spellings:

    * older files: ``rope_theta``, ``rope_scaling`` (its ``type`` or
      ``rope_type`` and the scaling keys) and ``partial_rotary_factor`` at
      the top level; Gemma 3's ``rope_local_base_freq`` is the base of the
      sliding layers, whose RoPE is not scaled;
    * ``transformers`` 5: ``rope_parameters``, one dict, or one per layer
      type (Gemma 3: ``full_attention`` and ``sliding_attention``).

    A key written in both spellings with two values is an error. ``None``
    when the config says nothing of RoPE.
    """
    kinds = sorted(set(layer_types or (FULL,)) - {LINEAR})
    new = get_object(cfg, "rope_parameters")
    if new is not None:
        if new and set(new) <= set(LAYER_TYPES):
            per = {
                k: _check_rope(v, f"rope_parameters.{k}")
                for k, v in new.items()
            }
        else:
            one = _check_rope(new, "rope_parameters")
            per = {k: one for k in kinds}
    old: dict = {}
    if cfg.get("rope_theta") is not None:
        old["rope_theta"] = cfg["rope_theta"]
    scaling = get_object(cfg, "rope_scaling")
    if scaling is not None:
        old.update(scaling)
    if cfg.get("partial_rotary_factor") is not None:
        old["partial_rotary_factor"] = cfg["partial_rotary_factor"]
    if not old:
        return per if new is not None else None
    old = _check_rope(old, "rope_scaling")
    old_per = {k: old for k in kinds}
    local = cfg.get("rope_local_base_freq")
    if local is None and str(cfg.get("model_type")).startswith("gemma3"):
        local = 10_000.0  # Gemma3TextConfig's default for sliding layers
    if local is not None and SLIDING in kinds:
        sliding = _check_rope({"rope_theta": local}, "rope_local_base_freq")
        if "partial_rotary_factor" in old:
            sliding["partial_rotary_factor"] = old["partial_rotary_factor"]
        old_per[SLIDING] = sliding
    if new is None:
        return old_per
    for kind, params in per.items():
        for key, value in old_per.get(kind, {}).items():
            if key == "rope_type" and value == "default":
                continue
            if key in params and params[key] != value:
                raise ValueError(
                    f"config is contradictory: {key}={value!r} at the top "
                    f"level and {params[key]!r} in rope_parameters"
                )
    return per


# MiMoV2FlashConfig's sizes for a file that writes none
_MIMO_SIZES = {
    "head_dim": 192,
    "v_head_dim": 128,
    "num_key_value_heads": 4,
    "sliding_window": 129,
}


def _mimo_config(cfg: dict) -> dict:
    """``cfg`` as MiMo-V2-Flash's configuration class reads it: its
    sizes where the file writes none (head_dim 192, v_head_dim 128, 4
    key/value heads, window 129); ``sliding_window = sliding_window_size
    + 1`` when the older key is written (its window counts the query
    too); ``layer_types`` by its rule when absent (layer 0 and each layer
    ``i`` with ``(i + 1) % 6 == 0`` full, the others sliding)."""
    out = {k: v for k, v in cfg.items() if k != "sliding_window_size"}
    for key, value in _MIMO_SIZES.items():
        out.setdefault(key, value)
        count(out, key, required=True)  # null: refused by name
    if cfg.get("sliding_window_size") is not None:
        out["sliding_window"] = count(cfg, "sliding_window_size") + 1
    if out.get("layer_types") is None:
        n = count(cfg, "num_hidden_layers")
        check_listed(cfg, n, "mimo_v2_flash's layer rule")
        out["layer_types"] = [
            FULL if i == 0 or (i + 1) % 6 == 0 else SLIDING for i in range(n)
        ]
    return out


def _mla_sizes(cfg: dict) -> tuple[tuple, dict]:
    """DeepSeek's multi-head latent attention sizes from ``cfg``:
    ``(args, kwargs)`` of :class:`~attn_np.MultiHeadLatentAttention`'s
    ``(d_model, n_heads, d_head, d_latent_kv, d_rope)`` and its
    ``d_latent_q`` (None without ``q_lora_rank``), ``d_head_v`` and the
    latent norms every family of it keeps."""
    q_lora = cfg.get("q_lora_rank")
    args = (
        count(cfg, "hidden_size"),
        count(cfg, "num_attention_heads"),
        count(cfg, "qk_nope_head_dim"),
        count(cfg, "kv_lora_rank"),
        count(cfg, "qk_rope_head_dim"),
    )
    kw = dict(
        d_latent_q=None if q_lora is None else count(cfg, "q_lora_rank"),
        d_head_v=count(cfg, "v_head_dim"),
        latent_norm=True,
    )
    return args, kw
