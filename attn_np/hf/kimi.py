"""Kimi Linear (``kimi_linear``), as ``transformers`` 5.24.0 builds it
(chapter 10): two kinds of layer, each a part the book already has.

* ``linear_attention``: chapter 12's :class:`~attn_np.KimiDeltaAttention`
  with HF's output gate, ``sigmoid(x W_g1 W_g2)`` without a bias
  (``gate_bias=False``). HF's names: ``q_proj``, ``k_proj``, ``v_proj``;
  one ``conv1d`` over ``[q | k | v]``; ``forget_gate.f_a_proj`` and
  ``f_b_proj`` (the low-rank decay, ``W_f1``, ``W_f2``),
  ``forget_gate.dt_bias``, ``forget_gate.A_log`` (``[1, 1, h, 1]``);
  ``b_proj`` (``beta``); ``g_a_proj``, ``g_b_proj`` (the gate of
  ``o_norm``, ``W_g1``, ``W_g2``); ``o_norm``; ``o_proj``.
  :func:`_kda_from_hf` reads them, :func:`_kda_to_hf` writes them back.
* ``full_attention``: chapter 7's MLA with no rotation at all. The
  ``qk_rope_head_dim`` features of ``kv_a_proj_with_mqa`` are still one
  key shared by every head, beside the latent, but nothing turns them
  (NoPE): the position part is :class:`_Unrotated`. The scale stays
  ``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)``; the weights are
  DeepSeek's names.

The sizes of the linear layers: the released files'
``linear_attn_config`` (``num_heads``, ``head_dim``,
``short_conv_kernel_size``) or transformers 5's ``linear_num_heads``,
``linear_head_dim``, ``linear_conv_kernel_dim``.
"""

from __future__ import annotations

import numpy as np

from ..linear import KimiDeltaAttention
from .config import _mla_sizes, count, flag, get_object, number
from .layers import HFLatentAttention

# linear_attn_config's key -> transformers 5's spelling of it
_SPELLINGS = {
    "num_heads": "linear_num_heads",
    "head_dim": "linear_head_dim",
    "short_conv_kernel_size": "linear_conv_kernel_dim",
}


class _Unrotated:
    """The position part of a layer without RoPE: the protocol of
    :class:`~attn_np.rope.Rotary` (``forward(t, positions) -> (t,
    saved)``, ``backward(dy, saved) -> dt``) turning nothing."""

    def forward(self, t, positions):
        return t, None

    def backward(self, dy, saved):
        return dy


def _kimi_linear(cfg, layer_type):
    """``(cls, args, kwargs, layout)`` of a Kimi Linear layer of
    ``layer_type`` (``linear_attention`` or ``full_attention``)."""
    if layer_type == "linear_attention":
        return _kda(cfg)
    if layer_type == "full_attention":
        return _nope_mla(cfg)
    raise ValueError(
        f"a kimi_linear layer is linear_attention or full_attention, "
        f"got layer type {layer_type!r}"
    )


def _kda_sizes(cfg):
    """``(heads, head_dim, conv_size)`` from either spelling; the two
    spellings, when both are written, must agree."""
    lin = get_object(cfg, "linear_attn_config") or {}
    sizes = []
    for key, top in _SPELLINGS.items():
        a = count(lin, key) if key in lin else None
        b = count(cfg, top, required=a is None)
        if a is not None and b is not None and a != b:
            raise ValueError(
                f"config is contradictory: linear_attn_config.{key}={a} "
                f"and {top}={b}"
            )
        sizes.append(b if a is None else a)
    return tuple(sizes)


def _kda(cfg):
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(
            "config key hidden_act must be 'silu' for a linear_attention "
            f"layer (its convolution's activation), got {act!r}"
        )
    h, d, K = _kda_sizes(cfg)
    args = (count(cfg, "hidden_size"), h, h)
    kw = dict(
        d_k=d,
        d_v=d,
        conv_size=K,
        eps=number(cfg, "rms_norm_eps", 1e-5),
        gate_bias=False,
    )
    return KimiDeltaAttention, args, kw, {"kind": "kda"}


def _nope_mla(cfg):
    if flag(cfg, "mla_use_nope") is False:
        raise ValueError(
            "config key mla_use_nope=False (RoPE on the shared key) is not "
            "built: transformers 5.24.0's KimiLinearAttention turns no "
            "key whatever it says"
        )
    if flag(cfg, "attention_bias"):
        raise ValueError(
            "config key attention_bias=True for MLA is not implemented"
        )
    n_heads = count(cfg, "num_attention_heads")
    n_kv = count(cfg, "num_key_value_heads", required=False) or n_heads
    if n_kv != n_heads:
        raise ValueError(
            "config key num_key_value_heads must equal num_attention_heads "
            f"({n_heads}) for Kimi Linear's MLA (every head its own key "
            f"and value from the latent), got {n_kv}"
        )
    args, kw = _mla_sizes(cfg)
    kw["rotary"] = _Unrotated()
    return HFLatentAttention, args, kw, {"kind": "mla"}


# ------------------------------------------------ the linear layer's weights
def _hf_shapes(layer) -> dict:
    """HF name -> its shape in HF's layout (``[out, in]``)."""
    D, h, d, K = layer.d_model, layer.n_v_heads, layer.d_k, layer.conv_size
    n = h * d
    return {
        "q_proj.weight": (n, D),
        "k_proj.weight": (n, D),
        "v_proj.weight": (n, D),
        "conv1d.weight": (3 * n, 1, K),
        "forget_gate.f_a_proj.weight": (d, D),
        "forget_gate.f_b_proj.weight": (n, d),
        "forget_gate.dt_bias": (n,),
        "forget_gate.A_log": (1, 1, h, 1),
        "b_proj.weight": (h, D),
        "g_a_proj.weight": (d, D),
        "g_b_proj.weight": (n, d),
        "o_norm.weight": (d,),
        "o_proj.weight": (D, n),
    }


# the HF matrices that are one of the layer's W [in, out], transposed
_MATRICES = {
    "q_proj.weight": "W_q",
    "k_proj.weight": "W_k",
    "v_proj.weight": "W_v",
    "forget_gate.f_a_proj.weight": "W_f1",
    "forget_gate.f_b_proj.weight": "W_f2",
    "b_proj.weight": "W_b",
    "g_a_proj.weight": "W_g1",
    "g_b_proj.weight": "W_g2",
    "o_proj.weight": "W_o",
}


def _checked(layer, state_dict, dtype) -> dict:
    """``state_dict`` as float arrays of ``dtype``, every name and shape
    checked against the layer."""
    if not isinstance(state_dict, dict):
        raise TypeError(
            "state_dict must be a dict of arrays, got "
            f"{type(state_dict).__name__}"
        )
    shapes = _hf_shapes(layer)
    extra = sorted(set(state_dict) - set(shapes))
    missing = sorted(set(shapes) - set(state_dict))
    if extra or missing:
        raise ValueError(
            f"state_dict does not fit this layer: unexpected {extra}, "
            f"missing {missing} (names without the "
            "'model.layers.{i}.self_attn.' prefix)"
        )
    got = {}
    for name, shape in shapes.items():
        a = np.asarray(state_dict[name])
        if a.dtype.kind != "f":  # an int or complex weight is a mistake
            raise TypeError(
                f"state_dict entry {name} must be an array of "
                f"floating-point numbers, got dtype {a.dtype}"
            )
        if a.shape != shape:
            raise ValueError(
                f"state_dict entry {name} has shape {a.shape}, the config "
                f"says {shape}"
            )
        if not np.isfinite(a).all():
            raise ValueError(f"state_dict entry {name} has NaN or inf")
        got[name] = a.astype(dtype, copy=False)
    return got


def _kda_from_hf(layer, state_dict, dtype=np.float64):
    """Fill a Kimi Linear ``linear_attention`` layer (a
    :class:`~attn_np.KimiDeltaAttention` built by
    :func:`~attn_np.attention_from_hf`) from HF's state dict."""
    sd = _checked(layer, state_dict, dtype)
    n = layer.n_v_heads * layer.d_k
    conv = sd["conv1d.weight"][:, 0, :].T  # [K, 3n]: [q | k | v]
    p = {key: sd[hf].T for hf, key in _MATRICES.items()}
    p.update(
        conv_q=conv[:, :n],
        conv_k=conv[:, n : 2 * n],
        conv_v=conv[:, 2 * n :],
        A_log=sd["forget_gate.A_log"].reshape(-1),  # [1, 1, h, 1] -> [h]
        dt_bias=sd["forget_gate.dt_bias"],
        norm=sd["o_norm.weight"],
    )
    layer.params = {k: np.ascontiguousarray(p[k]) for k in layer.params}
    layer.grads = {k: np.zeros_like(a) for k, a in layer.params.items()}


def _kda_to_hf(layer, d) -> dict:
    """A dict in the layer's keys (``params`` or ``grads``) under HF's
    names and in HF's layout: the inverse of :func:`_kda_from_hf`."""
    h = layer.n_v_heads
    conv = np.concatenate([d["conv_q"], d["conv_k"], d["conv_v"]], axis=1)
    out = {hf: d[key].T for hf, key in _MATRICES.items()}
    out.update(
        {
            "conv1d.weight": conv.T[:, None, :],  # [3n, 1, K]
            "forget_gate.A_log": d["A_log"].reshape(1, 1, h, 1),
            "forget_gate.dt_bias": d["dt_bias"],
            "o_norm.weight": d["norm"],
        }
    )
    return out
