"""Cross-attention: chapter 3's layer with keys and values from another
sequence; its backward into the encoder, its cache made once per source."""

import numpy as np
import pytest

from attn_np import TOLERANCE, attention_forward, check_gradients
from attn_np.cross import CrossAttention, CrossCache
from attn_np.masks import padding_mod

RNG = np.random.default_rng(0)


def _layer(n_kv=2):
    layer = CrossAttention(12, 4, n_kv, seed=3)
    return layer


def test_forward_is_attention_over_the_source():
    """Per head, softmax(q k^T / sqrt(d)) v with q from x and k, v from
    memory: chapter 1's attention_forward on the same projections."""
    layer = _layer(n_kv=4)
    x, mem = RNG.standard_normal((2, 5, 12)), RNG.standard_normal((2, 7, 12))
    y = layer.forward(x, mem)
    W, d = layer.params, layer.d_k

    def heads(t, Wm):  # [B, L, h*d] -> [B, h, L, d]
        p = t @ Wm
        return p.reshape(*p.shape[:2], -1, d).transpose(0, 2, 1, 3)

    o, _ = attention_forward(
        heads(x, W["W_q"]), heads(mem, W["W_k"]), heads(mem, W["W_v"])
    )
    want = o.transpose(0, 2, 1, 3).reshape(2, 5, -1) @ W["W_o"]
    assert np.abs(y - want).max() < 1e-12


@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_gradients_into_the_decoder_and_the_encoder(n_kv):
    layer = _layer(n_kv)
    x, mem = RNG.standard_normal((2, 3, 12)), RNG.standard_normal((2, 5, 12))
    names = ("W_q", "W_k", "W_v", "W_o")

    def forward(x, memory, **params):
        layer.params.update(params)
        return layer.forward(x, memory), None

    def backward(dy, _):
        dx, dmem = layer.backward(dy)
        return (dx, dmem, *(layer.grads[n] for n in names))

    inputs = dict(x=x, memory=mem, **{n: layer.params[n] for n in names})
    errors = check_gradients(forward, backward, inputs)
    assert max(errors.values()) < TOLERANCE, errors


def test_the_cache_projects_the_source_once():
    layer = _layer()
    x, mem = RNG.standard_normal((1, 6, 12)), RNG.standard_normal((1, 9, 12))
    full = layer.forward(x, mem)
    cache = layer.new_cache()
    steps = [layer.forward(x[:, :1], mem, kv_cache=cache)]
    keys = cache.keys
    steps += [
        layer.forward(x[:, t : t + 1], kv_cache=cache) for t in range(1, 6)
    ]
    assert cache.keys is keys and len(cache) == 9
    assert np.abs(np.concatenate(steps, axis=1) - full).max() < 1e-12


def test_a_padded_source_with_a_mask_function():
    layer = _layer()
    x, mem = RNG.standard_normal((2, 3, 12)), RNG.standard_normal((2, 6, 12))
    lengths = np.array([6, 4])
    y = layer.forward(x, mem, mask=padding_mod(lengths))
    alone = layer.forward(x[1:], mem[1:, :4])
    assert np.abs(y[1:] - alone).max() < 1e-12


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda l, c: l.forward(np.ones((1, 2, 12))), "memory is needed"),
        (
            lambda l, c: l.forward(np.ones((1, 2, 12)), np.ones((2, 3, 12))),
            "share the batch",
        ),
        (
            lambda l, c: l.forward(np.ones((1, 2, 12)), np.ones((1, 3, 5))),
            "memory must be",
        ),
        (
            lambda l, c: l.forward(
                np.ones((1, 2, 12)), np.ones((1, 3, 12)), kv_cache=[]
            ),
            "CrossCache",
        ),
    ],
)
def test_bad_input_is_refused_by_name(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(_layer(), CrossCache())


def test_no_positions_between_two_sequences():
    with pytest.raises(ValueError, match="rope_base"):
        CrossAttention(12, 4, 2, rope_base=1e4)
