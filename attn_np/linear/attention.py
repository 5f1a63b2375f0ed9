"""Linear attention (Katharopoulos et al. 2020; chapter 12): ``exp(q . k)``
replaced by ``phi(q) . phi(k)``, so the causal sum is a running state
``S [d_k, d_v]`` and a normaliser, not a matrix of scores."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import (
    as_float_array,
    check_backward_cache,
    check_finite,
    check_upstream,
)

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
    q, k, v = check_qkv(q, k, v)
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
    if den.size and not den.min() > 0:
        raise ValueError(
            "the normaliser phi(q) . sum phi(k) underflowed to 0: phi = "
            "elu + 1 is exp(x) below 0, which is 0 in "
            f"{den.dtype} for x below about "
            f"{np.log(np.finfo(den.dtype).tiny):.0f}; q or k is too "
            "negative (scale them down)"
        )
    cache = LinearAttentionCache(fq, fk, v, q, k, num, den)
    return num / den, cache


def linear_attention_backward(do, cache: LinearAttentionCache):
    """``(dq, dk, dv)`` of :func:`linear_attention_forward`, from its
    parallel form ``num = (M * phi(Q) phi(K)^T) V``, ``den = (M * phi(Q)
    phi(K)^T) 1`` (``M`` the causal mask)."""
    check_backward_cache(
        cache, LinearAttentionCache, "linear_attention_forward"
    )
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


def check_qkv(q, k, v):
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
    if q.shape[-1] == 0 or v.shape[-1] == 0:
        raise ValueError(
            "q, k and v need at least one feature (d_k, d_v >= 1), got q "
            f"{q.shape} and v {v.shape}"
        )
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_finite(x, name)
    dtype = np.result_type(q, k, v)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)
