"""Laguna as a Hugging Face family (chapter 10).

Its attention (``LagunaAttention`` in ``transformers`` 5.24.0) is
AFMoE's layer, Qwen3's per-head QK-norm (gain ``w``) and an output gate
from a projection of its own (``g_proj``, no bias), with two
differences:

* the gate's nonlinearity is softplus, not sigmoid: ``y = (o
  softplus(x W_g)) W_o``, ``softplus(g) = log(1 + e^g)``, a gate in
  ``(0, inf)`` that can amplify a head as well as close it. One gate per
  head (``gating`` true or ``"per-head"``, ``W_g [d_model, H]``) or per
  feature (``"per-element"``, ``[d_model, H d]``);
* each layer its own number of query heads
  (``num_attention_heads_per_layer[i]``), with the same key/value heads
  and ``head_dim`` everywhere.

RoPE is read per layer type from ``rope_parameters`` (the class's when
a file writes none: full layers base 5e5 on half the head, sliding
layers base 1e4 on all of it); a top-level ``rope_theta`` is not read
there, and not here. ``attention_bias`` gives q, k, v and o biases.

The gate's backward: with ``s = softplus(g)``, ``do = dy s`` and ``dg =
dy o sigmoid(g)`` (softplus' derivative is the sigmoid), summed over a
head's features for the per-head gate.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._checks import check_backward_cache, check_upstream
from ..linear.gates import softplus
from ..refinements import GatedOutput
from ..softmax import sigmoid
from .config import FULL, SLIDING, count, layer_types
from .families_mimo import _NOT_READ, _rope_per_type
from .layers import HFAttention

# LagunaConfig's RoPE when a file writes no rope_parameters
_LAGUNA_ROPE = {
    FULL: {
        "rope_type": "default",
        "rope_theta": 500000.0,
        "partial_rotary_factor": 0.5,
    },
    SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
}
# LagunaConfig's sizes for a file that writes none
_LAGUNA_SIZES = {"head_dim": 128, "num_key_value_heads": 8}


def _softplus_gate(o, g):
    """``(o * softplus(g), cache)``; ``g`` has o's shape or ``[..., h,
    1]`` against ``o [..., h, d]``."""
    return o * softplus(g), (o, g)


def _softplus_gate_backward(dy, cache):
    """``(do, dg)``: ``do = dy softplus(g)``, ``dg = dy o sigmoid(g)``,
    summed to g's shape."""
    check_backward_cache(cache, tuple, "_softplus_gate", 2)
    o, g = cache
    dy = check_upstream(dy, "dy", o.shape, "the gated output")
    do = dy * softplus(g)
    dg = dy * o * sigmoid(g)
    if dg.shape != g.shape:
        dg = dg.sum(axis=-1, keepdims=True)
    return do, dg


@dataclass(frozen=True)
class _SoftplusGate(GatedOutput):
    """Chapter 10's output step with the gate ``softplus(x W_g)``."""

    def activate(self, layer, o4, g4):
        return _softplus_gate(o4, g4)

    def activate_backward(self, layer, do4, cache):
        return _softplus_gate_backward(do4, cache)


class _SoftplusGateAttention(HFAttention):
    """:class:`~attn_np.hf.layers.HFAttention` whose output gate is
    :class:`_SoftplusGate` (``gate`` ``"headwise"`` or
    ``"elementwise"``, as chapter 10's)."""

    rebuilds_from_options = True

    def _step_parts(self) -> dict:
        parts = super()._step_parts()
        out = parts["out_projection"]
        parts["out_projection"] = _SoftplusGate(out.gate, out.bias)
        return parts


def _gating(cfg):
    """``"headwise"`` or ``"elementwise"`` from ``gating`` (absent: true,
    the class's default)."""
    value = cfg.get("gating", True)
    if value is True or value == "per-head":
        return "headwise"
    if value is False or value == "per-element":
        return "elementwise"
    raise ValueError(
        "config key gating must be true, false, 'per-head' or "
        f"'per-element' (laguna's output gate), got {value!r}"
    )


def _heads_of(cfg, i, n):
    """Layer ``i``'s query heads: ``num_attention_heads_per_layer[i]``
    (absent or null: ``num_attention_heads`` on every layer)."""
    per = cfg.get("num_attention_heads_per_layer")
    if per is None:
        return count(cfg, "num_attention_heads")
    if not isinstance(per, list) or len(per) != n:
        raise ValueError(
            "config key num_attention_heads_per_layer must list one head "
            f"count per layer (num_hidden_layers={n}), got {per!r:.120}"
        )
    h = per[i]
    if isinstance(h, bool) or not isinstance(h, int) or h < 1:
        raise ValueError(
            f"config key num_attention_heads_per_layer[{i}] must be a "
            f"positive integer, got {h!r}"
        )
    return h


def _laguna(cfg, i, plain_decoder):
    """Laguna's layer ``i``: ``(cls, args, kwargs, layout)``;
    ``plain_decoder`` is :func:`attn_np.hf.families.plain_decoder`."""
    n = count(cfg, "num_hidden_layers")
    out = {k: v for k, v in cfg.items() if k not in _NOT_READ}
    for key, value in _LAGUNA_SIZES.items():
        out.setdefault(key, value)
        count(out, key, required=True)  # null: refused by name
    out.setdefault("sliding_window", 512)
    if out.get("layer_types") is None:  # LagunaConfig: every layer full
        out["layer_types"] = [FULL] * n
    types, _ = layer_types(out, n)
    kind = types[i]
    if kind not in (FULL, SLIDING):
        raise ValueError(
            f"layer {i} has layer type {kind!r}, which laguna's attention "
            "does not build"
        )
    out["rope_parameters"] = _rope_per_type(
        cfg, sorted(set(types)), _LAGUNA_ROPE, "laguna"
    )
    out["num_attention_heads"] = _heads_of(cfg, i, n)
    args, kw = plain_decoder(out, i, kind)
    kw.update(qk_norm="head", gate=_gating(cfg))
    layout = {"kind": "proj", "gate_rows": False, "gate_proj": "g_proj"}
    return _SoftplusGateAttention, args, kw, layout
