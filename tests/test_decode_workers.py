"""A decode step dealt out to worker threads (the lab's pool lent through
attn_np._workers, within
decode_workers(); off by default): the same outputs and attention weights
as in one piece, for every family, sinks and windows, and MLA's absorbed
step; a worker's error reaches the caller; the switch turns it on and
off."""

import numpy as np
import pytest

import attn_np._workers as hook
import attn_np.grouped as grouped
import attn_np.instruments.workers as workers
from attn_np import GroupedQueryAttention, KVCache, decode_workers
from attn_np.instruments import blas_threads, get_blas_threads
from attn_np.latent import LatentKVCache, MultiHeadLatentAttention

pytestmark = pytest.mark.skipif(
    get_blas_threads() is None, reason="NumPy's BLAS is not OpenBLAS"
)


@pytest.fixture
def shared(monkeypatch):
    """Share out even the tiny steps of a test, on two workers; count the
    shared calls."""
    monkeypatch.setattr(grouped, "DECODE_PARALLEL_MIN_FLOPS", 0)
    calls = []
    real = workers.run_tasks

    def counting(tasks):
        tasks = list(tasks)
        calls.append(len(tasks))
        return real(tasks)

    monkeypatch.setattr(grouped, "run_tasks", counting)
    with blas_threads(2), decode_workers():
        yield calls


def decode(layer, x, cache, chunks=(5, 3, 4) + (1,) * 11):
    outs, start, weights = [], 0, []
    for n in chunks:
        outs.append(layer.forward(x[:, start : start + n], kv_cache=cache))
        weights.append(layer.attention_weights)
        start += n
    return np.concatenate(outs, axis=1), weights


@pytest.mark.parametrize("n_kv", [8, 2, 1])
@pytest.mark.parametrize(
    "options", [{}, {"sinks": True}, {"window": 5}], ids=str
)
def test_shared_steps_equal_the_full_forward(shared, n_kv, options):
    rng = np.random.default_rng(n_kv)
    x = rng.standard_normal((3, 23, 32))
    layer = GroupedQueryAttention(32, 8, n_kv, seed=2, **options)
    if "sinks" in options:
        layer.params["sinks"][:] = rng.standard_normal(8)
    full = layer.forward(x, causal=True)
    window = options.get("window")
    y, w = decode(layer, x, KVCache(window=window))
    assert np.abs(y - full).max() < 1e-12
    assert shared, "no step was shared out"
    with decode_workers(False):
        y1, w1 = decode(layer, x, KVCache(window=window))
    # the heads dealt out: the same products; one key/value head's
    # positions dealt out: the same softmax, rounded in another order
    assert np.abs(y - y1).max() < 1e-13 and (n_kv == 1 or (y == y1).all())
    for a, b in zip(w, w1):
        assert np.abs(a - b).max() < 1e-13 and (n_kv == 1 or (a == b).all())


def test_shared_latent_steps_equal_the_full_forward(shared):
    x = np.random.default_rng(0).standard_normal((2, 23, 32))
    layer = MultiHeadLatentAttention(
        32, 4, d_head=8, d_latent_kv=16, d_rope=4, d_head_v=8, seed=0
    )
    full = layer.forward(x, causal=True)
    y, _ = decode(layer, x, LatentKVCache())
    assert np.abs(y - full).max() < 1e-12 and shared


def test_the_switch_turns_sharing_on_and_off(shared):
    layer = GroupedQueryAttention(32, 8, 2, seed=0)
    x = np.random.default_rng(1).standard_normal((1, 6, 32))
    with decode_workers(False):
        decode(layer, x, KVCache(), chunks=(5, 1))
        assert not workers.sharing()
    assert shared == [] and workers.sharing()
    decode(layer, x, KVCache(), chunks=(5, 1))
    assert shared == [2, 2]  # the prefill of 5 and the step, two workers


def test_off_by_default():
    assert not workers.sharing()
    with decode_workers():
        assert workers.sharing()
    assert not workers.sharing()
    with pytest.raises(TypeError, match="enabled must be True or False"):
        with decode_workers("yes"):
            pass


def test_a_workers_error_reaches_the_caller(shared):
    """Scores that overflow float32 in one worker's heads are refused, as
    in one piece."""
    layer = GroupedQueryAttention(8, 2, 2, seed=0, dtype=np.float32)
    cache = KVCache()
    k = np.ones((1, 2, 3, 4), np.float32)
    k[:, 1] = 1e20  # key/value head 1 only: the second worker's
    cache.append(k, np.ones_like(k))
    layer.params["W_q"][:] = 1e20 / 8  # queries of about 1e20
    with pytest.raises(ValueError, match="overflowed"):
        layer.forward(np.ones((1, 1, 8), np.float32), kv_cache=cache)


def test_run_tasks_in_order_and_nested_calls_run_in_place():
    def inner():
        return workers.run_tasks([lambda: 1, lambda: 2])

    assert workers.run_tasks([inner, lambda: 3, inner]) == [
        [1, 2],
        3,
        [1, 2],
    ]
    assert workers.split(5, 2) == [slice(0, 2), slice(2, 5)]
    assert workers.split(1, 2) == [slice(0, 1)]


@pytest.mark.parametrize("shape", [(3, 40), (2, 1, 40)])
def test_row_products_equal_the_products(monkeypatch, shape):
    """Each worker's block of rows of every weight, the blocks added (the
    bench's worker probe): the products to rounding, for 2-D and 3-D
    inputs and mixed dtypes."""
    monkeypatch.setattr(workers, "SHARED_MIN_BYTES", 0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    weights = [rng.standard_normal((40, n)) for n in (7, 1, 33)]
    weights[1] = weights[1].astype(np.float32)
    with blas_threads(2), decode_workers():
        got = workers.row_products(x, *weights)
    for y, W in zip(got, weights):
        want = x @ W
        assert y.shape == want.shape and y.dtype == want.dtype
        assert np.abs(y - want).max() < 1e-12


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork")
def test_a_forked_child_makes_its_own_workers():
    """A child made by fork does not wait for the parent's threads."""
    import os

    workers.run_tasks([lambda: 1, lambda: 2])  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the tasks ran
        ok = workers.run_tasks([lambda: 1, lambda: 2]) == [1, 2]
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_positions_shared_out_equal_the_softmax(monkeypatch):
    """One key/value head, no mask, no sink: each worker its positions, the
    partial softmaxes merged (o and p), against the core in one piece;
    scores far apart (one worker's maxima far below the other's)."""
    monkeypatch.setattr(grouped, "DECODE_PARALLEL_MIN_FLOPS", 0)
    calls, real = [], grouped._attend_positions_in_workers
    monkeypatch.setattr(
        grouped,
        "_attend_positions_in_workers",
        lambda *a: calls.append(1) or real(*a),
    )
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 1, 6, 1, 8))
    k = rng.standard_normal((2, 1, 41, 8))
    k[:, :, 25:] *= 30  # the second worker's keys dominate
    v = rng.standard_normal((2, 1, 41, 3))
    with blas_threads(2), decode_workers():
        o, c = grouped.grouped_attention_forward(q, k, v)
        with decode_workers(False):
            o1, c1 = grouped.grouped_attention_forward(q, k, v)
    assert np.abs(o - o1).max() < 1e-13
    assert np.abs(c.weights - c1.weights).max() < 1e-13
    assert np.allclose(c.weights.sum(-1), 1.0, rtol=0, atol=1e-14)
    assert calls == [1]  # shared out once, in one piece once


def test_kernels_without_lent_threads_work_in_one_piece():
    """No lender: one worker, the tasks one after the other in the
    calling thread (the kernels make no threads of their own)."""
    import threading

    hook.lend_threads(None, None)
    try:
        assert hook.worker_count() == 1
        seen = hook.run_tasks([threading.get_ident, threading.get_ident])
        assert seen == [threading.get_ident()] * 2
        with pytest.raises(TypeError, match="run and count"):
            hook.lend_threads(workers.run_tasks, None)
    finally:
        workers.lend()
    assert hook.worker_count() == workers.worker_count()
