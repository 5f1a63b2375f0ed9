"""Gemma 3n and Gemma 4 as Hugging Face families (chapter 10).

Their attention differs from Gemma 3's in five ways, each read off
``transformers`` 5.24.0 (``Gemma3nTextAttention``,
``Gemma4TextAttention``) and matched by
``tests/fixtures/families/<model_type>.npz``:

* scale 1: the queries and keys are RMS-normalised per head, so the
  scores need no ``1/sqrt(d)`` (HF writes ``self.scaling = 1.0``; a
  file's ``query_pre_attn_scalar`` is not read);
* QK-norm with gain ``w`` (``Gemma3nRMSNorm``, ``Gemma4RMSNorm``: the
  weight starts at 1), not Gemma 3's ``1 + w``;
* ``v_norm``: the values RMS-normalised per head with no gain,
  ``v = v' / sqrt(mean(v'^2) + eps)`` (:class:`_ValueNorm`, the
  parameter-free QK-norm of chapter 11 on the values);
* the last ``num_kv_shared_layers`` layers read the keys and values of
  the last earlier layer of their type (HF's ``kv_sharing_modes``:
  "store" and "reuse"): :class:`HFKVReader`, chapter 10's
  :class:`~attn_np.shared_kv.KVReader` with the query norm;
* Gemma 4 only: its full layers have heads of their own width and count
  (``global_head_dim``, ``num_global_key_value_heads``, or transformers
  5's ``per_layer_config``), ``proportional`` RoPE
  (:class:`~attn_np.rope_scaling.ProportionalRotary`), and with
  ``attention_k_eq_v`` no ``v_proj``: the values are the output of
  ``k_proj`` before ``k_norm`` and RoPE, normalised by ``v_norm``. So
  ``W_k`` gets two gradients, ``x^T (dk' + dv')``, one through each
  norm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..norms import qk_norm_backward, qk_norm_forward
from ..refinements import Projection, _linear, linear_backward
from ..rope_scaling import ProportionalRotary, ScaledRotary
from ..shared_kv import KVReader
from .config import (
    FULL,
    SLIDING,
    alternate,
    count,
    flag,
    layer_types,
    number,
)
from .layers import HFAttention

_GEMMA_3N = ("gemma3n_text",)
# Gemma 4 unified's attention is Gemma 4's class (Gemma4TextAttention)
_GEMMA_4 = ("gemma4_text", "gemma4_unified_text")


# ----------------------------------------------------------- the parts
@dataclass(frozen=True)
class _ValueNorm(Projection):
    """The project step of Gemma 3n and Gemma 4: ``x W + b``, then an
    RMSNorm per head on q and k with gains ``q_norm``, ``k_norm`` and on
    v with none. ``k_eq_v``: no ``W_v``, the values made from ``x W_k``
    (before ``k_norm``). Backward: each norm's (chapter 10's QK-norm,
    its parameter-free form for v), and with ``k_eq_v`` the two
    gradients of ``x W_k`` added before ``W_k``."""

    k_eq_v: bool = False

    def add_params(self, layer, rng):
        super().add_params(layer, rng)
        if self.k_eq_v:  # HF builds no v_proj
            del layer.params["W_v"]

    def linears(self, layer, x3, saved):
        """Projection's, or with ``k_eq_v`` the values ``x W_k`` too."""
        if not self.k_eq_v:
            return super().linears(layer, x3, saved)
        P, t = layer.params, {}
        for n in ("q", "k"):  # [B, L, d_model] -> [B, L, heads * d]
            t[n], saved[n] = _linear(x3, P[f"W_{n}"], P.get(f"b_{n}"))
        t["v"] = t["k"]  # k_proj's output, before k_norm
        return t

    def norms(self, layer, t, saved, B, L):
        """An RMSNorm per head on q, k (gains ``q_norm``, ``k_norm``) and
        v (no gain)."""
        P, n_kv = layer.params, layer.n_kv_heads
        heads = {"q": layer.n_heads, "k": n_kv, "v": n_kv}
        for n in ("q", "k", "v"):  # [B, L, heads, d], normalised over d
            y, saved[f"{n}n"] = qk_norm_forward(
                t[n].reshape(B, L, heads[n], -1),
                P.get(f"{n}_norm"),  # v: None, no gain
                eps=self.eps,
            )
            t[n] = y.reshape(B, L, -1)

    def linears_backward(self, layer, d, saved):
        if self.k_eq_v:  # both uses of x W_k
            d["k"] = d["k"] + d.pop("v")
        return super().linears_backward(layer, d, saved)


def _rotary(rope_base, rope_pairs, d):
    """Chapter 6's RoPE over the whole head, or Gemma 4's proportional
    RoPE turning ``rope_pairs`` pairs."""
    if rope_pairs is None:
        return ScaledRotary(rope_base, "half", None)
    return ProportionalRotary(rope_base, d, rope_pairs)


class GemmaAttention(HFAttention):
    """A Gemma 3n or Gemma 4 layer that computes its own keys and values
    (HF's "store" layers, and those before them): chapter 10's layer
    with :class:`_ValueNorm` as its project step, scale 1, and
    ``rope_pairs`` (None: RoPE over the whole head) for Gemma 4's
    proportional RoPE. ``k_eq_v``: the values are made from ``W_k``
    (Gemma 4's full layers with ``attention_k_eq_v``)."""

    def __init__(self, *args, k_eq_v=False, rope_pairs=None, **kw):
        self.k_eq_v, self.rope_pairs = bool(k_eq_v), rope_pairs
        super().__init__(*args, **kw)

    def _step_parts(self) -> dict:
        parts = super()._step_parts()
        biases = parts["projection"].biases
        parts["projection"] = _ValueNorm(
            biases, "head", 0.0, True, self.norm_eps, k_eq_v=self.k_eq_v
        )
        return parts

    @property
    def options(self) -> dict:
        return {
            **super().options,
            "k_eq_v": self.k_eq_v,
            "rope_pairs": self.rope_pairs,
        }

    @property
    def rotary(self):
        if self.rope_pairs is None:
            return super().rotary
        return _rotary(self.rope_base, self.rope_pairs, self.d)


class HFKVReader(KVReader):
    """A Gemma 3n or Gemma 4 layer that reads another's keys and values
    (HF's "reuse" layers): chapter 10's :class:`~attn_np.shared_kv.
    KVReader` with an RMSNorm per head on its queries (gain ``q_norm``),
    before RoPE, scale 1, and the window of its type. ``kv_source`` is
    the index of the layer it reads."""

    rebuilds_from_options = False  # kv_source and the norm: not options

    def __init__(
        self,
        d_model,
        n_heads,
        n_kv_heads,
        head_dim,
        *,
        kv_source,
        window=None,
        rope_base=10000.0,
        rope_pairs=None,
        norm_eps=1e-6,
        dtype=np.float64,
        seed=0,
    ):
        super().__init__(
            d_model,
            n_heads,
            n_kv_heads,
            d_k=head_dim,
            d_v=head_dim,
            window=window,
            rotary=_rotary(rope_base, rope_pairs, head_dim),
            scale=1.0,
            dtype=dtype,
            seed=seed,
        )
        self.kv_source, self.norm_eps = kv_source, norm_eps
        self.params["q_norm"] = np.ones(head_dim, self.dtype)
        self.grads["q_norm"] = np.zeros(head_dim, self.dtype)

    def project_queries(self, x3):
        B, L, _ = x3.shape
        q, lin = _linear(x3, self.params["W_q"])  # [B, L, h * d_k]
        y, norm = qk_norm_forward(
            q.reshape(B, L, self.n_heads, -1),
            self.params["q_norm"],
            eps=self.norm_eps,
        )
        return y.reshape(B, L, -1), (lin, norm)

    def project_queries_backward(self, x3, dq, saved):
        lin, norm = saved
        dt, self.grads["q_norm"] = qk_norm_backward(
            dq.reshape(norm[0].shape), norm
        )
        dx, self.grads["W_q"], _ = linear_backward(dt.reshape(dq.shape), lin)
        return dx


# ------------------------------------------------------- the config
def _layer_types(cfg, every):
    """``cfg`` with ``layer_types`` as the configuration class fills it
    when the file has none: full iff ``(i + 1) % every == 0``."""
    if cfg.get("layer_types") is not None:
        return cfg
    n = count(cfg, "num_hidden_layers")
    return {**cfg, "layer_types": list(alternate(n, every))}


def _gemma4_types(cfg):
    cfg = _layer_types(cfg, 6)
    types = cfg["layer_types"]
    if isinstance(types, list) and types and types[-1] != FULL:
        raise ValueError(
            "config key layer_types must end with 'full_attention' for "
            "gemma4_text: HF's Gemma4TextConfig turns the last layer into "
            f"a full layer whatever the file says, got {types[-1]!r}"
        )
    return cfg


#: model_type -> the rule its configuration class fills layer_types with
_GEMMA_TYPES = {
    "gemma3n_text": lambda cfg: _layer_types(cfg, 5),
    "gemma4_text": _gemma4_types,
    "gemma4_unified_text": _gemma4_types,
}


def _text_causal(cfg):
    """Gemma 4's ``use_bidirectional_attention``: ``"vision"`` lets image
    tokens attend one another both ways and keeps text causal, so for
    text (what the layer sees here) it is dropped; ``"all"`` is refused
    (a ``ValueError``)."""
    value = cfg.get("use_bidirectional_attention")
    if value == "all":
        raise ValueError(
            "config key use_bidirectional_attention='all' (every token "
            "attends both ways, the window halved) is not built for "
            f"{cfg.get('model_type')}: its layers are causal here"
        )
    if value == "vision":
        return {**cfg, "use_bidirectional_attention": None}
    return cfg


def _kv_source(cfg, i, types):
    """The layer whose keys and values layer ``i`` reads (None: its own):
    of the last ``num_kv_shared_layers`` layers, each reads the last
    layer of its type before them (HF's ``kv_sharing_modes``)."""
    n = len(types)
    gemma3n = cfg.get("model_type") in _GEMMA_3N
    shared = count(cfg, "num_kv_shared_layers", required=False, minimum=0)
    shared = (15 if gemma3n else 0) if shared is None else shared
    first = n - shared
    if i < first:
        return None
    if shared == n and not gemma3n:
        raise ValueError(
            f"config key num_kv_shared_layers={shared} (every layer): each "
            "reads the keys and values of another model (an assistant's, "
            "from its target's shared_kv_states), which attention_from_hf "
            "does not build"
        )
    if first <= 0 or types[i] not in types[:first]:
        raise ValueError(
            f"config key num_kv_shared_layers={shared}: layer {i} "
            f"({types[i]}) reads the last layer of its type before the "
            f"shared ones, and the first {max(first, 0)} of the {n} "
            "layers have none (HF raises too)"
        )
    return first - 1 - types[:first][::-1].index(types[i])


def _per_layer(cfg, model_type, i, layer_type):
    """``cfg`` as layer ``i`` of type ``layer_type`` reads it: Gemma 4's
    full layers with their own ``head_dim`` and ``num_key_value_heads``,
    its proportional RoPE as plain RoPE of the same base (the number of
    pairs it turns, and the layer read, kept for :func:`_gemma` under
    ``"_gemma"``); every other family's unchanged."""
    if model_type not in (*_GEMMA_3N, *_GEMMA_4):
        return cfg
    bidirectional = cfg.get("use_bidirectional_attention")
    if bidirectional not in (None, False, "vision"):
        raise ValueError(
            f"config key use_bidirectional_attention={bidirectional!r} "
            f"(every token attends both ways) is not built for "
            f"{model_type}: its layers are causal here"
        )
    if flag(cfg, "attention_bias"):
        raise ValueError(
            f"config key attention_bias=True is not built for {model_type} "
            "(its released models have no biases)"
        )
    out, pairs = dict(cfg), None
    no_rope = all(
        cfg.get(k) is None for k in ("rope_parameters", "rope_theta")
    )
    if model_type in _GEMMA_3N and no_rope:
        out["rope_theta"] = 1e6  # Gemma3nTextConfig's full layers' base
    if model_type in _GEMMA_4:
        out.update(_gemma4_heads(cfg, i, layer_type))
        out["rope_parameters"] = _gemma4_rope(cfg)
        out, pairs = _proportional(out, layer_type, out["head_dim"])
    types, _ = layer_types(cfg, count(cfg, "num_hidden_layers"))
    out["_gemma"] = (_kv_source(cfg, i, types), pairs)
    return out


def _gemma(cfg, i, layer_type, kw, layout):
    """Gemma 3n's and Gemma 4's difference from the plain decoder
    (after :func:`per_layer`): scale 1, QK-norm of gain ``w``, and the
    layer class: :class:`GemmaAttention` for a layer with keys of its
    own, :class:`HFKVReader` for one that reads another's."""
    source, pairs = cfg["_gemma"]
    if kw["rope_factor"] != 1.0 or kw["rope_scaling"] is not None:
        raise ValueError(
            f"RoPE scaling ({kw['rope_factor']}, {kw['rope_scaling']}) is "
            f"not built for {cfg.get('model_type')}"
        )
    if source is None:
        k_eq_v = cfg.get("model_type") in _GEMMA_4 and layer_type == FULL
        kw.update(
            qk_norm="head",
            scale=1.0,
            rope_pairs=pairs,
            k_eq_v=bool(k_eq_v and flag(cfg, "attention_k_eq_v")),
        )
        layout["cls"] = GemmaAttention
        return
    keep = {k: kw[k] for k in ("window", "rope_base", "norm_eps")}
    kw.clear()
    kw.update(keep, kv_source=source, rope_pairs=pairs)
    layout["cls"] = HFKVReader


def _gemma4_heads(cfg, i, layer_type):
    """``{head_dim, num_key_value_heads}`` of Gemma 4's layer ``i``:
    ``per_layer_config[i]`` when the file writes one, else on a full
    layer ``global_head_dim`` (512 when absent) and, with
    ``attention_k_eq_v``, ``num_global_key_value_heads``
    (``Gemma4TextConfig``'s rule)."""
    base = {
        "head_dim": count(cfg, "head_dim"),
        "num_key_value_heads": count(cfg, "num_key_value_heads"),
    }
    per = cfg.get("per_layer_config")
    if per is not None:
        if not isinstance(per, dict):
            raise ValueError(
                f"config key per_layer_config must be an object, got "
                f"{per!r:.80}"
            )
        over = per.get(str(i)) or {}
        extra = set(over) - set(base)
        if extra:
            raise ValueError(
                f"config key per_layer_config.{i} sets {sorted(extra)}, "
                "which attention_from_hf does not build (it reads "
                "head_dim and num_key_value_heads)"
            )
        return {
            k: count(over, k) if k in over else v for k, v in base.items()
        }
    if layer_type != FULL:
        return base
    d = count(cfg, "global_head_dim", required=False) or 512
    heads = base["num_key_value_heads"]
    if flag(cfg, "attention_k_eq_v"):
        key = "num_global_key_value_heads"
        heads = count(cfg, key, required=False) or heads
    return {"head_dim": d, "num_key_value_heads": heads}


def _gemma4_rope(cfg):
    """Gemma 4's ``rope_parameters`` per layer type, the class's default
    when the file writes none (sliding: base 1e4; full: proportional,
    base 1e6, a quarter of the pairs)."""
    rope = cfg.get("rope_parameters")
    if rope is None:
        rope = {
            SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
            FULL: {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.25,
                "rope_theta": 1_000_000.0,
            },
        }
    return rope


def _proportional(cfg, layer_type, head_dim):
    """``(cfg, pairs)``: a ``proportional`` RoPE of this layer type read
    into the number of pairs it turns (None: not proportional), and
    ``cfg`` with plain RoPE of the same base in its place."""
    rope = cfg.get("rope_parameters")
    kind = layer_type or FULL
    params = rope.get(kind) if isinstance(rope, dict) else None
    if not isinstance(params, dict) or params.get("rope_type") != (
        "proportional"
    ):
        return cfg, None
    allowed = {"rope_type", "rope_theta", "partial_rotary_factor", "factor"}
    extra = set(params) - allowed
    if extra or number(params, "factor", 1.0) != 1.0:
        raise ValueError(
            f"rope keys {sorted(extra)} are not understood for rope_type "
            "'proportional' (a factor other than 1 is not built)"
        )
    part = number(params, "partial_rotary_factor", 1.0)
    pairs = int(part * head_dim // 2)  # HF's rope_angles
    plain = {"rope_type": "default", "rope_theta": params["rope_theta"]}
    return {**cfg, "rope_parameters": {**rope, kind: plain}}, pairs
