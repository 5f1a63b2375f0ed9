"""Sparse attention on the latent cache (chapter 13).

DeepSeek Sparse Attention, DSA (DeepSeek-AI 2025, DeepSeek-V3.2-Exp): a
small *lightning indexer* scores every cached token for every query, and
the query then attends only the ``k`` tokens with the highest scores.
For query ``t`` and key ``s`` (row vectors)::

    I[t, s] = sum_j w[t, j] * ReLU(q_I[t, j] . k_I[s])    j = 1 ... H_I

with ``H_I`` indexer heads of ``d_I`` features. As released
(``inference/model.py``, class ``Indexer``):

* the queries come from the query latent ``c_Q`` of MLA (chapter 7):
  ``q_I = c_Q W_qi``, ``H_I`` heads of ``d_I``;
* one key per token, shared by all heads: ``k_I = LayerNorm(h W_ki)``;
* RoPE turns the first ``d_R`` features of every query head and of the
  key (``d_R`` is MLA's rotary width), in the rotate-half layout since
  the fix of 2025-11-18 (interleaved before);
* the weights come from the hidden state, with two scales folded in:
  ``w = h W_w / sqrt(H_I) / sqrt(d_I)``;
* the key is cached per token beside MLA's latent (in FP8 with one float32
  scale per 128 numbers in the release; here in the layer's dtype).

The main attention is MLA's absorbed (MQA) path over the selected rows
``[c_KV ; k_R]`` only. Top-k has no gradient: the indexer is trained by its
own loss, the KL divergence from the main attention (summed over heads,
L1-normalised, detached) to ``softmax(I)``, over all previous tokens in
the dense warm-up and over the selected ones in the sparse stage.

Block selection (MoBA, Lu et al. 2025; the selection branch of NSA, Yuan
et al. 2025) is the block-granular member of the family: score pooled
block keys, keep the top-n blocks. :func:`block_top_n_mask`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import (
    as_bool_array,
    as_float_array,
    broadcasts_to,
    check_backward_cache,
    check_cache_kind,
    check_count,
    check_finite,
    check_flag,
    check_float_dtype,
    check_layer_input,
    check_norm_input,
    check_overflow,
    check_positive_number,
    check_upstream,
    fingerprint,
)

# the costs of chapter 13 live in attn_np.costs.sparse; importable here too
from .costs.sparse import (  # noqa: F401
    dsa_cache_bytes_per_token,
    indexer_key_bytes,
    sparse_decode_step_flops,
)
from .grouped import (
    group_mask,
    grouped_attention_backward,
    grouped_attention_forward,
)
from .heads import flat, merge_heads, split_heads
from .latent import LatentKVCache, MultiHeadLatentAttention
from .masks import position_mask
from .rope import Rotary, check_rope_settings

# ------------------------------------------------------------ LayerNorm


@dataclass
class LayerNormCache:
    xhat: np.ndarray  # [..., d]: (x - mean) / std
    r: np.ndarray  # [..., 1]: 1 / std
    g: np.ndarray  # [d]


def layernorm_forward(x, g, b, *, eps=1e-6):
    """LayerNorm (Ba et al. 2016) over the last axis: ``(y, cache)``.

    ``y = g * (x - mean(x)) / sqrt(var(x) + eps) + b`` (the indexer's
    ``k_norm``, with DeepSeek's ``eps = 1e-6``).
    """
    x, eps = check_norm_input(x, "x", eps)
    for name, p in (("g", g), ("b", b)):
        p = as_float_array(p, name)
        check_finite(p, name)
        if p.shape != x.shape[-1:]:
            raise ValueError(
                f"{name} must have shape {x.shape[-1:]} (the last axis of "
                f"x {x.shape}), got {p.shape}"
            )
    mu = x.mean(axis=-1, keepdims=True)  # [..., 1]
    with np.errstate(over="ignore", invalid="ignore"):  # checked below
        var = x.var(axis=-1, keepdims=True)
    check_overflow(
        var, "var(x) in layernorm", "x is too large for the dtype"
    )
    r = 1.0 / np.sqrt(var + eps)  # [..., 1]
    xhat = (x - mu) * r  # [..., d]
    return xhat * g + b, LayerNormCache(xhat, r, g)


def layernorm_backward(dy, cache: LayerNormCache):
    """``(dx, dg, db)``. With ``u = dy * g``:
    ``dx = r (u - mean(u) - xhat mean(u xhat))``."""
    check_backward_cache(cache, LayerNormCache, "layernorm_forward")
    xhat, r, g = cache.xhat, cache.r, cache.g
    dy = check_upstream(dy, "dy", xhat.shape, "the LayerNorm output")
    u = dy * g  # [..., d]
    dx = r * (
        u
        - u.mean(axis=-1, keepdims=True)
        - xhat * (u * xhat).mean(axis=-1, keepdims=True)
    )
    d = xhat.shape[-1]
    dg = (dy * xhat).reshape(-1, d).sum(axis=0)  # [d]
    db = dy.reshape(-1, d).sum(axis=0)  # [d]
    return dx, dg, db


# ------------------------------------------------- the index score itself


@dataclass
class IndexScoreCache:
    q: np.ndarray  # [B, H_I, L_q, d_I]
    k: np.ndarray  # [B, L_k, d_I]
    w: np.ndarray  # [B, L_q, H_I]
    dots: np.ndarray  # [B, H_I, L_q, L_k]


def _refuse_nan(**arrays):
    """:func:`check_finite` on each array, by name (a function whose
    ``check_finite`` keyword hides the checker calls this)."""
    for name, a in arrays.items():
        check_finite(a, name)


def index_scores_forward(q, k, w, *, check_finite=True):
    """``I[b, t, s] = sum_j w[b, t, j] ReLU(q[b, j, t] . k[b, s])``.

    ``q [B, H_I, L_q, d_I]``, one key per token ``k [B, L_k, d_I]`` for
    all heads, ``w [B, L_q, H_I]``; returns ``(I [B, L_q, L_k], cache)``.
    ``check_finite`` refuses NaN or inf in them; the indexer passes
    False (its keys are checked once, a decode step would re-read them).
    """
    finite = check_flag(check_finite, "check_finite")
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    w = as_float_array(w, "w")
    if q.ndim != 4 or k.ndim != 3 or w.ndim != 3:
        raise ValueError(
            "q, k and w must be [B, H_I, L_q, d_I], [B, L_k, d_I] and "
            f"[B, L_q, H_I], got {q.shape}, {k.shape} and {w.shape}"
        )
    B, H, L_q, d = q.shape
    if k.shape[0] != B or k.shape[2] != d or w.shape != (B, L_q, H):
        raise ValueError(
            f"k must be [B={B}, L_k, d_I={d}] and w [B, L_q, H_I] = "
            f"{(B, L_q, H)} for q {q.shape}, got k {k.shape}, w {w.shape}"
        )
    if finite:
        _refuse_nan(q=q, k=k, w=w)
    # one key for all heads: stack the heads as rows of one product
    kT = k.swapaxes(-1, -2)  # [B, d, L_k]
    dots = q.reshape(B, H * L_q, d) @ kT  # [B, H*L_q, d] @ [B, d, L_k]
    dots = dots.reshape(B, H, L_q, -1)  # -> [B, H, L_q, L_k]
    relu = np.maximum(dots, 0.0).transpose(0, 2, 1, 3)  # [B, L_q, H, L_k]
    # the weighted sum over heads, one [1, H] @ [H, L_k] per query
    scores = (w[:, :, None, :] @ relu)[:, :, 0]  # -> [B, L_q, L_k]
    return scores, IndexScoreCache(q, k, w, dots)


def index_scores_backward(dI, cache: IndexScoreCache):
    """``(dq, dk, dw)`` from ``dI = dL/dI [B, L_q, L_k]``.

    ``dw[t, j] = sum_s dI[t, s] ReLU(dots[j, t, s])``;
    ``ddots = w[t, j] dI[t, s] [dots > 0]``; then the two products of a
    dot, with the shared key summed over heads.
    """
    q, k, w, dots = cache.q, cache.k, cache.w, cache.dots
    B, H, L_q, _ = q.shape
    dI = check_upstream(dI, "dI", (B, L_q, k.shape[1]), "the index scores")
    relu = np.maximum(dots, 0.0)  # [B, H, L_q, L_k]
    dw = (relu * dI[:, None]).sum(axis=-1).transpose(0, 2, 1)  # [B, L_q, H]
    wt = w.transpose(0, 2, 1)[..., None]  # [B, H, L_q, 1]
    ddots = np.where(dots > 0, wt * dI[:, None], 0.0)  # [B, H, L_q, L_k]
    dq = ddots @ k[:, None]  # [B, H, L_q, L_k] @ [B, 1, L_k, d]
    dk = (ddots.swapaxes(-1, -2) @ q).sum(axis=1)  # heads share k
    return dq, dk, dw


# ---------------------------------------------------- the indexer layer


class LightningIndexer:
    """DSA's lightning indexer, as released, with a hand-written backward.

    Parameters (``d_q_in`` is MLA's ``d_latent_q``, or ``d_model``
    without query compression)::

        W_qi [d_q_in, H_I * d_I]  wq_b      W_ki [d_model, d_I]  wk
        g_k, b_k [d_I]            k_norm    W_w [d_model, H_I]   weights_proj

    Head ``j`` owns columns ``j*d_I:(j+1)*d_I`` of ``W_qi``. RoPE turns
    the first ``d_rope`` features of queries and key.
    """

    def __init__(
        self,
        d_model,
        d_q_in,
        n_heads,
        head_dim,
        d_rope,
        *,
        rope_base=10000.0,
        rope_layout="half",
        seed=0,
        dtype=np.float64,
    ):
        self.d_model = check_count(d_model, "d_model")
        self.d_q_in = check_count(d_q_in, "d_q_in")
        self.n_heads = check_count(n_heads, "index_n_heads")
        self.head_dim = check_count(head_dim, "index_head_dim")
        self.d_rope = check_count(d_rope, "d_rope")
        if self.d_rope > self.head_dim or self.d_rope % 2:
            raise ValueError(
                f"d_rope must be even and at most index_head_dim="
                f"{self.head_dim}, got {d_rope}"
            )
        self.rope_base, self.rope_layout, _ = check_rope_settings(
            rope_base, rope_layout, None, self.d_rope
        )
        dtype = check_float_dtype(dtype)
        H, d = self.n_heads, self.head_dim
        shapes = {
            "W_qi": (self.d_q_in, H * d),
            "W_ki": (self.d_model, d),
            "W_w": (self.d_model, H),
        }
        rng = np.random.default_rng(seed)
        self.params = {
            k: (rng.standard_normal(s) / np.sqrt(s[0])).astype(dtype)
            for k, s in shapes.items()
        }
        self.params["g_k"] = np.ones(d, dtype=dtype)
        self.params["b_k"] = np.zeros(d, dtype=dtype)
        self.grads = {k: np.zeros_like(p) for k, p in self.params.items()}
        # the two scales of the release, folded into the weights
        self.weight_scale = 1.0 / math.sqrt(H) / math.sqrt(d)
        # chapter 6's turn, on the first d_rope features only
        self.rotary = Rotary(self.rope_base, self.rope_layout, self.d_rope)
        self._cache = None

    def __repr__(self) -> str:
        return (
            f"LightningIndexer(index_n_heads={self.n_heads}, "
            f"index_head_dim={self.head_dim}, d_rope={self.d_rope}, "
            f"rope_layout={self.rope_layout!r})"
        )

    def keys(self, x3, pos):
        """``k_I = RoPE(LayerNorm(x W_ki))``: ``[B, L, d_I]`` (cached)."""
        P = self.params
        k = x3 @ P["W_ki"]  # [B, L, d] @ [d, d_I] -> [B, L, d_I]
        k, norm = layernorm_forward(k, P["g_k"], P["b_k"])  # [B, L, d_I]
        k, rope = self.rotary.forward(k, pos)  # first d_R turn
        return k, (norm, rope)

    def queries(self, x3, c_q, pos):
        """``q_I [B, H_I, L, d_I]`` from ``c_Q``; ``w [B, L, H_I]``."""
        P = self.params
        q = c_q @ P["W_qi"]  # [B, L, d_q_in] @ [., H_I*d_I]
        q = split_heads(q, self.n_heads, self.head_dim)  # [B, H_I, L, d_I]
        q, rope = self.rotary.forward(q, pos)  # [B, H_I, L, d_I]
        w = x3 @ P["W_w"] * self.weight_scale  # [B, L, d] @ [d, H_I]
        return q, w, rope

    def forward(self, x, c_q, *, positions=None, keys=None):
        """Index scores ``I [B, L_q, L_k]`` of a chunk.

        ``x [B, L, d_model]`` is the hidden state and ``c_q [B, L, d_q_in]``
        MLA's query latent (``x`` itself without query compression).
        Without ``keys`` the chunk scores itself (training: ``L_k = L``,
        backward available). With ``keys [B, L_k, d_I]`` (the cached keys,
        the chunk's own included) it scores them (inference). Entries of
        future keys are computed too: the caller masks them.
        """
        x = as_float_array(x, "x")
        c_q = as_float_array(c_q, "c_q")
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must be [B, L, d_model={self.d_model}], got {x.shape}"
            )
        want = x.shape[:2] + (self.d_q_in,)
        if c_q.shape != want:
            raise ValueError(
                f"c_q must be [B, L, d_q_in] = {want} for x {x.shape}, "
                f"got {c_q.shape}"
            )
        check_finite(x, "x")
        check_finite(c_q, "c_q")
        L = x.shape[1]
        pos = np.arange(L) if positions is None else np.asarray(positions)
        q, w, q_rope = self.queries(x, c_q, pos)
        k_keep = None
        if keys is None:
            keys, k_keep = self.keys(x, pos)  # [B, L, d_I]
        else:  # the cached keys: checked as x is
            keys = as_float_array(keys, "keys")
            if (
                keys.ndim != 3
                or keys.shape[0] != x.shape[0]
                or keys.shape[-1] != self.head_dim
            ):
                raise ValueError(
                    f"keys must be [B={x.shape[0]}, L_k, index_head_dim="
                    f"{self.head_dim}], got {keys.shape}"
                )
            check_finite(keys, "keys")
        # [B, L_q, L_k]
        scores, sc = index_scores_forward(q, keys, w, check_finite=False)
        self._cache = None
        if k_keep is not None:
            self._cache = (x, c_q, q_rope, k_keep, sc)
        return scores

    def backward(self, dI):
        """``(dx, dc_q)`` from ``dI [B, L, L]``; fills ``self.grads``."""
        if self._cache is None:
            raise RuntimeError(
                "backward needs a preceding forward without keys (the "
                "cached path is inference only)"
            )
        x, c_q, q_rope, (norm, k_rope), sc = self._cache
        P, G = self.params, self.grads
        dq, dk, dw = index_scores_backward(dI, sc)
        xf, cf = flat(x), flat(c_q)  # [B*L, d], [B*L, d_q_in]
        # weights: w = x W_w * scale
        dw = dw * self.weight_scale  # [B, L, H_I]
        G["W_w"] = xf.T @ flat(dw)  # [d, B*L] @ [B*L, H_I]
        dx = dw @ P["W_w"].T  # [B, L, H_I] @ [H_I, d] -> [B, L, d]
        # queries: q = RoPE(split(c_q W_qi))
        dq = merge_heads(self.rotary.backward(dq, q_rope))  # [B, L, H_I*d_I]
        G["W_qi"] = cf.T @ flat(dq)  # [d_q_in, H_I*d_I]
        dc_q = dq @ P["W_qi"].T  # [B, L, H_I*d_I] @ [., d_q_in]
        # key: k = RoPE(LayerNorm(x W_ki))
        dk = self.rotary.backward(dk, k_rope)  # [B, L, d_I]
        dk, G["g_k"], G["b_k"] = layernorm_backward(dk, norm)
        G["W_ki"] = xf.T @ flat(dk)  # [d, B*L] @ [B*L, d_I]
        dx = dx + dk @ P["W_ki"].T  # [B, L, d_I] @ [d_I, d]
        return dx, dc_q


# -------------------------------------------------------------- top-k


def top_k_mask(scores, k, allowed=None):
    """Boolean ``[..., L_k]``: the ``k`` highest ``scores`` of each row.

    Only ``allowed`` entries (bool, broadcastable) may be chosen; a row
    with fewer than ``k`` of them keeps them all. Ties are broken towards
    the earlier position, so a row's choice does not depend on how many
    (masked) entries follow it: prefill and decode choose alike.
    """
    scores = as_float_array(scores, "scores", min_ndim=1)
    check_finite(scores, "scores")
    k = check_count(k, "k")
    if allowed is not None:
        allowed = _allowed_like(allowed, scores.shape)
        s = np.where(allowed, scores, -np.inf)  # [..., L_k]
    else:
        s = scores
    L_k = s.shape[-1]
    if k >= L_k:
        full = np.ones(s.shape, dtype=bool)
        return full if allowed is None else full & allowed
    kth = np.partition(s, L_k - k, axis=-1)[..., L_k - k, None]  # [..., 1]
    above = s > kth  # fewer than k
    tie = s == kth
    need = k - above.sum(axis=-1, keepdims=True)  # [..., 1]
    chosen = above | (tie & (np.cumsum(tie, axis=-1) <= need))
    return chosen if allowed is None else chosen & allowed


def _allowed_like(allowed, shape, name="allowed"):
    """A boolean mask broadcast to ``shape``, or a ValueError naming it."""
    allowed = as_bool_array(allowed, name)
    if not broadcasts_to(allowed.shape, tuple(shape)):
        raise ValueError(
            f"{name} must broadcast to {tuple(shape)}, got {allowed.shape}"
        )
    return np.broadcast_to(allowed, shape)


def selected_indices(chosen):
    """``(idx, valid)``, both ``[..., n]``: the chosen positions of each
    row in increasing order, ``n`` the most any row chose; ``valid``
    marks the real ones (a short row is padded with position 0)."""
    chosen = as_bool_array(chosen, "chosen")
    if chosen.ndim < 1:
        raise ValueError("chosen must be a mask [..., L_k], got a scalar")
    n = max(int(chosen.sum(axis=-1).max(initial=0)), 1)
    # a stable sort of "not chosen" puts the chosen first, in order
    order = np.argsort(~chosen, axis=-1, kind="stable")[..., :n]
    valid = np.take_along_axis(chosen, order, axis=-1)
    return np.where(valid, order, 0), valid


# ------------------------------------ sparse attention on the cached rows


@dataclass
class SparseMQACache:
    att: object  # the grouped core's cache
    idx: np.ndarray  # [B, L_q, n]
    L_k: int
    d_v: int


def sparse_mqa_forward(q, rows, idx, valid, *, d_v, scale):
    """Every query head of token ``t`` attends the rows ``idx[t]`` only.

    MLA's absorbed path is multi-query attention whose one key is the
    cached row ``[c_KV ; k_R]`` and whose value is its first ``d_v``
    (``= d_c``) columns. ``q [B, L_q, h, D]``, ``rows [B, L_k, D]``,
    ``idx, valid [B, L_q, n]`` (:func:`selected_indices`); returns
    ``(o [B, L_q, h, d_v], cache)``. Only ``n`` rows per token are read:
    each token's gathered rows are one key/value head of the grouped core
    (``n_kv = L_q``), its ``h`` query heads the group.
    """
    q = as_float_array(q, "q")
    rows = as_float_array(rows, "rows")
    if q.ndim != 4:
        raise ValueError(f"q must be [B, L_q, h, D], got shape {q.shape}")
    check_finite(q, "q")
    check_finite(rows, "rows")
    B, L_q, h, D = q.shape
    d_v = check_count(d_v, "d_v")
    if d_v > D:
        raise ValueError(
            f"d_v must be at most D = {D} (the values are the rows' first "
            f"d_v columns), got {d_v}"
        )
    scale = check_positive_number(scale, "scale")
    if rows.ndim != 3 or rows.shape[0] != B or rows.shape[2] != D:
        raise ValueError(
            f"rows must be [B={B}, L_k, D={D}] for q {q.shape}, got "
            f"{rows.shape}"
        )
    if idx.shape[:2] != (B, L_q) or valid.shape != idx.shape:
        raise ValueError(
            f"idx and valid must be [B, L_q, n] with B, L_q = {(B, L_q)}, "
            f"got {idx.shape} and {valid.shape}"
        )
    if idx.dtype == np.bool_ or not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"idx must be integer row indices, got {idx.dtype}")
    valid = as_bool_array(valid, "valid")
    L_k = rows.shape[1]
    if idx.size and (idx.min() < 0 or idx.max() >= L_k):
        raise ValueError(
            f"idx must lie in [0, L_k) = [0, {L_k}) (rows of rows), got "
            f"values from {idx.min()} to {idx.max()}"
        )
    b = np.arange(B)[:, None, None]  # [B, 1, 1]
    kv = rows[b, idx]  # gather: [B, L_q, n, D]
    o, att = grouped_attention_forward(
        q[:, :, :, None],  # [B, n_kv=L_q, G=h, 1, D]
        kv,  # [B, n_kv=L_q, n, D]: token t's own rows
        kv[..., :d_v],  # the values: the latents themselves
        allowed=valid[:, :, None, None, :],  # padding: [B, L_q, 1, 1, n]
        scale=scale,
        check_finite=False,
    )  # o: [B, L_q, h, 1, d_v]
    return o[:, :, :, 0], SparseMQACache(att, idx, rows.shape[1], d_v)


def sparse_mqa_backward(do, cache: SparseMQACache):
    """``(dq [B, L_q, h, D], drows [B, L_k, D])``.

    The grouped core's backward on the gathered rows (key and value
    gradients add up in the first ``d_v`` columns, which are both), then
    a scatter-add: a row chosen by several tokens gets the sum of their
    gradients, a row nobody chose gets zero.
    """
    check_backward_cache(cache, SparseMQACache, "sparse_mqa_forward")
    att, idx, d_v = cache.att, cache.idx, cache.d_v
    want = att.out.shape[:3] + (d_v,)
    do = check_upstream(do, "do", want, "the sparse attention output")
    g = grouped_attention_backward(do[:, :, :, None], att)
    dkv = g["k"]  # [B, L_q, n, D]
    dkv[..., :d_v] += g["v"]  # the value is the key's first d_v columns
    B, _, _, D = dkv.shape
    drows = np.zeros((B, cache.L_k, D), dtype=dkv.dtype)
    b = np.broadcast_to(np.arange(B)[:, None, None], idx.shape)
    np.add.at(drows, (b, idx), dkv)  # scatter-add: [B, L_k, D]
    return g["q"][:, :, :, 0], drows


# ------------------------------------------------------ the indexer loss


@dataclass
class IndexerLossCache:
    p: np.ndarray  # [B, L_q, L_k]: the target, rows sum to 1 or 0
    q: np.ndarray  # [B, L_q, L_k]: softmax(I) on the set


def indexer_kl_forward(scores, weights, allowed):
    """``sum_t KL(p_t || softmax(I_t))`` over the keys ``allowed``.

    ``weights [B, h, L_q, L_k]`` is the main attention; ``p_t`` is its
    sum over heads on the set, L1-normalised, a constant (detached).
    ``allowed`` (bool, broadcastable to ``[B, L_q, L_k]``) is the causal
    mask in the dense warm-up and the selected set in the sparse stage.
    Returns ``(loss, cache)``; a row with an empty set adds 0.
    """
    scores = as_float_array(scores, "scores", min_ndim=3)
    weights = as_float_array(weights, "weights")
    if weights.ndim != 4 or weights.shape[2:] != scores.shape[1:]:
        raise ValueError(
            "weights must be [B, h, L_q, L_k] with L_q, L_k of scores "
            f"{scores.shape}, got {weights.shape}"
        )
    check_finite(scores, "scores")
    check_finite(weights, "weights")
    if (weights < 0).any():
        raise ValueError(
            "weights must be attention weights (non-negative), got a "
            f"minimum of {weights.min():.3g}"
        )
    allowed = _allowed_like(allowed, scores.shape)
    a = np.where(allowed, weights.sum(axis=1), 0.0)  # [B, L_q, L_k]
    total = a.sum(axis=-1, keepdims=True)  # [B, L_q, 1]
    p = a / np.where(total > 0, total, 1.0)  # L1-normalised, detached
    # log softmax on the set, without forming log(0)
    s = np.where(allowed, scores, -np.inf)  # [B, L_q, L_k]
    m = s.max(axis=-1, keepdims=True)  # [B, L_q, 1]
    m = np.where(np.isfinite(m), m, 0.0)  # empty rows
    e = np.exp(s - m)  # 0 off the set
    z = e.sum(axis=-1, keepdims=True)  # [B, L_q, 1]
    z = np.where(z > 0, z, 1.0)
    log_q = np.where(allowed, scores - m - np.log(z), 0.0)
    safe_p = np.where(p > 0, p, 1.0)
    loss = float(np.sum(np.where(p > 0, p * (np.log(safe_p) - log_q), 0)))
    return loss, IndexerLossCache(p, e / z)


def indexer_kl_backward(dloss, cache: IndexerLossCache):
    """``dI = dloss * (softmax(I) - p)`` on the set, 0 elsewhere.

    Only ``-sum_s p_s log q_s`` depends on ``I``; through the
    log-softmax, ``d/dI_s = q_s sum_r p_r - p_s``, and ``sum_r p_r`` is 1
    on a non-empty row (0 on an empty one, where ``q`` is 0 too).
    """
    p, q = cache.p, cache.q
    dloss = check_upstream(dloss, "dloss", (), "the loss (a number)")
    mass = p.sum(axis=-1, keepdims=True)  # [B, L_q, 1]: 1 or 0
    return float(np.asarray(dloss)) * (q * mass - p)


# ------------------------------------------------------------ the cache


class IndexedLatentCache(LatentKVCache):
    """Chapter 7's latent cache plus one indexer key per position.

    One transposed buffer ``[B, d_c + d_R + d_I, capacity]`` (a
    :class:`~attn_np.kv_cache.CacheBuffer`) holds ``c_KV``, ``k_R`` and
    ``k_I`` of every position: :attr:`rows` shows the first two as
    chapter 7's rows, :attr:`index_keys` the third. ``len``,
    ``truncate`` and ``check_chunk`` cover all three; ``nbytes`` counts
    them all, :attr:`index_nbytes` the indexer's part.
    """

    names = ("batch", "d_latent_kv", "d_rope", "index_head_dim")

    def __repr__(self) -> str:
        return f"IndexedLatentCache({self._describe()})"

    @property
    def rows(self) -> np.ndarray:
        """View of the rows ``[c_KV ; k_R]``: ``[B, len, d_c + d_R]``."""
        if self._buf is None:
            raise ValueError("the cache is empty: it holds no latents yet")
        width = self._widths[0] + self._widths[1]
        return self._buf[..., :width, : self._len].swapaxes(-1, -2)

    @property
    def index_keys(self) -> np.ndarray:
        """View of the cached indexer keys ``k_I``: ``[B, len, d_I]``."""
        return self._part(2)

    @property
    def index_nbytes(self) -> int:
        """``B * len * d_I * itemsize``: the indexer's part of nbytes."""
        if self._buf is None:
            return 0
        d_i = self._widths[2]
        return self._buf.shape[0] * self._len * d_i * self._buf.itemsize

    def append(self, c_kv, k_r, k_index=None):
        """Add a chunk's ``c_KV [B, L, d_c]``, ``k_R [B, L, d_R]`` and
        indexer keys ``k_I [B, L, d_I]``; returns the views
        ``(rows, index_keys)``."""
        if k_index is None:
            raise ValueError(
                "k_index must be a NumPy array [B, L, d_I]: an "
                "IndexedLatentCache keeps one indexer key per position"
            )
        self.append_parts({"c_kv": c_kv, "k_r": k_r, "k_index": k_index})
        return self.rows, self.index_keys


# ------------------------------------------------------------ the layer


class SparseLatentAttention(MultiHeadLatentAttention):
    """MLA whose queries attend only the top-k rows of a lightning indexer.

    Chapter 7's layer and parameters, plus :attr:`indexer` (a
    :class:`LightningIndexer` reading MLA's query latent) and
    ``index_topk``. Always causal. Without a cache the forward is the
    expanded (training) path with the selection as a mask, and
    :meth:`backward` is chapter 7's; with an :class:`IndexedLatentCache`
    (or ``absorb=True``) it is the absorbed path reading only the
    selected cached rows (inference).
    """

    def __init__(
        self,
        d_model,
        n_heads,
        d_head,
        d_latent_kv,
        d_rope,
        d_latent_q=None,
        d_head_v=None,
        rope_base=10000.0,
        rope_layout="half",
        seed=0,
        dtype=np.float64,
        *,
        latent_norm=False,
        index_n_heads,
        index_head_dim,
        index_topk,
        index_rope_layout="half",
    ):
        super().__init__(
            d_model,
            n_heads,
            d_head,
            d_latent_kv,
            d_rope,
            d_latent_q,
            d_head_v,
            rope_base,
            rope_layout,
            seed,
            dtype,
            latent_norm=latent_norm,
        )
        self.index_topk = check_count(index_topk, "index_topk")
        self.indexer = LightningIndexer(
            d_model,
            d_model if d_latent_q is None else d_latent_q,
            index_n_heads,
            index_head_dim,
            d_rope,
            rope_base=rope_base,
            rope_layout=index_rope_layout,
            seed=seed + 1,
            dtype=dtype,
        )
        self.index_scores = None  # [B, L_q, L_k]
        self.selected = None  # [B, L_q, L_k] bool

    def new_cache(self):
        """An empty :class:`IndexedLatentCache` for ``forward(x,
        kv_cache=...)``."""
        return IndexedLatentCache()

    def forward(self, x, *, causal=True, kv_cache=None, absorb=None):
        """``y`` of a causal chunk ``x [L | B, L, d_model]``.

        With ``kv_cache`` (an :class:`IndexedLatentCache`, from
        :meth:`new_cache`) ``x`` follows the cached positions and its
        latents and indexer keys are appended. ``absorb`` defaults to
        True with a cache. Always causal (``causal=True``, the keyword
        every layer takes).
        """
        if causal is not True:
            raise ValueError(
                "SparseLatentAttention is causal (its top-k picks among "
                f"earlier positions): causal must be True, got {causal!r}"
            )
        name = "x" if kv_cache is None else "x_chunk"
        x3, unbatched = check_layer_input(x, self.d_model, name)
        B, L, _ = x3.shape
        absorb = (kv_cache is not None) if absorb is None else absorb
        absorb = check_flag(absorb, "absorb")
        self.check_cache(kv_cache, x3)
        start = 0 if kv_cache is None else len(kv_cache)
        pos = np.arange(start, start + L)  # absolute positions: [L]

        # project: MLA's queries and latents, the indexer's key
        q_c, q_r, q_keep = self._queries(x3, pos)  # [B, h, L, d_h|d_R]
        c_kv, k_r, kv_keep = self._latents(x3, pos)  # [B, L, d_c|d_R]
        c_q = q_keep[0]  # the query latent (x without compression)
        if kv_cache is None:
            rows = np.concatenate([c_kv, k_r], axis=-1)  # [B, L, d_c+d_R]
            keys = None  # the indexer makes them (and can go back)
        else:
            k_i, _ = self.indexer.keys(x3, pos)  # [B, L, d_I]
            rows, keys = kv_cache.append(c_kv, k_r, k_i)  # [B, L_k, .]
        L_k = rows.shape[1]

        # select: index scores, causal top-k
        scores = self.indexer.forward(x3, c_q, positions=pos, keys=keys)
        causal = position_mask(pos, np.arange(L_k))  # [L, L_k]
        chosen = top_k_mask(scores, self.index_topk, causal)  # [B, L, L_k]
        self.index_scores, self.selected = scores, chosen

        # attend: over the chosen rows only
        self._cache = self._att = None
        if absorb:  # gather the chosen rows (inference)
            o = self._attend_selected(q_c, q_r, rows, chosen)
        else:  # chapter 7's expanded path, the selection as its mask
            where = dict(
                allowed=group_mask(
                    chosen[:, None], B, self.n_heads, 1, L, L_k
                ),
                scale=self.scale,
                check_finite=False,  # x was checked once
            )
            d_c = self.d_latent_kv
            o, self._att = self._attend_expanded(
                q_c, q_r, rows[..., :d_c], rows[..., d_c:], where
            )
        o = merge_heads(o)  # [B, h, L, d_v] -> [B, L, h*d_v]
        y = o @ self.params["W_o"]  # [B, L, h*d_v] @ [h*d_v, d]
        if not absorb and kv_cache is None:  # chapter 7's backward
            keep = (x3, q_keep, kv_keep, c_kv, o, self._att, unbatched)
            self._cache = keep + (fingerprint(x3),)
        return y[0] if unbatched else y

    def check_cache(self, kv_cache, x3):
        """Raise unless ``kv_cache`` (None, or an
        :class:`IndexedLatentCache`) can take ``x3``'s chunk."""
        if kv_cache is None:
            return
        check_cache_kind(
            kv_cache,
            IndexedLatentCache,
            "the indexer keys live beside the latents",
        )
        dtype = np.result_type(x3.dtype, self.params["W_dkv"].dtype)
        layout = (x3.shape[0], self.d_latent_kv, self.d_rope)
        kv_cache.check_chunk(
            x3.shape, layout + (self.indexer.head_dim,), dtype
        )
        kv_cache.check_owner(self, ("W_dkv", "W_kr"))

    def _attend_selected(self, q_c, q_r, rows, chosen):
        """The absorbed (MQA) path, reading only the chosen rows."""
        w_uk, w_uv = self._absorbed_weights()  # per head, chapter 7
        q_lat = q_c @ w_uk  # [B, h, L, d_h] @ [h, d_h, d_c] -> [., d_c]
        q = np.concatenate([q_lat, q_r], axis=-1)  # [B, h, L, d_c + d_R]
        q = q.transpose(0, 2, 1, 3)  # a token's heads as rows: [B, L, h, D]
        idx, valid = selected_indices(chosen)  # [B, L, n]
        o_lat, _ = sparse_mqa_forward(
            q, rows, idx, valid, d_v=self.d_latent_kv, scale=self.scale
        )  # [B, L, h, d_c]: a weighted sum of the chosen latents
        o_lat = o_lat.transpose(0, 2, 1, 3)  # [B, h, L, d_c]
        return o_lat @ w_uv  # [B, h, L, d_c] @ [h, d_c, d_v]

    def indexer_loss(self, *, sparse=True):
        """The indexer's loss and ``dI`` after a training forward.

        ``sparse=False``: the dense warm-up (all previous tokens; run it
        with ``index_topk`` at least the sequence length, so the main
        attention is dense). ``sparse=True``: the selected set only.
        """
        if self._cache is None or self.attention_weights is None:
            raise RuntimeError(
                "indexer_loss needs a preceding forward without kv_cache "
                "and with absorb=False"
            )
        sparse = check_flag(sparse, "sparse")
        L_q, L_k = self.index_scores.shape[1:]
        allowed = (
            self.selected
            if sparse
            else position_mask(np.arange(L_k - L_q, L_k), np.arange(L_k))
        )
        loss, c = indexer_kl_forward(
            self.index_scores, self.attention_weights, allowed
        )
        return loss, indexer_kl_backward(1.0, c)


# ------------------------------------------------------- block selection


def _query_positions(q_positions, L_q, L_k):
    """``L_q`` integer positions among ``0 ... L_k - 1``, or raise."""
    qp = np.asarray(q_positions)
    if (
        qp.shape != (L_q,)
        or qp.dtype == np.bool_
        or not np.issubdtype(qp.dtype, np.integer)
        or (L_q and not 0 <= qp.min() <= qp.max() < L_k)
    ):
        raise ValueError(
            f"q_positions must be {L_q} integer positions of the {L_k} "
            f"keys (0 ... {L_k - 1}), got {qp.dtype} of shape {qp.shape}"
            + (f": {qp.tolist()!r:.60}" if qp.ndim == 1 else "")
        )
    return qp


def block_top_n_mask(q, k, *, block_size, n_blocks, q_positions=None):
    """MoBA's block selection: ``[..., L_q, L_k]`` bool, True = attend.

    ``q [..., L_q, d]``, ``k [..., L_k, d]``. Keys are cut into blocks of
    ``block_size`` positions; block ``i`` is scored by ``q . mean(K_i)``.
    A query takes its own block (causally, up to itself) and the best
    ``n_blocks - 1`` of the blocks that end before it; no future block.
    With ``n_blocks`` at least the number of blocks it is causal
    attention. ``q_positions`` (default: the last ``L_q`` of ``L_k``)
    place the queries.
    """
    q = as_float_array(q, "q", min_ndim=2)
    k = as_float_array(k, "k", min_ndim=2)
    check_finite(q, "q")
    check_finite(k, "k")
    size = check_count(block_size, "block_size")
    n = check_count(n_blocks, "n_blocks")
    L_q, L_k = q.shape[-2], k.shape[-2]
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share the feature axis, got {q.shape} and "
            f"{k.shape}"
        )
    if q_positions is None:
        q_positions = np.arange(L_k - L_q, L_k)
    qp = _query_positions(q_positions, L_q, L_k)  # [L_q]
    n_b = -(-L_k // size)  # ceil: the last block may be short
    pad = n_b * size - L_k
    kp = np.concatenate(
        [k, np.zeros(k.shape[:-2] + (pad, k.shape[-1]), dtype=k.dtype)],
        axis=-2,
    )  # [..., n_b*size, d]
    counts = np.minimum(size, L_k - np.arange(n_b) * size)  # [n_b]
    pooled = kp.reshape(k.shape[:-2] + (n_b, size, k.shape[-1])).sum(-2)
    pooled /= counts[:, None]  # mean pooling: [..., n_b, d]
    s = q @ pooled.swapaxes(-1, -2)  # [..., L_q, d] @ [..., d, n_b]
    own = qp // size  # [L_q]: the query's own block
    ends = (np.arange(n_b) + 1) * size  # [n_b]: one past each block
    past = ends[None, :] <= qp[:, None]  # [L_q, n_b]: ended before
    chosen = top_k_mask(s, n - 1, past) if n > 1 else np.zeros_like(past)
    chosen = chosen | (np.arange(n_b)[None, :] == own[:, None])  # [.., n_b]
    tokens = np.repeat(chosen, size, axis=-1)[..., :L_k]  # [..., L_q, L_k]
    return tokens & position_mask(qp, np.arange(L_k))
