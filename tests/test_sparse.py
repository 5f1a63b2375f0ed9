"""Chapter 13: DSA's lightning indexer, top-k, sparse MLA on the latent
cache, the indexer's KL loss, the indexed cache and block selection.

References here are written from the equations (loops over heads and
tokens, RoPE by hand), not from the library's stacked layouts."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_np import (
    TOLERANCE,
    IndexedLatentCache,
    LatentKVCache,
    LightningIndexer,
    MultiHeadLatentAttention,
    SparseLatentAttention,
    block_top_n_mask,
    check_gradients,
    check_layer_gradients,
    index_scores_backward,
    index_scores_forward,
    indexer_kl_backward,
    indexer_kl_forward,
    position_mask,
    sparse_mqa_backward,
    sparse_mqa_forward,
    top_k_mask,
)
from attn_np.sparse import (
    dsa_cache_bytes_per_token,
    indexer_key_bytes,
    layernorm_backward,
    layernorm_forward,
    selected_indices,
    sparse_decode_step_flops,
)

EXACT = 1e-12
MLA = dict(
    d_model=8,
    n_heads=3,
    d_head=4,
    d_latent_kv=6,
    d_rope=4,
    d_latent_q=5,
    latent_norm=True,
    seed=2,
)
INDEX = dict(index_n_heads=2, index_head_dim=6)


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _assert_checked(errors):
    for name, err in errors.items():
        assert np.isfinite(err), name
        assert err < TOLERANCE, (name, err)


def _sparse(topk, **kw):
    layer = SparseLatentAttention(**{**MLA, **kw}, **INDEX, index_topk=topk)
    rng = np.random.default_rng(7)
    for g in ("g_q", "g_kv"):  # gains away from 1, so that they matter
        layer.params[g] = 1 + 0.5 * rng.standard_normal(layer.params[g].size)
    return layer


# ------------------------------------------------------------ indexer


def rotate_half(t, pos, r, base=10000.0):
    """RoPE on the first r features, pairs (i, i + r/2), by hand."""
    theta = base ** (-np.arange(0, r, 2) / r)  # [r/2]
    ang = pos[:, None] * theta  # [L, r/2]
    a, b = t[..., : r // 2], t[..., r // 2 : r]
    out = t.copy()
    out[..., : r // 2] = a * np.cos(ang) - b * np.sin(ang)
    out[..., r // 2 : r] = a * np.sin(ang) + b * np.cos(ang)
    return out


def reference_scores(ix, x, c_q):
    """I[t, s] = sum_j w[t, j] ReLU(q[t, j] . k[s]), head by head, as the
    release computes it (k_norm, partial rotate-half RoPE, the scales)."""
    P, H, d, r = ix.params, ix.n_heads, ix.head_dim, ix.d_rope
    B, L, _ = x.shape
    pos = np.arange(L)
    k = x @ P["W_ki"]
    k = (k - k.mean(-1, keepdims=True)) / np.sqrt(
        k.var(-1, keepdims=True) + 1e-6
    ) * P["g_k"] + P["b_k"]
    k = rotate_half(k, pos, r)
    w = x @ P["W_w"] * H**-0.5 * d**-0.5
    out = np.zeros((B, L, L))
    for j in range(H):
        q = rotate_half(c_q @ P["W_qi"][:, j * d : (j + 1) * d], pos, r)
        out += w[..., j, None] * np.maximum(q @ k.swapaxes(1, 2), 0.0)
    return out


def _indexer(seed=3, **kw):
    ix = LightningIndexer(8, 5, 3, 6, 4, seed=seed, **kw)
    rng = np.random.default_rng(seed)
    ix.params["g_k"] = 1 + 0.5 * rng.standard_normal(6)
    ix.params["b_k"] = 0.3 * rng.standard_normal(6)
    return ix


def test_indexer_matches_the_formula_head_by_head():
    ix = _indexer()
    x, c_q = _x((2, 7, 8), 1), _x((2, 7, 5), 2)
    got = ix.forward(x, c_q)
    assert np.abs(got - reference_scores(ix, x, c_q)).max() < EXACT


def test_indexer_rope_layout_matters():
    """The release's slip: interleaved pairs give other scores than the
    rotate-half layout the weights were trained with."""
    x, c_q = _x((1, 9, 8), 1), _x((1, 9, 5), 2)
    half = _indexer(rope_layout="half").forward(x, c_q)
    inter = _indexer(rope_layout="interleaved").forward(x, c_q)
    assert np.abs(half - reference_scores(_indexer(), x, c_q)).max() < EXACT
    assert np.abs(half - inter).max() > 1e-3


def test_index_score_gradients():
    rng = np.random.default_rng(0)
    inputs = dict(
        q=rng.standard_normal((2, 3, 4, 6)),
        k=rng.standard_normal((2, 5, 6)),
        w=rng.standard_normal((2, 4, 3)),
    )
    _assert_checked(
        check_gradients(
            index_scores_forward, index_scores_backward, inputs, seed=1
        )
    )


def test_layernorm_gradients():
    rng = np.random.default_rng(0)
    inputs = dict(
        x=rng.standard_normal((3, 4, 6)),
        g=rng.standard_normal(6),
        b=rng.standard_normal(6),
    )
    _assert_checked(
        check_gradients(
            lambda x, g, b: layernorm_forward(x, g, b),
            layernorm_backward,
            inputs,
        )
    )


def _indexer_loss_pair(ix, weights, allowed):
    """(forward, backward) of the loss as a function of every input and
    parameter of the indexer, for check_gradients."""
    names = list(ix.params)

    def forward(x, c_q, **params):
        for n, v in params.items():
            ix.params[n] = v
        scores = ix.forward(x, c_q)
        loss, c = indexer_kl_forward(scores, weights, allowed)
        return np.array(loss), c

    def backward(dloss, c):
        dI = indexer_kl_backward(dloss, c)
        dx, dc_q = ix.backward(dI)
        return (dx, dc_q) + tuple(ix.grads[n] for n in names)

    return forward, backward


@pytest.mark.parametrize("stage", ["dense warm-up", "sparse"])
def test_indexer_loss_gradients_every_input_and_parameter(stage):
    ix = _indexer()
    B, L, h = 2, 6, 3
    x, c_q = _x((B, L, 8), 1), _x((B, L, 5), 2)
    causal = position_mask(np.arange(L), np.arange(L))
    # the main attention: any causal rows that sum to 1
    weights = np.exp(_x((B, h, L, L), 3)) * causal
    weights /= weights.sum(-1, keepdims=True)
    allowed = causal
    if stage == "sparse":
        allowed = top_k_mask(_x((B, L, L), 4), 3, causal)
        assert (allowed.sum(-1) < causal.sum(-1)).any()  # really sparse
    forward, backward = _indexer_loss_pair(ix, weights, allowed)
    inputs = dict(
        x=x, c_q=c_q, **{n: p.copy() for n, p in ix.params.items()}
    )
    errors = check_gradients(forward, backward, inputs, seed=5)
    assert set(errors) == {"x", "c_q", "W_qi", "W_ki", "W_w", "g_k", "b_k"}
    _assert_checked(errors)


def test_kl_loss_value_and_gradient_by_hand():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((1, 3, 4))
    weights = rng.random((1, 2, 3, 4))
    allowed = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 1]], bool)
    loss, c = indexer_kl_forward(scores, weights, allowed)
    want, grad = 0.0, np.zeros_like(scores)
    for t in range(3):
        s = np.flatnonzero(allowed[t])
        p = weights[0][:, t][:, s].sum(0)
        p /= p.sum()
        q = np.exp(scores[0, t, s]) / np.exp(scores[0, t, s]).sum()
        want += np.sum(p * np.log(p / q))
        grad[0, t, s] = q - p
    assert abs(loss - want) < EXACT
    assert np.abs(indexer_kl_backward(1.0, c) - grad).max() < EXACT
    # the target is detached: the same p whatever the scores
    loss2, _ = indexer_kl_forward(scores * 0, weights, allowed)
    assert loss2 > 0 and loss2 != loss


def test_kl_is_zero_when_the_indexer_matches_the_attention():
    p = np.random.default_rng(1).random((1, 1, 2, 5)) + 0.1
    p /= p.sum(-1, keepdims=True)
    loss, _ = indexer_kl_forward(np.log(p[:, 0]), p, np.ones((2, 5), bool))
    assert abs(loss) < EXACT


# ------------------------------------------------ per-head weights, ReLU


def test_one_head_keeps_the_ranking_of_the_dot_products():
    """With one head and w > 0, w ReLU(q . k) ranks the keys with a
    positive dot product as q . k does (ReLU is monotone)."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 1, 1, 8)), rng.standard_normal((1, 40, 8))
    w = np.array([[[0.7]]])
    scores, _ = index_scores_forward(q, k, w)
    dots = (q[0, 0] @ k[0].T)[0]
    n_pos = int((dots > 0).sum())
    assert n_pos >= 5
    for kk in range(1, n_pos + 1):
        by_i = top_k_mask(scores[0, 0], kk)
        by_dot = top_k_mask(dots, kk)
        assert (by_i == by_dot).all()


def test_two_heads_change_the_ranking():
    """The counterexample: key A has dots (3, -3), key B (1, 1). Summed
    dot products rank B first (0 < 2); the index score ranks A first
    (3 > 2): ReLU and the sum over heads do not commute. Per-head weights
    change it again: w = (0.2, 1) makes B first."""
    q = np.array([[[[1.0, 0.0]], [[0.0, 1.0]]]])  # [1, H=2, 1, 2]
    k = np.array([[[3.0, -3.0], [1.0, 1.0]]])  # A, B: [1, 2, 2]
    ones = np.ones((1, 1, 2))
    scores, _ = index_scores_forward(q, k, ones)
    summed = (q[0, :, 0] @ k[0].T).sum(0)  # [2]
    assert summed.argmax() == 1 and scores[0, 0].argmax() == 0
    reweighted, _ = index_scores_forward(q, k, np.array([[[0.2, 1.0]]]))
    assert reweighted[0, 0].argmax() == 1


# -------------------------------------------------------------- top-k


def test_top_k_ties_go_to_the_earlier_position_whatever_follows():
    s = np.array([1.0, 3.0, 1.0, 1.0, 0.5])
    assert top_k_mask(s, 2).tolist() == [1, 1, 0, 0, 0]
    longer = np.concatenate([s, [9.0, 1.0]])
    allowed = np.arange(7) < 5
    assert (top_k_mask(longer, 2, allowed)[:5] == top_k_mask(s, 2)).all()
    assert not top_k_mask(longer, 2, allowed)[5:].any()


def test_top_k_keeps_every_allowed_key_of_a_short_row():
    s = _x((4, 6))
    causal = position_mask(np.arange(4) + 2, np.arange(6))
    got = top_k_mask(s, 4, causal)
    assert got.sum(-1).tolist() == [3, 4, 4, 4]
    assert not (got & ~causal).any()


@given(
    L=st.integers(1, 12),
    k=st.integers(1, 14),
    seed=st.integers(0, 10**6),
)
def test_top_k_chooses_the_k_largest(L, k, seed):
    s = np.round(_x((3, L), seed), 1)  # ties happen
    got = top_k_mask(s, k)
    assert (got.sum(-1) == min(k, L)).all()
    for row, g in zip(s, got):
        if g.all():
            continue
        assert row[g].min() >= row[~g].max()
    idx, valid = selected_indices(got)
    assert (np.take_along_axis(got, idx, -1) == valid).all()
    assert (np.diff(np.where(valid, idx, 10**6), axis=-1) > 0).all()


def test_top_k_errors():
    with pytest.raises(ValueError, match="k must be a positive integer"):
        top_k_mask(_x((2, 3)), 0)
    with pytest.raises(TypeError, match="scores must be a floating"):
        top_k_mask(np.arange(3), 1)


# ------------------------------------------------- sparse attention


def _sparse_inputs(seed=0, B=2, L_q=5, L_k=6, h=3, D=7, k=3):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, L_q, h, D))
    rows = rng.standard_normal((B, L_k, D))
    causal = position_mask(np.arange(L_q) + L_k - L_q, np.arange(L_k))
    chosen = top_k_mask(rng.standard_normal((B, L_q, L_k)), k, causal)
    return q, rows, chosen


def test_sparse_mqa_gradients():
    q, rows, chosen = _sparse_inputs()
    idx, valid = selected_indices(chosen)
    assert not valid.all()  # a short row is padded

    def forward(q, rows):
        return sparse_mqa_forward(q, rows, idx, valid, d_v=4, scale=0.4)

    errors = check_gradients(
        forward, sparse_mqa_backward, dict(q=q, rows=rows), seed=2
    )
    _assert_checked(errors)


def test_sparse_mqa_equals_masked_dense_mqa():
    q, rows, chosen = _sparse_inputs(seed=1)
    idx, valid = selected_indices(chosen)
    o, c = sparse_mqa_forward(q, rows, idx, valid, d_v=4, scale=0.4)
    s = np.einsum("bthd,bsd->bths", q, rows) * 0.4
    s = np.where(chosen[:, :, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert np.abs(o - p @ rows[:, None, :, :4]).max() < EXACT
    do = _x(o.shape, 3)
    dq, drows = sparse_mqa_backward(do, c)
    unchosen = ~chosen.any(axis=1)  # [B, L_k]: no token chose the row
    assert unchosen.any() and (drows[unchosen] == 0).all()


# ------------------------------------------------- the layer (sparse MLA)


def test_top_k_at_least_t_is_dense_mla_forward_and_backward():
    L = 7
    x = _x((2, L, 8), 1)
    dense = MultiHeadLatentAttention(**MLA)
    sparse = _sparse(L)
    for g in ("g_q", "g_kv"):
        dense.params[g] = sparse.params[g].copy()
    y_d, y_s = dense.forward(x, causal=True), sparse.forward(x)
    assert np.abs(y_d - y_s).max() < EXACT
    dy = _x(y_d.shape, 2)
    dx_d, dx_s = dense.backward(dy), sparse.backward(dy)
    assert np.abs(dx_d - dx_s).max() < EXACT
    for name in dense.params:
        assert np.abs(dense.grads[name] - sparse.grads[name]).max() < EXACT
    # and the absorbed path over the gathered rows
    assert np.abs(sparse.forward(x, absorb=True) - y_d).max() < EXACT


def test_top_k_below_t_differs_from_dense():
    L = 7
    x = _x((2, L, 8), 1)
    y_dense = _sparse(L).forward(x)
    layer = _sparse(3)
    y = layer.forward(x)
    assert (layer.selected.sum(-1)[:, 3:] == 3).all()  # 3 keys per row
    # rows with at most 3 causal keys are dense; later ones are not
    assert np.abs(y - y_dense)[:, :3].max() < EXACT
    assert np.abs(y - y_dense)[:, 3:].max() > 1e-2


def test_sparse_layer_gradients():
    layer = _sparse(3)
    errors = check_layer_gradients(layer, _x((2, 7, 8), 1), seed=3)
    assert set(errors) == {"x"} | set(layer.params)
    _assert_checked(errors)


@pytest.mark.parametrize("chunks", [[1] * 11, [4, 1, 3, 1, 1, 1]])
def test_sparse_prefill_equals_sparse_decode(chunks):
    L, topk = 11, 4
    layer = _sparse(topk)
    x = _x((3, L, 8), 4)
    full = layer.forward(x)  # expanded, selection as a mask
    assert (layer.selected.sum(-1) < np.arange(1, L + 1)).any()
    cache, outs, start = IndexedLatentCache(), [], 0
    for n in chunks:
        outs.append(layer.forward(x[:, start : start + n], kv_cache=cache))
        start += n
    assert len(cache) == L
    assert np.abs(np.concatenate(outs, 1) - full).max() < EXACT


def test_the_indexer_is_detached_from_the_main_model():
    """The layer's backward is chapter 7's: no gradient reaches the
    indexer's parameters through top-k; its signal is its own loss."""
    layer = _sparse(3)
    x = _x((2, 7, 8), 1)
    layer.forward(x)
    layer.backward(_x((2, 7, 8), 2))
    assert set(layer.grads) == set(MultiHeadLatentAttention(**MLA).params)
    loss, dI = layer.indexer_loss(sparse=True)
    assert np.isfinite(loss) and loss > 0
    assert (dI[~layer.selected] == 0).all()
    dx, dc_q = layer.indexer.backward(dI)
    assert dx.shape == x.shape and np.abs(layer.indexer.grads["W_qi"]).max()
    dense_loss, dI_dense = layer.indexer_loss(sparse=False)
    causal = position_mask(np.arange(7), np.arange(7))
    assert (dI_dense[:, ~causal] == 0).all()
    assert (dI_dense[:, causal] != 0).any()


def test_layer_errors():
    layer = _sparse(3)
    with pytest.raises(TypeError, match="IndexedLatentCache"):
        layer.forward(_x((1, 2, 8)), kv_cache=LatentKVCache())
    with pytest.raises(ValueError, match="index_topk"):
        _sparse(0)
    with pytest.raises(ValueError, match="d_rope must be even"):
        LightningIndexer(8, 5, 2, 6, 8)
    with pytest.raises(RuntimeError, match="indexer_loss needs"):
        layer.forward(_x((1, 2, 8)), absorb=True)
        layer.indexer_loss()
    with pytest.raises(ValueError, match="c_q must be"):
        layer.indexer.forward(_x((1, 2, 8)), _x((1, 3, 5)))


# ------------------------------------------------------------ the cache


def test_indexed_cache_protocol_and_bytes():
    layer = _sparse(3)
    cache = IndexedLatentCache(initial_capacity=2)
    layer.forward(_x((2, 5, 8), 1), kv_cache=cache)
    layer.forward(_x((2, 1, 8), 2), kv_cache=cache)
    d_c, d_r, d_i = 6, 4, INDEX["index_head_dim"]
    assert len(cache) == 6 and cache.index_keys.shape == (2, 6, d_i)
    assert cache.nbytes == 2 * 6 * (d_c + d_r + d_i) * 8
    assert cache.index_nbytes == 2 * 6 * d_i * 8
    cache.truncate(4)
    assert len(cache) == 4 and cache.nbytes == 2 * 4 * (d_c + d_r + d_i) * 8
    with pytest.raises(ValueError, match="kv_cache holds batch 2"):
        layer.forward(_x((3, 1, 8)), kv_cache=cache)
    with pytest.raises(ValueError, match="k_index must be"):
        cache.append(np.zeros((2, 1, d_c)), np.zeros((2, 1, d_r)))
    other = SparseLatentAttention(
        **MLA, index_n_heads=2, index_head_dim=8, index_topk=3
    )
    with pytest.raises(
        ValueError, match="index_head_dim 8, but kv_cache holds"
    ):
        other.forward(_x((2, 1, 8)), kv_cache=cache)


def test_truncated_cache_decodes_like_a_fresh_one():
    layer = _sparse(3)
    x = _x((1, 9, 8), 5)
    cache = IndexedLatentCache()
    layer.forward(x[:, :6], kv_cache=cache)
    cache.truncate(4)
    again = layer.forward(x[:, 4:9], kv_cache=cache)
    fresh = IndexedLatentCache()
    layer.forward(x[:, :4], kv_cache=fresh)
    assert (
        np.abs(again - layer.forward(x[:, 4:9], kv_cache=fresh)).max() == 0
    )


def test_deepseek_v32_cache_bytes_per_token():
    """From config_671B_v3.2.json: kv_lora_rank 512, qk_rope_head_dim 64,
    index_head_dim 128, 61 layers; the latent in bfloat16, the indexer key
    in FP8 (1 byte) with one float32 scale per 128 (block_size)."""
    config = dict(
        n_layers=61,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        index_head_dim=128,
    )
    latent = config["n_layers"] * (512 + 64) * 2
    index = config["n_layers"] * (128 * 1 + (128 // 128) * 4)
    got = dsa_cache_bytes_per_token(
        config["kv_lora_rank"],
        config["qk_rope_head_dim"],
        config["index_head_dim"],
        n_layers=config["n_layers"],
    )
    assert got == {"latent": latent, "indexer": index}
    assert latent + index == 78_324  # 61 * (1152 + 132)
    assert indexer_key_bytes(128) == 132
    assert indexer_key_bytes(200, scale_block=128) == 200 + 2 * 4


def test_decode_step_flops():
    f = sparse_decode_step_flops(
        4095,
        128,
        512,
        64,
        index_n_heads=64,
        index_head_dim=128,
        index_topk=2048,
    )
    assert f["indexer"] == 2 * 4096 * 64 * 128
    assert f["attention"] == 2048 * 2 * 128 * (2 * 512 + 64)
    short = sparse_decode_step_flops(
        9, 2, 3, 2, index_n_heads=1, index_head_dim=1, index_topk=2048
    )
    assert short["attention"] == 10 * 2 * 2 * (6 + 2)  # k' = L_k = 10


# ---------------------------------------------------- block selection


def reference_blocks(q, k, size, n):
    """MoBA's rule query by query (its moba_naive.py, one head)."""
    L_q, L_k = q.shape[0], k.shape[0]
    out = np.zeros((L_q, L_k), bool)
    n_b = -(-L_k // size)
    means = np.stack(
        [k[i * size : (i + 1) * size].mean(0) for i in range(n_b)]
    )
    for t in range(L_q):
        pos = L_k - L_q + t
        gate = q[t] @ means.T
        gate[[(i + 1) * size > pos for i in range(n_b)]] = -np.inf
        gate[pos // size] = np.inf  # the own block, always
        order = sorted(range(n_b), key=lambda i: (-gate[i], i))[:n]
        for i in order:
            if gate[i] > -np.inf:
                out[t, i * size : (i + 1) * size] = True
        out[t, pos + 1 :] = False
    return out


@pytest.mark.parametrize("size,n", [(3, 2), (4, 1), (2, 3), (5, 9)])
def test_block_selection_matches_moba(size, n):
    q, k = _x((11, 4), 1), _x((11, 4), 2)
    got = block_top_n_mask(q, k, block_size=size, n_blocks=n)
    assert (got == reference_blocks(q, k, size, n)).all()


def test_all_blocks_is_causal_attention_and_fewer_is_not():
    q, k = _x((2, 12, 4), 1), _x((2, 12, 4), 2)
    causal = position_mask(np.arange(12), np.arange(12))
    assert (block_top_n_mask(q, k, block_size=3, n_blocks=4) == causal).all()
    few = block_top_n_mask(q, k, block_size=3, n_blocks=2)
    assert (few <= causal).all() and (few != causal).any()
    assert few[..., -1, -3:].all()  # its own block


def test_block_selection_errors():
    with pytest.raises(ValueError, match="block_size"):
        block_top_n_mask(_x((2, 4)), _x((2, 4)), block_size=0, n_blocks=1)
    with pytest.raises(ValueError, match="share the feature axis"):
        block_top_n_mask(_x((2, 4)), _x((2, 3)), block_size=2, n_blocks=1)


def test_a_decode_step_reads_only_the_chosen_rows():
    """Change a cached latent row no query chose: the step's output stays
    the same, bit for bit. Change a chosen one: it moves."""
    layer = _sparse(3)
    x = _x((1, 9, 8), 6)
    cache = IndexedLatentCache()
    layer.forward(x[:, :8], kv_cache=cache)
    y = layer.forward(x[:, 8:], kv_cache=cache)
    chosen = layer.selected[0, 0]  # [9]: the last step's choice
    assert chosen.sum() == 3
    cache.truncate(8)
    # the rows live in the cache's buffer: [B, d_c + d_R + d_I, capacity]
    d_rows = layer.d_latent_kv + layer.d_rope
    skipped = int(np.flatnonzero(~chosen[:8])[0])
    cache.storage[0, :d_rows, skipped] += 5.0
    assert (layer.forward(x[:, 8:], kv_cache=cache) == y).all()
    cache.truncate(8)
    picked = int(np.flatnonzero(chosen[:8])[0])
    cache.storage[0, :d_rows, picked] += 5.0
    assert np.abs(layer.forward(x[:, 8:], kv_cache=cache) - y).max() > 1e-3


def test_bad_masks_and_numbers_are_refused_by_name():
    # before: a broadcasting error from inside NumPy (allowed of the wrong
    # shape, q_positions of the wrong length), a silent answer (NaN
    # scores, an int mask, negative attention weights giving a loss of 0,
    # q_positions past the keys, d_c = 0 or n_layers = 0) or a ufunc
    # TypeError (selected_indices of a float array)
    rng = np.random.default_rng(0)
    s = rng.standard_normal((2, 5))
    with pytest.raises(ValueError, match="allowed must broadcast"):
        top_k_mask(s, 2, np.ones(3, bool))
    with pytest.raises(TypeError, match="allowed must be a boolean"):
        top_k_mask(s, 2, np.ones(5, int))
    with pytest.raises(ValueError, match="scores must be finite"):
        top_k_mask(np.array([np.nan, 1.0, 2.0]), 1)
    with pytest.raises(TypeError, match="chosen must be a boolean"):
        selected_indices(np.ones((3, 4)))
    q, k = rng.standard_normal((4, 8)), rng.standard_normal((8, 8))
    for qp in ([0, 1], [4, 5, 6, 9], [4.0, 5.0, 6.0, 7.0]):
        with pytest.raises(ValueError, match="q_positions"):
            block_top_n_mask(q, k, block_size=2, n_blocks=2, q_positions=qp)
    scores = rng.standard_normal((1, 1, 3))
    with pytest.raises(ValueError, match="weights must be attention"):
        indexer_kl_forward(scores, -np.ones((1, 1, 1, 3)), np.ones(3, bool))
    with pytest.raises(ValueError, match="allowed must broadcast"):
        indexer_kl_forward(scores, np.ones((1, 1, 1, 3)), np.ones(2, bool))
    with pytest.raises(ValueError, match="d_latent_kv"):
        dsa_cache_bytes_per_token(0, 64, 128)
    with pytest.raises(ValueError, match="n_layers"):
        dsa_cache_bytes_per_token(512, 64, 128, n_layers=0)
    with pytest.raises(ValueError, match="key_bytes"):
        indexer_key_bytes(128, key_bytes=0)
    with pytest.raises(ValueError, match="n_heads"):
        sparse_decode_step_flops(
            10,
            0,
            512,
            64,
            index_n_heads=64,
            index_head_dim=128,
            index_topk=8,
        )


def test_indexer_loss_refuses_a_string_for_sparse():
    # before: sparse="no" is a non-empty string, read as True: the sparse
    # stage's loss where the caller asked for the dense warm-up
    layer = SparseLatentAttention(
        d_model=8,
        n_heads=3,
        d_head=4,
        d_latent_kv=6,
        d_rope=4,
        index_n_heads=2,
        index_head_dim=6,
        index_topk=3,
    )
    layer.forward(np.random.default_rng(0).standard_normal((1, 5, 8)))
    with pytest.raises(TypeError, match="sparse must be True or False"):
        layer.indexer_loss(sparse="no")
