"""MiMo-V2-Flash as a Hugging Face family (chapter 10).

Its attention (``MiMoV2FlashAttention`` in ``transformers`` 5.24.0) is
Llama's layer with four differences, each a part the library has:

* value heads narrower than the key heads: ``head_dim`` for queries and
  keys, ``v_head_dim`` for values (chapter 10's ``v_head_dim=``), so
  ``W_v [d_model, n_kv v_head_dim]`` and ``W_o [H v_head_dim, d_model]``;
* a value scale: ``v = (x W_v + b_v) s``, ``s`` the config's
  ``attention_value_scale`` (absent: 0.707, null: 1), applied before the
  cache, so the cache holds scaled values (:class:`_ScaledValues`);
* on ``sliding_attention`` layers twice ``num_key_value_heads`` and
  gpt-oss's sinks (a learned logit per query head, chapter 8), and the
  window ``sliding_window`` (or ``sliding_window_size + 1``, the
  configuration class's rule);
* partial RoPE per layer type: ``rope_parameters.full_attention`` and
  ``.sliding_attention`` (absent: bases 5e6 and 1e4), turning the first
  ``int(head_dim * partial_rotary_factor)`` features, 0.334 of the head
  when a default-type entry writes no factor.

The configuration class makes layer 0 and every sixth layer full when a
file writes no ``layer_types``; its rotary class reads only
``rope_parameters`` (a top-level ``rope_theta`` or
``partial_rotary_factor`` is not read there, and not here). q, k and v
take ``attention_bias``; ``o_proj`` never has one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..refinements import Projection
from .config import (
    FULL,
    SLIDING,
    _mimo_config,
    count,
    get_object,
    layer_types,
    number,
)
from .layers import HFAttention

# MiMoV2FlashConfig's RoPE when a file writes no rope_parameters
_MIMO_ROPE = {
    FULL: {"rope_type": "default", "rope_theta": 5_000_000.0},
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
}
_MIMO_PARTIAL = 0.334  # its default-type rotary's partial_rotary_factor
# keys its rotary class does not read (it reads rope_parameters only)
_NOT_READ = ("rope_theta", "partial_rotary_factor")


@dataclass(frozen=True)
class _ScaledValues(Projection):
    """The project step with the values scaled: ``v = (x W_v + b_v)
    s``. Backward: the values' gradient times ``s`` before ``W_v``'s
    (``s`` is a constant of the config, not a parameter)."""

    value_scale: float = 1.0

    def forward(self, layer, x3):
        q, k, v, saved = super().forward(layer, x3)
        return q, k, v * self.value_scale, saved  # [B, n_kv, L, d_v]

    def backward(self, layer, x3, g, saved):
        g["v"] = g["v"] * self.value_scale
        return super().backward(layer, x3, g, saved)


class _MiMoAttention(HFAttention):
    """:class:`~attn_np.hf.layers.HFAttention` whose project step is
    :class:`_ScaledValues` (``value_scale``, a positive number)."""

    rebuilds_from_options = True

    def __init__(self, *args, value_scale=1.0, **kw):
        self.value_scale = float(value_scale)
        if not self.value_scale > 0:
            raise ValueError(
                f"value_scale must be a positive number, got {value_scale!r}"
            )
        super().__init__(*args, **kw)

    def _step_parts(self) -> dict:
        parts = super()._step_parts()
        p = parts["projection"]
        parts["projection"] = _ScaledValues(
            **vars(p), value_scale=self.value_scale
        )
        return parts

    @property
    def options(self) -> dict:
        return {**super().options, "value_scale": self.value_scale}


def _mimo_types(cfg):
    """``(cfg, types)``: the configuration class's reading of ``cfg``
    (:func:`~attn_np.hf.config._mimo_config`) and every layer's
    type."""
    cfg = _mimo_config(cfg)
    types, _ = layer_types(cfg, count(cfg, "num_hidden_layers"))
    return cfg, types


def _rope_per_type(cfg, kinds, defaults, model_type):
    """``rope_parameters`` with an entry per layer type in ``kinds``
    (``defaults``, the configuration class's, when the file writes
    none). A single entry for every type, a type without its entry or an
    entry without ``rope_theta`` is refused: HF's rotary class reads
    ``rope_parameters[layer_type]["rope_theta"]``. So is ``rope_scaling``,
    which the class turns into a single entry."""
    if cfg.get("rope_scaling") is not None:
        raise ValueError(
            f"config key rope_scaling is not read per layer type by "
            f"{model_type}'s rotary class: write rope_parameters."
            "full_attention and rope_parameters.sliding_attention"
        )
    rope = get_object(cfg, "rope_parameters")
    if rope is None:
        return dict(defaults)
    missing = [
        k
        for k in kinds
        if not isinstance(rope.get(k), dict) or "rope_theta" not in rope[k]
    ]
    if missing:
        raise ValueError(
            "config key rope_parameters must hold one entry per layer type "
            f"with its rope_theta for {model_type} (its rotary class reads "
            "rope_parameters[layer_type]['rope_theta']); it has none for "
            f"{missing}"
        )
    return rope


def _mimo_v2_flash(cfg, i, plain_decoder):
    """MiMo-V2-Flash's layer ``i``: ``(cls, args, kwargs, layout)``;
    ``plain_decoder`` is :func:`attn_np.hf.families.plain_decoder`."""
    cfg, types = _mimo_types(cfg)
    kind = types[i]
    if kind not in (FULL, SLIDING):
        raise ValueError(
            f"layer {i} has layer type {kind!r}, which mimo_v2_flash's "
            "attention does not build"
        )
    out = {k: v for k, v in cfg.items() if k not in _NOT_READ}
    out["rope_parameters"] = _rope_per_type(
        cfg, sorted(set(types)), _MIMO_ROPE, "mimo_v2_flash"
    )
    n_kv = count(out, "num_key_value_heads")
    if kind == SLIDING:
        out["num_key_value_heads"] = 2 * n_kv
    params = out["rope_parameters"][kind]
    default_type = params.get("rope_type", "default") == "default"
    partial = _MIMO_PARTIAL if default_type else 1.0
    args, kw = plain_decoder(out, i, kind, default_partial=partial)
    kw.update(
        biases=("q", "k", "v") if "q" in kw["biases"] else (),
        sinks=kind == SLIDING,
        v_head_dim=count(out, "v_head_dim"),
        value_scale=_value_scale(cfg),
    )
    return _MiMoAttention, args, kw, {"kind": "proj", "gate_rows": False}


def _value_scale(cfg):
    """``attention_value_scale``: 0.707 when absent (the class's
    default), 1 when null (the layer's ``None`` rule)."""
    if "attention_value_scale" not in cfg:
        return 0.707
    return number(cfg, "attention_value_scale", 1.0)
