"""Adam (Kingma & Ba 2015) on the book's ``params`` / ``grads`` dicts
(chapter 5).

For each parameter ``w`` with gradient ``g``, at step ``t = 1, 2, ...``::

    m = b1 m + (1 - b1) g            running mean of the gradient
    v = b2 v + (1 - b2) g^2          running mean of its square
    m^ = m / (1 - b1^t)              bias corrections: m and v start at 0,
    v^ = v / (1 - b2^t)              so early averages are too small by
                                     exactly these factors
    w -= lr * m^ / (sqrt(v^) + eps)

Parameters are updated in place, so a layer that owns an array sees the new
values.
"""

from __future__ import annotations

import numpy as np


class Adam:
    """Adam over a dict of parameter arrays; call :meth:`step` with a dict of
    gradients (same keys)."""

    def __init__(
        self,
        params: dict,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
    ):
        if not lr > 0 or not all(0 <= b < 1 for b in betas) or not eps > 0:
            raise ValueError(
                f"need lr > 0, 0 <= betas < 1 and eps > 0, got lr={lr}, "
                f"betas={betas}, eps={eps}"
            )
        self.params = dict(params)
        self.lr, (self.b1, self.b2), self.eps = float(lr), betas, float(eps)
        self.m = {k: np.zeros_like(p) for k, p in self.params.items()}
        self.v = {k: np.zeros_like(p) for k, p in self.params.items()}
        self.t = 0

    def step(self, grads: dict, lr: float | None = None) -> None:
        """One update of every parameter; ``lr`` overrides the learning rate
        for this step (schedules)."""
        if set(grads) != set(self.params):
            missing, extra = (
                set(self.params) - set(grads),
                set(grads) - set(self.params),
            )
            raise ValueError(
                "grads must have the keys of params: missing "
                f"{sorted(missing)}, unexpected {sorted(extra)}"
            )
        self.t += 1
        lr = self.lr if lr is None else float(lr)
        c1, c2 = 1.0 - self.b1**self.t, 1.0 - self.b2**self.t
        for k, w in self.params.items():
            g = grads[k]
            if g.shape != w.shape:
                raise ValueError(
                    f"grads[{k!r}] has shape {g.shape}, the parameter has "
                    f"shape {w.shape}"
                )
            m, v = self.m[k], self.v[k]
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            # in place: the layer sees it
            w -= (lr / c1) * m / (np.sqrt(v / c2) + self.eps)


def clip_grad_norm(grads: dict, max_norm: float) -> float:
    """Scale every gradient (in place) so that their joint L2 norm is at most
    ``max_norm``; return the norm."""
    norm = float(
        np.sqrt(
            sum(
                float(np.sum(g.astype(np.float64) ** 2))
                for g in grads.values()
            )
        )
    )
    if norm > max_norm:
        for g in grads.values():
            g *= max_norm / norm
    return norm
