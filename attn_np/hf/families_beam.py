"""Beam as a Hugging Face family (chapter 10).

Its attention (``BeamAttention`` in ``transformers`` 5.24.0) is Qwen3's
layer (per-head QK RMSNorm, gain ``w``) with two more parts:

* chapter 10's elementwise output gate from its own ``gate_proj``, with
  a bias per head (``gate_bias``, broadcast over the head's features):
  ``y = (o sigmoid(x W_g + b_g)) W_o``; ``db_g`` is ``dg`` summed over
  positions and the head's features (:class:`_BiasedGate`);
* RoPE where ``rope_parameters`` has an entry for the layer's type (the
  whole head: its rotary class reads no ``partial_rotary_factor``), and
  where the entry is null (the class's full layers) no RoPE but a query
  scale by position, ``tau(p) = (1 + (p + 1) / 2048)^0.1`` (HF's
  "scalable-softmax" scale): the scores are linear in ``q``, so it
  multiplies row ``p`` of the scores (:class:`_PowerQueryScale`, a score
  mod: ``ds = tau(p) ds2``).

``attention_bias`` gives q, k, v and o biases. The configuration class
makes every sixth layer and the last one full when a file writes no
``layer_types``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..refinements import GatedOutput
from .config import FULL, SLIDING, count, get_object, layer_types
from .families_mimo import _NOT_READ, _rope_per_type
from .layers import HFAttention

# BeamConfig's RoPE when a file writes no rope_parameters: none on full
_BEAM_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
    FULL: None,
}
_BEAM_SIZES = {"head_dim": 128, "num_key_value_heads": 8}


@dataclass(frozen=True)
class _PowerQueryScale:
    """A score mod: row ``p`` of the scores times ``(1 + (p + 1) /
    length)^power`` (Beam's NoPE layers: length 2048, power 0.1)."""

    length: float = 2048.0
    power: float = 0.1

    def forward(self, s, ctx):
        p = np.asarray(ctx.q_positions, dtype=np.float64)
        t = np.exp(self.power * np.log1p((p + 1.0) / self.length))
        t = t[:, None].astype(s.dtype)  # [L_q, 1]
        return s * t, t  # [B, n_kv, G, L_q, L_k] * [L_q, 1]

    def backward(self, ds2, saved):
        return ds2 * saved


@dataclass(frozen=True)
class _BiasedGate(GatedOutput):
    """Chapter 10's output step with a bias per head in the gate,
    ``sigmoid(x W_g + b_g)``; ``b_g [H]`` is HF's ``gate_bias``."""

    def add_params(self, layer, rng):
        super().add_params(layer, rng)
        layer.params["b_g"] = np.zeros(layer.n_heads, layer.dtype)

    def activate(self, layer, o4, g4):
        # [B, L, h, d] + [h, 1]
        return super().activate(layer, o4, g4 + layer.params["b_g"][:, None])

    def activate_backward(self, layer, do4, cache):
        do, dg = super().activate_backward(layer, do4, cache)
        layer.grads["b_g"] = dg.sum(axis=(0, 1, 3))  # [B, L, h, d] -> [h]
        return do, dg


class _BeamAttention(HFAttention):
    """:class:`~attn_np.hf.layers.HFAttention` whose output gate is
    :class:`_BiasedGate`; ``query_scale=True`` adds
    :class:`_PowerQueryScale` to its score mods (a NoPE layer)."""

    rebuilds_from_options = True

    def __init__(self, *args, query_scale=False, **kw):
        self.query_scale = bool(query_scale)
        if self.query_scale:
            mods = tuple(kw.pop("score_mods", ()))
            kw["score_mods"] = (_PowerQueryScale(), *mods)
        super().__init__(*args, **kw)
        self.grads.setdefault("b_g", np.zeros_like(self.params["b_g"]))

    def _step_parts(self) -> dict:
        parts = super()._step_parts()
        out = parts["out_projection"]
        parts["out_projection"] = _BiasedGate(out.gate, out.bias)
        return parts

    @property
    def options(self) -> dict:
        mods = self._mods
        if self.query_scale:
            mods = tuple(
                m for m in mods if not isinstance(m, _PowerQueryScale)
            )
        return {
            **super().options,
            "score_mods": mods,
            "query_scale": self.query_scale,
        }


def _beam_types(cfg, n):
    """``layer_types``, or BeamConfig's rule: every sixth layer and the
    last one full."""
    if cfg.get("layer_types") is not None:
        return cfg
    types = [SLIDING if (i + 1) % 6 else FULL for i in range(n)]
    types[-1] = FULL
    return {**cfg, "layer_types": types}


def _beam(cfg, i, plain_decoder):
    """Beam's layer ``i``: ``(cls, args, kwargs, layout)``;
    ``plain_decoder`` is :func:`attn_np.hf.families.plain_decoder`."""
    n = count(cfg, "num_hidden_layers")
    out = _beam_types(
        {k: v for k, v in cfg.items() if k not in _NOT_READ}, n
    )
    for key, value in _BEAM_SIZES.items():
        out.setdefault(key, value)
        count(out, key, required=True)  # null: refused by name
    out.setdefault("sliding_window", 512)
    types, _ = layer_types(out, n)
    kind = types[i]
    if kind not in (FULL, SLIDING):
        raise ValueError(
            f"layer {i} has layer type {kind!r}, which beam's attention "
            "does not build"
        )
    rope = _beam_rope(cfg, sorted(set(types)))
    out["rope_parameters"] = {k: v for k, v in rope.items() if v}
    nope = rope.get(kind) is None
    if nope:  # plain_decoder reads no RoPE for this layer
        out["rope_parameters"].pop(kind, None)
    args, kw = plain_decoder(out, i, kind)
    kw.update(
        qk_norm="head",
        gate="elementwise",
        rotary_dim=None,  # the whole head, whatever the entry says
        use_rope=not nope,
        query_scale=nope,
    )
    layout = {"kind": "proj", "gate_rows": False, "gate_proj": "gate_proj"}
    return _BeamAttention, args, kw, layout


def _beam_rope(cfg, kinds):
    """``rope_parameters`` per layer type, a null entry a NoPE type;
    only the ``default`` rope type (its rotary class's own)."""
    rope = get_object(cfg, "rope_parameters")
    if rope is None:
        return dict(_BEAM_ROPE)
    live = [k for k in kinds if rope.get(k, 0) is not None]
    given = {k: rope[k] for k in rope if rope[k] is not None}
    checked = _rope_per_type(
        {**cfg, "rope_parameters": given}, live, {}, "beam"
    )
    for k in live:
        if checked[k].get("rope_type", "default") != "default":
            raise ValueError(
                f"config key rope_parameters.{k}.rope_type="
                f"{checked[k]['rope_type']!r} is not built for beam (its "
                "rotary class's default type only)"
            )
    return {k: checked.get(k) for k in kinds}
