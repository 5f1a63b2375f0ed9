"""The tiled forward's shift (attn_np.flash._shift): exact on a row's
first tile, then moved by the log2 of a tile's row sum, or made again
after an overflow; the parts of a masked tile (Tiles.blocks); the layer's
output and gradients in the merged layout, and its cache released by
its backward (chapter 9's memory)."""

import numpy as np
import pytest

import attn_np.flash as flash
from attn_np import MultiHeadAttention, attention_backward, attention_forward
from attn_np.grouped import grouped_attention_backward
from attn_np.heads import merge_groups
from attn_np.masks import position_mask

EXACT = 1e-12


def rising(dtype, step, L=48, d=4, seed=0):
    """Queries and keys whose scores rise by about ``step`` per key, so
    that every later tile's scores pass the shift of the first ones."""
    rng = np.random.default_rng(seed)
    q = np.ones((1, 2, L, d)) + 0.1 * rng.standard_normal((1, 2, L, d))
    k = 0.1 * rng.standard_normal((1, 2, L, d))
    k[..., 0] += step * np.arange(L) * np.sqrt(d)  # scores ~ step * j
    v = rng.standard_normal((1, 2, L, 3))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def counted(monkeypatch):
    """Count the shift's moves: exact (``alpha`` None) and by row sums."""
    seen = {"exact": 0, "sum": 0}
    real = flash._move

    def move(m, l, acc, m_new, alpha=None):
        seen["exact" if alpha is None else "sum"] += 1
        return real(m, l, acc, m_new, alpha)

    monkeypatch.setattr(flash, "_move", move)
    return seen


def check_equal(q, k, v, exact=EXACT, **kw):
    """float64: the dense kernels' numbers to rounding. float32: finite
    and near them (scores in the hundreds are ill-conditioned in float32:
    dQ sums dS times keys of hundreds, whose recomputed P sums to 1 only
    to float32's rounding, in the tiled kernels old and new alike)."""
    dout = np.random.default_rng(1).standard_normal(q.shape[:-1] + (3,))
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    o, c = attention_forward(q64, k64, v64, causal=True)
    want = (o, *attention_backward(dout, c))
    o, cache = flash.flash_attention_forward(q, k, v, causal=True, **kw)
    got = (o, *flash.flash_attention_backward(dout.astype(q.dtype), cache))
    tol = exact if q.dtype == np.float64 else 2e-3
    for a, b in zip(got, want):
        assert np.all(np.isfinite(a))
        scale = max(1.0, float(np.max(np.abs(b))))
        assert np.max(np.abs(a - b)) < tol * scale


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_shift_moves_by_row_sums(monkeypatch, dtype):
    # 5 per key: a tile of 8 keys passes the shift by ~40 (2^58 > 2^16)
    seen = counted(monkeypatch)
    check_equal(*rising(dtype, 5.0), block_q=16, block_k=8)
    assert seen["sum"] > 0  # the moves by row sums happened


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_overflow_makes_the_tile_again(monkeypatch, dtype):
    # float64 overflows past 2^1024, float32 past 2^128: a tile of 8 keys
    # at 200 (float64) or 30 (float32) per key passes the shift by more
    step = 200.0 if dtype == np.float64 else 30.0
    seen = counted(monkeypatch)
    calls = []
    real = flash._shift

    def shift(*args):
        ok = real(*args)
        calls.append(ok)
        return ok

    monkeypatch.setattr(flash, "_shift", shift)
    # scores near 10^4 in float64: rounding of 10^4 * 2^-52 in S
    check_equal(*rising(dtype, step), 1e-10, block_q=16, block_k=8)
    assert False in calls  # an overflow was seen, the tile made again
    assert seen["exact"] > len(calls) - calls.count(True)


def test_parts_of_a_masked_tile_cover_exactly_its_pairs():
    for L_q, L_k, window, bq, bk, sub in [
        (512, 512, None, 256, 256, 128),
        (300, 700, None, 256, 256, 128),
        (512, 512, 200, 256, 256, 128),
        (64, 64, 9, 32, 16, 8),
    ]:
        tiles = flash.Tiles(L_q, L_k, bq, bk, causal=True, window=window)
        allowed = position_mask(
            np.arange(L_q) + L_k - L_q, np.arange(L_k), window=window
        )
        got = np.zeros((L_q, L_k), int)
        for i, (r0, _) in enumerate(tiles.rows):
            for j in tiles.in_row(i):
                c0 = tiles.cols[j][0]
                hidden = tiles.hidden(i, j)
                parts = (
                    flash._parts(hidden, sub)
                    if hidden is not None
                    else tiles.blocks(i, j)
                )
                for a, b, ca, cb, h in parts:
                    seen = np.ones((b - a, cb - ca), bool)
                    if h is not None:
                        seen = ~h
                    got[r0 + a : r0 + b, c0 + ca : c0 + cb] += seen
        np.testing.assert_array_equal(got, allowed.astype(int))


def test_diagonal_tile_computes_three_quarters():
    tiles = flash.Tiles(512, 512, 256, 256, causal=True, window=None)
    pairs = sum(
        (b - a) * (cb - ca) for a, b, ca, cb, _ in tiles.blocks(0, 0)
    )
    assert pairs == 256 * 256 * 3 // 4


def test_layer_merges_heads_without_a_copy_and_releases_its_cache():
    layer = MultiHeadAttention(16, 4, dtype=np.float64, flash=True)
    x = np.random.default_rng(0).standard_normal((2, 9, 16))
    layer.forward(x, causal=True)
    att = layer._att
    merged = merge_groups(att.out)  # [B, L, h*d_v]: a view, no copy
    assert np.shares_memory(merged, att.out)
    layer.backward(np.ones_like(x) * 0.5)
    assert att.out is None and att.tiled.out is None  # freed once read
    with pytest.raises(RuntimeError, match="one backward"):
        layer.backward(np.ones_like(x))
    with pytest.raises(ValueError, match="released"):
        grouped_attention_backward(np.ones((2, 4, 1, 9, 4)), att)
    with pytest.raises(ValueError, match="released"):
        flash.flash_attention_backward(np.ones((2, 4, 1, 9, 4)), att.tiled)


def test_dense_layer_keeps_its_cache():
    layer = MultiHeadAttention(16, 4, dtype=np.float64)
    x = np.random.default_rng(0).standard_normal((2, 9, 16))
    layer.forward(x, causal=True)
    a = layer.backward(np.ones_like(x))
    np.testing.assert_array_equal(a, layer.backward(np.ones_like(x)))
