"""Gemma 3n and Gemma 4 (attn_np.hf.families_gemma): the parts their
layers add (the values' RMSNorm, values from k_proj, proportional RoPE,
a reader's query norm) checked by central differences in float64, the
layer each reads, and what is refused. Their fixtures are checked with
every family's in test_hf_families.py."""

import json
from pathlib import Path

import numpy as np
import pytest

from attn_np import check_layer_gradients
from attn_np.hf.build import attention_from_hf, attention_layers_from_hf
from attn_np.hf.families_gemma import GemmaAttention, HFKVReader
from attn_np.instruments.gradcheck import TOLERANCE
from attn_np.rope import Rotary
from attn_np.rope_scaling import ProportionalRotary
from attn_np.shared_kv import SharedKVStack, shared_kv

FIXTURES = Path(__file__).parent / "fixtures" / "families"
TYPES = ["sliding_attention", "full_attention"]


def _config(name):
    f = np.load(FIXTURES / f"{name}.npz")
    return json.loads(str(f["config"]))


@pytest.mark.parametrize("k_eq_v", [False, True])
@pytest.mark.parametrize("pairs", [None, 2])
def test_gradients_of_a_gemma_layer(k_eq_v, pairs):
    """The values' norm (no gain), QK-norm of gain w, values from W_k,
    proportional RoPE: every input and parameter."""
    layer = GemmaAttention(
        16, 4, 2, 8, qk_norm="head", scale=1.0, k_eq_v=k_eq_v,
        rope_pairs=pairs, window=3,
    )  # fmt: skip
    assert ("W_v" in layer.params) is not k_eq_v
    x = np.random.default_rng(0).standard_normal((2, 6, 16))
    errors = check_layer_gradients(layer, x)
    assert {"q_norm", "k_norm", "W_k"} <= set(errors)
    assert max(errors.values()) < TOLERANCE, errors


@pytest.mark.parametrize("pairs", [None, 1])
def test_gradients_of_a_producer_and_its_gemma_readers(pairs):
    """Readers with the query norm, each leaving dk, dv that the
    producer's backward adds to its own: checked whole (heads of 4, one
    of their two pairs turned, or both)."""
    producer = GemmaAttention(
        8, 2, 1, 4, qk_norm="head", scale=1.0, k_eq_v=True,
        rope_pairs=pairs,
    )  # fmt: skip
    readers = [
        HFKVReader(8, 2, 1, 4, kv_source=0, rope_pairs=pairs, seed=i)
        for i in (1, 2)
    ]
    for r in readers:
        r.params["q_norm"][...] = 1.0 + 0.3 * np.arange(4) / 4
    stack = SharedKVStack(producer, readers)
    x = np.random.default_rng(1).standard_normal((1, 5, 8))
    errors = check_layer_gradients(stack, x)
    assert "reader1.q_norm" in errors and "producer.k_norm" in errors
    assert max(errors.values()) < TOLERANCE, errors


def test_proportional_rope_turns_its_pairs_only():
    """All pairs turned: chapter 6's RoPE over the head; none: nothing;
    n pairs: those of full RoPE, the others (in both halves) still."""
    rng = np.random.default_rng(2)
    x, pos = rng.standard_normal((2, 5, 8)), np.arange(3, 8)
    full, _ = ProportionalRotary(1e4, 8, 4).forward(x, pos)
    assert np.allclose(full, Rotary(1e4).forward(x, pos)[0], atol=1e-14)
    still, _ = ProportionalRotary(1e4, 8, 0).forward(x, pos)
    assert np.array_equal(still, x)
    two, _ = ProportionalRotary(1e4, 8, 2).forward(x, pos)
    idle = [2, 3, 6, 7]  # pairs (2, 6) and (3, 7)
    assert np.array_equal(two[..., idle], x[..., idle])
    assert np.allclose(two[..., [0, 1, 4, 5]], full[..., [0, 1, 4, 5]])


def test_bad_proportional_settings_are_named():
    with pytest.raises(ValueError, match="n_turned"):
        ProportionalRotary(1e4, 8, 5)
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., L, d\]"):
        ProportionalRotary(1e4, 8, 2).forward(np.ones((5, 6)), np.arange(5))


def test_which_layer_a_reader_reads():
    """Gemma 3n E4B's shape: 35 layers, every fifth full, the last 15
    shared: each reads the last layer of its type before them."""
    types = [TYPES[(i + 1) % 5 == 0] for i in range(35)]
    cfg = {
        **_config("gemma3n_text"),
        "num_hidden_layers": 35,
        "layer_types": types,
        "num_kv_shared_layers": 15,
        "activation_sparsity_pattern": None,
    }
    src = {i: getattr(attention_from_hf(cfg, i), "kv_source", None)
           for i in (0, 19, 20, 24, 34)}  # fmt: skip
    assert src == {0: None, 19: None, 20: 18, 24: 19, 34: 19}


def test_the_stack_attaches_each_reader_to_its_producer():
    layers = attention_layers_from_hf(_config("gemma4_text"))
    assert layers[2].producer is layers[0]
    assert layers[3].producer is layers[1]
    assert (layers[3].n_kv_heads, layers[3].d_k) == (1, 16)  # full: own
    x = np.random.default_rng(3).standard_normal((1, 5, 64))
    layers[0].forward(x)
    y = layers[2].forward(x)  # the producer's keys, read by itself
    assert np.allclose(y, layers[2].forward(x, shared_kv(layers[0])))
    with pytest.raises(ValueError, match="keeps no cache"):
        layers[2].new_cache()


def test_the_details_matter():
    """Scale 1/sqrt(d) (Gemma 3's) or no value norm: far from HF."""
    f = np.load(FIXTURES / "gemma3n_text.npz")
    cfg = json.loads(str(f["config"]))
    pre = "layer0.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    layer = attention_from_hf(cfg, 0, state)
    ref = f["layer0.out"]
    assert np.max(np.abs(layer.forward(f["x"]) - ref)) < 1e-12
    layer.scale = 8**-0.5
    assert np.max(np.abs(layer.forward(f["x"]) - ref)) > 1e-2


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"use_bidirectional_attention": "all"}, "both ways"),
        ({"per_layer_config": {"3": {"sliding_window": 3}}}, "sliding"),
        ({"layer_types": TYPES[::-1] * 2}, "must end with"),
        ({"num_kv_shared_layers": 4}, "another model"),
        ({"attention_bias": True}, "attention_bias"),
    ],
)
def test_what_gemma4_refuses_is_named(change, words):
    cfg = {**_config("gemma4_text"), **change}
    with pytest.raises(ValueError, match=words):
        attention_from_hf(cfg, 3)


def test_gemma3n_refuses_too_few_producers():
    cfg = {**_config("gemma3n_text"), "num_kv_shared_layers": 3}
    with pytest.raises(ValueError, match="num_kv_shared_layers=3"):
        attention_from_hf(cfg, 3)


def test_a_reader_decodes_over_its_producers_cache_only():
    layers = attention_layers_from_hf(_config("gemma3n_text"))
    x = np.random.default_rng(4).standard_normal((1, 3, 64))
    cache = layers[0].new_cache()
    layers[0].forward(x, kv_cache=cache)
    layers[2].forward(x, kv_cache=cache)
    full = layers[1].new_cache()
    with pytest.raises(ValueError, match="window"):
        layers[1].forward(x, kv_cache=full)
        layers[2].forward(x, kv_cache=full)
