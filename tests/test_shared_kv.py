"""Layers that share keys and values across depth (attn_np.shared_kv):
the readers' gradients of the shared keys and values add up in the
producer's backward, checked by central differences in float64."""

import numpy as np
import pytest

from attn_np import GroupedQueryAttention, check_layer_gradients
from attn_np.instruments.gradcheck import TOLERANCE
from attn_np.shared_kv import KVReader, SharedKVStack, shared_kv


def _stack(n_readers=2, rope=1e4, sinks=False):
    producer = GroupedQueryAttention(
        16, 4, 2, seed=0, rope_base=rope, sinks=sinks
    )
    readers = [
        KVReader(16, 4, 2, seed=i + 1, rope_base=rope, sinks=sinks)
        for i in range(n_readers)
    ]
    return SharedKVStack(producer, readers)


@pytest.mark.parametrize("n_readers", [1, 3])
@pytest.mark.parametrize("rope", [None, 1e4])
def test_gradients_of_a_producer_and_its_readers(n_readers, rope):
    """Every input and parameter, the producer's W_k and W_v included
    (their gradient is the sum over the producer and every reader)."""
    stack = _stack(n_readers, rope)
    x = np.random.default_rng(0).standard_normal((2, 5, 16))
    errors = check_layer_gradients(stack, x)
    assert "producer.W_k" in errors and "reader0.W_q" in errors
    assert "reader0.W_k" not in errors  # a reader has no keys of its own
    assert max(errors.values()) < TOLERANCE, errors


def test_gradients_with_sinks():
    stack = _stack(2, 1e4, sinks=True)
    x = np.random.default_rng(1).standard_normal((1, 6, 16))
    errors = check_layer_gradients(stack, x)
    assert "reader1.sinks" in errors
    assert max(errors.values()) < TOLERANCE, errors


def test_the_readers_share_gradient_matters():
    """Leave the readers' dk, dv out and the producer's W_k gradient is
    another one: the sum is not a no-op."""
    stack = _stack(2, 1e4)
    x = np.random.default_rng(2).standard_normal((1, 5, 16))
    dy = np.random.default_rng(3).standard_normal((1, 5, 16))
    stack.forward(x)
    stack.backward(dy)
    full = stack.producer.grads["W_k"].copy()
    stack.forward(x)
    y1 = dy.copy()
    for r in reversed(stack.readers):
        y1 = y1 + r.backward(y1)
    stack.producer.backward(y1)  # without dkv
    assert not np.allclose(full, stack.producer.grads["W_k"])


def test_a_reader_with_the_producers_weights_is_the_producer():
    """Given the producer's own input and W_q, W_o, a reader's output is
    the producer's (the same keys, values and queries)."""
    rng = np.random.default_rng(4)
    p = GroupedQueryAttention(16, 4, 2, seed=0, rope_base=1e4)
    r = KVReader(16, 4, 2, seed=9, rope_base=1e4)
    r.params["W_q"][...] = p.params["W_q"]
    r.params["W_o"][...] = p.params["W_o"]
    x = rng.standard_normal((2, 7, 16))
    y = p.forward(x, causal=True)
    assert np.allclose(r.forward(x, shared_kv(p)), y, rtol=0, atol=1e-13)
    assert set(r.params) == {"W_q", "W_o"}


def test_bad_shared_keys_are_named():
    p = GroupedQueryAttention(16, 4, 2, seed=0)
    x = np.random.default_rng(5).standard_normal((1, 5, 16))
    r = KVReader(16, 4, 2, seed=1)
    with pytest.raises(RuntimeError, match="shared_kv needs"):
        shared_kv(p)
    p.forward(x, causal=True)
    k, v = shared_kv(p)
    with pytest.raises(TypeError, match="kv must be"):
        r.forward(x, k)
    with pytest.raises(ValueError, match="kv must be k"):
        r.forward(x[:, :4], (k, v))
    bad = np.array(v)
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="v"):
        r.forward(x, (k, bad))
    dy = np.ones((1, 5, 16))
    p.forward(x, causal=True)
    with pytest.raises(ValueError, match="dk must have the shape"):
        p.backward(dy, dkv=(k[:, :, :4], v))
    with pytest.raises(TypeError, match="dkv must be a tuple"):
        p.backward(dy, dkv=[k, v])
    with pytest.raises(ValueError, match="n_kv_heads, d_k, d_v"):
        SharedKVStack(p, [KVReader(16, 4, 1)])
    with pytest.raises(TypeError, match="readers must be KVReaders"):
        SharedKVStack(p, [p])
