"""The tiled kernels' worker threads (attn_np.flash.in_parallel): the heads
dealt out to two workers give the dense kernels' output and gradients, for
every way key/value heads broadcast; a worker's error reaches the caller;
the bench's timing helpers (attn_np.instruments.measure)."""

import numpy as np
import pytest

import attn_np.flash as flash
from attn_np import attention_backward, attention_forward
from attn_np.instruments import blas_threads, get_blas_threads
from attn_np.instruments.measure import (
    alternating_times,
    busy_core,
    matmul_probe,
    ratio_spread,
)

EXACT = 1e-12

needs_blas = pytest.mark.skipif(
    get_blas_threads() is None, reason="NumPy's BLAS is not OpenBLAS"
)


@pytest.fixture
def always_share(monkeypatch):
    """Share out even the tiny calls of a test."""
    monkeypatch.setattr(flash, "PARALLEL_MIN_FLOPS", 0)
    calls = []
    real = flash._Take

    def counting(*args, **kw):
        calls.append(args[1:])
        return real(*args, **kw)

    monkeypatch.setattr(flash, "_Take", counting)
    with blas_threads(2):
        yield calls


def both(q, k, v, dout, **kw):
    out, cache = attention_forward(q, k, v, causal=True)
    dense = (out, *attention_backward(dout, cache))
    out, cache = flash.flash_attention_forward(
        q, k, v, causal=True, block_q=5, block_k=7, **kw
    )
    return dense, (out, *flash.flash_attention_backward(dout, cache))


SHAPES = {
    # q, k/v leading axes: MHA, GQA as the layer lays it out, MQA, a
    # query broadcast against key/value heads, odd head counts
    "MHA": ((1, 4), (1, 4)),
    "GQA": ((1, 2, 3), (1, 2, 1)),
    "MQA": ((1, 1, 4), (1, 1, 1)),
    "q broadcast": ((1,), (3,)),
    "batch and heads": ((3, 5), (3, 1)),
}


@needs_blas
@pytest.mark.parametrize("name", SHAPES)
def test_shared_heads_equal_dense(always_share, name):
    qb, kb = SHAPES[name]
    rng = np.random.default_rng(len(name))
    L, d = 23, 6
    q = rng.standard_normal(qb + (L, d))
    k, v = (rng.standard_normal(kb + (L, d)) for _ in range(2))
    batch = np.broadcast_shapes(qb, kb)
    dout = rng.standard_normal(batch + (L, d))
    dense, tiled = both(q, k, v, dout)
    assert len(always_share) >= 2  # it did share the heads out
    for a, b in zip(dense, tiled):
        assert a.shape == b.shape
        assert np.max(np.abs(a - b)) < EXACT * max(1.0, np.max(np.abs(a)))


def _forward_backward(q, k, v, dout, **blocks):
    """The causal kernels' output and gradients, as one tuple."""
    out, cache = flash.flash_attention_forward(
        q, k, v, causal=True, **blocks
    )
    return (out, *flash.flash_attention_backward(dout, cache))


@needs_blas
def test_shared_equals_one_piece_bit_for_bit(monkeypatch):
    rng = np.random.default_rng(3)
    q, k, v, dout = (rng.standard_normal((2, 3, 40, 8)) for _ in range(4))

    def run():
        return _forward_backward(q, k, v, dout, block_q=8, block_k=16)

    with blas_threads(1):  # one worker: one piece
        alone = run()
    monkeypatch.setattr(flash, "PARALLEL_MIN_FLOPS", 0)
    with blas_threads(2):
        shared = run()
        assert get_blas_threads() == 2  # restored after the call
    for a, b in zip(alone, shared):
        np.testing.assert_array_equal(a, b)


@needs_blas
def test_workers_are_kept_between_calls(monkeypatch):
    """in_parallel reuses attn_np._workers' pool: a second call starts no
    thread."""
    import threading

    monkeypatch.setattr(flash, "PARALLEL_MIN_FLOPS", 0)
    q = np.random.default_rng(0).standard_normal((1, 4, 16, 4))
    with blas_threads(2):
        flash.flash_attention_forward(q, q, q, causal=True)
        before = {t.ident for t in threading.enumerate()}
        for _ in range(3):
            out, cache = flash.flash_attention_forward(q, q, q, causal=True)
            flash.flash_attention_backward(q, cache)
        assert {t.ident for t in threading.enumerate()} == before


@needs_blas
def test_more_parts_than_workers_equal_one_piece(monkeypatch):
    """With PARTS_PER_WORKER > 1 the two workers take the parts from one
    queue: every part is done once, the same numbers as in one piece."""
    rng = np.random.default_rng(5)
    q, k, v, dout = (rng.standard_normal((1, 7, 24, 4)) for _ in range(4))

    def run():
        return _forward_backward(q, k, v, dout, block_q=8, block_k=8)

    with blas_threads(1):
        alone = run()
    monkeypatch.setattr(flash, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(flash, "PARTS_PER_WORKER", 3)
    taken = []
    real = flash._Take

    def counting(*args, **kw):
        taken.append(args[2])
        return real(*args, **kw)

    monkeypatch.setattr(flash, "_Take", counting)
    with blas_threads(2):
        shared = run()
    assert len(taken) == 2 * 6  # six parts of the 7 heads, twice
    for a, b in zip(alone, shared):
        np.testing.assert_array_equal(a, b)


@needs_blas
def test_a_workers_error_reaches_the_caller(always_share, monkeypatch):
    def broken(*args):
        raise FloatingPointError("from a worker")

    monkeypatch.setattr(flash, "forward_tiles", broken)
    q = np.ones((1, 4, 8, 4))
    with pytest.raises(FloatingPointError, match="from a worker"):
        flash.flash_attention_forward(q, q, q, causal=True)
    assert get_blas_threads() == 2


def test_alternating_times_and_ratio_spread():
    seen = []
    fns = {name: (lambda n=name: seen.append(n)) for name in "abc"}
    t = alternating_times(fns, rounds=4)
    assert set(t) == set("abc") and all(len(x) == 4 for x in t.values())
    # a warm-up round, then a b c, c b a, a b c, c b a
    assert "".join(seen) == "abc" + "abc" + "cba" + "abc" + "cba"
    med, low, high = ratio_spread([2.0, 4.0, 6.0, 8.0], [1.0, 2.0, 2.0, 2.0])
    assert (med, low, high) == (2.5, 2.0, 3.25)  # 2, 2, 3, 4


def test_busy_core_runs_and_stops():
    with busy_core(seconds=30) as proc:
        assert proc.poll() is None  # spinning
    assert proc.returncode is not None  # stopped when the block ended


def test_matmul_probe():
    fn, flops = matmul_probe(8)
    assert flops == 2 * 8**3
    assert fn().shape == (8, 8)


def test_bench_prints_every_ratio_within_77_columns(capsys, monkeypatch):
    from attn_np.bench import flash as bench

    # a small reference product, and one BLAS thread: a quick test even
    # on a busy machine (the layout is what is tested)
    monkeypatch.setattr(
        bench, "matmul_probe", lambda n, dtype: matmul_probe(64, dtype)
    )
    argv = ["--L", "128", "--rounds", "2", "--skip-memory"]
    with blas_threads(1):
        assert bench.main(argv + ["--skip-load"]) == 0
    out = capsys.readouterr().out
    assert "layer" in out and "kernels" in out and "A/A" in out
    assert "lowest fraction of the matmul rate at any L" in out
    assert not any(w in out for w in ("goal", " met", "noisy"))
    assert max(len(line) for line in out.splitlines()) <= 77


def test_bench_load_and_why_small():
    from attn_np.bench import flash as bench

    with blas_threads(1):
        r = bench.under_load(64, rounds=1)
    assert {"dense growth", "flash growth", "flash / dense loaded"} <= set(r)
    assert all(np.isfinite(v).all() and v[0] > 0 for v in r.values())
    why = bench.why_load(calls=5)
    assert set(why) == {(a, b) for a in (False, True) for b in (1, 2)}
    assert all(len(x["seconds"]) == 5 for x in why.values())


def test_causal_flops_halves_the_attention_products():
    from attn_np import costs
    from attn_np.bench.flash import causal_flops

    L, d, h = 64, 32, 4
    full = costs.training_flops(1, L, d, h)
    kernels = causal_flops(L, d_model=d, n_heads=h, kernel_only=True)
    assert kernels == 3 * 2 * h * L * L * (d // h)  # half of 3 x 4 h L^2 d_k
    assert causal_flops(L, d_model=d, n_heads=h) == full - kernels
