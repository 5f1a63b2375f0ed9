"""Tree attention (chapter 16): a tree given by parent indices, its mask as
a function, per-node positions through a layer, a cache that keeps an
accepted path whose slots are not neighbours, and a drafted tree verified
in one forward giving what each branch gives alone."""

import numpy as np
import pytest

from attn_np import GroupedQueryAttention, KVCache
from attn_np.masks import (
    create_mask,
    tree_ancestors,
    tree_depths,
    tree_mod,
)

PARENTS = [-1, 0, 1, 0, 3, -1, 5]  # two roots, a fork at node 0


def test_ancestors_and_depths_by_walking_up():
    anc = tree_ancestors(PARENTS)
    for i in range(len(PARENTS)):
        up, j = {i}, PARENTS[i]
        while j >= 0:
            up.add(j)
            j = PARENTS[j]
        assert set(np.flatnonzero(anc[i])) == up
        assert tree_depths(PARENTS)[i] == len(up) - 1


@pytest.mark.parametrize("bad", [[0], [-1, 1], [-1, 0, 5], [-2]])
def test_a_parent_must_be_an_earlier_node(bad):
    with pytest.raises(
        ValueError, match=r"parents\[\d\] must be an earlier"
    ):
        tree_ancestors(bad)


def test_parents_must_be_ints():
    with pytest.raises(ValueError, match="parents must be"):
        tree_ancestors([[0]])
    with pytest.raises(ValueError, match="parents must be"):
        tree_ancestors([-1.0, 0.0])


def test_tree_mask_sees_the_cache_and_the_ancestors():
    held, N = 5, len(PARENTS)
    m = create_mask(tree_mod(PARENTS, held), 1, 1, N, held + N)[0, 0]
    assert m[:, :held].all()  # every node sees every cached key
    assert np.array_equal(m[:, held:], tree_ancestors(PARENTS))


def test_tree_mask_refuses_a_call_it_does_not_cover():
    with pytest.raises(ValueError, match="tree_mod covers"):
        create_mask(tree_mod(PARENTS, 2), 1, 1, 3, 12)


def _layer(seed=0):
    return GroupedQueryAttention(16, 4, 2, seed=seed, rope_base=100.0)


def test_positions_default_is_unchanged_and_explicit_ones_rotate():
    layer = _layer()
    x = np.random.default_rng(1).standard_normal((2, 6, 16))
    y = layer.forward(x, causal=True)
    y_pos = layer.forward(x, causal=True, positions=np.arange(6))
    assert np.array_equal(y, y_pos)
    # shifting every position by the same amount leaves RoPE's scores
    y_far = layer.forward(x, causal=True, positions=np.arange(6) + 40)
    assert np.allclose(y, y_far, atol=1e-12)


@pytest.mark.parametrize(
    "positions, match",
    [
        (np.arange(5), r"\[L\] = \[6\]"),
        (np.arange(6.0), "ints"),
        (np.arange(6) - 1, ">= 0"),
    ],
)
def test_bad_positions_are_refused(positions, match):
    x = np.zeros((1, 6, 16))
    with pytest.raises(ValueError, match=match):
        _layer().forward(x, causal=True, positions=positions)


def test_a_tree_over_a_cache_equals_each_branch_alone():
    """Node i's output under the tree mask at its depth's position equals
    the last output of its root-to-node path fed after the cache."""
    layer, rng = _layer(), np.random.default_rng(2)
    prefix = rng.standard_normal((1, 4, 16))
    nodes = rng.standard_normal((1, len(PARENTS), 16))
    cache = KVCache()
    layer.forward(prefix, kv_cache=cache)
    held = len(cache)
    y = layer.forward(
        nodes,
        kv_cache=cache,
        mask=tree_mod(PARENTS, held),
        positions=held + tree_depths(PARENTS),
    )
    anc = tree_ancestors(PARENTS)
    for i in range(len(PARENTS)):
        path = np.flatnonzero(anc[i])  # root ... i, in order
        alone = KVCache()
        layer.forward(prefix, kv_cache=alone)
        want = layer.forward(nodes[:, path], kv_cache=alone)[0, -1]
        assert np.allclose(y[0, i], want, atol=1e-12)


def test_keep_moves_the_path_together_and_forgets_the_rest():
    rng = np.random.default_rng(3)
    k, v = rng.standard_normal((2, 1, 2, 9, 4))
    cache = KVCache()
    cache.append(k, v)
    cache.keep(3, np.array([0, 2, 5]))
    assert len(cache) == 6
    rows = [0, 1, 2, 3, 5, 8]
    assert np.array_equal(cache.keys, k[:, :, rows])
    assert np.array_equal(cache.values, v[:, :, rows])
    cache.append(k[:, :, :1], v[:, :, :1])  # appends after the path
    assert np.array_equal(cache.keys[:, :, -1], k[:, :, 0])


@pytest.mark.parametrize(
    "start, offsets, match",
    [
        (10, [0], "start"),
        (3, [1, 1], "strictly"),
        (3, [0, 6], "strictly"),
        (3, [-1], "strictly"),
    ],
)
def test_keep_refuses_bad_paths(start, offsets, match):
    cache = KVCache()
    cache.append(np.zeros((1, 1, 9, 2)), np.zeros((1, 1, 9, 2)))
    with pytest.raises(ValueError, match=match):
        cache.keep(start, np.array(offsets))


def test_keep_needs_a_cache_of_every_position():
    cache = KVCache(window=4)
    cache.append(np.zeros((1, 1, 3, 2)), np.zeros((1, 1, 3, 2)))
    with pytest.raises(ValueError, match="every position"):
        cache.keep(0, np.array([0]))


def _tiny_lm(seed=0, vocab=11):
    """A random two-layer Llama in float64 (chapter 14's CausalLM)."""
    from attn_np.pretrained import LlamaConfig
    from attn_np.pretrained.model import CausalLM

    c = LlamaConfig(vocab, 16, 2, 4, 2, 4, 24, 100.0, 1e-6, 64, True)
    m = CausalLM(c)
    rng = np.random.default_rng(seed)
    m.embed.params["W"] = rng.standard_normal((vocab, 16))
    for name, p in m.params.items():
        if name.endswith(".g"):
            p[:] = 1 + 0.3 * rng.standard_normal(p.shape)
    return m


def test_a_model_forward_takes_positions_and_a_mask():
    m = _tiny_lm()
    ids = np.array([[1, 4, 2, 9, 3]])
    plain = m.forward(ids)
    assert np.array_equal(plain, m.forward(ids, positions=np.arange(5)))
    # a shift of every position leaves RoPE's logits (to rounding)
    far = m.forward(ids, positions=np.arange(5) + 17)
    assert np.abs(far - plain).max() < 1e-12


def test_verify_tree_keeps_the_greedy_branch_and_its_cache():
    """The greedy continuation drafted as the second branch, with a wrong
    sibling before its second token: the walk keeps it, the next token is
    greedy's, and the cache, its slots moved together, holds what feeding
    the greedy tokens one by one gives (float64, to rounding)."""
    from attn_np.speculative import verify_tree

    m, V = _tiny_lm(1), 11
    prompt = np.array([[3, 1, 4, 1, 5, 9]])
    ref = m.new_cache(32)
    logits = m.forward(prompt, kv_cache=ref)[0, -1]
    greedy = []
    for _ in range(4):  # the root, then three greedy tokens
        greedy.append(int(np.argmax(logits)))
        logits = m.forward(np.array([[greedy[-1]]]), kv_cache=ref)[0, -1]
    root, g1, g2, g3 = greedy
    tokens = [(g1 + 1) % V, g1, (g2 + 1) % V, g2]
    parents = [-1, -1, 1, 1]  # a wrong root, then g1 -> (wrong, g2)
    cache = m.new_cache(32)
    m.forward(prompt, kv_cache=cache)
    path, nxt = verify_tree(m, cache, root, tokens, parents)
    assert path == [1, 3] and nxt == g3
    assert len(cache) == len(ref) - 1  # g3 is not fed yet
    for a, b in zip(cache.caches, ref.caches):
        n = len(cache)
        assert np.abs(a.keys - b.keys[:, :, :n]).max() < 1e-12
        assert np.abs(a.values - b.values[:, :, :n]).max() < 1e-12
