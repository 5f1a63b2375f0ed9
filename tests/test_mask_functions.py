"""Masks as functions (FlexAttention's mask_mod): each rule evaluated on
the grid equals the book's array masks, compositions equal their loops,
packed documents see only themselves, and every attention call takes a
mask function where it takes a mask."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_np import GroupedQueryAttention, attention_forward, rope
from attn_np.grouped import (
    grouped_attention_backward,
    grouped_attention_forward,
)
from attn_np.masks import (
    and_masks,
    causal_mask,
    causal_mod,
    chunk_mod,
    chunked_mask,
    create_mask,
    document_ids,
    document_mod,
    document_positions,
    or_masks,
    padding_mod,
    position_mask,
    prefix_mod,
    sink_mod,
    window_mod,
)
from attn_np.refinements import ALiBi, SoftCap


@given(
    L_q=st.integers(0, 9),
    extra=st.integers(0, 6),
    W=st.integers(1, 8),
    S=st.integers(0, 3),
)
@settings(max_examples=60, deadline=None)
def test_causal_window_and_sinks_equal_position_mask(L_q, extra, W, S):
    L_k = L_q + extra
    pos = np.arange(L_k)
    causal = create_mask(causal_mod, 1, 1, L_q, L_k)[0, 0]
    assert np.array_equal(causal, causal_mask(L_q, L_k))
    if S >= W:
        return
    mod = and_masks(causal_mod, window_mod(W - S))
    if S:
        mod = and_masks(causal_mod, or_masks(window_mod(W - S), sink_mod(S)))
    want = position_mask(pos[L_k - L_q :], pos, window=W, sink_tokens=S)
    assert np.array_equal(create_mask(mod, 1, 1, L_q, L_k)[0, 0], want)


@pytest.mark.parametrize("C", [1, 3, 4, 16])
def test_chunks_equal_chunked_mask(C):
    p = np.arange(11)
    mod = and_masks(causal_mod, chunk_mod(C))
    got = create_mask(mod, 1, 1, 11, 11)[0, 0]
    assert np.array_equal(got, chunked_mask(p, p, C))


def test_documents_padding_and_prefix_by_loops():
    cu = [0, 3, 4, 9]
    ids = document_ids(cu)
    assert ids.tolist() == [0, 0, 0, 1, 2, 2, 2, 2, 2]
    assert document_positions(cu).tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 4]
    m = create_mask(and_masks(causal_mod, document_mod(cu)), 1, 1, 9, 9)
    loop = [
        [j <= i and ids[i] == ids[j] for j in range(9)] for i in range(9)
    ]
    assert np.array_equal(m[0, 0], np.array(loop))
    lengths = np.array([5, 2])
    m = create_mask(and_masks(causal_mod, padding_mod(lengths)), 2, 3, 6, 6)
    for b in range(2):
        for i in range(6):
            for j in range(6):
                assert m[b, 1, i, j] == (j <= i and j < lengths[b])
    m = create_mask(or_masks(causal_mod, prefix_mod(3)), 1, 1, 6, 6)[0, 0]
    assert m[0, 2] and m[1, 2] and not m[3, 4] and m[5, 4]


def test_a_mask_function_in_every_attention_call():
    rng = np.random.default_rng(0)
    cu = [0, 4, 7]
    mod = and_masks(causal_mod, document_mod(cu))
    grid = create_mask(mod, 2, 3, 7, 7)  # [B, H, L, L]
    q, k, v = (rng.standard_normal((2, 3, 7, 4)) for _ in range(3))
    a, _ = attention_forward(q, k, v, mask=mod)
    b, _ = attention_forward(q, k, v, mask=grid)
    assert np.array_equal(a, b)
    # the grouped core: 3 query heads over one key/value head
    qg = q[:, None]  # [B, 1, 3, L, d]
    kg, vg = k[:, :1], v[:, :1]
    a, _ = grouped_attention_forward(qg, kg, vg, allowed=mod)
    b, _ = grouped_attention_forward(qg, kg, vg, allowed=grid[:, None])
    assert np.array_equal(a, b)
    # chapter 3's layer
    layer = GroupedQueryAttention(12, 3, 1, seed=1)
    x = rng.standard_normal((2, 7, 12))
    a = layer.forward(x, mask=mod)
    b = layer.forward(x, mask=grid)
    assert np.array_equal(a, b)


def test_packed_documents_equal_each_document_alone():
    """What the document mask buys: a packed row of three documents gives
    each document exactly what it gets alone (without the mask the later
    documents read the earlier ones); and per-document positions restart
    RoPE as each document alone would have it."""
    rng = np.random.default_rng(1)
    cu = [0, 5, 7, 12]
    layer = GroupedQueryAttention(16, 4, 2, seed=2)  # no RoPE here
    x = rng.standard_normal((1, 12, 16))
    mod = and_masks(causal_mod, document_mod(cu))
    packed = layer.forward(x, mask=mod)
    leak = layer.forward(x, causal=True)
    for s, e in zip(cu[:-1], cu[1:]):
        alone = layer.forward(x[:, s:e], causal=True)
        assert np.abs(packed[:, s:e] - alone).max() < 1e-12
    assert np.abs(leak[:, 5:] - packed[:, 5:]).max() > 1e-3
    q = rng.standard_normal((12, 8))
    turned = rope(q, document_positions(cu), base=100.0)
    for s, e in zip(cu[:-1], cu[1:]):
        own = rope(q[s:e], np.arange(e - s), base=100.0)
        assert np.array_equal(turned[s:e], own)


@pytest.mark.parametrize(
    "mod, match",
    [
        (lambda b, h, q, kv: (kv <= q).astype(int), "booleans"),
        (lambda b, h, q, kv: np.ones((2, 2), bool), "does not broadcast"),
    ],
)
def test_a_bad_mask_function_is_refused(mod, match):
    with pytest.raises(ValueError, match=match):
        create_mask(mod, 1, 1, 3, 3)


@pytest.mark.parametrize(
    "cu", [[1, 3], [0, 3, 3], [0, 4, 2], [0], [0.0, 2.0]]
)
def test_offsets_must_increase_from_zero(cu):
    with pytest.raises(ValueError, match="cu_seqlens"):
        document_ids(cu)


def test_composition_refuses_what_is_not_a_mask_function():
    with pytest.raises(TypeError, match="and_masks"):
        and_masks(causal_mod, np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="at least one"):
        or_masks()
    with pytest.raises(TypeError, match="mask_mod"):
        create_mask(np.ones((2, 2), bool), 1, 1, 2, 2)


FLEX = Path(__file__).parent / "fixtures" / "flex_attention.npz"


def _flex_cases():
    f = np.load(FLEX)
    meta = json.loads(str(f["meta"]))
    return f, meta


def _ours(name, meta):
    """The NumPy side of each recorded case: a mask function, and for the
    score mods chapter 10's SoftCap and ALiBi in the grouped core."""
    doc = document_mod(meta["cu_seqlens"])
    masks = {
        "causal_document": and_masks(causal_mod, doc),
        "prefix_lm": or_masks(causal_mod, prefix_mod(meta["prefix"])),
        "window_document": and_masks(
            causal_mod, window_mod(meta["window"]), doc
        ),
        "softcap": causal_mod,
        "alibi": causal_mod,
    }
    mods = {
        "softcap": (SoftCap(meta["cap"]),),
        "alibi": (ALiBi(np.array(meta["slopes"])),),
    }
    return masks[name], mods.get(name, ())


@pytest.mark.parametrize(
    "name",
    ["causal_document", "prefix_lm", "window_document", "softcap", "alibi"],
)
def test_flex_attention_matches(name):
    """Against torch's flex_attention (CPU, float64, torch 2.13.0) and the
    gradients of its definition (scripts/record_flex_fixtures.py)."""
    f, meta = _flex_cases()
    q, k, v, dout = (f[f"{name}.{x}"] for x in ("q", "k", "v", "dout"))
    mask, mods = _ours(name, meta)
    # [B, H, L, d] -> the grouped core's [B, n_kv = H, G = 1, L, d]
    out, cache = grouped_attention_forward(
        q[:, :, None], k, v, allowed=mask, score_mods=mods
    )
    grads = grouped_attention_backward(dout[:, :, None], cache)
    out = out[:, :, 0]

    def rel(a, b):
        return np.abs(a - b).max() / np.abs(b).max()

    assert rel(out, f[f"{name}.out"]) < 1e-12
    assert rel(grads["q"][:, :, 0], f[f"{name}.grad.q"]) < 1e-12
    for x in ("k", "v"):
        assert rel(grads[x], f[f"{name}.grad.{x}"]) < 1e-12
    if not mods:  # the plain attention call takes the function too
        a, _ = attention_forward(q, k, v, mask=mask)
        assert rel(a, f[f"{name}.out"]) < 1e-12
