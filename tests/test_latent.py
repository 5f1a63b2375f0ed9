"""Multi-head latent attention: a per-head reference written from the
paper's equations, gradient checks, the two decode paths against the full
causal forward, the latent cache, the cost formulas and the errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_np import TOLERANCE, KVCache, check_layer_gradients
from attn_np.costs.latent import (
    latent_cache_elements,
    latent_chunk_cost,
    latent_decode_step_cost,
    latent_param_count,
)
from attn_np.instruments import measure_peak_bytes
from attn_np.latent import LatentKVCache, MultiHeadLatentAttention
from attn_np.rope import rope

EXACT = 1e-12


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def reference(layer, x, *, causal=False, mask=None):
    """MLA token by token and head by head, from DeepSeek-V2's eqs. 37-47.

    Independent of the layer's stacked layouts: explicit loops over heads,
    the shared rotary key concatenated to every head's key.
    """
    x3 = x[None] if x.ndim == 2 else x
    B, L, _ = x3.shape
    W, h = layer.params, layer.n_heads
    d_h, d_r, d_v = layer.d_head, layer.d_rope, layer.d_head_v
    pos = np.arange(L)

    def norm(t, g):
        return t / np.sqrt(np.mean(t * t, -1, keepdims=True) + 1e-6) * g

    if layer.d_latent_q is None:
        c_q, w_uq = x3, W["W_q"]
    else:
        c_q, w_uq = x3 @ W["W_dq"], W["W_uq"]
        if layer.latent_norm:
            c_q = norm(c_q, W["g_q"])
    c_kv = x3 @ W["W_dkv"]
    if layer.latent_norm:
        c_kv = norm(c_kv, W["g_kv"])
    kw = dict(base=layer.rope_base, layout=layer.rope_layout)
    k_r = rope(x3 @ W["W_kr"], pos, **kw)  # [B, L, d_R], one per token
    heads = []
    for i in range(h):
        q_c = c_q @ w_uq[:, i * d_h : (i + 1) * d_h]
        q_r = rope(c_q @ W["W_qr"][:, i * d_r : (i + 1) * d_r], pos, **kw)
        k_c = c_kv @ W["W_uk"][:, i * d_h : (i + 1) * d_h]
        v = c_kv @ W["W_uv"][:, i * d_v : (i + 1) * d_v]
        q = np.concatenate([q_c, q_r], -1)
        k = np.concatenate([k_c, k_r], -1)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(d_h + d_r)  # [B, L, L]
        ok = np.ones((B, L, L), dtype=bool)
        if causal:
            ok &= np.tril(np.ones((L, L), dtype=bool))
        if mask is not None:
            ok &= np.broadcast_to(mask, (B, h, L, L))[:, i]
        s = np.where(ok, s, -np.inf)
        m = np.max(s, -1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.where(ok, np.exp(s - m), 0.0)
        z = e.sum(-1, keepdims=True)
        p = np.divide(e, z, out=np.zeros_like(e), where=z > 0)
        heads.append(p @ v)
    y = np.concatenate(heads, -1) @ W["W_o"]
    return y[0] if x.ndim == 2 else y


SMALL = dict(d_model=8, n_heads=3, d_head=4, d_latent_kv=6, d_rope=4)
VARIANTS = {
    "compressed q": dict(d_latent_q=5),
    "plain q": dict(),
    "d_head_v, interleaved": dict(
        d_latent_q=5, d_head_v=3, rope_layout="interleaved"
    ),
    "latent norm": dict(d_latent_q=5, latent_norm=True),
    "latent norm, plain q": dict(latent_norm=True, d_head_v=2),
}


def _layer(variant, seed=1, **over):
    kw = {**SMALL, **VARIANTS[variant], **over}
    layer = MultiHeadLatentAttention(**kw, seed=seed)
    if layer.latent_norm:  # gains away from 1, so they matter
        rng = np.random.default_rng(seed + 100)
        for k in ("g_q", "g_kv"):
            if k in layer.params:
                layer.params[k] = 1 + 0.5 * rng.standard_normal(
                    layer.params[k].shape
                )
    return layer


# --------------------------------------------------------------- contract
def test_signature_and_parameter_keys():
    layer = MultiHeadLatentAttention(
        16,
        4,
        8,
        12,
        6,
        d_latent_q=10,
        d_head_v=5,
        rope_base=500.0,
        rope_layout="interleaved",
        seed=3,
        dtype=np.float32,
    )
    shapes = {k: p.shape for k, p in layer.params.items()}
    assert shapes == {
        "W_dq": (16, 10),
        "W_uq": (10, 32),
        "W_qr": (10, 24),
        "W_dkv": (16, 12),
        "W_uk": (12, 32),
        "W_uv": (12, 20),
        "W_kr": (16, 6),
        "W_o": (20, 16),
    }
    assert all(p.dtype == np.float32 for p in layer.params.values())
    assert set(layer.grads) == set(layer.params)
    plain = MultiHeadLatentAttention(16, 4, 8, 12, 6)
    assert list(plain.params) == [
        "W_q",
        "W_qr",
        "W_dkv",
        "W_uk",
        "W_uv",
        "W_kr",
        "W_o",
    ]
    assert plain.d_head_v == 8 and plain.rope_layout == "half"
    assert plain.n_params == latent_param_count(16, 4, 8, 12, 6)
    assert layer.n_params == latent_param_count(16, 4, 8, 12, 6, 10, 5)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("causal", [False, True])
def test_matches_per_head_reference(variant, causal):
    layer = _layer(variant)
    x = _x((2, 7, 8))
    mask = _x((2, 3, 7, 7), 5) > -0.5
    for m in (None, mask):
        y = layer.forward(x, causal=causal, mask=m)
        ref = reference(layer, x, causal=causal, mask=m)
        assert np.max(np.abs(y - ref)) < EXACT
        assert layer.attention_weights.shape == (2, 3, 7, 7)


def test_head_i_owns_its_columns():
    """Changing head 1's columns of W_uk changes head 1's weights only."""
    layer = _layer("compressed q")
    x = _x((5, 8))
    layer.forward(x)
    before = layer.attention_weights.copy()
    layer.params["W_uk"][:, 4:8] += 1.0  # head 1 of d_head = 4
    layer.forward(x)
    changed = np.abs(layer.attention_weights - before).max(axis=(0, 2, 3))
    assert changed[1] > 1e-3 and changed[0] == 0 and changed[2] == 0


# -------------------------------------------------------- gradient checks
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gradients(variant):
    layer = _layer(variant)
    x = _x((2, 5, 8), 2)
    mask = _x((2, 3, 5, 5), 3) > -0.3
    mask[0, 1, 2] = False  # a query with no key: zero row, no NaN
    for kw in (dict(), dict(causal=True, mask=mask)):
        errors = check_layer_gradients(layer, x, seed=4, **kw)
        assert set(errors) == {"x", *layer.params}
        assert max(errors.values()) < TOLERANCE, errors


@given(
    h=st.integers(1, 3),
    d_head=st.integers(1, 4),
    d_c=st.integers(2, 5),  # RMSNorm of one number is its sign
    half_r=st.integers(1, 2),
    d_cq=st.one_of(st.none(), st.integers(2, 4)),
    L=st.integers(3, 5),
    B=st.integers(1, 2),
    norm=st.booleans(),
    interleaved=st.booleans(),
    seed=st.integers(0, 100),
)
def test_gradients_random_shapes(
    h, d_head, d_c, half_r, d_cq, L, B, norm, interleaved, seed
):
    layer = MultiHeadLatentAttention(
        5,
        h,
        d_head,
        d_c,
        2 * half_r,
        d_latent_q=d_cq,
        rope_base=7.0,
        rope_layout="interleaved" if interleaved else "half",
        seed=seed,
        latent_norm=norm,
    )
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, L, 5))
    # a random mask that keeps the diagonal: every row attends two keys
    # or more somewhere, so no parameter's gradient is all but zero (the
    # fixed-shape test above covers rows with no key at all)
    mask = (rng.random((B, h, L, L)) > 0.2) | np.eye(L, dtype=bool)
    mask[..., 1, 0] = True
    errors = check_layer_gradients(
        layer, x, seed=seed, causal=True, mask=mask
    )
    assert max(errors.values()) < TOLERANCE, errors


def test_shared_rope_key_gets_the_sum_over_heads():
    """dW_kr is the sum of what each head sends into the one k_R."""
    layer = _layer("compressed q")
    x, dy = _x((6, 8), 7), _x((6, 8), 8)
    layer.forward(x, causal=True)
    layer.backward(dy)
    total = layer.grads["W_kr"].copy()
    per_head = np.zeros_like(total)
    d_h = layer.d_head
    for i in range(layer.n_heads):  # silence every head but head i
        one = _layer("compressed q")
        keep = np.zeros(layer.n_heads * layer.d_head_v, dtype=bool)
        keep[i * layer.d_head_v : (i + 1) * layer.d_head_v] = True
        one.params["W_o"] = np.where(keep[:, None], one.params["W_o"], 0.0)
        one.forward(x, causal=True)
        one.backward(dy)
        per_head += one.grads["W_kr"]
    assert d_h == 4 and np.max(np.abs(total - per_head)) < EXACT


# ------------------------------------------------------ decode equalities
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("absorb", [False, True])
def test_decode_paths_equal_full_causal_forward(variant, absorb):
    layer = _layer(variant)
    x = _x((3, 13, 8), 9)
    full = layer.forward(x, causal=True)
    full_w = layer.attention_weights
    cache, outs, start = LatentKVCache(initial_capacity=2), [], 0
    for n in [4, 3] + [1] * 6:
        chunk = x[:, start : start + n]
        outs.append(layer.forward(chunk, kv_cache=cache, absorb=absorb))
        start += n
    assert np.max(np.abs(np.concatenate(outs, axis=1) - full)) < EXACT
    assert (
        np.max(np.abs(layer.attention_weights[:, :, 0] - full_w[:, :, -1]))
        < EXACT
    )
    assert len(cache) == 13 and cache.reallocations > 0


@given(
    chunks=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    absorb=st.booleans(),
    plain=st.booleans(),
    masked=st.booleans(),
    seed=st.integers(0, 50),
)
def test_any_chunking_and_mask(chunks, absorb, plain, masked, seed):
    layer = _layer("plain q" if plain else "latent norm", seed=seed)
    L = sum(chunks)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, L, 8))
    mask = rng.random((2, 3, L, L)) > 0.4 if masked else None
    full = layer.forward(x, causal=True, mask=mask)
    cache, outs, start = LatentKVCache(), [], 0
    for n in chunks:
        m = (
            None
            if mask is None
            else mask[:, :, start : start + n, : start + n]
        )
        outs.append(
            layer.forward(
                x[:, start : start + n],
                kv_cache=cache,
                mask=m,
                absorb=absorb,
            )
        )
        start += n
    assert np.max(np.abs(np.concatenate(outs, axis=1) - full)) < EXACT


@pytest.mark.parametrize("causal", [False, True])
def test_absorbed_forward_without_cache_equals_expanded(causal):
    layer = _layer("latent norm")
    x = _x((2, 6, 8), 11)
    for mask in (_x((1, 3, 6, 6), 12) > 0, _x((6, 6), 13) > 0, None):
        y = layer.forward(x, causal=causal, mask=mask)
        w = layer.attention_weights
        y_abs = layer.forward(x, causal=causal, mask=mask, absorb=True)
        assert np.max(np.abs(y - y_abs)) < EXACT
        assert np.max(np.abs(w - layer.attention_weights)) < EXACT
    with pytest.raises(RuntimeError, match="absorb=False"):
        layer.backward(np.ones_like(y))


def test_float32_decode_both_paths():
    layer = MultiHeadLatentAttention(
        32, 4, 8, 16, 8, d_latent_q=24, dtype=np.float32
    )
    x = _x((2, 9, 32), 13).astype(np.float32)
    full = layer.forward(x, causal=True)
    for absorb in (False, True):
        cache, outs = LatentKVCache(), []
        for t in range(9):
            outs.append(
                layer.forward(x[:, t : t + 1], kv_cache=cache, absorb=absorb)
            )
        out = np.concatenate(outs, axis=1)
        assert out.dtype == np.float32 and cache.dtype == np.float32
        assert np.max(np.abs(out - full)) < 1e-4


def test_absorbed_step_builds_no_per_head_keys():
    """Peak memory of one absorbed step stays far below one head's keys."""
    layer = MultiHeadLatentAttention(64, 16, 32, 32, 16, d_latent_q=48)
    n = 2000
    cache = LatentKVCache(initial_capacity=n + 1)
    cache.append(_x((1, n, 32), 14), _x((1, n, 16), 15))
    x = _x((1, 1, 64), 16)

    def step(absorb):
        def run():
            layer.forward(x, kv_cache=cache, absorb=absorb)
            cache.truncate(n)

        return run

    one_head_keys = n * (32 + 16) * 8  # bytes of [k_C,i ; k_R] for one head
    rebuilt = n * 16 * (32 + 16 + 32) * 8  # every head's keys and values
    assert measure_peak_bytes(step(True)) < one_head_keys
    assert measure_peak_bytes(step(False)) > rebuilt


# ----------------------------------------------------------- the cache
def test_cache_nbytes_views_and_growth():
    layer = _layer("compressed q")
    cache = LatentKVCache(initial_capacity=1)
    assert cache.nbytes == 0 and len(cache) == 0 and cache.layout is None
    assert repr(cache) == "LatentKVCache(empty)"
    x = _x((2, 20, 8), 17)
    for t in range(20):
        layer.forward(x[:, t : t + 1], kv_cache=cache)
    assert cache.nbytes == 2 * 20 * (6 + 4) * 8  # B len (d_c + d_R) 8
    assert cache.capacity == 32 and cache.reallocations == 5
    assert cache.latents.shape == (2, 20, 6)
    assert cache.rope_keys.shape == (2, 20, 4)
    assert np.shares_memory(cache.latents, cache.rows)
    # stored transposed: one row per feature, the positions adjacent, so
    # that a decode step's products stream along rows len numbers long
    assert cache.rows.strides[1] == cache.rows.itemsize
    assert cache.rows.swapaxes(1, 2).strides[1] == 32 * 8  # capacity apart
    c_kv = x @ layer.params["W_dkv"]
    assert np.max(np.abs(cache.latents - c_kv)) < EXACT
    cache.truncate(5)
    assert len(cache) == 5 and cache.nbytes == 2 * 5 * 10 * 8
    with pytest.raises(ValueError, match="length"):
        cache.truncate(6)


def test_cache_mismatches_are_named():
    a = MultiHeadLatentAttention(8, 2, 4, 6, 4)
    b = MultiHeadLatentAttention(8, 2, 4, 5, 4)
    cache = LatentKVCache()
    a.forward(_x((2, 3, 8)), kv_cache=cache)
    with pytest.raises(ValueError, match="gives batch 1, .*holds batch 2"):
        a.forward(_x((1, 1, 8)), kv_cache=cache)
    with pytest.raises(ValueError, match="gives .*d_latent_kv 5"):
        b.forward(_x((2, 1, 8)), kv_cache=cache)
    c = MultiHeadLatentAttention(8, 2, 4, 6, 4, dtype=np.float32)
    with pytest.raises(TypeError, match="dtype"):
        c.forward(_x((2, 1, 8)).astype(np.float32), kv_cache=cache)
    with pytest.raises(TypeError, match="LatentKVCache"):
        a.forward(_x((2, 1, 8)), kv_cache=KVCache())
    with pytest.raises(RuntimeError, match="backward"):
        a.backward(np.zeros((2, 1, 8)))
    with pytest.raises(ValueError, match="c_kv"):
        cache.append(np.zeros((2, 1, 6)), np.zeros((2, 2, 4)))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="d_rope must be even"):
        MultiHeadLatentAttention(8, 2, 4, 6, 3)
    with pytest.raises(ValueError, match="rope_layout"):
        MultiHeadLatentAttention(8, 2, 4, 6, 4, rope_layout="neox")
    with pytest.raises(ValueError, match="base"):
        MultiHeadLatentAttention(8, 2, 4, 6, 4, rope_base=-1.0)
    with pytest.raises(ValueError, match="d_latent_q"):
        MultiHeadLatentAttention(8, 2, 4, 6, 4, d_latent_q=0)
    with pytest.raises(TypeError, match="dtype"):
        MultiHeadLatentAttention(8, 2, 4, 6, 4, dtype=np.int64)
    layer = MultiHeadLatentAttention(8, 2, 4, 6, 4)
    with pytest.raises(ValueError, match="d_model=8"):
        layer.forward(np.zeros((3, 7)))
    with pytest.raises(ValueError, match=r"\[B, n_heads, L_q, L_k\]"):
        layer.forward(np.zeros((3, 8)), mask=np.ones((3, 3, 3), dtype=bool))
    with pytest.raises(TypeError, match="absorb"):
        layer.forward(np.zeros((3, 8)), absorb="yes")
    layer.forward(np.zeros((3, 8)))
    with pytest.raises(ValueError, match="dy"):
        layer.backward(np.zeros((3, 7)))


# --------------------------------------------------------------- costs
def test_cache_elements_of_deepseek_v3_shapes():
    args = (128, 128, 512, 64)  # n_heads, d_head, d_latent_kv, d_rope
    assert latent_cache_elements(*args) == 576
    assert latent_cache_elements(*args, 128, decompressed=True) == 40960
    assert 2 * 128 * 128 == 32768  # MHA with the same heads


def test_chunk_cost_by_hand():
    d, h, d_h, d_c, d_r, d_cq, d_v = 10, 2, 3, 4, 2, 5, 6
    dims = (d, h, d_h, d_c, d_r, d_cq, d_v)
    naive = latent_chunk_cost(1, 1, 7, *dims, absorb=False)
    absorbed = latent_chunk_cost(1, 1, 7, *dims, absorb=True)
    common = 2 * d * d_cq + 2 * d_cq * h * (d_h + d_r) + 2 * d * (d_c + d_r)
    common += 2 * h * d_v * d
    assert naive.flops == common + 2 * 8 * d_c * h * (
        d_h + d_v
    ) + 2 * h * 8 * (d_h + d_r + d_v)
    assert (
        absorbed.flops
        == common
        + 2 * h * d_h * d_c
        + 2 * h * 8 * (2 * d_c + d_r)
        + 2 * h * d_c * d_v
    )
    step = latent_decode_step_cost(1, 7, *dims, absorb=True)
    assert step.flops_breakdown == absorbed.flops_breakdown
    # the cache read is the same; only naive writes the rebuilt keys/values
    assert naive.bytes_breakdown["latent cache read"] == 4 * 8 * (d_c + d_r)
    rebuilt = naive.bytes_breakdown["rebuilt keys and values"]
    assert rebuilt == 4 * 2 * 8 * h * (d_h + d_r + d_v)
    assert "rebuilt keys and values" not in absorbed.bytes_breakdown
    fused = latent_chunk_cost(1, 1, 7, *dims, absorb=True, fused=True)
    assert absorbed.bytes - fused.bytes == 4 * 2 * h * 8


def test_absorption_wins_for_decode_loses_for_long_prompts():
    dims = (7168, 128, 128, 512, 64, 1536, 128)  # DeepSeek-V3's attention
    for n in (1024, 32768):
        naive = latent_decode_step_cost(1, n, *dims, absorb=False)
        absorbed = latent_decode_step_cost(1, n, *dims, absorb=True)
        assert absorbed.flops < naive.flops / 10
    L = 4096
    naive = latent_chunk_cost(1, L, 0, *dims, absorb=False)
    absorbed = latent_chunk_cost(1, L, 0, *dims, absorb=True)
    assert absorbed.flops > 2 * naive.flops


def test_cost_bad_arguments():
    with pytest.raises(ValueError, match="n_cached"):
        latent_decode_step_cost(1, -1, 8, 2, 4, 6, 4, absorb=True)
    with pytest.raises(ValueError, match="d_head"):
        latent_cache_elements(2, 0, 6, 4)
