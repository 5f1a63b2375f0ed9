"""Linear attention, DeltaNet and Gated DeltaNet (chapter 12).

Softmax attention keeps every key and value. Linear attention replaces
``exp(q . k)`` by a product of features, ``phi(q) . phi(k)`` (Katharopoulos
et al. 2020), and the causal sum becomes a recurrence on a fixed-size
state ``S [d_k, d_v]``::

    S_t = S_{t-1} + phi(k_t) v_t^T          o_t = S_t^T phi(q_t)

The delta rule (DeltaNet; Schlag et al. 2021, Yang et al. 2024) writes
the *error* of what the state already returns for ``k_t``; Gated DeltaNet
(Yang, Kautz and Hatamizadeh, ICLR 2025) first decays the state by
``alpha_t = exp(g_t)``::

    S'_t = alpha_t S_{t-1}                                  decay
    u_t  = beta_t (v_t - S'_t^T k_t)                        [d_v]
    S_t  = S'_t + k_t u_t^T                                 [d_k, d_v]
    o_t  = S_t^T q_t                                        [d_v]

which is ``S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t
v_t^T``. ``g`` of shape ``[..., T]`` is one decay per head (Gated
DeltaNet); of shape ``[..., T, d_k]`` it is one per key channel,
``S'_t = Diag(alpha_t) S_{t-1}`` (Kimi Delta Attention, Kimi Team 2025).

Two forms compute it:

* :func:`gated_delta_recurrent_forward`: the loop over tokens; its
  backward is backpropagation through time and keeps all ``T + 1``
  states.
* :func:`gated_delta_chunked_forward`: chunks of ``C`` tokens. With
  ``Gamma_r`` the decay summed from the chunk's start, ``S_0`` the state
  entering it and ``<x, y>_ri = sum_d x_rd y_id exp(Gamma_rd - Gamma_id)``::

      A = -diag(beta) <K, K>   strictly lower     [C, C]
      T = (I - A)^{-1}         forward substitution
      W = T diag(beta) (K * e^Gamma)   U~ = T diag(beta) V
      U = U~ - W S_0                              [C, d_v]: the u_t
      O = (Q * e^Gamma) S_0 + (<Q, K> incl. diagonal) U
      S_C = e^Gamma_C S_0 + (K * e^(Gamma_C - Gamma))^T U

  (the WY/UT representation of Yang et al. 2024). Only ``S_0`` of each
  chunk is kept; the backward recomputes the rest chunk by chunk.

:class:`GatedDeltaNet` is the released layer (Qwen3-Next's
``linear_attention``): short causal convolutions, L2-normalised ``q`` and
``k``, ``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``,
more value heads than key heads and a gated RMSNorm. :class:`StateCache`
carries one state and the convolution's last inputs per sequence, for
decoding. :class:`KimiDeltaAttention` overrides its gates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import (
    as_float_array,
    check_count,
    check_finite,
    check_float_dtype,
    check_positive_int,
    check_upstream,
)
from .training.layers import rmsnorm_backward, rmsnorm_forward

# ---------------------------------------------------------------------------
# -- linear attention


def elu_feature_map(x):
    """``phi(x) = elu(x) + 1`` (Katharopoulos et al. 2020): positive, so the
    normaliser ``phi(q) . sum phi(k)`` never vanishes."""
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


@dataclass
class LinearAttentionCache:
    fq: np.ndarray  # [..., T, d_k]: phi(q)
    fk: np.ndarray  # [..., T, d_k]: phi(k)
    v: np.ndarray  # [..., T, d_v]
    q: np.ndarray  # [..., T, d_k]
    k: np.ndarray  # [..., T, d_k]
    num: np.ndarray  # [..., T, d_v]: S_t^T phi(q_t)
    den: np.ndarray  # [..., T, 1]: z_t . phi(q_t)


def linear_attention_forward(q, k, v):
    """Causal linear attention with ``phi = elu + 1``, as the recurrence::

        S_t = S_{t-1} + phi(k_t) v_t^T     z_t = z_{t-1} + phi(k_t)
        o_t = S_t^T phi(q_t) / (z_t . phi(q_t))

    ``q, k [..., T, d_k]``, ``v [..., T, d_v]`` -> ``o [..., T, d_v]``.
    The state ``(S, z)`` has ``d_k (d_v + 1)`` numbers, whatever ``T``.
    """
    q, k, v = _check_qkv(q, k, v)
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    *lead, T, d_k = q.shape
    S = np.zeros((*lead, d_k, v.shape[-1]), dtype=v.dtype)  # [..., d_k, d_v]
    z = np.zeros((*lead, d_k), dtype=v.dtype)  # [..., d_k]
    num = np.empty(v.shape, dtype=v.dtype)
    den = np.empty((*lead, T, 1), dtype=v.dtype)
    for t in range(T):
        # S += phi(k_t) v_t^T: [..., d_k, 1] * [..., 1, d_v]
        S = S + fk[..., t, :, None] * v[..., t, None, :]
        z = z + fk[..., t, :]
        # S^T phi(q_t): [..., 1, d_k] @ [..., d_k, d_v] -> [..., d_v]
        num[..., t, :] = (fq[..., t, None, :] @ S)[..., 0, :]
        den[..., t, 0] = np.sum(z * fq[..., t, :], axis=-1)
    cache = LinearAttentionCache(fq, fk, v, q, k, num, den)
    return num / den, cache


def linear_attention_backward(do, cache: LinearAttentionCache):
    """``(dq, dk, dv)`` of :func:`linear_attention_forward`, from its
    parallel form ``num = (M * phi(Q) phi(K)^T) V``, ``den = (M * phi(Q)
    phi(K)^T) 1`` (``M`` the causal mask)."""
    c = cache
    do = check_upstream(do, "do", c.v.shape, "the output o")
    T = c.v.shape[-2]
    M = np.tril(np.ones((T, T), dtype=bool))
    # [..., T, d_k] @ [..., d_k, T] -> [..., T, T], causal
    P = np.where(M, c.fq @ c.fk.swapaxes(-1, -2), 0.0)
    dnum = do / c.den  # [..., T, d_v]
    # d(1/den): -sum(do * num) / den^2
    dden = -np.sum(do * c.num, axis=-1, keepdims=True) / c.den**2
    # num = P V, den = P 1: dP = dnum V^T + dden 1^T
    dP = np.where(M, dnum @ c.v.swapaxes(-1, -2) + dden, 0.0)
    dv = P.swapaxes(-1, -2) @ dnum  # [..., T, T] @ [..., T, d_v]
    dfq = dP @ c.fk  # [..., T, T] @ [..., T, d_k]
    dfk = dP.swapaxes(-1, -2) @ c.fq
    # phi'(x) = 1 for x > 0, exp(x) otherwise
    dq = dfq * np.where(c.q > 0, 1.0, c.fq)
    dk = dfk * np.where(c.k > 0, 1.0, c.fk)
    return dq, dk, dv


def _check_qkv(q, k, v):
    q = as_float_array(q, "q", min_ndim=2)
    k = as_float_array(k, "k", min_ndim=2)
    v = as_float_array(v, "v", min_ndim=2)
    if q.shape != k.shape:
        raise ValueError(
            "q and k must have the same shape [..., T, d_k], got q "
            f"{q.shape} and k {k.shape}"
        )
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(
            "v must have shape [..., T, d_v] with the leading axes and T of "
            f"k {k.shape}, got v {v.shape}"
        )
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_finite(x, name)
    dtype = np.result_type(q, k, v)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


# ---------------------------------------------------------------------------
# -- the gated delta rule: checks shared by both forms


def _check_delta_inputs(q, k, v, g, beta, initial_state):
    """Validated arrays in one dtype, ``g`` as ``[..., T, d_k or 1]``."""
    q, k, v = _check_qkv(q, k, v)
    *lead, T, d_k = k.shape
    lead, d_v = tuple(lead), v.shape[-1]
    g = as_float_array(g, "g")
    beta = as_float_array(beta, "beta")
    if g.shape == (*lead, T):
        g = g[..., None]  # one decay per head: [..., T, 1]
    elif g.shape != (*lead, T, d_k):
        raise ValueError(
            f"g must have shape [..., T] = {(*lead, T)} (one decay per "
            f"head) or [..., T, d_k] = {(*lead, T, d_k)} (one per key "
            f"channel), got {g.shape}"
        )
    if beta.shape != (*lead, T):
        raise ValueError(
            f"beta must have shape [..., T] = {(*lead, T)} (one per token "
            f"and head), got {beta.shape}"
        )
    check_finite(g, "g")
    check_finite(beta, "beta")
    dtype = np.result_type(q, g, beta)
    if initial_state is None:
        S0 = np.zeros((*lead, d_k, d_v), dtype=dtype)
    else:
        S0 = as_float_array(initial_state, "initial_state")
        if S0.shape != (*lead, d_k, d_v):
            raise ValueError(
                "initial_state must have shape [..., d_k, d_v] = "
                f"{(*lead, d_k, d_v)}, got {S0.shape}"
            )
        check_finite(S0, "initial_state")
        dtype = np.result_type(dtype, S0)
    return tuple(x.astype(dtype, copy=False) for x in (q, k, v, g, beta, S0))


def _sum_to(x, shape):
    """Sum ``x`` over the axes where ``shape`` has size 1 (the backward of
    broadcasting a per-head ``g [..., 1]`` over ``d_k``)."""
    if x.shape[-1] != shape[-1]:
        return x.sum(axis=-1, keepdims=True)
    return x


# ---------------------------------------------------------------------------
# -- recurrent form


@dataclass
class RecurrentCache:
    q: np.ndarray  # [T, ..., d_k]   (time first: one slice per step)
    k: np.ndarray  # [T, ..., d_k]
    a: np.ndarray  # [T, ..., d_k or 1]: alpha_t = exp(g_t)
    beta: np.ndarray  # [T, ...]
    r: np.ndarray  # [T, ..., d_v]: v_t - S'_t^T k_t
    u: np.ndarray  # [T, ..., d_v]: beta_t r_t
    states: np.ndarray  # [T + 1, ..., d_k, d_v]: S_0 ... S_T
    per_head: bool  # g was [..., T]

    @property
    def final_state(self) -> np.ndarray:
        """``S_T [..., d_k, d_v]``."""
        return self.states[-1]


def gated_delta_recurrent_forward(q, k, v, g, beta, initial_state=None):
    """The gated delta rule token by token.

    ``q, k [..., T, d_k]``, ``v [..., T, d_v]``, ``g [..., T]`` (or
    ``[..., T, d_k]``: per channel), ``beta [..., T]``, ``initial_state
    [..., d_k, d_v]`` (zeros if None) -> ``(o [..., T, d_v], cache)``;
    ``cache.final_state`` is ``S_T``. ``q`` is used as given (the layer
    scales it).
    """
    per_head = np.shape(g) == np.shape(beta)
    q, k, v, g, beta, S0 = _check_delta_inputs(
        q, k, v, g, beta, initial_state
    )
    # time first, so that step t reads contiguous slices
    qt, kt, vt = (np.moveaxis(x, -2, 0) for x in (q, k, v))
    at = np.exp(np.moveaxis(g, -2, 0))  # [T, ..., d_k or 1]
    bt = np.moveaxis(beta, -1, 0)  # [T, ...]
    T = qt.shape[0]
    states = np.empty((T + 1, *S0.shape), dtype=S0.dtype)
    states[0] = S0
    r = np.empty(vt.shape, dtype=S0.dtype)  # [T, ..., d_v]
    u = np.empty_like(r)
    o = np.empty_like(r)
    for t in range(T):
        Sp = at[t][..., None] * states[t]  # [..., d_k, 1] * [..., d_k, d_v]
        # S'^T k: [..., 1, d_k] @ [..., d_k, d_v] -> [..., d_v]
        r[t] = vt[t] - (kt[t][..., None, :] @ Sp)[..., 0, :]
        u[t] = bt[t][..., None] * r[t]
        # S_t = S' + k u^T: [..., d_k, 1] * [..., 1, d_v]
        states[t + 1] = Sp + kt[t][..., :, None] * u[t][..., None, :]
        # o_t = S_t^T q_t: [..., 1, d_k] @ [..., d_k, d_v] -> [..., d_v]
        o[t] = (qt[t][..., None, :] @ states[t + 1])[..., 0, :]
    cache = RecurrentCache(qt, kt, at, bt, r, u, states, per_head)
    return np.moveaxis(o, 0, -2), cache


def gated_delta_recurrent_backward(do, cache: RecurrentCache, dstate=None):
    """Backpropagation through time: ``(dq, dk, dv, dg, dbeta,
    dinitial_state)``.

    ``dstate`` is the gradient of the final state (None: 0). Step ``t``,
    walking back with ``dS = dL/dS_t``::

        dS += q_t do_t^T          dq_t = S_t do_t
        du = dS^T k_t             dk_t = dS u_t
        dbeta_t = du . r_t        dv_t = beta_t du
        dS' = dS - k_t dv_t^T     dk_t -= S'_t dv_t
        dg_t = alpha_t sum(dS' * S_{t-1})     dS = alpha_t dS'
    """
    c = cache
    T = c.q.shape[0]
    lead_shape = c.states.shape[1:]
    do = check_upstream(
        do,
        "do",
        (*lead_shape[:-2], T, lead_shape[-1]),
        "the output o [..., T, d_v]",
    )
    dS = np.zeros(lead_shape, dtype=c.states.dtype)
    if dstate is not None:
        dS = dS + check_upstream(
            dstate, "dstate", lead_shape, "the final state"
        )
    dot = np.moveaxis(do, -2, 0)  # [T, ..., d_v]
    dq, dk = np.empty_like(c.q), np.empty_like(c.k)
    dv = np.empty_like(c.r)
    dg = np.empty(c.a.shape, dtype=c.states.dtype)
    dbeta = np.empty(c.beta.shape, dtype=c.states.dtype)
    for t in range(T - 1, -1, -1):
        q_t, k_t, a_t = c.q[t], c.k[t], c.a[t]
        S_prev = c.states[t]  # S_{t-1}: [..., d_k, d_v]
        Sp = a_t[..., None] * S_prev  # S'_t
        # o_t = S_t^T q_t
        dS = dS + q_t[..., :, None] * dot[t][..., None, :]
        # [..., d_k, d_v] @ [..., d_v, 1] -> [..., d_k]
        dq[t] = (c.states[t + 1] @ dot[t][..., :, None])[..., 0]
        # S_t = S' + k u^T
        du = (k_t[..., None, :] @ dS)[..., 0, :]  # [..., d_v]
        dk_t = (dS @ c.u[t][..., :, None])[..., 0]  # [..., d_k]
        # u = beta r, r = v - S'^T k
        dbeta[t] = np.sum(du * c.r[t], axis=-1)
        dv[t] = dr = c.beta[t][..., None] * du
        dSp = dS - k_t[..., :, None] * dr[..., None, :]
        dk[t] = dk_t - (Sp @ dr[..., :, None])[..., 0]
        # S' = alpha S_{t-1}
        da = np.sum(dSp * S_prev, axis=-1)  # [..., d_k]
        dg[t] = _sum_to(da, a_t.shape) * a_t
        dS = a_t[..., None] * dSp
    dg = np.moveaxis(dg, 0, -2)
    if c.per_head:
        dg = dg[..., 0]
    return (
        np.moveaxis(dq, 0, -2),
        np.moveaxis(dk, 0, -2),
        np.moveaxis(dv, 0, -2),
        dg,
        np.moveaxis(dbeta, 0, -1),
        dS,
    )


# ---------------------------------------------------------------------------
# -- chunked form


def _decay_gram(x, y, gam, *, strict):
    """``<x, y>_ri = sum_d x_rd y_id exp(gam_rd - gam_id)`` for ``i < r``
    (``strict``) or ``i <= r``, else 0: ``[..., C, C]``, and the decay
    factors for the backward.

    ``gam [..., C, 1]`` (one decay per head) makes it ``(x y^T) * E``, ``E
    [..., C, C]``; ``gam [..., C, d_k]`` needs ``E [..., C, C, d_k]``. The
    exponent is masked before ``exp``, so no factor overflows.
    """
    C = x.shape[-2]
    keep = np.tril(np.ones((C, C), dtype=bool), k=-1 if strict else 0)
    if gam.shape[-1] == 1:
        # [..., C, 1] - [..., 1, C] -> [..., C, C]
        diff = gam[..., :, 0][..., :, None] - gam[..., :, 0][..., None, :]
        E = np.exp(np.where(keep, diff, -np.inf))
        return (x @ y.swapaxes(-1, -2)) * E, E  # [..., C, C]
    # [..., C, 1, d_k] - [..., 1, C, d_k] -> [..., C, C, d_k]
    diff = gam[..., :, None, :] - gam[..., None, :, :]
    E = np.exp(np.where(keep[:, :, None], diff, -np.inf))
    return np.einsum("...rd,...id,...rid->...ri", x, y, E), E


def _decay_gram_backward(dG, G, x, y, E):
    """``(dx, dy, dgam)`` of :func:`_decay_gram`."""
    if E.ndim == dG.ndim:  # one decay per head
        dGE = dG * E  # [..., C, C]
        dx = dGE @ y  # [..., C, C] @ [..., C, d] -> [..., C, d]
        dy = dGE.swapaxes(-1, -2) @ x
        Z = dG * G  # d/d(gam_r - gam_i)
        dgam = (Z.sum(axis=-1) - Z.sum(axis=-2))[..., None]  # [..., C, 1]
        return dx, dy, dgam
    dx = np.einsum("...ri,...id,...rid->...rd", dG, y, E)
    dy = np.einsum("...ri,...rd,...rid->...id", dG, x, E)
    # [..., C, C, d_k]
    Z = dG[..., None] * x[..., :, None, :] * y[..., None, :, :] * E
    return dx, dy, Z.sum(axis=-2) - Z.sum(axis=-3)


def unit_lower_inverse(A):
    """``T = (I - A)^{-1}`` for strictly lower-triangular ``A [..., C,
    C]``, by forward substitution.

    ``(I - A) T = I`` gives, row by row, ``T_i = e_i + A_i T``; ``A_i`` is
    zero from column ``i`` on, so ``T[i, :i] = A[i, :i] T[:i, :i]`` with
    ``T``'s diagonal 1: ``C - 1`` small products, no general solve.
    """
    C = A.shape[-1]
    T = np.broadcast_to(np.eye(C, dtype=A.dtype), A.shape).copy()
    for i in range(1, C):
        # [..., 1, i] @ [..., i, i] -> [..., 1, i]
        T[..., i : i + 1, :i] = A[..., i : i + 1, :i] @ T[..., :i, :i]
    return T


@dataclass
class ChunkParts:
    """What a chunk needs besides its entering state (recomputed in the
    backward). Arrays are ``[N, ..., C, ·]``, chunk first."""

    eg: np.ndarray  # [N, ..., C, d_k or 1]: exp(Gamma_r)
    KG: np.ndarray  # [N, ..., C, d_k]: k * exp(Gamma)
    Gk: np.ndarray  # [N, ..., C, C]: <K, K> strict
    Ek: np.ndarray  # decay factors of Gk
    Tm: np.ndarray  # [N, ..., C, C]: (I - A)^{-1}
    W: np.ndarray  # [N, ..., C, d_k]: T diag(beta) K e^Gamma
    Ut: np.ndarray  # [N, ..., C, d_v]: T diag(beta) V
    P: np.ndarray  # [N, ..., C, C]: <Q, K> incl. diagonal
    Ep: np.ndarray  # decay factors of P
    QG: np.ndarray  # [N, ..., C, d_k]: q * exp(Gamma)
    eB: np.ndarray  # [N, ..., C, d_k or 1]: exp(Gamma_C - Gamma)
    KB: np.ndarray  # [N, ..., C, d_k]: k * exp(Gamma_C - Gamma)
    eC: np.ndarray  # [N, ..., d_k or 1]: exp(Gamma_C)


def _chunk_parts(q, k, v, gam, beta):
    """Every chunk's intra-chunk matrices at once (``[N, ..., C, ·]``)."""
    eg = np.exp(gam)
    KG = k * eg  # [N, ..., C, d_k]
    Gk, Ek = _decay_gram(k, k, gam, strict=True)  # [N, ..., C, C]
    Tm = unit_lower_inverse(-beta[..., None] * Gk)  # A = -diag(b) <K, K>
    # [N, ..., C, C] @ [N, ..., C, d] -> [N, ..., C, d]
    W = Tm @ (beta[..., None] * KG)
    Ut = Tm @ (beta[..., None] * v)
    P, Ep = _decay_gram(q, k, gam, strict=False)
    gC = gam[..., -1:, :]  # [N, ..., 1, d_k or 1]
    eB = np.exp(gC - gam)
    return ChunkParts(
        eg,
        KG,
        Gk,
        Ek,
        Tm,
        W,
        Ut,
        P,
        Ep,
        q * eg,
        eB,
        k * eB,
        np.exp(gC[..., 0, :]),
    )


@dataclass
class ChunkedCache:
    q: np.ndarray  # [N, ..., C, d_k]  (padded to N*C tokens)
    k: np.ndarray  # [N, ..., C, d_k]
    v: np.ndarray  # [N, ..., C, d_v]
    gam: np.ndarray  # [N, ..., C, d_k or 1]: decay summed within chunks
    beta: np.ndarray  # [N, ..., C]
    states: np.ndarray  # [N + 1, ..., d_k, d_v]: state entering chunk n
    T: int  # tokens before padding
    per_head: bool

    @property
    def final_state(self) -> np.ndarray:
        """``S_T [..., d_k, d_v]``."""
        return self.states[-1]


def _to_chunks(x, C, pad):
    """``[..., T, d] -> [N, ..., C, d]``, zero-padded to ``N * C``
    tokens, chunk axis first (contiguous)."""
    if pad:
        x = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pad), (0, 0)])
    *lead, TT, d = x.shape
    x = x.reshape(*lead, TT // C, C, d)
    return np.ascontiguousarray(np.moveaxis(x, -3, 0))


def _from_chunks(x, T):
    """``[N, ..., C, d] -> [..., T, d]`` (padding dropped)."""
    x = np.moveaxis(x, 0, -3)
    *lead, N, C, d = x.shape
    return x.reshape(*lead, N * C, d)[..., :T, :]


def gated_delta_chunked_forward(
    q, k, v, g, beta, initial_state=None, *, chunk_size=64
):
    """The gated delta rule in chunks of ``chunk_size`` tokens: the same
    arguments and result as :func:`gated_delta_recurrent_forward`.

    Any ``T``: the last chunk is padded with ``beta = 0`` and ``g = 0``
    tokens, which leave the state unchanged (their ``u`` is 0 and their
    decay 1), and the padded outputs are dropped. The cache keeps the
    inputs and one state per chunk.
    """
    C = check_positive_int(chunk_size, "chunk_size")
    per_head = np.shape(g) == np.shape(beta)
    q, k, v, g, beta, S0 = _check_delta_inputs(
        q, k, v, g, beta, initial_state
    )
    T = k.shape[-2]
    pad = -T % C
    qc, kc, vc, gc = (_to_chunks(x, C, pad) for x in (q, k, v, g))
    bc = _to_chunks(beta[..., None], C, pad)[..., 0]  # [N, ..., C]
    gam = np.cumsum(gc, axis=-2)  # Gamma_r: [N, ..., C, d_k or 1]
    p = _chunk_parts(qc, kc, vc, gam, bc)
    N = qc.shape[0]
    states = np.empty((N + 1, *S0.shape), dtype=S0.dtype)
    states[0] = S0
    o = np.empty(vc.shape, dtype=S0.dtype)  # [N, ..., C, d_v]
    for n in range(N):  # the only loop: one step per chunk
        S = states[n]  # [..., d_k, d_v]
        # U = U~ - W S: [..., C, d_k] @ [..., d_k, d_v] -> [..., C, d_v]
        U = p.Ut[n] - p.W[n] @ S
        # O = (Q e^G) S + P U: [..., C, d_v]
        o[n] = p.QG[n] @ S + p.P[n] @ U
        # S_C = e^G_C S + (K e^(G_C - G))^T U: [..., d_k, d_v]
        states[n + 1] = p.eC[n][..., None] * S + p.KB[n].swapaxes(-1, -2) @ U
    cache = ChunkedCache(qc, kc, vc, gam, bc, states, T, per_head)
    return _from_chunks(o, T), cache


def gated_delta_chunked_backward(do, cache: ChunkedCache, dstate=None):
    """``(dq, dk, dv, dg, dbeta, dinitial_state)`` of
    :func:`gated_delta_chunked_forward`.

    Two passes. Backwards over chunks, from ``dS = dL/dS_C`` and ``dO``::

        dK~ = U dS^T      dU = K~ dS       dGamma_C += sum(dS * S_C-part)
        dQ~ = dO S_0^T    dP = dO U^T      dU += P^T dO
        dU~ = dU          dW = -dU S_0^T
        dS_0 = e^G_C dS + Q~^T dO - W^T dU

    (``K~ = K e^(G_C - G)``, ``Q~ = Q e^G``). Then all chunks at once,
    through ``W, U~ = T diag(beta) (K e^G, V)`` and the inverse: ``dT =
    dW (b K e^G)^T + dU~ (b V)^T``, ``dA = T^T dT T^T`` (strictly lower),
    the decayed products, and ``g`` from ``Gamma`` by a reverse cumsum.
    """
    c = cache
    lead_shape = c.states.shape[1:]  # [..., d_k, d_v]
    want = (*lead_shape[:-2], c.T, lead_shape[-1])
    do = check_upstream(do, "do", want, "the output o [..., T, d_v]")
    C = c.q.shape[-2]
    dO = _to_chunks(do, C, -c.T % C)  # [N, ..., C, d_v]
    p = _chunk_parts(c.q, c.k, c.v, c.gam, c.beta)  # recomputed
    N = c.q.shape[0]
    dS = np.zeros(lead_shape, dtype=c.states.dtype)
    if dstate is not None:
        dS = dS + check_upstream(
            dstate, "dstate", lead_shape, "the final state"
        )
    dQG, dW = np.empty_like(p.QG), np.empty_like(p.W)
    dKB, dUt = np.empty_like(p.KB), np.empty_like(p.Ut)
    dP = np.empty_like(p.P)
    deC = np.empty_like(p.eC)
    for n in range(N - 1, -1, -1):
        S = c.states[n]
        U = p.Ut[n] - p.W[n] @ S  # recomputed: [..., C, d_v]
        # S_C = e^G_C S + K~^T U
        dKB[n] = U @ dS.swapaxes(-1, -2)  # [C, d_v] @ [d_v, d_k]
        dU = p.KB[n] @ dS  # [C, d_k] @ [d_k, d_v] -> [C, d_v]
        deC[n] = _sum_to(np.sum(dS * S, axis=-1), p.eC[n].shape)
        dS_prev = p.eC[n][..., None] * dS
        # O = Q~ S + P U
        dQG[n] = dO[n] @ S.swapaxes(-1, -2)  # [C, d_v] @ [d_v, d_k]
        dS_prev += p.QG[n].swapaxes(-1, -2) @ dO[n]  # [d_k, C] @ [C, d_v]
        dP[n] = dO[n] @ U.swapaxes(-1, -2)  # [C, d_v] @ [d_v, C]
        dU += p.P[n].swapaxes(-1, -2) @ dO[n]
        # U = U~ - W S
        dUt[n] = dU
        dW[n] = -dU @ S.swapaxes(-1, -2)  # [C, d_v] @ [d_v, d_k]
        dS_prev -= p.W[n].swapaxes(-1, -2) @ dU
        dS = dS_prev
    # -- all chunks at once
    b = c.beta[..., None]  # [N, ..., C, 1]
    Tt = p.Tm.swapaxes(-1, -2)
    # W = T (b K e^G), U~ = T (b V)
    dTm = dW @ (b * p.KG).swapaxes(-1, -2) + dUt @ (b * c.v).swapaxes(-1, -2)
    dbKG, dbV = Tt @ dW, Tt @ dUt  # [N, ..., C, d]
    dbeta = np.sum(dbKG * p.KG, axis=-1) + np.sum(dbV * c.v, axis=-1)
    dKG, dv = b * dbKG, b * dbV
    # T = (I - A)^{-1}: dA = T^T dT T^T, only where A lives
    C_ = c.q.shape[-2]
    dA = np.tril(Tt @ dTm @ Tt, k=-1) if C_ > 1 else np.zeros_like(dTm)
    # A = -b <K, K>
    dbeta -= np.sum(dA * p.Gk, axis=-1)
    dk1, dk2, dgam = _decay_gram_backward(-b * dA, p.Gk, c.k, c.k, p.Ek)
    dq, dk3, dgam2 = _decay_gram_backward(np.tril(dP), p.P, c.q, c.k, p.Ep)
    dk = dk1 + dk2 + dk3
    dgam = dgam + dgam2
    # Q~ = Q e^G, K e^G, K~ = K e^(G_C - G)
    dq = dq + dQG * p.eg
    dk = dk + dKG * p.eg + dKB * p.eB
    shape = c.gam.shape
    dgam = dgam + _sum_to(dQG * p.QG + dKG * p.KG - dKB * p.KB, shape)
    dgC = _sum_to(np.sum(dKB * p.KB, axis=-2), shape) + deC * p.eC
    dgam[..., -1, :] += dgC
    # Gamma = cumsum(g) within the chunk: dg_j = sum_{r >= j} dGamma_r
    dg = np.flip(np.cumsum(np.flip(dgam, axis=-2), axis=-2), axis=-2)
    dg = _from_chunks(dg, c.T)
    if c.per_head:
        dg = dg[..., 0]
    dbeta = _from_chunks(dbeta[..., None], c.T)[..., 0]
    return (
        _from_chunks(dq, c.T),
        _from_chunks(dk, c.T),
        _from_chunks(dv, c.T),
        dg,
        dbeta,
        dS,
    )
