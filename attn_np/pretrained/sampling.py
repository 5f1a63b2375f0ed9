"""Choosing the next token from the logits (chapter 14; chapter 15's
engine samples with the same function).

``temperature=0`` is greedy: the most likely token. Otherwise the token is
drawn from ``softmax(logits / temperature)``, cut to the ``top_k`` most
likely tokens and to the smallest set whose probability reaches ``top_p``
(nucleus sampling, Holtzman et al. 2020), from a seeded
``np.random.Generator``: the same seed gives the same tokens, whoever
calls.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_float_array, check_finite, check_positive_int


def check_sampling(temperature, top_k, top_p, vocab):
    """``(temperature, top_k, top_p)`` checked: a number ``>= 0``, None
    or a positive int (at most ``vocab``), None or a number in ``(0,
    1]``."""
    if isinstance(temperature, bool) or not isinstance(
        temperature, (int, float, np.floating, np.integer)
    ):
        raise TypeError(
            f"temperature must be a number, got {type(temperature).__name__}"
        )
    if not np.isfinite(temperature) or temperature < 0:
        raise ValueError(
            f"temperature must be finite and >= 0, got {temperature!r}"
        )
    if top_k is not None:
        top_k = min(check_positive_int(top_k, "top_k"), vocab)
    if top_p is not None:
        ok = isinstance(top_p, (int, float, np.floating)) and not isinstance(
            top_p, bool
        )
        if not ok or not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    return temperature, top_k, top_p


def sample_next(logits, *, temperature=0.0, top_k=None, top_p=None, rng):
    """``logits [B, V]`` -> the next token of each row, ``ids [B]``:
    greedy (``temperature=0``, ``rng`` unused), or drawn with ``rng`` (a
    ``np.random.Generator``) after the temperature, top-k and top-p cuts.
    The arguments are those :func:`check_sampling` passes."""
    check_finite(as_float_array(logits, "logits", min_ndim=1), "logits")
    if temperature == 0:
        return np.argmax(logits, axis=-1)
    z = logits.astype(np.float64) / temperature  # [B, V]
    if top_k is not None:  # below the k-th largest: out
        kth = np.partition(z, -top_k, axis=-1)[:, -top_k, None]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)  # [B, V]
    if top_p is not None:  # the smallest set reaching top_p
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p
        keep = np.zeros_like(p, dtype=bool)
        np.put_along_axis(keep, order, before < top_p, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(len(r), p=r) for r in p])


def sampler(temperature=0.0, top_k=None, top_p=None, seed=0, *, vocab):
    """A function ``logits [B, V] -> ids [B]`` that samples with
    :func:`sample_next`, its arguments checked once and its generator
    ``np.random.default_rng(seed)`` kept between calls (a generation's
    steps draw from one stream). ``sampler(0.0).greedy`` is True."""
    temperature, top_k, top_p = check_sampling(
        temperature, top_k, top_p, vocab
    )
    rng = np.random.default_rng(seed)

    def sample(logits):
        return sample_next(
            logits,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            rng=rng,
        )

    sample.greedy = temperature == 0
    return sample
