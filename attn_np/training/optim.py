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

import math

import numpy as np

from .._checks import check_finite


def _positive(value, name: str) -> float:
    """A positive finite real number, or a ``ValueError`` naming
    ``name``."""
    if isinstance(value, bool) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"{name} must be a positive finite number, got {value!r}"
        )
    return float(value)


def _arrays(named: dict, what: str) -> dict:
    if not isinstance(named, dict):
        raise TypeError(
            f"{what} must be a dict of arrays, got {type(named).__name__}"
        )
    for k, a in named.items():
        # kind "f": float16 to longdouble, np.issubdtype(dtype, np.floating)
        if not isinstance(a, np.ndarray) or a.dtype.kind != "f":
            kind = getattr(a, "dtype", type(a).__name__)
            raise TypeError(
                f"{what}[{k!r}] must be a floating-point ndarray, got {kind}"
            )
    return named


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
        lr = _positive(lr, "lr")
        eps = _positive(eps, "eps")
        try:
            b1, b2 = (float(b) for b in betas)
        except (TypeError, ValueError):
            raise ValueError(
                f"betas must be a pair of numbers, got {betas!r}"
            ) from None
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas!r}")
        self.params = dict(_arrays(params, "params"))
        for k, a in self.params.items():  # once: step checks the grads
            check_finite(a, f"params[{k!r}]")
        self.lr, (self.b1, self.b2), self.eps = lr, (b1, b2), eps
        # m and v of the parameters of one dtype in one vector each (one
        # group for a model): self.m[k] and self.v[k] are views of them
        self.groups = _groups(self.params)  # [(keys, slices, m, v), ...]
        self.m = _views(self.params, self.groups, 2)
        self.v = _views(self.params, self.groups, 3)
        self.t = 0

    def step(self, grads: dict, lr: float | None = None) -> None:
        """One update of every parameter; ``lr`` overrides the learning rate
        for this step (schedules). Elementwise, so each group's parameters
        are updated as one vector: the same numbers as one parameter at a
        time, in 9 NumPy calls instead of 9 per parameter."""
        lr = self.check_step(grads, lr)
        self.t += 1
        c1, c2 = 1.0 - self.b1**self.t, 1.0 - self.b2**self.t
        for keys, slices, m, v in self.groups:
            # the group's gradients, one vector: [n]
            g = np.concatenate([grads[k].reshape(-1) for k in keys])
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            step = (lr / c1) * m / (np.sqrt(v / c2) + self.eps)  # [n]
            for k, sl in zip(keys, slices):
                w = self.params[k]
                w -= step[sl].reshape(w.shape)  # in place: the layer sees it

    def check_step(self, grads: dict, lr: float | None = None) -> float:
        """The step's learning rate, after checking every gradient (keys,
        shapes, dtypes, NaN or inf) before any parameter is touched."""
        if set(grads) != set(self.params):
            missing, extra = (
                set(self.params) - set(grads),
                set(grads) - set(self.params),
            )
            raise ValueError(
                "grads must have the keys of params: missing "
                f"{sorted(missing)}, unexpected {sorted(extra)}"
            )
        _arrays(grads, "grads")
        for k, w in self.params.items():
            g = grads[k]
            if g.shape != w.shape:
                raise ValueError(
                    f"grads[{k!r}] has shape {g.shape}, the parameter has "
                    f"shape {w.shape}"
                )
            if not np.isfinite(g).all():
                raise ValueError(
                    f"grads[{k!r}] holds NaN or inf: the step would turn "
                    "the parameter into NaN"
                )
        return self.lr if lr is None else _positive(lr, "lr")


def _groups(params: dict) -> list:
    """``[(keys, slices, m, v), ...]``: the parameters grouped by dtype
    (in their order), each one's slice of its group's vector, and zero
    ``m`` and ``v`` vectors of that length and dtype."""
    by_dtype = {}
    for k, p in params.items():
        by_dtype.setdefault(p.dtype, []).append(k)
    groups = []
    for dtype, keys in by_dtype.items():
        ends = np.cumsum([params[k].size for k in keys]).tolist()
        slices = [slice(e - params[k].size, e) for k, e in zip(keys, ends)]
        n = ends[-1]
        groups.append((keys, slices, np.zeros(n, dtype), np.zeros(n, dtype)))
    return groups


def _views(params: dict, groups: list, which: int) -> dict:
    """``{key: view}``: each parameter's part of its group's ``m`` (2) or
    ``v`` (3) vector, in the parameter's shape."""
    return {
        k: g[which][sl].reshape(params[k].shape)
        for g in groups
        for k, sl in zip(g[0], g[1])
    }


def clip_grad_norm(grads: dict, max_norm: float) -> float:
    """Scale every gradient (in place) so that their joint L2 norm is at most
    ``max_norm``; return the norm. A NaN or infinite norm is an error (it
    would turn every gradient into NaN)."""
    max_norm = _positive(max_norm, "max_norm")
    _arrays(grads, "grads")
    with np.errstate(over="ignore", invalid="ignore"):
        norm = float(
            np.sqrt(
                sum(
                    float(np.sum(g.astype(np.float64) ** 2))
                    for g in grads.values()
                )
            )
        )
    if not math.isfinite(norm):
        bad = [k for k, g in grads.items() if not np.isfinite(g).all()]
        raise ValueError(
            f"the gradients' norm is {norm}: "
            + (
                f"grads[{bad[0]!r}] holds NaN or inf"
                if bad
                else "no gradient holds NaN or inf: their squares overflow"
            )
        )
    if norm > max_norm:
        for g in grads.values():
            g *= max_norm / norm
    return norm
