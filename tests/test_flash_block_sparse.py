"""Block sparsity from a mask in the tiled kernel (chapter 16): tiles the
mask hides are skipped, tiles it shows need no mask, and the outputs and
gradients are the dense kernels' with the same mask."""

import numpy as np
import pytest

from attn_np import (
    TOLERANCE,
    attention_backward,
    attention_forward,
    check_gradients,
    flash_attention_backward,
    flash_attention_forward,
)
from attn_np.flash import SKIP, Tiles
from attn_np.masks import (
    and_masks,
    causal_mod,
    create_mask,
    document_mod,
    or_masks,
    prefix_mod,
)

CU = [0, 37, 40, 101, 128]


@pytest.mark.parametrize(
    "mod, causal",
    [
        (and_masks(causal_mod, document_mod(CU)), False),
        (document_mod(CU), True),
        (or_masks(causal_mod, prefix_mod(20)), False),
    ],
)
def test_tiles_from_a_mask_equal_the_dense_kernels(mod, causal):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 128, 8)) for _ in range(3))
    dout = rng.standard_normal((2, 3, 128, 8))
    grid = create_mask(mod, 1, 1, 128, 128)[0, 0]
    if causal:
        grid = grid & np.tril(np.ones((128, 128), bool))
    o, c = flash_attention_forward(
        q, k, v, mask=mod, causal=causal, block_q=32, block_k=32
    )
    od, cd = attention_forward(q, k, v, mask=grid)
    assert np.abs(o - od).max() < 1e-12
    g = flash_attention_backward(dout, c)
    gd = attention_backward(dout, cd)
    for a, b in zip(g, gd):
        assert np.abs(a - b).max() < 1e-12


def test_a_packed_row_skips_the_tiles_between_documents():
    grid = create_mask(
        and_masks(causal_mod, document_mod(CU)), 1, 1, 128, 128
    )[0, 0]
    tiles = Tiles(128, 128, 32, 32, causal=False, window=None, mask=grid)
    dense = Tiles(128, 128, 32, 32, causal=True, window=None)
    assert (tiles.plan == SKIP).sum() > (dense.plan == SKIP).sum()
    assert tiles.pairs < dense.pairs


def test_gradient_check_with_block_sparsity():
    rng = np.random.default_rng(1)
    inputs = {n: rng.standard_normal((2, 20, 4)) for n in ("q", "k", "v")}
    mod = and_masks(causal_mod, document_mod([0, 7, 9, 20]))

    def forward(q, k, v):
        return flash_attention_forward(
            q, k, v, mask=mod, block_q=4, block_k=4
        )

    errors = check_gradients(forward, flash_attention_backward, inputs)
    assert max(errors.values()) < TOLERANCE, errors


def test_a_mask_of_the_wrong_kind_is_refused():
    q = np.zeros((4, 2))
    with pytest.raises(ValueError, match=r"\[4, 4\]"):
        flash_attention_forward(q, q, q, mask=np.ones((4, 3), bool))
    with pytest.raises(ValueError, match="bool"):
        flash_attention_forward(q, q, q, mask=np.ones((4, 4)))
