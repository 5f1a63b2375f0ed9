"""One attention layer assembled from parts (issue 38): chapter 10's and
chapter 11's layers are recipes of chapter 2's layer, so they decode with
its caches as it does, and mha_to_gqa keeps every part they hold."""

import numpy as np
import pytest

from attn_np import (
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    check_layer_gradients,
    mha_to_gqa,
)
from attn_np.long_context import ChunkedKVCache, LongContextAttention
from attn_np.refinements import ALiBi, RefinedAttention, SoftCap

EXACT = 1e-12


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _decode(layer, x, cache):
    """``x [B, L, d]`` one position at a time through ``cache``."""
    return np.concatenate(
        [
            layer.forward(x[:, i : i + 1], kv_cache=cache)
            for i in range(x.shape[1])
        ],
        axis=1,
    )


@pytest.mark.parametrize("sink_tokens", [0, 1, 2])
def test_refined_layer_decodes_a_sink_cache_as_chapter_2s_layer(sink_tokens):
    """A StreamingLLM cache through the chapter-10 layer equals the
    chapter-2 layer's decode with the same weights (on main the refined
    layer's mask dropped the sink tokens: 1.30 apart)."""
    gqa = GroupedQueryAttention(
        16, 4, 2, seed=3, rope_base=10000.0, window=4
    )
    ref = RefinedAttention(16, 4, 2, seed=4, window=4)
    for name in ("W_q", "W_k", "W_v", "W_o"):
        ref.params[name] = gqa.params[name].copy()
    x = _x((2, 11, 16))
    want = _decode(gqa, x, KVCache(window=4, sink_tokens=sink_tokens))
    got = _decode(ref, x, KVCache(window=4, sink_tokens=sink_tokens))
    np.testing.assert_allclose(got, want, rtol=0, atol=EXACT)


def test_refined_temperature_reads_absolute_positions_with_sinks():
    """Llama 4's query temperature is a function of a query's absolute
    position, also when a StreamingLLM cache turns the queries by slot:
    the refined layer equals chapter 2's layer with the temperature as
    a score mod."""
    from attn_np.refinements import QueryTemperature

    gqa = GroupedQueryAttention(
        16,
        4,
        2,
        seed=3,
        rope_base=10000.0,
        window=4,
        score_mods=(QueryTemperature(2.0, 0.5),),
    )
    ref = RefinedAttention(16, 4, 2, window=4, query_temperature=(2.0, 0.5))
    for name in ("W_q", "W_k", "W_v", "W_o"):
        ref.params[name] = gqa.params[name].copy()
    x = _x((1, 9, 16), seed=1)
    want = _decode(gqa, x, KVCache(window=4, sink_tokens=1))
    got = _decode(ref, x, KVCache(window=4, sink_tokens=1))
    np.testing.assert_allclose(got, want, rtol=0, atol=EXACT)
    cold = GroupedQueryAttention(16, 4, 2, seed=3, rope_base=1e4, window=4)
    off = _decode(cold, x, KVCache(window=4, sink_tokens=1))
    assert np.abs(got - off)[:, 1:].min() > 0  # tau(p) > 1 from p = 1


REFINED = {
    "biases_gate_softcap": dict(
        biases=("q", "k", "v", "o"),
        gate="elementwise",
        scale=0.3,
        score_mods=(SoftCap(2.0),),
        sinks=True,
    ),
    "qk_norm_head_window": dict(
        qk_norm="head", qk_norm_offset=1.0, window=3, rope_base=1e4
    ),
    "qk_norm_proj_chunk": dict(qk_norm="proj", chunk=3, rope_factor=2.0),
    "alibi_nope": dict(use_rope=False, score_mods=(ALiBi([0.5] * 4),)),
    "llama4_chunk": dict(
        qk_norm="head",
        qk_norm_learned=False,
        qk_norm_after_rope=True,
        chunk=3,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
    ),  # fmt: skip
    "nope_temperature": dict(use_rope=False, query_temperature=(2.0, 0.5)),
    "headwise_gate": dict(gate="headwise", biases=("k", "v")),
}


def _refined(kw, n_kv=4, seed=1):
    layer = RefinedAttention(16, 4, n_kv, seed=seed, **kw)
    rng = np.random.default_rng(seed + 7)
    for name, p in layer.params.items():  # learned, not their init
        if name[0] != "W":
            p[...] = p + 0.3 * rng.standard_normal(p.shape)
    return layer


@pytest.mark.parametrize("name", REFINED)
def test_mha_to_gqa_keeps_a_refined_layer_at_identity_pooling(name):
    """Converting to as many key/value heads as it has changes nothing:
    every bias, norm, gate, scale, score mod and mask part carries over
    (on main a plain GroupedQueryAttention came back)."""
    layer = _refined(REFINED[name])
    new = mha_to_gqa(layer, 4)
    assert type(new) is RefinedAttention
    x = _x((2, 7, 16))
    np.testing.assert_allclose(
        new.forward(x), layer.forward(x), rtol=0, atol=EXACT
    )


@pytest.mark.parametrize("name", REFINED)
def test_mha_to_gqa_pools_a_refined_layer(name):
    layer = _refined(REFINED[name])
    new = mha_to_gqa(layer, 2)
    assert (type(new), new.n_kv_heads) == (RefinedAttention, 2)
    assert new.params.keys() == layer.params.keys()
    for key in ("W_k", "b_k", "W_v", "b_v"):
        if key in layer.params:
            w = layer.params[key]
            pooled = w.reshape(*w.shape[:-1], 2, 2, 4).mean(axis=-2)
            np.testing.assert_array_equal(
                new.params[key], pooled.reshape(new.params[key].shape)
            )
    for key in ("W_q", "W_o", "b_q", "b_o", "q_norm", "W_g", "sinks"):
        if key in layer.params:
            np.testing.assert_array_equal(new.params[key], layer.params[key])
    x = _x((1, 5, 16))
    assert np.isfinite(new.forward(x)).all()


LONG = {
    "chunked": dict(attention_chunk_size=3),
    "chunked_qk_norm_scaled": dict(
        attention_chunk_size=4,
        qk_norm=True,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 4,
        },
    ),  # fmt: skip
    "nope_temperature": dict(
        use_rope=False, temperature_tuning=True, floor_scale=2.0
    ),
    "window_sinks": dict(window=3, sinks=True),
}


@pytest.mark.parametrize("name", LONG)
def test_mha_to_gqa_keeps_a_long_context_layer(name):
    layer = LongContextAttention(16, 4, 4, seed=2, **LONG[name])
    if "sinks" in layer.params:
        layer.params["sinks"][:] = [0.5, -1.0, 2.0, 0.0]
    x = _x((2, 9, 16))
    new = mha_to_gqa(layer, 4)
    assert type(new) is LongContextAttention
    np.testing.assert_allclose(
        new.forward(x, causal=True),
        layer.forward(x, causal=True),
        rtol=0,
        atol=EXACT,
    )
    pooled = mha_to_gqa(layer, 2)
    assert pooled.n_kv_heads == 2
    assert pooled.options == layer.options


def test_mha_to_gqa_refuses_a_layer_it_cannot_rebuild():
    class Mine(GroupedQueryAttention):
        def output(self, o, x3):
            y, saved = super().output(o, x3)
            return 2 * y, saved

    with pytest.raises(ValueError, match="Mine"):
        mha_to_gqa(Mine(8, 2, 2), 1)
    with pytest.raises(ValueError, match="mha"):
        mha_to_gqa("not a layer", 1)


def test_chunked_layer_decodes_as_it_forwards_after_conversion():
    layer = LongContextAttention(16, 4, 4, seed=6, attention_chunk_size=3)
    new = mha_to_gqa(layer, 4)
    x = _x((1, 8, 16), seed=3)
    np.testing.assert_allclose(
        _decode(new, x, ChunkedKVCache(3)),
        layer.forward(x, causal=True),
        rtol=0,
        atol=EXACT,
    )


@pytest.mark.parametrize("name", ["qk_norm_proj_chunk", "llama4_chunk"])
def test_recipes_keep_their_gradients(name):
    layer = _refined(REFINED[name], n_kv=2)
    errs = check_layer_gradients(layer, _x((2, 5, 16)))
    assert max(errs.values()) < 1e-7, errs


def test_plain_layer_takes_the_parts():
    """Chapter 2's layer with a score mod, a scale and a mask rule is the
    refined layer with the same parts."""
    from attn_np.masks import ChunkedMask

    gqa = GroupedQueryAttention(
        16,
        4,
        2,
        seed=8,
        rope_base=10000.0,
        score_mods=(SoftCap(1.5),),
        scale=0.2,
        mask_rule=ChunkedMask(3),
    )
    ref = RefinedAttention(
        16, 4, 2, seed=9, score_mods=(SoftCap(1.5),), scale=0.2, chunk=3
    )
    for name in gqa.params:
        ref.params[name] = gqa.params[name].copy()
    x = _x((2, 7, 16))
    np.testing.assert_allclose(
        ref.forward(x), gqa.forward(x, causal=True), rtol=0, atol=EXACT
    )
    assert MultiHeadAttention(8, 2).options["mask_rule"] is None
    errs = check_layer_gradients(gqa, _x((2, 5, 16)), causal=True)
    assert max(errs.values()) < 1e-7, errs
    with pytest.raises(ValueError, match="mask_rule"):
        gqa.forward(x)  # a mask rule is causal
    with pytest.raises(TypeError, match="mask_rule"):
        GroupedQueryAttention(16, 4, 2, mask_rule=3)
    with pytest.raises(TypeError, match="score_mods"):
        GroupedQueryAttention(16, 4, 2, score_mods=(3,))


def test_latent_attention_takes_the_position_part():
    """MLA's decoupled RoPE takes the same position part as chapter 2's
    layer: a YaRN scaling given as a part changes its output, and the
    plain part gives the plain layer."""
    from attn_np import MultiHeadLatentAttention
    from attn_np.rope import Rotary
    from attn_np.rope_scaling import ScaledRotary

    x = _x((1, 6, 16))
    plain = MultiHeadLatentAttention(16, 4, 4, 8, 4, seed=1)
    same = MultiHeadLatentAttention(
        16, 4, 4, 8, 4, seed=1, rotary=Rotary(10000.0)
    )
    scaling = {"rope_type": "linear", "factor": 4.0}
    scaled = MultiHeadLatentAttention(
        16,
        4,
        4,
        8,
        4,
        seed=1,
        rotary=ScaledRotary(1e4, rope_scaling=scaling),
    )
    y = plain.forward(x, causal=True)
    np.testing.assert_array_equal(same.forward(x, causal=True), y)
    assert np.abs(scaled.forward(x, causal=True) - y).max() > 1e-6
    errs = check_layer_gradients(scaled, x, causal=True)
    assert max(errs.values()) < 1e-7, errs
    with pytest.raises(TypeError, match="rotary"):
        MultiHeadLatentAttention(16, 4, 4, 8, 4, rotary=scaling)


def test_every_layer_makes_its_cache():
    """Every layer makes its cache with new_cache(): a chunked layer's
    holds only its chunk, and decoding through it equals the forward."""
    from attn_np import LatentKVCache, MultiHeadLatentAttention
    from attn_np.kv_cache import ChunkedKVCache as Chunked

    assert Chunked is ChunkedKVCache  # one class, re-exported
    gqa = GroupedQueryAttention(8, 2, 1, window=3)
    assert (type(gqa.new_cache()), gqa.new_cache().window) == (KVCache, 3)
    long = LongContextAttention(8, 2, 1, attention_chunk_size=3)
    assert long.new_cache().chunk == 3
    ref = RefinedAttention(16, 4, 2, seed=2, chunk=3)
    cache = ref.new_cache()
    assert cache.chunk == 3
    x = _x((1, 8, 16), seed=4)
    np.testing.assert_allclose(
        _decode(ref, x, cache), ref.forward(x), rtol=0, atol=EXACT
    )
    assert len(cache.positions) <= 3
    mla = MultiHeadLatentAttention(16, 4, 4, 8, 4)
    assert type(mla.new_cache()) is LatentKVCache


def test_refined_layer_is_a_recipe_of_parts():
    """Chapter 10's layer overrides no step of chapter 3's: chapter 3's
    layer given the same parts is the same layer."""
    from attn_np.refinements import GatedOutput, Projection

    for step in ("project", "project_backward", "position", "attend",
                 "output", "output_backward", "backward"):  # fmt: skip
        assert getattr(RefinedAttention, step) is getattr(
            GroupedQueryAttention, step
        ), step
    ref = _refined(REFINED["biases_gate_softcap"], n_kv=2)
    assert ref.projection == Projection(("k", "q", "v"))
    assert ref.out_projection == GatedOutput("elementwise", True)
    gqa = GroupedQueryAttention(
        16,
        4,
        2,
        d_k=4,
        d_v=4,
        rope_base=1e4,
        sinks=True,
        score_mods=(SoftCap(2.0),),
        scale=0.3,
        projection=Projection(("k", "q", "v")),
        out_projection=GatedOutput("elementwise", True),
    )
    assert gqa.params.keys() == ref.params.keys()
    for name in gqa.params:
        gqa.params[name] = ref.params[name].copy()
    x = _x((2, 6, 16))
    np.testing.assert_allclose(
        gqa.forward(x, causal=True), ref.forward(x), rtol=0, atol=EXACT
    )
    errs = check_layer_gradients(gqa, x, causal=True)
    assert max(errs.values()) < 1e-7, errs
    new = mha_to_gqa(gqa, 1)
    assert (type(new), new.projection) == (
        GroupedQueryAttention,
        gqa.projection,
    )
    assert set(gqa.kv_params) == {"W_k", "W_v", "b_k", "b_v"}
    with pytest.raises(TypeError, match="projection"):
        GroupedQueryAttention(16, 4, 2, projection=SoftCap(1.0))
