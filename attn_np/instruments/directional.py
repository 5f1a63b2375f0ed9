"""Gradient checks along random directions, for a model too large to check
entry by entry (chapter 14).

For ``f(theta) = sum(logits(theta) * R)`` with a random ``R`` and a random
unit direction ``u`` (of one parameter, or of the embedded input), the
backward's gradient ``g`` must give the directional derivative::

    D(h) = (f(theta + h u) - f(theta - h u)) / (2 h)      error O(h^2)
    <g, u>  ~  (4 D(h/2) - D(h)) / 3                      error O(h^4)

The second line is Richardson's extrapolation: the ``h^2`` terms of the
two central differences cancel. It matters here: a unit step spread over
a token's embedding row (a vector of small norm, then RMS-normalised)
meets strong curvature, and ``D(h)`` alone is off by ``1e-7`` relative
at ``h = 1e-4``, where rounding already costs as much.

Four forwards per direction, however many numbers the parameter holds: the
whole backward of a 30-layer model is checked in seconds. The difference
is taken logit by logit before the sum with ``R``, ``sum((logits+ -
logits-) R)``: summed first, two totals of a few hundred thousand terms
would each carry a rounding error far larger than the difference's. The
relative error is the book's, ``|a - b| / max(1e-8, |a| + |b|)``.
"""

from __future__ import annotations

import numpy as np

from .gradcheck import rel_error


def directional_check(model, ids, keys, *, seed=0, h=1e-3, inputs=True):
    """``{name: (analytic, numeric, rel_error)}`` for every parameter in
    ``keys`` of ``model`` (a :class:`~attn_np.pretrained.CausalLM`) and,
    with ``inputs=True``, for the embedded input ``"x"``, on ``ids [B, L]``.
    The parameters are restored afterwards."""
    rng = np.random.default_rng(seed)
    ids = model.check_ids(ids)
    x = model.embed.params["W"][ids]  # [B, L, d]
    R = rng.standard_normal((*ids.shape, model.vocab_size))  # [B, L, V]
    R = R.astype(model.dtype)
    model.forward_embeddings(x)
    dx = model.backward(R)  # the head's part only in embed.W
    grads = {k: np.array(model.grads[k]) for k in keys}
    # the embedding's rows of the tokens: from a forward of the ids
    if "embed.W" in keys:
        model.forward(ids)
        model.backward(R)
        grads["embed.W"] = np.array(model.grads["embed.W"])

    def slope(logits_at):
        """Richardson's ``(4 D(h/2) - D(h)) / 3`` from ``logits_at(t)``,
        the logits a step ``t`` along the direction."""
        d = {}
        for step in (h, h / 2):  # [B, L, V] twice -> D(step)
            up, down = logits_at(step), logits_at(-step)
            d[step] = float(np.sum((up - down) * R)) / (2 * step)
        return (4 * d[h / 2] - d[h]) / 3

    out = {}
    for key in keys:
        p = model.params[key]
        u = rng.standard_normal(p.shape)
        u /= np.linalg.norm(u)
        # in p's own layout (the embedding is stored column by column), so
        # that p = saved + t u is made in place in one pass, with no
        # temporaries as large as the embedding
        saved, u_p = p.copy(order="K"), np.empty_like(p)
        u_p[...] = u

        def at(t, p=p, u=u_p, saved=saved):
            np.multiply(u, t, out=p)
            p += saved
            return model.forward(ids)

        try:
            n = slope(at)
        finally:
            p[...] = saved
        a = float(np.sum(grads[key] * u))
        out[key] = (a, n, rel_error(a, n))
    if inputs:
        u = rng.standard_normal(x.shape)
        u /= np.linalg.norm(u)
        n = slope(lambda t: model.forward_embeddings(x + t * u))
        a = float(np.sum(dx * u))
        out["x"] = (a, n, rel_error(a, n))
    return out
