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
  chunk and ``U`` (as large as ``V``) are kept; the backward recomputes
  the rest chunk by chunk (or, with :data:`KEEP_PARTS`, the forward
  keeps the chunks' intra-chunk matrices: about ``5 d_k + 5 C`` numbers
  per token and head).

:class:`GatedDeltaNet` is the released layer (Qwen3-Next's
``linear_attention``): short causal convolutions, L2-normalised ``q`` and
``k``, ``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``,
more value heads than key heads and a gated RMSNorm. :class:`StateCache`
carries one state and the convolution's last inputs per sequence, for
decoding. :class:`KimiDeltaAttention` overrides its gates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

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
from .training.transformer import register_layer_kind

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
    # time first and contiguous, so that step t reads one block
    qt, kt, vt = (
        np.ascontiguousarray(np.moveaxis(x, -2, 0)) for x in (q, k, v)
    )
    at = np.exp(np.moveaxis(g, -2, 0))  # [T, ..., d_k or 1]
    bt = np.ascontiguousarray(np.moveaxis(beta, -1, 0))  # [T, ...]
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


@lru_cache(maxsize=64)
def _causal_mask(C, strict):
    """``[C, C]`` boolean, True where ``i < r`` (``strict``) or ``i <= r``
    (made once per size: ``np.tril`` costs more than the products it
    masks in a small chunk)."""
    keep = np.tril(np.ones((C, C), dtype=bool), k=-1 if strict else 0)
    keep.flags.writeable = False
    return keep


def _decay(x):
    """``exp(x)`` for the decay factors (``x <= 0``), with what falls below
    the dtype's smallest normal number set to 0: a summed decay reaches
    ``e^-90`` within a chunk, a subnormal float32, and products of
    subnormals run tens of times slower on most CPUs. The factors lost are
    below ``1e-38`` (float32) or ``1e-308`` (float64) of the ones kept."""
    e = np.exp(x)
    np.copyto(e, 0.0, where=e < np.finfo(e.dtype).tiny)
    return e


def _mT(x):
    """``[..., a, b] -> [..., b, a]``, a view: NumPy hands a transposed
    operand to BLAS as a flag, with no copy (a copy first made the
    chunked kernels 1.15 times slower, paired)."""
    return x.swapaxes(-1, -2)


def _decay_gram(x, y, gam, *, strict):
    """``<x, y>_ri = sum_d x_rd y_id exp(gam_rd - gam_id)`` for ``i < r``
    (``strict``) or ``i <= r``, else 0: ``[..., C, C]``, and the decay
    factors for the backward.

    ``gam [..., C, 1]`` (one decay per head) makes it ``(x y^T) * E``, ``E
    [..., C, C]``; ``gam [..., C, d_k]`` needs ``E [..., C, C, d_k]``. The
    exponent is masked before ``exp``, so no factor overflows.
    """
    keep = _causal_mask(x.shape[-2], strict)
    if gam.shape[-1] == 1:
        # [..., C, 1] - [..., 1, C] -> [..., C, C]
        diff = gam[..., :, 0][..., :, None] - gam[..., :, 0][..., None, :]
        E = _decay(np.where(keep, diff, -np.inf))
        G = x @ _mT(y)  # [..., C, d] @ [..., d, C] -> [..., C, C]
        G *= E
        return G, E
    # [..., C, 1, d_k] - [..., 1, C, d_k] -> [..., C, C, d_k]
    diff = gam[..., :, None, :] - gam[..., None, :, :]
    E = _decay(np.where(keep[:, :, None], diff, -np.inf))
    return np.einsum("...rd,...id,...rid->...ri", x, y, E), E


def _decay_gram_backward(dG, G, x, y, E):
    """``(dx, dy, dgam)`` of :func:`_decay_gram`."""
    if E.ndim == dG.ndim:  # one decay per head
        dGE = dG * E  # [..., C, C]
        dx = dGE @ y  # [..., C, C] @ [..., C, d] -> [..., C, d]
        dy = _mT(dGE) @ x
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
    """What a chunk needs besides its entering state (kept for the
    backward, or recomputed there: :data:`KEEP_PARTS`). Arrays are ``[N,
    ..., C, ·]``, chunk first."""

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


def _chunk_parts(q, k, v, gam, beta, squares=None):
    """Every chunk's intra-chunk matrices at once (``[N, ..., C, ·]``).
    ``squares``: their ``(Gk, Ek, Tm, P, Ep)`` as the forward kept them
    (:data:`KEEP_SQUARES`), so that only the ``d``-wide parts are made
    again: no Gram products, no triangular solve."""
    eg = _decay(gam)
    KG = k * eg  # [N, ..., C, d_k]
    if squares is None:
        Gk, Ek = _decay_gram(k, k, gam, strict=True)  # [N, ..., C, C]
        Tm = unit_lower_inverse(-beta[..., None] * Gk)  # A = -b <K, K>
        P, Ep = _decay_gram(q, k, gam, strict=False)
    else:
        Gk, Ek, Tm, P, Ep = squares
    # [N, ..., C, C] @ [N, ..., C, d] -> [N, ..., C, d]
    W = Tm @ (beta[..., None] * KG)
    Ut = Tm @ (beta[..., None] * v)
    gC = gam[..., -1:, :]  # [N, ..., 1, d_k or 1]
    eB = _decay(gC - gam)
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
        _decay(gC[..., 0, :]),
    )


@dataclass
class ChunkedCache:
    q: np.ndarray  # [N, ..., C, d_k]  (padded to N*C tokens)
    k: np.ndarray  # [N, ..., C, d_k]
    v: np.ndarray  # [N, ..., C, d_v]
    gam: np.ndarray  # [N, ..., C, d_k or 1]: decay summed within chunks
    beta: np.ndarray  # [N, ..., C]
    states: np.ndarray  # [N + 1, ..., d_k, d_v]: state entering chunk n
    U: np.ndarray  # [N, ..., C, d_v]: the u_t (as large as v)
    parts: list  # per group of chunks: its ChunkParts (KEEP_PARTS:
    #              about 5 d_k + 5 C numbers per token and head), or its
    #              squares (KEEP_SQUARES: 5 C), or None
    T: int  # tokens before padding
    per_head: bool

    @property
    def final_state(self) -> np.ndarray:
        """``S_T [..., d_k, d_v]``."""
        return self.states[-1]


# the chunked form works on groups of chunks of about this many tokens:
# the intermediate arrays of a group stay small (and in cache)
GROUP_TOKENS = 256
# True: the forward keeps each group's ChunkParts for the backward
# (about 5 d_k + 5 C numbers per token and head; measured 0.89 [0.84,
# 0.92] of the time of fwd + bwd at T = 4096, paired). False, the
# default: the backward recomputes them from the inputs
KEEP_PARTS = False
# True, the default (with one decay per head): the forward keeps only
# the chunks' C x C matrices, <K, K>, <Q, K>, their decay factors and
# T = (I - A)^{-1}, 5 C numbers per token and head (160 at C = 32,
# against 512 per token for one 128 x 128 state per chunk); the
# backward makes the d-wide parts again, but not the Gram products
# and the triangular solve. Training still keeps one state per chunk,
# and memory grows with T, not T x state. (Per-channel decay, KDA,
# keeps nothing: its decay factors are C x C x d_k.)
KEEP_SQUARES = True


def _to_chunks(x, C, pad):
    """``[..., T, d] -> [N, ..., C, d]``, zero-padded to ``N * C``
    tokens, chunk axis first (contiguous)."""
    if pad:  # (np.pad is slow on small arrays)
        padded = np.zeros(
            (*x.shape[:-2], x.shape[-2] + pad, x.shape[-1]), x.dtype
        )
        padded[..., : x.shape[-2], :] = x
        x = padded
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
    inputs, one state per chunk and (:data:`KEEP_PARTS`) the chunks'
    parts.
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
    N = qc.shape[0]
    states = np.empty((N + 1, *S0.shape), dtype=S0.dtype)
    states[0] = S0
    U = np.empty(vc.shape, dtype=S0.dtype)  # [N, ..., C, d_v]: the u_t
    o = np.empty(vc.shape, dtype=S0.dtype)  # [N, ..., C, d_v]
    G = max(1, GROUP_TOKENS // C)  # chunks per group
    parts = []  # kept for the backward
    KU = np.empty(S0.shape, dtype=S0.dtype)  # K~^T U of one chunk
    for lo in range(0, N, G):  # a group of chunks at a time
        hi = min(N, lo + G)
        p = _chunk_parts(
            qc[lo:hi], kc[lo:hi], vc[lo:hi], gam[lo:hi], bc[lo:hi]
        )
        parts.append(_kept(p))
        eC, KBt = p.eC[..., None], _mT(p.KB)
        for n in range(hi - lo):  # the only loop: the state
            S, Sn = states[lo + n], states[lo + n + 1]  # [..., d_k, d_v]
            # U = U~ - W S: [..., C, d_k] @ [..., d_k, d_v] -> [..., C, d_v]
            Un = U[lo + n]
            np.matmul(p.W[n], S, out=Un)
            np.subtract(p.Ut[n], Un, out=Un)
            # S_C = e^G_C S + (K e^(G_C - G))^T U: [..., d_k, d_v]
            np.multiply(eC[n], S, out=Sn)
            Sn += np.matmul(KBt[n], Un, out=KU)
        # the group's outputs at once, from the states entering its chunks
        # O = (Q e^G) S + P U: [n, ..., C, d_v]
        og = o[lo:hi]
        np.matmul(p.QG, states[lo:hi], out=og)
        og += p.P @ U[lo:hi]
    cache = ChunkedCache(qc, kc, vc, gam, bc, states, U, parts, T, per_head)
    return _from_chunks(o, T), cache


def _kept(p: ChunkParts):
    """What the forward keeps of a group's parts for the backward."""
    if KEEP_PARTS:
        return p
    if KEEP_SQUARES and p.eg.shape[-1] == 1:  # one decay per head
        return (p.Gk, p.Ek, p.Tm, p.P, p.Ep)
    return None


def gated_delta_chunked_backward(do, cache: ChunkedCache, dstate=None):
    """``(dq, dk, dv, dg, dbeta, dinitial_state)`` of
    :func:`gated_delta_chunked_forward`.

    Backwards over chunks, from ``dS = dL/dS_C``, only the state::

        dU = K~ dS + P^T dO                                 [C, d_v]
        dS_0 = e^G_C dS + Q~^T dO - W^T dU                  [d_k, d_v]

    (``K~ = K e^(G_C - G)``, ``Q~ = Q e^G``); then, for a group of
    chunks at once (:func:`chunk_group_backward`), ``dK~ = U dS^T``, ``dQ~ =
    dO S_0^T``, ``dP = dO U^T``, ``dU~ = dU``, ``dW = -dU S_0^T``,
    ``dGamma_C = sum(dS * S_0) e^G_C``. Then,
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
    N = c.q.shape[0]
    dS = np.zeros(lead_shape, dtype=c.states.dtype)
    if dstate is not None:
        dS = dS + check_upstream(
            dstate, "dstate", lead_shape, "the final state"
        )
    grads = [np.empty_like(x) for x in (c.q, c.k, c.v, c.gam, c.beta)]
    G = max(1, GROUP_TOKENS // C)
    for i, lo in reversed(list(enumerate(range(0, N, G)))):  # last first
        sl = slice(lo, min(N, lo + G))
        # the group's kept parts, released once used (a second backward
        # of the same cache recomputes them)
        p, c.parts[i] = c.parts[i], None
        dS = chunk_group_backward(
            [x[sl] for x in (c.q, c.k, c.v, c.gam, c.beta)],
            c.states[sl],
            c.U[sl],
            dO[sl],
            dS,
            [g[sl] for g in grads],
            parts=p,
        )
    dq, dk, dv, dgam, dbeta = grads
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


def chunk_group_backward(inputs, S, U, dO, dS, out, *, parts=None):
    """The chunked backward for a run of chunks: ``inputs`` are their
    ``(q, k, v, gam, beta)`` (``[n, ..., C, ·]``), ``S`` the states
    entering them, ``U`` their ``u_t`` (kept by the forward), ``dO``
    their output gradients and ``dS`` the gradient of the state leaving
    the last. Writes ``(dq, dk, dv, dgam, dbeta)`` into ``out``; returns
    the gradient of the state entering the first. ``parts``: their
    :class:`ChunkParts` as the forward kept them, or their squares (the
    rest recomputed), or None (all recomputed).
    """
    q, k, v, gam, beta = inputs
    if isinstance(parts, ChunkParts):
        p = parts
    else:
        p = _chunk_parts(q, k, v, gam, beta, squares=parts)
    N = q.shape[0]
    # what of dU and dS_0 does not wait for the next chunk's dS
    X = _mT(p.P) @ dO  # P^T dO: [N, ..., C, d_v]
    Y = _mT(p.QG) @ dO  # Q~^T dO: [N, ..., d_k, d_v]
    eC, Wt = p.eC[..., None], _mT(p.W)
    dSn = np.empty_like(S)  # dL/dS_C of each chunk
    C = q.shape[-2]
    # [dO; dU] stacked on the token axis: both meet S^T below
    dOU = np.empty((*dO.shape[:-2], 2 * C, dO.shape[-1]), dO.dtype)
    dOU[..., :C, :] = dO
    dU = dOU[..., C:, :]  # [N, ..., C, d_v]
    dS, WdU = dS.copy(), np.empty_like(dS)  # (the caller's dS kept)
    for n in range(N - 1, -1, -1):  # the state, backwards
        dSn[n] = dS
        # [C, d_k] @ [d_k, d_v] -> [C, d_v]
        np.matmul(p.KB[n], dS, out=dU[n])
        dU[n] += X[n]
        # dS = e^G_C dS + Y - W^T dU: [d_k, d_v], in place
        np.multiply(eC[n], dSn[n], out=dS)
        dS += Y[n]
        dS -= np.matmul(Wt[n], dU[n], out=WdU)
    # then the run's chunks at once
    dKB = U @ _mT(dSn)  # [C, d_v] @ [d_v, d_k]
    deC = _sum_to(np.vecdot(dSn, S), p.eC.shape)
    # dQ~ = dO S^T, dW = -dU S^T: [2C, d_v] @ [d_v, d_k], one product
    R = dOU @ _mT(S)
    dQG, dW = R[..., :C, :], -R[..., C:, :]
    dP = dO @ _mT(U)  # [C, d_v] @ [d_v, C]
    dUt = dU
    # through the intra-chunk parts, all chunks at once
    b = beta[..., None]  # [N, ..., C, 1]
    Tt = _mT(p.Tm)
    # W = T (b K e^G), U~ = T (b V)
    dTm = dW @ _mT(b * p.KG) + dUt @ _mT(b * v)
    dbKG, dbV = Tt @ dW, Tt @ dUt  # [N, ..., C, d]
    dbeta = np.vecdot(dbKG, p.KG) + np.vecdot(dbV, v)
    dKG, dv = b * dbKG, b * dbV
    # T = (I - A)^{-1}: dA = T^T dT T^T, only where A lives
    dA = Tt @ dTm @ Tt
    dA *= _causal_mask(C, True)
    # A = -b <K, K>
    dbeta -= np.vecdot(dA, p.Gk)
    dk1, dk2, dgam = _decay_gram_backward(-b * dA, p.Gk, k, k, p.Ek)
    dP *= _causal_mask(C, False)
    dq, dk3, dgam2 = _decay_gram_backward(dP, p.P, q, k, p.Ep)
    dk = dk1 + dk2 + dk3
    dgam = dgam + dgam2
    # Q~ = Q e^G, K e^G, K~ = K e^(G_C - G)
    dq = dq + dQG * p.eg
    dk = dk + dKG * p.eg + dKB * p.eB
    shape = gam.shape
    dgam = dgam + _sum_to(dQG * p.QG + dKG * p.KG - dKB * p.KB, shape)
    dgC = _sum_to(np.sum(dKB * p.KB, axis=-2), shape) + deC * p.eC
    dgam[..., -1, :] += dgC
    for o, g in zip(out, (dq, dk, dv, dgam, dbeta)):
        o[...] = g
    return dS


# ---------------------------------------------------------------------------
# -- the layer's small parts, each with its backward


def silu(x):
    """``x * sigmoid(x)``."""
    y = _sigmoid(x)
    y *= x
    return y


def _sigmoid(x):
    # tanh form: one transcendental, no overflow for large |x|; in place
    # on one new array, in x's dtype
    s = np.multiply(x, 0.5)
    np.tanh(s, out=s)
    s *= 0.5
    s += 0.5
    return s


def _silu_backward(dy, x):
    """``d silu / dx = s (1 + x (1 - s))``, ``s = sigmoid(x)``."""
    s = _sigmoid(x)
    d = np.subtract(1.0, s, dtype=s.dtype)  # 1 - s
    d *= x
    d += 1.0
    d *= s
    d *= dy
    return d


def causal_conv_forward(x, w, prev=None):
    """Depthwise causal convolution then SiLU, Qwen3-Next's short
    convolution.

    ``x [B, L, ch]``, ``w [K, ch]``, ``prev [B, K-1, ch]`` the inputs
    before the chunk (zeros: the sequence starts here). With ``xp =
    [prev, x]``, ``y_t = silu(sum_j w_j * xp_{t+j})``: ``w[K-1]`` weighs
    the current token. ``K`` shifted multiply-adds over whole arrays, no
    loop over tokens. Returns ``(y [B, L, ch], (xp, w, pre))``; the last
    ``K - 1`` rows of ``xp`` are the next chunk's ``prev``.
    """
    K = w.shape[0]
    B, L, ch = x.shape
    dtype = np.result_type(x, w)
    xp = np.empty((B, K - 1 + L, ch), dtype=dtype)  # [prev, x]
    xp[:, : K - 1] = 0.0 if prev is None else prev
    xp[:, K - 1 :] = x
    pre = np.multiply(xp[:, K - 1 :], w[K - 1])  # the current token
    tmp = np.empty_like(pre)
    for j in range(K - 1):  # the K - 1 earlier ones
        np.multiply(xp[:, j : j + L], w[j], out=tmp)  # [B, L, ch] * [ch]
        pre += tmp
    return silu(pre), (xp, w, pre)


def causal_conv_backward(dy, cache):
    """``(dx, dw)`` of :func:`causal_conv_forward` (``prev`` is a constant:
    a cached input). Input ``i`` feeds outputs ``i + m``, ``m = 0 .. K-1``,
    through ``w[K-1-m]``: ``dx_i = sum_m w[K-1-m] dpre_(i+m)``."""
    xp, w, pre = cache
    K, L = w.shape[0], pre.shape[1]
    dpre = _silu_backward(dy, pre)  # [B, L, ch]
    dx = np.multiply(dpre, w[K - 1])
    tmp = np.empty_like(dpre)
    dw = np.empty_like(w)
    for j in range(K):
        np.multiply(dpre, xp[:, j : j + L], out=tmp)
        dw[j] = tmp.sum(axis=(0, 1))
        m = K - 1 - j
        if 0 < m < L:
            # [B, L-m, ch] += [ch] * [B, L-m, ch]
            np.multiply(dpre[:, m:], w[j], out=tmp[:, : L - m])
            dx[:, : L - m] += tmp[:, : L - m]
    return dx, dw


def l2norm_forward(x, eps=1e-6):
    """``x / sqrt(sum(x^2) + eps)`` over the last axis (the ``l2norm`` of
    FLA and Hugging Face, ``eps`` inside the root)."""
    # [..., d] . [..., d] -> [..., 1]
    r = np.einsum("...d,...d->...", x, x)[..., None]
    r += eps
    np.sqrt(r, out=r)
    np.divide(1.0, r, out=r)
    y = x * r
    return y, (y, r)


def l2norm_backward(dy, cache):
    """``dx = r (dy - y (y . dy))``."""
    y, r = cache
    yd = np.einsum("...d,...d->...", y, dy)[..., None]  # [..., 1]
    dx = y * yd
    np.subtract(dy, dx, out=dx)
    dx *= r
    return dx


def softplus(x):
    """``log(1 + e^x)``, computed without overflow."""
    return np.logaddexp(0.0, x)


# ---------------------------------------------------------------------------
# -- the state cache


class StateCache:
    """What a Gated DeltaNet layer carries from one chunk to the next, for
    one batch of sequences: the state ``[B, n_v_heads, d_k, d_v]`` and the
    last ``K - 1`` inputs of each short convolution.

    Unlike a :class:`~attn_np.KVCache` it does not grow: ``nbytes`` is the
    same after 10 tokens and after a million. ``len(cache)`` counts the
    positions seen. A state cannot forget its last tokens, so
    :meth:`truncate` only keeps everything or resets to empty.
    """

    def __init__(self):
        self.state = None  # [B, n_v_heads, d_k, d_v]
        self.conv = None  # (q, k, v) inputs: each [B, K-1, channels]
        self._seen = 0

    def __len__(self) -> int:
        return self._seen

    def __repr__(self) -> str:
        if self.state is None:
            return "StateCache(empty)"
        B, n_v, d_k, d_v = self.state.shape
        return (
            f"StateCache(batch={B}, n_v_heads={n_v}, d_k={d_k}, d_v={d_v}, "
            f"seen={self._seen}, dtype={self.state.dtype}, "
            f"nbytes={self.nbytes})"
        )

    @property
    def state_bytes(self) -> int:
        """``B n_v_heads d_k d_v x itemsize``."""
        return 0 if self.state is None else self.state.nbytes

    @property
    def conv_bytes(self) -> int:
        """``B (K - 1) (2 n_k d_k + n_v d_v) x itemsize``."""
        return 0 if self.conv is None else sum(c.nbytes for c in self.conv)

    @property
    def nbytes(self) -> int:
        """State and convolution inputs: the whole per-layer cache."""
        return self.state_bytes + self.conv_bytes

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions: only ``n = len(self)`` (nothing
        to do) or ``n = 0`` (start again) are possible; the state mixes
        every position into the same numbers."""
        n = check_count(n, "n", minimum=0)
        if n == self._seen:
            return
        if n:
            raise ValueError(
                f"a StateCache cannot be truncated to {n} of its "
                f"{self._seen} positions: the state holds no positions "
                "one by one (only n=0, a reset, or n=len(cache))"
            )
        self.state, self.conv, self._seen = None, None, 0

    def check_chunk(
        self, x_shape, *, batch, n_v_heads, d_k, d_v, conv_shapes, dtype
    ) -> None:
        """Raise unless a chunk ``x_chunk`` (of shape ``x_shape``) of a layer
        with this layout fits the cache (before any work)."""
        if self.state is None:
            return
        want = (batch, n_v_heads, d_k, d_v)
        if self.state.shape != want:
            raise ValueError(
                f"x_chunk {tuple(x_shape)} needs a state of shape [B, "
                f"n_v_heads, d_k, d_v] = {want}, but kv_cache holds "
                f"{self.state.shape}: use one StateCache per layer and batch"
            )
        got = tuple(c.shape for c in self.conv)
        if got != tuple(conv_shapes):
            raise ValueError(
                f"x_chunk {tuple(x_shape)} needs convolution inputs of "
                f"shapes {tuple(conv_shapes)}, but kv_cache holds {got}"
            )
        if np.dtype(dtype) != self.state.dtype:
            raise TypeError(
                f"x_chunk makes a state of dtype {np.dtype(dtype)}, but "
                f"kv_cache holds {self.state.dtype}"
            )

    def update(self, state, conv, n_new: int) -> None:
        self.state, self.conv = state, tuple(conv)
        self._seen += n_new


# ---------------------------------------------------------------------------
# -- the layer


def _check_head_groups(n_v_heads: int, n_k_heads: int) -> None:
    """Each key head serves a group of value heads: ``n_v_heads`` must be
    a multiple of ``n_k_heads``."""
    if n_v_heads % n_k_heads:
        raise ValueError(
            "n_v_heads must be a multiple of n_k_heads (each key head "
            f"serves a group of value heads), got n_v_heads={n_v_heads} "
            f"and n_k_heads={n_k_heads}"
        )


def state_bytes(
    n_v_heads, n_k_heads, d_k, d_v, *, conv_size=4, dtype=np.float32
) -> int:
    """Bytes a Gated DeltaNet layer keeps per sequence, at any context:
    the state and the convolution's last inputs, ``(n_v d_k d_v + (K -
    1)(2 n_k d_k + n_v d_v)) x itemsize``."""
    item = check_float_dtype(dtype).itemsize
    n_v_heads = check_positive_int(n_v_heads, "n_v_heads")
    n_k_heads = check_positive_int(n_k_heads, "n_k_heads")
    d_k = check_positive_int(d_k, "d_k")
    d_v = check_positive_int(d_v, "d_v")
    conv_size = check_positive_int(conv_size, "conv_size")
    _check_head_groups(n_v_heads, n_k_heads)
    state = n_v_heads * d_k * d_v
    conv = (conv_size - 1) * (2 * n_k_heads * d_k + n_v_heads * d_v)
    return (state + conv) * item


KERNELS = {
    "chunked": (gated_delta_chunked_forward, gated_delta_chunked_backward),
    "recurrent": (
        gated_delta_recurrent_forward,
        gated_delta_recurrent_backward,
    ),
}


class GatedDeltaNet:
    """The Gated DeltaNet layer as Qwen3-Next releases it
    (``Qwen3NextGatedDeltaNet`` in Hugging Face ``transformers``).

    ``n_k_heads`` key heads of ``d_k`` and ``n_v_heads`` value heads of
    ``d_v`` (a multiple: value head ``j`` reads key head ``j // G``, ``G
    = n_v_heads // n_k_heads``); one state ``[d_k, d_v]`` per value head.
    Parameters::

        W_q, W_k [d_model, n_k d_k]   W_v, W_z [d_model, n_v d_v]
        W_a, W_b [d_model, n_v]       A_log, dt_bias [n_v]
        conv_q, conv_k [K, n_k d_k]   conv_v [K, n_v d_v]
        norm [d_v]                    W_o [n_v d_v, d_model]

    Forward, ``x [B, L, d_model]``: project; short causal convolution and
    SiLU on q, k, v; L2-normalise q and k, scale q by ``1/sqrt(d_k)``;
    ``g = -exp(A_log) softplus(x W_a + dt_bias)``, ``beta = sigmoid(x
    W_b)``; the gated delta rule (``mode``: ``"chunked"`` or
    ``"recurrent"``); ``RMSNorm(o) * silu(x W_z)`` per value head;
    ``W_o``. ``kv_cache=`` (a :class:`StateCache`, from
    :meth:`new_cache`) continues from the cached state, for decoding: the
    cache protocol of every layer in the book.
    """

    def __init__(
        self,
        d_model,
        n_v_heads,
        n_k_heads=None,
        d_k=None,
        d_v=None,
        *,
        conv_size=4,
        chunk_size=64,
        mode="chunked",
        eps=1e-6,
        seed=0,
        dtype=np.float64,
    ):
        self.d_model = check_positive_int(d_model, "d_model")
        self.n_v_heads = check_positive_int(n_v_heads, "n_v_heads")
        self.n_k_heads = (
            self.n_v_heads
            if n_k_heads is None
            else check_positive_int(n_k_heads, "n_k_heads")
        )
        _check_head_groups(self.n_v_heads, self.n_k_heads)
        if (d_k is None or d_v is None) and d_model % self.n_v_heads:
            raise ValueError(
                "d_model must be divisible by n_v_heads when d_k or d_v is "
                f"not given, got d_model={d_model}, n_v_heads={n_v_heads}"
            )
        default = self.d_model // self.n_v_heads
        self.d_k = check_positive_int(default if d_k is None else d_k, "d_k")
        self.d_v = check_positive_int(default if d_v is None else d_v, "d_v")
        self.group_size = self.n_v_heads // self.n_k_heads
        self.conv_size = check_positive_int(conv_size, "conv_size")
        self.chunk_size = check_positive_int(chunk_size, "chunk_size")
        if mode not in KERNELS:
            raise ValueError(
                f"mode must be one of {tuple(KERNELS)}, got {mode!r}"
            )
        self.mode = mode
        self.eps = float(eps)
        self.dtype = dtype = check_float_dtype(dtype)
        rng = np.random.default_rng(seed)
        d, n_k, n_v = self.d_model, self.n_k_heads, self.n_v_heads
        self.params = {}
        for name, shape in self._projection_shapes().items():
            self.params[name] = (
                rng.standard_normal(shape) / np.sqrt(shape[0])
            ).astype(dtype)
        K = self.conv_size
        for name, ch in (("q", n_k * self.d_k), ("k", n_k * self.d_k)):
            self.params[f"conv_{name}"] = rng.uniform(
                -1 / np.sqrt(K), 1 / np.sqrt(K), (K, ch)
            ).astype(dtype)
        self.params["conv_v"] = rng.uniform(
            -1 / np.sqrt(K), 1 / np.sqrt(K), (K, n_v * self.d_v)
        ).astype(dtype)
        self.params.update(self._gate_params(rng))
        self.params["norm"] = np.ones(self.d_v, dtype=dtype)
        self.params["W_o"] = (
            rng.standard_normal((n_v * self.d_v, d))
            / np.sqrt(n_v * self.d_v)
        ).astype(dtype)
        self.grads = {n: np.zeros_like(p) for n, p in self.params.items()}
        self._cache = None

    # the hooks a variant overrides: its projections and its two gates
    def _projection_shapes(self) -> dict:
        d, n_k, n_v = self.d_model, self.n_k_heads, self.n_v_heads
        return {
            "W_q": (d, n_k * self.d_k),
            "W_k": (d, n_k * self.d_k),
            "W_v": (d, n_v * self.d_v),
            "W_z": (d, n_v * self.d_v),
            "W_a": (d, n_v),
            "W_b": (d, n_v),
        }

    def _gate_params(self, rng) -> dict:
        """``A_log = log(A)``, ``A ~ U(1, 16)``; ``dt_bias`` the inverse
        softplus of ``dt``, log-uniform in ``[0.001, 0.1]`` (FLA's
        initialisation)."""
        n = self.n_v_heads
        A = rng.uniform(1, 16, n)
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), n))
        return {
            "A_log": np.log(A).astype(self.dtype),
            "dt_bias": (dt + np.log(-np.expm1(-dt))).astype(self.dtype),
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(d_model={self.d_model}, n_v_heads="
            f"{self.n_v_heads}, n_k_heads={self.n_k_heads}, d_k={self.d_k}, "
            f"d_v={self.d_v}, conv_size={self.conv_size}, "
            f"mode={self.mode!r}, chunk_size={self.chunk_size}, "
            f"dtype={self.dtype})"
        )

    @property
    def n_params(self) -> int:
        return sum(p.size for p in self.params.values())

    def state_bytes_per_sequence(self, dtype=None) -> int:
        """:func:`state_bytes` of this layer (in its dtype by default)."""
        return state_bytes(
            self.n_v_heads,
            self.n_k_heads,
            self.d_k,
            self.d_v,
            conv_size=self.conv_size,
            dtype=self.dtype if dtype is None else dtype,
        )

    def new_cache(self) -> StateCache:
        """An empty :class:`StateCache` for ``forward(x, kv_cache=...)``."""
        return StateCache()

    # ------------------------------------------------------------------
    # forward
    def forward(self, x, *, causal=True, kv_cache=None):
        """``x [L, d_model]`` or ``[B, L, d_model]`` -> ``y`` of the same
        shape. Always causal. With ``kv_cache``, ``x`` is the next
        chunk of the sequences the cache has seen (inference only)."""
        if causal is not True:
            raise ValueError(
                "a Gated DeltaNet layer is causal (its state runs forward "
                f"in time): call forward(x, causal=True), got {causal!r}"
            )
        # the last forward's cache is replaced: drop it before allocating
        # the new one (the loop's holds T + 1 states)
        self._cache = None
        name = "x" if kv_cache is None else "x_chunk"
        x = as_float_array(x, name)
        check_finite(x, name)
        if x.ndim not in (2, 3) or x.shape[-1] != self.d_model:
            raise ValueError(
                f"{name} must have shape [L, d_model] or [B, L, d_model] "
                f"with d_model={self.d_model}, got {x.shape}"
            )
        unbatched = x.ndim == 2
        x3 = x[None] if unbatched else x
        B, L, _ = x3.shape
        if L == 0 or B == 0:
            raise ValueError(
                f"{name} must hold at least one position of one "
                f"sequence, got shape {x.shape}"
            )
        n_k, n_v, G = self.n_k_heads, self.n_v_heads, self.group_size
        d_k, d_v = self.d_k, self.d_v
        P = self.params
        dtype = np.result_type(x3.dtype, P["W_q"].dtype)
        prev, S0 = (None, None, None), None
        if kv_cache is not None:
            if not isinstance(kv_cache, StateCache):
                raise TypeError(
                    "kv_cache must be an attn_np.StateCache (from "
                    f"layer.new_cache()), got {type(kv_cache).__name__}"
                )
            K1 = self.conv_size - 1
            kv_cache.check_chunk(
                x3.shape,
                batch=B,
                n_v_heads=n_v,
                d_k=d_k,
                d_v=d_v,
                conv_shapes=[
                    (B, K1, n_k * d_k),
                    (B, K1, n_k * d_k),
                    (B, K1, n_v * d_v),
                ],
                dtype=dtype,
            )
            if kv_cache.state is not None:
                prev = kv_cache.conv
                # [B, n_v, d_k, d_v] -> [B, n_k, G, d_k, d_v]
                S0 = kv_cache.state.reshape(B, n_k, G, d_k, d_v)

        xf = x3.reshape(B * L, self.d_model)  # [B*L, d_model]
        # 1. project, one product for every projection of x:
        # [B*L, d_model] @ [d_model, ch_all] -> [B*L, ch_all]
        W_in, names, cuts = self._in_projection()
        h_all = xf @ W_in
        h = dict(zip(names, np.split(h_all, cuts, axis=1)))  # views
        # 2. one short causal convolution over the q | k | v channels,
        # then SiLU: [B, L, n_qkv]
        n_q, n_qkv = n_k * d_k, 2 * n_k * d_k + n_v * d_v
        w_conv = np.concatenate(
            [P["conv_q"], P["conv_k"], P["conv_v"]], axis=1
        )  # [K, n_qkv]
        prev = None if prev[0] is None else np.concatenate(prev, axis=2)
        qkv, cconv = causal_conv_forward(
            h_all[:, :n_qkv].reshape(B, L, n_qkv), w_conv, prev
        )
        # 3. heads: q and k on the unit sphere, q scaled by 1/sqrt(d_k)
        q, cqn = l2norm_forward(qkv[..., :n_q].reshape(B, L, n_k, d_k))
        k, ckn = l2norm_forward(
            qkv[..., n_q : 2 * n_q].reshape(B, L, n_k, d_k)
        )
        q = q * (1.0 / math.sqrt(d_k))  # a Python float keeps the dtype
        # [B, L, n_k, d] -> [B, n_k, G, L, d]: value head j = h*G + i
        # reads key head h (views; the kernel lays them out once)
        v = qkv[..., 2 * n_q :].reshape(B, L, n_k, G, d_v)
        v = v.transpose(0, 2, 3, 1, 4)
        qb = np.broadcast_to(
            q.transpose(0, 2, 1, 3)[:, :, None], (B, n_k, G, L, d_k)
        )
        kb = np.broadcast_to(
            k.transpose(0, 2, 1, 3)[:, :, None], (B, n_k, G, L, d_k)
        )
        # 4. gates: g [B, L, n_v (, d_k)], beta [B, L, n_v]
        g, beta, cgate = self._gates_forward(h, B, L)
        g = _gate_heads(g, n_k, G)  # -> [B, n_k, G, L (, d_k)]
        beta = _gate_heads(beta, n_k, G)
        # 5. the gated delta rule: o [B, n_k, G, L, d_v]
        use = "recurrent" if L == 1 else self.mode
        kernel_fwd = KERNELS[use][0]
        # a sequence shorter than a chunk is one chunk of its own length
        C = min(self.chunk_size, L)
        kw = {"chunk_size": C} if use == "chunked" else {}
        o, ckern = kernel_fwd(qb, kb, v, g, beta, S0, **kw)
        # 6. output: [B, n_k, G, L, d_v] -> [B, L, n_v, d_v], contiguous
        o = np.ascontiguousarray(
            o.reshape(B, n_v, L, d_v).transpose(0, 2, 1, 3)
        )
        on, cnorm = rmsnorm_forward(o, P["norm"], eps=self.eps)
        z, cz = self._output_gate_forward(h, B, L)  # [B*L, n_v*d_v]
        y = on.reshape(B * L, n_v * d_v) * z
        # [B*L, n_v*d_v] @ [n_v*d_v, d_model] -> [B, L, d_model]
        out = (y @ P["W_o"]).reshape(B, L, self.d_model)

        if kv_cache is not None:
            xp = cconv[0]  # [B, K-1+L, n_qkv]: [prev, x] of the conv
            tail = xp[:, xp.shape[1] - (self.conv_size - 1) :]
            kv_cache.update(
                ckern.final_state.reshape(B, n_v, d_k, d_v),
                np.split(tail, [n_q, 2 * n_q], axis=2),
                L,
            )
            self._cache = None
        else:
            self._cache = dict(
                xf=xf,
                W_in=W_in,
                shape=(B, L, unbatched),
                conv=cconv,
                norms=(cqn, ckn),
                gate=cgate,
                kernel=(use, ckern),
                on=on,
                norm=cnorm,
                z=z,
                out_gate=cz,
                y=y,
            )
        return out[0] if unbatched else out

    def gates(self, x):
        """``(g, beta)`` the layer computes from ``x [B, L, d_model]``:
        ``g [B, L, n_v (, d_k)]`` (the log decays) and ``beta [B, L,
        n_v]``, to look at."""
        x = as_float_array(x, "x")
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape [B, L, d_model] with d_model="
                f"{self.d_model}, got {x.shape}"
            )
        B, L, _ = x.shape
        W_in, names, cuts = self._in_projection()
        h_all = x.reshape(B * L, self.d_model) @ W_in
        h = dict(zip(names, np.split(h_all, cuts, axis=1)))
        g, beta, _ = self._gates_forward(h, B, L)
        return g, beta

    def _in_projection(self):
        """``(W_in [d_model, ch_all], names, cuts)``: the projections of
        ``x`` side by side, q, k, v first (the convolution's channels);
        ``cuts`` are the column offsets where one ends."""
        names = self._x_projections()
        Ws = [self.params[n] for n in names]
        cuts = np.cumsum([W.shape[1] for W in Ws])[:-1]
        return np.concatenate(Ws, axis=1), names, cuts

    # ------------------------------------------------------------------
    # backward
    def backward(self, dy):
        """Gradient with respect to ``x``; fills ``self.grads``."""
        c = self._cache
        if c is None:
            raise RuntimeError(
                "backward needs a preceding forward without kv_cache "
                "(decoding with a cache is inference only)"
            )
        B, L, unbatched = c["shape"]
        want = (L, self.d_model) if unbatched else (B, L, self.d_model)
        dy = check_upstream(dy, "dy", want, "the layer's output")
        n_k, n_v, G = self.n_k_heads, self.n_v_heads, self.group_size
        d_k, d_v = self.d_k, self.d_v
        n_q, n_qkv = n_k * d_k, 2 * n_k * d_k + n_v * d_v
        P, grads, xf, W_in = self.params, self.grads, c["xf"], c["W_in"]
        names = self._x_projections()
        # the gradient of every projection of x, side by side
        dh_all = np.empty((B * L, W_in.shape[1]), dtype=c["y"].dtype)
        cuts = np.cumsum([P[n].shape[1] for n in names])[:-1]
        dh = dict(zip(names, np.split(dh_all, cuts, axis=1)))
        dyf = dy.reshape(B * L, self.d_model)
        # 6. output
        grads["W_o"] = c["y"].T @ dyf  # [n_v*d_v, B*L] @ [B*L, d_model]
        dyv = dyf @ P["W_o"].T  # [B*L, n_v*d_v]
        self._output_gate_backward(
            dyv * c["on"].reshape(dyv.shape), c["out_gate"], dh
        )
        dyv *= c["z"]
        do, grads["norm"] = rmsnorm_backward(
            dyv.reshape(B, L, n_v, d_v), c["norm"]
        )
        # [B, L, n_v, d_v] -> [B, n_k, G, L, d_v] (a view)
        do = do.reshape(B, L, n_k, G, d_v).transpose(0, 2, 3, 1, 4)
        # 5. the kernel
        use, ckern = c["kernel"]
        dq, dk, dv, dg, dbeta, _ = KERNELS[use][1](do, ckern)
        # 4. gates: back to [B, L, n_v (, d_k)]; write into dh
        self._gates_backward(
            _gate_heads_back(dg, B, L),
            _gate_heads_back(dbeta, B, L),
            c["gate"],
            dh,
        )
        # 3. heads: sum the broadcast over each key head's G value heads,
        # [B, n_k, L, d_k] -> [B, L, n_k, d_k]
        dq = dq.sum(axis=2).transpose(0, 2, 1, 3) * (1.0 / math.sqrt(d_k))
        dk = dk.sum(axis=2).transpose(0, 2, 1, 3)
        dqkv = np.empty((B, L, n_qkv), dtype=dh_all.dtype)
        dqkv[..., :n_q] = l2norm_backward(dq, c["norms"][0]).reshape(
            B, L, n_q
        )
        dqkv[..., n_q : 2 * n_q] = l2norm_backward(
            dk, c["norms"][1]
        ).reshape(B, L, n_q)
        # [B, n_k, G, L, d_v] -> [B, L, n_k, G, d_v]
        dvv = dqkv[..., 2 * n_q :].reshape(B, L, n_k, G, d_v)  # a view
        dvv[...] = dv.transpose(0, 3, 1, 2, 4)
        # 2. the convolution, 1. the one in-projection
        d0, dw = causal_conv_backward(dqkv, c["conv"])
        dh_all[:, :n_qkv] = d0.reshape(B * L, n_qkv)
        grads["conv_q"], grads["conv_k"], grads["conv_v"] = np.split(
            dw, [n_q, 2 * n_q], axis=1
        )
        # [d_model, B*L] @ [B*L, ch_all] -> [d_model, ch_all]
        dW_in = xf.T @ dh_all
        for n, dW in zip(names, np.split(dW_in, cuts, axis=1)):
            grads[n] = dW
        dx = (dh_all @ W_in.T).reshape(B, L, self.d_model)
        return dx[0] if unbatched else dx

    # ------------------------------------------------------------------
    # the hooks a variant overrides: which projections of x it has, and
    # its two gates (KimiDeltaAttention overrides them). ``h`` maps each
    # name of _x_projections to its product with x, [B*L, ·]; a
    # backward writes the gradient of each into ``dh`` (same names)
    def _x_projections(self) -> tuple:
        return ("W_q", "W_k", "W_v", "W_z", "W_a", "W_b")

    def _gates_forward(self, h, B, L):
        """``g = -exp(A_log) softplus(x W_a + dt_bias)``, ``beta =
        sigmoid(x W_b)``: ``[B, L, n_v]`` each."""
        P = self.params
        pre = h["W_a"] + P["dt_bias"]  # [B*L, n_v]
        g = -np.exp(P["A_log"]) * softplus(pre)
        beta = _sigmoid(h["W_b"])  # [B*L, n_v]
        shape = (B, L, self.n_v_heads)
        return g.reshape(shape), beta.reshape(shape), (pre, g, beta)

    def _gates_backward(self, dg, dbeta, saved, dh):
        """Fills the gates' grads; writes ``d(x W_a)`` and ``d(x W_b)``."""
        pre, g, beta = saved
        P, grads = self.params, self.grads
        dg, dbeta = dg.reshape(g.shape), dbeta.reshape(beta.shape)
        grads["A_log"] = np.sum(dg * g, axis=0)  # d(-e^A s)/dA = g
        dpre = dg * -np.exp(P["A_log"]) * _sigmoid(pre)  # softplus' = sig
        grads["dt_bias"] = dpre.sum(axis=0)
        dh["W_a"][...] = dpre
        dh["W_b"][...] = dbeta * beta * (1.0 - beta)

    def _output_gate_forward(self, h, B, L):
        """``silu(x W_z)``: ``[B*L, n_v*d_v]``."""
        zp = h["W_z"]
        return silu(zp), zp

    def _output_gate_backward(self, dz, zp, dh):
        dh["W_z"][...] = _silu_backward(dz, zp)


class KimiDeltaAttention(GatedDeltaNet):
    """Kimi Delta Attention (Kimi Team 2025; FLA's ``KimiDeltaAttention``):
    the same layer with a decay per key channel and low-rank gates.

    ``g = -exp(A_log) softplus(x W_f1 W_f2 + dt_bias)``, ``[B, L, n_v,
    d_k]`` (``W_f1 [d_model, d_v]``, ``W_f2 [d_v, n_v d_k]``, ``dt_bias
    [n_v d_k]``), so the state decays as ``Diag(alpha_t) S``; the output
    gate is ``sigmoid(x W_g1 W_g2 + b_g)`` (``W_g1 [d_model, d_v]``,
    ``W_g2 [d_v, n_v d_v]``) in place of ``silu(x W_z)``. Everything else
    (convolutions, L2 norms, ``beta``, the kernels) is Gated DeltaNet's.
    """

    def __init__(self, *args, eps=1e-5, **kwargs):
        super().__init__(*args, eps=eps, **kwargs)

    def _projection_shapes(self) -> dict:
        d, n_k, n_v = self.d_model, self.n_k_heads, self.n_v_heads
        return {
            "W_q": (d, n_k * self.d_k),
            "W_k": (d, n_k * self.d_k),
            "W_v": (d, n_v * self.d_v),
            "W_b": (d, n_v),
            "W_f1": (d, self.d_v),
            "W_f2": (self.d_v, n_v * self.d_k),
            "W_g1": (d, self.d_v),
            "W_g2": (self.d_v, n_v * self.d_v),
        }

    def _x_projections(self) -> tuple:
        return ("W_q", "W_k", "W_v", "W_b", "W_f1", "W_g1")

    def _gate_params(self, rng) -> dict:
        n, nk = self.n_v_heads, self.n_v_heads * self.d_k
        A = rng.uniform(1, 16, n)
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), nk))
        return {
            "A_log": np.log(A).astype(self.dtype),
            "dt_bias": (dt + np.log(-np.expm1(-dt))).astype(self.dtype),
            "b_g": np.zeros(n * self.d_v, dtype=self.dtype),
        }

    def _gates_forward(self, h, B, L):
        P, n_v, d_k = self.params, self.n_v_heads, self.d_k
        h1 = h["W_f1"]  # [B*L, d_v]: the low rank
        pre = (h1 @ P["W_f2"] + P["dt_bias"]).reshape(-1, n_v, d_k)
        A = np.exp(P["A_log"])[:, None]  # [n_v, 1]: per head
        g = -A * softplus(pre)  # [B*L, n_v, d_k]
        beta = _sigmoid(h["W_b"])
        return (
            g.reshape(B, L, n_v, d_k),
            beta.reshape(B, L, n_v),
            (h1, pre, g, beta),
        )

    def _gates_backward(self, dg, dbeta, saved, dh):
        h1, pre, g, beta = saved
        P, grads = self.params, self.grads
        dg, dbeta = dg.reshape(g.shape), dbeta.reshape(beta.shape)
        grads["A_log"] = np.sum(dg * g, axis=(0, 2))
        A = np.exp(P["A_log"])[:, None]
        dpre = (dg * -A * _sigmoid(pre)).reshape(h1.shape[0], -1)
        grads["dt_bias"] = dpre.sum(axis=0)
        grads["W_f2"] = h1.T @ dpre
        dh["W_f1"][...] = dpre @ P["W_f2"].T  # [B*L, d_v]
        dh["W_b"][...] = dbeta * beta * (1.0 - beta)

    def _output_gate_forward(self, h, B, L):
        P = self.params
        h1 = h["W_g1"]  # [B*L, d_v]
        s = _sigmoid(h1 @ P["W_g2"] + P["b_g"])  # [B*L, n_v*d_v]
        return s, (h1, s)

    def _output_gate_backward(self, dz, saved, dh):
        h1, s = saved
        P, grads = self.params, self.grads
        dpre = dz * s * (1.0 - s)
        grads["b_g"] = dpre.sum(axis=0)
        grads["W_g2"] = h1.T @ dpre
        dh["W_g1"][...] = dpre @ P["W_g2"].T


def _gate_heads(t, n_k, G):
    """``[B, L, n_v (, d_k)] -> [B, n_k, G, L (, d_k)]``."""
    B, L = t.shape[:2]
    t = np.moveaxis(t, 2, 1)  # [B, n_v, L (, d_k)]
    return t.reshape(B, n_k, G, L, *t.shape[3:])


def _gate_heads_back(t, B, L):
    """``[B, n_k, G, L (, d_k)] -> [B, L, n_v (, d_k)]``."""
    t = t.reshape(B, -1, L, *t.shape[4:])
    return np.moveaxis(t, 1, 2)


def transformer_layer(d_model, n_heads, n_kv_heads, **settings):
    """A ``"linear"`` layer of chapter 5's
    :class:`~attn_np.Transformer`: a :class:`GatedDeltaNet` with
    ``n_heads`` value heads and ``n_kv_heads`` key heads, and the
    model's ``linear_options``."""
    return GatedDeltaNet(
        d_model,
        n_heads,
        n_kv_heads,
        d_k=settings["d_k"],
        d_v=settings["d_v"],
        seed=settings["seed"],
        dtype=settings["dtype"],
        **(settings.get("linear_options") or {}),
    )


register_layer_kind("linear", transformer_layer)
