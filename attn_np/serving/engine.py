"""Continuous batching over a paged cache (chapter 15).

A step of :class:`Engine`:

1. **Schedule** under a token budget (``max_batch_tokens``), first come,
   first served: every running request's next token (a decode) first,
   then the next chunk of the prompts being prefilled (chunked prefill: a
   long prompt takes several steps, so decodes keep flowing), then new
   requests while the budget and the pool last. A request whose pages the
   pool cannot give preempts the latest-arrived running request: its
   pages go back, and it is computed again later (its tokens are kept).
2. **One forward over a ragged batch**: the chosen tokens of every
   sequence, packed into one ``[1, T, d_model]`` array with offsets. The
   projections, norms and feed-forwards are one product each for all
   ``T`` rows (the weights are read once per step, not once per
   sequence). The cache takes every row's keys and values in one write
   (their slots are worked out once per step), and attention is one
   :func:`~attn_np.serving.paged_attention` call for all the sequences
   that add one token (the decodes), each over its own pages, and one per
   prefill chunk. The attention layer is the book's one layer, driven
   step by step: its ``project``, ``position``, ``attend`` and
   ``output``.
3. **Sample** the sequences whose chunk reached their last known token,
   retire the finished ones (their pages are freed) and admit others in
   the next step, mid-flight.

A linear-attention layer (chapter 12) keeps one state per sequence (its
``new_cache()``) instead of pages. When every attention layer has a window
(chapter 8), pages wholly behind the widest window are freed.

Prefix caching is used unless the model has a linear layer: its state
sums a sequence's whole past into one array, and there is no page of it
to share. With windows it is exact as it is: a page a request frees
behind its window is only dropped from its table (a named page stays
cached for others until evicted), and a request that finds a prompt's
pages takes them from the first on, so it holds every page its queries
can see.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .._checks import check_count, check_positive_int, check_token_ids
from ..ffn import SwiGLU
from ..latent import MultiHeadLatentAttention
from ..multihead import GroupedQueryAttention
from ..pretrained.sampling import sampler
from .paged import (
    PagedKVCache,
    _gathered_attention,
    padded_tables,
    page_hashes,
    paged_attention,
)


@dataclass(eq=False)
class Request:
    """A request and where it stands: ``computed`` positions have their
    keys and values in the cache."""

    id: int
    prompt: np.ndarray
    max_new_tokens: int
    sample: object
    out: list = field(default_factory=list)
    computed: int = 0
    states: dict = field(default_factory=dict)  # linear layers' caches
    names: list = field(default_factory=list)  # its full pages' hashes

    @property
    def tokens(self) -> np.ndarray:
        return np.concatenate([self.prompt, np.asarray(self.out, int)])

    @property
    def known(self) -> int:
        return len(self.prompt) + len(self.out)


@dataclass(eq=False)
class Layout:
    """A step's packed rows (:meth:`Engine.layout`): ``ids [T]``, ``pos
    [T]`` absolute positions, ``ends`` the rows sampled, ``slots [T]``
    where their keys and values go, and ``groups`` the attention calls,
    ``(rows, tables, lengths)`` each."""

    ids: np.ndarray
    pos: np.ndarray
    ends: list
    slots: np.ndarray = None
    groups: list = field(default_factory=list)


def layer_step(layer):
    """``attend(q, k, v, mask, positions) -> o`` for
    :func:`~attn_np.serving.paged_attention`: the layer's own attention
    step on the gathered keys, so that its window, sinks and score mods
    apply as they do alone. A part that reads absolute positions (a mask
    rule such as chapter 11's chunks), or tiled kernels (``flash=True``,
    which take no mask), get one sequence at a time without its padding,
    at its own positions."""

    def attend(q, k, v, mask, positions):
        if layer.mask_rule is None and (mask is None or not layer.flash):
            return layer.attend(q, k, v, mask=mask, causal=True)[0]
        outs, L = [], q.shape[3]
        for b in range(q.shape[0]):
            n = k.shape[2] if mask is None else int(mask[b].sum())
            k_pos = positions[b, -n:]  # [n]
            where = dict(q_positions=k_pos[-L:], k_positions=k_pos)
            kb, vb = k[b : b + 1, :, -n:], v[b : b + 1, :, -n:]
            o, _ = layer.attend(q[b : b + 1], kb, vb, causal=True, **where)
            outs.append(o)  # [1, n_kv, G, L, d_v]
        return np.concatenate(outs)

    return attend


def _norm(layer, x):
    """A norm layer's output for inference: its ``step`` where it has one
    (RMSNorm: the same numbers, nothing kept or checked again; the rows
    entered as checked token ids), else its ``forward``."""
    step = getattr(layer, "step", None)
    return layer.forward(x) if step is None else step(x)


class ModelParts:
    """What the engine reads of a model of the book (chapter 14's
    :class:`~attn_np.pretrained.CausalLM`, chapter 5's
    :class:`~attn_np.Transformer`): embedding, blocks, final norm, head,
    and which blocks keep keys and values in pages, which MLA's latent
    rows (chapter 7) in pages, and which a state of their own."""

    def __init__(self, model):
        blocks = getattr(model, "blocks", None)
        if not blocks or not hasattr(model, "norm_f"):
            raise TypeError(
                "model must be a model of the book with blocks and norm_f "
                "(a CausalLM or a Transformer), got "
                f"{type(model).__name__}"
            )
        self.model, self.blocks = model, blocks
        self.paged = [
            isinstance(b.attn, GroupedQueryAttention) for b in blocks
        ]
        self.page_layer = {}  # block -> its layer in the pool
        for i, paged in enumerate(self.paged):
            if paged:
                self.page_layer[i] = len(self.page_layer)
        attn = [b.attn for b, p in zip(blocks, self.paged) if p]
        self.attn = attn
        self.latent = [
            isinstance(b.attn, MultiHeadLatentAttention) for b in blocks
        ]
        self.latent_layer = {}  # block -> its layer in the latent pool
        for i, latent in enumerate(self.latent):
            if latent:
                self.latent_layer[i] = len(self.latent_layer)
        self.mla = [b.attn for b, m in zip(blocks, self.latent) if m]
        widths = {a.d_latent_kv + a.d_rope for a in self.mla}
        if len(widths) > 1:
            raise ValueError(
                "model's MLA layers must keep rows of one width "
                f"(d_latent_kv + d_rope) to share pages, got {widths}"
            )
        self.d_latent = widths.pop() if widths else 1
        # pages behind every layer's window are freed: behind the widest
        # (an MLA layer has no window: it reads every page)
        windows = [a.window for a in attn] + [None] * len(self.mla)
        self.window = max(windows) if attn and None not in windows else None
        self.pages = bool(attn or self.mla)  # does any layer keep pages
        self.stateful = not all(
            p or m for p, m in zip(self.paged, self.latent)
        )
        self.dtype = np.dtype(model.embed.params["W"].dtype)
        self.vocab_size = model.vocab_size
        table = getattr(model, "positions", None)
        self.positions = table if isinstance(table, np.ndarray) else None

    def embed(self, ids, pos):
        """``[T, d]`` vectors of tokens ``ids`` at positions ``pos``."""
        x = self.model.embed.params["W"][ids]  # [T, d]
        if self.positions is not None:  # chapter 5's sinusoidal table
            x = x + self.positions[pos]
        return x

    def ffn(self, blk, x):
        h = _norm(blk.norm2, x)
        if isinstance(blk.ffn, SwiGLU):
            return blk.ffn.forward(h, keep=False)
        return blk.ffn.forward(h)

    def logits(self, x):
        """``x [1, n, d]`` -> ``[n, vocab]``: final norm and head."""
        h = _norm(self.model.norm_f, x)  # [1, n, d]
        head = getattr(self.model, "head", None)
        if head is None:  # tied (chapter 14)
            return (h @ self.model.head_weight.T)[0]
        return head.forward(h)[0]


class Engine:
    """Serve many requests with ``model`` over a :class:`PagedKVCache`
    of ``n_pages`` pages of ``page_size`` positions.

    ``max_batch_tokens`` caps the tokens of one step (prefill chunks and
    decodes together); ``max_seqs`` the sequences running at once;
    ``prefix_caching`` shares the full pages of common prompt prefixes;
    ``keep_logits`` keeps the logits each sample read (``logits[id]``,
    ``[max_new_tokens, vocab]``), for checking.
    """

    def __init__(
        self,
        model,
        *,
        page_size=16,
        n_pages=256,
        max_batch_tokens=256,
        max_seqs=None,
        prefix_caching=True,
        keep_logits=False,
    ):
        self.parts = parts = ModelParts(model)
        self.page_size = check_positive_int(page_size, "page_size")
        self.n_pages = check_positive_int(n_pages, "n_pages")
        self.max_batch_tokens = check_positive_int(
            max_batch_tokens, "max_batch_tokens"
        )
        self.max_seqs = (
            None
            if max_seqs is None
            else check_positive_int(max_seqs, "max_seqs")
        )
        if not isinstance(prefix_caching, bool):
            raise TypeError(
                "prefix_caching must be True or False, got "
                f"{prefix_caching!r}"
            )
        # a linear layer's state is not in pages: nothing to share
        self.prefix_caching = prefix_caching and not parts.stateful
        a = parts.attn[0] if parts.attn else None
        self.cache = PagedKVCache(
            n_pages,
            page_size,
            n_layers=len(parts.attn),
            n_kv_heads=a.n_kv_heads if a else 1,
            d_k=a.d_k if a else 1,
            d_v=a.d_v if a else 1,
            dtype=parts.dtype,
            n_latent_layers=len(parts.mla),
            d_latent=parts.d_latent,
        )
        self.requests = {}  # id -> Request, until finished
        self.waiting = deque()
        self.running = []  # in arrival order
        self.finished = {}
        self.keep_logits = bool(keep_logits)
        self.logits = {}  # id -> [rows read by the sampler]
        self._next_id = 0
        self.stats = dict(
            steps=0, computed=0, prefill=0, cached=0, preemptions=0
        )
        self.history = []  # per step: (tokens, seqs, reserved, used)
        self.plans = []  # per step: [(request_id, start, n)]

    def __repr__(self) -> str:
        return (
            f"Engine(page_size={self.page_size}, n_pages={self.n_pages}, "
            f"max_batch_tokens={self.max_batch_tokens}, "
            f"prefix_caching={self.prefix_caching}, "
            f"waiting={len(self.waiting)}, running={len(self.running)})"
        )

    # -- requests --------------------------------------------------------
    def add_request(
        self,
        prompt_ids,
        max_new_tokens,
        *,
        temperature=0.0,
        top_k=None,
        top_p=None,
        seed=0,
    ) -> int:
        """Queue a request: ``prompt_ids`` (a 1-D sequence of token ids)
        and ``max_new_tokens`` tokens to generate, greedy
        (``temperature=0``) or sampled as chapter 14's ``generate``.
        Returns its id."""
        ids = np.asarray(prompt_ids)
        V = self.parts.vocab_size
        if (
            ids.ndim != 1
            or ids.size == 0
            or not np.issubdtype(ids.dtype, np.integer)
            or ids.min() < 0
            or ids.max() >= V
        ):
            raise ValueError(
                "prompt_ids must be a non-empty 1-D sequence of token ids "
                f"in [0, {V}), got shape {ids.shape} dtype {ids.dtype}"
            )
        n = check_positive_int(max_new_tokens, "max_new_tokens")
        positions = len(ids) + n - 1  # the last token is never fed
        capacity = self.n_pages * self.page_size
        if positions > capacity:
            raise ValueError(
                f"prompt_ids ({len(ids)} tokens) and max_new_tokens ({n}) "
                f"need {positions} positions, more than the pool can "
                f"ever hold: n_pages={self.n_pages} x page_size="
                f"{self.page_size} = {capacity}"
            )
        table = self.parts.positions
        if table is not None and positions > len(table):
            raise ValueError(
                f"prompt_ids ({len(ids)} tokens) and max_new_tokens ({n}) "
                f"need {positions} positions; the model's position table "
                f"holds max_len={len(table)}"
            )
        sample = sampler(temperature, top_k, top_p, seed, vocab=V)
        rid = self._next_id
        self._next_id += 1
        req = Request(rid, ids.astype(np.int64), n, sample)
        self.requests[rid] = req
        self.waiting.append(req)
        return rid

    def _request(self, request_id) -> Request:
        if request_id not in self.requests:
            raise ValueError(
                f"request_id {request_id!r} is not a request in flight "
                f"(in flight: {sorted(self.requests)[:8]})"
            )
        return self.requests[request_id]

    def cancel(self, request_id) -> None:
        """Drop a request in flight and free its pages."""
        req = self._request(request_id)
        if req in self.running:
            self.running.remove(req)
            self.cache.release(req.id)
        else:
            self.waiting.remove(req)
        del self.requests[request_id]

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def run(self) -> dict:
        """Step until every request is done; ``{request_id: ids}``
        (prompt and generated tokens) of the requests finished."""
        out = {}
        while not self.idle:
            out.update(self.step())
        return out

    # -- a step ------------------------------------------------------------
    def step(self) -> list:
        """Schedule, one forward, sample; the ``(request_id, ids)`` of the
        requests that finished in this step."""
        plan = self._schedule()
        if not plan:
            return []
        logits = self.forward(plan)  # [sampled, vocab]
        sampled, P = [], self.page_size
        for req, start, n in plan:
            req.computed = start + n
            if self.prefix_caching and (start + n) // P > start // P:
                self._name(req)  # it filled a page: name it
            if start + n == req.known:  # not a prefill chunk with more
                sampled.append(req)
        done = []
        tokens = self.sample(sampled, logits)
        for req, token, row in zip(sampled, tokens, logits):
            req.out.append(int(token))
            if self.keep_logits:
                self.logits.setdefault(req.id, []).append(row)
            if len(req.out) == req.max_new_tokens:
                done.append(self._retire(req))
            elif self.parts.window is not None:
                self._forget(req)
        self.stats["steps"] += 1
        used = sum(self.cache.lengths.values())
        reserved = self.cache.pages_in_use * self.page_size
        tokens = sum(n for _, _, n in plan)
        self.history.append((tokens, len(plan), reserved, used))
        self.plans.append([(r.id, s, n) for r, s, n in plan])
        return done

    @staticmethod
    def sample(reqs, logits) -> np.ndarray:
        """The next token of each request, ``logits [len(reqs), vocab]``:
        the greedy ones in one ``argmax``, the others each with its own
        seeded sampler (:func:`~attn_np.pretrained.sampler`)."""
        tokens = np.argmax(logits, axis=-1)  # [len(reqs)]
        for j, req in enumerate(reqs):
            if not req.sample.greedy:
                tokens[j] = req.sample(logits[j : j + 1])[0]
        return tokens

    def _retire(self, req):
        """Free a finished request's pages; ``(request_id, ids)``."""
        self.running.remove(req)
        self.cache.release(req.id)
        del self.requests[req.id]
        self.finished[req.id] = req.tokens
        if self.keep_logits:
            self.logits[req.id] = np.stack(self.logits[req.id])
        return req.id, req.tokens

    def _names(self, req) -> list:
        """``req.names`` grown to every full page of its known tokens."""
        P = self.page_size
        have = len(req.names)
        if req.known // P > have:
            toks = req.tokens
            parent = req.names[-1] if have else None
            req.names += page_hashes(toks[have * P :], P, parent)
        return req.names

    def _name(self, req) -> None:
        self.cache.name_pages(req.id, self._names(req))

    def _forget(self, req) -> None:
        """Free the pages wholly behind the window of the next query."""
        W, P = self.parts.window, self.page_size
        table = self.cache.tables[req.id]
        first = max(0, req.computed + 1 - W) // P  # first page still seen
        for i in range(first):
            if table[i] >= 0:
                self.cache._drop(table[i])
                table[i] = -1

    def _preempt(self, req) -> None:
        """Give back ``req``'s pages and queue it first: its tokens so far
        are its new prompt (computed again later)."""
        self.running.remove(req)
        self.cache.release(req.id)
        req.computed, req.states = 0, {}
        self.waiting.appendleft(req)
        self.stats["preemptions"] += 1

    def _reserve(self, req, n, planned) -> bool:
        """Pages for ``n`` more positions of ``req``, preempting the
        latest-arrived running request not yet planned; False if ``req``
        itself had to go."""
        while not self.cache.reserve(req.id, n):
            victims = [r for r in self.running if r not in planned]
            victim = victims[-1] if victims else req
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _schedule(self) -> list:
        """``[(request, start, n)]``: who computes which positions."""
        budget, plan, planned = self.max_batch_tokens, [], set()
        inflight = set()
        # decodes first, then prefill chunks, each in arrival order
        decoding = [r for r in self.running if r.known - r.computed == 1]
        prefilling = [r for r in self.running if r.known - r.computed > 1]
        for req in decoding + prefilling:
            if budget == 0:
                break
            if req not in self.running:  # preempted meanwhile
                continue
            n = min(req.known - req.computed, budget)
            if not self._reserve(req, n, planned):
                continue
            plan.append((req, req.computed, n))
            planned.add(req)
            budget -= n
            inflight.update(self._completes(req, n))
        while self.waiting and budget > 0:
            if (
                self.max_seqs is not None
                and len(self.running) >= self.max_seqs
            ):
                break
            req = self.waiting[0]
            start = self._admit(req)
            if start is None or self._names_next(req, start) in inflight:
                # the pool is short, or the next page of its prompt is
                # being computed by another request: wait for it
                self.cache.release(req.id)
                req.computed = 0
                break
            n = min(req.known - start, budget)
            if not self.cache.reserve(req.id, n):
                self.cache.release(req.id)
                req.computed = 0
                break
            self.waiting.popleft()
            self.running.append(req)
            req.computed = start
            self.stats["cached"] += start
            plan.append((req, start, n))
            planned.add(req)
            budget -= n
            inflight.update(self._completes(req, n))
        return plan

    def _admit(self, req):
        """Take the cached pages of ``req``'s prefix (prefix caching);
        the first position to compute."""
        if not self.prefix_caching:
            self.cache.reserve(req.id, 0)
            return 0
        # at least the last known token is computed: its logits are needed
        usable = (req.known - 1) // self.page_size
        return self.cache.lookup(req.id, self._names(req)[:usable])

    def _names_next(self, req, start):
        if not self.prefix_caching:
            return None
        i = start // self.page_size
        names = self._names(req)
        return names[i] if i < len(names) else None

    def _completes(self, req, n):
        """Names of the pages ``req`` fills in this step."""
        if not self.prefix_caching:
            return ()
        P, names = self.page_size, self._names(req)
        return names[req.computed // P : (req.computed + n) // P]

    # -- the forward over a ragged batch ----------------------------------
    def forward(self, plan) -> np.ndarray:
        """Logits ``[sampled, vocab]`` of the last row of each segment
        ``(request, start, n)`` that reaches its request's last known
        token; writes every segment's keys and values."""
        parts = self.parts
        batch = self.layout(plan)
        x = parts.embed(batch.ids, batch.pos)[None]  # [1, T, d]
        for i, blk in enumerate(parts.blocks):
            h = _norm(blk.norm1, x)  # [1, T, d]
            if parts.paged[i]:
                a = self.attention(blk.attn, parts.page_layer[i], h, batch)
            elif parts.latent[i]:
                a = self.latent_attention(
                    blk.attn, parts.latent_layer[i], h, batch
                )
            else:
                a = self.stateful(blk.attn, i, h, plan)
            x = x + a  # [1, T, d]
            x = x + parts.ffn(blk, x)
        for r, s, n in plan:
            self.stats["computed"] += n
            self.stats["prefill"] += min(n, max(0, len(r.prompt) - s))
        return parts.logits(x[:, batch.ends])  # [sampled, vocab]

    def layout(self, plan) -> Layout:
        """The step's packed rows: token ids, positions, the slots their
        keys and values go to, the rows sampled, and the attention calls:
        one for every segment of one row (the decodes), one per longer
        segment (a prefill chunk). Worked out once, for every layer."""
        sizes = [n for _, _, n in plan]
        offs = np.concatenate([[0], np.cumsum(sizes)])  # [segments + 1]
        ids = np.concatenate([r.tokens[s : s + n] for r, s, n in plan])
        pos = np.concatenate([np.arange(s, s + n) for _, s, n in plan])
        ends = [
            offs[j + 1] - 1
            for j, (r, s, n) in enumerate(plan)
            if s + n == r.known
        ]
        batch = Layout(ids, pos, ends)
        if not self.parts.pages:
            return batch
        tables = self.cache.tables
        for r, s, n in plan:  # written by the end of the step
            self.cache.lengths[r.id] = s + n
        batch.slots = np.concatenate(
            [self.cache.slots(r.id, s, s + n) for r, s, n in plan]
        )  # [T]
        one = [j for j, n in enumerate(sizes) if n == 1]
        if one:  # one query of each: [B] rows, tables, lengths
            rows = offs[one]
            seqs = [tables[plan[j][0].id] for j in one]
            batch.groups.append(
                (rows, padded_tables(seqs), pos[rows].astype(np.int64) + 1)
            )
        for j, (r, s, n) in enumerate(plan):
            if n > 1:  # a chunk: its rows, its table, its length
                rows = slice(offs[j], offs[j + 1])
                length = np.array([s + n], dtype=np.int64)  # [1]
                batch.groups.append(
                    (rows, padded_tables([tables[r.id]]), length)
                )
        return batch

    def attention(self, layer, li, h, batch) -> np.ndarray:
        """One attention layer over the packed rows ``h [1, T, d]``: one
        projection for all rows, one write of their keys and values into
        the pool, one :func:`~attn_np.serving.paged_attention` for the
        decodes and one per prefill chunk, one output projection."""
        q, k, v = layer.project(h)  # [1, n_kv, G, T, d_k], [1, n_kv, T, d]
        # every row turned by its own absolute position, in one call
        q, k, _ = layer.position(q, k, batch.pos)
        self.cache.store(li, batch.slots, k[0], v[0])
        pool = self.cache.k[li], self.cache.v[li]  # [pages, P, n_kv, d]
        # the pool's own tables, and keys and values checked when stored
        kw = dict(check_read=False)
        attend = layer_step(layer)
        o = np.empty((*q.shape[:-1], v.shape[-1]), q.dtype)
        for rows, tables, lengths in batch.groups:
            args = (*pool, tables, lengths, layer.window, None, attend)
            if isinstance(rows, slice):  # a chunk: [1, n_kv, G, n, d_k]
                qs = q[..., rows, :]
                o[..., rows, :] = _gathered_attention(qs, *args, **kw)
            else:  # a row of each of B sequences: [B, n_kv, G, 1, d_k]
                qs = q[0][:, :, rows, None].transpose(2, 0, 1, 3, 4)
                ob = _gathered_attention(qs, *args, **kw)
                # [B, n_kv, G, d_v] -> [n_kv, G, B, d_v]
                o[0][:, :, rows] = ob[:, :, :, 0].transpose(1, 2, 0, 3)
        y, _ = layer.output(o, h)  # [1, T, d]
        return y

    def latent_attention(self, layer, li, h, batch) -> np.ndarray:
        """An MLA layer (chapter 7) over the packed rows ``h [1, T, d]``:
        its pages hold the rows ``[c_KV ; k_R]``, and its absorbed step
        is multi-query attention whose one key is the row and whose one
        value is ``c_KV``, so :func:`~attn_np.serving.paged_attention`
        gathers rows as it gathers keys."""
        # [1, 1, h, T, d_c + d_R], [1, T, d_c + d_R]
        q, lat = layer.project_latent(h, batch.pos)
        self.cache.store_latent(li, batch.slots, lat[0])
        pool = self.cache.latent[li]  # [pages, P, 1, d_c + d_R]
        pool = pool, pool[..., : layer.d_latent_kv]  # keys, values
        o = np.empty((*q.shape[:-1], layer.d_latent_kv), q.dtype)

        def attend(qs, k, v, mask, positions):
            return layer.attend_latent(qs, k, v, mask)

        for rows, tables, lengths in batch.groups:
            if isinstance(rows, slice):  # a chunk: [1, 1, h, n, d]
                o[..., rows, :] = paged_attention(
                    q[..., rows, :], *pool, tables, lengths, attend=attend
                )
            else:  # a row of each of B sequences: [B, 1, h, 1, d]
                qs = q[0][:, :, rows, None].transpose(2, 0, 1, 3, 4)
                ob = paged_attention(
                    qs, *pool, tables, lengths, attend=attend
                )
                o[0][:, :, rows] = ob[:, :, :, 0].transpose(1, 2, 0, 3)
        return layer.output_latent(o)  # [1, T, d]

    def stateful(self, layer, i, h, plan) -> np.ndarray:
        """A layer that keeps a state per sequence (chapter 12's linear
        attention): each segment through its request's own cache."""
        outs, off = [], 0
        for req, _, n in plan:
            if i not in req.states:
                req.states[i] = layer.new_cache()
            y = layer.forward(h[:, off : off + n], kv_cache=req.states[i])
            outs.append(y)
            off += n
        if not self.parts.pages:
            for req, start, n in plan:
                self.cache.reserve(req.id, 0)
                self.cache.lengths[req.id] = start + n
        return np.concatenate(outs, axis=1)  # [1, T, d]


def generate_alone(
    model, prompt_ids, max_new_tokens, *, chunk=None, **sampling
):
    """The reference: one request alone, every layer with the cache its
    ``new_cache()`` makes (chapter 4's contiguous :class:`~attn_np.KVCache`,
    a linear layer's state), the prompt in chunks of ``chunk`` (all at
    once by default), then one token at a time. Returns ``(ids,
    logits)``: prompt and generated tokens, and the logits each sample
    read ``[max_new_tokens, vocab]``."""
    parts = ModelParts(model)
    check_token_ids(prompt_ids, parts.vocab_size, "prompt_ids")
    ids = [int(t) for t in np.asarray(prompt_ids)]
    n = check_count(max_new_tokens, "max_new_tokens")
    sample = sampler(
        sampling.get("temperature", 0.0),
        sampling.get("top_k"),
        sampling.get("top_p"),
        sampling.get("seed", 0),
        vocab=parts.vocab_size,
    )
    caches = [blk.attn.new_cache() for blk in parts.blocks]
    chunk = len(ids) if chunk is None else check_positive_int(chunk, "chunk")
    seen, feed, rows = (
        0,
        [ids[i : i + chunk] for i in range(0, len(ids), chunk)],
        [],
    )
    while True:
        for piece in feed:
            x = parts.embed(
                np.asarray(piece), np.arange(seen, seen + len(piece))
            )
            x = x[None]  # [1, L, d]
            for blk, cache in zip(parts.blocks, caches):
                a = blk.attn.forward(blk.norm1.forward(x), kv_cache=cache)
                x = x + a
                x = x + parts.ffn(blk, x)
            seen += len(piece)
        logits = parts.logits(x[:, -1:])  # [1, vocab]
        rows.append(logits[0])
        ids.append(int(sample(logits)[0]))
        if len(rows) == n:
            return np.asarray(ids), np.stack(rows)
        feed = [[ids[-1]]]
