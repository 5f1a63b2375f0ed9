"""rope_forward / rope_backward: values, relative positions, layouts, errors.

The layer-level tests (GroupedQueryAttention with ``rope_base``) live at
the end of this file.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_np import (
    TOLERANCE,
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    MultiQueryAttention,
    Transformer,
    check_gradients,
    check_layer_gradients,
    mha_to_gqa,
    rel_error,
    rope,
    rope_backward,
    rope_forward,
    rope_frequencies,
    rope_permutation,
    rotate_pairs,
)
from attn_np.rope import KEPT_POSITIONS, Rotary

LAYOUTS = ["half", "interleaved"]


def reference_rope(x, positions, base, layout, r):
    """One pair at a time with an explicit 2x2 rotation matrix."""
    y = np.array(x, dtype=np.float64)
    for t, p in enumerate(positions):
        for i in range(r // 2):
            a, b = (
                (i, i + r // 2) if layout == "half" else (2 * i, 2 * i + 1)
            )
            phi = p * base ** (-2.0 * i / r)
            R = np.array(
                [[np.cos(phi), -np.sin(phi)], [np.sin(phi), np.cos(phi)]]
            )
            pair = np.stack([x[..., t, a], x[..., t, b]], axis=-1)
            out = pair @ R.T
            y[..., t, a], y[..., t, b] = out[..., 0], out[..., 1]
    return y


@st.composite
def rope_cases(draw):
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    L = draw(st.integers(1, 5))
    d = 2 * draw(st.integers(1, 4))
    r = 2 * draw(st.integers(1, d // 2))
    layout = draw(st.sampled_from(LAYOUTS))
    base = draw(st.sampled_from([10.0, 10000.0, 1e6]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal(lead + (L, d))
    positions = rng.integers(0, 50, size=L)
    return x, positions, base, layout, r


# ------------------------------------------------------------------ values
@given(rope_cases())
def test_matches_pairwise_rotation_matrices(case):
    x, positions, base, layout, r = case
    y = rope(x, positions, base=base, layout=layout, rotary_dim=r)
    want = reference_rope(x, positions, base, layout, r)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


@given(rope_cases())
def test_norm_is_kept_and_unrotated_features_pass(case):
    x, positions, base, layout, r = case
    y = rope(x, positions, base=base, layout=layout, rotary_dim=r)
    np.testing.assert_allclose(
        np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12
    )
    assert np.array_equal(y[..., r:], x[..., r:])


def test_position_zero_is_the_identity():
    x = np.random.default_rng(0).standard_normal((3, 4, 8))
    for layout in LAYOUTS:
        y = rope(x, np.zeros(4, dtype=int), layout=layout)
        assert np.array_equal(y, x)


def test_frequencies():
    theta = rope_frequencies(8, base=10000.0)
    np.testing.assert_allclose(theta, [1.0, 0.1, 0.01, 0.001], rtol=1e-14)


def test_float32_stays_float32():
    x = (
        np.random.default_rng(0)
        .standard_normal((2, 5, 6))
        .astype(np.float32)
    )
    y, cache = rope_forward(x, np.arange(5))
    assert y.dtype == np.float32
    assert rope_backward(y, cache).dtype == np.float32


# ------------------------------------------------------- relative position
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("r", [16, 10])
def test_score_depends_only_on_relative_position(layout, r):
    """q at m, k at n: the score is a function of n - m alone."""
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 1, 16))
    scores = {}
    for m in range(0, 40, 3):
        for n in range(0, 40, 5):
            qm = rope(q, np.array([m]), layout=layout, rotary_dim=r)
            kn = rope(k, np.array([n]), layout=layout, rotary_dim=r)
            scores.setdefault(n - m, []).append(float(qm[0] @ kn[0]))
    spread = max(max(s) - min(s) for s in scores.values())
    assert spread < 1e-12
    assert len(scores) > 10


# ------------------------------------------------------------- gradients
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_gradients(layout, rotary_dim):
    x = np.random.default_rng(2).standard_normal((2, 5, 8))
    errors = check_gradients(
        lambda x: rope_forward(
            x,
            np.array([0, 3, 1, 7, 100]),
            layout=layout,
            rotary_dim=rotary_dim,
        ),
        rope_backward,
        {"x": x},
    )
    assert errors["x"] < TOLERANCE, errors


@given(rope_cases())
def test_backward_is_the_transpose(case):
    """<R x, g> = <x, R^T g> for random x and g: the backward is R^T."""
    x, positions, base, layout, r = case
    y, cache = rope_forward(
        x, positions, base=base, layout=layout, rotary_dim=r
    )
    g = np.random.default_rng(0).standard_normal(y.shape)
    lhs, rhs = np.sum(y * g), np.sum(x * rope_backward(g, cache))
    assert abs(lhs - rhs) <= 1e-12 * (1 + abs(lhs))
    # and rotating by -theta undoes the rotation
    np.testing.assert_allclose(rope_backward(y, cache), x, atol=1e-12)


# --------------------------------------------------------------- layouts
@pytest.mark.parametrize("rotary_dim", [None, 6])
def test_permutation_maps_interleaved_onto_half(rotary_dim):
    n_heads, L, d_k = 3, 7, 8
    q = np.random.default_rng(3).standard_normal((n_heads, L, d_k))
    perm = rope_permutation(d_k, rotary_dim=rotary_dim)
    pos = np.arange(L) * 5
    y_inter = rope(q, pos, layout="interleaved", rotary_dim=rotary_dim)
    y_half = rope(q[..., perm], pos, layout="half", rotary_dim=rotary_dim)
    assert np.array_equal(y_half, y_inter[..., perm])
    back = rope_permutation(
        d_k, rotary_dim=rotary_dim, source="half", target="interleaved"
    )
    assert np.array_equal(perm[back], np.arange(d_k))


def test_permutation_per_head():
    perm = rope_permutation(4, n_heads=2)
    assert perm.tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    assert rope_permutation(6, rotary_dim=4).tolist() == [0, 2, 1, 3, 4, 5]
    same = rope_permutation(4, n_heads=2, source="half", target="half")
    assert same.tolist() == list(range(8))


def test_mixing_layouts_changes_the_result():
    x = np.random.default_rng(4).standard_normal((5, 8))
    a = rope(x, np.arange(5), layout="half")
    b = rope(x, np.arange(5), layout="interleaved")
    assert np.array_equal(a[0], b[0])  # position 0: no rotation at all
    assert rel_error(a[1:], b[1:]) > 0.01


# ---------------------------------------------------------------- errors
def test_errors():
    x = np.zeros((2, 4, 6))
    pos = np.arange(4)
    with pytest.raises(ValueError, match="rotated in pairs"):
        rope_forward(np.zeros((4, 5)), pos)
    with pytest.raises(ValueError, match="rotary_dim must be an even"):
        rope_forward(x, pos, rotary_dim=3)
    with pytest.raises(ValueError, match="rotary_dim must be at most"):
        rope_forward(x, pos, rotary_dim=8)
    with pytest.raises(ValueError, match="positions must be an integer"):
        rope_forward(x, pos.astype(float))
    with pytest.raises(ValueError, match="positions must be an integer"):
        rope_forward(x, pos > 1)
    with pytest.raises(ValueError, match="non-negative"):
        rope_forward(x, pos - 2)
    with pytest.raises(ValueError, match=r"shape \[L\] = \(4,\)"):
        rope_forward(x, np.arange(5))
    with pytest.raises(ValueError, match="layout must be one of"):
        rope_forward(x, pos, layout="neox")
    with pytest.raises(ValueError, match="base must be a positive"):
        rope_forward(x, pos, base=0.0)
    with pytest.raises(ValueError, match="at least 2 axes"):
        rope_forward(np.zeros(6), np.arange(1))
    with pytest.raises(TypeError, match="floating-point"):
        rope_forward(np.zeros((4, 6), dtype=int), pos)
    y, cache = rope_forward(x, pos)
    with pytest.raises(ValueError, match="dy must have shape"):
        rope_backward(y[0], cache)
    with pytest.raises(ValueError, match="source must be one of"):
        rope_permutation(4, source="x")
    with pytest.raises(ValueError, match="d_k must be even"):
        rope_permutation(5)
    with pytest.raises(ValueError, match=r"cos must be \[L, r/2\]"):
        rotate_pairs(x, cache.cos[:3], cache.sin[:3])
    with pytest.raises(ValueError, match="sin must have the shape"):
        rotate_pairs(x, cache.cos, cache.sin[:, :1])


def test_rotate_pairs_by_a_quarter_turn():
    x = np.array([[1.0, 2.0, 3.0, 4.0, 5.0]])  # [L=1, d=5], r = 4
    one, zero = np.ones((1, 2)), np.zeros((1, 2))
    half = rotate_pairs(x, zero, one, layout="half")
    assert half.tolist() == [[-3.0, -4.0, 1.0, 2.0, 5.0]]
    inter = rotate_pairs(x, zero, one, layout="interleaved")
    assert inter.tolist() == [[-2.0, 1.0, -4.0, 3.0, 5.0]]


# ================================================================ layers
def rope_layer(n_kv=2, layout="half", rope_dim=None, d_k=6, seed=0):
    return GroupedQueryAttention(
        12,
        4,
        n_kv,
        d_k=d_k,
        d_v=5,
        seed=seed,
        rope_base=100.0,  # a small base: every pair turns visibly
        rope_layout=layout,
        rope_dim=rope_dim,
    )


@pytest.mark.parametrize(
    "n_kv, layout, rope_dim",
    [
        (4, "half", None),
        (2, "interleaved", None),
        (1, "half", 4),
        (2, "interleaved", 2),
    ],
)
def test_layer_gradients_with_rope(n_kv, layout, rope_dim):
    layer = rope_layer(n_kv, layout, rope_dim)
    x = np.random.default_rng(5).standard_normal((2, 5, 12))
    errors = check_layer_gradients(layer, x, causal=True)
    assert set(errors) == {"x", "W_q", "W_k", "W_v", "W_o"}
    assert max(errors.values()) < TOLERANCE, errors


def test_layer_gradients_unbatched_with_mask():
    layer = rope_layer(2, "interleaved")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 12))
    mask = rng.random((4, 4)) < 0.7
    errors = check_layer_gradients(layer, x, mask=mask)
    assert max(errors.values()) < TOLERANCE, errors


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_prefill_plus_decode_equals_full_forward(layout, n_kv):
    layer = rope_layer(n_kv, layout, d_k=8)
    x = np.random.default_rng(7).standard_normal((2, 9, 12))
    full = layer.forward(x, causal=True)
    cache = KVCache(initial_capacity=2)
    parts = [layer.forward(x[:, :4], kv_cache=cache)]  # prefill 4
    parts.append(layer.forward(x[:, 4:6], kv_cache=cache))  # a chunk of 2
    for t in range(6, 9):  # then one token at a time
        parts.append(layer.forward(x[:, t : t + 1], kv_cache=cache))
    assert rel_error(np.concatenate(parts, axis=1), full) < 1e-12
    # the cache holds the keys after their rotation
    k = x @ layer.params["W_k"]  # [B, L, n_kv*d_k]
    k = k.reshape(2, 9, n_kv, 8).transpose(0, 2, 1, 3)
    want = rope(k, np.arange(9), base=100.0, layout=layout)
    assert rel_error(cache.keys, want) < 1e-12


def test_shifting_every_position_changes_nothing():
    """Relative positions: the same chunk, 7 positions later, attends the
    same way when it cannot see what came before."""
    layer = rope_layer(2, "half", d_k=8)
    rng = np.random.default_rng(8)
    prefix, x = rng.standard_normal((7, 12)), rng.standard_normal((5, 12))
    fresh = layer.forward(x, causal=True)
    cache = KVCache()
    layer.forward(prefix, kv_cache=cache)
    hide_prefix = np.arange(12)[None, :] >= 7  # [1, L_k]: keys 7 ... 11
    later = layer.forward(x, kv_cache=cache, mask=hide_prefix)
    assert rel_error(later, fresh) < 1e-12
    norope = GroupedQueryAttention(12, 4, 2, d_k=8, d_v=5, seed=0)
    assert rel_error(norope.forward(x, causal=True), fresh) > 1e-3


@pytest.mark.parametrize("rope_dim", [None, 4])
def test_layer_layout_permutation_equivalence(rope_dim):
    """Interleaved weights, permuted, run in the half layout: same output."""
    inter = rope_layer(2, "interleaved", rope_dim, d_k=8, seed=3)
    half = rope_layer(2, "half", rope_dim, d_k=8, seed=4)
    for name in ("W_v", "W_o"):
        half.params[name] = inter.params[name].copy()
    for name, heads in (("W_q", 4), ("W_k", 2)):
        perm = rope_permutation(8, n_heads=heads, rotary_dim=rope_dim)
        half.params[name] = inter.params[name][:, perm]
    x = np.random.default_rng(9).standard_normal((2, 6, 12))
    want = inter.forward(x, causal=True)
    assert rel_error(half.forward(x, causal=True), want) < 1e-14
    # and unpermuted weights in the wrong layout give another layer
    wrong = rope_layer(2, "half", rope_dim, d_k=8, seed=3)
    got = wrong.forward(x, causal=True)
    assert rel_error(got[:, 0], want[:, 0]) < 1e-14  # position 0: same
    assert rel_error(got, want) > 1e-3


def test_mha_and_mqa_take_rope():
    x = np.random.default_rng(10).standard_normal((3, 8))
    kw = dict(seed=1, rope_base=10.0, rope_layout="interleaved")
    mha = MultiHeadAttention(8, 2, **kw)
    gqa = GroupedQueryAttention(8, 2, 2, **kw)
    np.testing.assert_array_equal(mha.forward(x), gqa.forward(x))
    mqa = MultiQueryAttention(8, 2, **kw)
    gqa1 = GroupedQueryAttention(8, 2, 1, **kw)
    np.testing.assert_array_equal(mqa.forward(x), gqa1.forward(x))
    assert "rope_base=10" in repr(mqa)
    assert "rope" not in repr(MultiHeadAttention(8, 2))


def test_conversion_keeps_rope():
    mha = MultiHeadAttention(8, 4, seed=2, rope_base=50.0, rope_dim=2)
    gqa = mha_to_gqa(mha, 4)
    x = np.random.default_rng(11).standard_normal((5, 8))
    assert rel_error(gqa.forward(x), mha.forward(x)) < 1e-14
    assert (gqa.rope_base, gqa.rope_dim) == (50.0, 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rope_base=10.0, d_k=5), "d_k must be even"),
        (dict(rope_base=10.0, rope_dim=3), "rope_dim"),
        (dict(rope_base=10.0, rope_dim=8), "rope_dim"),
        (dict(rope_base=-1.0), "rope_base must be a positive"),
        (dict(rope_layout="neox"), "rope_layout must be one of"),
        (dict(rope_dim=2), "needs rope_base"),
    ],
)
def test_layer_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GroupedQueryAttention(8, 2, 1, **kwargs)


# ============================================================ transformer
def test_transformer_with_rope_gradients():
    model = Transformer(
        vocab_size=7,
        d_model=8,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=12,
        max_len=6,
        seed=1,
        positions="rope",
        rope_base=100.0,
    )
    assert model.positions is None
    assert all(b.attn.rope_base == 100.0 for b in model.blocks)
    ids = np.array([[0, 3, 6, 3, 1], [5, 5, 2, 0, 4]])
    errors = check_layer_gradients(model, ids, seed=2)
    assert max(errors.values()) < TOLERANCE, errors


def test_transformer_positions_choice():
    kw = dict(
        vocab_size=7,
        d_model=8,
        n_layers=1,
        n_heads=2,
        n_kv_heads=2,
        d_ff=8,
        max_len=4,
        seed=0,
    )
    ids = np.array([[1, 2, 1, 2]])
    sin, rot, none = (
        Transformer(**kw, positions=p).forward(ids)
        for p in ("sinusoidal", "rope", "none")
    )
    # the same weights; only the position code differs
    assert rel_error(sin, rot) > 1e-3 and rel_error(rot, none) > 1e-3
    # at position 0 RoPE is the identity: the first logits equal "none"'s
    assert rel_error(rot[:, 0], none[:, 0]) < 1e-14
    with pytest.raises(ValueError, match="positions must be one of"):
        Transformer(**kw, positions="alibi")


def test_a_batch_of_positions_turns_as_rope_forward_does():
    """A few positions (a batch's rows, one per sequence) take the kept
    tables of :func:`position_tables`: bit for bit rope_forward's."""
    rng = np.random.default_rng(3)
    rot = Rotary(base=10000.0, layout="interleaved", rotary_dim=6)
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal((2, 3, 5, 8)).astype(dtype)  # [..., L, d]
        pos = np.array([7, 0, 130, 7, 64])
        y, saved = rot.forward(x, pos)
        ref, ref_saved = rope_forward(
            x, pos, base=10000.0, layout="interleaved", rotary_dim=6
        )
        assert y.dtype == dtype and np.array_equal(y, ref)
        assert np.array_equal(saved.cos, ref_saved.cos)
        dy = rng.standard_normal(x.shape).astype(dtype)
        assert np.array_equal(
            rot.backward(dy, saved), rope_backward(dy, ref_saved)
        )
    # a negative position, or more than are kept: rope_forward decides
    with pytest.raises(ValueError, match="non-negative"):
        rot.forward(x, np.array([1, -1, 2, 3, 4]))
    long = rng.standard_normal((1, KEPT_POSITIONS + 1, 8))
    pos = np.arange(KEPT_POSITIONS + 1)
    assert np.array_equal(
        rot.forward(long, pos)[0],
        rope_forward(long, pos, layout="interleaved", rotary_dim=6)[0],
    )
