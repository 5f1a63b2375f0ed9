"""python -m attn_np.bench decode --formulations: every formulation of a
decode step's attention over its cache computes the grouped core's
output (blocks and their tail, two workers by heads or by positions),
and the table's bookkeeping."""

import numpy as np
import pytest

from attn_np import grouped_attention_forward
from attn_np.bench import decode as bench
from attn_np.instruments import blas_threads, get_blas_threads
from attn_np.instruments import decode_ceiling as ceiling

D, H, CTX = 64, 8, 300


def core_output(case, qs):
    """The grouped core's output for the scaled queries ``qs [B, n_kv, R,
    d_k]`` over the case's cache: ``[B, n_kv, R, d_v]``."""
    layer, cache = case["layer"], case["cache"]
    if hasattr(cache, "rows"):
        k = cache.rows[:, None]
        v = k[..., : layer.d_latent_kv]
    else:
        k, v = cache.keys, cache.values
    o, _ = grouped_attention_forward(
        qs[:, :, :, None].astype(np.float64),
        k.astype(np.float64),
        v.astype(np.float64),
        scale=1.0,
    )
    return o[:, :, :, 0]


@pytest.mark.parametrize("family", ["MHA", "GQA", "MQA", "MLA"])
def test_every_formulation_is_the_cores_attention(family):
    case = bench.step_case(family, D, H, CTX)
    # a small "L2": several blocks and a tail of 300 + 1 positions
    fns = ceiling.formulations(case, l2=2**15, l1=2**12)
    assert list(fns) == list(ceiling.FORMULATIONS)
    qs = _queries(case)
    want = core_output(case, qs)
    for name, fn in fns.items():
        if name.startswith("library"):
            o, _ = fn()  # the layer's own attention: (o, cache)
            assert o.shape[:3] == want.shape[:3]
            continue
        got = fn()
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)


def _queries(case, seed=0):
    """The scaled queries :func:`ceiling.formulations` draws (same seed)."""
    layer, cache = case["layer"], case["cache"]
    if hasattr(cache, "rows"):
        n_kv, G, d_k = 1, layer.n_heads, cache.rows.shape[-1]
        scale = layer.scale
    else:
        n_kv, G, d_k = layer.n_kv_heads, layer.group_size, layer.d_k
        scale = 1.0 / np.sqrt(d_k)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, n_kv, G, d_k), dtype=np.float32)
    return q * np.float32(scale)


@pytest.mark.skipif(get_blas_threads() is None, reason="not OpenBLAS")
@pytest.mark.parametrize("n_kv", [1, 2, 3])
def test_blocked_in_two_workers_equals_one_piece(n_kv):
    """By heads (n_kv >= 2, an odd count too) or by positions (one head,
    FlashDecoding's combine)."""
    rng = np.random.default_rng(n_kv)
    T, d, R = 203, 16, 4
    buf = rng.standard_normal((1, n_kv, 2 * d, T + 5), dtype=np.float32)
    kt, vt = buf[:, :, :d, :T], buf[:, :, d:, :T]
    qs = rng.standard_normal((1, n_kv, R, d), dtype=np.float32)
    sizes = (64, 32)
    one = ceiling.blocked(qs, kt, vt, sizes)
    with blas_threads(2):
        two = ceiling.blocked_in_workers(qs, kt, vt, sizes)
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)
    s = qs.astype(np.float64) @ kt
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = p @ vt.swapaxes(-1, -2)
    np.testing.assert_allclose(one, want, rtol=1e-4, atol=1e-5)


def test_blocks_are_views_of_the_cache():
    x = np.arange(2 * 3 * 10, dtype=np.float32).reshape(2, 3, 10)
    b = ceiling._blocks(x, 4)  # [2, 2, 3, 4]: the tail (2) left out
    assert b.shape == (2, 2, 3, 4) and np.shares_memory(b, x)
    np.testing.assert_array_equal(b[1, 1], x[1, :, 4:8])


def test_block_sizes():
    # d = 128 floats: 1 MiB of L2 holds 2048 positions, half of it 1024;
    # 4 rows of weights per position, half of 32 KiB: 1024
    assert ceiling.block_sizes(128, 128, 4) == (1024, 1024)
    assert ceiling.block_sizes(128, 128, 16) == (1024, 256)
    assert ceiling.block_sizes(576, 512, 16) == (128, 256)  # MLA's rows
    assert ceiling.block_sizes(8, 8, 1) == (4096, 4096)  # at most 4096
    assert ceiling.block_sizes(10**6, 10**6, 1)[0] == 64  # at least 64


def test_a_formulation_that_differs_is_refused(monkeypatch):
    case = bench.step_case("GQA", D, H, CTX)
    monkeypatch.setattr(
        ceiling, "blocked_values", lambda p, vt, n: np.zeros(1)
    )
    with pytest.raises(ValueError, match="'blocked' differs"):
        ceiling.formulations(case)


@pytest.mark.parametrize(
    "ratio, word",
    [
        ((0.8, 0.75, 0.85), "faster"),
        ((1.2, 1.15, 1.25), "slower"),
        ((0.95, 0.9, 0.99), "noise"),  # inside the A/A quartiles
        ((1.0, 0.8, 1.2), "noise"),
    ],
)
def test_verdict_against_the_a_a_floor(ratio, word):
    assert ceiling.verdict(ratio, (1.0, 0.93, 1.06)) == word


def test_ceiling_rows_and_table():
    cases = {"GQA": {"kv_bytes": 2e6}}
    t = {name: np.array([2e-3, 3e-3]) for name in ceiling.FORMULATIONS}
    t["blocked"] = np.array([1e-3, 1.5e-3])  # half the library's, paired
    rows = ceiling.ceiling_rows(
        {("GQA", n): x for n, x in t.items()}, cases, np.array([1e9, 2e9])
    )
    row = rows["GQA"]["blocked"]
    assert row["time"] == 1e-3
    assert row["of cache at ref"] == pytest.approx(2e6 / 2e9 / 1e-3)
    assert row["over library"] == (0.5, 0.5, 0.5)
    lines = ceiling.ceiling_table(rows)
    assert max(map(len, lines)) <= 77
    (blocked,) = [x for x in lines if "blocked " in x and "thread" not in x]
    assert "faster" in blocked and "(fastest)" in blocked
