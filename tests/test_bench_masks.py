"""The block-sparsity benchmark (chapter 16) on a small row: its three
contenders agree, and the sparse kernel computes fewer tiles."""

import numpy as np

from attn_np.bench.masks import (
    check_same,
    contenders,
    packed_row,
    tile_counts,
)


def test_a_packed_row_covers_the_row():
    cu = packed_row(1000, 8, seed=3)
    assert cu[0] == 0 and cu[-1] == 1000 and len(cu) == 9
    assert (np.diff(cu) > 0).all()


def test_contenders_agree_and_sparsity_skips_tiles():
    L = 768
    steps, grid = contenders(L, packed_row(L, 6), heads=2, d_k=16)
    assert check_same(steps) < 1e-4
    counts = tile_counts(L, grid)
    assert counts["tiled"][0] == counts["tiled"][1] == 9
    assert counts["sparse"][0] < 9
    assert counts["sparse"][2] < counts["tiled"][2] == L * L
