"""rope_forward / rope_backward: values, relative positions, layouts, errors.

The layer-level tests (GroupedQueryAttention with ``rope_base``) live at
the end of this file.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_np import TOLERANCE, check_gradients, rel_error
from attn_np.rope import (
    rope,
    rope_backward,
    rope_forward,
    rope_frequencies,
    rope_permutation,
)

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
