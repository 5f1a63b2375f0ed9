"""Families whose configuration classes fill in their own layer pattern
(``layer_types``), window or RoPE per layer type when a file does not
write them, each a difference from the plain decoder (chapter 10):

* Lara Mini: Qwen3's per-head QK-norm, RoPE on its ``sliding_attention``
  layers only, and Qwen3.5's Gated DeltaNet (its projections split) on its
  ``linear_attention`` layers, in a period of five;
* ModernBERT's decoder: every head its own keys and values, biases on all
  four projections, the output ``Wo``, a window of ``local_attention //
  2`` on two layers in three, and RoPE bases per layer type;
* LFM2 and LFM2-MoE: Qwen3's per-head QK-norm under the names
  ``q_layernorm`` and ``k_layernorm``, ``out_proj``; their short
  convolutions (``conv`` layers) are refused by name;
* Cohere Compass's text model: Llama's layer with RoPE parameters per
  layer type, ``null`` for a layer type without RoPE, and multimodal
  RoPE's keys, which leave a text token's rotation as plain RoPE's;
* OLMo Hybrid: OLMo 2's QK-norm over the whole projection, RoPE (when
  its base is not ``null``) on its ``full_attention`` layers, and
  chapter 12's Gated DeltaNet, ``beta`` doubled and the projections
  each its own, on its ``linear_attention`` layers, three in four.

SmolLM3 (NoPE every fourth layer unless ``no_rope_layers`` says), Cohere
2 and EXAONE 4 (RoPE on the window layers only) and Mellum (RoPE bases
per layer type) are here too.

Read off each family's modeling file in ``transformers`` 5.24.0 and
matched by ``tests/fixtures/families/<model_type>.npz``.
"""

from __future__ import annotations

from .config import (
    FULL,
    LINEAR,
    SLIDING,
    count,
    flag,
    get_object,
    number,
    rope_flags,
)


def _lara_mini_types(cfg):
    """``layer_types`` as ``LaraMiniConfig`` fills it when the file has
    none: the released period of five, ``linear_attention``,
    ``sliding_attention``, ``linear_attention``, ``full_attention``,
    ``sliding_attention``."""
    if cfg.get("layer_types") is not None:
        return cfg
    n = count(cfg, "num_hidden_layers")
    period = ("linear_attention", SLIDING, "linear_attention", FULL, SLIDING)
    return {**cfg, "layer_types": [period[i % 5] for i in range(n)]}


def _lara_mini(cfg, i, layer_type, kw, layout):
    """Lara Mini: Qwen3's per-head QK RMSNorm (gain ``w``), RoPE on the
    ``sliding_attention`` layers only (the model hands the rotation to
    those layers and none to the ``full_attention`` ones, whatever the
    window), its ``linear_attention`` layers Qwen3.5's Gated DeltaNet."""
    kw["qk_norm"] = "head"
    kw["use_rope"] = layer_type == SLIDING


def _modernbert_types(cfg):
    """``layer_types`` and ``sliding_window`` as
    ``ModernBertDecoderConfig`` sets them: layer ``i`` full when ``i %
    global_attn_every_n_layers == 0`` (3 by default), else sliding, when
    the file writes no ``layer_types``; the window always
    ``local_attention // 2`` (128 // 2 by default), whatever
    ``sliding_window`` the file writes, so a file whose
    ``sliding_window`` says otherwise is refused."""
    out = dict(cfg)
    if cfg.get("layer_types") is None:
        n = count(cfg, "num_hidden_layers")
        every = count(cfg, "global_attn_every_n_layers", required=False)
        every = every or 3
        out["layer_types"] = [
            FULL if i % every == 0 else SLIDING for i in range(n)
        ]
    local = cfg.get("local_attention", 128)
    if local is None or local == 0:  # HF's window is then -1
        raise ValueError(
            f"config key local_attention={local!r} gives "
            "modernbert-decoder's sliding layers a window of -1, which "
            "attention_from_hf does not build"
        )
    window = count({"local_attention": local}, "local_attention") // 2
    written = cfg.get("sliding_window")
    if written is not None and written != window:
        raise ValueError(
            f"config is contradictory: sliding_window={written!r}, but "
            f"modernbert-decoder's window is local_attention // 2 = "
            f"{window}"
        )
    out["sliding_window"] = window
    return out


def _modernbert_decoder(cfg, i, layer_type, kw, layout):
    """ModernBERT's decoder: every head its own keys and values,
    ``attention_bias`` on all four projections, the output ``Wo``, a
    window on the sliding layers (:func:`_modernbert_types`) and RoPE per
    layer type (bases 160,000 full and 10,000 sliding when the file
    writes none)."""
    model_type = cfg.get("model_type")
    n_heads = count(cfg, "num_attention_heads")
    for key, want in (
        ("num_key_value_heads", n_heads),
        ("head_dim", count(cfg, "hidden_size") // n_heads),
    ):
        if cfg.get(key) not in (None, want):
            raise ValueError(
                f"config key {key}={cfg[key]!r} is not read by "
                f"{model_type}'s attention (its heads are hidden_size // "
                f"num_attention_heads wide, each its own keys and values)"
            )
    layout["names"] = {"o": "Wo"}
    if all(cfg.get(k) is None for k in ("rope_parameters", "rope_theta")):
        kw["rope_base"] = 160000.0 if layer_type != SLIDING else 10000.0


def _lfm2_types(cfg):
    """``layer_types`` as ``Lfm2Config`` fills it when the file has none:
    ``full_attention`` at ``full_attn_idxs`` (every layer by default),
    ``conv`` elsewhere. ``Lfm2MoeConfig`` fills nothing, and its model
    reads ``layer_types`` for every layer: a file without it is
    refused."""
    if cfg.get("layer_types") is not None:
        return cfg
    if cfg.get("model_type") == "lfm2_moe":
        raise ValueError(
            "config key layer_types is missing: lfm2_moe's configuration "
            "class leaves it unset, and its model reads it for every layer"
        )
    n = count(cfg, "num_hidden_layers")
    full = cfg.get("full_attn_idxs")
    full = range(n) if full is None else full
    if not isinstance(full, (list, range)) or any(
        not isinstance(j, int) or isinstance(j, bool) for j in full
    ):
        raise ValueError(
            f"config key full_attn_idxs must be a list of layer indices, "
            f"got {full!r:.200}"
        )
    return {**cfg, "layer_types": [FULL if i in full else "conv" for i in
                                   range(n)]}  # fmt: skip


def _lfm2(cfg, i, layer_type, kw, layout):
    """LFM2 and LFM2-MoE: Qwen3's per-head QK RMSNorm (gain ``w``, eps
    ``norm_eps``) under the names ``q_layernorm`` and ``k_layernorm``, no
    bias, the output ``out_proj``; its ``conv`` layers are short
    convolutions, refused by name."""
    kw.update(qk_norm="head", norm_eps=number(cfg, "norm_eps", 1e-5))
    kw["biases"] = ()
    layout["names"] = {
        "o": "out_proj",
        "q_norm": "q_layernorm",
        "k_norm": "k_layernorm",
    }


# multimodal RoPE's keys: a text token has one position on all three axes
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def _compass_types(cfg):
    """Cohere Compass's text model as its configuration class and rotary
    embedding read it: every layer ``full_attention`` when the file
    writes no ``layer_types``; ``rope_parameters`` one entry per layer
    type (the top-level ``rope_theta`` and ``rope_type`` beside them are
    dropped, as the class drops them), ``null`` for a type without RoPE
    (kept as ``_nope_types``), its multimodal keys left out. A layer type
    without an entry is refused: the model would fail on it."""
    out = dict(cfg)
    if out.get("layer_types") is None:
        out["layer_types"] = [FULL] * count(cfg, "num_hidden_layers")
    types = sorted(set(out["layer_types"]))
    rope = cfg.get("rope_parameters")
    missing = [
        t for t in types if not isinstance(rope, dict) or t not in rope
    ]
    if missing:
        raise ValueError(
            f"config key rope_parameters has no entry for the layer types "
            f"{missing}: cohere_compass_text's rotary embedding reads one "
            "per layer type (null for no RoPE)"
        )
    nope = [t for t in types if rope[t] is None]
    per = {}
    for t in types:
        entry = rope[t] if rope[t] is not None else {"rope_theta": 1.0}
        if not isinstance(entry, dict):
            raise ValueError(
                f"config key rope_parameters.{t} must be an object or "
                f"null, got {entry!r:.80}"
            )
        per[t] = {k: v for k, v in entry.items() if k not in _MROPE_KEYS}
    out["rope_parameters"] = per
    out["_nope_types"] = nope
    return out


def _compass(cfg, i, layer_type, kw, layout):
    """Cohere Compass's text model: Llama's layer, the window on its
    sliding layers, and no RoPE on a layer type whose RoPE parameters
    are ``null``."""
    kw["use_rope"] = layer_type not in cfg.get("_nope_types", ())


def _smollm3(cfg, i, layer_type, kw, layout):
    """NoPE where ``no_rope_layers[i] == 0`` (absent: every
    ``no_rope_layer_interval``-th layer, 4 by default, as
    ``SmolLM3Config`` fills it); a sliding layer's window only when
    ``use_sliding_window`` is true."""
    n = count(cfg, "num_hidden_layers", required=False)
    types = cfg.get("layer_types")
    if n is None and isinstance(types, list):
        n = len(types)
    flags = rope_flags(cfg, n)
    if flags is None:
        every = count(cfg, "no_rope_layer_interval", required=False) or 4
        kw["use_rope"] = (i + 1) % every != 0
    else:
        kw["use_rope"] = bool(flags[i])
    if not flag(cfg, "use_sliding_window"):
        kw["window"] = None


def _rope_if_windowed(cfg, i, layer_type, kw, layout):
    """Cohere 2: RoPE on the window layers only (HF turns q and k iff
    the layer's ``sliding_window`` is set); every other layer is NoPE."""
    kw["use_rope"] = kw["window"] is not None


def _exaone4_rope(cfg, i, layer_type, kw, layout):
    """EXAONE 4: RoPE on the window layers, NoPE on the full ones; every
    layer turns when the config has no ``sliding_window``."""
    if cfg.get("sliding_window") is not None:
        kw["use_rope"] = kw["window"] is not None


def _mellum(cfg, i, layer_type, kw, layout):
    """Mellum: Qwen3's per-head QK-norm; a file without RoPE keys takes
    ``MellumConfig``'s bases, 5e5 on full layers and 1e4 on sliding
    ones."""
    kw["qk_norm"] = "head"  # Qwen3's
    no_rope_keys = all(
        cfg.get(k) is None for k in ("rope_parameters", "rope_theta")
    )
    if no_rope_keys and kw["window"] is None:
        kw["rope_base"] = 500000.0


def _olmo_hybrid_types(cfg):
    """``cfg`` as ``OlmoHybridConfig`` fills it: ``layer_types`` every
    fourth layer ``full_attention``, the others ``linear_attention`` (the
    last full if none is); the linear layers' sizes where the file writes
    none (``num_attention_heads`` key and value heads, keys ``int(0.75
    hidden_size / n_k)`` wide, values twice that, a convolution of 4).
    The model turns its full layers by RoPE unless the base it reads is
    ``null`` (the released files: NoPE), kept as ``_nope``. Any other
    layer type is refused, as the model fails on it."""
    out = dict(cfg)
    n = count(cfg, "num_hidden_layers")
    if out.get("layer_types") is None:
        types = [FULL if i % 4 == 3 else LINEAR for i in range(n)]
        if FULL not in types:
            types[-1] = FULL
        out["layer_types"] = types
    types = out["layer_types"]
    other = (
        sorted(set(types) - {FULL, LINEAR})
        if isinstance(types, list)
        else types
    )
    if other:
        raise ValueError(
            f"config key layer_types holds {other!r:.80}: olmo_hybrid's "
            "model builds linear_attention and full_attention layers only"
        )
    heads = count(cfg, "num_attention_heads")
    sizes = {"linear_num_key_heads": heads, "linear_num_value_heads": heads}
    for key, value in sizes.items():
        if out.get(key) is None:
            out[key] = value
    if out.get("linear_key_head_dim") is None:
        hidden = count(cfg, "hidden_size")
        out["linear_key_head_dim"] = int(
            0.75 * hidden / count(out, "linear_num_key_heads")
        )
    if out.get("linear_value_head_dim") is None:
        out["linear_value_head_dim"] = 2 * count(out, "linear_key_head_dim")
    if out.get("linear_conv_kernel_dim") is None:
        out["linear_conv_kernel_dim"] = 4
    return _olmo_hybrid_rope(out)


def _olmo_hybrid_rope(cfg):
    """The base OLMo Hybrid's rotary embedding reads: ``rope_parameters
    .rope_theta``, else a top-level ``rope_theta``, else 10,000; a
    ``null`` base leaves every layer unturned (``_nope``). Its default
    RoPE turns the whole head whatever ``partial_rotary_factor`` says,
    and its other types fail on one: a factor below 1 is refused."""
    rope = get_object(cfg, "rope_parameters") or {}
    if "rope_theta" in rope:
        theta = rope["rope_theta"]
    else:
        theta = cfg.get("rope_theta", 10000.0)
    for where in (rope, cfg):
        f = where.get("partial_rotary_factor")
        if f is not None and f != 1:
            raise ValueError(
                f"config key partial_rotary_factor={f!r}: olmo_hybrid's "
                "rotary embedding turns the whole head (its default RoPE "
                "ignores the factor and its scaled ones fail on it)"
            )
    if theta is not None:
        return {**cfg, "_nope": False}
    out = {k: v for k, v in cfg.items() if k not in ("rope_theta",)}
    out["rope_parameters"] = {"rope_type": "default", "rope_theta": 1.0}
    return {**out, "_nope": True}


def _olmo_hybrid(cfg, i, layer_type, kw, layout):
    """OLMo Hybrid's attention layers (``OlmoHybridAttention``, OLMo 3's):
    an RMSNorm over the whole q and k projections (OLMo 2's), no window,
    RoPE unless the base is ``null`` (:func:`_olmo_hybrid_rope`)."""
    kw["qk_norm"] = "proj"
    kw["use_rope"] = not cfg.get("_nope", False)


# Families whose rotary embedding in transformers 5.24.0 turns every
# feature of the head whatever partial_rotary_factor says (checked by
# building each one's rotary with the factor 0.5 written: its inv_freq
# keeps head_dim / 2 entries)
_PARTIAL_IGNORED = frozenset(
    """llama mistral qwen2 qwen3 gemma2 olmo2 llama4_text mixtral phimoe
    ministral arcee gemma jais2 helium ernie4_5 ernie4_5_moe seed_oss
    qwen2_moe starcoder2 qwen3_moe olmoe olmo vaultgemma granite granitemoe
    granitemoeshared hyperclovax cohere cohere2 afmoe exaone4 kolibri1 flint
    aria_text exaone internlm3 iquestcoder bitnet diffllama hunyuan_v1_dense
    hunyuan_v1_moe hy_v3 exaone_moe cohere2_moe granite_swa granitemoe_swa
    nanochat falcon_h1 lara_mini lfm2""".split()
)


def _refuse_unread_partial(model_type, factor):
    """Refuse a ``partial_rotary_factor`` other than 1 written for a family
    whose rotary embedding does not read it (:data:`_PARTIAL_IGNORED`):
    Hugging Face turns the whole head, and a partial rotation here would
    be another layer."""
    if model_type in _PARTIAL_IGNORED and factor not in (None, 1, 1.0):
        raise ValueError(
            f"config key partial_rotary_factor={factor!r} is not read by "
            f"{model_type}'s rotary embedding in transformers (it turns "
            "every feature of the head): attention_from_hf refuses it "
            "rather than build a rotation the model does not make"
        )
