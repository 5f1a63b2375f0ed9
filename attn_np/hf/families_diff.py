"""DiffLlama as a Hugging Face family (chapter 10): differential
attention (Ye et al., ICLR 2025, arXiv:2410.05258).

The paper subtracts two softmax maps. HF's ``DiffLlamaAttention``
(``transformers`` 5.24.0) spells it without a second map: Llama's
layer (RoPE, GQA, ``n_kv = num_key_value_heads``, which must be even)
runs the same queries and keys twice, against the two halves of the
value heads, and pairs query head ``p`` with head ``p + H/2``:

* call 1 reads value head ``j mod n_kv/2`` where Llama would read
  ``j``, call 2 value head ``n_kv/2 + j mod n_kv/2`` (``j = h // G``,
  ``G = H / n_kv``); the two outputs of a head side by side,
  ``o_h [2d]``, are the core's with value head ``j`` made of those two
  heads side by side (:func:`_value_pairs`), one softmax for both;
* ``c_p = o_p - lambda o_{p + H/2}`` for ``p < H/2``, with ``lambda =
  exp(l_q1 . l_k1) - exp(l_q2 . l_k2) + lambda_init`` (four learned
  vectors ``[d]``) and ``lambda_init = 0.8 - 0.6 exp(-0.3 i)`` at layer
  ``i`` (counted from 0, as the paper's ``l - 1``);
* ``z_p = (1 - lambda_init) c_p / sqrt(mean(c_p^2) + eps)``, an RMSNorm
  without a gain over the ``2d`` features (eps ``rms_norm_eps``), then
  the ``H/2`` pairs side by side, ``[H d]``, times ``W_o``.

This is the paper's equation, ``(softmax(Q1 K1^T s) - lambda
softmax(Q2 K2^T s)) V``, with ``Q1, Q2`` query heads ``p`` and ``p +
H/2``, ``K1, K2`` key heads ``j`` and ``j + n_kv/2`` (``j = p // G``)
and ``V`` value heads ``j`` and ``j + n_kv/2`` side by side, ``2d``
wide: both heads of a pair read the same pair of value heads.

The cache holds the values as HF's does, ``n_kv`` heads of ``d``; the
pairs are laid out from it at each call (a copy twice their size).

Backward of the output step (:class:`_DiffOutput`): ``dz`` from
``W_o``'s, ``dc`` the norm's of ``(1 - lambda_init) dz``, then ``do_p
= dc``, ``do_{p+H/2} = -lambda dc``, ``dlambda = -sum(dc o_{p+H/2})``
over every position and pair, and ``dl_q1 = dlambda e1 l_k1``, ``dl_k1 =
dlambda e1 l_q1``, ``dl_q2 = -dlambda e2 l_k2``, ``dl_k2 = -dlambda e2
l_q2`` (``e1 = exp(l_q1 . l_k1)``, ``e2 = exp(l_q2 . l_k2)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..heads import merge_groups, split_groups
from ..norms import qk_norm_backward, qk_norm_forward
from ..refinements import GatedOutput, _linear, linear_backward
from .config import count, number
from .layers import HFAttention

# the four vectors of lambda, HF's names and the layer's params keys
_LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def _lambda_init(layer_idx):
    """``0.8 - 0.6 exp(-0.3 i)``: 0.2 at layer 0, towards 0.8 deeper."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


def _value_pairs(v):
    """``v [B, n_kv, L, d] -> [B, n_kv, L, 2d]``: value head ``j`` of the
    core is heads ``j mod n_kv/2`` and ``n_kv/2 + j mod n_kv/2`` side by
    side, what HF's two calls read for query heads of group ``j``."""
    h = v.shape[1] // 2
    w = np.concatenate([v[:, :h], v[:, h:]], axis=-1)  # [B, h, L, 2d]
    return np.concatenate([w, w], axis=1)  # [B, n_kv, L, 2d]


def _value_pairs_backward(dv2):
    """The twin of :func:`_value_pairs`: ``[B, n_kv, L, 2d] -> [B, n_kv,
    L, d]``, each value head's gradient summed over the two groups that
    read it."""
    h, d = dv2.shape[1] // 2, dv2.shape[-1] // 2
    dw = dv2[:, :h] + dv2[:, h:]  # [B, h, L, 2d]
    return np.concatenate([dw[..., :d], dw[..., d:]], axis=1)


def _lambda(P, lambda_init):
    """``(lambda, (e1, e2))`` from the four vectors in ``P``."""
    e1 = math.exp(float(P["lambda_q1"] @ P["lambda_k1"]))
    e2 = math.exp(float(P["lambda_q2"] @ P["lambda_k2"]))
    return e1 - e2 + lambda_init, (e1, e2)


@dataclass(frozen=True)
class _DiffOutput(GatedOutput):
    """The output step of differential attention: ``o [B, n_kv, G, L,
    2d]``, head ``p`` minus ``lambda`` times head ``p + H/2``, an RMSNorm
    without a gain over ``2d`` (``eps``), times ``1 - lambda_init``, the
    pairs side by side ``[B, L, H d]``, then ``W_o`` (and ``b_o``)."""

    eps: float = 1e-5
    lambda_init: float = 0.2

    def add_params(self, layer, rng):
        super().add_params(layer, rng)
        for name in _LAMBDAS:  # HF's init: N(0, lambda_std_dev = 0.1)
            w = 0.1 * rng.standard_normal(layer.d_k)
            layer.params[name] = w.astype(layer.dtype)

    def forward(self, layer, o, x3):
        P, (B, L) = layer.params, x3.shape[:2]
        H = layer.n_heads
        o = merge_groups(o).reshape(B, L, 2, H // 2, -1)  # p, p + H/2
        lam, e = _lambda(P, self.lambda_init)
        second = o[:, :, 1]  # [B, L, H/2, 2d]
        c = o[:, :, 0] - lam * second
        n, norm = qk_norm_forward(c, eps=self.eps)  # over the 2d
        z = ((1.0 - self.lambda_init) * n).reshape(B, L, -1)  # [B, L, Hd]
        y, out = _linear(z, P["W_o"], P.get("b_o"))  # [B, L, d_model]
        return y, (out, norm, second, lam, e)

    def backward(self, layer, dy3, saved):
        out, norm, second, lam, (e1, e2) = saved
        P, grads = layer.params, layer.grads
        dz, grads["W_o"], db = linear_backward(dy3, out)  # [B, L, H d]
        if db is not None:
            grads["b_o"] = db
        dn = (1.0 - self.lambda_init) * dz.reshape(second.shape)
        dc, _ = qk_norm_backward(dn, norm)  # [B, L, H/2, 2d]
        dlam = -float(np.sum(dc * second))
        grads["lambda_q1"] = dlam * e1 * P["lambda_k1"]
        grads["lambda_k1"] = dlam * e1 * P["lambda_q1"]
        grads["lambda_q2"] = -dlam * e2 * P["lambda_k2"]
        grads["lambda_k2"] = -dlam * e2 * P["lambda_q2"]
        do = np.stack([dc, -lam * dc], axis=2)  # [B, L, 2, H/2, 2d]
        B, L = dy3.shape[:2]
        G, w = layer.group_size, 2 * layer.d_v
        return split_groups(
            do.reshape(B, L, -1), layer.n_kv_heads, G, w
        ), None


class _DiffAttention(HFAttention):
    """DiffLlama's layer: :class:`~attn_np.hf.layers.HFAttention` whose
    core reads the value pairs (:func:`_value_pairs`, made from the
    cached values at each call) and whose output step is
    :class:`_DiffOutput` (``lambda_init``, the layer's ``norm_eps``).
    ``n_kv_heads`` must be even."""

    rebuilds_from_options = True

    def __init__(self, *args, lambda_init=0.2, **kw):
        li = lambda_init
        if isinstance(li, bool) or not isinstance(li, (int, float)):
            raise TypeError(f"lambda_init must be a number, got {li!r}")
        if not math.isfinite(li):
            raise ValueError(f"lambda_init must be finite, got {li!r}")
        self.lambda_init = float(li)
        super().__init__(*args, **kw)
        if self.n_kv_heads % 2:
            raise ValueError(
                "differential attention splits the value heads in two: "
                f"n_kv_heads must be even, got {self.n_kv_heads}"
            )

    def _step_parts(self) -> dict:
        parts = super()._step_parts()
        if self.gate is not None:
            raise ValueError("DiffLlama's layer has no output gate")
        parts["out_projection"] = _DiffOutput(
            None, "o" in self.biases, self.norm_eps, self.lambda_init
        )
        return parts

    @property
    def options(self) -> dict:
        return {**super().options, "lambda_init": self.lambda_init}

    def attend(self, q, k, v, *, mask=None, **where):
        """The grouped core with value head ``j`` made of heads ``j mod
        n_kv/2`` and ``n_kv/2 + j mod n_kv/2``: ``o [B, n_kv, G, L,
        2d]``."""
        return super().attend(q, k, _value_pairs(v), mask=mask, **where)

    def project_backward(self, x3, g):
        g["v"] = _value_pairs_backward(g["v"])  # [B, n_kv, L, d]
        return super().project_backward(x3, g)


def _diffllama(cfg, i, layer_type, kw, layout):
    """DiffLlama: Llama's layer with differential attention, refused
    where HF's module refuses (an odd ``num_key_value_heads``,
    ``attention_dropout > 0``) and where its rotary class turns another
    share of the head than ours would (``partial_rotary_factor``)."""
    n_kv = count(cfg, "num_key_value_heads", required=False)
    n_kv = n_kv or count(cfg, "num_attention_heads")
    if n_kv % 2:
        raise ValueError(
            "config key num_key_value_heads must be even for diffllama "
            f"(its values split in two along the heads), got {n_kv}"
        )
    drop = number(cfg, "attention_dropout", 0.0, positive=False)
    if drop != 0.0:
        raise ValueError(
            f"config key attention_dropout={drop!r} is refused for "
            "diffllama, as HF's module refuses it (no dropout is defined "
            "for the difference of two maps)"
        )
    if kw.get("rotary_dim") is not None:
        raise ValueError(
            "config key partial_rotary_factor is not built for diffllama: "
            "its default rotary turns the whole head whatever the factor"
        )
    if kw.get("window") is not None:
        raise ValueError("diffllama's layer has no sliding window")
    kw["norm_eps"] = number(cfg, "rms_norm_eps", 1e-5)  # its class's
    kw["lambda_init"] = _lambda_init(i)
    layout["cls"] = _DiffAttention
