"""Test doubles that several test files share (imported by name: pytest puts tests/ on the path).

Written apart from attn_np on purpose: the tests check the library's seams against them, so they
must not be the library's own code (attn_np.refinements.SoftCap is chapter 10's)."""

import numpy as np


class SoftCap:
    """Gemma 2's logit soft-capping, s -> c tanh(s / c), as a score mod with its backward twin."""

    def __init__(self, cap):
        self.cap = cap

    def forward(self, s, ctx):
        t = np.tanh(s / self.cap)
        return self.cap * t, t

    def backward(self, ds, t):
        return ds * (1 - t * t)
