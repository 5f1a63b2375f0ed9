"""Multi-head attention written the obvious way, for comparison only
(chapter 2's timings and ``python -m attn_np.bench mha``).

:func:`naive_mha_forward` and :func:`naive_mha_backward` hand ``np.matmul``
the per-head *views* that ``x @ W`` reshaped to ``[B, L, h, d_k]`` and
swapped to ``[B, h, L, d_k]`` gives, without making anything contiguous,
and make a fresh ``[B, h, L, L]`` array for every step of the softmax.
:func:`forward_backward_step` and :func:`naive_forward_backward_step` wrap
a forward + backward pass as a function of nothing, to be timed.
"""

from __future__ import annotations

import numpy as np

from ..attention import causal_mask


# ---------------------------------------------------------------------------
# ----------------- COMPARISON ONLY, not part of the library: multi-head
# attention written the obvious way, on non-contiguous per-head views, with a
# fresh array for every step of the softmax. --------------------------------
# ------------------------------------------------------------
def naive_mha_forward(x, params, n_heads, *, causal=False):
    """Multi-head attention on per-head views; returns ``(y, cache)``. For
    benchmarks only.

    ``x`` is ``[B, L, d_model]``; ``params`` holds ``W_q, W_k, W_v, W_o`` as
    in :class:`attn_np.MultiHeadAttention`. Every per-head array is a strided
    view of ``x @ W``, and every matmul gets the transposed *view*
    ``k.swapaxes(-1, -2)``, never a contiguous copy.
    """
    B, L, _ = x.shape
    W = params
    d_k, d_v = W["W_q"].shape[1] // n_heads, W["W_v"].shape[1] // n_heads
    # view [B, h, L, d_k], not contiguous
    q = (x @ W["W_q"]).reshape(B, L, n_heads, d_k).swapaxes(1, 2)
    # view [B, h, L, d_k]
    k = (x @ W["W_k"]).reshape(B, L, n_heads, d_k).swapaxes(1, 2)
    # view [B, h, L, d_v]
    v = (x @ W["W_v"]).reshape(B, L, n_heads, d_v).swapaxes(1, 2)
    # [B, h, L, d_k] @ [B, h, d_k, L] -> [B, h, L, L]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(d_k)
    if causal:
        # a new [B, h, L, L] array
        s = np.where(causal_mask(L, L), s, -np.inf)
    # two new [B, h, L, L] arrays
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)  # and another
    o = p @ v  # [B, h, L, L] @ [B, h, L, d_v] -> [B, h, L, d_v]
    # [B, L, h*d_v] (reshape has to copy)
    concat = o.swapaxes(1, 2).reshape(B, L, n_heads * d_v)
    # [B, L, h*d_v] @ [h*d_v, d_model] -> [B, L, d_model]
    y = concat @ W["W_o"]
    return y, (x, q, k, v, p, concat, params, n_heads)


def naive_mha_backward(dy, cache):
    """Backward of :func:`naive_mha_forward`: ``(dx, grads)``, again on
    per-head views."""
    x, q, k, v, p, concat, W, n_heads = cache
    B, L, d_model = x.shape
    d_k, d_v = q.shape[-1], v.shape[-1]
    scale = 1 / np.sqrt(d_k)
    # [h*d_v, d_model]
    grads = {
        "W_o": concat.reshape(-1, n_heads * d_v).T @ dy.reshape(-1, d_model)
    }
    # view [B, h, L, d_v]
    do = (dy @ W["W_o"].T).reshape(B, L, n_heads, d_v).swapaxes(1, 2)
    # [B, h, L, L] @ [B, h, L, d_v] -> [B, h, L, d_v]
    dv = p.swapaxes(-1, -2) @ do
    # [B, h, L, d_v] @ [B, h, d_v, L] -> [B, h, L, L]
    dp = do @ v.swapaxes(-1, -2)
    # three new [B, h, L, L] arrays
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = ds @ k * scale  # [B, h, L, L] @ [B, h, L, d_k] -> [B, h, L, d_k]
    # [B, h, L, L] @ [B, h, L, d_k] -> [B, h, L, d_k]
    dk = ds.swapaxes(-1, -2) @ q * scale
    dq = dq.swapaxes(1, 2).reshape(B, L, n_heads * d_k)  # [B, L, h*d_k]
    dk = dk.swapaxes(1, 2).reshape(B, L, n_heads * d_k)
    dv = dv.swapaxes(1, 2).reshape(B, L, n_heads * d_v)
    xf = x.reshape(-1, d_model)  # [B*L, d_model]
    for name, g in (("W_q", dq), ("W_k", dk), ("W_v", dv)):
        # [d_model, B*L] @ [B*L, h*d] -> [d_model, h*d]
        grads[name] = xf.T @ g.reshape(B * L, -1)
    # [B, L, d_model]
    dx = dq @ W["W_q"].T + dk @ W["W_k"].T + dv @ W["W_v"].T
    return dx, grads


# ---------------------------------------------------------------------------
# -----------------
def forward_backward_step(layer, x, *, causal=True):
    """A function that runs ``layer.forward(x)`` then ``layer.backward(dy)``
    (``dy`` fixed, seeded)."""
    dy = np.random.default_rng(1).standard_normal(x.shape).astype(x.dtype)

    def step():
        layer.forward(x, causal=causal)
        layer.backward(dy)

    return step


def naive_forward_backward_step(params, n_heads, x, *, causal=True):
    """The same for :func:`naive_mha_forward` and
    :func:`naive_mha_backward`."""
    dy = np.random.default_rng(1).standard_normal(x.shape).astype(x.dtype)

    def step():
        _, cache = naive_mha_forward(x, params, n_heads, causal=causal)
        naive_mha_backward(dy, cache)

    return step
