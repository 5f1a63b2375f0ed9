"""softmax_forward / softmax_backward: values, masks, stability, gradients and input checks."""

import importlib
import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_np import (
    TOLERANCE,
    check_gradients,
    rel_error,
    softmax,
    softmax_backward,
    softmax_forward,
)

NUMPY_BROADCAST_MESSAGE = "could not be broadcast"


# --------------------------------------------------------------------------- strategies
@st.composite
def softmax_cases(draw, with_mask=True):
    """A logits array of 1 to 3 axes, an axis, and (maybe) a mask with some fully masked rows."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.normal(scale=2.0, size=shape)
    mask = None
    if with_mask and draw(st.booleans()):
        # the mask may omit leading axes or have size-1 axes: it only has to broadcast to x
        n_drop = draw(st.integers(0, len(shape) - 1))
        mshape = tuple(
            1 if draw(st.booleans()) else n for n in shape[n_drop:]
        )
        mask = rng.random(mshape) < 0.7
        if draw(
            st.booleans()
        ):  # force at least one fully masked row along the softmax axis
            full = np.broadcast_to(mask, shape).copy()
            idx = [slice(None)] * len(shape)
            for ax in range(len(shape)):
                if ax != axis % len(shape):
                    idx[ax] = 0
            full[tuple(idx)] = False
            mask = full
    return x, axis, mask


def naive_softmax(x, axis, mask=None):
    """Reference: one row at a time, in Python floats, over the allowed entries only."""
    x = np.asarray(x, dtype=np.float64)
    allowed = (
        np.ones(x.shape, bool)
        if mask is None
        else np.broadcast_to(mask, x.shape)
    )
    x, allowed = np.moveaxis(x, axis, -1), np.moveaxis(allowed, axis, -1)
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row, ok = x[idx], allowed[idx]
        if not ok.any():
            continue
        m = max(float(v) for v, a in zip(row, ok) if a)
        e = [math.exp(float(v) - m) if a else 0.0 for v, a in zip(row, ok)]
        total = sum(e)
        out[idx] = [val / total for val in e]
    return np.moveaxis(out, -1, axis)


# --------------------------------------------------------------------------- values
@given(softmax_cases())
def test_softmax_matches_naive_reference(case):
    x, axis, mask = case
    p = softmax(x, axis=axis, mask=mask)
    np.testing.assert_allclose(
        p, naive_softmax(x, axis, mask), rtol=1e-12, atol=1e-15
    )


@given(softmax_cases())
def test_rows_sum_to_one_or_zero_when_fully_masked(case):
    x, axis, mask = case
    p = softmax(x, axis=axis, mask=mask)
    sums = p.sum(axis=axis)
    if mask is None:
        np.testing.assert_allclose(sums, 1.0, rtol=1e-12)
    else:
        any_allowed = np.broadcast_to(mask, x.shape).any(axis=axis)
        np.testing.assert_allclose(
            sums, np.where(any_allowed, 1.0, 0.0), rtol=1e-12, atol=0
        )
        assert np.all(
            p[~np.broadcast_to(mask, x.shape)] == 0.0
        )  # masked entries: exactly 0


def test_shift_invariance():
    x = np.random.default_rng(0).standard_normal((4, 6))
    np.testing.assert_allclose(softmax(x), softmax(x + 123.5), rtol=1e-12)
    np.testing.assert_allclose(softmax(x), softmax(x - 1e6), rtol=1e-9)


def test_known_values():
    p = softmax(np.log(np.array([[1.0, 2.0, 5.0]])))
    np.testing.assert_allclose(p, [[0.125, 0.25, 0.625]], rtol=1e-14)
    p = softmax(
        np.array([[0.0, 0.0, 0.0, 0.0]]),
        mask=np.array([[True, False, True, False]]),
    )
    np.testing.assert_array_equal(p, [[0.5, 0.0, 0.5, 0.0]])


def test_mask_ignores_masked_logits_even_when_infinite():
    x = np.array([[np.inf, 1.0, 2.0], [np.nan, 0.0, 0.0]])
    mask = np.array([[False, True, True], [False, True, True]])
    p = softmax(x, mask=mask)
    np.testing.assert_allclose(
        p[0],
        naive_softmax(
            np.array([0.0, 1.0, 2.0]), -1, np.array([False, True, True])
        ),
    )
    np.testing.assert_array_equal(p[1], [0.0, 0.5, 0.5])


# --------------------------------------------------------------------------- gradients
@given(softmax_cases())
def test_gradient_check(case):
    x, axis, mask = case
    errors = check_gradients(
        softmax_forward,
        softmax_backward,
        {"x": x},
        seed=1,
        axis=axis,
        mask=mask,
    )
    assert errors["x"] < TOLERANCE, errors


@given(softmax_cases(with_mask=False))
def test_backward_is_the_jacobian_transpose_product(case):
    """dx = J^T dp with the explicit Jacobian J = diag(p) - p p^T of every row."""
    x, axis, _ = case
    p, cache = softmax_forward(x, axis=axis)
    dp = np.random.default_rng(2).standard_normal(x.shape)
    dx = softmax_backward(dp, cache)
    pr, dpr, dxr = (np.moveaxis(a, axis, -1) for a in (p, dp, dx))
    for idx in np.ndindex(pr.shape[:-1]):
        J = np.diag(pr[idx]) - np.outer(
            pr[idx], pr[idx]
        )  # J[i, j] = dp_i / dx_j
        np.testing.assert_allclose(
            dxr[idx], J.T @ dpr[idx], rtol=1e-10, atol=1e-14
        )


def test_gradient_rows_sum_to_zero():
    """Adding a constant to a row changes nothing, so the gradient has no component along it."""
    x = np.random.default_rng(3).standard_normal((5, 7))
    p, cache = softmax_forward(x)
    dx = softmax_backward(
        np.random.default_rng(4).standard_normal(x.shape), cache
    )
    np.testing.assert_allclose(dx.sum(axis=-1), 0.0, atol=1e-15)


def test_fully_masked_row_gives_zero_output_and_zero_gradient():
    x = np.random.default_rng(5).standard_normal((3, 4))
    mask = np.ones((3, 4), bool)
    mask[1] = False
    mask[2, :2] = False
    p, cache = softmax_forward(x, mask=mask)
    dx = softmax_backward(
        np.random.default_rng(6).standard_normal(x.shape), cache
    )
    assert np.all(p[1] == 0.0) and np.all(dx[1] == 0.0)
    assert np.all(p[2, :2] == 0.0) and np.all(dx[2, :2] == 0.0)
    assert np.all(np.isfinite(p)) and np.all(np.isfinite(dx))


# --------------------------------------------------------------------------- stability
@pytest.mark.parametrize("masked", [False, True])
def test_huge_logits_give_finite_values_and_gradients_without_warnings(
    masked,
):
    x = np.array(
        [
            [1e4, -1e4, 0.0, 1e4 - 1.0],
            [-1e4, -1e4, -1e4, -1e4],
            [1e4, 1e4, 1e4, 1e4],
        ]
    )
    mask = (
        np.array(
            [
                [True, True, True, True],
                [False, False, False, False],
                [True, True, False, True],
            ]
        )
        if masked
        else None
    )
    with warnings.catch_warnings():
        warnings.simplefilter(
            "error"
        )  # any overflow, 0/0 or inf-inf would raise here
        p, cache = softmax_forward(x, mask=mask)
        dx = softmax_backward(
            np.random.default_rng(7).standard_normal(x.shape), cache
        )
    assert np.all(np.isfinite(p)) and np.all(np.isfinite(dx))
    np.testing.assert_allclose(
        p[0],
        [
            1 / (1 + math.exp(-1)),
            0.0,
            0.0,
            math.exp(-1) / (1 + math.exp(-1)),
        ],
    )
    if masked:
        np.testing.assert_array_equal(p[1], 0.0)
        np.testing.assert_allclose(p[2], [1 / 3, 1 / 3, 0.0, 1 / 3])
    else:
        np.testing.assert_allclose(p[1], 0.25)
        np.testing.assert_allclose(p[2], 0.25)


def test_the_naive_formula_would_overflow():
    """The stability test above can fail: without the max shift, exp(1e4) is inf and inf/inf is NaN."""
    x = np.array([1e4, 0.0])
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.exp(x) / np.exp(x).sum()
    assert np.isnan(naive[0])
    np.testing.assert_allclose(softmax(x), [1.0, 0.0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_is_preserved(dtype):
    x = np.random.default_rng(8).standard_normal((3, 5)).astype(dtype)
    mask = np.random.default_rng(9).random((3, 5)) < 0.6
    p, cache = softmax_forward(x, mask=mask)
    dx = softmax_backward(np.ones_like(x), cache)
    assert p.dtype == dtype and dx.dtype == dtype


# --------------------------------------------------------------------------- input checks
def _raises(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kwargs)
    assert NUMPY_BROADCAST_MESSAGE not in str(info.value)
    return info


def test_integer_logits_are_refused():
    _raises(
        TypeError,
        r"x must be a floating-point array .* got dtype int",
        softmax,
        np.arange(4),
    )


def test_scalar_logits_are_refused():
    _raises(
        ValueError,
        r"x must have at least 1 axes, got shape \(\)",
        softmax,
        np.float64(1.0),
    )


def test_non_boolean_mask_is_refused():
    _raises(
        TypeError,
        r"mask must be a boolean array .* got dtype float64",
        softmax,
        np.zeros((2, 3)),
        mask=np.ones((2, 3)),
    )


@pytest.mark.parametrize("mshape", [(2, 4), (3, 2, 3)])
def test_mask_that_does_not_broadcast_to_x_is_refused(mshape):
    shape_text = re_shape(mshape)
    _raises(
        ValueError,
        rf"mask.*{shape_text}",
        softmax,
        np.zeros((2, 3)),
        mask=np.ones(mshape, bool),
    )


@pytest.mark.parametrize("axis", [2, -3, 1.0])
def test_bad_axis_is_refused(axis):
    _raises(
        ValueError,
        r"axis must be an integer in \[-2, 2\)",
        softmax,
        np.zeros((2, 3)),
        axis=axis,
    )


def test_wrong_upstream_gradient_shape_is_refused():
    _, cache = softmax_forward(np.zeros((2, 3)))
    _raises(
        ValueError,
        r"dp must have shape \(2, 3\) .* got \(3,\)",
        softmax_backward,
        np.zeros(3),
        cache,
    )
    _raises(
        TypeError,
        r"dp must be a floating-point array",
        softmax_backward,
        np.zeros((2, 3), int),
        cache,
    )


def re_shape(shape):
    """The regex for a shape tuple as Python prints it."""
    return (
        "\\("
        + ", ".join(str(n) for n in shape)
        + ("," if len(shape) == 1 else "")
        + "\\)"
    )


def test_rel_error_of_the_gradient_check_detects_a_wrong_backward():
    """The gradient check itself can fail: a backward without the '- sum(p * dp)' term is caught."""
    x = np.random.default_rng(10).standard_normal((3, 4))

    def wrong_backward(dp, cache):
        return cache.p * dp

    errors = check_gradients(
        softmax_forward, wrong_backward, {"x": x}, seed=1
    )
    assert errors["x"] > 1e-3
    assert rel_error(np.ones(3), np.ones(3)) == 0.0


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_softmax_refuses_non_finite_logits_that_take_part(bad):
    x = np.zeros((2, 3))
    x[0, 1] = bad
    with pytest.raises(
        ValueError, match=r"x must be finite.*shape \(2, 3\)"
    ):
        softmax(x)
    mask = np.ones((2, 3), dtype=bool)
    mask[0, 1] = False  # the bad entry is excluded: fine
    p = softmax(x, mask=mask)
    assert np.all(np.isfinite(p)) and p[0, 1] == 0.0


@given(
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    data=st.data(),
)
def test_row_max_is_np_max(shape, data):
    # row_max takes short rows column by column: the same numbers as np.max, NaN and -inf included
    row_max = importlib.import_module("attn_np.softmax").row_max
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal(shape).astype(
        data.draw(st.sampled_from([np.float32, np.float64]))
    )
    x[rng.random(shape) < 0.3] = -np.inf
    x[rng.random(shape) < 0.02] = np.nan
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    got, want = row_max(x, axis), np.max(x, axis=axis, keepdims=True)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
