"""The gated delta rule, one token at a time: the reference form
(chapter 12), and the checks both forms share.

:func:`gated_delta_recurrent_forward` loops over the tokens; its backward
is backpropagation through time and keeps all ``T + 1`` states.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import (
    as_float_array,
    check_backward_cache,
    check_finite,
    check_upstream,
)
from .attention import check_qkv

# ---------------------------------------------------------------------------
# -- the gated delta rule: checks shared by both forms


def check_delta_inputs(q, k, v, g, beta, initial_state):
    """Validated arrays in one dtype, ``g`` as ``[..., T, d_k or 1]``."""
    q, k, v = check_qkv(q, k, v)
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
    if g.size and g.max() > 0:
        raise ValueError(
            "g must be log decays, g <= 0 (the decay exp(g) lies in (0, "
            f"1]), got a largest g of {g.max():.6g}"
        )
    if beta.size and not (beta.min() >= 0 and beta.max() <= 2):
        raise ValueError(
            "beta must be write strengths in [0, 2] (the delta rule's "
            "step; 2 allows negative eigenvalues), got values from "
            f"{beta.min():.6g} to {beta.max():.6g}"
        )
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


def sum_to(x, shape):
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
    q, k, v, g, beta, S0 = check_delta_inputs(
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
    check_backward_cache(
        cache, RecurrentCache, "gated_delta_recurrent_forward"
    )
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
        dg[t] = sum_to(da, a_t.shape) * a_t
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
