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
    SLIDING,
    _mimo_config,
    check_listed,
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
from ..hf.config import LAYER_TYPES as _LAYER_TYPES
from .model import NO_CACHE, Indexer, LinearState, ModelConfig

# What each layer of a hybrid is, in the configs that say it with a
# pattern (Nemotron-H: hybrid_override_pattern, or transformers 5's
# layers_block_type) and what its cache keeps (transformers 5.24's
# remap: M is a Mamba-2 layer, * attention, - an MLP, E an MoE block).
_PATTERN_TYPES = {"M": LINEAR, "*": FULL, "-": NO_CACHE, "E": NO_CACHE}
_BLOCK_TYPES = {
    "mamba": LINEAR,
    "linear_attention": LINEAR,
    "attention": FULL,
    "full_attention": FULL,
    "mlp": NO_CACHE,
    "moe": NO_CACHE,
}
_STATE_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Model types whose layers share another layer's cache
# (num_kv_shared_layers), and Gemma 4's full layers' own heads.
_GEMMA4 = {"gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text"}
_SHARED_KV = {"gemma3n", "gemma3n_text", *_GEMMA4}


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


def _mamba_state(cfg: dict) -> LinearState:
    """A Mamba layer's state as transformers 5.24 allocates it.

    Mamba-2 (Nemotron-H, ``mamba2``): a convolution over ``intermediate +
    2 * n_groups * state`` channels (``conv_kernel`` positions, the
    cache's dtype) and ``heads`` states of ``head_dim x state``
    (``mamba_ssm_cache_dtype``, float32 by default). Jamba's Mamba:
    ``expand * hidden_size`` channels, each a convolution of
    ``mamba_d_conv`` and a float32 state of ``mamba_d_state``."""
    if cfg.get("model_type") == "jamba":
        d = count(cfg, "mamba_expand") * count(cfg, "hidden_size")
        state = count(cfg, "mamba_d_state")
        k = count(cfg, "mamba_d_conv")
        return LinearState("Mamba", d, d, 1, state, k, d, 4, "float32")
    if cfg.get("model_type") == "mamba2":
        heads, head = count(cfg, "num_heads"), count(cfg, "head_dim")
        state = count(cfg, "state_size")
        dtype = "float32"
    else:
        heads = count(cfg, "mamba_num_heads")
        head = count(cfg, "mamba_head_dim")
        state = count(cfg, "ssm_state_size")
        dtype = cfg.get("mamba_ssm_cache_dtype", "float32")
    if dtype not in _STATE_DTYPES:
        raise ValueError(
            f"config key mamba_ssm_cache_dtype must be one of "
            f"{sorted(_STATE_DTYPES)}, got {dtype!r}"
        )
    groups = count(cfg, "n_groups")
    k = count(cfg, "conv_kernel")
    conv_dim = heads * head + 2 * groups * state
    return LinearState(
        "Mamba-2", groups, heads, head, state, k, conv_dim,
        _STATE_DTYPES[dtype], dtype,
    )  # fmt: skip


def _linear_state(cfg: dict) -> LinearState:
    """The state of a linear-attention layer: Kimi Linear's
    ``linear_attn_config`` (one head count for q, k and v, each with its own
    convolution), Ling's (``bailing_hybrid``: the same, from
    ``num_attention_heads``, ``head_dim`` and ``short_conv_kernel_size``),
    MiniMax's lightning attention (a ``head_dim x head_dim`` state per
    head, in the cache's dtype, no convolution), a Mamba layer
    (:func:`_mamba_state`), or Qwen3-Next's ``linear_*`` keys (q and k
    share the key heads; the convolution runs over q, k and v together)."""
    model_type = cfg.get("model_type")
    if model_type in ("nemotron_h", "jamba", "mamba2"):
        return _mamba_state(cfg)
    if model_type == "minimax":
        h = count(cfg, "num_attention_heads")
        d = count(cfg, "head_dim", required=False)
        d = d or count(cfg, "hidden_size") // h
        return LinearState("lightning attention", h, h, d, d, 0, 0, None, "")
    dtype, nbytes = _state_dtype(cfg)
    lin = cfg.get("linear_attn_config")
    if lin is None and model_type == "bailing_hybrid":
        lin = {  # BailingHybridConfig: the linear heads are the model's
            "num_heads": count(cfg, "num_attention_heads"),
            "head_dim": count(cfg, "linear_head_dim", required=False)
            or count(cfg, "head_dim"),
            "short_conv_kernel_size": count(cfg, "short_conv_kernel_size"),
        }
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
    Linear's MLA layers (``mla_use_nope``), and the layer types whose
    entry of ``rope_parameters`` is ``null`` (Beam's full layers, Cohere
    Compass's)."""
    raw = cfg.get("rope_parameters")
    nope = set()
    if isinstance(raw, dict) and raw and set(raw) <= set(_LAYER_TYPES):
        nope = {k for k, v in raw.items() if v is None}
        kept = {k: v for k, v in raw.items() if v is not None}
        cfg = {**cfg, "rope_parameters": kept or None}
    rope = rope_parameters(cfg, types)
    if nope:
        rope = {**(rope or {}), **{k: NOPE for k in nope}}
    kinds = set(types or (FULL,))
    if flag(cfg, "mla_use_nope"):
        rope = {k: NOPE for k in kinds - {LINEAR}}
    elif CHUNKED in kinds and FULL in kinds:
        rope = {**(rope or {}), FULL: NOPE}
    return rope


def _plan_types(cfg: dict) -> tuple[int, tuple] | None:
    """``(n_layers, layer_types)`` for the configs that say which layers
    are Mamba or MLP layers, or MiniMax's ``attn_type_list``; ``None``
    for the others (:func:`layer_types` reads them)."""
    model_type = cfg.get("model_type")
    if model_type == "nemotron_h":
        pattern = cfg.get("hybrid_override_pattern")
        key, table = "hybrid_override_pattern", _PATTERN_TYPES
        if pattern is None:
            key, table = "layers_block_type", _BLOCK_TYPES
            pattern = cfg.get(key, cfg.get("layer_types"))
        if not isinstance(pattern, (str, list)) or not pattern:
            raise ValueError(
                "config of model_type 'nemotron_h' has neither "
                "hybrid_override_pattern nor layers_block_type"
            )
        bad = sorted({str(p) for p in pattern} - set(table))
        if bad:
            raise ValueError(
                f"config key {key}={pattern!r:.120} has {bad}: the "
                f"calculator reads {sorted(table)}"
            )
        return len(pattern), tuple(table[p] for p in pattern)
    if model_type == "jamba" or cfg.get("attn_layer_period") is not None:
        n = count(cfg, "num_hidden_layers")
        every = count(cfg, "attn_layer_period")
        offset = count(cfg, "attn_layer_offset", minimum=0)
        if offset >= every:
            raise ValueError(
                f"config key attn_layer_offset={offset} must be less than "
                f"attn_layer_period={every}"
            )
        check_listed(cfg, n, "attn_layer_period")
        return n, tuple(
            FULL if i % every == offset else LINEAR for i in range(n)
        )
    if model_type == "mamba2":
        return count(cfg, "num_hidden_layers"), None
    n = count(cfg, "num_hidden_layers")
    listed = cfg.get("attn_type_list")
    if listed is not None:
        if (
            not isinstance(listed, list)
            or len(listed) != n
            or any(isinstance(t, bool) or t not in (0, 1) for t in listed)
        ):
            raise ValueError(
                "config key attn_type_list must hold a 0 (lightning) or 1 "
                f"(softmax) for each of the {n} layers, got {listed!r:.120}"
            )
        types = tuple(FULL if t else LINEAR for t in listed)
        if cfg.get("layer_types") not in (None, list(types)):
            raise ValueError(
                "config is contradictory: attn_type_list and layer_types "
                "give different layer types"
            )
        return n, types
    if model_type == "minimax" and cfg.get("layer_types") is None:
        # MiniMaxConfig's default: full, linear, full, linear...
        return n, tuple(FULL if i % 2 == 0 else LINEAR for i in range(n))
    if model_type == "bailing_hybrid" and cfg.get("layer_types") is None:
        every = count(cfg, "layer_group_size", required=False) or 6
        check_listed(cfg, n, "layer_group_size")
        return n, tuple(
            FULL if (i + 1) % every == 0 else LINEAR for i in range(n)
        )
    return None


def _shared_kv(cfg: dict, types, n_layers: int):
    """Gemma 3n's and Gemma 4's ``num_kv_shared_layers``: the last N layers
    read the cache of the last earlier layer of their type and keep none."""
    shared = count(cfg, "num_kv_shared_layers", required=False, minimum=0)
    if not shared:
        return types
    if cfg.get("model_type") not in _SHARED_KV:
        raise ValueError(
            f"config key num_kv_shared_layers={shared} on model_type "
            f"{cfg.get('model_type')!r}: the calculator knows which "
            f"layers share a cache for {sorted(_SHARED_KV)} only"
        )
    types = types or (FULL,) * n_layers
    first = n_layers - shared
    if first < 0 or set(types[first:]) - set(types[:first]):
        raise ValueError(
            f"config key num_kv_shared_layers={shared}: each shared layer "
            "needs an earlier layer of its type to read from, among "
            f"{n_layers} layers"
        )
    return types[:first] + (NO_CACHE,) * shared


def _layer_kv(cfg: dict, types, n_kv: int, d_k: int, d_v) -> tuple:
    """Layer types whose key/value heads differ from the model's:
    ``per_layer_config`` (transformers 5's overrides), Gemma 4's full
    layers (``global_head_dim``, and ``num_global_key_value_heads`` when
    ``attention_k_eq_v``) and MiMo-V2-Flash's window layers (twice
    ``num_key_value_heads``, as MiMoV2FlashAttention builds them)."""
    d_v = d_v or d_k
    rows = {}
    model_type = cfg.get("model_type")
    per = cfg.get("per_layer_config")
    if per is not None:
        if not isinstance(per, dict):
            raise ValueError(
                f"config key per_layer_config must be an object, got "
                f"{per!r:.120}"
            )
        for i, over in per.items():
            ok = str(i).isdigit() and int(i) < len(types or ())
            if not ok or not isinstance(over, dict):
                raise ValueError(
                    f"config key per_layer_config has {i!r}: {over!r:.80}; "
                    "the calculator reads layer numbers of layer_types"
                )
            extra = set(over) - {"head_dim", "num_key_value_heads"}
            if extra:
                raise ValueError(
                    f"config key per_layer_config.{i} sets "
                    f"{sorted(extra)}, which the calculator does not size"
                )
            kind = types[int(i)]
            d = count(over, "head_dim", required=False) or d_k
            row = (count(over, "num_key_value_heads", required=False)
                   or n_kv, d, d)  # fmt: skip
            if rows.setdefault(kind, row) != row:
                raise ValueError(
                    "config key per_layer_config gives the layers of "
                    f"type {kind!r} different heads"
                )
    elif model_type in _GEMMA4 and types and FULL in types:
        d = count(cfg, "global_head_dim", required=False) or 512
        heads = n_kv
        if flag(cfg, "attention_k_eq_v"):
            heads = (
                count(cfg, "num_global_key_value_heads", required=False)
                or n_kv
            )
        rows[FULL] = (heads, d, d)
    if model_type == "mimo_v2_flash" and types and SLIDING in types:
        swa = (2 * n_kv, d_k, d_v)
        written = tuple(
            cfg.get(k, v)
            for k, v in zip(
                (
                    "swa_num_key_value_heads",
                    "swa_head_dim",
                    "swa_v_head_dim",
                ),
                swa,
            )
        )
        if written != swa:
            raise ValueError(
                "config keys swa_num_key_value_heads, swa_head_dim, "
                f"swa_v_head_dim say {written}; transformers 5.24's "
                f"MiMoV2FlashAttention builds {swa} (twice "
                "num_key_value_heads)"
            )
        rows[SLIDING] = swa
    rows = {k: v for k, v in rows.items() if v != (n_kv, d_k, d_v)}
    return tuple((k, *v) for k, v in sorted(rows.items())) or None


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
      state's dtype from ``mamba_ssm_dtype`` (absent: float32); Ling's
      ``bailing_hybrid``, MiniMax's lightning layers (``layer_types`` or
      ``attn_type_list``);
    * state-space layers: Nemotron-H's ``hybrid_override_pattern`` (or
      ``layers_block_type``), Jamba's ``attn_layer_period`` and
      ``attn_layer_offset``, a whole ``mamba2`` model; MLP and MoE layers
      keep no cache;
    * layers that keep none of their own: Gemma 3n's and Gemma 4's
      ``num_kv_shared_layers``; layer types with their own heads: Gemma 4's
      ``global_head_dim`` and ``num_global_key_value_heads``, transformers
      5's ``per_layer_config``, MiMo-V2-Flash's window layers (twice
      ``num_key_value_heads``; its class's sizes and layer rule where a
      file writes none, and its window ``sliding_window_size + 1``);
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


def _head_dim(cfg, d_model, n_heads) -> tuple[int, dict]:
    """``(head_dim, latent)``: MLA's ``qk_nope_head_dim`` and its latent
    sizes, or ``head_dim`` (default ``hidden_size / heads``) and ``{}``."""
    if cfg.get("kv_lora_rank") is not None:
        latent = dict(
            d_latent_kv=count(cfg, "kv_lora_rank"),
            d_rope=count(cfg, "qk_rope_head_dim"),
            d_latent_q=count(cfg, "q_lora_rank", required=False),
        )
        return count(cfg, "qk_nope_head_dim"), latent
    if cfg.get("qk_rope_head_dim") is not None:
        raise ValueError(
            "config has qk_rope_head_dim but no kv_lora_rank: a latent "
            "cache needs both"
        )
    head_dim = count(cfg, "head_dim", required=False)
    if head_dim is None:
        if d_model % n_heads:
            raise ValueError(
                "config has no head_dim, and hidden_size="
                f"{d_model} is not a multiple of "
                f"num_attention_heads={n_heads}"
            )
        head_dim = d_model // n_heads
    return head_dim, {}


def _from_dict(data: dict, name: str, source: str) -> ModelConfig:
    cfg = language_model(data)
    if cfg.get("model_type") == "mimo_v2_flash":  # its class's rules
        cfg = _mimo_config(cfg)
    plan = _plan_types(cfg)
    if plan is not None:
        n_layers, types = plan
        written = count(cfg, "num_hidden_layers", required=False)
        if written not in (None, n_layers):
            raise ValueError(
                f"config is contradictory: num_hidden_layers={written} "
                f"but its layer pattern lists {n_layers} layers"
            )
        if cfg.get("sliding_window") is not None:
            raise ValueError(
                f"config key sliding_window={cfg['sliding_window']!r} on "
                f"a {cfg.get('model_type')!r} model: which of its layers "
                "it applies to is not modelled"
            )
    else:
        n_layers = count(cfg, "num_hidden_layers")
    if cfg.get("model_type") == "mamba2":
        # no attention at all: every layer a Mamba-2 state
        n_heads = n_kv = count(cfg, "num_heads")
        d_model = count(cfg, "hidden_size")
    else:
        n_heads = count(cfg, "num_attention_heads")
        d_model = count(cfg, "hidden_size")
        n_kv = kv_heads(cfg, n_heads)
    d_head_v = count(cfg, "v_head_dim", required=False)  # None: head_dim
    head_dim, latent = _head_dim(cfg, d_model, n_heads)
    if plan is None:
        types, chunk = layer_types(cfg, n_layers)
        window, types = windows(cfg, n_layers, types)
    else:
        types, chunk, window = plan[1], None, None
        if types is None:  # mamba2
            types = (LINEAR,) * n_layers
    layer_kv = _layer_kv(cfg, types, n_kv, head_dim, d_head_v)
    types = _shared_kv(cfg, types, n_layers)
    if types is not None and SLIDING not in types:
        window = None
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
        layer_kv=None if latent else layer_kv,
        max_position_embeddings=count(
            cfg, "max_position_embeddings", required=False
        ),
        **latent,
    )
