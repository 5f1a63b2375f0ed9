"""Mistral Large 4's text model (``mistral_large4_text``, chapter 10).

Its attention is DeepSeek-V3.2's indexed MLA without a query latent,
with three differences, each built here as a part of chapter 7's layer:

* every query, both parts, after RoPE, times a learned scale of its head
  ``i`` and position ``p`` (HF's ``softmax_scaling``)::

      c_i(p) = s_i ln(1 + p) + b_i       (s_i: scale, b_i: bias)

  A scalar per query row commutes with the rotation, so it is the last
  step of the queries (:meth:`~attn_np.MultiHeadLatentAttention.
  scale_queries`). Backward: ``dq_in = c dq`` and, summed over the rows
  of head ``i``, ``ds_i = sum (dq . q_in) ln(1 + p)``, ``db_i = sum
  dq . q_in``;
* RoPE of learned frequencies (LeRoPE): ``theta_j e^(a_j)``, ``a`` the
  model's ``rotary_emb.alpha`` (one per pair, shared by every layer and
  the indexers; a setting of the layer here, given in its state dict);
* an indexer that makes its queries from ``LayerNorm(x)`` (its
  ``q_input_norm``) and scales them as above with its own ``s``, ``b``.

A layer listed in ``no_rope_layers`` with 0 (NoPE), one whose
``kv_source_layers`` entry is an earlier layer (it reads that layer's
latents) and one whose ``indexer_types`` entry is ``shared`` (it reuses
the previous full layer's top-k) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..heads import split_heads
from ..rope import RopeCache, rope_backward, rotate_pairs
from ..rope_scaling import scaled_frequencies
from ..sparse import LightningIndexer, layernorm_forward
from .config import count, number
from .layers import HFSparseLatentAttention

_TYPE = "mistral_large4_text"


@dataclass(frozen=True, eq=False)
class _LearnedFrequencyRotary:
    """RoPE whose frequencies are chapter 11's (``rope_scaling``) times
    ``e^a``, ``a`` one learned number per pair (``log_gain [r/2]``):
    ``forward(x, positions) -> (y, saved)``, ``backward(dy, saved)``.
    The first ``rotary_dim`` features turn (all when None)."""

    base: float
    layout: str
    rope_scaling: dict | None
    log_gain: np.ndarray
    rotary_dim: int | None = None

    def forward(self, x, positions):
        r = x.shape[-1] if self.rotary_dim is None else self.rotary_dim
        p = np.asarray(positions)
        theta, m = scaled_frequencies(
            r, base=self.base, rope_scaling=self.rope_scaling,
            seq_len=int(p.max()) + 1,
        )  # fmt: skip
        theta = theta * np.exp(self.log_gain)  # [r/2]
        angles = p[:, None] * theta[None, :]  # [L, r/2]
        cos = (m * np.cos(angles)).astype(x.dtype)
        sin = (m * np.sin(angles)).astype(x.dtype)
        y = rotate_pairs(x, cos, sin, layout=self.layout)  # [..., L, d]
        return y, RopeCache(cos, sin, self.layout, r, x.shape)

    def backward(self, dy, saved):
        return rope_backward(dy, saved)


def _log_position_scale(slope, bias, positions):
    """``c [h, L] = s ln(1 + p) + b`` for head gains ``s, b [h]``."""
    log_p = np.log1p(np.asarray(positions, dtype=slope.dtype))  # [L]
    return slope[:, None] * log_p[None, :] + bias[:, None], log_p


class _MistralIndexer(LightningIndexer):
    """The lightning indexer of Mistral Large 4: queries ``LayerNorm(x)
    W_qi`` (gains ``g_qn``, biases ``b_qn``), each head's times
    ``s ln(1 + p) + b`` (``qs_slope``, ``qs_bias``), then RoPE on the
    first ``d_rope`` features. Its top-k has no gradient (HF runs it
    under ``no_grad``), so no backward is built."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        d, H, dt = self.d_model, self.n_heads, self.params["g_k"].dtype
        extra = dict(
            g_qn=np.ones(d, dt),
            b_qn=np.zeros(d, dt),
            qs_slope=np.zeros(H, dt),
            qs_bias=np.ones(H, dt),
        )
        self.params.update(extra)
        self.grads.update({k: np.zeros_like(a) for k, a in extra.items()})

    def queries(self, x3, c_q, pos):
        P = self.params
        c, _ = layernorm_forward(x3, P["g_qn"], P["b_qn"])  # [B, L, d]
        q = c @ P["W_qi"]  # [B, L, d] @ [d, H_I*d_I]
        q = split_heads(q, self.n_heads, self.head_dim)  # [B, H_I, L, d_I]
        scale, _ = _log_position_scale(P["qs_slope"], P["qs_bias"], pos)
        q = q * scale[..., None]  # [B, H_I, L, d_I] * [H_I, L, 1]
        q, rope = self.rotary.forward(q, pos)
        w = x3 @ P["W_w"] * self.weight_scale  # [B, L, d] @ [d, H_I]
        return q, w, rope

    def backward(self, dI):
        raise NotImplementedError(
            "Mistral Large 4's indexer has no backward: its top-k enters "
            "the layer without a gradient (HF runs it under no_grad)"
        )


class _MistralLargeLatentAttention(HFSparseLatentAttention):
    """Mistral Large 4's layer: :class:`HFSparseLatentAttention` with the
    indexer :class:`_MistralIndexer`, learned RoPE frequencies
    (:attr:`rope_log_gain`, HF's ``rotary_emb.alpha``) and every query
    times ``c_i(p) = s_i ln(1 + p) + b_i`` after RoPE (``qs_slope``,
    ``qs_bias``, HF's ``softmax_scaling.scale`` and ``.bias``)."""

    def __init__(self, *args, latent_eps=1e-6, **kw):
        super().__init__(*args, **kw)
        self.latent_eps = float(latent_eps)  # kv_a_layernorm's
        ix = self.indexer
        self.indexer = _MistralIndexer(
            self.d_model, self.d_model, ix.n_heads, ix.head_dim,
            self.d_rope, rope_base=self.rope_base,
            rope_layout=self.rope_layout, dtype=self.dtype,
        )  # fmt: skip
        h, dt = self.n_heads, self.dtype
        self.params.update(qs_slope=np.zeros(h, dt), qs_bias=np.ones(h, dt))
        for k in ("qs_slope", "qs_bias"):
            self.grads[k] = np.zeros(h, dt)
        self.set_rope_log_gain(np.zeros(self.d_rope // 2, dt))

    def set_rope_log_gain(self, a):
        """Set ``a [d_rope / 2]``: the frequencies become ``theta e^a``,
        in the layer's rotation and its indexer's."""
        a = np.asarray(a, dtype=self.dtype)
        if a.shape != (self.d_rope // 2,) or not np.isfinite(a).all():
            raise ValueError(
                f"rotary_emb.alpha must be {self.d_rope // 2} finite "
                f"numbers (one per pair of d_rope={self.d_rope}), got "
                f"shape {a.shape}"
            )
        self.rope_log_gain = a
        self.indexer.rotary = self._turn(self.d_rope)

    def _turn(self, rotary_dim=None):
        return _LearnedFrequencyRotary(
            self.rope_base, self.rope_layout, self.rope_scaling,
            self.rope_log_gain, rotary_dim,
        )  # fmt: skip

    @property
    def rotary(self):
        return self._turn()

    def scale_queries(self, q_c, q_r, pos):
        P = self.params
        c, log_p = _log_position_scale(P["qs_slope"], P["qs_bias"], pos)
        cq = c[..., None]  # [h, L, 1]
        return q_c * cq, q_r * cq, (q_c, q_r, c, log_p)

    def scale_queries_backward(self, dq, saved):
        q_c, q_r, c, log_p = saved
        q_in = np.concatenate([q_c, q_r], axis=-1)  # [B, h, L, d_h + d_R]
        dc = (dq * q_in).sum(axis=(0, 3))  # [h, L]
        self.grads["qs_slope"] = dc @ log_p  # [h, L] @ [L] -> [h]
        self.grads["qs_bias"] = dc.sum(axis=1)  # [h]
        return dq * c[..., None]


def _layer_plan(cfg, n):
    """``(no_rope_layers, kv_source_layers, indexer_types)``, each as
    Mistral Large 4's configuration class fills it when a file has
    none (RoPE but every 4th layer, every layer its own latents, every
    indexer full)."""
    nope = cfg.get("no_rope_layers")
    if nope is None:
        every = cfg.get("no_rope_layer_interval", 4)
        nope = [int((i + 1) % every != 0) for i in range(n)]
    source = cfg.get("kv_source_layers") or list(range(n))
    kinds = cfg.get("indexer_types")
    if kinds is None:
        pattern = cfg.get("index_topk_pattern")
        if pattern is not None:
            kinds = [{"F": "full", "S": "shared"}[c] for c in pattern]
        else:
            freq = max(cfg.get("index_topk_freq", 1), 1)
            off = cfg.get("index_skip_topk_offset", 2)
            kinds = [
                "full" if max(i - off + 1, 0) % freq == 0 else "shared"
                for i in range(n)
            ]
    for key, v in (("no_rope_layers", nope), ("kv_source_layers", source),
                   ("indexer_types", kinds)):  # fmt: skip
        if not isinstance(v, list) or len(v) < n:
            raise ValueError(
                f"config key {key} must list every layer "
                f"(num_hidden_layers={n}), got {v!r:.200}"
            )
    return nope, source, kinds


def _mistral_large4(cfg, layer_idx, mla):
    """Layer ``layer_idx`` of Mistral Large 4 (``mla`` builds DeepSeek's
    MLA): the indexed layer of this module, or a refusal naming the key
    of a kind it does not build."""
    n = count(cfg, "num_hidden_layers")
    nope, source, kinds = _layer_plan(cfg, n)
    cfg = {k: v for k, v in cfg.items() if k not in _PLAN_KEYS}
    _, args, kw, _ = mla(cfg, _TYPE, layer_idx)
    i = layer_idx
    if not nope[i]:
        raise ValueError(
            f"layer {i} is a NoPE layer (no_rope_layers[{i}] = 0: MLA "
            f"without the decoupled key, heads of qk_nope_head_dim + "
            f"qk_rope_head_dim), which attention_from_hf does not build "
            f"for {_TYPE}"
        )
    if source[i] != i:
        raise ValueError(
            f"layer {i} reads layer {source[i]}'s latents "
            f"(kv_source_layers[{i}] = {source[i]}), which "
            f"attention_from_hf does not build for {_TYPE}"
        )
    if kinds[i] != "full":
        raise ValueError(
            f"layer {i} has indexer_types[{i}] = {kinds[i]!r} (it reuses "
            "the previous full layer's top-k), which attention_from_hf "
            f"does not build for {_TYPE}"
        )
    kw.update(
        rope_layout="interleaved",  # HF's apply_rotary_pos_emb_interleave
        index_n_heads=count(cfg, "index_n_heads"),
        index_head_dim=count(cfg, "index_head_dim"),
        index_topk=count(cfg, "index_topk"),
        latent_eps=number(cfg, "rms_norm_eps", 1e-5),  # its class's
    )
    layout = {"kind": "mla", "indexer": True, "mistral_large": True}
    return _MistralLargeLatentAttention, args, kw, layout


_PLAN_KEYS = (
    "no_rope_layers",
    "kv_source_layers",
    "indexer_types",
    "no_rope_layer_interval",
    "index_topk_pattern",
    "index_topk_freq",
    "index_skip_topk_offset",
    "rope_interleave",
)
