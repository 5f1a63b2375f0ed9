"""attn_np.convert: mha_to_gqa carries every option of the layer it converts (issue 24 item 1)."""

import inspect

import numpy as np
import pytest

from attn_np import GroupedQueryAttention, MultiHeadAttention, mha_to_gqa

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
