"""One cache protocol: every layer takes its cache through ``kv_cache=``
and makes a fresh one with ``new_cache()`` (issue 38).

The hybrid tests failed on the old main with ``AttributeError`` (the
Gated DeltaNet layer has no ``window`` and took ``state_cache=``); the
Llama 4 test failed there because the HF layer's cache held every
position (40 after 40 tokens) where the chunk is 4.
"""

import json

import numpy as np
import pytest

from attn_np import (
    GatedDeltaNet,
    GroupedQueryAttention,
    KimiDeltaAttention,
    MultiHeadLatentAttention,
    Transformer,
    attention_from_hf,
)
from attn_np.hf.build import fixture_errors
from attn_np.long_context import with_rope_scaling
from attn_np.sparse import SparseLatentAttention
from attn_np.streaming import stream_logits

FIXTURES = "tests/fixtures"


def hybrid(positions="rope", n_layers=4):
    return Transformer(
        vocab_size=9,
        d_model=8,
        n_layers=n_layers,
        n_heads=2,
        n_kv_heads=1,
        d_ff=12,
        max_len=40,
        seed=3,
        positions=positions,
        layer_pattern=("linear", "full"),
        linear_options={"chunk_size": 4},
    )


IDS = np.random.default_rng(0).integers(9, size=(2, 23))


@pytest.mark.parametrize("chunk", [1, 5, None])
def test_stream_logits_on_a_hybrid_equals_its_forward(chunk):
    model = hybrid()
    assert model.layer_types == ["linear", "full", "linear", "full"]
    full = model.forward(IDS)
    got = stream_logits(model, IDS, chunk=chunk)
    np.testing.assert_allclose(got, full, rtol=0, atol=1e-10)


def test_with_rope_scaling_on_a_hybrid():
    model = hybrid()
    same = with_rope_scaling(model, None)
    np.testing.assert_allclose(
        same.forward(IDS), model.forward(IDS), rtol=1e-13, atol=1e-13
    )
    pi = with_rope_scaling(model, {"rope_type": "linear", "factor": 2.0})
    # the linear layers have no positions: they are the model's own
    assert pi.blocks[0].attn is model.blocks[0].attn
    assert pi.params["block1.attn.W_q"] is model.params["block1.attn.W_q"]
    assert not np.allclose(pi.forward(IDS), model.forward(IDS))
    np.testing.assert_allclose(
        stream_logits(pi, IDS, chunk=3), pi.forward(IDS), atol=1e-10
    )


def _layers():
    yield GroupedQueryAttention(8, 2, 1, seed=1)
    yield GatedDeltaNet(8, 2, 1, d_k=4, d_v=4, chunk_size=4, seed=1)
    yield KimiDeltaAttention(8, 2, 1, d_k=4, d_v=4, chunk_size=4, seed=1)
    yield MultiHeadLatentAttention(
        8, 2, d_head=4, d_latent_kv=4, d_rope=2, d_latent_q=4, seed=1
    )
    yield SparseLatentAttention(
        8,
        2,
        d_head=4,
        d_latent_kv=4,
        d_rope=2,
        d_latent_q=4,
        index_n_heads=2,
        index_head_dim=4,
        index_topk=3,
        seed=1,
    )


@pytest.mark.parametrize("layer", list(_layers()), ids=repr)
def test_every_layer_decodes_through_kv_cache_and_new_cache(layer):
    x = np.random.default_rng(5).standard_normal((2, 7, 8))
    full = layer.forward(x, causal=True)
    cache = layer.new_cache()
    parts = [layer.forward(x[:, :4], kv_cache=cache)]
    parts += [
        layer.forward(x[:, t : t + 1], kv_cache=cache) for t in (4, 5, 6)
    ]
    np.testing.assert_allclose(
        np.concatenate(parts, axis=1), full, rtol=0, atol=1e-10
    )
    assert len(cache) == 7


def _fixture_layer(i):
    f = np.load(f"{FIXTURES}/llama4.npz")
    config = json.loads(str(f["config"]))
    pre = f"layer{i}.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    return attention_from_hf(config, i, state), config


def test_hf_llama4_chunked_cache_stays_bounded_by_its_chunk():
    layer, config = _fixture_layer(0)
    C = config["attention_chunk_size"]
    assert layer.new_cache().chunk == C
    x = np.random.default_rng(7).standard_normal((1, 40, layer.d_model))
    full = layer.forward(x)
    cache, outs = layer.new_cache(), []
    for t in range(40):
        outs.append(layer.forward(x[:, t : t + 1], kv_cache=cache))
        assert cache.positions.size <= C, (t, cache.positions)
    np.testing.assert_allclose(
        np.concatenate(outs, axis=1), full, rtol=0, atol=1e-10
    )
    # and the recorded HF decode (chunks 5, 1, 1, 2 over a chunk of 4)
    errors = fixture_errors(f"{FIXTURES}/llama4.npz", 0)
    assert max(errors.values()) < 1e-12, errors
    # the full-attention layer keeps everything
    full_layer, _ = _fixture_layer(1)
    cache = full_layer.new_cache()
    full_layer.forward(x, kv_cache=cache)
    assert len(cache) == cache.positions.size == 40


def test_the_model_takes_its_layers_from_a_table():
    """Chapter 5's model imports no later chapter: chapter 12 adds its
    kind to LAYER_KINDS; a caller can add one too."""
    from attn_np.training.transformer import LAYER_KINDS, register_layer_kind

    assert {"full", "linear"} <= set(LAYER_KINDS)
    built = []

    def build(d_model, n_heads, n_kv_heads, **settings):
        built.append(settings["seed"])
        return LAYER_KINDS["full"](d_model, n_heads, n_kv_heads, **settings)

    register_layer_kind("mine", build)
    try:
        model = Transformer(
            vocab_size=9,
            d_model=8,
            n_layers=2,
            n_heads=2,
            n_kv_heads=1,
            d_ff=12,
            max_len=8,
            layer_pattern=("mine", "full"),
        )
        assert len(built) == 1 and model.layer_types == ["mine", "full"]
    finally:
        del LAYER_KINDS["mine"]
    with pytest.raises(ValueError, match="layer_pattern"):
        Transformer(
            vocab_size=9,
            d_model=8,
            n_layers=2,
            n_heads=2,
            n_kv_heads=1,
            d_ff=12,
            max_len=8,
            layer_pattern=("mine",),
        )
    with pytest.raises(TypeError, match="build must be callable"):
        register_layer_kind("x", None)
