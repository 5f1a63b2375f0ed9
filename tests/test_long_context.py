"""Chapter 11: RoPE scaling, NoPE layers, chunked attention.

The expected frequencies come from plain per-pair loops written here after
the reference code (Meta's ``apply_scaling`` for Llama 3.1 and Llama 4,
DeepSeek-V3's ``precompute_freqs_cis``, gpt-oss's
``_compute_concentration_and_inv_freq``) and from values worked out by
hand in the comments, never from the function under test.
"""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_np import (
    TOLERANCE,
    GroupedQueryAttention,
    KVCache,
    Transformer,
    check_gradients,
    check_layer_gradients,
    position_mask,
    rope_backward,
    rope_frequencies,
)
from attn_np.long_context import (
    ChunkedKVCache,
    LongContextAttention,
    Passkey,
    chunked_mask,
    frequency_bands,
    qk_norm_backward,
    qk_norm_forward,
    query_temperature,
    query_temperature_backward,
    query_temperature_forward,
    read_rope_scaling,
    rope_layers,
    rope_settings_from_config,
    scaled_frequencies,
    scaled_rope_forward,
    softmax_scale,
    with_rope_scaling,
    yarn_correction_range,
)

# the released configs (Hugging Face config.json of each model)
LLAMA31_8B = dict(
    rotary_dim=128,
    base=500000.0,
    rope_scaling={
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
)
LLAMA4_SCOUT = dict(
    rotary_dim=128,
    base=500000.0,
    rope_scaling={
        "factor": 16.0,
        "high_freq_factor": 1.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
)
DEEPSEEK_V3 = dict(
    rotary_dim=64,  # qk_rope_head_dim
    base=10000.0,
    rope_scaling={
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
)
GPT_OSS = dict(
    rotary_dim=64,
    base=150000.0,
    rope_scaling={
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
)


def plain_theta(r, base):
    return [1.0 / base ** (2 * i / r) for i in range(r // 2)]


def meta_apply_scaling(
    freqs, scale_factor, low_freq_factor, high_freq_factor
):
    """Meta's Llama 4 ``apply_scaling``, one frequency at a time (Llama
    3.1's is the same rule with 8, 1, 4 fixed); old_context_len 8192."""
    old = 8192
    low_wl, high_wl = old / low_freq_factor, old / high_freq_factor
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(f)
        elif wl > low_wl:
            out.append(f / scale_factor)
        else:
            s = (old / wl - low_freq_factor) / (
                high_freq_factor - low_freq_factor
            )
            out.append((1 - s) * f / scale_factor + s * f)
    return out


def plain_yarn(r, base, factor, low, high):
    """DeepSeek-V3's and gpt-oss's blend, one pair at a time."""
    out = []
    for i, f in enumerate(plain_theta(r, base)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        smooth = 1 - ramp  # their name: the share kept unscaled
        out.append(f / factor * (1 - smooth) + f * smooth)
    return out


def freqs(cfg):
    return scaled_frequencies(
        cfg["rotary_dim"], base=cfg["base"], rope_scaling=cfg["rope_scaling"]
    )


# ------------------------------------------------------------- llama3
def test_llama31_8b_matches_metas_apply_scaling():
    theta, m = freqs(LLAMA31_8B)
    want = meta_apply_scaling(plain_theta(128, 500000.0), 8.0, 1.0, 4.0)
    np.testing.assert_allclose(theta, want, rtol=1e-13)
    assert m == 1.0
    # wavelength 2 pi 500000^(i/64) < 2048 for i <= 28, > 8192 for i >= 35
    bands = frequency_bands(plain_theta(128, 500000.0), theta, 8.0)
    assert bands == {"kept": 29, "divided": 29, "smoothed": 6}


def test_llama4_scout_matches_metas_apply_scaling():
    theta, m = freqs(LLAMA4_SCOUT)
    want = meta_apply_scaling(plain_theta(128, 500000.0), 16.0, 1.0, 1.0)
    np.testing.assert_allclose(theta, want, rtol=1e-13)
    assert m == 1.0 and np.isfinite(theta).all()
    # low = high = 1: no band between; wavelength > 8192 from i = 35 on
    bands = frequency_bands(plain_theta(128, 500000.0), theta, 16.0)
    assert bands == {"kept": 35, "divided": 29, "smoothed": 0}


# --------------------------------------------------------------- yarn
def test_deepseek_v3_yarn_and_softmax_scale():
    theta, m = freqs(DEEPSEEK_V3)
    # 64 ln(4096 / (2 pi 32)) / (2 ln 10^4) = 10.47 -> 10;
    # 64 ln(4096 / (2 pi)) / (2 ln 10^4) = 22.51 -> 23
    assert yarn_correction_range(64, 1e4, 32, 1, 4096) == (10, 23)
    np.testing.assert_allclose(
        theta, plain_yarn(64, 1e4, 40, 10, 23), rtol=1e-13
    )
    # mscale / mscale_all_dim = 1: nothing on cos/sin ...
    assert m == 1.0
    # ... the temperature goes into the softmax: (0.1 ln 40 + 1)^2 / sqrt(192)
    mscale = 0.1 * 1.0 * math.log(40) + 1.0
    want = 192**-0.5 * mscale * mscale
    assert softmax_scale(192, DEEPSEEK_V3["rope_scaling"]) == pytest.approx(
        want, rel=1e-15
    )
    assert want == pytest.approx(0.1352337788608801, rel=1e-12)
    assert softmax_scale(192) == 192**-0.5
    bands = frequency_bands(plain_theta(64, 1e4), theta, 40)
    assert bands == {"kept": 11, "divided": 9, "smoothed": 12}


def test_gpt_oss_yarn_unrounded_range_and_concentration():
    theta, m = freqs(GPT_OSS)
    # gpt-oss: d_half ln(L / (beta 2 pi)) / ln(base), not rounded
    low = 32 * math.log(4096 / (32 * 2 * math.pi)) / math.log(150000.0)
    high = 32 * math.log(4096 / (1 * 2 * math.pi)) / math.log(150000.0)
    assert 0 < low < high < 31
    got = yarn_correction_range(64, 150000.0, 32.0, 1.0, 4096, False)
    assert got == pytest.approx((low, high), rel=1e-14)
    np.testing.assert_allclose(
        theta, plain_yarn(64, 150000.0, 32.0, low, high), rtol=1e-13
    )
    assert m == pytest.approx(0.1 * math.log(32.0) + 1.0, rel=1e-15)
    # 8.09 and 17.40: pairs 0-8 kept, 18-31 divided, 9-17 between
    bands = frequency_bands(plain_theta(64, 150000.0), theta, 32.0)
    assert bands == {"kept": 9, "divided": 14, "smoothed": 9}
    # truncated (HF's default) the range is (8, 18) and the numbers move
    rounded = dict(GPT_OSS["rope_scaling"], truncate=True)
    theta2, _ = scaled_frequencies(64, base=150000.0, rope_scaling=rounded)
    np.testing.assert_allclose(
        theta2, plain_yarn(64, 150000.0, 32.0, 8, 18), rtol=1e-13
    )
    assert np.abs(theta2 / theta - 1).max() > 0.05


def test_yarn_attention_factor_rules():
    base = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    _, m = scaled_frequencies(16, rope_scaling=base)
    assert m == pytest.approx(0.1 * math.log(4.0) + 1)
    _, m = scaled_frequencies(
        16, rope_scaling=dict(base, attention_factor=0.5)
    )
    assert m == 0.5
    _, m = scaled_frequencies(
        16, rope_scaling=dict(base, mscale=0.707, mscale_all_dim=1.0)
    )
    want = (0.1 * 0.707 * math.log(4) + 1) / (0.1 * math.log(4) + 1)
    assert m == pytest.approx(want, rel=1e-14)
    # no factor: max_position_embeddings / original (HF's DeepSeek rule)
    nofactor = {k: v for k, v in base.items() if k != "factor"}
    a, _ = scaled_frequencies(
        16, rope_scaling=nofactor, max_position_embeddings=256
    )
    b, _ = scaled_frequencies(16, rope_scaling=base)
    np.testing.assert_array_equal(a, b)


# ------------------------------------------- linear, ntk, dynamic, default
def test_linear_ntk_dynamic_default():
    r, b = 16, 10000.0
    plain = np.array(plain_theta(r, b))
    got, m = scaled_frequencies(
        r, base=b, rope_scaling={"rope_type": "linear", "factor": 4.0}
    )
    np.testing.assert_allclose(got, plain / 4.0, rtol=1e-15)
    got, _ = scaled_frequencies(
        r, base=b, rope_scaling={"rope_type": "ntk", "factor": 4.0}
    )
    np.testing.assert_allclose(
        got, plain_theta(r, b * 4.0 ** (16 / 14)), rtol=1e-14
    )
    # the slowest pair turns exactly 4x slower; the fastest not at all
    assert got[0] == 1.0 and got[-1] == pytest.approx(plain[-1] / 4)
    dyn = {
        "rope_type": "dynamic",
        "factor": 2.0,
        "original_max_position_embeddings": 32,
    }
    for n in (None, 1, 32):  # up to the trained length: plain RoPE
        got, _ = scaled_frequencies(r, base=b, rope_scaling=dyn, seq_len=n)
        np.testing.assert_allclose(got, plain, rtol=1e-15)
    got, _ = scaled_frequencies(r, base=b, rope_scaling=dyn, seq_len=96)
    # 2 * 96/32 - (2 - 1) = 5
    np.testing.assert_allclose(
        got, plain_theta(r, b * 5.0 ** (16 / 14)), rtol=1e-14
    )
    for s in (None, {"rope_type": "default"}, {"type": "default"}):
        got, m = scaled_frequencies(r, base=b, rope_scaling=s)
        np.testing.assert_allclose(got, plain, rtol=1e-15)
        assert m == 1.0


def test_chapter_6s_frequencies_know_no_scaling():
    """The scalings are chapter 11's position part (issue 38): chapter
    6's rope_frequencies is the plain rule and takes no rope_scaling."""
    np.testing.assert_array_equal(
        rope_frequencies(8, base=100.0), plain_theta(8, 100.0)
    )
    got, _ = scaled_frequencies(
        128, base=500000.0, rope_scaling=LLAMA31_8B["rope_scaling"]
    )
    np.testing.assert_array_equal(got, freqs(LLAMA31_8B)[0])
    with pytest.raises(TypeError, match="rope_scaling"):
        rope_frequencies(8, rope_scaling=LLAMA31_8B["rope_scaling"])


# ----------------------------------------------------------- spelling
def test_spellings_type_rope_type_and_rope_parameters():
    old = DEEPSEEK_V3["rope_scaling"]
    new = {k: v for k, v in old.items() if k != "type"}
    new.update(rope_type="yarn", rope_theta=10000.0)
    assert read_rope_scaling(old) == read_rope_scaling(new)
    v4 = {
        "rope_theta": 500000.0,
        "rope_scaling": LLAMA4_SCOUT["rope_scaling"],
    }
    v5 = {
        "rope_parameters": dict(
            LLAMA4_SCOUT["rope_scaling"], rope_theta=500000.0
        )
    }
    assert rope_settings_from_config(v4) == rope_settings_from_config(v5)
    base, s = rope_settings_from_config(v5)
    assert base == 500000.0 and s["rope_type"] == "llama3"
    gemma = {
        "rope_parameters": {
            "full_attention": {
                "rope_type": "linear",
                "factor": 8.0,
                "rope_theta": 1e6,
            },
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": 1e4,
            },
        }
    }
    assert rope_settings_from_config(gemma, layer_type="full_attention") == (
        1e6,
        {"rope_type": "linear", "factor": 8.0},
    )
    with pytest.raises(ValueError, match="layer_type"):
        rope_settings_from_config(gemma)
    with pytest.raises(ValueError, match="rope_theta"):
        rope_settings_from_config({"rope_scaling": None})


@pytest.mark.parametrize(
    "scaling, match",
    [
        ({"rope_type": "longrope", "factor": 2.0}, "longrope"),
        ({"factor": 2.0}, "rope_type"),
        ({"rope_type": "linear"}, "'factor'"),
        ({"rope_type": "yarn", "factor": 2.0}, "original_max_position"),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "low_freq_factor",
        ),
        ({"rope_type": "linear", "factor": 2.0, "factr": 1}, "factr"),
        ({"rope_type": "linear", "factor": -2.0}, "factor"),
        (
            {
                "rope_type": "yarn",
                "factor": 2.0,
                "original_max_position_embeddings": 8,
                "truncate": "no",
            },
            "truncate",
        ),
        ({"rope_type": "dynamic", "factor": 2.0}, "original_max_position"),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 4.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
            },
            "high_freq_factor",
        ),
    ],
)
def test_bad_rope_scaling_names_the_key(scaling, match):
    with pytest.raises(ValueError, match=match):
        scaled_frequencies(16, rope_scaling=scaling)


def test_rope_scaling_must_be_a_dict():
    with pytest.raises(TypeError, match="rope_scaling"):
        scaled_frequencies(16, rope_scaling=[("rope_type", "linear")])


# -------------------------------------------------------------- masks
def brute_chunked(qp, kp, C):
    m = np.zeros((len(qp), len(kp)), dtype=bool)
    for a, i in enumerate(qp):
        for b, j in enumerate(kp):
            m[a, b] = j <= i and i // C == j // C
    return m


@given(
    C=st.integers(1, 9),
    L_k=st.integers(1, 30),
    data=st.data(),
)
def test_chunked_mask_matches_a_loop(C, L_k, data):
    L_q = data.draw(st.integers(1, L_k))
    start = data.draw(st.integers(0, 40))
    kp = start + np.arange(L_k)
    qp = kp[-L_q:]
    np.testing.assert_array_equal(
        chunked_mask(qp, kp, C), brute_chunked(qp, kp, C)
    )


def test_chunked_is_not_a_sliding_window():
    p = np.arange(8)
    chunk, window = chunked_mask(p, p, 4), position_mask(p, p, window=4)
    # both let the last query of a chunk see 4 keys ...
    assert chunk[3].sum() == window[3].sum() == 4
    # ... but the first query of the next chunk sees only itself
    assert chunk[4].sum() == 1 and window[4].sum() == 4
    assert chunk.sum() == 2 * (1 + 2 + 3 + 4)
    with pytest.raises(ValueError, match="chunk"):
        chunked_mask(p, p, 0)


# --------------------------------------------- Llama 4's pieces, values
def test_query_temperature_values():
    t = query_temperature(np.array([0, 8190, 8191, 16383, 10**6]))
    # floor((p + 1) / 8192) = 0, 0, 1, 2, 122
    want = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3)]
    np.testing.assert_allclose(t[:4], want, rtol=1e-15)
    assert t[4] == pytest.approx(1 + 0.1 * math.log(123))


def test_rope_layers_hf_and_meta_spellings():
    scout = [1, 1, 1, 0] * 12  # HF: 1 means the layer uses RoPE
    a = rope_layers(48, no_rope_layers=scout)
    b = rope_layers(48, nope_layer_interval=4)
    np.testing.assert_array_equal(a, b)
    assert a.sum() == 36 and not a[3] and a[0]
    with pytest.raises(ValueError, match="exactly one"):
        rope_layers(4)
    with pytest.raises(ValueError, match="no_rope_layers"):
        rope_layers(4, no_rope_layers=[1, 2, 1, 0])


# --------------------------------------------------- gradient checks
SCALINGS = [
    {"rope_type": "linear", "factor": 3.0},
    {"rope_type": "ntk", "factor": 3.0},
    {
        "rope_type": "dynamic",
        "factor": 2.0,
        "original_max_position_embeddings": 4,
    },
    {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 4.0,
        "truncate": False,
    },
    {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s["rope_type"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_scaled_rope_gradients(scaling, layout):
    x = np.random.default_rng(0).standard_normal((2, 9, 10))
    errs = check_gradients(
        scaled_rope_forward,
        rope_backward,
        {"x": x},
        positions=np.arange(3, 12),
        base=100.0,
        rope_scaling=scaling,
        layout=layout,
        rotary_dim=8,
    )
    assert all(np.isfinite(e) and e < TOLERANCE for e in errs.values())


def test_scaled_rope_carries_the_attention_factor():
    x = np.random.default_rng(1).standard_normal((5, 8))
    y, _ = scaled_rope_forward(
        x, np.arange(5), base=150000.0, rope_scaling=GPT_OSS["rope_scaling"]
    )
    # a rotation keeps norms: only the concentration changes them
    ratio = np.linalg.norm(y, axis=-1) / np.linalg.norm(x, axis=-1)
    np.testing.assert_allclose(ratio, 0.1 * math.log(32) + 1, rtol=1e-13)


def test_temperature_and_qk_norm_gradients():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 3, 7, 6))
    errs = check_gradients(
        query_temperature_forward,
        query_temperature_backward,
        {"q": q},
        positions=np.arange(7) * 5,
        floor_scale=4.0,
        attn_scale=0.3,
    )
    assert errs["q"] < TOLERANCE
    errs = check_gradients(
        qk_norm_forward, qk_norm_backward, {"x": q}, eps=1e-5
    )
    assert np.isfinite(errs["x"]) and errs["x"] < TOLERANCE
    y, _ = qk_norm_forward(q, eps=0.0)
    np.testing.assert_allclose(np.mean(y * y, axis=-1), 1.0, rtol=1e-13)


LAYER_CASES = {
    "chunked": dict(attention_chunk_size=3),
    "nope_temperature": dict(
        use_rope=False, temperature_tuning=True, floor_scale=3.0
    ),
    "rope_qk_norm_chunked": dict(
        qk_norm=True, attention_chunk_size=4, rope_layout="interleaved"
    ),
    **{s["rope_type"]: dict(rope_scaling=s, rope_dim=4) for s in SCALINGS},
}


@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_layer_gradients(case):
    # a narrow model (d_model 8, heads of 4): half the entries to perturb
    x = np.random.default_rng(3).standard_normal((2, 10, 8))
    layer = LongContextAttention(8, 4, 2, d_k=4, seed=4, **LAYER_CASES[case])
    mask = np.random.default_rng(5).random((10, 10)) < 0.8
    for kw in ({}, {"mask": mask}):
        errs = check_layer_gradients(layer, x, causal=True, **kw)
        assert set(errs) == {"x", "W_q", "W_k", "W_v", "W_o"}
        assert all(np.isfinite(e) and e < TOLERANCE for e in errs.values())


def test_layer_without_options_is_chapter_6s_layer():
    x = np.random.default_rng(6).standard_normal((2, 9, 16))
    plain = GroupedQueryAttention(16, 4, 2, seed=7, rope_base=100.0)
    ours = LongContextAttention(16, 4, 2, seed=7, rope_base=100.0)
    np.testing.assert_allclose(
        ours.forward(x, causal=True),
        plain.forward(x, causal=True),
        rtol=1e-13,
        atol=1e-13,
    )
    dy = np.random.default_rng(8).standard_normal(x.shape)
    np.testing.assert_allclose(
        ours.backward(dy), plain.backward(dy), rtol=1e-12, atol=1e-13
    )


def test_chunked_layer_masks_like_the_loop():
    layer = LongContextAttention(8, 2, 1, attention_chunk_size=3)
    layer.forward(
        np.random.default_rng(9).standard_normal((7, 8)), causal=True
    )
    w = layer.attention_weights[0]  # [h, L, L]
    p = np.arange(7)
    assert ((w > 0) == brute_chunked(p, p, 3)[None]).all()
    with pytest.raises(ValueError, match="causal"):
        layer.forward(np.zeros((7, 8)))


# ------------------------------------------------------------- caches
@pytest.mark.parametrize("first", [1, 2, 5])
def test_chunked_cache_decodes_like_the_full_forward(first):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 13, 16))
    layer = LongContextAttention(
        16,
        4,
        2,
        attention_chunk_size=4,
        qk_norm=True,
        rope_scaling=SCALINGS[-1],
    )
    full = layer.forward(x, causal=True)
    cache = ChunkedKVCache(4)
    outs = [layer.forward(x[:, :first], kv_cache=cache)]
    held = []
    for t in range(first, 13):
        outs.append(layer.forward(x[:, t : t + 1], kv_cache=cache))
        held.append(cache.positions.copy())
    np.testing.assert_allclose(
        np.concatenate(outs, axis=1), full, rtol=1e-12, atol=1e-12
    )
    assert len(cache) == 13
    np.testing.assert_array_equal(held[-1], [12])  # chunk 3 holds 12 only
    assert max(len(h) for h in held) <= 4
    one = 2 * 2 * (4 + 4) * 8  # B * n_kv * (d_k + d_v) * 8 bytes
    assert cache.nbytes <= cache.capacity * one


def test_chunked_cache_truncate_and_errors():
    layer = LongContextAttention(8, 2, 1, attention_chunk_size=4)
    x = np.random.default_rng(11).standard_normal((10, 8))
    cache = ChunkedKVCache(4)
    layer.forward(x[:6], kv_cache=cache)
    layer.forward(x[6:7], kv_cache=cache)  # forgets 0-3, holds 4-6
    np.testing.assert_array_equal(cache.positions, [4, 5, 6])
    cache.truncate(5)
    np.testing.assert_array_equal(cache.positions, [4])
    y = layer.forward(x[5:6], kv_cache=cache)
    np.testing.assert_allclose(
        y, layer.forward(x[:6], causal=True)[-1:], rtol=1e-12, atol=1e-13
    )
    with pytest.raises(ValueError, match="length"):
        cache.truncate(3)
    with pytest.raises(ValueError, match="ChunkedKVCache"):
        layer.forward(x[:1], kv_cache=KVCache())
    with pytest.raises(ValueError, match="ChunkedKVCache"):
        layer.forward(x[:1], kv_cache=ChunkedKVCache(3))


def test_nope_layer_with_a_plain_cache():
    layer = LongContextAttention(
        8, 2, 1, use_rope=False, temperature_tuning=True, floor_scale=2.0
    )
    x = np.random.default_rng(12).standard_normal((6, 8))
    full = layer.forward(x, causal=True)
    cache = KVCache()
    steps = [layer.forward(x[t : t + 1], kv_cache=cache) for t in range(6)]
    np.testing.assert_allclose(
        np.concatenate(steps), full, rtol=1e-12, atol=1e-13
    )


def test_layer_option_errors():
    with pytest.raises(ValueError, match="flash"):
        LongContextAttention(8, 2, 1, flash=True)
    with pytest.raises(ValueError, match="window"):
        LongContextAttention(8, 2, 1, window=4, attention_chunk_size=4)
    with pytest.raises(ValueError, match="use_rope"):
        LongContextAttention(8, 2, 1, rope_base=None)
    with pytest.raises(TypeError, match="qk_norm"):
        LongContextAttention(8, 2, 1, qk_norm="yes")
    with pytest.raises(ValueError, match="attention_chunk_size"):
        LongContextAttention(8, 2, 1, attention_chunk_size=0)


# ---------------------------------------------------- chapter 5's model
def test_with_rope_scaling_shares_weights():
    model = Transformer(
        vocab_size=11,
        d_model=8,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        d_ff=16,
        max_len=64,
        positions="rope",
    )
    ids = np.random.default_rng(13).integers(11, size=(2, 20))
    same = with_rope_scaling(model, None)
    np.testing.assert_allclose(
        same.forward(ids), model.forward(ids), rtol=1e-13, atol=1e-13
    )
    pi = with_rope_scaling(model, {"rope_type": "linear", "factor": 2.0})
    assert pi.params["block0.attn.W_q"] is model.params["block0.attn.W_q"]
    assert not np.allclose(pi.forward(ids), model.forward(ids))
    with pytest.raises(ValueError, match="positions='rope'"):
        with_rope_scaling(
            Transformer(
                vocab_size=11,
                d_model=8,
                n_layers=1,
                n_heads=2,
                n_kv_heads=1,
                d_ff=16,
                max_len=8,
            ),
            None,
        )


# ------------------------------------------- Hugging Face fixtures (ch10)
FIXTURES = Path(__file__).parent / "fixtures"
FIXTURES = Path(
    os.environ.get("ATTN_NP_FIXTURES", Path(__file__).parent / "fixtures")
)


def load_fixture(name):
    path = FIXTURES / f"{name}.npz"
    if not path.exists():
        pytest.skip(f"no HF fixture {path} (recorded by chapter 10)")
    f = np.load(path)
    return f, json.loads(str(f["config"]))


def fixture_layer(f, cfg, i, **options):
    """Our layer with HF's weights of layer ``i``; biases ride on a
    constant input feature (``x -> [x, 1]``, ``W -> [W; b]``)."""
    p = {
        k.split(".param.")[1]: f[k]
        for k in f.files
        if f"layer{i}.param." in k
    }
    d, h = cfg["hidden_size"], cfg["num_attention_heads"]
    bias = "q_proj.bias" in p
    base, scaling = rope_settings_from_config(cfg)
    layer = LongContextAttention(
        d + bias,
        h,
        cfg["num_key_value_heads"],
        d_k=cfg["head_dim"],
        d_v=cfg["head_dim"],
        rope_base=base,
        rope_scaling=scaling,
        sinks="sinks" in p,
        **options,
    )
    for ours, theirs in (("W_q", "q"), ("W_k", "k"), ("W_v", "v")):
        w = p[f"{theirs}_proj.weight"].T  # [d, out]
        if bias:
            w = np.vstack([w, p[f"{theirs}_proj.bias"][None]])
        layer.params[ours][...] = w
    w_o = p["o_proj.weight"].T  # [h*d_v, d]
    # with biases the layer's output has a spare feature too: keep it 0
    layer.params["W_o"] = np.hstack(
        [w_o, np.zeros((w_o.shape[0], int(bias)))]
    )
    if "sinks" in p:
        layer.params["sinks"][...] = p["sinks"]
    layer.grads = {k: np.zeros_like(v) for k, v in layer.params.items()}
    b_o = p["o_proj.bias"] if bias else 0.0
    return layer, bias, b_o


def run_fixture(name, i, **options):
    f, cfg = load_fixture(name)
    layer, bias, b_o = fixture_layer(f, cfg, i, **options)
    x, d = f["x"], f["x"].shape[-1]

    def pad(t):  # [..., d] -> [..., d + 1]: the constant feature
        return np.concatenate([t, np.ones(t.shape[:-1] + (1,))], -1)

    x1 = pad(x) if bias else x
    y = layer.forward(x1, causal=True)[..., :d] + b_o
    np.testing.assert_allclose(y, f[f"layer{i}.out"], rtol=1e-10, atol=1e-12)
    dy = f["dy"]
    if bias:  # no gradient flows into the spare output feature
        dy = np.concatenate([dy, np.zeros(dy.shape[:-1] + (1,))], -1)
    dx = layer.backward(dy)[..., :d]
    np.testing.assert_allclose(
        dx, f[f"layer{i}.grad.x"], rtol=1e-10, atol=1e-12
    )
    grads = {  # ours in HF's names: every weight, bias and sink
        f"{theirs}_proj.weight": layer.grads[ours][:d].T
        for ours, theirs in (("W_q", "q"), ("W_k", "k"), ("W_v", "v"))
    }
    grads["o_proj.weight"] = layer.grads["W_o"][:, :d].T
    if bias:
        for ours, theirs in (("W_q", "q"), ("W_k", "k"), ("W_v", "v")):
            grads[f"{theirs}_proj.bias"] = layer.grads[ours][d]
        grads["o_proj.bias"] = f["dy"].sum(axis=(0, 1))  # y = ... + b_o
    if "sinks" in layer.grads:
        grads["sinks"] = layer.grads["sinks"]
    want = {k.split(".grad.")[1] for k in f.files if f"layer{i}.grad." in k}
    assert set(grads) == want - {"x"}, sorted(want)
    for name, g in grads.items():
        np.testing.assert_allclose(
            g,
            f[f"layer{i}.grad.{name}"],
            rtol=1e-10,
            atol=1e-12,
            err_msg=name,
        )
    meta = json.loads(str(f["meta"]))
    chunk = options.get("attention_chunk_size")
    cache = (
        ChunkedKVCache(chunk)
        if chunk
        else KVCache(window=options.get("window"))
    )
    outs, t = [], 0
    for n in meta["chunks"]:
        outs.append(layer.forward(x1[:, t : t + n], kv_cache=cache))
        t += n
    dec = np.concatenate(outs, axis=1)[..., :d] + b_o
    np.testing.assert_allclose(
        dec, f[f"layer{i}.decode.out"], rtol=1e-10, atol=1e-12
    )


def test_llama31_layer_matches_hf():
    run_fixture("llama31", 0)


def test_llama4_chunked_rope_qk_norm_layer_matches_hf():
    _, cfg = load_fixture("llama4")
    run_fixture(
        "llama4",
        0,
        rope_layout="interleaved",
        qk_norm=True,
        qk_norm_eps=cfg["rms_norm_eps"],
        attention_chunk_size=cfg["attention_chunk_size"],
    )


def test_llama4_nope_temperature_layer_matches_hf():
    _, cfg = load_fixture("llama4")
    assert cfg["no_rope_layers"][1] == 0  # HF: 0 means NoPE
    run_fixture(
        "llama4",
        1,
        use_rope=False,
        temperature_tuning=True,
        floor_scale=cfg["floor_scale"],
        attn_scale=cfg["attn_scale"],
    )


@pytest.mark.parametrize("i", [0, 1])
def test_gpt_oss_yarn_layer_matches_hf(i):
    _, cfg = load_fixture("gpt_oss_yarn")
    window = (
        cfg["sliding_window"]
        if cfg["layer_types"][i] == "sliding_attention"
        else None
    )
    run_fixture("gpt_oss_yarn", i, window=window)


# ---------------------------------------------------------------- the task
def test_passkey_task():
    task = Passkey(12, n_values=5)
    b = task.sample(50, seed=3)
    marked = (b.inputs >= 5) & (b.inputs < 10)
    assert (marked.sum(axis=1) == 1).all()  # one passkey per sequence
    assert (b.inputs[:, -1] == 10).all() and not marked[:, -1].any()
    np.testing.assert_array_equal(b.targets[:, -1], b.inputs[marked] - 5)
    assert b.mask[:, -1].all() and b.mask.sum() == 50
    np.testing.assert_array_equal(task.sample(50, seed=3).inputs, b.inputs)
    assert task.vocab_size == 11
    with pytest.raises(ValueError, match="length"):
        Passkey(1)


# ------------------------- chapter 3's layer takes the scaling as a part
def test_grouped_query_attention_takes_rope_scaling():
    from attn_np import MultiHeadAttention, mha_to_gqa
    from attn_np.rope_scaling import ScaledRotary

    s = SCALINGS[3]  # YaRN, attention factor 1.21
    x = np.random.default_rng(14).standard_normal((2, 9, 16))
    part = ScaledRotary(100.0, rope_scaling=s)
    plain = GroupedQueryAttention(
        16, 4, 2, seed=1, rope_base=100.0, rotary=part
    )
    ours = LongContextAttention(
        16, 4, 2, seed=1, rope_base=100.0, rope_scaling=s
    )
    np.testing.assert_allclose(
        plain.forward(x, causal=True),
        ours.forward(x, causal=True),
        rtol=1e-13,
        atol=1e-14,
    )
    unscaled = GroupedQueryAttention(16, 4, 2, seed=1, rope_base=100.0)
    assert not np.allclose(
        unscaled.forward(x, causal=True), plain.forward(x, causal=True)
    )
    assert plain.options["rotary"].rope_scaling == read_rope_scaling(s)
    errs = check_layer_gradients(plain, x, causal=True)
    assert all(np.isfinite(e) and e < TOLERANCE for e in errs.values())
    mha = MultiHeadAttention(16, 4, seed=2, rope_base=100.0, rotary=part)
    assert mha_to_gqa(mha, 2).rotary == mha.rotary == part
    with pytest.raises(ValueError, match="rope_type"):
        ScaledRotary(100.0, rope_scaling={"factor": 2.0})
    with pytest.raises(TypeError, match="rotary"):
        GroupedQueryAttention(16, 4, 2, rotary=s)


@pytest.mark.parametrize(
    "positions", [[-5], [1.5], [[1, 2]], [True, False]], ids=str
)
def test_query_temperature_refuses_bad_positions(positions):
    # before: -5 gave log(0) = -inf, 1.5 and a 2-D array a silent answer
    with pytest.raises(ValueError, match="positions"):
        query_temperature(positions)


@pytest.mark.parametrize(
    "args, name",
    [
        ((0, 10000.0, 32, 1, 4096), "rotary_dim"),
        ((64, 10000.0, 32, 1, 0), "original_max"),
        ((64, 0.0, 32, 1, 4096), "base"),
        ((64, 10000.0, 1, 32, 4096), "beta_fast"),
    ],
)
def test_yarn_correction_range_refuses_bad_numbers(args, name):
    # before: (0, -1) for rotary_dim 0, "math domain error" for a length
    # of 0, and a ramp running backwards for beta_fast < beta_slow
    with pytest.raises(ValueError, match=name):
        yarn_correction_range(*args)


def test_yarn_with_beta_fast_below_beta_slow_is_refused():
    bad = dict(
        rope_type="yarn",
        factor=2.0,
        original_max_position_embeddings=32,
        beta_fast=1.0,
        beta_slow=32.0,
    )
    with pytest.raises(ValueError, match="beta_fast"):
        scaled_frequencies(8, rope_scaling=bad)


def test_dynamic_seq_len_and_frequency_bands_refuse_bad_input():
    dyn = dict(
        rope_type="dynamic", factor=2.0, original_max_position_embeddings=4
    )
    for bad in (-5, "a", 2.5):
        with pytest.raises(ValueError, match="seq_len"):
            scaled_frequencies(8, rope_scaling=dyn, seq_len=bad)
    with pytest.raises(ValueError, match="scaled"):  # was a broadcast error
        frequency_bands(np.ones(4), np.ones(3), 2.0)
