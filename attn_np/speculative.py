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

A tree of drafts (SpecInfer, Miao et al. 2024; Medusa, Cai et al. 2024)
verifies several candidates in the same forward: with ``tree=`` the draft
returns tokens and parent indices (:func:`prompt_lookup_tree` merges the
continuations of several earlier matches into a trie); every node is fed
at the position ``len(cache) + depth`` under a tree mask
(:func:`~attn_np.masks.tree_mod`: a node sees the cache, its ancestors and
itself), the longest path the model agrees with is kept, and its keys and
values, which need not be neighbours in the cache, are moved together
(:meth:`~attn_np.KVCache.keep`) before the rest is forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import check_count, check_positive_int, check_token_ids
from .masks import check_parents, tree_depths, tree_mod


def prompt_lookup_draft(ids, k, *, ngram=3):
    """Up to ``k`` drafted tokens for the 1-D token sequence ``ids``: the
    tokens that followed the latest earlier occurrence of ``ids``'s last
    ``ngram`` tokens (shorter n-grams if none is found); none when the
    text does not repeat."""
    seq = check_token_ids(ids, None).reshape(-1)
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


def prompt_lookup_tree(ids, k, branches=3, *, ngram=3):
    """A tree of drafts for the 1-D sequence ``ids``: ``(tokens [N],
    parents [N])``, the continuations (up to ``k`` tokens each) of up to
    ``branches`` earlier occurrences of the text's last ``ngram`` tokens
    (then shorter n-grams), latest first, merged into a trie. ``parents[i]``
    is an earlier node, or -1: the node follows the last token of
    ``ids``."""
    seq = check_token_ids(ids, None).reshape(-1)
    k = check_count(k, "k", minimum=0)
    branches = check_positive_int(branches, "branches")
    n_max = check_positive_int(ngram, "ngram")
    conts = []  # distinct continuations, as tuples
    for n in range(min(n_max, seq.size - 1), 0, -1):
        tail = seq[-n:]
        for start in range(seq.size - n - 1, -1, -1):
            if len(conts) == branches or k == 0:
                break
            if np.array_equal(seq[start : start + n], tail):
                c = tuple(seq[start + n : start + n + k].tolist())
                if c and c not in conts:
                    conts.append(c)
    tokens, parents, node = [], [], {}  # node: prefix -> index
    for c in conts:
        for d in range(len(c)):
            if c[: d + 1] not in node:
                node[c[: d + 1]] = len(tokens)
                tokens.append(c[d])
                parents.append(node[c[:d]] if d else -1)
    return (
        np.array(tokens, dtype=seq.dtype),
        np.array(parents, dtype=np.int64),
    )


@dataclass
class SpeculativeStats:
    """What a run did: ``forwards`` (calls of the model after the prompt),
    ``drafted`` and ``accepted`` tokens, ``generated`` tokens. A tree
    drafts every branch and keeps at most one, so its share kept is lower
    than a chain's for the same tokens per forward."""

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
    ``k`` deep at a time.

    ``model`` is a language model with ``forward(ids, kv_cache=...,
    mask=..., positions=...)`` and ``new_cache(capacity)`` (chapter 14's
    ``CausalLM``). Without ``tree``, ``draft(seq, k)`` proposes a chain of
    up to ``k`` next tokens for the 1-D sequence so far (default
    :func:`prompt_lookup_draft`). With ``tree`` (an int, the branches),
    ``draft(seq, k, tree)`` returns a tree ``(tokens, parents)`` at most
    ``k`` deep (default :func:`prompt_lookup_tree`), verified in one
    forward. ``stats`` (a :class:`SpeculativeStats`) is filled in when
    given.
    """
    if tree is not None:
        tree = check_positive_int(tree, "tree")
    ids = model.check_ids(ids)
    if ids.shape[0] != 1:
        raise ValueError(
            "speculative generate verifies one sequence at a time: ids "
            f"must be [1, L], got {list(ids.shape)}"
        )
    n = check_count(max_new_tokens, "max_new_tokens", minimum=0)
    k = check_count(k, "k", minimum=0)
    if draft is None:
        draft = prompt_lookup_draft if tree is None else prompt_lookup_tree
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
        if tree is None:
            tokens = _checked_draft(draft(np.array(seq), room), room, model)
            parents = np.arange(len(tokens)) - 1  # a chain
        else:
            got = draft(np.array(seq), room, tree)
            tokens, parents = _checked_tree(got, room, model)
        path, nxt = verify_tree(model, cache, nxt, tokens, parents)
        stats.forwards += 1
        stats.drafted += len(tokens)
        stats.accepted += len(path)
        seq.extend(tokens[i] for i in path)
        if len(seq) >= end:
            break
    out = np.array([seq[:end]], dtype=np.int64)
    stats.generated += n
    return out


def verify_tree(model, cache, token, tokens, parents):
    """One forward of ``token`` (the next one, not yet cached) and the
    drafted tree after it (``tokens``, ``parents``: -1 for a child of
    ``token``) over ``cache``; returns ``(path, next)``: the drafted
    nodes the model agrees with, root to leaf, and its own token after
    them. The cache then holds ``token`` and the path's tokens only."""
    held, N = len(cache), len(tokens)
    # node 0 is token, the drafted nodes 1 ... N: parents shifted by one
    par = np.concatenate([[-1], np.asarray(parents, np.int64) + 1])
    chunk = np.array([[token, *tokens]], dtype=np.int64)  # [1, 1 + N]
    if np.array_equal(par, np.arange(N + 1) - 1):  # a chain: causal
        logits = model.forward(chunk, kv_cache=cache)[0]  # [1 + N, V]
    else:  # a node sees the cache, its ancestors and itself
        logits = model.forward(
            chunk,
            kv_cache=cache,
            mask=tree_mod(par, held),
            positions=held + tree_depths(par),  # [1 + N]
        )[0]
    preds = np.argmax(logits, axis=-1)  # the model's token after each node
    path, cur = [], 0
    while True:  # down the child whose token the model predicts
        kids = np.flatnonzero((par == cur) & (chunk[0] == preds[cur]))
        if kids.size == 0:
            break
        cur = int(kids[0])
        path.append(cur)
    for c in cache.caches:  # token and the path, moved together
        c.keep(held, np.array([0, *path]))
    return [i - 1 for i in path], int(preds[cur])


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


def _checked_tree(got, room, model):
    """A tree draft ``(tokens, parents)`` as lists, at most ``room``
    deep."""
    if not (isinstance(got, tuple) and len(got) == 2):
        raise ValueError(
            "a tree draft must return (tokens, parents), got "
            f"{type(got).__name__}"
        )
    parents = check_parents(got[1])
    tokens = _checked_draft(got[0], max(room, np.size(got[0])), model)
    if len(tokens) != parents.size:
        raise ValueError(
            f"a tree draft's tokens ({len(tokens)}) and parents "
            f"({parents.size}) must have one entry per node"
        )
    depth = int(tree_depths(parents).max(initial=-1)) + 1
    if depth > room:
        raise ValueError(
            f"the tree is {depth} tokens deep, at most {room} were asked"
        )
    return tokens, parents
