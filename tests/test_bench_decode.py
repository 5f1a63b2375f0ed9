"""python -m attn_np.bench decode: the table's bookkeeping at toy sizes
(its figures are machine-dependent, its arithmetic is not), the read
probes, and the parts of a step it times alone."""

import numpy as np
import pytest

from attn_np import (
    GroupedQueryAttention,
    KVCache,
    attention_forward,
    grouped_attention_forward,
)
from attn_np.bench import decode as bench
from attn_np.instruments.measure import read_probes

D, H, CTX = 32, 8, 40
SMALL = dict(
    d_model=D,
    n_heads=H,
    context=CTX,
    rounds=2,
    probe_bytes=2**20,
    flush_bytes=2**16,
)


@pytest.fixture(scope="module")
def result():
    return bench.run(**SMALL)


def test_families_and_bytes(result):
    d_k = D // H
    assert bench.families(16) == {"MHA": 16, "GQA": 4, "MQA": 1}
    assert list(result["rows"]) == ["MHA", "GQA", "MQA", "MLA"]
    for fam, n_kv in bench.families(H).items():
        row = result["rows"][fam]
        assert row["n_kv_heads"] == n_kv
        # the four projections, then the cache with the step's own token
        weights = 4 * (2 * D * H * d_k + 2 * D * n_kv * d_k)
        kv = 4 * n_kv * (CTX + 1) * 2 * d_k
        assert row["step_bytes"] == weights + kv
        assert row["cache_bytes"] == 4 * n_kv * CTX * 2 * d_k
        assert row["attention_flops"] == 2 * 2 * H * (CTX + 1) * d_k
    assert result["bytes_mha_over_mqa"] == pytest.approx(
        result["rows"]["MHA"]["step_bytes"]
        / result["rows"]["MQA"]["step_bytes"]
    )
    # MLA, absorbed: W_q, W_qr, W_dkv, W_kr, W_uk, W_uv, W_o, then the
    # cached rows [c_KV ; k_R] with the step's own
    dims = bench.latent_dims(D, H)
    assert dims == {
        "d_head": 4,
        "d_latent_kv": 16,
        "d_rope": 2,
        "d_head_v": 4,
    }
    d_h, d_c, d_r, d_v = 4, 16, 2, 4
    mla = result["rows"]["MLA"]
    weights = D * H * d_h + D * H * d_r + D * d_c + D * d_r
    weights += d_c * H * d_h + d_c * H * d_v + H * d_v * D
    assert mla["weight_bytes"] == 4 * weights
    assert mla["step_bytes"] == 4 * (weights + (CTX + 1) * (d_c + d_r))
    assert mla["cache_bytes"] == 4 * CTX * (d_c + d_r)
    assert mla["n_kv_heads"] is None
    scores = 2 * H * (CTX + 1) * (d_c + d_r)
    assert mla["attention_flops"] == scores + 2 * H * (CTX + 1) * d_c


def test_rates_fractions_and_gap_add_up(result):
    ref = result["reference"]
    assert ref == max(result["bandwidths"].values()) > 0
    assert result["bandwidths"][result["reference_name"]] == ref
    assert result["matmul_rate"] > 0
    for row in result["rows"].values():
        t = row["time"]
        assert row["bytes_per_s"] == pytest.approx(row["step_bytes"] / t)
        assert row["fraction"] == pytest.approx(row["bytes_per_s"] / ref)
        assert 0 < row["roof"] <= 1 + 1e-12
        # weights at the reference, attention timed right after itself
        again = row["parts"]["attention (again)"]
        w = row["weight_bytes"]
        if row["n_kv_heads"]:  # the MLA row's weights: above
            assert w == 4 * 2 * D * (H + row["n_kv_heads"]) * (D // H)
        assert row["best"] == pytest.approx(
            row["step_bytes"] / ref / (w / ref + again)
        )
        # the parts of the gap add up to time - bytes / reference
        gap = sum(row["gap"].values())
        assert gap == pytest.approx(t - row["step_bytes"] / ref)
        assert row["gap"]["softmax"] == row["parts"]["softmax"] > 0
    assert result["mha_over_mqa"] == pytest.approx(
        result["rows"]["MHA"]["time"] / result["rows"]["MQA"]["time"]
    )


def test_table_fits_the_page(result):
    lines = bench.table(result)
    assert len(lines) == 2 + 4
    assert all(len(line) <= 77 for line in lines)
    assert [line.split()[0] for line in lines[2:]] == [
        "MHA",
        "GQA",
        "MQA",
        "MLA",
    ]


def test_main_prints_within_77_columns(capsys, monkeypatch):
    real_run = bench.run

    def small_run(*args, **kw):
        return real_run(*args, probe_bytes=2**20, **kw)

    monkeypatch.setattr(bench, "run", small_run)
    argv = ["--d-model", "32", "--heads", "8", "--context", "40"]
    argv += ["--rounds", "1", "--levers", "--formulations"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "no temporaries" in out and "stacked products" in out
    assert "blocked, 2 workers" in out and "(fastest)" in out
    words = " ".join(out.split())
    assert "fraction of its roof: MHA" in words
    assert "(no K/V gap)" in words
    assert "time MHA / MQA" in out and "for their bytes" in words
    assert not any(w in out for w in ("goal", " met", "noisy"))
    assert max(len(line) for line in out.splitlines()) <= 77


def test_read_probes_read_what_they_say():
    probes = read_probes(2**20)
    assert len(probes) == 5
    for name, (fn, nbytes) in probes.items():
        assert nbytes == 2**20
        out = np.asarray(fn()).astype(np.float64)
        # every probe adds up the 2**18 ones, each once: all of them, 1024
        # per row of a [256, 1024] matrix, or 256 per column of it
        assert out.sum() == 2**18 and np.all(out == out.flat[0]), name


def test_step_parts_are_the_steps_work():
    """The attention part is the layer's attention over the cache: on the
    same query rows it gives the layer's own output heads."""
    layer, cache, step = bench.decode_setup(D, H, 2, CTX)
    parts = bench.step_parts(layer, cache)
    assert set(parts) == set(bench.PARTS)
    q, k, v = parts["attention"]()[1].q, cache.keys, cache.values
    # G = 4 rows per key/value head: one product per query head
    assert layer.per_head_rows(1) and not layer.per_head_rows(2)
    assert q.shape == (1, 2, H // 2, 1, D // H)
    out, att = attention_forward(q, k[:, :, None], v[:, :, None])
    np.testing.assert_allclose(parts["attention"]()[0], out, rtol=1e-6)
    w = parts["weights"]()
    assert [a.shape for a in w] == [(1, D), (1, 2 * 4), (1, 2 * 4), (1, D)]
    p = parts["softmax"]()
    np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-5)
    step()
    assert len(cache) == CTX and cache.reallocations == 0


def test_decode_setup_step_is_undone():
    layer, cache, step = bench.decode_setup(D, H, 1, 10, batch=2)
    before = cache.keys.copy()
    step()
    step()
    assert len(cache) == 10 and cache.reallocations == 0
    np.testing.assert_array_equal(cache.keys, before)
    assert isinstance(layer, GroupedQueryAttention)
    assert isinstance(cache, KVCache)


# -- the decode path's layout: what the benchmark's speed rests on


def test_cache_keeps_keys_and_values_transposed():
    """Each head's keys and values are stored as rows ``len`` positions
    long, so that ``q K^T`` and ``p V`` stream along them."""
    cache = KVCache(initial_capacity=16)
    rng = np.random.default_rng(0)
    k = rng.standard_normal((2, 3, 5, 4))
    v = rng.standard_normal((2, 3, 5, 6))
    keys, values = cache.append(k, v)
    for t, d in ((keys, 4), (values, 6)):
        rows = t.swapaxes(-1, -2)  # [B, n_kv, d, len]: one row a feature
        assert rows.shape == (2, 3, d, 5)
        assert rows.strides[-1] == rows.itemsize  # positions adjacent
        assert rows.strides[-2] == 16 * rows.itemsize  # capacity apart
    np.testing.assert_array_equal(keys, k)
    np.testing.assert_array_equal(values, v)
    keys, values = cache.append(k[:, :, :1], v[:, :, :1])
    np.testing.assert_array_equal(keys[:, :, 5], k[:, :, 0])
    np.testing.assert_array_equal(values[:, :, 5], v[:, :, 0])


@pytest.mark.parametrize("G, L_q", [(1, 1), (4, 1), (16, 1), (3, 7)])
def test_values_product_is_the_same_in_either_layout(G, L_q):
    """The grouped core computes P V as (V^T P^T)^T when V is stored
    transposed (a cache): the same numbers, to rounding, in float64."""
    rng = np.random.default_rng(G + L_q)
    q = rng.standard_normal((2, 3, G, L_q, 8))
    k = rng.standard_normal((2, 3, 50, 8))
    v = rng.standard_normal((2, 3, 50, 5))
    v_t = np.ascontiguousarray(v.swapaxes(-1, -2)).swapaxes(-1, -2)
    assert v_t.strides[-2] == v_t.itemsize and np.array_equal(v_t, v)
    out, att = grouped_attention_forward(q, k, v)
    out_t, att_t = grouped_attention_forward(q, k, v_t)
    np.testing.assert_allclose(out_t, out, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(att_t.weights, att.weights)


@pytest.mark.parametrize("n_kv", [8, 2, 1])
def test_decode_steps_equal_the_full_causal_forward(n_kv):
    """Prefill, then one token at a time, through the fast path: the
    full causal forward to 1e-12 in float64, and the last step's weights
    are the last row of the full map."""
    rng = np.random.default_rng(n_kv)
    layer = GroupedQueryAttention(32, 8, n_kv, seed=4)
    x = rng.standard_normal((2, 12, 32))
    full = layer.forward(x, causal=True)
    weights = layer.attention_weights  # [B, h, L, L]
    cache = KVCache(initial_capacity=4)  # grows on the way
    outs = [layer.forward(x[:, :5], kv_cache=cache)]
    outs += [
        layer.forward(x[:, i : i + 1], kv_cache=cache) for i in range(5, 12)
    ]
    np.testing.assert_allclose(
        np.concatenate(outs, axis=1), full, rtol=0, atol=1e-12
    )
    np.testing.assert_allclose(
        layer.attention_weights, weights[:, :, -1:], rtol=0, atol=1e-12
    )
    assert cache.reallocations > 0


# -- the levers, one at a time


@pytest.mark.parametrize("n_kv", [8, 2, 1])
def test_lever_steps_compute_the_step_and_leave_the_cache(n_kv):
    steps = bench.lever_steps(D, H, n_kv, CTX)
    layer, cache, aligned = steps.pop("_keep")
    assert set(steps) == {"library", *bench.LEVERS}
    before = cache.keys.copy()
    x = np.random.default_rng(0).standard_normal((1, 1, D), dtype=np.float32)
    want = layer.forward(x, kv_cache=cache)[0]  # [1, d]
    cache.truncate(CTX)
    # the yardstick computes the library's numbers
    got = steps["no temporaries"]()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for name, fn in steps.items():
        fn()
        assert len(cache) == CTX == len(aligned[1]), name
    np.testing.assert_array_equal(cache.keys, before)
    # the stacked lever patched the layer only while it ran
    assert "min_stacked_rows" not in vars(layer)
    assert layer.min_stacked_rows == 8
    # the aligned lever's cache: the same keys, rows on 64-byte lines
    np.testing.assert_array_equal(aligned[1].keys, before)
    assert aligned[1].storage.ctypes.data % 64 == 0
    assert aligned[1].storage.strides[-2] % 64 == 0


def test_levers_table(capsys):
    lev = bench.run_levers(D, H, CTX, rounds=3, flush_bytes=2**16)
    assert list(lev) == ["MHA", "GQA", "MQA"]
    for row in lev.values():
        assert row["library"] > 0
        for name in bench.LEVERS:
            median, low, high = row[name]
            assert low <= median <= high
    lines = bench.lever_table(lev)
    assert len(lines) == 2 + len(bench.LEVERS)
    assert all(len(line) <= 77 for line in lines)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1, 3, 1), (2, 3, 4, 17), (5, 8193)])
def test_aligned_rows_start_on_64_byte_lines(dtype, shape):
    a = bench.aligned_rows(shape, dtype)
    assert a.shape == shape and a.dtype == dtype
    assert a.strides[-1] == a.itemsize  # positions adjacent
    rows = a.reshape(-1, shape[-1])
    assert np.shares_memory(rows, a)  # the rows themselves, not a copy
    assert all(r.ctypes.data % 64 == 0 for r in rows)
    # rows padded by less than one line
    assert 0 <= a.strides[-2] - shape[-1] * a.itemsize < 64


def test_latent_setup_and_parts_are_the_steps_work():
    layer, cache, step = bench.latent_decode_setup(D, H, CTX)
    before = cache.rows.copy()
    step()
    step()
    assert len(cache) == CTX and cache.reallocations == 0
    np.testing.assert_array_equal(cache.rows, before)
    parts = bench.latent_step_parts(layer, cache)
    assert set(parts) == set(bench.PARTS)
    out, att = parts["attention"]()
    assert out.shape == (1, 1, H, 1, layer.d_latent_kv)
    np.testing.assert_allclose(att.weights.sum(-1), 1, rtol=1e-5)
    assert len(parts["weights"]()) == 7
    # the absorbed step is the layer's default with a cache
    x = np.random.default_rng(1).standard_normal((1, 1, D), dtype=np.float32)
    y_abs = layer.forward(x, kv_cache=cache)
    cache.truncate(CTX)
    y_exp = layer.forward(x, kv_cache=cache, absorb=False)
    cache.truncate(CTX)
    np.testing.assert_allclose(y_abs, y_exp, rtol=1e-3, atol=1e-4)


def test_roof_fractions_are_paired_with_their_noise_floor(result):
    """Each family's fraction of its roof, round by round, with the step
    timed against itself beside it, and a verdict read from the two."""
    for row in result["rows"].values():
        for key in ("roof paired", "A/A paired"):
            median, low, high = row[key]
            assert 0 < low <= median <= high
        assert row["roof time"] == pytest.approx(
            bench.roof_time(
                row["weight_bytes"],
                row["kv_bytes"],
                row["attention_flops"],
                result["reference"],
                result["matmul_rate"],
            )
        )
        assert row["of roof"] == pytest.approx(
            row["roof time"] / row["time"]
        )
        assert row["verdict"] == bench.roof_verdict(
            row["roof paired"], row["A/A paired"]
        )
    lines = bench.roof_lines(result)
    assert len(lines) == 1 + 2 * 4 and max(map(len, lines)) <= 77


def test_roof_time_is_the_longer_of_cache_and_flops_after_weights():
    # weights 2 s at 1 B/s; cache 3 s against FLOPs 5 s: the FLOPs
    assert bench.roof_time(2, 3, 10, 1.0, 2.0) == 2 + 5
    assert bench.roof_time(2, 3, 2, 1.0, 2.0) == 2 + 3
    rates = np.array([1.0, 2.0])  # one per round
    assert list(bench.roof_time(2, 4, 2, rates, 1.0)) == [6.0, 3.0]


@pytest.mark.parametrize(
    "of_roof, a_a, starts, floor",
    [
        ((0.8, 0.78, 0.82), (1.0, 0.97, 1.03), "step time 1.25x", "3%"),
        ((0.5, 0.45, 0.55), (1.0, 0.95, 1.01), "step time 2.00x", "5%"),
        ((0.8, 0.78, 0.82), (1.0, 0.7, 1.4), "step time 1.25x", "wide"),
    ],
)
def test_roof_verdict(of_roof, a_a, starts, floor):
    """The line reads the step's time over its roof's and how wide the
    floor is; it never speaks of a goal."""
    line = bench.roof_verdict(of_roof, a_a)
    assert line.startswith(starts) and floor in line
    assert "goal" not in line and "noisy" not in line


def test_of_roof_without_the_kv_gap(result):
    """The step with its attention at its cache's bytes, the rest as
    measured: never below the step's own fraction of its roof."""
    for row in result["rows"].values():
        gap = max(0.0, row["gap"]["keys and values"])
        want = row["roof time"] / (row["time"] - gap)
        assert row["of roof, no K/V gap"] == pytest.approx(want)
        assert row["of roof, no K/V gap"] >= row["of roof"]
