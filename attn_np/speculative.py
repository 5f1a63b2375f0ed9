"""Speculative decoding: draft several tokens cheaply, verify them in one
forward of the real model, keep the ones it agrees with (chapter 16).

A decode step of a small model on a CPU is bound by reading its weights
(chapter 4): a forward over ``1 + k`` tokens costs little more than over
one. So a draft of ``k`` tokens that the model would have produced anyway
saves up to ``k`` steps. The draft needs no second model here: prompt
lookup (:func:`prompt_lookup_draft`) finds the text's last few tokens
earlier in the text and proposes what followed them, which pays off on
text that repeats itself (code, lists, quotes).

Verification is greedy and exact: the drafted tokens are fed with the
current token through the model with its cache; where the model's own
argmax after a prefix equals the next drafted token, that token is kept;
at the first disagreement the model's token is taken instead and the
cache is cut back to what was kept (``truncate``). The output is what
greedy decoding gives, token for token, up to ties that floating-point
rounding decides differently in a chunked forward and a one-token one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import check_count, check_positive_int


def prompt_lookup_draft(ids, k, *, ngram=3):
    """Up to ``k`` drafted tokens for the 1-D token sequence ``ids``: the
    tokens that followed the latest earlier occurrence of ``ids``'s last
    ``ngram`` tokens (shorter n-grams if none is found); none when the
    text does not repeat."""
    seq = np.asarray(ids).reshape(-1)
    k = check_count(k, "k", minimum=0)
    n_max = check_positive_int(ngram, "ngram")
    for n in range(min(n_max, seq.size - 1), 0, -1):
        tail = seq[-n:]
        # windows of n tokens that end before the tail itself
        for start in range(seq.size - n - 1, -1, -1):
            if np.array_equal(seq[start : start + n], tail):
                follow = seq[start + n : start + n + k]
                return follow.copy()
    return seq[:0].copy()


@dataclass
class SpeculativeStats:
    """What a run did: ``forwards`` (calls of the model after the prompt),
    ``drafted`` and ``accepted`` tokens, ``generated`` tokens."""

    forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0

    @property
    def acceptance(self) -> float:
        """Share of drafted tokens the model kept (0 when none drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.generated / self.forwards if self.forwards else 0.0


def generate(
    model,
    ids,
    max_new_tokens,
    *,
    draft=None,
    tree=None,
    k=4,
    stats=None,
):
    """``ids [1, L + max_new_tokens]``, what ``model.generate(ids,
    max_new_tokens)`` gives greedily, made with drafted tokens verified
    ``k`` at a time.

    ``model`` is a language model with ``forward(ids, kv_cache=...)`` and
    ``new_cache(capacity)`` (chapter 14's ``CausalLM``); ``draft(seq,
    k)`` proposes up to ``k`` next tokens for the 1-D sequence so far
    (default :func:`prompt_lookup_draft`). ``tree``: a drafted tree of
    candidates is not built here; the draft is one chain. ``stats`` (a
    :class:`SpeculativeStats`) is filled in when given.
    """
    if tree is not None:
        raise ValueError(
            "tree= drafts (several candidates verified with a tree mask) "
            "are not built; pass tree=None to verify one chain, got "
            f"{tree!r}"
        )
    ids = model.check_ids(ids)
    if ids.shape[0] != 1:
        raise ValueError(
            "speculative generate verifies one sequence at a time: ids "
            f"must be [1, L], got {list(ids.shape)}"
        )
    n = check_count(max_new_tokens, "max_new_tokens", minimum=0)
    k = check_count(k, "k", minimum=0)
    draft = prompt_lookup_draft if draft is None else draft
    if not callable(draft):
        raise TypeError(
            f"draft must be a function (seq, k) -> tokens, got {draft!r}"
        )
    stats = SpeculativeStats() if stats is None else stats
    seq = [int(t) for t in ids[0]]
    if n == 0:
        return np.array([seq], dtype=np.int64)
    cache = model.new_cache(ids.shape[1] + n + k + 1)
    logits = model.forward(ids, kv_cache=cache)[0, -1]  # [V]
    nxt = int(np.argmax(logits))  # the next token, not yet in the cache
    end = ids.shape[1] + n
    while True:
        seq.append(nxt)
        if len(seq) >= end:
            break
        room = min(k, end - len(seq))  # never draft past the end
        proposal = _checked_draft(draft(np.array(seq), room), room, model)
        held = len(cache)
        chunk = np.array([[nxt, *proposal]], dtype=np.int64)  # [1, 1 + d]
        logits = model.forward(chunk, kv_cache=cache)[0]  # [1 + d, V]
        preds = np.argmax(logits, axis=-1)  # the model's token after each
        j = 0
        while j < len(proposal) and proposal[j] == preds[j]:
            j += 1
        stats.forwards += 1
        stats.drafted += len(proposal)
        stats.accepted += j
        seq.extend(proposal[:j])
        cache.truncate(held + 1 + j)  # keep nxt and the accepted tokens
        nxt = int(preds[j])
        if len(seq) >= end:
            break
    out = np.array([seq[:end]], dtype=np.int64)
    stats.generated += n
    return out


def _checked_draft(tokens, room, model):
    """The draft as a list of at most ``room`` in-vocabulary ints."""
    t = np.asarray(tokens).reshape(-1)
    if t.size and (
        t.dtype == np.bool_ or not np.issubdtype(t.dtype, np.integer)
    ):
        raise ValueError(f"a draft must be token ids (ints), got {t.dtype}")
    if t.size > room:
        raise ValueError(
            f"the draft proposed {t.size} tokens, at most {room} were asked"
        )
    vocab = model.vocab_size
    if t.size and (t.min() < 0 or t.max() >= vocab):
        raise ValueError(
            f"a draft's token ids must lie in [0, {vocab}), got "
            f"{t.min()}..{t.max()}"
        )
    return [int(x) for x in t]
