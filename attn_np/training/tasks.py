"""Multi-query associative recall, the chapter-5 task (after Ba et al. 2016
and Arora et al. 2023).

A sequence lists ``n_pairs`` key -> value pairs, then asks ``n_queries`` of
the keys again::

    k3 v7  k0 v2  k5 v7  k1 v4 | k5 k3
    targets at the query positions: v7 v7

The model must predict, at each query position, the value that followed that
key earlier. Keys in a sequence are distinct; values are drawn with
replacement. Key ids are ``0 .. n_keys-1``, value ids ``n_keys ..
n_keys+n_values-1``. Only the query positions count in the loss (``mask``).

Solving it takes attention: a position must find an earlier token by its
identity and copy what stands next to it. The keys and values of the
attention heads carry that identity, which is where sharing key/value heads
(MQA, GQA) can cost accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import check_positive_int


@dataclass(frozen=True)
class RecallBatch:
    inputs: np.ndarray  # [N, L] int token ids
    # [N, L] int, the value to predict at query positions (0 elsewhere)
    targets: np.ndarray
    mask: np.ndarray  # [N, L] bool, True at query positions


@dataclass(frozen=True)
class AssociativeRecall:
    """The task's sizes; :meth:`sample` draws a batch deterministically from
    a seed."""

    n_pairs: int = 8
    n_queries: int = 4
    n_keys: int = 16
    n_values: int = 16

    def __post_init__(self):
        for name in ("n_pairs", "n_queries", "n_keys", "n_values"):
            check_positive_int(getattr(self, name), name)
        if self.n_pairs > self.n_keys:
            raise ValueError(
                "n_pairs must be <= n_keys (keys in a sequence are "
                f"distinct), got {self.n_pairs} > {self.n_keys}"
            )
        if self.n_queries > self.n_pairs:
            raise ValueError(
                "n_queries must be <= n_pairs (each query asks a distinct "
                f"key), got {self.n_queries} > {self.n_pairs}"
            )

    @property
    def vocab_size(self) -> int:
        return self.n_keys + self.n_values

    @property
    def seq_len(self) -> int:
        return 2 * self.n_pairs + self.n_queries

    def sample(self, n: int, seed) -> RecallBatch:
        """``n`` sequences drawn from ``np.random.default_rng(seed)`` (the
        same seed gives the same batch)."""
        n = check_positive_int(n, "n")
        rng = np.random.default_rng(seed)
        P, Q = self.n_pairs, self.n_queries
        # [n, P] distinct keys per row
        keys = np.argsort(rng.random((n, self.n_keys)), axis=1)[:, :P]
        # [n, P]
        values = self.n_keys + rng.integers(self.n_values, size=(n, P))
        # [n, Q] distinct pair indices
        asked = np.argsort(rng.random((n, P)), axis=1)[:, :Q]
        inputs = np.empty((n, 2 * P + Q), dtype=np.int64)
        # k v k v ... : keys at even positions
        inputs[:, 0 : 2 * P : 2] = keys
        inputs[:, 1 : 2 * P : 2] = values
        # [n, Q] query keys
        inputs[:, 2 * P :] = np.take_along_axis(keys, asked, axis=1)
        targets = np.zeros_like(inputs)
        # [n, Q] their values
        targets[:, 2 * P :] = np.take_along_axis(values, asked, axis=1)
        mask = np.zeros(inputs.shape, dtype=bool)
        mask[:, 2 * P :] = True
        return RecallBatch(inputs=inputs, targets=targets, mask=mask)

    def labels(self, ids) -> list[str]:
        """Readable token names for plots: ``k3`` for key 3, ``v7`` for value
        7."""
        return [
            f"k{i}" if i < self.n_keys else f"v{i - self.n_keys}"
            for i in np.asarray(ids).tolist()
        ]
