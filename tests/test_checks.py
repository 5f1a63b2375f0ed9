"""The one validation module: non-finite input, counts, dtypes, head sizes."""

from __future__ import annotations

import numpy as np
import pytest

from attn_np import GroupedQueryAttention, KVCache, attention_forward
from attn_np._checks import (
    check_count,
    check_float_dtype,
    check_head_dims,
    check_token_ids,
)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_attention_refuses_non_finite_inputs_naming_them(bad, which):
    rng = np.random.default_rng(0)
    qkv = {n: rng.standard_normal((2, 3, 4)) for n in "qkv"}
    qkv[which][1, 2, 0] = bad
    with pytest.raises(ValueError, match=rf"{which} must be finite"):
        attention_forward(qkv["q"], qkv["k"], qkv["v"])


def test_layer_refuses_nan_input_instead_of_returning_nan():
    layer = GroupedQueryAttention(8, 4, 2)
    x = np.zeros((1, 3, 8))
    x[0, 1, 5] = np.nan
    with pytest.raises(ValueError, match=r"x must be finite.*\(1, 3, 8\)"):
        layer.forward(x)


def test_decode_chunk_refuses_inf():
    layer, cache = GroupedQueryAttention(8, 4, 2), KVCache()
    layer.forward(np.ones((1, 2, 8)), kv_cache=cache)
    chunk = np.ones((1, 1, 8))
    chunk[0, 0, 0] = np.inf
    with pytest.raises(ValueError, match="x_chunk must be finite"):
        layer.forward(chunk, kv_cache=cache)
    assert len(cache) == 2  # nothing appended


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3", None])
def test_check_count_refuses_non_counts(value):
    with pytest.raises(
        ValueError, match="n_heads must be a positive integer"
    ):
        check_count(value, "n_heads")


def test_check_count_minimum_zero_and_numpy_integers():
    assert check_count(0, "n", minimum=0) == 0
    assert check_count(np.int64(7), "n") == 7
    with pytest.raises(ValueError, match="non-negative"):
        check_count(-1, "n", minimum=0)


def test_check_float_dtype():
    assert check_float_dtype(np.float32) == np.float32
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        check_float_dtype(np.int32)


def test_check_head_dims_defaults_and_errors():
    assert check_head_dims(64, 8) == (64, 8, 8, 8, 8)
    assert check_head_dims(64, 8, 2, d_k=16) == (64, 8, 2, 16, 8)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        check_head_dims(64, 8, 3)
    with pytest.raises(ValueError, match="divisible by n_heads"):
        check_head_dims(60, 8)


def test_check_token_ids():
    with pytest.raises(TypeError, match="ids must be an integer array"):
        check_token_ids(np.zeros(3), 5)
    with pytest.raises(
        ValueError, match=r"\[0, 5\), got values from 0 to 5"
    ):
        check_token_ids(np.arange(6), 5)
