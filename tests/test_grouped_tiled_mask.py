"""The grouped core's tiled path takes a mask (chapter 16): a mask function
or an array, the same for every batch row and head, gives the dense core's
outputs and gradients, passes a gradient check on every input, and a mask
that differs between heads is refused by name."""

import numpy as np
import pytest

from attn_np import TOLERANCE, GroupedQueryAttention, check_gradients
from attn_np.grouped import (
    grouped_attention_backward,
    grouped_attention_forward,
)
from attn_np.masks import (
    and_masks,
    causal_mod,
    create_mask,
    document_mod,
    or_masks,
    padding_mod,
    prefix_mod,
)

CU = [0, 11, 14, 29, 40]
MODS = {
    "documents": (and_masks(causal_mod, document_mod(CU)), False),
    "documents, causal=True": (document_mod(CU), True),
    "prefix-LM": (or_masks(causal_mod, prefix_mod(9)), False),
}


def _inputs(rng, B=2, n_kv=2, G=3, L=40, d=8):
    q = rng.standard_normal((B, n_kv, G, L, d))
    k, v = (rng.standard_normal((B, n_kv, L, d)) for _ in range(2))
    return q, k, v


def _grid(mod, L, causal):
    m = create_mask(mod, 1, 1, L, L)[0, 0]
    return m & np.tril(np.ones((L, L), bool)) if causal else m


@pytest.mark.parametrize("name", list(MODS))
@pytest.mark.parametrize("as_array", [False, True])
def test_tiled_with_a_mask_equals_the_dense_core(name, as_array):
    mod, causal = MODS[name]
    rng = np.random.default_rng(0)
    q, k, v = _inputs(rng)
    mask = create_mask(mod, 1, 1, 40, 40)[0, 0] if as_array else mod
    kw = dict(causal=causal, block_q=8, block_k=8)
    o, c = grouped_attention_forward(q, k, v, allowed=mask, tiled=True, **kw)
    od, cd = grouped_attention_forward(
        q, k, v, allowed=_grid(mod, 40, causal)
    )
    assert np.abs(o - od).max() < 1e-12
    do = rng.standard_normal(o.shape)
    g = grouped_attention_backward(do, c)
    gd = grouped_attention_backward(do, cd)
    for key in ("q", "k", "v"):
        assert np.abs(g[key] - gd[key]).max() < 1e-12, key


@pytest.mark.parametrize("name", list(MODS))
def test_gradient_check_of_the_tiled_core_with_a_mask(name):
    mod, causal = MODS[name]
    rng = np.random.default_rng(1)
    q, k, v = _inputs(rng, B=1, n_kv=2, G=2, L=40, d=4)
    sinks = rng.standard_normal((2, 2, 1, 1))

    def forward(q, k, v, sinks):
        return grouped_attention_forward(
            q,
            k,
            v,
            allowed=mod,
            causal=causal,
            sinks=sinks,
            tiled=True,
            block_q=8,
            block_k=8,
        )

    def backward(dout, cache):
        g = grouped_attention_backward(dout, cache)
        return g["q"], g["k"], g["v"], g["sinks"]

    errors = check_gradients(
        forward, backward, {"q": q, "k": k, "v": v, "sinks": sinks}
    )
    assert max(errors.values()) < TOLERANCE, errors
    assert TOLERANCE <= 1e-7


def test_a_mask_shared_by_every_head_may_come_with_head_axes():
    rng = np.random.default_rng(2)
    q, k, v = _inputs(rng)
    grid = _grid(MODS["documents"][0], 40, False)
    wide = np.broadcast_to(grid, (2, 2, 3, 40, 40))
    o, _ = grouped_attention_forward(q, k, v, allowed=wide, tiled=True)
    od, _ = grouped_attention_forward(q, k, v, allowed=grid)
    assert np.abs(o - od).max() < 1e-12


def test_a_mask_that_differs_between_rows_or_heads_is_refused():
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng)
    with pytest.raises(ValueError, match="same for every batch row"):
        grouped_attention_forward(
            q, k, v, allowed=padding_mod([40, 30]), tiled=True
        )
    heads = np.ones((1, 2, 1, 40, 40), bool)
    heads[0, 1, 0, :, 5] = False
    with pytest.raises(ValueError, match="same for every batch row"):
        grouped_attention_forward(q, k, v, allowed=heads, tiled=True)


def test_a_flash_layer_takes_a_mask_function():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 40, 24))
    mod = and_masks(causal_mod, document_mod(CU))
    dense = GroupedQueryAttention(24, 6, 2, seed=5)
    tiled = GroupedQueryAttention(24, 6, 2, seed=5, flash=True)
    y = tiled.forward(x, mask=mod)
    yd = dense.forward(x, mask=mod)
    assert np.abs(y - yd).max() < 1e-12
    dy = rng.standard_normal(y.shape)
    assert np.abs(tiled.backward(dy) - dense.backward(dy)).max() < 1e-12
