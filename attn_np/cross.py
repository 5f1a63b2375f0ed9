"""Cross-attention (chapter 16): queries from one sequence, keys and
values from another.

An encoder-decoder model's decoder reads its source through this layer:
``x [B, L_q, d_model]`` (the decoder's stream) makes the queries, the
encoder's output ``memory [B, L_k, d_model]`` the keys and values. It is
chapter 3's layer with one change in its project step, so the attend and
output steps, the grouped core and their backward are the same code. Every
query may attend every key of its source (a ``mask``, array or function,
can forbid some, e.g. the source's padding); there is no causal order
between two sequences, and no RoPE between them.

The keys and values depend on the source only, so a decoder that emits one
token at a time computes them once per source: :class:`CrossCache` holds
them, filled by the first call and read by every later one. The backward
returns the gradients of both inputs: ``dmemory`` is what flows into the
encoder, the sum of the key path and the value path.
"""

from __future__ import annotations

from ._checks import as_float_array, check_finite
from .grouped import grouped_attention_backward
from .heads import flat, merge_groups, merge_heads, split_groups, split_heads
from .multihead import GroupedQueryAttention


class CrossCache:
    """The keys ``[B, n_kv, L_k, d_k]`` and values ``[B, n_kv, L_k, d_v]``
    of one source, made once by :class:`CrossAttention`."""

    def __init__(self):
        self.keys = self.values = None
        self.owner = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]


class CrossAttention(GroupedQueryAttention):
    """``forward(x, memory) -> y``: ``n_heads`` query heads over the
    ``n_kv_heads`` key/value heads of ``memory``; the parameters of chapter
    3's layer (``W_q``, ``W_k``, ``W_v``, ``W_o``)."""

    def __init__(self, d_model, n_heads, n_kv_heads=None, **kwargs):
        for name in ("rope_base", "rotary", "window", "sinks", "flash"):
            if kwargs.get(name):
                raise ValueError(
                    f"cross-attention has no {name}: queries and keys come "
                    f"from two sequences, got {name}={kwargs[name]!r}"
                )
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        super().__init__(d_model, n_heads, n_kv_heads, **kwargs)

    def new_cache(self):
        """An empty :class:`CrossCache` for one source."""
        return CrossCache()

    def forward(self, x, memory=None, *, mask=None, kv_cache=None):
        """``x [B, L_q, d_model]`` attends ``memory [B, L_k, d_model]``;
        returns ``y [B, L_q, d_model]``. With ``kv_cache`` (a
        :class:`CrossCache`) the first call projects ``memory`` into it
        and later calls may pass ``memory=None``: they read the cache."""
        x3 = self._input(x, "x")
        if kv_cache is not None and not isinstance(kv_cache, CrossCache):
            raise TypeError(
                "kv_cache must be a CrossCache (new_cache()), got "
                f"{type(kv_cache).__name__}"
            )
        if kv_cache is not None and len(kv_cache):
            if kv_cache.owner is not self:
                raise ValueError("kv_cache holds another layer's source")
            if memory is not None:
                raise ValueError(
                    "the cache already holds this source's keys and "
                    "values: pass memory=None (or a new_cache() for a "
                    "new source)"
                )
            k, v, m3 = kv_cache.keys, kv_cache.values, None
        else:
            if memory is None:
                raise ValueError("memory is needed (the cache is empty)")
            m3 = self._input(memory, "memory")
            if m3.shape[0] != x3.shape[0]:
                raise ValueError(
                    f"x and memory must share the batch, got {x3.shape[0]} "
                    f"and {m3.shape[0]}"
                )
            k, v = self._project_memory(m3)
            if kv_cache is not None:
                kv_cache.keys, kv_cache.values = k, v
                kv_cache.owner = self
        q = self._project_queries(x3)  # [B, n_kv, G, L_q, d_k]
        o, self._att = self.attend(q, k, v, mask=mask, causal=False)
        y, out = self.output(o, x3)  # [B, L_q, d_model]
        self._cache = None if m3 is None else (x3, m3, out, self._att)
        return y

    def backward(self, dy):
        """``(dx, dmemory)``; fills ``self.grads`` (``W_q``, ``W_k``,
        ``W_v``, ``W_o``). Needs a forward that projected ``memory``."""
        if self._cache is None:
            raise RuntimeError(
                "backward needs a preceding forward that projected memory "
                "(a call reading a filled CrossCache is inference only)"
            )
        x3, m3, o, att = self._cache
        dy = as_float_array(dy, "dy")
        if dy.shape != (*x3.shape[:2], self.d_model):
            raise ValueError(
                f"dy must have the shape of the output "
                f"{(*x3.shape[:2], self.d_model)}, got {dy.shape}"
            )
        check_finite(dy, "dy")
        do, _ = self.output_backward(dy, o)
        g = grouped_attention_backward(do, att)
        W = self.params
        dq = merge_groups(g["q"])  # [B, L_q, h*d_k]
        self.grads["W_q"] = flat(x3).T @ flat(dq)
        dx = dq @ W["W_q"].T  # [B, L_q, d_model]
        dmemory = None
        for name in ("k", "v"):  # both paths flow into the encoder
            d = merge_heads(g[name])  # [B, L_k, n_kv*d]
            self.grads["W_" + name] = flat(m3).T @ flat(d)
            part = d @ W["W_" + name].T  # [B, L_k, d_model]
            dmemory = part if dmemory is None else dmemory + part
        return dx, dmemory

    # ------------------------------------------------------------------
    def _input(self, t, name):
        t = as_float_array(t, name)
        if t.ndim != 3 or t.shape[-1] != self.d_model:
            raise ValueError(
                f"{name} must be [B, L, d_model={self.d_model}], got shape "
                f"{t.shape}"
            )
        check_finite(t, name)
        return t

    def _project_queries(self, x3):
        B, L = x3.shape[:2]
        q = (flat(x3) @ self.params["W_q"]).reshape(B, L, -1)
        return split_groups(q, self.n_kv_heads, self.group_size, self.d_k)

    def _project_memory(self, m3):
        B, L = m3.shape[:2]
        mf, W = flat(m3), self.params  # [B*L_k, d_model]
        n_kv = self.n_kv_heads
        # [B*L_k, d_model] @ [d_model, n_kv*d] -> [B, n_kv, L_k, d]
        k = split_heads((mf @ W["W_k"]).reshape(B, L, -1), n_kv, self.d_k)
        v = split_heads((mf @ W["W_v"]).reshape(B, L, -1), n_kv, self.d_v)
        return k, v
