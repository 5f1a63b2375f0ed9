"""The gated delta rule in chunks of ``C`` tokens (chapter 12): the WY/UT
representation of Yang et al. 2024, as the package docstring derives it.

Only ``S_0`` of each chunk and ``U`` are kept; the backward recomputes
the rest chunk by chunk (or, with :data:`KEEP_PARTS`, the forward keeps
the chunks' intra-chunk matrices).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .._checks import (
    check_backward_cache,
    check_positive_int,
    check_upstream,
)
from .recurrent import check_delta_inputs, sum_to

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
    q, k, v, g, beta, S0 = check_delta_inputs(
        q, k, v, g, beta, initial_state
    )
    T = k.shape[-2]
    C = min(C, max(T, 1))  # a chunk longer than the input: one chunk
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
    check_backward_cache(cache, ChunkedCache, "gated_delta_chunked_forward")
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
    deC = sum_to(np.vecdot(dSn, S), p.eC.shape)
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
    dgam = dgam + sum_to(dQG * p.QG + dKG * p.KG - dKB * p.KB, shape)
    dgC = sum_to(np.sum(dKB * p.KB, axis=-2), shape) + deC * p.eC
    dgam[..., -1, :] += dgC
    for o, g in zip(out, (dq, dk, dv, dgam, dbeta)):
        o[...] = g
    return dS
