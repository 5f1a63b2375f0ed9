"""Cost formulas of prefill and decode (attn_np.costs.decode) against hand-computed values."""

import math

import pytest

from attn_np import costs
from attn_np.costs.catalogue import MODELS
from attn_np.costs.decode import (
    attainable_flops,
    chunk_cost,
    decode_step_cost,
    kv_read_tokens_per_second,
    prefill_cost,
    ridge_point,
    roofline_time,
    shazeer_ratio,
)


def test_decode_step_by_hand_mha():
    # B=2, n=10 cached, d=8, h=2, d_k=d_v=4 (MHA), float32. L_k = 11.
    c = decode_step_cost(2, 10, 8, 2, bytes_per_element=4)
    assert c.flops_breakdown == {
        "Q projection": 2 * 2 * 1 * 8 * 8,  # 256
        "K, V projections": 2 * 2 * 1 * 8 * 2 * 8,  # 512
        "scores Q K^T": 2 * 2 * 2 * 1 * 11 * 4,  # 352
        "weights @ V": 352,
        "output projection": 256,
    }
    assert c.flops == 1728
    assert c.bytes_breakdown == {
        "weights": 4 * 4 * 64,  # four 8x8 matrices: 1024
        "keys and values read": 4 * 2 * 2 * 11 * 8,  # 1408
        "new keys and values written": 4 * 2 * 2 * 1 * 8,  # 128
        "x read, y written": 4 * 2 * 2 * 8,  # 128
        "queries and head outputs": 4 * 2 * 2 * 2 * 8,  # 256
        "scores [B, h, L_q, L_k]": 4 * 2 * 2 * 2 * 11,  # 352
    }
    assert c.bytes == 3296
    assert c.intensity == pytest.approx(1728 / 3296)


def test_mqa_reads_h_times_fewer_cache_bytes():
    mha = decode_step_cost(1, 1000, 512, 8, 8)
    mqa = decode_step_cost(1, 1000, 512, 8, 1)
    assert (
        mha.bytes_breakdown["keys and values read"]
        == 8 * mqa.bytes_breakdown["keys and values read"]
    )
    # the attention FLOPs do not depend on n_kv_heads: every query head still scores every key
    assert (
        mha.flops_breakdown["scores Q K^T"]
        == mqa.flops_breakdown["scores Q K^T"]
    )
    assert mqa.intensity > mha.intensity


def test_prefill_flops_match_costs_forward():
    """A prefill over an empty cache is exactly the layer's causal forward, whose FLOPs costs.py counts."""
    for n_kv in (8, 2, 1):
        assert prefill_cost(3, 50, 64, 8, n_kv).flops == costs.forward_flops(
            3, 50, 64, 8, n_kv
        )


def test_prefill_is_compute_heavy_decode_is_not():
    """Prefill reuses every weight L times; a batch-1 decode step about once (intensity ~ 1)."""
    pre = prefill_cost(1, 2048, 1024, 16, 16, fused=True)
    dec = decode_step_cost(1, 2048, 1024, 16, 16, fused=True)
    assert pre.intensity > 100 * dec.intensity
    assert 0.2 < dec.intensity < 1.0  # ~2 FLOPs per 4-byte number read


def test_fused_drops_only_the_scores():
    a = chunk_cost(2, 3, 5, 16, 4, 2)
    b = chunk_cost(2, 3, 5, 16, 4, 2, fused=True)
    assert (
        a.bytes - b.bytes
        == a.bytes_breakdown["scores [B, h, L_q, L_k]"]
        == 4 * 2 * 2 * 4 * 3 * 8
    )
    assert a.flops == b.flops


def test_shazeer_ratio_forms():
    mha = {"n_heads": 16, "n_kv_heads": 16}
    assert shazeer_ratio(1024, 1024, 1, **mha) == 2.0  # n/d + 1/b
    assert shazeer_ratio(512, 1024, 4, **mha) == 0.75
    assert shazeer_ratio(
        1024, 1024, 1, n_heads=16, n_kv_heads=1
    ) == pytest.approx(1 / 1024 + 1 / 16 + 1)
    # one head: multi-head and multi-query coincide; the MHA form is used
    assert shazeer_ratio(8, 8, 1, n_heads=1, n_kv_heads=1) == 2.0
    with pytest.raises(ValueError, match="b must be a positive integer"):
        shazeer_ratio(10, 10, 0, **mha)
    with pytest.raises(ValueError, match="grouped-query"):
        shazeer_ratio(10, 10, 1, n_heads=16, n_kv_heads=4)
    with pytest.raises(TypeError):
        shazeer_ratio(10, 10, 1, 16)  # head counts are keyword-only


def test_shazeer_ratio_tracks_exact_counts():
    """For n << d the exact bytes/FLOPs of a decode step follow n/d + 1/b up to constants."""
    d, h = 4096, 32
    mha = {"n_heads": h, "n_kv_heads": h}
    for b in (1, 8, 64):
        for n in (64, 512):
            c = decode_step_cost(b, n, d, h, fused=True)
            ratio = c.bytes / c.flops  # bytes per FLOP, 4-byte numbers
            assert 0.25 < ratio / shazeer_ratio(n, d, b, **mha) < 4


def test_roofline_helpers():
    assert ridge_point(100e9, 20e9) == 5.0
    assert attainable_flops(0.5, 100e9, 20e9) == 10e9
    assert attainable_flops(50, 100e9, 20e9) == 100e9
    assert roofline_time(1e9, 1e9, 100e9, 20e9) == pytest.approx(0.05)
    with pytest.raises(
        ValueError, match="bandwidth must be a positive finite number"
    ):
        ridge_point(1e9, 0)
    with pytest.raises(ValueError, match="peak_flops"):
        roofline_time(1, 1, math.inf, 1)


def test_kv_read_tokens_per_second_by_hand():
    # llama-2-7b: 2 * 32 layers * 32 heads * 128 * 2 bytes = 524288 bytes per token = 0.5 MiB
    cfg = MODELS["llama-2-7b"]
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2
    assert per_token == 524288
    bw = 1e12
    assert kv_read_tokens_per_second(
        "llama-2-7b", 4096, bw
    ) == pytest.approx(bw / (4096 * per_token))
    assert kv_read_tokens_per_second(
        "llama-2-7b", 4096, bw, batch=8
    ) == pytest.approx(bw / (8 * 4096 * per_token))
    with_w = kv_read_tokens_per_second(
        "llama-2-7b", 4096, bw, include_weights=True
    )
    assert with_w == pytest.approx(
        bw / (4096 * per_token + 2 * cfg.n_params)
    )
    # grouped-query attention with 8 key/value heads: four times the tokens per second of MHA
    assert kv_read_tokens_per_second(
        "llama-3-8b", 4096, bw
    ) == pytest.approx(4 * kv_read_tokens_per_second("llama-2-7b", 4096, bw))


def test_bad_arguments_raise():
    with pytest.raises(
        ValueError, match="n_cached must be a non-negative integer"
    ):
        decode_step_cost(1, -1, 8, 2)
    with pytest.raises(ValueError, match="L_q must be a positive integer"):
        chunk_cost(1, 0, 0, 8, 2)
    with pytest.raises(
        ValueError, match="n_heads must be a multiple of n_kv_heads"
    ):
        decode_step_cost(1, 4, 8, 4, 3)
    with pytest.raises(ValueError, match="seq_len must be positive"):
        kv_read_tokens_per_second("llama-2-7b", 0, 1e9)


def test_decode_benchmark_runs_small():
    """The benchmark's measuring code, at toy sizes (its figures are machine-dependent, its bookkeeping is not)."""
    from attn_np.bench.decode import decode_setup, run

    r = run(d_model=32, n_heads=4, context=64, rounds=1, probe_bytes=2**20)
    assert set(r["rows"]) == {"MHA", "GQA", "MQA", "MLA"}
    assert r["reference"] == max(r["bandwidths"].values()) > 0
    assert r["rows"]["MHA"]["cache_bytes"] == 1 * 4 * 64 * (8 + 8) * 4
    assert r["rows"]["MQA"]["cache_bytes"] == 1 * 1 * 64 * (8 + 8) * 4
    # MLA: one row [c_KV ; k_R] of 4 * 8 + 4 numbers per position
    assert r["rows"]["MLA"]["cache_bytes"] == 1 * 64 * (32 + 4) * 4
    assert r["bytes_mha_over_mqa"] > 1
    for row in r["rows"].values():
        assert row["fraction"] == pytest.approx(
            row["bytes_per_s"] / r["reference"]
        )
    layer, cache, step = decode_setup(32, 4, 2, 10)
    step()
    step()
    assert (
        len(cache) == 10 and cache.reallocations == 0
    )  # each step is undone; nothing is reallocated
