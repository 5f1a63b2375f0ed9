"""attn_np.convert: mha_to_gqa pools the right heads by mean or first, copies what it keeps, and
carries every option of the layer it converts (issue 24 item 1)."""

import inspect

import numpy as np
import pytest

from attn_np import GroupedQueryAttention, MultiHeadAttention, mha_to_gqa

EXACT = 1e-12


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# every constructor keyword that is not a size the conversion changes or the seed
NOT_OPTIONS = {"self", "d_model", "n_heads", "n_kv_heads", "seed"}


def test_options_cover_every_constructor_keyword():
    """A new keyword of GroupedQueryAttention that `options` (and so mha_to_gqa) forgets fails here."""
    keywords = (
        set(inspect.signature(GroupedQueryAttention).parameters)
        - NOT_OPTIONS
    )
    assert set(MultiHeadAttention(8, 2).options) == keywords


@pytest.mark.parametrize(
    "options",
    [
        dict(rope_base=500.0, rope_layout="interleaved", rope_dim=2),
        dict(window=3),
        dict(sinks=True),
        dict(flash=True, window=4),
        dict(window=3, sinks=True, rope_base=10000.0, dtype=np.float32),
    ],
)
def test_conversion_keeps_every_option(options):
    rng = np.random.default_rng(0)
    mha = MultiHeadAttention(12, 4, d_k=4, d_v=3, seed=1, **options)
    if "sinks" in mha.params:  # learned sinks, not the zeros a new layer has
        mha.params["sinks"][:] = rng.standard_normal(4)
    gqa = mha_to_gqa(mha, 2)
    assert gqa.options == mha.options
    assert "sinks" not in mha.params or np.array_equal(
        gqa.params["sinks"], mha.params["sinks"]
    )
    # with as many key/value heads as before, pooling is the identity: the
    # same layer, the same outputs
    same = mha_to_gqa(mha, 4)
    x = rng.standard_normal((2, 9, 12)).astype(mha.dtype)
    np.testing.assert_allclose(
        same.forward(x, causal=True), mha.forward(x, causal=True), atol=1e-6
    )


# -------------------------------------------------------------------------- conversion
def test_conversion_with_h_kv_heads_is_the_identity():
    mha = MultiHeadAttention(12, 4, seed=1)
    x = _x((2, 5, 12))
    for method in ("mean", "first"):
        gqa = mha_to_gqa(mha, 4, method=method)
        assert type(gqa) is GroupedQueryAttention and gqa.n_kv_heads == 4
        for name in mha.params:
            assert np.array_equal(gqa.params[name], mha.params[name])
            assert (
                gqa.params[name] is not mha.params[name]
            )  # copies, not views
        assert np.max(np.abs(gqa.forward(x) - mha.forward(x))) < EXACT


@pytest.mark.parametrize("n_kv", [1, 2])
@pytest.mark.parametrize("method", ["mean", "first"])
def test_conversion_of_identical_heads_reproduces_mha(n_kv, method):
    mha = MultiHeadAttention(12, 4, seed=2)
    for name in (
        "W_k",
        "W_v",
    ):  # every key/value head the same: pooling loses nothing
        head = mha.params[name][:, :3]
        mha.params[name] = np.tile(head, (1, 4))
    gqa = mha_to_gqa(mha, n_kv, method=method)
    assert gqa.params["W_k"].shape == (12, 3 * n_kv)
    x = _x((2, 6, 12), 3)
    assert (
        np.max(
            np.abs(gqa.forward(x, causal=True) - mha.forward(x, causal=True))
        )
        < EXACT
    )


def test_conversion_pools_the_right_heads():
    mha = MultiHeadAttention(8, 4, d_k=1, d_v=1, seed=0)
    mha.params["W_k"] = np.tile(
        np.array([1.0, 2.0, 3.0, 5.0]), (8, 1)
    )  # head j has weight value w_j
    mha.params["W_v"] = mha.params["W_k"] * 10
    mean2 = mha_to_gqa(mha, 2)
    assert np.allclose(mean2.params["W_k"][0], [1.5, 4.0]) and np.allclose(
        mean2.params["W_v"][0], [15, 40]
    )
    assert np.allclose(
        mha_to_gqa(mha, 2, method="first").params["W_k"][0], [1.0, 3.0]
    )
    assert np.allclose(mha_to_gqa(mha, 1).params["W_k"][0], [2.75])
    # From a GQA layer too: 4 kv heads -> 2 pools pairs of kv heads.
    gqa4 = GroupedQueryAttention(8, 8, 4, d_k=1, d_v=1, seed=0)
    gqa4.params["W_k"] = mha.params["W_k"].copy()
    assert np.allclose(mha_to_gqa(gqa4, 2).params["W_k"][0], [1.5, 4.0])


def test_conversion_keeps_dtype():
    mha = MultiHeadAttention(8, 4, dtype=np.float32)
    gqa = mha_to_gqa(mha, 2)
    assert all(p.dtype == np.float32 for p in gqa.params.values())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"n_kv_heads": 3},
            "n_kv_heads must divide the layer's 4 key/value heads",
        ),
        ({"n_kv_heads": 0}, "n_kv_heads must be a positive integer"),
        ({"n_kv_heads": 2, "method": "median"}, "method must be one of"),
    ],
)
def test_conversion_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mha_to_gqa(MultiHeadAttention(8, 4), **kwargs)
    with pytest.raises(ValueError, match="mha must be"):
        mha_to_gqa("not a layer", 2)
