"""attn_np.multihead (chapter 2): gradients, an independent reference, bad input, costs, and a
subclass that adds a score mod and an output gate by overriding steps."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import SoftCap
from hypothesis import given
from hypothesis import strategies as st

from attn_np import (
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiQueryAttention,
    costs,
)
from attn_np.bench.mha import naive_mha_backward, naive_mha_forward
from attn_np.heads import flat, merge_groups, split_groups
from attn_np.instruments import measure_memory, measure_peak_bytes
from attn_np.instruments.gradcheck import TOLERANCE, check_layer_gradients

D_MODEL, N_HEADS, D_K, D_V = (
    8,
    2,
    3,
    5,
)  # d_k != d_v and h*d_k != d_model: every shape is distinct


def reference_mha(x, params, n_heads, mask=None):
    """Multi-head attention the textbook way: one head at a time, concatenate, then W_o.

    Written independently of attn_np: a Python loop over batch rows and heads, the row maximum
    subtracted inside the softmax, masked keys dropped by hand. ``mask`` is [L, L] or None.
    """
    W_q, W_k, W_v, W_o = (params[n] for n in ("W_q", "W_k", "W_v", "W_o"))
    d_k, d_v = W_q.shape[1] // n_heads, W_v.shape[1] // n_heads
    B, L, _ = x.shape
    ys, weights = [], []
    for b in range(B):
        heads, ws = [], []
        for i in range(n_heads):
            Q = x[b] @ W_q[:, i * d_k : (i + 1) * d_k]  # [L, d_k]
            K = x[b] @ W_k[:, i * d_k : (i + 1) * d_k]  # [L, d_k]
            V = x[b] @ W_v[:, i * d_v : (i + 1) * d_v]  # [L, d_v]
            S = Q @ K.T / np.sqrt(d_k)  # [L, L]
            P = np.zeros_like(S)
            for r in range(L):
                keep = np.ones(L, bool) if mask is None else mask[r]
                if keep.any():
                    e = np.exp(S[r, keep] - S[r, keep].max())
                    P[r, keep] = e / e.sum()
            heads.append(P @ V)  # [L, d_v]
            ws.append(P)
        ys.append(
            np.concatenate(heads, axis=1) @ W_o
        )  # Concat(head_1, ..., head_h) W^O: [L, d_model]
        weights.append(np.stack(ws))
    return np.stack(ys), np.stack(weights)  # [B, L, d_model], [B, h, L, L]


def random_mask(L, rng, empty_row=True):
    m = rng.random((L, L)) < 0.6
    m[np.arange(L), np.arange(L)] = True
    if empty_row:
        m[1] = (
            False  # a query with nothing to attend: defined as a zero output row
        )
    return m


@pytest.fixture
def layer():
    return MultiHeadAttention(D_MODEL, N_HEADS, d_k=D_K, d_v=D_V, seed=3)


# ------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize(
    "batched", [False, True], ids=["unbatched", "batched"]
)
@pytest.mark.parametrize(
    "masking", ["none", "causal", "mask", "causal+mask"]
)
def test_gradients_of_every_parameter_and_the_input(layer, batched, masking):
    rng = np.random.default_rng(11)
    L = 5
    x = rng.standard_normal((2, L, D_MODEL) if batched else (L, D_MODEL))
    kw = {}
    if "causal" in masking:
        kw["causal"] = True
    if "mask" in masking:
        kw["mask"] = random_mask(L, rng)
    errors = check_layer_gradients(layer, x, seed=5, **kw)
    assert set(errors) == {"x", "W_q", "W_k", "W_v", "W_o"}
    assert max(errors.values()) < TOLERANCE, errors


def test_gradients_with_a_per_head_mask(layer):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, D_MODEL))
    mask = (
        rng.random((2, N_HEADS, 4, 4)) < 0.5
    )  # different keys hidden for each row and head
    errors = check_layer_gradients(layer, x, seed=1, mask=mask)
    assert max(errors.values()) < TOLERANCE, errors


def test_gradient_check_catches_a_wrong_backward(layer, monkeypatch):
    """The check can fail: break the W_o gradient and it must notice."""
    x = np.random.default_rng(0).standard_normal((4, D_MODEL))
    original = MultiHeadAttention.backward

    def broken(self, dy):
        dx = original(self, dy)
        self.grads["W_o"] = self.grads["W_o"] * 1.001
        return dx

    monkeypatch.setattr(MultiHeadAttention, "backward", broken)
    errors = check_layer_gradients(layer, x, seed=0)
    assert errors["W_o"] > TOLERANCE and errors["x"] < TOLERANCE


# ------------------------------------------------------------------ independent reference
@pytest.mark.parametrize("masking", ["none", "causal", "mask"])
def test_matches_a_per_head_loop_with_concat_then_W_o(layer, masking):
    rng = np.random.default_rng(7)
    B, L = 3, 6
    x = rng.standard_normal((B, L, D_MODEL))
    mask = {
        "none": None,
        "causal": np.tril(np.ones((L, L), bool)),
        "mask": random_mask(L, rng),
    }[masking]
    y = layer.forward(
        x,
        causal=masking == "causal",
        mask=mask if masking == "mask" else None,
    )
    y_ref, w_ref = reference_mha(x, layer.params, N_HEADS, mask)
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=1e-12)
    assert layer.attention_weights.shape == (B, N_HEADS, L, L)
    np.testing.assert_allclose(
        layer.attention_weights, w_ref, rtol=0, atol=1e-12
    )


@given(
    B=st.integers(1, 3),
    L=st.integers(1, 7),
    h=st.integers(1, 4),
    d_k=st.integers(1, 5),
    d_v=st.integers(1, 5),
    d_model=st.integers(1, 9),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_any_shape_matches_the_reference_and_costs(
    B, L, h, d_k, d_v, d_model, causal, seed
):
    """Property: for any sizes, the layer is the per-head loop, and param_count counts its arrays."""
    layer = MultiHeadAttention(d_model, h, d_k=d_k, d_v=d_v, seed=seed)
    x = np.random.default_rng(seed).standard_normal((B, L, d_model))
    y = layer.forward(x, causal=causal)
    y_ref, w_ref = reference_mha(
        x,
        layer.params,
        h,
        np.tril(np.ones((L, L), bool)) if causal else None,
    )
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        layer.attention_weights, w_ref, rtol=0, atol=1e-12
    )
    assert costs.param_count(d_model, h, d_k=d_k, d_v=d_v) == layer.n_params
    dx = layer.backward(np.ones_like(y))
    assert dx.shape == x.shape and all(
        layer.grads[n].shape == p.shape for n, p in layer.params.items()
    )


def test_unbatched_is_the_batch_of_one(layer):
    x = np.random.default_rng(4).standard_normal((5, D_MODEL))
    y1 = layer.forward(x, causal=True)
    w1 = layer.attention_weights.copy()
    y2 = layer.forward(x[None], causal=True)
    assert y1.shape == (5, D_MODEL)
    np.testing.assert_array_equal(y1, y2[0])
    np.testing.assert_array_equal(
        w1, layer.attention_weights
    )  # always [B, h, L, L], B = 1 here


def test_heads_are_not_all_alike(layer):
    """Each head has its own projections, so its attention map differs from the others'."""
    x = np.random.default_rng(0).standard_normal((6, D_MODEL))
    layer.forward(x)
    w = layer.attention_weights[0]
    assert np.abs(w[0] - w[1]).max() > 0.05


def test_naive_benchmark_variant_computes_the_same(layer):
    """The benchmark's comparison must do the same work: same outputs and gradients."""
    rng = np.random.default_rng(9)
    x, dy = (
        rng.standard_normal((2, 5, D_MODEL)),
        rng.standard_normal((2, 5, D_MODEL)),
    )
    for causal in (False, True):
        y = layer.forward(x, causal=causal)
        dx = layer.backward(dy)
        y_n, cache = naive_mha_forward(
            x, layer.params, N_HEADS, causal=causal
        )
        dx_n, grads = naive_mha_backward(dy, cache)
        np.testing.assert_allclose(y_n, y, rtol=0, atol=1e-12)
        np.testing.assert_allclose(dx_n, dx, rtol=0, atol=1e-12)
        for name in layer.params:
            np.testing.assert_allclose(
                grads[name], layer.grads[name], rtol=0, atol=1e-12
            )


def test_float32_stays_float32():
    layer = MultiHeadAttention(16, 4, seed=0, dtype=np.float32)
    x = (
        np.random.default_rng(0)
        .standard_normal((2, 7, 16))
        .astype(np.float32)
    )
    y = layer.forward(x, causal=True)
    dx = layer.backward(np.ones_like(y))
    assert y.dtype == dx.dtype == layer.attention_weights.dtype == np.float32
    assert all(g.dtype == np.float32 for g in layer.grads.values())


def test_parameter_shapes_are_the_documents(layer):
    shapes = {name: p.shape for name, p in layer.params.items()}
    assert shapes == {
        "W_q": (D_MODEL, N_HEADS * D_K),
        "W_k": (D_MODEL, N_HEADS * D_K),
        "W_v": (D_MODEL, N_HEADS * D_V),
        "W_o": (N_HEADS * D_V, D_MODEL),
    }
    assert all(p.dtype == np.float64 for p in layer.params.values())
    assert set(layer.grads) == set(layer.params)


# -------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "shape, words",
    [
        ((5, D_MODEL + 1), "d_model=8"),
        ((2, 5, 3), "d_model=8"),
        ((D_MODEL,), "[L, d_model]"),
        ((1, 2, 5, D_MODEL), "[B, L, d_model]"),
    ],
    ids=["wrong width", "wrong width batched", "rank 1", "rank 4"],
)
def test_bad_x_raises_a_clear_value_error(layer, shape, words):
    with pytest.raises(ValueError, match=r"x must have shape") as info:
        layer.forward(np.zeros(shape))
    assert words in str(info.value) and str(shape) in str(info.value)


def test_n_heads_must_divide_d_model_when_d_k_is_not_given():
    with pytest.raises(
        ValueError,
        match=r"d_model must be divisible by n_heads.*d_model=10 and n_heads=4",
    ):
        MultiHeadAttention(10, 4)
    layer = MultiHeadAttention(
        10, 4, d_k=3, d_v=2
    )  # explicit head sizes: allowed
    assert layer.params["W_q"].shape == (10, 12) and layer.params[
        "W_o"
    ].shape == (8, 10)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_n_heads_must_be_a_positive_integer(bad):
    with pytest.raises(
        ValueError, match="n_heads must be a positive integer"
    ):
        MultiHeadAttention(8, bad)


def test_integer_x_is_a_type_error(layer):
    with pytest.raises(TypeError, match="x must be a floating-point array"):
        layer.forward(np.zeros((3, D_MODEL), dtype=int))


def test_dy_of_the_wrong_shape_raises(layer):
    layer.forward(np.zeros((2, 4, D_MODEL)))
    with pytest.raises(
        ValueError,
        match=r"dy must have the shape of the layer's output \(2, 4, 8\), got \(2, 4, 7\)",
    ):
        layer.backward(np.zeros((2, 4, 7)))
    with pytest.raises(ValueError, match="dy must have the shape"):
        layer.backward(
            np.zeros((4, D_MODEL))
        )  # unbatched dy for a batched forward


def test_backward_before_forward_raises(layer):
    with pytest.raises(
        RuntimeError, match="backward needs a preceding forward"
    ):
        layer.backward(np.zeros((4, D_MODEL)))


def test_mask_of_the_wrong_shape_raises(layer):
    with pytest.raises(
        ValueError, match=r"mask must broadcast to \[B, n_heads, L_q, L_k\]"
    ):
        layer.forward(np.zeros((2, 4, D_MODEL)), mask=np.ones((4, 5), bool))


# ------------------------------------------------------------------------------------ costs
def test_param_count_by_hand():
    assert (
        costs.param_count(512, 8) == 4 * 512 * 512 == 1_048_576
    )  # 2 d h d_k + 2 d h d_v with h d_k = d
    assert (
        costs.param_count(D_MODEL, N_HEADS, d_k=D_K, d_v=D_V)
        == 2 * 8 * 2 * 3 + 2 * 8 * 2 * 5
        == 256
    )
    # grouped-query: W_q and W_o keep h heads, W_k and W_v shrink to n_kv heads
    assert (
        costs.param_count(512, 8, n_kv_heads=2)
        == 512 * 512 * 2 + 2 * 512 * 2 * 64
        == 655_360
    )


@pytest.mark.parametrize(
    "h, n_kv, d_k, d_v",
    [(2, 2, 3, 5), (4, 4, None, None), (4, 2, 3, 2), (4, 1, 2, 6)],
)
def test_param_count_matches_the_layers(h, n_kv, d_k, d_v):
    layer = GroupedQueryAttention(8, h, n_kv, d_k=d_k, d_v=d_v)
    assert (
        costs.param_count(8, h, n_kv, d_k, d_v)
        == layer.n_params
        == sum(p.size for p in layer.params.values())
    )
    if n_kv == 1:
        assert (
            costs.param_count(8, h, 1, d_k, d_v)
            == MultiQueryAttention(8, h, d_k=d_k, d_v=d_v).n_params
        )


def test_flops_by_hand():
    # B=1, L=2048, d=512, h=8, d_k=d_v=64: four d x d projections and two attention products per head
    proj = 4 * 2 * 2048 * 512 * 512  # 4 294 967 296
    attn = 2 * (2 * 8 * 2048 * 2048 * 64)  # 8 589 934 592
    assert (
        costs.forward_flops(1, 2048, 512, 8) == proj + attn == 12_884_901_888
    )
    assert costs.backward_flops(1, 2048, 512, 8) == 2 * (proj + attn)
    assert costs.training_flops(1, 2048, 512, 8) == 3 * (proj + attn)
    # tiny case, every term written out: B=2, L=3, d=4, h=2, d_k=1, d_v=2
    B, L, d, h, dk, dv = 2, 3, 4, 2, 1, 2
    fwd = (
        2 * B * L * d * h * dk
        + 2 * B * L * d * h * (dk + dv)
        + 2 * B * h * L * L * (dk + dv)
        + 2 * B * L * h * dv * d
    )
    assert fwd == 96 + 288 + 216 + 192 == 792  # Q; K and V; QK^T and PV; W_o
    assert costs.forward_flops(B, L, d, h, d_k=dk, d_v=dv) == fwd
    assert costs.backward_flops(B, L, d, h, d_k=dk, d_v=dv) == 2 * fwd


def test_flops_grow_linearly_in_B_and_quadratically_in_L_at_long_L():
    f = lambda B, L: costs.forward_flops(B, L, 64, 4)  # noqa: E731
    assert f(3, 100) == 3 * f(1, 100)
    assert 3.9 < f(1, 200_000) / f(1, 100_000) <= 4


def test_activation_bytes_by_hand():
    kept = costs.activation_bytes(1, 2048, 512, 8, bytes_per_element=4)
    assert (
        kept["attention weights [B, h, L, L]"]
        == 8 * 2048 * 2048 * 4
        == 128 * 2**20
    )
    assert (
        sum(kept.values()) - kept["attention weights [B, h, L, L]"]
        == 5 * 2048 * 512 * 4
    )  # q, k, v, o, concat
    assert costs.attention_weights_bytes(1, 2048, 8) == 128 * 2**20
    assert (
        costs.forward_retained_bytes(1, 2048, 512, 8)
        == 128 * 2**20 + 6 * 4 * 2**20
    )  # + the output y


def test_crossover_length():
    assert (
        costs.weights_crossover_length(512, 8) == 320 == 5 * 64
    )  # 5 d_k for MHA
    kept = costs.activation_bytes(2, 320, 512, 8)
    w = kept.pop("attention weights [B, h, L, L]")
    assert w == sum(kept.values())


def test_bad_cost_arguments_raise():
    with pytest.raises(
        ValueError, match="d_model must be divisible by n_heads"
    ):
        costs.param_count(10, 4)
    with pytest.raises(
        ValueError, match="n_heads must be a multiple of n_kv_heads"
    ):
        costs.forward_flops(1, 8, 12, 6, n_kv_heads=4)
    with pytest.raises(ValueError, match="L must be a positive integer"):
        costs.activation_bytes(1, 0, 8, 2)


def test_measure_memory_sees_numpy_arrays():
    m = measure_memory(lambda: np.ones(2**20))  # 8 MiB
    assert 8 * 2**20 <= m.retained < 8 * 2**20 + 4096
    assert m.peak >= m.retained
    assert (
        measure_peak_bytes(lambda: np.ones(2**20).sum()) >= 8 * 2**20
    )  # freed, but it was the peak


@pytest.mark.parametrize(
    "dtype, causal", [(np.float64, False), (np.float32, True)]
)
@pytest.mark.parametrize("B, L", [(1, 256), (2, 96)])
def test_formula_matches_tracemalloc(dtype, causal, B, L):
    """What a forward leaves allocated (cache + output) is the formula within 1 % plus 16 KiB of
    Python objects; the peak adds at most the boolean causal mask and small temporaries (10 %)."""
    d, h = 64, 4
    layer = MultiHeadAttention(d, h, dtype=dtype)
    x = np.random.default_rng(0).standard_normal((B, L, d)).astype(dtype)
    e = np.dtype(dtype).itemsize
    formula = costs.forward_retained_bytes(B, L, d, h, bytes_per_element=e)
    m = measure_memory(lambda: layer.forward(x, causal=causal))
    assert abs(m.retained - formula) <= 0.01 * formula + 16 * 1024, (
        m.retained,
        formula,
    )
    assert formula <= m.peak <= 1.10 * formula + 16 * 1024, (m.peak, formula)


# ----------------------------------------------- the seams later chapters use
class GatedCappedAttention(GroupedQueryAttention):
    """A chapter-10 style variant, by overriding steps only: a score mod in
    attend, and an output gate y = (o * sigmoid(x W_g)) W_o in output."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        shape = (self.d_model, self.n_heads * self.d_v)
        self.params["W_g"] = np.random.default_rng(9).standard_normal(shape)
        self.grads["W_g"] = np.zeros(shape)

    def attend(self, q, k, v, **where):
        return super().attend(q, k, v, score_mods=(SoftCap(2.0),), **where)

    def output(self, o, x3):
        o = merge_groups(o)  # [B, L, h*d_v]
        g = 1 / (1 + np.exp(-(x3 @ self.params["W_g"])))  # [B, L, h*d_v]
        return (o * g) @ self.params["W_o"], (o, g, x3)

    def output_backward(self, dy3, saved):
        o, g, x3 = saved
        self.grads["W_o"] = flat(o * g).T @ flat(dy3)
        d_og = dy3 @ self.params["W_o"].T  # [B, L, h*d_v]
        d_pre = d_og * o * g * (1 - g)  # through the sigmoid
        self.grads["W_g"] = flat(x3).T @ flat(d_pre)
        do = split_groups(
            d_og * g, self.n_kv_heads, self.group_size, self.d_v
        )
        return do, d_pre @ self.params["W_g"].T


def test_a_subclass_adds_a_score_mod_and_an_output_gate_through_the_steps():
    layer = GatedCappedAttention(8, 4, 2, d_k=3, d_v=2, seed=1)
    x = np.random.default_rng(2).standard_normal((2, 5, 8))
    plain = GroupedQueryAttention(8, 4, 2, d_k=3, d_v=2, seed=1)
    assert not np.allclose(
        layer.forward(x, causal=True), plain.forward(x, causal=True)
    )
    errors = check_layer_gradients(layer, x, seed=3, causal=True)
    assert set(errors) == {"x", "W_q", "W_k", "W_v", "W_o", "W_g"}
    assert all(np.isfinite(e) for e in errors.values()), errors
    assert max(errors.values()) < TOLERANCE, errors
