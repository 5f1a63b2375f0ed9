"""Chapter 5 pieces: embedding, positions, linear, RMSNorm, GELU, feed-forward, cross-entropy, Adam.

Gradient checks follow the book's standard: float64, central differences, a random upstream
gradient, relative error below 1e-7 for every input and parameter.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_np.instruments.gradcheck import (
    TOLERANCE,
    check_gradients,
    check_layer_gradients,
    numerical_gradient,
    rel_error,
)
from attn_np.training.layers import (
    Embedding,
    FeedForward,
    Linear,
    RMSNorm,
    embedding_backward,
    embedding_forward,
    gelu_backward,
    gelu_forward,
    linear_backward,
    linear_forward,
    rmsnorm_backward,
    rmsnorm_forward,
    sinusoidal_positions,
)
from attn_np.training.losses import (
    accuracy,
    cross_entropy_backward,
    cross_entropy_forward,
)
from attn_np.training.optim import Adam, clip_grad_norm


def assert_all_ok(errors):
    bad = {k: v for k, v in errors.items() if not v < TOLERANCE}
    assert not bad, f"gradient check failed: {bad}"


# ------------------------------------------------------------------------------ gradient checks
def test_linear_gradients():
    rng = np.random.default_rng(0)
    inputs = {
        "x": rng.standard_normal((2, 3, 4)),
        "W": rng.standard_normal((4, 5)),
        "b": rng.standard_normal(5),
    }
    assert_all_ok(
        check_gradients(linear_forward, linear_backward, inputs, seed=1)
    )


@given(
    B=st.integers(1, 3),
    L=st.integers(1, 4),
    d=st.integers(2, 6),
    scale=st.sampled_from([0.1, 1.0, 30.0]),
)
@settings(max_examples=20, deadline=None)
def test_rmsnorm_gradients(B, L, d, scale):
    # d >= 2: with d = 1 the output is g * sign(x) and its tiny derivative drowns in finite-difference noise
    rng = np.random.default_rng(B * 100 + L * 10 + d)
    inputs = {
        "x": scale * rng.standard_normal((B, L, d)),
        "g": rng.standard_normal(d),
    }
    assert_all_ok(
        check_gradients(rmsnorm_forward, rmsnorm_backward, inputs, seed=2)
    )


def test_gelu_gradients():
    x = (
        np.linspace(-6, 6, 37).reshape(37, 1)
        + np.random.default_rng(3).standard_normal((37, 3)) * 0.1
    )
    assert_all_ok(
        check_gradients(gelu_forward, gelu_backward, {"x": x}, seed=3)
    )


def test_embedding_gradient_with_repeated_tokens():
    rng = np.random.default_rng(4)
    ids = np.array(
        [[1, 3, 1, 0], [3, 3, 2, 1]]
    )  # repeats must add up; token 4 never appears
    W = rng.standard_normal((5, 3))
    y, cache = embedding_forward(ids, W)
    dy = rng.standard_normal(y.shape)
    num = numerical_gradient(lambda: embedding_forward(ids, W)[0], W, dy)
    dW = embedding_backward(dy, cache)
    assert rel_error(dW, num) < TOLERANCE
    assert np.all(dW[4] == 0)


@pytest.mark.parametrize(
    "layer, x",
    [
        (
            Linear(4, 3, seed=1),
            np.random.default_rng(5).standard_normal((2, 3, 4)),
        ),
        (RMSNorm(4), np.random.default_rng(6).standard_normal((2, 3, 4))),
        (
            FeedForward(4, 7, seed=2),
            np.random.default_rng(7).standard_normal((2, 3, 4)),
        ),
        (Embedding(6, 4, seed=3), np.array([[0, 5, 5], [2, 1, 0]])),
    ],
    ids=["Linear", "RMSNorm", "FeedForward", "Embedding"],
)
def test_layer_shells_gradients(layer, x):
    if isinstance(
        layer, RMSNorm
    ):  # a gain of ones hides errors that a random gain exposes
        layer.params["g"][:] = np.random.default_rng(8).standard_normal(4)
    errors = check_layer_gradients(layer, x, seed=9)
    expected = set(layer.params) | ({"x"} if x.dtype.kind == "f" else set())
    assert set(errors) == expected
    assert_all_ok(errors)


def test_cross_entropy_gradient_with_mask():
    rng = np.random.default_rng(10)
    z = rng.standard_normal((2, 3, 5)) * 3
    t = rng.integers(5, size=(2, 3))
    m = np.array([[True, False, True], [False, True, True]])
    loss, cache = cross_entropy_forward(z, t, mask=m)
    dloss = 0.7  # a non-unit upstream gradient
    num = numerical_gradient(
        lambda: np.asarray(cross_entropy_forward(z, t, mask=m)[0]),
        z,
        np.asarray(dloss),
    )
    dz = cross_entropy_backward(dloss, cache)
    assert rel_error(dz, num) < TOLERANCE
    assert np.all(dz[~m] == 0)


@given(
    shape=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    V=st.integers(2, 6),
    seed=st.integers(0, 10**6),
)
@settings(max_examples=25, deadline=None)
def test_cross_entropy_gradient_any_shape_and_mask(shape, V, seed):
    rng = np.random.default_rng(seed)
    z = 4 * rng.standard_normal((*shape, V))
    t = rng.integers(V, size=shape)
    m = rng.random(shape) < 0.6
    m.flat[0] = True  # at least one counted position
    dloss = rng.standard_normal()
    _, cache = cross_entropy_forward(z, t, mask=m)
    num = numerical_gradient(
        lambda: np.asarray(cross_entropy_forward(z, t, mask=m)[0]),
        z,
        np.asarray(dloss),
    )
    assert rel_error(cross_entropy_backward(dloss, cache), num) < TOLERANCE


# ------------------------------------------------------------------------------ forward values
def test_rmsnorm_output_has_unit_rms():
    x = np.random.default_rng(11).standard_normal((3, 8)) * 50
    y, _ = rmsnorm_forward(x, np.ones(8), eps=0.0)
    np.testing.assert_allclose(
        np.sqrt(np.mean(y**2, axis=-1)), 1.0, rtol=1e-12
    )


def test_gelu_matches_its_limits():
    y, _ = gelu_forward(np.array([-20.0, 0.0, 20.0]))
    np.testing.assert_allclose(y, [0.0, 0.0, 20.0], atol=1e-12)


def test_sinusoidal_positions():
    P = sinusoidal_positions(50, 7)
    assert P.shape == (50, 7)
    np.testing.assert_allclose(
        P[0], [0, 1, 0, 1, 0, 1, 0]
    )  # sin 0, cos 0, ...
    np.testing.assert_allclose(
        P[:, 0], np.sin(np.arange(50))
    )  # the fastest pair has frequency 1
    np.testing.assert_allclose(P[:, 2] ** 2 + P[:, 3] ** 2, 1.0)
    assert (
        len({tuple(np.round(r, 6)) for r in P}) == 50
    )  # every position gets its own code


def test_cross_entropy_value_and_stability():
    z = np.array([[1.0, 2.0, 3.0], [1e4, 0.0, -1e4]])
    t = np.array([2, 1])
    loss, cache = cross_entropy_forward(z, t)
    logp0 = 3.0 - np.log(np.exp(1.0) + np.exp(2.0) + np.exp(3.0))
    assert loss == pytest.approx(
        (-logp0 + 1e4) / 2, rel=1e-12
    )  # row 2: -log p = 1e4 exactly
    assert np.all(np.isfinite(cross_entropy_backward(1.0, cache)))


def test_cross_entropy_ignores_unmasked_targets():
    rng = np.random.default_rng(12)
    z = rng.standard_normal((4, 6))
    m = np.array([True, False, True, False])
    t1, t2 = np.array([1, 2, 3, 4]), np.array([1, 5, 3, 0])
    assert (
        cross_entropy_forward(z, t1, mask=m)[0]
        == cross_entropy_forward(z, t2, mask=m)[0]
    )
    assert accuracy(np.eye(4, 6) * 5, np.array([0, 1, 0, 0]), mask=m) == 0.5


# ------------------------------------------------------------------------------------- errors
def test_embedding_rejects_out_of_range_and_float_ids():
    emb = Embedding(5, 3)
    with pytest.raises(
        ValueError, match=r"ids must lie in \[0, vocab_size\) = \[0, 5\).*5"
    ):
        emb.forward(np.array([[0, 5]]))
    with pytest.raises(ValueError, match="ids must lie"):
        emb.forward(np.array([-1]))
    with pytest.raises(TypeError, match="integer array"):
        emb.forward(np.array([0.0, 1.0]))


def test_cross_entropy_rejects_bad_targets():
    z = np.zeros((2, 3, 5))
    with pytest.raises(
        ValueError,
        match=r"targets must have the shape of logits.*\(2, 3\).*\(3, 2\)",
    ):
        cross_entropy_forward(z, np.zeros((3, 2), dtype=int))
    with pytest.raises(
        ValueError, match=r"targets must lie in \[0, vocab_size\) = \[0, 5\)"
    ):
        cross_entropy_forward(z, np.full((2, 3), 5))
    with pytest.raises(
        ValueError, match="mask must have the shape of targets"
    ):
        cross_entropy_forward(
            z, np.zeros((2, 3), dtype=int), mask=np.ones((2, 1), dtype=bool)
        )
    with pytest.raises(ValueError, match="mask selects no position"):
        cross_entropy_forward(
            z, np.zeros((2, 3), dtype=int), mask=np.zeros((2, 3), dtype=bool)
        )


def test_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"x \(2, 3\), W \(4, 5\)"):
        linear_forward(np.zeros((2, 3)), np.zeros((4, 5)), np.zeros(5))
    with pytest.raises(ValueError, match=r"g must have shape \(4,\)"):
        rmsnorm_forward(np.zeros((2, 4)), np.ones(3))
    _, cache = gelu_forward(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"dy must have shape \(2, 3\)"):
        gelu_backward(np.zeros((3, 2)), cache)


# --------------------------------------------------------------------------------------- Adam
def test_adam_first_step_is_lr_times_sign():
    # With bias correction, m^ = g and v^ = g^2 at t = 1, so the step is lr * g / (|g| + eps).
    w = np.array([1.0, -2.0, 3.0, 0.5])
    g = np.array([0.3, -1e-3, 40.0, -7.0])
    opt = Adam({"w": w}, lr=0.1)
    opt.step({"w": g})
    np.testing.assert_allclose(w, [0.9, -1.9, 2.9, 0.6], rtol=1e-6)


def test_adam_matches_the_paper_loop():
    rng = np.random.default_rng(13)
    w = rng.standard_normal(5)
    w_ref, m, v = w.copy(), np.zeros(5), np.zeros(5)
    opt = Adam({"w": w}, lr=0.01, betas=(0.8, 0.95), eps=1e-6)
    for t in range(1, 8):
        g = rng.standard_normal(5)
        opt.step({"w": g.copy()})
        m = 0.8 * m + 0.2 * g
        v = 0.95 * v + 0.05 * g * g
        w_ref = w_ref - 0.01 * (m / (1 - 0.8**t)) / (
            np.sqrt(v / (1 - 0.95**t)) + 1e-6
        )
    np.testing.assert_allclose(w, w_ref, rtol=1e-12)


def test_adam_step_is_bit_identical_to_one_parameter_at_a_time():
    # Adam.step updates each dtype's parameters as one vector: the same elementwise arithmetic as the
    # per-parameter loop, so the same bits, for float32 and float64 parameters side by side.
    rng = np.random.default_rng(5)
    shapes = {"a": (3, 4), "b": (7,), "c": (2, 1, 3), "d": (5,)}
    dtypes = {
        "a": np.float32,
        "b": np.float64,
        "c": np.float32,
        "d": np.float64,
    }
    params = {
        k: rng.standard_normal(s).astype(dtypes[k])
        for k, s in shapes.items()
    }
    ref = {k: p.copy() for k, p in params.items()}
    m = {k: np.zeros_like(p) for k, p in ref.items()}
    v = {k: np.zeros_like(p) for k, p in ref.items()}
    opt = Adam(params, lr=0.01, betas=(0.8, 0.95), eps=1e-6)
    for t in range(1, 6):
        grads = {
            k: rng.standard_normal(s).astype(dtypes[k])
            for k, s in shapes.items()
        }
        lr = 0.01 * t
        opt.step(grads, lr=lr)
        c1, c2 = 1.0 - 0.8**t, 1.0 - 0.95**t
        for k, w in ref.items():
            g = grads[k]
            m[k] *= 0.8
            m[k] += (1 - 0.8) * g
            v[k] *= 0.95
            v[k] += (1 - 0.95) * g * g
            w -= (lr / c1) * m[k] / (np.sqrt(v[k] / c2) + 1e-6)
        for k in shapes:
            assert params[k].dtype == ref[k].dtype
            assert params[k].tobytes() == ref[k].tobytes(), k
            assert opt.m[k].tobytes() == m[k].tobytes(), k
            assert opt.v[k].tobytes() == v[k].tobytes(), k


def test_adam_minimises_an_ill_conditioned_quadratic():
    w = np.array([3.0, -3.0])
    scales = np.array([100.0, 0.01])
    opt = Adam({"w": w}, lr=0.05)
    for _ in range(2000):
        opt.step({"w": scales * w})
    assert np.max(np.abs(w)) < 1e-2


def test_adam_rejects_mismatched_grads():
    opt = Adam({"a": np.zeros(2), "b": np.zeros(3)})
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        opt.step({"a": np.zeros(2)})
    with pytest.raises(ValueError, match=r"grads\['b'\] has shape \(2,\)"):
        opt.step({"a": np.zeros(2), "b": np.zeros(2)})


def test_clip_grad_norm():
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([[4.0]])}
    assert clip_grad_norm(grads, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(grads["a"], [0.6, 0.0])
    np.testing.assert_allclose(grads["b"], [[0.8]])
    assert clip_grad_norm(grads, 10.0) == pytest.approx(1.0)
    np.testing.assert_allclose(
        grads["b"], [[0.8]]
    )  # under the limit: untouched
