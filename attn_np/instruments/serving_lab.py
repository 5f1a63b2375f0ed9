"""Measuring chapter 15's engine: repeatable decode steps at a batch size,
the decode step's roofline, random workloads and the memory they reserve,
and a shared system prompt. ``python -m attn_np.bench serve`` and the
chapter's timing cells use these."""

from __future__ import annotations

import time

import numpy as np

from attn_np.serving import Engine


def decoding_engine(model, batch, prompt_len, *, page_size=16, seed=0):
    """An engine with ``batch`` requests of ``prompt_len`` random tokens,
    prefilled, every one about to decode; and ``step()``: one decode
    step of the whole batch, undone after it (the tokens sampled are
    dropped and the positions forgotten), so every call times the same
    step. Returns ``(engine, step)``."""
    rng = np.random.default_rng(seed)
    per = -(-(prompt_len + 2) // page_size)
    eng = Engine(
        model,
        page_size=page_size,
        n_pages=batch * per + 1,
        max_batch_tokens=max(batch * prompt_len, batch),
        prefix_caching=False,
    )
    for _ in range(batch):
        eng.add_request(rng.integers(0, model.vocab_size, prompt_len), 3)
    # every prompt in one chunk, a first token each; the timed step
    # samples a second, undone, so none ever reaches its third
    eng.step()
    running = list(eng.running)

    def step():
        eng.step()
        for req in running:  # undo: the same step next time
            req.out.pop()
            req.computed -= 1
            eng.cache.lengths[req.id] -= 1

    return eng, step


def step_bytes(model, batch, context) -> int:
    """Bytes a decode step of ``batch`` sequences must read: every weight
    once (the tied embedding once, as the head), and each sequence's
    cached keys and values at ``context`` positions."""
    c = model.config
    item = np.dtype(model.dtype).itemsize
    kv = c.n_layers * 2 * c.n_kv_heads * c.d_k * item * context
    return model.nbytes + batch * kv


def step_flops(model, batch, context) -> float:
    """FLOPs of a decode step of ``batch`` tokens: ``2`` per weight and
    token (the blocks and the head), and the scores and weighted values
    over ``context`` keys."""
    c = model.config
    d, h, n_kv, d_k, f = c.d_model, c.n_heads, c.n_kv_heads, c.d_k, c.d_ff
    per_layer = d * (h + 2 * n_kv) * d_k + h * d_k * d + 3 * d * f
    weights = c.n_layers * per_layer + c.vocab_size * d
    attention = c.n_layers * h * 2 * 2 * d_k * context
    return batch * (2.0 * weights + attention)


def random_workload(seed, n, *, vocab, prompt=(8, 96), new=(8, 96)):
    """``n`` requests ``(prompt_ids, max_new_tokens)``: prompt and output
    lengths drawn uniformly from the ranges (inclusive)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        L = int(rng.integers(prompt[0], prompt[1] + 1))
        m = int(rng.integers(new[0], new[1] + 1))
        out.append((rng.integers(0, vocab, L), m))
    return out


def memory_trace(model, requests, *, page_size=16, n_pages=512, **kw):
    """Serve ``requests`` and record, every step, the positions held
    (``used``), reserved by the pages (``paged``), and reserved by a
    contiguous cache preallocated to the longest request of the workload
    for every running request (``contiguous``). Returns ``{name: array
    per step}`` and the engine."""
    longest = max(len(p) + m for p, m in requests)
    eng = Engine(model, page_size=page_size, n_pages=n_pages, **kw)
    for p, m in requests:
        eng.add_request(p, m)
    used, paged, contiguous = [], [], []
    while not eng.idle:
        eng.step()
        used.append(sum(eng.cache.lengths.values()))
        paged.append(eng.cache.pages_in_use * page_size)
        contiguous.append(len(eng.running) * longest)
    trace = {
        "used": np.array(used),
        "paged": np.array(paged),
        "contiguous": np.array(contiguous),
    }
    return trace, eng


def shared_prompt_workload(seed, n, system, user, *, vocab):
    """``n`` prompts: the same ``system`` random tokens, then ``user``
    tokens of each request's own."""
    rng = np.random.default_rng(seed)
    head = rng.integers(0, vocab, system)
    return [
        np.concatenate([head, rng.integers(0, vocab, user)])
        for _ in range(n)
    ]


def prefill_all(model, prompts, *, prefix_caching, page_size=16, **kw):
    """Serve ``prompts`` one token each; returns the engine (its
    ``stats["prefill"]``: prompt positions computed)."""
    per = sum(-(-(len(p) + 1) // page_size) for p in prompts)
    eng = Engine(
        model,
        page_size=page_size,
        n_pages=per + 1,
        prefix_caching=prefix_caching,
        **kw,
    )
    for p in prompts:
        eng.add_request(p, 1)
    eng.run()
    return eng


def timed_run(eng):
    """Step ``eng`` until idle, timing each step. Returns ``(seconds per
    step, {request_id: [step index of each token it made]})``."""
    times, made = [], {}
    while not eng.idle:
        before = {r.id: len(r.out) for r in eng.running}
        t0 = time.perf_counter()
        done = eng.step()
        times.append(time.perf_counter() - t0)
        after = {r.id: len(r.out) for r in eng.running}
        after.update({rid: before.get(rid, 0) + 1 for rid, _ in done})
        for rid, n in after.items():
            for _ in range(n - before.get(rid, 0)):
                made.setdefault(rid, []).append(len(times) - 1)
    return np.array(times), made


def chunked_prefill(model, budget, *, long=192, decoders=3, seed=0):
    """``decoders`` short requests decoding when a ``long``-token prompt
    arrives; the engine's token budget ``budget`` (a budget below
    ``long`` splits its prefill into chunks). Returns ``(engine, step
    seconds, tokens made per request by step, the long request's id)``."""
    rng = np.random.default_rng(seed)
    V = model.vocab_size
    eng = Engine(
        model,
        page_size=16,
        n_pages=64,
        max_batch_tokens=budget,
        prefix_caching=False,
    )
    for _ in range(decoders):
        eng.add_request(rng.integers(0, V, 8), 12)
    eng.step()  # the short prompts, one chunk each: now decoding
    rid = eng.add_request(rng.integers(0, V, long), 4)
    times, made = timed_run(eng)
    return eng, times, made, rid
