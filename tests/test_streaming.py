"""stream_logits (a Transformer over a long input with one cache per layer), the MarkedCopy task,
the Transformer's window/sinks arguments, and the window decode benchmark at toy sizes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_np import TOLERANCE, Transformer, check_layer_gradients
from attn_np.bench.window import run as run_window_bench
from attn_np.streaming import MarkedCopy, stream_logits


def small_model(positions="rope", window=None, sinks=False, seed=0):
    model = Transformer(
        vocab_size=9,
        d_model=8,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        d_ff=12,
        max_len=40,
        seed=seed,
        positions=positions,
        window=window,
        sinks=sinks,
    )
    if sinks:
        rng = np.random.default_rng(seed)
        for blk in model.blocks:
            blk.attn.params["sinks"][:] = rng.standard_normal(2)
    return model


IDS = np.random.default_rng(0).integers(9, size=(2, 23))


@pytest.mark.parametrize("positions", ["rope", "sinusoidal", "none"])
@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("chunk", [1, 5, None])
def test_stream_equals_forward(positions, window, chunk):
    """With no sink tokens, streaming through the caches is the model's own forward, window or not."""
    model = small_model(positions, window=window, sinks=window is not None)
    full = model.forward(IDS)
    got = stream_logits(model, IDS, chunk=chunk)
    np.testing.assert_allclose(got, full, rtol=0, atol=1e-12)


@settings(max_examples=15)
@given(chunk=st.integers(1, 23), S=st.integers(1, 3))
def test_streaming_llm_output_does_not_depend_on_the_chunks(chunk, S):
    model = small_model("rope", window=5)
    one = stream_logits(model, IDS, sink_tokens=S, chunk=1)
    np.testing.assert_allclose(
        stream_logits(model, IDS, sink_tokens=S, chunk=chunk),
        one,
        atol=1e-12,
    )


def test_sinks_change_only_what_was_evicted():
    model = small_model("rope", window=5)
    a = stream_logits(model, IDS, sink_tokens=2)
    b = stream_logits(model, IDS)
    np.testing.assert_allclose(
        a[:, :5], b[:, :5], atol=1e-13
    )  # nothing forgotten yet
    assert np.abs(a[:, 6:] - b[:, 6:]).max() > 1e-6


def test_stream_errors():
    model = small_model("sinusoidal")
    with pytest.raises(ValueError, match="max_len=40"):
        stream_logits(model, np.zeros((1, 41), int))
    with pytest.raises(ValueError, match="chunk must be a positive integer"):
        stream_logits(model, IDS, chunk=0)
    with pytest.raises(ValueError, match=r"ids must have shape \[B, L\]"):
        stream_logits(model, IDS[0])
    # RoPE models stream past max_len: nothing in them depends on it
    assert stream_logits(
        small_model("rope", window=4), np.zeros((1, 50), int)
    ).shape == (1, 50, 9)


def test_transformer_with_window_and_sinks_gradients():
    model = small_model("rope", window=3, sinks=True)
    assert "block0.attn.sinks" in model.params
    errors = check_layer_gradients(model, IDS[:, :7], seed=3)
    assert max(errors.values()) < TOLERANCE, errors


def test_marked_copy():
    task = MarkedCopy(n_tokens=6, lag=2, p_marker=0.4, seq_len=30)
    b = task.sample(50, seed=1)
    x, t = b.inputs, b.targets
    assert (
        x.shape == (50, 30)
        and np.all(x[:, 0] == task.bos)
        and not b.mask[:, 0].any()
    )
    marked = x == task.marker
    assert marked.any() and not marked[:, :3].any()
    perm = np.random.default_rng(0).permutation(6)
    for r, c in zip(*np.nonzero(marked)):
        assert (
            x[r, c - 2] < 6 and t[r, c] == x[r, c - 2]
        )  # a marker copies an ordinary token
    ordinary = ~marked
    ordinary[:, 0] = False
    np.testing.assert_array_equal(t[ordinary], perm[x[ordinary]])
    assert task.vocab_size == 8
    np.testing.assert_array_equal(
        task.sample(50, seed=1).inputs, x
    )  # deterministic
    assert task.sample(3, seed=0, length=70).inputs.shape == (3, 70)


def test_window_bench_bookkeeping():
    r = run_window_bench(
        d_model=16,
        n_heads=2,
        n_kv_heads=1,
        window=8,
        contexts=(8, 32),
        rounds=1,
    )
    per_position = 1 * (8 + 8) * 4  # n_kv (d_k + d_v) float32
    assert (
        r[32]["full"][0] == 32 * per_position
        and r[32]["window"][0] == 8 * per_position
    )
    assert r[8]["window"][0] == r[8]["full"][0] == 8 * per_position
