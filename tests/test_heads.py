"""attn_np.heads: head i owns columns i*d ... (i+1)*d - 1; query head kv*G + g is member g of
group kv; splits are contiguous and merges are their inverses."""

import numpy as np

from attn_np.heads import (
    merge_groups,
    merge_heads,
    split_groups,
    split_heads,
)


def test_head_i_owns_its_columns_and_the_merge_is_the_inverse():
    t = np.arange(2 * 3 * 12.0).reshape(
        2, 3, 12
    )  # [B, L, n*d], n = 4, d = 3
    h = split_heads(t, 4, 3)
    assert h.shape == (2, 4, 3, 3) and h.flags.c_contiguous
    np.testing.assert_array_equal(h[1, 2, 0], t[1, 0, 6:9])
    np.testing.assert_array_equal(merge_heads(h), t)


def test_groups_number_query_heads_kv_times_G_plus_g():
    t = np.random.default_rng(0).standard_normal((2, 5, 6 * 4))  # h = 6
    g = split_groups(t, 3, 2, 4)  # n_kv = 3, G = 2, d = 4
    assert g.shape == (2, 3, 2, 5, 4) and g.flags.c_contiguous
    np.testing.assert_array_equal(g[0, 2, 1], split_heads(t, 6, 4)[0, 5])
    np.testing.assert_array_equal(merge_groups(g), t)
