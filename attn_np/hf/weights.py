"""Hugging Face's state dicts, mapped onto the book's layers and back.

HF's ``nn.Linear`` weights are ``[out, in]``, the book's ``W`` are ``[in,
out]``; some families fuse or interleave projections:

* q/k/v/o families (:func:`load_state`, :func:`to_hf`): ``q_proj`` ...
  ``o_proj`` with their biases and QK-norms, gpt-oss's ``sinks``;
  Qwen3-Next's ``q_proj`` holds each head's query then its gate; other
  names where the layout says (``out_proj``, Phi's ``dense``, CTRL's
  ``Wq`` ... ``dense``); nanochat's q and k with each head's halves
  swapped (:func:`_swap_halves`);
* one fused q/k/v weight (Falcon's ``query_key_value`` per group, per
  head or as MQA; Phi-3's ``qkv_proj``; GPT-2's ``Conv1D`` ``c_attn``;
  BLOOM's, MPT's, GPT-BigCode's): :mod:`attn_np.hf.fused`;
* MLA (DeepSeek): ``kv_a_proj_with_mqa``, ``kv_b_proj`` with each head's
  key and value rows, and V3.2's indexer (:func:`indexer_to_hf`);
* Qwen3-Next's Gated DeltaNet (:func:`gated_deltanet_from_hf`,
  :func:`gated_deltanet_grads_to_hf`): ``in_proj_qkvz`` grouped by key
  head, ``in_proj_ba``, one ``conv1d`` over ``[q | k | v]``; Qwen3.5's
  the same layer with ``in_proj_qkv`` (``[q | k | v]``), ``in_proj_z``,
  ``in_proj_b`` and ``in_proj_a`` each its own (:data:`SPLIT_LINEAR_TYPES`);
  OLMo Hybrid's with ``q_proj``, ``k_proj``, ``v_proj``, ``g_proj`` (the
  output gate), ``b_proj``, ``a_proj``, ``o_norm`` and ``o_proj``, its
  ``beta`` doubled.
"""

from __future__ import annotations

import copy

import numpy as np

from ..linear import GatedDeltaNet
from .config import count, flag, language_model, number
from .families_diff import _LAMBDAS
from .families_types import _olmo_hybrid_types
from .fused import _fused_names, _fused_to_hf, _load_fused


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
        if layout.get("mistral_large"):  # its query scale's gains
            names["softmax_scaling.scale"] = "qs_slope"
            names["softmax_scaling.bias"] = "qs_bias"
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
    if layout["kind"] == "fused":
        return _fused_names(layout, layer)
    names = {}
    spell = layout.get("names", {})  # OPT's out_proj, CTRL's Wq, ...
    for n in ("q", "k", "v", "o"):
        if f"W_{n}" not in p:  # a reader's k and v; Gemma 4's k_eq_v
            continue
        pre = spell.get(n, f"{n}_proj")
        names[f"{pre}.weight"] = f"W_{n}"
        if f"b_{n}" in p:
            names[f"{pre}.bias"] = f"b_{n}"
    for n in ("q", "k"):  # HunYuan's query_layernorm, key_layernorm
        pre = spell.get(f"{n}_norm", f"{n}_norm")
        if f"{n}_norm" in p and layout.get("norm_per_head_module"):
            for h in range(p[f"{n}_norm"].shape[0]):  # StableLM's
                names[f"{pre}.norms.{h}.weight"] = None
        elif f"{n}_norm" in p:
            names[f"{pre}.weight"] = f"{n}_norm"
        if f"{n}_norm_bias" in p:  # Phi's LayerNorm per head
            names[f"{pre}.bias"] = f"{n}_norm_bias"
    if "o_norm" in p:  # BitNet's attn_sub_norm
        names[f"{spell.get('o_norm', 'o_norm')}.weight"] = "o_norm"
    if "sinks" in p:
        names["sinks"] = "sinks"
    for n in _LAMBDAS:  # DiffLlama's lambda_q1 ... lambda_k2
        if n in p:
            names[n] = n
    if layout.get("gate_proj"):  # an output gate's own projection (AFMoE)
        names[f"{layout['gate_proj']}.weight"] = "W_g"
    if "b_g" in p:  # its bias per head (Beam's gate_bias)
        names["gate_bias"] = "b_g"
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


def _check_hf_shape(a, entry, shape, why):
    """Refuse state_dict ``entry`` unless its HF-layout shape is
    ``shape`` (``why`` says what the rows hold): checked before any fused
    weight is split, so a transposed or mis-sized one never reshapes."""
    if a.shape != tuple(shape):
        raise ValueError(
            f"state_dict entry {entry} has shape {a.shape}, the config "
            f"says {tuple(shape)} ({why})"
        )


# Mistral Large 4's indexer: its query norm and query scale, and the
# model's learned RoPE frequencies (rotary_emb.alpha), which its layers
# read as a setting
_INDEXER_ML4 = {
    "indexer.q_input_norm.weight": "g_qn",
    "indexer.q_input_norm.bias": "b_qn",
    "indexer.softmax_scaling.scale": "qs_slope",
    "indexer.softmax_scaling.bias": "qs_bias",
}
_ALPHA = "rotary_emb.alpha"


def _load_indexer(layer, got, layout):
    p = layer.indexer.params
    names = dict(_INDEXER)
    if layout.get("mistral_large"):
        names.update(_INDEXER_ML4)
        layer.set_rope_log_gain(got[_ALPHA])
    for hf, key in names.items():
        a = got[hf]
        _store(p, key, a.T if a.ndim == 2 else a, hf)


def indexer_to_hf(layer):
    """A V3.2 layer's indexer weights under HF's names and layout."""
    p = layer.indexer.params
    return {
        hf: p[key].T if p[key].ndim == 2 else p[key]
        for hf, key in _INDEXER.items()
    }


def _gate_split(layer, w):
    """Qwen3-Next's q_proj rows: per head [query d, gate d]."""
    _check_hf_shape(
        w,
        "q_proj.weight",
        (2 * layer.n_heads * layer.d, layer.d_model),
        f"each of the {layer.n_heads} heads' query then its gate rows",
    )
    rest = w.shape[1:]
    t = w.reshape(layer.n_heads, 2, layer.d, *rest)
    return t[:, 0].reshape(-1, *rest), t[:, 1].reshape(-1, *rest)


def load_state(layer, layout, state_dict, dtype):
    """Fill ``layer.params`` from HF's ``state_dict`` (``layout`` from
    :func:`~attn_np.hf.families.layer_settings`); every name checked."""
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
    if layout.get("mistral_large"):
        names.update(dict.fromkeys([*_INDEXER_ML4, _ALPHA]))
    extra = sorted(set(state_dict) - set(names))
    missing = sorted(set(names) - set(state_dict))
    if extra or missing:
        prefix = layout.get("prefix", "model.layers.{i}.self_attn.")
        raise ValueError(
            f"state_dict does not fit this layer: unexpected {extra}, "
            f"missing {missing} (names without the '{prefix}' prefix)"
        )
    p = layer.params
    got = {}
    for k, v in state_dict.items():
        a = np.asarray(v)
        if a.dtype.kind != "f":  # an int or complex weight is a mistake
            raise TypeError(
                f"state_dict entry {k} must be an array of floating-point "
                f"numbers, got dtype {a.dtype}"
            )
        got[k] = a.astype(dtype, copy=False)
    for k, a in got.items():
        bad = a.size - int(np.isfinite(a).sum())
        if bad:
            raise ValueError(
                f"state_dict entry {k} has {bad} NaN or inf value(s) in "
                f"its {a.size}"
            )
    if layout["kind"] == "fused":  # one q/k/v weight (attn_np.hf.fused)
        new, source = _load_fused(layer, layout, got)
    else:
        new, source = {}, {}
        for hf, key in names.items():
            a = got[hf]
            if key is not None:
                flip = a.ndim == 2 and key not in _GAINS
                new[key], source[key] = (a.T if flip else a), hf
        if layout.get("norm_per_head_module"):
            new.update(_stack_head_norms(layout, layer, got))
    if layout["kind"] == "mla":
        new.update(_mla_split(layer, got))
    if layout.get("indexer"):
        _load_indexer(layer, got, layout)
    if layout.get("gate_rows"):
        q, g = _gate_split(layer, got["q_proj.weight"])
        new["W_q"], new["W_g"] = q.T, g.T
    if layout.get("swap_halves"):
        for key in _SWAPPED:
            if key in new and new[key].shape == p[key].shape:
                new[key] = _swap_halves(new[key], layer.d)
    for key, a in new.items():
        _store(p, key, a, source.get(key, f"for {key}"))


def to_hf(layout, layer, d):
    """A dict in the layer's keys -> HF's names and layout."""
    if layout["kind"] == "fused":
        return _fused_to_hf(layout, layer, d)
    names = _hf_names(layout, layer)
    if layout.get("swap_halves"):
        d = {
            k: _swap_halves(a, layer.d) if k in _SWAPPED else a
            for k, a in d.items()
        }
    out = {}
    for hf, key in names.items():
        if key is None:
            continue
        a = d[key]
        out[hf] = a.T if a.ndim == 2 and key not in _GAINS else a
    if layout.get("norm_per_head_module"):
        spell = layout.get("names", {})
        for n in ("q", "k"):
            pre = spell.get(f"{n}_norm", f"{n}_norm")
            for h, row in enumerate(d[f"{n}_norm"]):
                out[f"{pre}.norms.{h}.weight"] = row
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


_SWAPPED = ("W_q", "W_k", "b_q", "b_k")
# gains of a norm per head, [heads, d] in both layouts (Cohere's q_norm)
_GAINS = ("q_norm", "k_norm")


def _stack_head_norms(layout, layer, got):
    """StableLM's ``q_layernorm.norms.{h}.weight`` (one LayerNorm per
    head) stacked into the layer's ``q_norm [H, d]`` (``k_norm [n_kv,
    d]``)."""
    spell, out = layout.get("names", {}), {}
    for n in ("q", "k"):
        pre = spell.get(f"{n}_norm", f"{n}_norm")
        heads, d = layer.params[f"{n}_norm"].shape
        rows = []
        for h in range(heads):
            entry = f"{pre}.norms.{h}.weight"
            _check_hf_shape(got[entry], entry, (d,), "one head's gains")
            rows.append(got[entry])
        out[f"{n}_norm"] = np.stack(rows)
    return out


def _swap_halves(a, d):
    """nanochat's layout (:func:`~attn_np.hf.families_more._nanochat`):
    each head's two halves of its ``d`` q or k features swapped, along
    the last axis (``W [in, H d]`` or ``b [H d]``). Its own inverse."""
    t = a.reshape(*a.shape[:-1], -1, 2, d // 2)  # [..., H, 2, d/2]
    return np.ascontiguousarray(t[..., ::-1, :]).reshape(a.shape)


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
    q_in = layer.d_model if q_name == "q_proj.weight" else layer.d_latent_q
    _check_hf_shape(
        got[q_name],
        q_name,
        (h * sum(dims), q_in),
        f"each of the {h} heads' {dims[0]} no-RoPE then {dims[1]} RoPE rows",
    )
    _check_hf_shape(
        got["kv_a_proj_with_mqa.weight"],
        "kv_a_proj_with_mqa.weight",
        (d_c + layer.d_rope, layer.d_model),
        f"the {d_c} latent then the {layer.d_rope} shared RoPE rows",
    )
    _check_hf_shape(
        got["kv_b_proj.weight"],
        "kv_b_proj.weight",
        (h * (dims[0] + layer.d_head_v), d_c),
        f"each of the {h} heads' {dims[0]} key then {layer.d_head_v} "
        "value rows",
    )
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


def load_linear(layer, layout, state_dict, dtype):
    """:func:`gated_deltanet_from_hf` reads the weights; this layer takes
    them."""
    src = gated_deltanet_from_hf(layout["config"], state_dict, dtype=dtype)
    layer.params, layer.grads = src.params, src.grads


def linear_to_hf(layer, d):
    view = copy.copy(layer)  # the same layer, reading d as its grads
    view.grads = d
    names = layer.hf_layout.get("names", "fused")
    return gated_deltanet_grads_to_hf(view, names=names)


# ------------------------------------------------ Qwen3-Next's linear layer
HF_LINEAR_KEYS = (
    "in_proj_qkvz.weight",
    "in_proj_ba.weight",
    "conv1d.weight",
    "A_log",
    "dt_bias",
    "norm.weight",
    "out_proj.weight",
)
# Qwen3.5's layer: the same Gated DeltaNet, its projections split
HF_LINEAR_SPLIT_KEYS = (
    "in_proj_qkv.weight",
    "in_proj_z.weight",
    "in_proj_b.weight",
    "in_proj_a.weight",
    "conv1d.weight",
    "A_log",
    "dt_bias",
    "norm.weight",
    "out_proj.weight",
)
# the model types whose linear_attention layers keep the split projections
SPLIT_LINEAR_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "lara_mini")
# OLMo Hybrid's layer: q, k, v, the output gate g, b and a each its own
# projection, the norm o_norm, the output o_proj; beta doubled
_HF_LINEAR_SEPARATE_KEYS = (
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "g_proj.weight",
    "b_proj.weight",
    "a_proj.weight",
    "conv1d.weight",
    "A_log",
    "dt_bias",
    "o_norm.weight",
    "o_proj.weight",
)
_SEPARATE_LINEAR_TYPES = ("olmo_hybrid",)
# each layout's keys, and its names for the norm's gain and W_o
_LINEAR_KEYS = {
    "fused": (HF_LINEAR_KEYS, "norm.weight", "out_proj.weight"),
    "split": (HF_LINEAR_SPLIT_KEYS, "norm.weight", "out_proj.weight"),
    "separate": (
        _HF_LINEAR_SEPARATE_KEYS,
        "o_norm.weight",
        "o_proj.weight",
    ),
}
_LINEAR_CONFIG = (
    "hidden_size",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


def _linear_layout(cfg) -> str:
    """How a model type names its linear layer's weights: ``"fused"``
    (Qwen3-Next), ``"split"`` (Qwen3.5) or ``"separate"`` (OLMo
    Hybrid)."""
    kind = cfg.get("model_type")
    if kind in _SEPARATE_LINEAR_TYPES:
        return "separate"
    return "split" if kind in SPLIT_LINEAR_TYPES else "fused"


def _linear_options(cfg) -> dict:
    """The layer's settings beyond its sizes: the output norm's ``eps``
    (``rms_norm_eps``; OLMo Hybrid's is 1e-5, FLA's, whatever the file
    says) and OLMo Hybrid's doubled ``beta`` (``linear_allow_neg_eigval``,
    true unless the file says false)."""
    if _linear_layout(cfg) != "separate":
        return {"eps": number(cfg, "rms_norm_eps", 1e-6)}
    neg = flag(cfg, "linear_allow_neg_eigval") is not False
    return {"eps": 1e-5, "allow_neg_eigval": neg}


def _linear_dims(config) -> dict:
    """The Gated DeltaNet's sizes from a Qwen3-Next ``config.json`` dict
    (its ``text_config`` when there is one; OLMo Hybrid's sizes filled as
    its configuration class fills them)."""
    if not isinstance(config, dict):
        raise TypeError(
            "config must be a dict (a config.json), got "
            f"{type(config).__name__}"
        )
    cfg = language_model(config)
    if _linear_layout(cfg) == "separate":
        cfg = _olmo_hybrid_types(cfg)
    missing = [k for k in _LINEAR_CONFIG if k not in cfg]
    if missing:
        raise ValueError(
            f"config has no {', '.join(missing)}: not a Qwen3-Next-style "
            "config with linear_attention layers"
        )
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(
            f"hidden_act must be 'silu' (the convolution's and the output "
            f"gate's activation), got {act!r}"
        )
    d, n_k, n_v, d_k, d_v, K = (count(cfg, k) for k in _LINEAR_CONFIG)
    names = _linear_layout(cfg)
    return dict(d=d, n_k=n_k, n_v=n_v, d_k=d_k, d_v=d_v, K=K, cfg=cfg,
                names=names)  # fmt: skip


def _linear_state(state_dict, s) -> dict:
    """HF's arrays, each checked against the shape the config gives."""
    if not isinstance(state_dict, dict):
        raise TypeError(
            "state_dict must be a dict of arrays, got "
            f"{type(state_dict).__name__}"
        )
    keys, norm, out = _LINEAR_KEYS[s["names"]]
    extra = sorted(set(state_dict) - set(keys))
    if extra:
        raise ValueError(
            f"state_dict does not fit this layer: unexpected {extra} "
            "(names without the 'model.layers.{i}.linear_attn.' prefix; "
            f"a {s['cfg'].get('model_type')} layer has {', '.join(keys)})"
        )
    gone = [k for k in keys if k not in state_dict]
    if gone:
        raise ValueError(
            f"state_dict lacks {', '.join(gone)} (keys are expected without "
            "the 'model.layers.{i}.linear_attn.' prefix)"
        )
    d, n_k, n_v, d_k, d_v, K = (s[k] for k in "d n_k n_v d_k d_v K".split())
    if s["names"] == "separate":  # OLMo Hybrid: each its own
        expect = {
            "q_proj.weight": (n_k * d_k, d),
            "k_proj.weight": (n_k * d_k, d),
            "v_proj.weight": (n_v * d_v, d),
            "g_proj.weight": (n_v * d_v, d),
            "b_proj.weight": (n_v, d),
            "a_proj.weight": (n_v, d),
        }
    elif s["names"] == "split":  # Qwen3.5: [q | k | v], z, b, a
        expect = {
            "in_proj_qkv.weight": (2 * n_k * d_k + n_v * d_v, d),
            "in_proj_z.weight": (n_v * d_v, d),
            "in_proj_b.weight": (n_v, d),
            "in_proj_a.weight": (n_v, d),
        }
    else:  # Qwen3-Next: grouped by key head
        expect = {
            "in_proj_qkvz.weight": (2 * n_k * d_k + 2 * n_v * d_v, d),
            "in_proj_ba.weight": (2 * n_v, d),
        }
    expect |= {
        "conv1d.weight": (2 * n_k * d_k + n_v * d_v, 1, K),
        "A_log": (n_v,),
        "dt_bias": (n_v,),
        norm: (d_v,),
        out: (d, n_v * d_v),
    }
    sd = {k: np.asarray(state_dict[k]) for k in keys}
    for name, shape in expect.items():
        a = sd[name]
        if a.dtype.kind != "f":  # an int or complex weight is a mistake
            raise TypeError(
                f"state_dict entry {name} must be an array of floating-"
                f"point numbers, got dtype {a.dtype}"
            )
        if a.shape != shape:
            raise ValueError(
                f"state_dict entry {name} must have shape {shape} for this "
                f"config, got {a.shape}"
            )
        bad = a.size - int(np.isfinite(a).sum())
        if bad:
            raise ValueError(
                f"state_dict entry {name} has {bad} NaN or inf value(s) in "
                f"its {a.size}"
            )
    return sd


def _linear_params(sd, s) -> dict:
    """HF's layout -> the layer's ``params`` (``W [in, out]``)."""
    d, n_k, n_v, d_k, d_v = (s[k] for k in "d n_k n_v d_k d_v".split())
    G = n_v // n_k
    _, norm, out = _LINEAR_KEYS[s["names"]]
    conv = sd["conv1d.weight"][:, 0, :].T  # [K, ch]: ch = [q | k | v]
    common = {
        "conv_q": conv[:, : n_k * d_k],
        "conv_k": conv[:, n_k * d_k : 2 * n_k * d_k],
        "conv_v": conv[:, 2 * n_k * d_k :],
        "A_log": sd["A_log"],
        "dt_bias": sd["dt_bias"],
        "norm": sd[norm],
        "W_o": sd[out].T,
    }
    if s["names"] == "separate":  # [out, d] -> [d, out], each its own
        mine = {"W_q": "q", "W_k": "k", "W_v": "v", "W_z": "g"}
        mine |= {"W_b": "b", "W_a": "a"}
        return {
            w: sd[f"{n}_proj.weight"].T for w, n in mine.items()
        } | common
    if (
        s["names"] == "split"
    ):  # [out, d] -> [d, out]; v head j reads key head j // G
        qkv = sd["in_proj_qkv.weight"].T  # [d, 2 n_k d_k + n_v d_v]
        return {
            "W_q": qkv[:, : n_k * d_k],
            "W_k": qkv[:, n_k * d_k : 2 * n_k * d_k],
            "W_v": qkv[:, 2 * n_k * d_k :],
            "W_z": sd["in_proj_z.weight"].T,
            "W_b": sd["in_proj_b.weight"].T,
            "W_a": sd["in_proj_a.weight"].T,
            **common,
        }
    # [out, d] -> [d, n_k, q | k | v | z]
    qkvz = sd["in_proj_qkvz.weight"].T.reshape(d, n_k, -1)
    q, k, v, z = np.split(
        qkvz, np.cumsum([d_k, d_k, G * d_v]), axis=-1
    )  # [d, n_k, d_k], ..., [d, n_k, G*d_v]
    ba = sd["in_proj_ba.weight"].T.reshape(d, n_k, 2 * G)
    return {
        "W_q": q.reshape(d, n_k * d_k),
        "W_k": k.reshape(d, n_k * d_k),
        "W_v": v.reshape(d, n_v * d_v),
        "W_z": z.reshape(d, n_v * d_v),
        "W_b": ba[..., :G].reshape(d, n_v),
        "W_a": ba[..., G:].reshape(d, n_v),
        **common,
    }


def gated_deltanet_from_hf(config, state_dict, *, dtype=None, **kwargs):
    """A :class:`~attn_np.GatedDeltaNet` holding the weights of one of
    Qwen3-Next's ``linear_attention`` layers.

    ``config`` is the model's ``config.json`` as a dict (a ``text_config``
    inside it is used when present); ``state_dict`` maps the layer's
    parameter names, without the ``model.layers.{i}.linear_attn.`` prefix,
    to arrays in HF's layout. ``in_proj_qkvz.weight [out, d_model]`` is
    grouped by key head: for each of the ``n_k`` key heads, its ``q``
    (``d_k`` rows), ``k`` (``d_k``), ``v`` (``G d_v``) and ``z`` (``G
    d_v``); ``in_proj_ba.weight`` likewise ``b`` (``G``) then ``a``
    (``G``). ``conv1d.weight [ch, 1, K]`` runs over the channels ``[q | k
    | v]``. A Qwen3.5 config (``model_type`` in
    :data:`SPLIT_LINEAR_TYPES`) reads ``in_proj_qkv.weight`` (``[q | k |
    v]`` rows; value head ``j`` reads key head ``j // G``),
    ``in_proj_z.weight``, ``in_proj_b.weight`` and ``in_proj_a.weight``
    instead; an OLMo Hybrid config (``model_type`` ``olmo_hybrid``)
    ``q_proj``, ``k_proj``, ``v_proj``, ``g_proj`` (the output gate, the
    layer's ``W_z``), ``b_proj``, ``a_proj``, ``o_norm`` (eps 1e-5) and
    ``o_proj``, its ``beta`` doubled unless ``linear_allow_neg_eigval``
    is false. Other keyword arguments go to the layer (``mode``,
    ``chunk_size``).
    """
    s = _linear_dims(config)
    sd = _linear_state(state_dict, s)
    dtype = sd["A_log"].dtype if dtype is None else dtype
    layer = GatedDeltaNet(
        s["d"],
        s["n_v"],
        s["n_k"],
        d_k=s["d_k"],
        d_v=s["d_v"],
        conv_size=s["K"],
        dtype=dtype,
        **_linear_options(s["cfg"]),
        **kwargs,
    )
    for name, val in _linear_params(sd, s).items():
        layer.params[name] = np.ascontiguousarray(val, dtype=layer.dtype)
    layer.grads = {n: np.zeros_like(p) for n, p in layer.params.items()}
    return layer


def gated_deltanet_grads_to_hf(layer, *, names="fused") -> dict:
    """The layer's ``grads`` in HF's names and layout (the inverse of
    :func:`gated_deltanet_from_hf`), to compare with HF's gradients;
    ``names``: ``"fused"`` (Qwen3-Next's), ``"split"`` (Qwen3.5's) or
    ``"separate"`` (OLMo Hybrid's)."""
    if names not in _LINEAR_KEYS:
        raise ValueError(
            f"names must be one of {tuple(_LINEAR_KEYS)}, got {names!r}"
        )
    gr = layer.grads
    d, n_k, G = layer.d_model, layer.n_k_heads, layer.group_size
    conv = np.concatenate([gr["conv_q"], gr["conv_k"], gr["conv_v"]], axis=1)
    _, norm, out = _LINEAR_KEYS[names]
    common = {
        "conv1d.weight": conv.T[:, None, :],
        "A_log": gr["A_log"],
        "dt_bias": gr["dt_bias"],
        norm: gr["norm"],
        out: gr["W_o"].T,
    }
    if names == "separate":  # [d, out] -> [out, d], each its own
        mine = {"W_q": "q", "W_k": "k", "W_v": "v", "W_z": "g"}
        mine |= {"W_b": "b", "W_a": "a"}
        return {
            f"{n}_proj.weight": gr[w].T for w, n in mine.items()
        } | common
    if names == "split":  # [d, q | k | v] -> [out, d]
        qkv = np.concatenate([gr["W_q"], gr["W_k"], gr["W_v"]], axis=1)
        return {
            "in_proj_qkv.weight": qkv.T,
            "in_proj_z.weight": gr["W_z"].T,
            "in_proj_b.weight": gr["W_b"].T,
            "in_proj_a.weight": gr["W_a"].T,
            **common,
        }
    qkvz = np.concatenate(
        [
            gr["W_q"].reshape(d, n_k, -1),
            gr["W_k"].reshape(d, n_k, -1),
            gr["W_v"].reshape(d, n_k, -1),
            gr["W_z"].reshape(d, n_k, -1),
        ],
        axis=-1,
    ).reshape(d, -1)
    ba = np.concatenate(
        [gr["W_b"].reshape(d, n_k, G), gr["W_a"].reshape(d, n_k, G)],
        axis=-1,
    ).reshape(d, -1)
    return {
        "in_proj_qkvz.weight": qkvz.T,
        "in_proj_ba.weight": ba.T,
        **common,
    }
