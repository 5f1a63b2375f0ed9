"""Chapter 12: linear attention, the (gated) delta rule in its recurrent and
chunked forms, the Gated DeltaNet layer and its state cache.

The two forms agree to float64 rounding for any chunk size and any length;
the recurrent form is checked against the rule written as a matrix product
(``S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``); both
backward passes and the layers' are checked against central differences for
every input and parameter; decoding after a chunked prefill reproduces the
full forward."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_np import (
    TOLERANCE,
    GatedDeltaNet,
    KimiDeltaAttention,
    StateCache,
    check_gradients,
    check_layer_gradients,
    gated_delta_chunked_backward,
    gated_delta_chunked_forward,
    gated_delta_recurrent_backward,
    gated_delta_recurrent_forward,
    gated_deltanet_from_hf,
    linear_attention_backward,
    linear_attention_forward,
    numerical_gradient,
    rel_error,
)
from attn_np.hf.weights import gated_deltanet_grads_to_hf
from attn_np.linear import (
    causal_conv_backward,
    causal_conv_forward,
    elu_feature_map,
    l2norm_backward,
    l2norm_forward,
    state_bytes,
    unit_lower_inverse,
)

FORMS = {
    "recurrent": (
        gated_delta_recurrent_forward,
        gated_delta_recurrent_backward,
    ),
    "chunked": (gated_delta_chunked_forward, gated_delta_chunked_backward),
}


def delta_inputs(
    seed=0, lead=(2, 3), T=7, d_k=4, d_v=5, per_channel=False, state=True
):
    """Random inputs in the ranges the layer produces: unit keys, g < 0,
    0 < beta < 1."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((*lead, T, d_k))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    g_shape = (*lead, T, d_k) if per_channel else (*lead, T)
    out = dict(
        q=rng.standard_normal((*lead, T, d_k)) / math.sqrt(d_k),
        k=k,
        v=rng.standard_normal((*lead, T, d_v)),
        g=-rng.uniform(0.05, 1.0, g_shape),
        beta=rng.uniform(0.1, 0.95, (*lead, T)),
    )
    if state:
        out["initial_state"] = rng.standard_normal((*lead, d_k, d_v))
    return out


def rule_as_matrices(q, k, v, g, beta, initial_state):
    """The gated delta rule as a matrix product, one token at a time, for
    one head: ``S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} +
    beta_t k_t v_t^T`` (with a scalar alpha, ``alpha_t (I - beta_t k_t
    k_t^T) S_{t-1} + ...``), ``o_t = S_t^T q_t``."""
    S = initial_state.copy()
    d_k = k.shape[-1]
    outs = []
    for t in range(k.shape[0]):
        a = np.exp(g[t]) * np.ones(d_k)
        kk = k[t][:, None] @ k[t][None, :]  # [d_k, d_k]
        S = (np.eye(d_k) - beta[t] * kk) @ (a[:, None] * S) + beta[t] * (
            k[t][:, None] @ v[t][None, :]
        )
        outs.append(S.T @ q[t])
    return np.array(outs), S


# ---------------------------------------------------------------------------
# the rule itself


@pytest.mark.parametrize("per_channel", [False, True])
def test_recurrent_form_is_the_rule_as_matrices(per_channel):
    x = delta_inputs(lead=(), T=9, per_channel=per_channel)
    o, cache = gated_delta_recurrent_forward(**x)
    o_ref, S_ref = rule_as_matrices(**x)
    assert np.abs(o - o_ref).max() < 1e-13
    assert np.abs(cache.final_state - S_ref).max() < 1e-13


def test_delta_rule_with_beta_one_writes_the_value_exactly():
    """With beta = 1, no decay and a unit key, reading the key back returns
    the value just written, whatever the state held before."""
    rng = np.random.default_rng(3)
    d_k, d_v = 6, 4
    k = rng.standard_normal((1, d_k))
    k /= np.linalg.norm(k)
    v = rng.standard_normal((1, d_v))
    S0 = rng.standard_normal((d_k, d_v))
    _, cache = gated_delta_recurrent_forward(
        k, k, v, np.zeros(1), np.ones(1), S0
    )
    read = cache.final_state.T @ k[0]
    assert np.abs(read - v[0]).max() < 1e-14
    # linear attention's additive write does not: it returns S0^T k + v
    assert np.abs(S0.T @ k[0] + v[0] - read).max() > 1e-3


def test_unit_lower_inverse_is_the_inverse():
    rng = np.random.default_rng(0)
    A = np.tril(rng.standard_normal((3, 6, 6)), k=-1)
    T = unit_lower_inverse(A)
    want = np.linalg.inv(np.eye(6) - A)
    assert np.abs(T - want).max() < 1e-12


# ---------------------------------------------------------------------------
# recurrent == chunked


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("T", [1, 7, 13, 17])
@pytest.mark.parametrize("C", [1, 2, 3, 5, 8, 16])
def test_chunked_equals_recurrent(per_channel, T, C):
    x = delta_inputs(seed=T * 31 + C, T=T, per_channel=per_channel)
    o1, c1 = gated_delta_recurrent_forward(**x)
    o2, c2 = gated_delta_chunked_forward(**x, chunk_size=C)
    assert o2.shape == o1.shape
    scale = np.abs(o1).max()
    assert np.abs(o1 - o2).max() < 1e-13 * max(1.0, scale)
    assert np.abs(c1.final_state - c2.final_state).max() < 1e-13 * max(
        1.0, np.abs(c1.final_state).max()
    )
    # one state per chunk (and the last), not one per token
    assert c2.states.shape[0] == math.ceil(T / C) + 1


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("C", [17, 20, 33, 64])
def test_chunked_equals_recurrent_large_chunks(per_channel, C):
    """Chunks larger than the tests above use (T = 70: several chunks,
    the last one partial): the forms agree, outputs and gradients."""
    x = delta_inputs(seed=C, lead=(2,), T=70, per_channel=per_channel)
    o1, c1 = gated_delta_recurrent_forward(**x)
    o2, c2 = gated_delta_chunked_forward(**x, chunk_size=C)
    assert np.abs(o1 - o2).max() < 1e-12 * max(1.0, np.abs(o1).max())
    assert np.abs(c1.final_state - c2.final_state).max() < 1e-12
    do = np.random.default_rng(C).standard_normal(o1.shape)
    g1 = gated_delta_recurrent_backward(do, c1)
    g2 = gated_delta_chunked_backward(do, c2)
    for a, b in zip(g1, g2):
        assert np.abs(a - b).max() < 1e-10 * max(1.0, np.abs(a).max())


@given(
    T=st.integers(1, 20),
    C=st.integers(1, 9),
    d_k=st.integers(1, 5),
    d_v=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_chunked_equals_recurrent_property(T, C, d_k, d_v, seed):
    x = delta_inputs(seed=seed, lead=(2,), T=T, d_k=d_k, d_v=d_v)
    o1, c1 = gated_delta_recurrent_forward(**x)
    o2, c2 = gated_delta_chunked_forward(**x, chunk_size=C)
    assert np.abs(o1 - o2).max() < 1e-12
    assert np.abs(c1.final_state - c2.final_state).max() < 1e-12


@pytest.mark.parametrize("per_channel", [False, True])
def test_groups_of_chunks_change_nothing(monkeypatch, per_channel):
    """The chunked form works on groups of GROUP_TOKENS // C chunks; with
    groups of one or two chunks it gives the same outputs and
    gradients."""
    import attn_np.linear.chunked as la

    x = delta_inputs(seed=8, lead=(2,), T=23, per_channel=per_channel)
    rng = np.random.default_rng(0)
    o, cache = gated_delta_chunked_forward(**x, chunk_size=3)
    do = rng.standard_normal(o.shape)
    dS = rng.standard_normal(cache.final_state.shape)
    want = gated_delta_chunked_backward(do, cache, dstate=dS)
    assert cache.q.shape[0] <= la.GROUP_TOKENS // 3  # one group
    for tokens in (3, 6):  # groups of 1 and of 2 chunks
        monkeypatch.setattr(la, "GROUP_TOKENS", tokens)
        o2, c2 = gated_delta_chunked_forward(**x, chunk_size=3)
        got = gated_delta_chunked_backward(do, c2, dstate=dS)
        assert np.abs(o2 - o).max() < 1e-14
        for a, b in zip(got, want):
            assert np.abs(a - b).max() < 1e-13


@pytest.mark.parametrize("per_channel", [False, True])
def test_kept_parts_equal_recomputed_parts(monkeypatch, per_channel):
    """The backward gives the same gradients from the parts the forward
    kept (KEEP_PARTS), from the squares it kept (KEEP_SQUARES, one decay
    per head only), from parts it recomputes (both off), and a second
    time from the same cache (what was kept is released once used)."""
    import attn_np.linear.chunked as la

    x = delta_inputs(seed=9, lead=(2,), T=29, per_channel=per_channel)
    rng = np.random.default_rng(1)
    monkeypatch.setattr(la, "KEEP_PARTS", True)
    o, cache = gated_delta_chunked_forward(**x, chunk_size=4)
    assert all(isinstance(p, la.ChunkParts) for p in cache.parts)
    do = rng.standard_normal(o.shape)
    dS = rng.standard_normal(cache.final_state.shape)
    kept = gated_delta_chunked_backward(do, cache, dstate=dS)
    assert all(p is None for p in cache.parts)  # released
    again = gated_delta_chunked_backward(do, cache, dstate=dS)
    monkeypatch.setattr(la, "KEEP_PARTS", False)
    results = {}
    for squares in (True, False):
        monkeypatch.setattr(la, "KEEP_SQUARES", squares)
        o2, c2 = gated_delta_chunked_forward(**x, chunk_size=4)
        np.testing.assert_array_equal(o2, o)
        want = tuple if squares and not per_channel else type(None)
        assert all(isinstance(p, want) for p in c2.parts)
        results[squares] = gated_delta_chunked_backward(do, c2, dstate=dS)
    for got in (again, results[True], results[False]):
        for a, b in zip(kept, got):
            np.testing.assert_array_equal(a, b)


def test_continuing_from_a_state_equals_one_pass():
    """Two calls, the second starting from the first's final state, give
    the outputs of one call (the state carries everything)."""
    x = delta_inputs(T=11, state=False)
    o, _ = gated_delta_chunked_forward(**x, chunk_size=4)
    first = {
        n: a[..., :5] if n in ("g", "beta") else a[..., :5, :]
        for n, a in x.items()
    }
    rest = {
        n: a[..., 5:] if n in ("g", "beta") else a[..., 5:, :]
        for n, a in x.items()
    }
    o1, c1 = gated_delta_chunked_forward(**first, chunk_size=4)
    o2, _ = gated_delta_recurrent_forward(
        **rest, initial_state=c1.final_state
    )
    assert np.abs(np.concatenate([o1, o2], axis=-2) - o).max() < 1e-13


# ---------------------------------------------------------------------------
# gradients of the kernels


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize(
    "form, C",
    [
        ("recurrent", None),
        ("chunked", 1),
        ("chunked", 2),
        ("chunked", 3),
        ("chunked", 8),
    ],
)
def test_kernel_gradients(form, C, per_channel):
    fwd, bwd = FORMS[form]
    kw = {} if C is None else {"chunk_size": C}
    x = delta_inputs(
        seed=5, lead=(2,), T=7, d_k=3, d_v=2, per_channel=per_channel
    )
    errs = check_gradients(fwd, bwd, x, seed=1, **kw)
    assert set(errs) == set(x)
    for name, err in errs.items():
        assert np.isfinite(err) and err < TOLERANCE, (name, err)


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_kernel_gradients_through_the_final_state(form):
    """A loss on the final state as well: ``dstate`` flows back to every
    input."""
    fwd, bwd = FORMS[form]
    kw = {"chunk_size": 3} if form == "chunked" else {}
    x = delta_inputs(seed=2, lead=(2,), T=8, d_k=3, d_v=2, per_channel=True)
    rng = np.random.default_rng(9)
    o, cache = fwd(**x, **kw)
    do = rng.standard_normal(o.shape)
    dS = rng.standard_normal(cache.final_state.shape)
    grads = bwd(do, cache, dstate=dS)

    def f():
        o, c = fwd(**x, **kw)
        return np.concatenate([o.ravel(), c.final_state.ravel()])

    dout = np.concatenate([do.ravel(), dS.ravel()])
    for (name, arr), g in zip(x.items(), grads):
        err = rel_error(g, numerical_gradient(f, arr, dout))
        assert np.isfinite(err) and err < TOLERANCE, (name, err)


def test_linear_attention_recurrence_is_the_masked_product():
    x = delta_inputs(lead=(2,), T=9, state=False)
    o, _ = linear_attention_forward(x["q"], x["k"], x["v"])
    fq, fk = elu_feature_map(x["q"]), elu_feature_map(x["k"])
    P = np.tril(fq @ fk.swapaxes(-1, -2))  # [2, T, T]
    want = (P @ x["v"]) / P.sum(axis=-1, keepdims=True)
    assert np.abs(o - want).max() < 1e-13


def test_linear_attention_gradients():
    x = delta_inputs(seed=4, lead=(2,), T=6, state=False)
    errs = check_gradients(
        linear_attention_forward,
        linear_attention_backward,
        {n: x[n] for n in ("q", "k", "v")},
    )
    for name, err in errs.items():
        assert np.isfinite(err) and err < TOLERANCE, (name, err)


def test_small_parts_gradients():
    # not seed 0: check_gradients draws dout from seed 0, and a dout equal
    # to x is parallel to l2norm's output, whose gradient is then ~0
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 5, 3))
    w = rng.standard_normal((4, 3))
    prev = rng.standard_normal((2, 3, 3))

    def conv(x, w):
        return causal_conv_forward(x, w, prev)

    errs = check_gradients(conv, causal_conv_backward, {"x": x, "w": w})
    errs["l2norm x"] = check_gradients(
        l2norm_forward, l2norm_backward, {"x": x}
    )["x"]
    for name, err in errs.items():
        assert np.isfinite(err) and err < TOLERANCE, (name, err)


def test_conv_continues_from_its_tail():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 9, 3))
    w = rng.standard_normal((4, 3))
    full, _ = causal_conv_forward(x, w)
    a, (xp, _, _) = causal_conv_forward(x[:, :5], w)
    b, _ = causal_conv_forward(x[:, 5:], w, xp[:, -3:])
    assert np.abs(np.concatenate([a, b], axis=1) - full).max() < 1e-15


# ---------------------------------------------------------------------------
# the layers

# The L2 normalisation of short q and k vectors (norms near 0.05 here) has
# large third derivatives: with h = 1e-5 the central difference's O(h^2)
# truncation error alone reaches ~2e-7 (it falls 100x per 10x smaller h),
# so the layers are checked with h = 1e-6 (rounding error ~1e-10).
LAYER_H = 1e-6


def small_layer(cls=GatedDeltaNet, **kw):
    kw = {"chunk_size": 3, "seed": 1} | kw
    return cls(12, 4, 2, d_k=3, d_v=2, **kw)


@pytest.mark.parametrize("neg", [False, True])
@pytest.mark.parametrize("cls", [GatedDeltaNet, KimiDeltaAttention])
@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
def test_layer_gradients(cls, mode, neg):
    """Every input and parameter, with beta in (0, 1) and, doubled
    (``allow_neg_eigval``: OLMo Hybrid's), in (0, 2)."""
    layer = small_layer(cls, mode=mode, allow_neg_eigval=neg)
    x = np.random.default_rng(2).standard_normal((2, 7, 12))
    errs = check_layer_gradients(layer, x, seed=3, h=LAYER_H)
    assert set(errs) == {"x"} | set(layer.params)
    for name, err in errs.items():
        assert np.isfinite(err) and err < TOLERANCE, (name, err)


@pytest.mark.parametrize("cls", [GatedDeltaNet, KimiDeltaAttention])
def test_allow_neg_eigval_doubles_beta(cls):
    """beta doubles and nothing else changes; the modes still agree."""
    x = np.random.default_rng(4).standard_normal((2, 7, 12))
    plain, neg = small_layer(cls), small_layer(cls, allow_neg_eigval=True)
    (g0, b0), (g1, b1) = plain.gates(x), neg.gates(x)
    assert np.array_equal(g0, g1) and np.allclose(b1, 2 * b0, rtol=0)
    assert b1.max() > 1  # some state direction is turned around
    assert "allow_neg_eigval=True" in repr(neg)
    assert np.abs(neg.forward(x) - plain.forward(x)).max() > 1e-3
    rec = small_layer(cls, allow_neg_eigval=True, mode="recurrent")
    assert np.abs(rec.forward(x) - neg.forward(x)).max() < 1e-13
    with pytest.raises(TypeError, match="allow_neg_eigval"):
        small_layer(cls, allow_neg_eigval="yes")


def test_layer_modes_agree_and_unbatched_input():
    x = np.random.default_rng(0).standard_normal((2, 10, 12))
    a = small_layer(mode="chunked").forward(x)
    b = small_layer(mode="recurrent").forward(x)
    assert np.abs(a - b).max() < 1e-13
    one = small_layer().forward(x[0])
    assert one.shape == (10, 12) and np.abs(one - a[0]).max() < 1e-13


def test_layer_has_the_released_parts():
    layer = GatedDeltaNet(64, 8, 4, d_k=16, d_v=8)
    shapes = {n: p.shape for n, p in layer.params.items()}
    assert shapes == {
        "W_q": (64, 64),
        "W_k": (64, 64),
        "W_v": (64, 64),
        "W_z": (64, 64),
        "W_a": (64, 8),
        "W_b": (64, 8),
        "conv_q": (4, 64),
        "conv_k": (4, 64),
        "conv_v": (4, 64),
        "A_log": (8,),
        "dt_bias": (8,),
        "norm": (8,),
        "W_o": (64, 64),
    }
    kda = KimiDeltaAttention(64, 8, 4, d_k=16, d_v=8)
    assert kda.params["dt_bias"].shape == (8 * 16,)  # per channel
    assert "W_z" not in kda.params and "W_a" not in kda.params


@pytest.mark.parametrize("cls", [GatedDeltaNet, KimiDeltaAttention])
@pytest.mark.parametrize("prefill", [1, 4, 7])
def test_decode_after_chunked_prefill_equals_full_forward(cls, prefill):
    layer = small_layer(cls)
    x = np.random.default_rng(prefill).standard_normal((2, 12, 12))
    full = layer.forward(x)
    cache = StateCache()
    outs = [layer.forward(x[:, :prefill], kv_cache=cache)]
    t = prefill
    for step in (1, 1, 2, 1, 12):  # one by one, short chunks, the rest
        if t < 12:
            chunk = x[:, t : t + step]
            outs.append(layer.forward(chunk, kv_cache=cache))
            t += chunk.shape[1]
    assert len(cache) == 12
    assert np.abs(np.concatenate(outs, axis=1) - full).max() < 1e-13


def test_state_cache_bytes_do_not_grow():
    layer = GatedDeltaNet(32, 4, 2, d_k=8, d_v=6, conv_size=4)
    B = 3
    x = np.random.default_rng(0).standard_normal((B, 20, 32))
    cache = StateCache()
    assert cache.nbytes == 0 and len(cache) == 0
    layer.forward(x[:, :5], kv_cache=cache)
    state = B * 4 * 8 * 6 * 8  # B n_v d_k d_v x 8 bytes
    conv = B * 3 * (2 * 2 * 8 + 4 * 6) * 8  # B (K-1) channels x 8
    assert cache.state_bytes == state and cache.conv_bytes == conv
    assert (
        cache.nbytes == state + conv == B * layer.state_bytes_per_sequence()
    )
    layer.forward(x[:, 5:], kv_cache=cache)
    assert len(cache) == 20 and cache.nbytes == state + conv
    assert layer.state_bytes_per_sequence(np.float32) * 2 == (
        layer.state_bytes_per_sequence()
    )


def test_state_cache_truncate():
    layer = small_layer()
    cache = StateCache()
    layer.forward(np.ones((1, 4, 12)), kv_cache=cache)
    cache.truncate(4)  # nothing to forget
    assert len(cache) == 4
    with pytest.raises(ValueError, match="cannot be truncated to 2"):
        cache.truncate(2)
    cache.truncate(0)
    assert len(cache) == 0 and cache.nbytes == 0


# ---------------------------------------------------------------------------
# bad input


def test_kernel_bad_input():
    x = delta_inputs(lead=(2,), T=5)
    fwd = gated_delta_chunked_forward
    with pytest.raises(ValueError, match="g must have shape"):
        fwd(**(x | {"g": x["g"][..., :4]}))
    with pytest.raises(ValueError, match="beta must have shape"):
        fwd(**(x | {"beta": x["beta"][None]}))
    with pytest.raises(ValueError, match="initial_state must have shape"):
        fwd(**(x | {"initial_state": x["initial_state"][..., :2]}))
    with pytest.raises(ValueError, match="v must have shape"):
        fwd(**(x | {"v": x["v"][..., :4, :]}))
    with pytest.raises(ValueError, match="q and k must have the same"):
        fwd(**(x | {"q": x["q"][..., :2]}))
    with pytest.raises(TypeError, match="q must be a floating-point"):
        fwd(**(x | {"q": np.ones(x["q"].shape, dtype=int)}))
    bad = x["g"].copy()
    bad[0, 1] = np.nan
    with pytest.raises(ValueError, match="g must be finite"):
        gated_delta_recurrent_forward(**(x | {"g": bad}))
    with pytest.raises(ValueError, match="chunk_size must be a positive"):
        fwd(**x, chunk_size=0)
    o, cache = fwd(**x, chunk_size=2)
    with pytest.raises(ValueError, match="do must have shape"):
        gated_delta_chunked_backward(o[..., :3, :], cache)
    with pytest.raises(ValueError, match="dstate must have shape"):
        gated_delta_chunked_backward(o, cache, dstate=np.ones(3))


def test_layer_bad_input():
    with pytest.raises(ValueError, match="n_v_heads must be a multiple"):
        GatedDeltaNet(12, 3, 2, d_k=2, d_v=2)
    with pytest.raises(ValueError, match="mode must be one of"):
        GatedDeltaNet(12, 4, mode="parallel")
    layer = small_layer()
    with pytest.raises(ValueError, match="causal"):
        layer.forward(np.ones((1, 3, 12)), causal=False)
    with pytest.raises(ValueError, match="x must have shape"):
        layer.forward(np.ones((1, 3, 5)))
    with pytest.raises(ValueError, match="at least one position"):
        layer.forward(np.ones((1, 0, 12)))
    with pytest.raises(RuntimeError, match="preceding forward"):
        small_layer().backward(np.ones((1, 3, 12)))
    layer.forward(np.ones((1, 3, 12)))
    with pytest.raises(ValueError, match="dy must have shape"):
        layer.backward(np.ones((1, 4, 12)))
    with pytest.raises(TypeError, match="kv_cache must be"):
        layer.forward(np.ones((1, 3, 12)), kv_cache={})
    cache = StateCache()
    layer.forward(np.ones((2, 3, 12)), kv_cache=cache)
    with pytest.raises(ValueError, match="kv_cache holds"):
        layer.forward(np.ones((1, 1, 12)), kv_cache=cache)
    with pytest.raises(TypeError, match="dtype float32"):
        cache.check_chunk(
            (2, 1, 12),
            batch=2,
            n_v_heads=4,
            d_k=3,
            d_v=2,
            conv_shapes=[c.shape for c in cache.conv],
            dtype=np.float32,
        )
    with pytest.raises(RuntimeError, match="preceding forward"):
        layer.backward(np.ones((2, 3, 12)))


# ---------------------------------------------------------------------------
# against Hugging Face's Qwen3NextGatedDeltaNet (tests/fixtures/README.md)

FIXTURE = Path(__file__).parent / "fixtures" / "qwen3_next.npz"


def qwen3_next_layer(f, **kw):
    config = json.loads(str(f["config"]))
    prefix = "layer0.param."
    sd = {n[len(prefix) :]: f[n] for n in f.files if n.startswith(prefix)}
    return gated_deltanet_from_hf(config, sd, **kw)


def close(a, b):
    return np.abs(a - b).max() <= 1e-12 * max(1.0, np.abs(b).max())


@pytest.mark.parametrize(
    "mode, C", [("chunked", 4), ("chunked", 64), ("recurrent", None)]
)
def test_qwen3_next_linear_attention_layer_matches_hf(mode, C):
    f = np.load(FIXTURE)
    meta = json.loads(str(f["meta"]))
    assert meta["module"]["0"] == "Qwen3NextGatedDeltaNet"
    layer = qwen3_next_layer(f, mode=mode, chunk_size=C or 64)
    assert (layer.n_k_heads, layer.n_v_heads) == (2, 4)
    assert close(layer.forward(f["x"]), f["layer0.out"])
    assert close(layer.backward(f["dy"]), f["layer0.grad.x"])
    for name, g in gated_deltanet_grads_to_hf(layer).items():
        assert close(g, f[f"layer0.grad.{name}"]), name


def test_qwen3_next_decode_matches_hf_cache():
    f = np.load(FIXTURE)
    chunks = json.loads(str(f["meta"]))["chunks"]
    layer = qwen3_next_layer(f, chunk_size=4)
    x, cache, outs, t = f["x"], StateCache(), [], 0
    for n in chunks:
        outs.append(layer.forward(x[:, t : t + n], kv_cache=cache))
        t += n
        if t == chunks[0]:  # HF's cache right after the prefill
            assert close(
                cache.state, f["layer0.decode.state.recurrent_state"]
            )
            # HF keeps K inputs per channel, [B, ch, K]; the first is
            # never read again: ours are the last K - 1, [B, K-1, ch]
            conv = np.concatenate(cache.conv, axis=-1).transpose(0, 2, 1)
            assert close(conv, f["layer0.decode.state.conv_state"][..., 1:])
    assert close(np.concatenate(outs, axis=1), f["layer0.decode.out"])


def test_from_hf_bad_input():
    f = np.load(FIXTURE)
    config = json.loads(str(f["config"]))
    prefix = "layer0.param."
    sd = {n[len(prefix) :]: f[n] for n in f.files if n.startswith(prefix)}
    with pytest.raises(TypeError, match="config must be a dict"):
        gated_deltanet_from_hf("config.json", sd)
    with pytest.raises(ValueError, match="linear_num_key_heads"):
        gated_deltanet_from_hf({"hidden_size": 64}, sd)
    with pytest.raises(ValueError, match="lacks A_log"):
        gated_deltanet_from_hf(
            config, {n: a for n, a in sd.items() if n != "A_log"}
        )
    with pytest.raises(ValueError, match="conv1d.weight"):
        gated_deltanet_from_hf(
            config, sd | {"conv1d.weight": sd["conv1d.weight"][..., :3]}
        )


@pytest.mark.parametrize("cls", [GatedDeltaNet, KimiDeltaAttention])
def test_float32_stays_float32(cls):
    layer = small_layer(cls, dtype=np.float32)
    x = np.random.default_rng(0).standard_normal((2, 5, 12)).astype("f4")
    y = layer.forward(x)
    dx = layer.backward(y)
    assert y.dtype == dx.dtype == np.float32
    assert all(g.dtype == np.float32 for g in layer.grads.values())


# ---------------------------------------------------------------------------
# hybrid stacks in the chapter-5 Transformer


def test_hybrid_transformer_gradients_and_kv_bytes():
    from attn_np import Transformer

    kw = dict(
        vocab_size=7,
        d_model=8,
        n_heads=2,
        n_kv_heads=1,
        d_ff=8,
        max_len=6,
        positions="rope",
        linear_options={"chunk_size": 2},
    )
    qwen = Transformer(
        n_layers=8,
        layer_pattern=("linear", "linear", "linear", "full"),
        **kw,
    )
    assert qwen.layer_types == ["linear"] * 3 + ["full"] + ["linear"] * 3 + [
        "full"
    ]
    assert isinstance(qwen.blocks[0].attn, GatedDeltaNet)
    assert not isinstance(qwen.blocks[3].attn, GatedDeltaNet)
    # only the two full-attention layers cache keys and values
    assert qwen.kv_bytes_per_token() == 2 * 1 * (4 + 4) * 8
    model = Transformer(n_layers=2, layer_pattern=("linear", "full"), **kw)
    ids = np.random.default_rng(0).integers(7, size=(2, 5))
    errs = check_layer_gradients(model, ids, seed=1, h=LAYER_H)
    assert any(n.startswith("block0.attn.A_log") for n in errs)
    for name, err in errs.items():
        assert np.isfinite(err) and err < TOLERANCE, (name, err)
    maps = model.attention_maps()
    assert maps[0] is None and maps[1].shape == (2, 2, 5, 5)
    with pytest.raises(ValueError, match="layer_pattern must be"):
        Transformer(n_layers=2, layer_pattern=("mamba",), **kw)


# ---------------------------------------------------------------------------
# the benchmark's command line


def test_bench_linear_prints_ratios_within_77_columns(capsys):
    from attn_np.bench import linear as bench

    argv = ["--T", "64", "--rounds", "1", "--memory-T", "64", "256"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "layer ratio" in out and "kernel ratio" in out
    assert "noise (A/A)" in out and "layer loop / chunked at T=" in out
    assert not any(w in out for w in ("goal", " met", "noisy"))
    assert "where the time goes" in out and "kernel loop / chunked" in out
    assert "chunked peak(256) / peak(64)" in out
    assert "Amdahl bound" in out and "freed memory kept" in out
    assert max(len(line) for line in out.splitlines()) <= 77
    argv += ["--return-freed"]
    assert bench.main(argv) == 0
    assert "glibc's default allocator" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0"])


def test_bench_breakdown_times_every_part_and_restores_the_layer():
    from attn_np.bench import linear as bench
    from attn_np.linear import layers as la

    before = (
        la.causal_conv_forward,
        la.GatedDeltaNet._gates_forward,
        dict(la.KERNELS),
    )
    parts = bench.breakdown(64, "chunked", rounds=1)
    assert set(parts) == set(bench.PARTS) | {bench.REST}
    # every part ran (so took time) and the rest is what is left
    assert all(parts[p] > 0 for p in bench.PARTS)
    assert parts[bench.REST] > -1e-3
    after = (
        la.causal_conv_forward,
        la.GatedDeltaNet._gates_forward,
        dict(la.KERNELS),
    )
    assert after == before


def test_fused_projection_matches_separate_products():
    # the layer multiplies x by every W_* at once; the same as one by one
    layer = GatedDeltaNet(12, 4, 2, d_k=3, d_v=2, seed=4)
    x = np.random.default_rng(5).standard_normal((6, 12))
    W_in, names, cuts = layer._in_projection()
    parts = np.split(x @ W_in, cuts, axis=1)
    for name, h in zip(names, parts):
        np.testing.assert_allclose(h, x @ layer.params[name], atol=1e-14)
    assert names[:3] == ("W_q", "W_k", "W_v")


def test_gates_helper_shapes_and_bad_input():
    kda = KimiDeltaAttention(12, 4, 2, d_k=3, d_v=2, seed=3)
    g, beta = kda.gates(np.random.default_rng(0).standard_normal((2, 5, 12)))
    assert g.shape == (2, 5, 4, 3) and beta.shape == (2, 5, 4)
    assert np.all(g < 0) and np.all((beta > 0) & (beta < 1))
    g, beta = GatedDeltaNet(12, 4, 2, d_k=3, d_v=2).gates(
        np.ones((1, 3, 12))
    )
    assert g.shape == (1, 3, 4) and beta.shape == (1, 3, 4)
    with pytest.raises(ValueError, match="x must have shape"):
        kda.gates(np.ones((5, 12)))


def test_keep_freed_memory_changes_no_number():
    """The allocator setting the benchmark runs under changes where pages
    come from, not what is computed: inside the block a freed block is
    reused (no new pages for an array of the same size)."""
    import resource

    from attn_np.instruments.allocator import (
        allocator_tunable,
        keep_freed_memory,
    )

    x = delta_inputs(seed=3, lead=(2,), T=40)
    want = gated_delta_chunked_forward(**x, chunk_size=8)[0]
    with keep_freed_memory() as took:
        assert took == allocator_tunable()
        got = gated_delta_chunked_forward(**x, chunk_size=8)[0]
        np.testing.assert_array_equal(got, want)
        if took:
            np.ones(2**18).sum()  # 2 MiB, then freed
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            np.ones(2**18).sum()
            after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            assert after - before < 50  # not the 512 pages of a new one
    with keep_freed_memory(False) as took:  # --return-freed
        assert took is False
    got = gated_delta_chunked_forward(**x, chunk_size=8)[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "args, name",
    [
        ((0, 16, 128, 128), "n_v_heads"),
        ((32, 0, 128, 128), "n_k_heads"),
        ((32, 16, 0, 128), "d_k"),
        ((8, 16, 128, 128), "multiple"),
        ((32, 16, 128, 128.5), "d_v"),
    ],
)
def test_state_bytes_refuses_bad_shapes(args, name):
    # before: 49,152 bytes for no value heads, and a size for 8 value
    # heads over 16 key heads, a layer GatedDeltaNet refuses to build
    with pytest.raises(ValueError, match=name):
        state_bytes(*args)
