"""What each Hugging Face family's attention layer is (chapter 10).

The plain decoder is Llama's layer: q/k/v/o projections, RoPE from the
config, a window where the layer type says so (:func:`plain_decoder`).
Every other q/k/v/o family is a difference from it, one small function
in :data:`FAMILIES`, the way ``transformers``' ``modular_*.py`` files
define a model as a diff of another (Qwen2: ``biases = q, k, v``; Qwen3:
``qk_norm = "head"``; ...). Falcon, the latent families (DeepSeek) and
Qwen3-Next's and Qwen3.5's ``linear_attention`` layers are layers of
their own, and so are the families whose q, k and v are one fused or
``Conv1D`` weight (GPT-2, OpenAI GPT, GPT-BigCode, BLOOM, MPT, CodeGen:
:mod:`attn_np.hf.fused`, which also holds Phi-3's ``qkv_proj``, a
difference in :data:`FAMILIES`).

This module admits every other decoder family of ``transformers`` 5.24.0
that these parts build exactly (each matched by
``tests/fixtures/families/<model_type>.npz``): Llama's layer as it is
(Mixtral, Arcee, Gemma, ...), biases under the family's own key
(``use_bias``, ``qkv_bias``, ``use_qkv_bias``, ``attention_out_bias``),
RoPE on interleaved pairs (Helium, ERNIE 4.5, GLM), QK-norm per head or
over the projection (Apertus, dots.llm1, OLMo 3, MiniMax-M2, ...),
Granite's ``attention_multiplier``, NoPE layers (SmolLM3's
``no_rope_layers``; Cohere 2 and EXAONE 4 turn only their window
layers). The comments in :data:`FAMILIES` give each one's difference;
:data:`_CLASS_ROPE` and :data:`_CLASS_WINDOWS` hold what a family's
configuration class fills in when a file is silent. A family whose
attention needs a part the library lacks is refused with that part
named (:mod:`attn_np.hf.keys`, with every key read, ignored or refused;
in an admitted family, ``qk_layernorm`` and Cohere's
``use_qk_norm``).

:func:`layer_settings` returns ``(cls, args, kwargs, layout)`` without
building anything; :func:`layer_rope` turns a layer's RoPE parameters
(read by :func:`attn_np.hf.config.rope_parameters`, the one reader of
both spellings) into the layer's arguments.

:mod:`attn_np.hf.families_more` holds the differences of the families
admitted since (Cohere 2 MoE, Granite SWA, MLA under other model types,
OPT-style NoPE layers, GPT-J, Phi, GPT-Neo, nanochat, the attention
layers of Bamba, Jamba, Granite 4, Nemotron-H and Falcon-H1), and
:mod:`attn_np.hf.families_diff` DiffLlama's differential attention;
they are registered here.
"""

from __future__ import annotations

import math

from ..linear import GatedDeltaNet
from ..long_context import read_rope_scaling
from ..refinements import ALiBi, SoftCap, alibi_slopes
from .config import (
    FULL,
    MODEL_TYPE_ALIASES,
    SLIDING,
    _mla_sizes,
    count,
    flag,
    language_model,
    layer_types,
    load_config,
    number,
    rope_flags,
    rope_parameters,
    windows,
)
from .families_diff import _diffllama
from .families_gemma import _gemma, _per_layer
from .families_mistral import _mistral_large4
from .families_more import (
    _LLAMA_4_SCALED,
    _NTK_ALPHA,
    _afmoe,
    _bamba,
    _class_layer_types,
    _clip_qkv,
    _cohere2_moe_rope,
    _falcon_h1,
    _gpt_neo,
    _gptj,
    _granite_swa,
    _granitemoehybrid,
    _head_gain_norm,
    _hunyuan,
    _hybrid_layer,
    _jamba,
    _learned_positions,
    _llama_4_scaling,
    _minicpm3_settings,
    _mistral4,
    _nanochat,
    _nemotron_h,
    _ntk_alpha,
    _phi,
    _respell,
    _text_positions,
)
from .families_own import _on_plain
from .families_types import (
    _compass,
    _exaone4_rope,
    _lara_mini,
    _lfm2,
    _mellum,
    _modernbert_decoder,
    _olmo_hybrid,
    _refuse_unread_partial,
    _rope_if_windowed,
    _smollm3,
)
from .fused import _FUSED_LAYERS, _fused, _persimmon, _phi3, _phi3_rope
from .keys import (
    _ATTENTION,
    _BUILT_BY,
    _CLASS_ROPE,
    _ELSEWHERE,
    _FAMILY_KEYS,
    _NOT_BUILT,
    _REFUSED,
)
from .kimi import _kimi_linear
from .layers import (
    HFAttention,
    HFLatentAttention,
    HFSparseLatentAttention,
    _bitnet,
)
from .weights import _SEPARATE_LINEAR_TYPES as _SEPARATE_TYPES
from .weights import SPLIT_LINEAR_TYPES as _SPLIT_TYPES
from .weights import _linear_layout, _linear_options

# the families whose linear_attention layers are a Gated DeltaNet
_GATED_DELTANET = ("qwen3_next", *_SPLIT_TYPES, *_SEPARATE_TYPES)


def _needs(part):
    """A ``_NOT_BUILT`` reason as the end of a refusal: the part, or, for
    a family without attention layers (Mamba, RWKV), what it has."""
    if part.startswith("no attention layer: "):
        return "an attention layer, and it has none: " + part[20:]
    return part + ", which the library lacks"


def layer_settings(config, layer_idx=0):
    """What :func:`~attn_np.attention_from_hf` builds, without building
    it: ``(cls, args, kwargs, layout)``, the layer class, its positional
    and keyword arguments, and how HF's state dict maps onto its
    ``params``. Reads and checks the config as
    :func:`~attn_np.attention_from_hf` does; costs nothing for a large
    model (no weights are drawn)."""
    data, _, _ = load_config(config)
    cfg = language_model(data)
    model_type = cfg.get("model_type")
    model_type = MODEL_TYPE_ALIASES.get(model_type, model_type)
    cfg = _respell(cfg, model_type)  # GPT-2's n_embd, XGLM's d_model, ...
    if model_type in _NOT_BUILT:
        raise ValueError(
            f"config model_type={model_type!r} is not built by "
            f"attention_from_hf: its attention needs "
            + _needs(_NOT_BUILT[model_type])
        )
    if model_type not in FAMILIES and model_type not in _OWN_LAYERS:
        raise ValueError(
            f"config model_type={model_type!r} is not one attention_from_hf "
            f"builds; it builds {', '.join(NAMES)}"
        )
    for key, what in _REFUSED.items():
        if flag(cfg, key) and model_type not in _BUILT_BY.get(key, ()):
            raise ValueError(
                f"config key {key}=True ({what}) is not built by "
                "attention_from_hf"
            )
    unknown = sorted(set(cfg) - _ELSEWHERE - _ATTENTION - set(_REFUSED))
    if unknown:
        raise ValueError(
            f"config keys {unknown} are not understood by "
            f"attention_from_hf ({model_type}); refusing to guess what they "
            "change"
        )
    for key, readers in _FAMILY_KEYS.items():
        value = cfg.get(key)
        if model_type not in readers and value not in (None, False, 0, []):
            raise ValueError(
                f"config key {key}={value!r} is read by "
                f"{', '.join(readers)} only: a {model_type} layer would "
                "ignore it, so attention_from_hf refuses it"
            )
    if model_type in _OWN_LAYERS:
        return _OWN_LAYERS[model_type](cfg, model_type, layer_idx)
    return _decoder(cfg, model_type, layer_idx)


# ------------------------------------------------------------------ RoPE
_PLAIN_ROPE_KEYS = {"rope_theta", "rope_type", "partial_rotary_factor"}


def layer_rope(cfg, layer_type=None, *, default_theta=10000.0):
    """``(base, partial_rotary_factor, linear_factor, rope_scaling)`` of
    a layer of type ``layer_type`` (None: a full layer), from either
    spelling (:func:`~attn_np.hf.config.rope_parameters`): ``rope_type``
    ``default`` and ``linear`` as a base and a factor; chapter 11's
    ``llama3`` and ``yarn`` as a scaling dict checked by
    :func:`~attn_np.long_context.read_rope_scaling` (a YaRN without
    ``factor`` takes ``max_position_embeddings /
    original_max_position_embeddings``). Another type, or a key its type
    does not use, is refused by name."""
    kind = layer_type or FULL
    per = rope_parameters(cfg, [kind]) or {}
    params = dict(per.get(kind) or {"rope_type": "default"})
    rope_type = params.get("rope_type", "default")
    base = float(params.get("rope_theta", default_theta))
    partial = float(params.get("partial_rotary_factor", 1.0))
    if rope_type in ("llama3", "yarn"):
        scaling = read_rope_scaling(
            params,
            max_position_embeddings=cfg.get("max_position_embeddings"),
        )
        return base, partial, 1.0, scaling
    if rope_type == "dynamic":
        raise ValueError(
            "rope_type 'dynamic' (dynamic NTK) is not built by "
            "attention_from_hf: Hugging Face recomputes the frequencies "
            "from the current length at every forward, and a layer's "
            "rotation is fixed when it is built; "
            "attn_np.rope_frequencies(..., rope_scaling=...) gives the "
            "frequencies at one length"
        )
    if rope_type not in ("default", "linear"):
        raise ValueError(
            f"rope_type {rope_type!r} is not implemented by "
            "attention_from_hf; it builds 'default', 'linear', "
            "'llama3' and 'yarn' (and Phi-3's 'longrope')"
        )
    extra = set(params) - _PLAIN_ROPE_KEYS
    if rope_type == "linear":
        extra -= {"factor"}
        factor = params.get("factor")
        if isinstance(factor, bool) or not (
            isinstance(factor, (int, float)) and factor > 0
        ):
            raise ValueError("rope_type linear needs a positive factor")
    if extra:
        raise ValueError(
            f"rope keys {sorted(extra)} are not understood for rope_type "
            f"{rope_type!r}"
        )
    factor = float(params["factor"]) if rope_type == "linear" else 1.0
    return base, partial, factor, None


# --------------------------------------------- the plain decoder and diffs
def _layer_index(cfg, layer_idx) -> int:
    """``layer_idx`` as an int in ``[0, num_hidden_layers)`` (NumPy's
    integers too)."""
    if isinstance(layer_idx, bool) or not hasattr(layer_idx, "__index__"):
        raise TypeError(f"layer_idx must be an int, got {layer_idx!r}")
    layer_idx = int(layer_idx)
    n = _n_layers(cfg)
    if layer_idx < 0 or (n is not None and layer_idx >= n):
        raise ValueError(
            f"layer_idx must be in [0, {n}) (num_hidden_layers), got "
            f"{layer_idx}"
        )
    return layer_idx


def _n_layers(cfg):
    n = count(cfg, "num_hidden_layers", required=False)
    types = cfg.get("layer_types")
    if n is None and isinstance(types, list):
        n = len(types)
    return n


def _layer_type(cfg, layer_idx):
    """Layer ``layer_idx``'s type as Hugging Face derives it (None when
    the config says nothing per layer): ``layer_types``, checked for
    length and kind, or what Llama 4's ``no_rope_layers`` /
    ``attention_chunk_size`` and Qwen3-Next's ``full_attention_interval``
    imply (:func:`~attn_np.hf.config.layer_types`)."""
    layer_idx = _layer_index(cfg, layer_idx)
    n = _n_layers(cfg)
    if n is None:
        return None
    types, _ = layer_types(cfg, n)
    return None if types is None else types[layer_idx]


def _heads(cfg):
    d_model = count(cfg, "hidden_size")
    n_heads = count(cfg, "num_attention_heads")
    n_kv = count(cfg, "num_key_value_heads", required=False) or n_heads
    head_dim = cfg.get("head_dim")  # absent or null: d_model // n_heads
    head_dim = (
        d_model // n_heads if head_dim is None else count(cfg, "head_dim")
    )
    return d_model, n_heads, n_kv, head_dim


def _window(cfg, layer_idx, layer_type):
    """``(window, layer_type)``: ``sliding_window`` on a sliding layer;
    an older config without ``layer_types`` follows chapter 8's
    calculator's rules (:func:`~attn_np.hf.config.windows`)."""
    if cfg.get("layer_types") is None and cfg.get("sliding_window"):
        window, types = windows(cfg, count(cfg, "num_hidden_layers"), None)
        if types is None:
            return window, layer_type
        layer_type = types[layer_idx]
        return (window if layer_type == SLIDING else None), layer_type
    if layer_type == SLIDING:
        window = count(cfg, "sliding_window", required=False)
        if window is None:
            raise ValueError(
                f"layer {layer_idx} is a {SLIDING!r} layer (layer_types) "
                "but the config has no sliding_window"
            )
        return window, layer_type
    return None, layer_type


def _writes_partial(cfg, layer_type) -> bool:
    """Whether the config writes ``partial_rotary_factor`` for a layer of
    this type (in either spelling)."""
    kind = layer_type or FULL
    per = rope_parameters(cfg, [kind]) or {}
    return "partial_rotary_factor" in (per.get(kind) or {})


def plain_decoder(
    cfg, layer_idx, layer_type, *, default_theta=10000.0, default_partial=1.0
):
    """Llama's attention layer: ``(args, kwargs)`` of
    :class:`~attn_np.hf.layers.HFAttention`, the start of every q/k/v/o
    family. ``default_theta`` and ``default_partial`` are the RoPE base
    and ``partial_rotary_factor`` a file that does not write them gets
    (the family's configuration class's)."""
    d_model, n_heads, n_kv, head_dim = _heads(cfg)
    window, layer_type = _window(cfg, layer_idx, layer_type)
    base, partial, factor, scaling = layer_rope(
        cfg, layer_type, default_theta=default_theta
    )
    if not _writes_partial(cfg, layer_type):
        partial = default_partial
    else:  # a family whose HF rotary turns the whole head: refused
        _refuse_unread_partial(cfg.get("model_type"), partial)
    bias = flag(cfg, "attention_bias")
    kw = dict(
        biases=("q", "k", "v", "o") if bias else (),
        window=window,
        rope_base=base,
        rotary_dim=int(head_dim * partial) if partial != 1.0 else None,
        rope_factor=factor,
        rope_scaling=scaling,
        norm_eps=number(cfg, "rms_norm_eps", 1e-6),
    )
    return (d_model, n_heads, n_kv, head_dim), kw


def _qwen2(cfg, i, layer_type, kw, layout):
    kw["biases"] = ("q", "k", "v")


def _qwen3(cfg, i, layer_type, kw, layout):
    kw["qk_norm"] = "head"


def _olmo2(cfg, i, layer_type, kw, layout):
    kw["qk_norm"] = "proj"


def _gemma2(cfg, i, layer_type, kw, layout):
    scalar = number(cfg, "query_pre_attn_scalar")
    if scalar is not None:
        kw["scale"] = scalar**-0.5
    cap = number(cfg, "attn_logit_softcapping")
    if cap is not None:
        kw["score_mods"] = (SoftCap(cap),)


def _gemma3(cfg, i, layer_type, kw, layout):
    """Gemma 2's, with QK-norm of gain ``1 + w``; an older file's full
    layers default to base 1e6 (``Gemma3TextConfig``'s)."""
    _gemma2(cfg, i, layer_type, kw, layout)
    kw.update(qk_norm="head", qk_norm_offset=1.0)
    if cfg.get("rope_parameters") is not None:
        if "rope_local_base_freq" in cfg:
            raise ValueError(
                "config is contradictory: rope_local_base_freq and "
                "rope_parameters both set the sliding layers' RoPE"
            )
    elif cfg.get("rope_theta") is None and layer_type != SLIDING:
        kw["rope_base"] = 1e6
    if flag(cfg, "use_bidirectional_attention"):  # EmbeddingGemma
        kw["bidirectional"] = True
        # HF's Gemma3TextConfig reads the file's sliding_window W as
        # W // 2 + 1 and masks |i - j| < W // 2 + 1: W // 2 each side
        if kw.get("window") is not None:
            kw["window"] = kw["window"] // 2 + 1


def _gpt_oss(cfg, i, layer_type, kw, layout):
    kw["sinks"] = True


def _qwen3_next(cfg, i, layer_type, kw, layout):
    """Qwen3's QK-norm with gain ``1 + w``, and an elementwise output
    gate whose rows HF keeps inside ``q_proj``."""
    kw.update(qk_norm="head", qk_norm_offset=1.0, gate="elementwise")
    layout["gate_rows"] = True


def _llama4(cfg, i, layer_type, kw, layout):
    """NoPE layers (``no_rope_layers[i] == 0``) with the query
    temperature; RoPE layers interleaved, parameter-free QK-norm after
    the rotation, chunked where the layer type says."""
    n = _n_layers(cfg)
    flags = None if n is None else rope_flags(cfg, n)
    use_rope = bool(flags[i]) if flags else True
    kw.update(use_rope=use_rope, rope_layout="interleaved")
    if flag(cfg, "use_qk_norm") and use_rope:
        kw.update(
            qk_norm="head", qk_norm_learned=False, qk_norm_after_rope=True
        )
    if layer_type == "chunked_attention":
        kw["chunk"] = count(cfg, "attention_chunk_size")
    # Llama4TextConfig's defaults: tuning on, floor 8192, attn_scale 0.1
    floor_scale = number(cfg, "floor_scale", 8192.0)
    attn_scale = number(cfg, "attn_scale", 0.1, positive=False)
    if _tuning(cfg) and not use_rope:
        kw["query_temperature"] = (floor_scale, attn_scale)


def _tuning(cfg) -> bool:
    """Llama 4's ``attn_temperature_tuning``: on when absent (HF's
    default), a JSON boolean, or the number the released files write (4,
    read by HF as true); a string is refused."""
    value = cfg.get("attn_temperature_tuning")
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return bool(flag(cfg, "attn_temperature_tuning"))
    return value != 0


def _same(cfg, i, layer_type, kw, layout):
    """The plain decoder as it is."""


def _no_bias(cfg, i, layer_type, kw, layout):
    """HF's class writes ``bias=False`` on q, k, v and o whatever the
    config says: an ``attention_bias`` in the file is ignored there, and
    so here (Mistral, Mixtral, Ministral, CWM)."""
    kw["biases"] = ()


# ------------------------------------------------ more decoder families
# Each is read off the family's attention class in transformers 5.24.0
# (modeling_<model_type>.py) and matched by a fixture in
# tests/fixtures/families/<model_type>.npz.
def _interleaved(cfg, i, layer_type, kw, layout):
    """RoPE on interleaved pairs ``(0, 1), (2, 3), ...`` (HF's
    ``rotate_half`` on ``x[..., 0::2]``, ``x[..., 1::2]``)."""
    kw["rope_layout"] = "interleaved"


def _bias_keys(qkv=None, o=None):
    """A family whose biases HF reads from its own keys: ``qkv`` turns on
    the q/k/v biases, ``o`` the output's."""

    def diff(cfg, i, layer_type, kw, layout):
        on = flag(cfg, qkv) if qkv else False
        out = flag(cfg, o) if o else False
        kw["biases"] = (*(("q", "k", "v") if on else ()), *("o" * out))

    return diff


def _and(*diffs):
    """Several differences, in order."""

    def diff(cfg, i, layer_type, kw, layout):
        for d in diffs:
            d(cfg, i, layer_type, kw, layout)

    return diff


def _refuse(key, what):
    """A difference that refuses a config whose ``key`` is set (true, or
    a number) because it needs a part attention_from_hf lacks."""

    def diff(cfg, i, layer_type, kw, layout):
        value = cfg.get(key)
        if value not in (None, False):
            raise ValueError(
                f"config key {key}={value!r} ({what}) is not built by "
                f"attention_from_hf for {cfg.get('model_type')}"
            )

    return diff


def _attention_multiplier(cfg, i, layer_type, kw, layout):
    """Granite's softmax scale: ``attention_multiplier`` in place of
    ``head_dim**-0.5`` (its configuration class's default 1.0)."""
    kw["scale"] = number(cfg, "attention_multiplier", 1.0)


def _minimax_m2(cfg, i, layer_type, kw, layout):
    """OLMo 2's QK-norm; released MiniMax-M2 files write partial RoPE as
    ``rotary_dim`` (features turned per head), read when no
    ``partial_rotary_factor`` is written (``MiniMaxM2Config``'s rule)."""
    _olmo2(cfg, i, layer_type, kw, layout)
    written = _writes_partial(cfg, layer_type)
    if cfg.get("rotary_dim") is not None and not written:
        rotary_dim = count(cfg, "rotary_dim")
        head_dim = _heads(cfg)[3]
        kw["rotary_dim"] = None if rotary_dim == head_dim else rotary_dim


def _qk_norm_if_used(cfg, i, layer_type, kw, layout):
    """GLM-4.5: Qwen3's per-head QK-norm when ``use_qk_norm``."""
    if flag(cfg, "use_qk_norm"):
        _qwen3(cfg, i, layer_type, kw, layout)


_CLIP = _clip_qkv  # OLMo's clamp of q, k and v (families_more)

#: model_type -> its difference from the plain decoder
FAMILIES = {
    "llama": _same,
    "mistral": _no_bias,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3,
    "olmo2": _olmo2,
    "gpt_oss": _gpt_oss,
    "qwen3_next": _qwen3_next,
    # Qwen3.5: Qwen3-Next's attention; its Gated DeltaNet keeps q, k, v,
    # z, b and a in projections of their own (hf.weights)
    "qwen3_5_text": _qwen3_next,
    "qwen3_5_moe_text": _qwen3_next,
    "llama4_text": _llama4,
    # Llama's layer: Mixtral, PhiMoE (the window on every
    # layer, as Mistral's), Ministral and CWM (window layers from
    # layer_types), never a bias (as Mistral); Arcee, Gemma, Jais 2
    # (attention_bias: all four)
    "mixtral": _no_bias,
    "phimoe": _same,
    "ministral": _no_bias,
    # Ministral 3: Mistral's layer; its query scale by position is read
    # with the RoPE (_llama_4_scaling)
    "ministral3": _no_bias,
    "cwm": _no_bias,
    "arcee": _same,
    "gemma": _same,
    "jais2": _same,
    # partial RoPE (rope_parameters' partial_rotary_factor, read by the
    # plain decoder): Nemotron; Solar Open with attention_bias on q/k/v
    # only (o_proj has no bias)
    "nemotron": _same,
    "solar_open": _bias_keys("attention_bias"),
    # RoPE on interleaved pairs: Helium; ERNIE 4.5 with use_bias (q, k,
    # v and o); GLM and GLM-4, partial, attention_bias on q/k/v only
    "helium": _interleaved,
    "ernie4_5": _and(_interleaved, _bias_keys("use_bias", "use_bias")),
    "ernie4_5_moe": _and(_interleaved, _bias_keys("use_bias", "use_bias")),
    "glm": _and(_interleaved, _bias_keys("attention_bias")),
    "glm4": _and(_interleaved, _bias_keys("attention_bias")),
    # biases under other keys: Seed-OSS (attention_bias on q/k/v,
    # attention_out_bias on o), Qwen2-MoE (qkv_bias), StarCoder2
    # (use_bias, all four), StableLM (use_qkv_bias; its qk_layernorm a
    # LayerNorm per head, each head its own gain)
    "seed_oss": _bias_keys("attention_bias", "attention_out_bias"),
    "qwen2_moe": _bias_keys("qkv_bias"),
    "starcoder2": _bias_keys("use_bias", "use_bias"),
    "stablelm": _and(
        _bias_keys("use_qkv_bias"), _head_gain_norm("qk_layernorm")
    ),
    # per-head QK RMSNorm (Qwen3's): Apertus, Qwen3-MoE (its window, when
    # use_sliding_window, on every layer), dots.llm1; GLM-4.5 when
    # use_qk_norm, with attention_bias on q/k/v only
    "apertus": _qwen3,
    "qwen3_moe": _qwen3,
    "dots1": _qwen3,
    "glm4_moe": _and(_bias_keys("attention_bias"), _qk_norm_if_used),
    # QK RMSNorm over the whole projection (OLMo 2's): OLMo 3, FlexOlmo,
    # MiniMax-M2 (partial RoPE), OLMoE (and clip_qkv); OLMo is Llama's
    # layer with clip_qkv
    "olmo3": _olmo2,
    "flex_olmo": _olmo2,
    "minimax_m2": _minimax_m2,
    "olmoe": _and(_olmo2, _CLIP),
    "olmo": _CLIP,
    # Gemma 2's scale and soft-cap: VaultGemma; Gemma 3n and Gemma 4
    # (families_gemma: v_norm, scale 1, layers reading others' keys)
    "vaultgemma": _gemma2,
    "gemma3n_text": _gemma,
    "gemma4_text": _gemma,
    "gemma4_unified_text": _gemma,
    # the scale attention_multiplier: Granite, Granite MoE (shared),
    # HyperCLOVA X
    "granite": _attention_multiplier,
    "granitemoe": _attention_multiplier,
    "granitemoeshared": _attention_multiplier,
    "hyperclovax": _attention_multiplier,
    # NoPE layers: SmolLM3 (no_rope_layers); Cohere 2 (interleaved RoPE
    # on the sliding layers only), EXAONE 4 (QK-norm, RoPE on the
    # sliding layers only); Cohere (use_qk_norm: a LayerNorm per head)
    "smollm3": _smollm3,
    "cohere": _and(_interleaved, _head_gain_norm("use_qk_norm")),
    "cohere2": _and(_interleaved, _rope_if_windowed),
    "afmoe": _afmoe,
    "exaone4": _and(_qwen3, _exaone4_rope),
    # Kolibri 1 is EXAONE 4's layer; Flint: QK-norm, gpt-oss's sinks,
    # RoPE on the window layers only (as Cohere 2); Mellum: QK-norm and
    # RoPE per layer type (rope_parameters.full_attention, ...)
    "kolibri1": _and(_qwen3, _exaone4_rope),
    "flint": _and(_qwen3, _gpt_oss, _rope_if_windowed),
    "mellum": _mellum,
    # Llama's layer, as HF builds it (LlamaAttention): Aria's text model,
    # EXAONE 3, InternLM 3, IQuest-Coder
    "aria_text": _same,
    "exaone": _same,
    "internlm3": _same,
    "iquestcoder": _same,
    "bitnet": _bitnet,  # RMSNorm of the heads before o_proj
    "diffllama": _diffllama,  # two maps' difference (families_diff)
    "emu3_text_model": _same,  # Emu3's language model
    # per-head QK RMSNorm: Apertus 1.5, Hunyuan V3; Sarvam-MoE is
    # GLM-4.5's layer (HF builds Glm4MoeAttention); EXAONE-MoE is
    # EXAONE 4's
    "apertus1p5_text": _qwen3,
    "hunyuan_v1_dense": _hunyuan,  # gains after RoPE (families_more)
    "hunyuan_v1_moe": _hunyuan,
    "hy_v3": _qwen3,
    "sarvam_moe": _and(_bias_keys("attention_bias"), _qk_norm_if_used),
    "exaone_moe": _and(_qwen3, _exaone4_rope),
    # attn_np.hf.families_more: Cohere 2 MoE (Cohere 2's, RoPE on dense
    # layers too); Granite SWA (sinks, a RoPE base per layer)
    "cohere2_moe": _and(_interleaved, _cohere2_moe_rope),
    "granite_swa": _granite_swa,
    "granitemoe_swa": _granite_swa,
    # NoPE layers with biases (positions added outside): OPT, BioGPT,
    # XGLM, CTRL; GPT-J (partial interleaved RoPE), Phi (dense), GPT-Neo
    # (unscaled, local windows), nanochat (RoPE the other way)
    "opt": _learned_positions("enable_bias"),
    "biogpt": _learned_positions(),
    "xglm": _learned_positions(),
    "ctrl": _learned_positions(),
    "gptj": _gptj,
    "phi": _phi,
    "gpt_neo": _gpt_neo,
    "nanochat": _nanochat,
    # hybrids' attention layers (their Mamba layers refused by name):
    # Bamba (partial RoPE 0.5), Jamba (NoPE), Falcon-H1 (key_multiplier)
    "bamba": _bamba,
    "jamba": _jamba,
    "falcon_h1": _falcon_h1,
    "granitemoehybrid": _granitemoehybrid,
    # Qwen3's QK-norm, RoPE on sliding layers; Qwen3.5's Gated DeltaNet
    "lara_mini": _lara_mini,
    # MHA with Wo, windows, RoPE per layer type
    "modernbert-decoder": _modernbert_decoder,
    "lfm2": _lfm2,  # conv layers refused by name
    "lfm2_moe": _lfm2,
    # RoPE per layer type, null for none
    "cohere_compass_text": _compass,
    # OLMo 2's QK-norm, RoPE unless null; a Gated DeltaNet of doubled beta
    "olmo_hybrid": _olmo_hybrid,
    "nemotron_h": _nemotron_h,
    # one fused qkv_proj (attn_np.hf.fused): Phi-3, its window on every
    # layer (as Mistral's)
    "phi3": _phi3,
    "phi4_multimodal": _phi3,
    # per-head query_key_value, a LayerNorm per head on q and k (when
    # qk_layernorm), partial RoPE 0.5 by default: Persimmon
    "persimmon": _persimmon,
}


def _decoder(cfg, model_type, layer_idx):
    """Every family with q_proj/k_proj/v_proj/o_proj."""
    cfg = _class_layer_types(cfg, model_type)
    layer_idx = _layer_index(cfg, layer_idx)
    cfg = _hybrid_layer(cfg, model_type, layer_idx)  # a Mamba layer: no
    layer_type = _layer_type(cfg, layer_idx)
    cfg = _per_layer(cfg, model_type, layer_idx, layer_type)  # Gemma 3n, 4
    if layer_type == "linear_attention" and model_type in _GATED_DELTANET:
        return _linear(cfg)
    if model_type in _SPLIT_TYPES:
        cfg = _text_positions(cfg)
    temperature = None
    if model_type in _LLAMA_4_SCALED:
        cfg, temperature = _llama_4_scaling(cfg)
    if model_type in _NTK_ALPHA:  # HunYuan's fixed NTK stretch
        cfg = _ntk_alpha(cfg)
    if FAMILIES.get(model_type) is _phi3:  # LongRoPE (attn_np.hf.fused)
        cfg = _phi3_rope(cfg)
    if layer_type not in (None, FULL, SLIDING, "chunked_attention"):
        raise ValueError(
            f"layer {layer_idx} has layer type {layer_type!r}, which "
            "attention_from_hf does not build"
        )
    theta, partial = _CLASS_ROPE.get(model_type, (10000.0, 1.0))
    args, kw = plain_decoder(
        cfg,
        layer_idx,
        layer_type,
        default_theta=theta,
        default_partial=partial,
    )
    layout = {"kind": "proj", "gate_rows": False}
    FAMILIES[model_type](cfg, layer_idx, layer_type, kw, layout)
    if temperature is not None:
        kw["query_temperature"] = temperature
    cls = layout.pop("cls", HFAttention)  # a diff may name its own class
    return cls, args, kw, layout


# ------------------------------------------------ layers of their own
def _falcon(cfg, model_type=None, layer_idx=0):
    """Falcon: MQA, grouped (``new_decoder_architecture``) or per head,
    RoPE or ALiBi."""
    _layer_index(cfg, layer_idx)
    d_model = count(cfg, "hidden_size")
    n_heads = count(cfg, "num_attention_heads")
    head_dim = d_model // n_heads
    if flag(cfg, "new_decoder_architecture"):
        n_kv, fused = count(cfg, "num_kv_heads"), "grouped"
    elif flag(cfg, "multi_query") is not False:  # FalconConfig: True
        n_kv, fused = 1, "mqa"
    else:
        n_kv, fused = n_heads, "per_head"
    base, partial, factor, scaling = layer_rope(cfg)
    bias = flag(cfg, "bias")
    kw = dict(
        biases=("q", "k", "v", "o") if bias else (),
        rope_base=base,
        rope_factor=factor,
        rope_scaling=scaling,
    )
    if flag(cfg, "alibi"):
        # HF's Falcon adds m_h * j before the 1/sqrt(d) scale
        slopes = alibi_slopes(n_heads) / math.sqrt(head_dim)
        kw.update(use_rope=False, score_mods=(ALiBi(slopes),))
    args = (d_model, n_heads, n_kv, head_dim)
    rows = "blocks" if fused == "mqa" else fused  # attn_np.hf.fused
    layout = _fused(
        "query_key_value", "dense", rows, False, "h.{i}.self_attention."
    )
    return HFAttention, args, kw, layout


def _linear(cfg):
    """Qwen3-Next's Gated DeltaNet layer (chapter 12)."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(
            "config key hidden_act must be 'silu' for a linear_attention "
            f"layer (its convolution and output gate), got {act!r}"
        )
    args = (
        count(cfg, "hidden_size"),
        count(cfg, "linear_num_value_heads"),
        count(cfg, "linear_num_key_heads"),
    )
    kw = dict(
        d_k=count(cfg, "linear_key_head_dim"),
        d_v=count(cfg, "linear_value_head_dim"),
        conv_size=count(cfg, "linear_conv_kernel_dim"),
        **_linear_options(cfg),  # eps; OLMo Hybrid's doubled beta
    )
    names = _linear_layout(cfg)  # fused, split (Qwen3.5's) or separate
    layout = {"kind": "linear", "config": cfg, "names": names}
    return GatedDeltaNet, args, kw, layout


def _mla(cfg, model_type, layer_idx):
    types = cfg.get("layer_types")
    layer_idx = _layer_index(cfg, layer_idx)
    if types is not None and (
        not isinstance(types, list) or len(types) != _n_layers(cfg)
    ):
        raise ValueError(
            "config key layer_types must list one layer type per layer "
            f"(num_hidden_layers), got {types!r:.200}"
        )
    layer_type = None if types is None else types[layer_idx]
    if layer_type not in (None, FULL, "indexed_attention"):
        raise ValueError(
            f"layer {layer_idx} has layer type {layer_type!r}, which "
            "attention_from_hf does not build for MLA"
        )
    return _latent(cfg, model_type)


def _latent(cfg, model_type):
    """DeepSeek-V2/V3 multi-head latent attention; V3.2's with the
    lightning indexer (chapter 13)."""
    q_lora = cfg.get("q_lora_rank")
    if flag(cfg, "attention_bias"):
        raise ValueError(
            "config key attention_bias=True for MLA is not implemented"
        )
    base, partial, factor, scaling = layer_rope(cfg)
    if partial != 1.0 or factor != 1.0:
        raise ValueError(
            "MLA with partial_rotary_factor or linear RoPE scaling is not "
            "implemented"
        )
    interleave = flag(cfg, "rope_interleave") is not False
    args, kw = _mla_sizes(cfg)
    kw.update(
        rope_base=base,
        rope_layout="interleaved" if interleave else "half",
        rope_scaling=scaling,
    )
    if model_type == "deepseek_v32":
        if q_lora is None:
            raise ValueError(
                "config needs q_lora_rank for deepseek_v32 (its indexer "
                "reads the query latent)"
            )
        kw.update(
            index_n_heads=count(cfg, "index_n_heads"),
            index_head_dim=count(cfg, "index_head_dim"),
            index_topk=count(cfg, "index_topk"),
            index_rope_layout="half",  # HF: "NON-interleaved"
        )
        layout = {"kind": "mla", "indexer": True}
        return HFSparseLatentAttention, args, kw, layout
    return HFLatentAttention, args, kw, {"kind": "mla"}


def _checked_index(build):
    """A builder of :mod:`attn_np.hf.fused`, given a checked layer
    index."""

    def own(cfg, model_type, layer_idx):
        return build(cfg, model_type, _layer_index(cfg, layer_idx))

    return own


_OWN_LAYERS = {
    "falcon": _falcon,
    "deepseek_v2": _mla,
    "deepseek_v3": _mla,
    "deepseek_v32": _mla,
    # DeepSeek-V3's module under other names (families_more); MiniCPM3's
    # with the rotate-half RoPE
    "glm4_moe_lite": _mla,
    "axk1": _mla,
    "youtu": _mla,
    "sarvam_mla": _mla,
    "minicpm3": lambda cfg, t, i: _mla(_minicpm3_settings(cfg), t, i),
    # Kimi Delta Attention and MLA without RoPE (attn_np.hf.kimi)
    "kimi_linear": lambda cfg, t, i: _kimi_linear(cfg, _layer_type(cfg, i)),
    "mistral4": lambda cfg, t, i: _mistral4(cfg, i, _mla),  # a query scale
    # on the plain decoder's settings: MiMo-V2-Flash, Laguna, Beam
    **_on_plain(plain_decoder, _layer_index),
    "mistral_large4_text": lambda c, t, i: _mistral_large4(c, i, _mla),
    # fused and Conv1D projections: GPT-2, OpenAI GPT, GPT-BigCode
    # (no RoPE), BLOOM and MPT (ALiBi), CodeGen (partial interleaved RoPE)
    **{name: _checked_index(b) for name, b in _FUSED_LAYERS.items()},
}
#: every model_type attention_from_hf builds
NAMES = (*FAMILIES, *_OWN_LAYERS)
