"""More Hugging Face decoder families, each a difference from a layer
:mod:`attn_np.hf.families` already builds (chapter 10).

Read off each family's attention class in ``transformers`` 5.24.0
(``modeling_<model_type>.py``) and matched by
``tests/fixtures/families/<model_type>.npz``:

* Cohere 2 MoE: Cohere 2's layer (interleaved RoPE on the window layers
  only), except that a dense-MLP layer turns too when
  ``prefix_dense_sliding_window_pattern`` is 1 (HF's ``force_rope``);
* Granite SWA and Granite MoE SWA: gpt-oss's sinks (HF adds them as
  ``sigmoid(logsumexp(s) - sink)`` on the output, the same as one more
  logit in the softmax's denominator), Granite's
  ``attention_multiplier`` as the scale, windows from ``layer_types``
  and a RoPE base per layer (``layer_rope_theta``; 0 is a NoPE layer);
* multi-head latent attention under other model types: GLM-4.7-Flash
  (``glm4_moe_lite``), Youtu and Sarvam's MLA build DeepSeek-V3's
  module line for line; MiniCPM3 builds it with the rotate-half RoPE
  always (its forward never reads ``rope_interleave``);
* NoPE layers with biases, whose positions are learned or sinusoidal
  vectors added to the embeddings before the first layer (so the
  attention layer itself turns nothing): OPT (``enable_bias``), BioGPT,
  XGLM (``q_proj ... out_proj``) and CTRL (``Wq``, ``Wk``, ``Wv``,
  ``dense``);
* GPT-J: RoPE on the first ``rotary_dim`` features of each head, on
  interleaved pairs, no biases, ``out_proj``;
* Phi: q/k/v and ``dense`` with biases, partial rotate-half RoPE, and
  with ``qk_layernorm`` Persimmon's LayerNorm per head; Cohere's
  ``use_qk_norm`` and StableLM's ``qk_layernorm``, a LayerNorm per head
  with a gain of each head's own;
* GPT-Neo: scores not divided by ``sqrt(d)``, ``local`` layers with a
  window of ``window_size`` alternating with ``global`` ones
  (``attention_types``), a bias on ``out_proj`` only;
* nanochat: RoPE turned the other way, then a parameter-free QK RMSNorm
  (built as a permutation of its weights, :func:`_nanochat`);
* Lara Mini: Qwen3's per-head QK-norm, RoPE on the sliding layers
  only, and Qwen3.5's Gated DeltaNet (its projections split) on its
  ``linear_attention`` layers;
* the attention layers of hybrids whose other layers are Mamba mixers
  or MLPs (refused by name): Bamba, Jamba, Granite 4
  (``granitemoehybrid``), Nemotron-H, and Falcon-H1, whose every layer
  runs attention beside a mixer.

Some of these configuration classes spell the sizes their own way
(``attribute_map``: XGLM's ``d_model``, CTRL's and GPT-J's ``n_embd``,
GPT-Neo's ``num_heads``); :func:`_respell` reads them under the common
names first. :mod:`attn_np.hf.families` registers the families; this
module holds only the differences.
"""

from __future__ import annotations

from .config import (
    FULL,
    SLIDING,
    alternate,
    check_listed,
    count,
    flag,
    number,
    rope_parameters,
)
from .families_gemma import _GEMMA_TYPES, _text_causal
from .families_types import (
    _compass_types,
    _lara_mini_types,
    _lfm2_types,
    _modernbert_types,
    _olmo_hybrid_types,
)
from .keys import _CLASS_WINDOWS
from .layers import (
    _HeadGainLayerNormAttention,
    _PostRopeGainAttention,
    _QKLayerNormAttention,
    _ScaledQueryLatentAttention,
)

# ------------------------------------------------------ Cohere 2 MoE


def _cohere2_moe_rope(cfg, i, layer_type, kw, layout):
    """Cohere 2 MoE turns q and k on a window layer, and on a layer with
    a dense MLP (``mlp_layer_types[i] == "dense"``) when
    ``prefix_dense_sliding_window_pattern`` is 1 (its class's default):
    HF's ``force_rope``. Every other layer is NoPE."""
    key = "prefix_dense_sliding_window_pattern"
    pattern = count(cfg, key, required=False)
    mlp = cfg.get("mlp_layer_types")
    n = count(cfg, "num_hidden_layers")
    if mlp is None:
        if cfg.get("first_k_dense_replace") not in (None, 0):
            raise ValueError(
                "config key mlp_layer_types is missing for cohere2_moe but "
                "first_k_dense_replace is set: which layers are dense "
                "(and so turn q and k) is not written; refusing to guess"
            )
        mlp = ["sparse"] * n  # Cohere2MoeConfig without dense layers
    if not isinstance(mlp, list) or len(mlp) != n:
        raise ValueError(
            "config key mlp_layer_types must list one entry per layer "
            f"(num_hidden_layers={n}), got {mlp!r:.200}"
        )
    force = mlp[i] == "dense" and (pattern is None or pattern == 1)
    kw["use_rope"] = kw["window"] is not None or force


# ------------------------------------------------------ Granite SWA


def _granite_swa_types(cfg):
    """``layer_types`` as ``GraniteSWAConfig`` fills it when the file has
    none: layer ``i`` full when ``i % 4 == 0``, else sliding."""
    if cfg.get("layer_types") is not None:
        return cfg
    n = count(cfg, "num_hidden_layers")
    types = [FULL if i % 4 == 0 else SLIDING for i in range(n)]
    return {**cfg, "layer_types": types}


def _layer_theta(cfg, i):
    """``layer_rope_theta[i]``: layer ``i``'s RoPE base, 0 for NoPE (None
    when the file has no list: every layer takes the config's base)."""
    thetas = cfg.get("layer_rope_theta")
    if thetas is None:
        return None
    n = count(cfg, "num_hidden_layers")
    if not isinstance(thetas, list) or len(thetas) != n:
        raise ValueError(
            "config key layer_rope_theta must list one RoPE base per layer "
            f"(num_hidden_layers={n}), got {thetas!r:.200}"
        )
    theta = thetas[i]
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ValueError(
            f"config key layer_rope_theta[{i}] must be a number (0: no "
            f"RoPE), got {theta!r}"
        )
    if theta < 0:
        raise ValueError(
            f"config key layer_rope_theta[{i}] must be 0 or positive, got "
            f"{theta!r}"
        )
    return float(theta)


def _granite_swa(cfg, i, layer_type, kw, layout):
    """Sinks, the scale ``attention_multiplier`` (class default 1.0), and
    layer ``i``'s RoPE base from ``layer_rope_theta`` (0: NoPE)."""
    kw["sinks"] = True
    kw["scale"] = number(cfg, "attention_multiplier", 1.0)
    theta = _layer_theta(cfg, i)
    if theta == 0.0:
        kw["use_rope"] = False
    elif theta is not None:
        kw["rope_base"] = theta


# ------------------------------------------------------------------ MLA
def _minicpm3_settings(cfg):
    """MiniCPM3's MLA: DeepSeek-V2's module with the rotate-half RoPE
    (its forward calls ``apply_rotary_pos_emb`` and never reads
    ``rope_interleave``, so a file's ``rope_interleave`` changes nothing
    there, and nothing here); ``v_head_dim`` defaults to ``hidden_size //
    num_attention_heads`` (``MiniCPM3Config``'s rule)."""
    cfg = {**cfg, "rope_interleave": False}
    if cfg.get("v_head_dim") is None:
        d = count(cfg, "hidden_size") // count(cfg, "num_attention_heads")
        cfg["v_head_dim"] = d
    return cfg


# ------------------------------------------- spellings (attribute_map)
#: model_type -> {the family's key: the common key it stands for}
# GPT-2's configuration class's attribute_map (OpenAI GPT's, GPT-J's,
# CTRL's, CodeGen's, GPT-BigCode's too)
_GPT = {
    "n_embd": "hidden_size",
    "n_head": "num_attention_heads",
    "n_layer": "num_hidden_layers",
    "n_positions": "max_position_embeddings",
}
# the sizes a spelling must hold as a count
_COUNTS = {
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "head_dim",
}
_SPELLINGS = {
    "gpt2": _GPT,
    "openai-gpt": _GPT,
    "gpt_bigcode": _GPT,
    "codegen": _GPT,
    "gptj": _GPT,
    "ctrl": _GPT,
    "bloom": {
        "n_embed": "hidden_size",
        "n_head": "num_attention_heads",
        "n_layer": "num_hidden_layers",
    },
    "mpt": {
        "d_model": "hidden_size",
        "n_heads": "num_attention_heads",
        "n_layers": "num_hidden_layers",
    },
    "xglm": {
        "d_model": "hidden_size",
        "attention_heads": "num_attention_heads",
        "num_layers": "num_hidden_layers",
    },
    "gpt_neo": {
        "num_heads": "num_attention_heads",
        "num_layers": "num_hidden_layers",
    },
    "granitemoehybrid": {"layers_block_type": "layer_types"},
    "nemotron_h": {"layers_block_type": "layer_types"},
}
# older files' layer type names, as transformers renames them
_LEGACY_TYPES = {"mamba": "linear_attention", "attention": FULL}


def _respell(cfg, model_type):
    """``cfg`` with the family's own spellings of the sizes under the
    common names (its configuration class's ``attribute_map``); a file
    that writes both spellings with different values is refused."""
    if model_type in ("gemma4_text", "gemma4_unified_text"):
        cfg = _text_causal(cfg)
    spell = _SPELLINGS.get(model_type)
    if not spell:
        return cfg
    out = dict(cfg)
    for own, common in spell.items():
        if own not in out:
            continue
        if common in _COUNTS:  # checked under the name the file writes
            count(out, own, required=False)
        value = out.pop(own)
        if common in out and out[common] != value:
            raise ValueError(
                f"config is contradictory: {own}={value!r} and "
                f"{common}={out[common]!r} name the same size for "
                f"{model_type}"
            )
        out[common] = value
    if model_type == "nemotron_h":
        out = _nemotron_h_types(out)
    types = out.get("layer_types")
    if model_type in _MIXERS and isinstance(types, list):
        out["layer_types"] = [_LEGACY_TYPES.get(t, t) for t in types]
    return out


def _nemotron_h_types(cfg):
    """Nemotron-H's layer list as ``NemotronHConfig`` reads it: an older
    file's ``hybrid_override_pattern`` (``M`` Mamba-2, ``*`` attention,
    ``E`` MoE, ``-`` MLP, one character a layer) when no list is written;
    the list's length is the number of layers (its
    ``num_hidden_layers`` is ignored then)."""
    out = dict(cfg)
    pattern = out.pop("hybrid_override_pattern", None)
    if out.get("layer_types") is None and pattern is not None:
        kinds = {"M": "linear_attention", "E": "moe", "*": FULL, "-": "mlp"}
        if not isinstance(pattern, str) or set(pattern) - set(kinds):
            raise ValueError(
                "config key hybrid_override_pattern must be a string of "
                f"M, E, * and -, got {pattern!r:.200}"
            )
        out["layer_types"] = [kinds[c] for c in pattern]
    types = out.get("layer_types")
    if types is None:  # the class's default
        types = out["layer_types"] = ["linear_attention", "moe", FULL, "mlp"]
    if isinstance(types, list):
        out["num_hidden_layers"] = len(types)
    return out


# ------------------------------- classes that derive their own sizes


def _mha_only(cfg, model_type):
    """Refuse what the family's class never reads, rather than build
    it: ``num_key_value_heads`` other than the head count (its heads are
    all key/value heads), ``head_dim`` other than ``hidden_size //
    num_attention_heads``, and a window."""
    d_model = count(cfg, "hidden_size")
    n_heads = count(cfg, "num_attention_heads")
    n_kv = cfg.get("num_key_value_heads")
    if n_kv is not None and n_kv != n_heads:
        raise ValueError(
            f"config key num_key_value_heads={n_kv!r} is not read by "
            f"{model_type}'s attention (every head has its own keys and "
            "values); refusing to build grouped queries it lacks"
        )
    head_dim = cfg.get("head_dim")
    if head_dim not in (None, d_model // n_heads):
        raise ValueError(
            f"config key head_dim={head_dim!r} is not read by "
            f"{model_type}'s attention (its heads are hidden_size // "
            f"num_attention_heads = {d_model // n_heads} wide)"
        )
    for key in ("sliding_window", "layer_types"):
        if cfg.get(key) is not None:
            raise ValueError(
                f"config key {key}={cfg[key]!r:.80} is not read by "
                f"{model_type}'s attention; refusing to build a window "
                "it lacks"
            )


def _no_rope_keys(cfg, model_type, why):
    """Refuse RoPE keys the family's class never reads (``why``: where
    its positions come from instead)."""
    for key in ("rope_parameters", "rope_theta", "rope_scaling"):
        if cfg.get(key) is not None:
            raise ValueError(
                f"config key {key}={cfg[key]!r:.80} is not read by "
                f"{model_type}'s attention ({why})"
            )


_OUTSIDE = "positions are added to the embeddings before the layers"


def _learned_positions(qkv_bias_key=None):
    """OPT, BioGPT, XGLM, CTRL: a NoPE layer (its positions are vectors
    added to the embeddings outside it) with ``out_proj`` and biases on
    all four projections (OPT: when ``enable_bias``, true by default)."""

    def diff(cfg, i, layer_type, kw, layout):
        model_type = cfg.get("model_type")
        _mha_only(cfg, model_type)
        _no_rope_keys(cfg, model_type, _OUTSIDE)
        on = True if qkv_bias_key is None else flag(cfg, qkv_bias_key)
        kw.update(
            use_rope=False,
            window=None,
            biases=("q", "k", "v", "o") if on is not False else (),
        )
        layout["names"] = (
            _CTRL_NAMES if model_type == "ctrl" else {"o": "out_proj"}
        )

    return diff


_CTRL_NAMES = {"q": "Wq", "k": "Wk", "v": "Wv", "o": "dense"}


def _gptj(cfg, i, layer_type, kw, layout):
    """GPT-J: RoPE of base 10000 (fixed in HF's code) on the first
    ``rotary_dim`` features of each head, pairs ``(0, 1), (2, 3), ...``
    (``rotate_every_two``); no biases; ``out_proj``. HF turns a table
    ``hidden_size`` wide when ``rotary_dim`` is null, which fits a head
    only with one head: refused."""
    _mha_only(cfg, "gptj")
    _no_rope_keys(cfg, "gptj", "its RoPE base is 10000 in HF's code")
    head_dim = count(cfg, "hidden_size") // count(cfg, "num_attention_heads")
    rotary_dim = count(cfg, "rotary_dim", required=False)
    if rotary_dim is None:
        raise ValueError(
            "config key rotary_dim is null for gptj: HF then turns a "
            "table hidden_size wide, which fits a head only when there is "
            "one; refusing to guess"
        )
    if rotary_dim > head_dim or rotary_dim % 2:
        raise ValueError(
            f"config key rotary_dim must be even and at most the head "
            f"width {head_dim}, got {rotary_dim}"
        )
    kw.update(
        biases=(),
        rope_base=10000.0,
        rope_layout="interleaved",
        rotary_dim=None if rotary_dim == head_dim else rotary_dim,
    )
    layout["names"] = {"o": "out_proj"}


def _phi(cfg, i, layer_type, kw, layout):
    """Phi: biases on q, k, v and ``dense`` always (HF writes
    ``bias=True``), partial rotate-half RoPE (``partial_rotary_factor``,
    0.5 when not written: ``PhiConfig``'s). ``qk_layernorm``, a LayerNorm
    per head with a gain and a bias shared by the heads (``q_layernorm``,
    ``k_layernorm``, eps ``layer_norm_eps``), is Persimmon's part."""
    kw["biases"] = ("q", "k", "v", "o")
    layout["names"] = {"o": "dense"}
    if flag(cfg, "qk_layernorm"):
        kw["norm_eps"] = number(cfg, "layer_norm_eps", 1e-5)
        layout["cls"] = _QKLayerNormAttention
        layout["names"].update(q_norm="q_layernorm", k_norm="k_layernorm")


def _head_gain_norm(key):
    """Cohere (``use_qk_norm``) and StableLM (``qk_layernorm``): when
    ``key`` is true, a LayerNorm per head on q and k, each head its own
    gain and no bias, eps ``layer_norm_eps`` (1e-5 by default); StableLM
    keeps one module per head (``q_layernorm.norms.{h}``)."""

    def diff(cfg, i, layer_type, kw, layout):
        if not flag(cfg, key):
            return
        kw["norm_eps"] = number(cfg, "layer_norm_eps", 1e-5)
        layout["cls"] = _HeadGainLayerNormAttention
        if cfg.get("model_type") == "stablelm":
            layout["norm_per_head_module"] = True
            names = layout.setdefault("names", {})
            names.update(q_norm="q_layernorm", k_norm="k_layernorm")

    return diff


def _gpt_neo(cfg, i, layer_type, kw, layout):
    """GPT-Neo: scores ``q . k`` not divided by ``sqrt(d)`` (scale 1); a
    ``local`` layer sees the ``window_size`` latest keys, a ``global``
    one all; NoPE (learned positions outside); only ``out_proj`` has a
    bias."""
    _mha_only(cfg, "gpt_neo")
    _no_rope_keys(cfg, "gpt_neo", _OUTSIDE)
    kind = _neo_layers(cfg)[i]
    window = None
    if kind == "local":
        window = count(cfg, "window_size", required=False) or 256
    kw.update(use_rope=False, scale=1.0, biases=("o",), window=window)
    layout["names"] = {"o": "out_proj"}


def _neo_layers(cfg):
    """Each layer's kind, ``global`` or ``local``, from
    ``attention_types`` (``[[kinds, repeats], ...]``, each ``kinds``
    repeated; ``GPTNeoConfig``'s default ``[[["global", "local"], 12]]``)
    and checked against ``attention_layers`` when the file has both."""
    n = count(cfg, "num_hidden_layers")
    spec = cfg.get("attention_types")
    if spec is None:
        spec = [[["global", "local"], 12]]
    kinds = []
    try:
        for item_kinds, repeats in spec:
            if isinstance(repeats, bool) or not isinstance(repeats, int):
                raise TypeError
            for _ in range(repeats):
                kinds.extend(item_kinds)
    except (TypeError, ValueError):
        raise ValueError(
            "config key attention_types must be a list of [kinds, "
            f"repeats] pairs, got {spec!r:.200}"
        ) from None
    bad = sorted({k for k in kinds if k not in ("global", "local")})
    if len(kinds) != n or bad:
        raise ValueError(
            f"config key attention_types gives layers {kinds!r:.200}: "
            f"it must give {n} (num_layers), each 'global' or 'local'"
        )
    written = cfg.get("attention_layers")
    if written is not None and list(written) != kinds:
        raise ValueError(
            "config is contradictory: attention_layers "
            f"{written!r:.200} is not what attention_types gives"
        )
    return kinds


def _nanochat(cfg, i, layer_type, kw, layout):
    """nanochat turns each pair ``(x1, x2)`` of a head's two halves by
    ``-theta`` (its ``rotate_half`` gives ``(x2, -x1)``), then normalises
    q and k by their RMS with no gain. Let ``P`` swap a head's halves.
    Turning by ``-theta`` is ``P R(theta) P`` (R: the usual rotate-half
    RoPE), and the RMS norm commutes with ``P``, so nanochat's ``q`` is
    ``P`` times the usual layer's ``q`` made from rows swapped by ``P``;
    the same for ``k``; and ``(P a) . (P b) = a . b``. So the usual layer
    with each head's q and k rows (and biases) swapped by halves gives
    nanochat's scores exactly: the swap is a layout of the state dict
    (``layout["swap_halves"]``, undone for the gradients)."""
    if kw["rotary_dim"] is not None:
        raise ValueError(
            "config key partial_rotary_factor must be 1 for nanochat (HF "
            "turns the whole head; the swap of halves holds only then)"
        )
    kw.update(qk_norm="head", qk_norm_learned=False, qk_norm_after_rope=True)
    layout["swap_halves"] = True


# ------------------------------------------- hybrids: attention layers
def _index_list(cfg, key):
    """``cfg[key]``, a list of layer indices."""
    value = cfg.get(key)
    ok = isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )
    if not ok:
        raise ValueError(
            f"config key {key} must be a list of layer indices, got "
            f"{value!r:.200}"
        )
    return value


def _mamba_layer(model_type, i, mixer, rule):
    """The refusal of a hybrid's layer ``i`` that is not attention."""
    return ValueError(
        f"layer {i} of {model_type} is {mixer} layer, not attention "
        f"({rule}): attention_from_hf builds only its attention layers"
    )


def _bamba(cfg, i, layer_type, kw, layout):
    """Bamba: Llama's layer with RoPE on the first half of each head
    (``BambaConfig`` sets ``partial_rotary_factor`` 0.5 unless
    ``rope_parameters`` gives one) at the layers ``attn_layer_indices``
    lists; every other layer is a Mamba-2 mixer, refused by name."""
    indices = []  # BambaConfig: none listed, every layer is Mamba-2
    if cfg.get("attn_layer_indices") is not None:
        indices = _index_list(cfg, "attn_layer_indices")
    if i not in indices:
        rule = f"attn_layer_indices={indices}"
        raise _mamba_layer("bamba", i, "a Mamba-2 mixer", rule)
    top = cfg.get("partial_rotary_factor")
    inner = (cfg.get("rope_parameters") or {}).get("partial_rotary_factor")
    if top is not None and inner is None and top != 0.5:
        raise ValueError(
            f"config key partial_rotary_factor={top!r} is replaced by 0.5 "
            "in HF's BambaConfig (only rope_parameters' is read); "
            "refusing to guess which the file means"
        )


def _jamba(cfg, i, layer_type, kw, layout):
    """Jamba: an attention layer where ``i % attn_layer_period ==
    attn_layer_offset`` (8 and 4 by default), a Mamba mixer elsewhere
    (refused by name); NoPE (the Mamba layers carry position), no
    biases (HF writes ``bias=False``)."""
    period = count(cfg, "attn_layer_period", required=False) or 8
    offset = count(cfg, "attn_layer_offset", required=False, minimum=0)
    offset = 4 if offset is None else offset
    if i % period != offset:
        rule = f"attn_layer_period={period}, attn_layer_offset={offset}"
        raise _mamba_layer("jamba", i, "a Mamba mixer", rule)
    if cfg.get("sliding_window") is not None:
        raise ValueError(
            "config key sliding_window is not read by jamba's attention; "
            "refusing to build a window it lacks"
        )
    _no_rope_keys(cfg, "jamba", "its attention layers are NoPE")
    kw.update(use_rope=False, biases=(), window=None)


def _falcon_h1(cfg, i, layer_type, kw, layout):
    """Falcon-H1: Llama's layer with the keys multiplied by
    ``key_multiplier`` (1.0 by default) before RoPE; RoPE is linear, so
    it is the softmax scale ``key_multiplier / sqrt(d)``. Its
    ``attention_in_multiplier`` and ``attention_out_multiplier`` scale
    the module's input and output in the decoder layer, outside it."""
    d_model = count(cfg, "hidden_size")
    head_dim = count(cfg, "head_dim", required=False)
    head_dim = head_dim or d_model // count(cfg, "num_attention_heads")
    kw["scale"] = number(cfg, "key_multiplier", 1.0) * head_dim**-0.5


#: hybrids -> {a layer type that is not attention: what it is} (refused)
_CONV = "a short-convolution"  # LFM2's conv layers
_MIXERS = {
    "granitemoehybrid": {"linear_attention": "a Mamba-2 mixer"},
    "lfm2": {"conv": _CONV},
    "lfm2_moe": {"conv": _CONV},
    "nemotron_h": {
        "linear_attention": "a Mamba-2 mixer",
        "moe": "a mixture-of-experts MLP",
        "mlp": "an MLP",
    },
}


def _granitemoehybrid(cfg, i, layer_type, kw, layout):
    """Granite 4 (``granitemoehybrid``): Granite's scale
    ``attention_multiplier`` at its ``full_attention`` layers (its
    ``linear_attention`` layers are Mamba-2 mixers, refused by name);
    RoPE only when ``position_embedding_type`` is ``"rope"``, NoPE when
    it is null (the class's default)."""
    kw["scale"] = number(cfg, "attention_multiplier", 1.0)
    kind = cfg.get("position_embedding_type")
    if kind not in (None, "rope"):
        raise ValueError(
            "config key position_embedding_type must be null (NoPE) or "
            f"'rope' for granitemoehybrid, got {kind!r}"
        )
    kw["use_rope"] = kind == "rope"


def _all_mamba_types(cfg):
    """``layer_types`` as ``GraniteMoeHybridConfig`` fills it when the
    file has none: every layer a Mamba-2 mixer (``linear_attention``)."""
    if cfg.get("layer_types") is not None:
        return cfg
    n = count(cfg, "num_hidden_layers")
    return {**cfg, "layer_types": ["linear_attention"] * n}


#: model_type -> the rule its configuration class fills layer_types with
_CLASS_TYPES = {
    "granite_swa": _granite_swa_types,
    "granitemoe_swa": _granite_swa_types,
    "granitemoehybrid": _all_mamba_types,
    "lara_mini": _lara_mini_types,
    "modernbert-decoder": _modernbert_types,
    "lfm2": _lfm2_types,
    "lfm2_moe": _lfm2_types,
    "cohere_compass_text": _compass_types,
    "olmo_hybrid": _olmo_hybrid_types,
    **_GEMMA_TYPES,  # Gemma 3n: every fifth layer full; Gemma 4: sixth
}


def _class_layer_types(cfg, model_type):
    """``cfg`` with ``layer_types`` written out by
    :data:`_CLASS_WINDOWS`'s rule when the file has a window and no
    ``layer_types`` (a ``sliding_window_pattern`` it writes wins)."""
    if model_type in _CLASS_TYPES:  # families_more's rules
        return _CLASS_TYPES[model_type](cfg)
    if (
        model_type not in _CLASS_WINDOWS
        or cfg.get("layer_types") is not None
        or cfg.get("sliding_window") is None
    ):
        return cfg
    n = count(cfg, "num_hidden_layers")
    check_listed(cfg, n, f"{model_type}'s window rule")
    every = _CLASS_WINDOWS[model_type]
    if every is None:
        return {**cfg, "layer_types": [SLIDING] * n}
    pattern = count(cfg, "sliding_window_pattern", required=False)
    if model_type == "afmoe":  # AfmoeConfig's spelling of the pattern
        pattern = count(cfg, "global_attn_every_n_layers", required=False)
    return {**cfg, "layer_types": list(alternate(n, pattern or every))}


def _hybrid_layer(cfg, model_type, i):
    """``cfg`` for a hybrid's attention layer ``i``, or the refusal of a
    layer of another kind by name (:data:`_MIXERS`). The kinds that are
    not attention are written ``linear_attention`` in the returned
    ``layer_types``: the layer-type reader knows no MLP layers, and only
    layer ``i``'s own type matters from here."""
    other = _MIXERS.get(model_type)
    types = cfg.get("layer_types")
    if not other or not isinstance(types, list) or not 0 <= i < len(types):
        return cfg
    if types[i] in other:
        raise _mamba_layer(model_type, i, other[types[i]], "layer_types")
    mixed = ["linear_attention" if t in other else t for t in types]
    return {**cfg, "layer_types": mixed}


def _nemotron_h(cfg, i, layer_type, kw, layout):
    """Nemotron-H: its ``full_attention`` layers are Llama's layer
    without RoPE (the Mamba-2 layers carry position) and without biases
    (HF writes ``bias=False``); its other layers (Mamba-2, MoE, MLP) are
    refused by name. A ``sliding_window`` is refused: its attention
    never reads one."""
    if cfg.get("sliding_window") is not None:
        raise ValueError(
            f"config key sliding_window={cfg['sliding_window']!r} is not "
            "read by nemotron_h's attention; refusing to build a window it "
            "lacks"
        )
    _no_rope_keys(cfg, "nemotron_h", "its attention layers are NoPE")
    kw.update(use_rope=False, biases=(), window=None)


# ------------------------------------ RoPE keys read before the layer
# families whose rope_parameters carry Llama 4's query scale
_LLAMA_4_SCALED = ("ministral3",)


def _llama_4_scaling(cfg):
    """``(cfg, temperature)``: Ministral 3 writes a query scale by
    position into its ``rope_parameters``, ``llama_4_scaling_beta``
    (``b``) over ``original_max_position_embeddings`` (``M``): every
    query is multiplied by ``1 + b ln(1 + floor(p / M))`` after RoPE,
    Llama 4's temperature counted from ``p`` (``offset`` 0), on every
    layer. ``temperature`` is :class:`~attn_np.refinements.
    RefinedAttention`'s ``(M, b, 0)`` (None without the key); ``cfg``
    loses the key, and the copy of ``max_position_embeddings`` that HF's
    RoPE does not read."""
    rope = cfg.get("rope_parameters")
    if not isinstance(rope, dict) or "llama_4_scaling_beta" not in rope:
        return cfg, None
    beta = number(rope, "llama_4_scaling_beta")
    floor = count(rope, "original_max_position_embeddings")
    drop = ("llama_4_scaling_beta", "max_position_embeddings")
    rope = {k: v for k, v in rope.items() if k not in drop}
    return {**cfg, "rope_parameters": rope}, (floor, beta, 0)


def _mistral4(cfg, layer_idx, mla):
    """Mistral 4: DeepSeek-V3's MLA (``mla`` builds it) with Ministral
    3's query scale by position (:func:`_llama_4_scaling`), on both parts
    of every query. Its ``rope_parameters`` give the rotated share as
    ``partial_rotary_factor``, ``qk_rope_head_dim / (qk_nope_head_dim +
    qk_rope_head_dim)``: the decoupled key, which MLA turns whole."""
    cfg, temp = _llama_4_scaling(cfg)
    if temp is None:
        raise ValueError(
            "config needs rope_parameters' llama_4_scaling_beta for "
            "mistral4 (its layer scales every query by it)"
        )
    rope = dict(cfg["rope_parameters"])
    nope, r = count(cfg, "qk_nope_head_dim"), count(cfg, "qk_rope_head_dim")
    share = rope.pop("partial_rotary_factor", r / (nope + r))
    if abs(share * (nope + r) - r) > 1e-9:
        raise ValueError(
            "config's rope_parameters.partial_rotary_factor must be "
            f"qk_rope_head_dim / (qk_nope_head_dim + qk_rope_head_dim) = "
            f"{r}/{nope + r} for mistral4, got {share!r}"
        )
    cfg = {**cfg, "rope_parameters": rope}
    _, args, kw, layout = mla(cfg, "mistral4", layer_idx)
    kw["query_temperature"] = temp
    return _ScaledQueryLatentAttention, args, kw, layout


# HunYuan: rope_type "dynamic" with an alpha
_NTK_ALPHA = ("hunyuan_v1_dense", "hunyuan_v1_moe")


def _ntk_alpha(cfg):
    """``cfg`` with HunYuan's RoPE written as plain RoPE. Its files say
    ``rope_type`` ``dynamic`` with an ``alpha``: NTK's stretch of the
    base, fixed, ``theta alpha^(d / (d - 2))`` for heads of ``d``
    (transformers 5.24.0 names it ``ntk_alpha`` and reads nothing else of
    the type: not ``factor``, nor the YaRN keys some files carry). A
    dynamic type without ``alpha`` stays, for the RoPE reader to refuse
    (its frequencies change with the sequence's length)."""
    rope = (rope_parameters(cfg) or {}).get(FULL) or {}
    if rope.get("rope_type") != "dynamic" or not rope.get("alpha"):
        return cfg
    d = count(cfg, "head_dim")
    if d < 4:
        raise ValueError(f"config key head_dim must be at least 4, got {d}")
    theta = number(rope, "rope_theta") * number(rope, "alpha") ** (
        d / (d - 2)
    )
    out = {
        k: v
        for k, v in cfg.items()
        if k not in ("rope_theta", "rope_scaling")
    }
    out["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    return out


def _hunyuan(cfg, i, layer_type, kw, layout):
    """HunYuan: after RoPE, an RMSNorm of each head of q and k with
    learned gains (``query_layernorm``, ``key_layernorm``)."""
    layout["cls"] = _PostRopeGainAttention
    layout["names"] = {
        "q_norm": "query_layernorm",
        "k_norm": "key_layernorm",
    }


# multimodal RoPE's keys (Qwen3-VL, Qwen3.5): how the angles of a token's
# three positions (time, height, width) share the frequencies
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def _text_positions(cfg):
    """``cfg`` without the multimodal RoPE keys of its ``rope_parameters``.
    Qwen3.5 turns each token by three positions (time, height, width),
    each over its own share of the frequencies (``mrope_section``); a
    text token has the same position on all three, so every frequency
    turns by that one position: the plain RoPE the layer builds, with the
    same base and partial factor (the fixture matches to 1e-15)."""
    rope = cfg.get("rope_parameters")
    if not isinstance(rope, dict) or not set(rope) & set(_MROPE_KEYS):
        return cfg
    rope = {k: v for k, v in rope.items() if k not in _MROPE_KEYS}
    return {**cfg, "rope_parameters": rope}


def _afmoe(cfg, i, layer_type, kw, layout):
    """AFMoE (Arcee): per-head QK RMSNorm (Qwen3's), RoPE on the window
    layers only (NoPE full layers, as Cohere 2's), and an output gate
    from a projection of its own: ``y = (o * sigmoid(x W_g)) W_o``,
    ``W_g`` HF's ``gate_proj``."""
    kw["qk_norm"] = "head"
    kw["use_rope"] = kw["window"] is not None
    kw["gate"] = "elementwise"
    layout["gate_proj"] = "gate_proj"


def _clip_qkv(cfg, i, layer_type, kw, layout):
    """OLMo's and OLMoE's ``clip_qkv``: q, k and v, each clamped to
    ``[-clip_qkv, clip_qkv]`` after the projection (and OLMoE's QK-norm),
    before RoPE: chapter 10's projection part with ``clip``. Null: no
    clamp; anything but a positive number is refused by name."""
    bound = number(cfg, "clip_qkv")
    if bound is not None:
        kw["clip_qkv"] = bound
