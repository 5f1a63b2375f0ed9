"""The released layers of chapter 12, in named steps like the chapter-2
layer: :class:`GatedDeltaNet` (Qwen3-Next's ``linear_attention``) and
:class:`KimiDeltaAttention`, which overrides its projections and gates.

``forward`` is project (one product for every projection of ``x``),
convolve (:mod:`~attn_np.linear.conv`), heads (L2 norm,
:mod:`~attn_np.linear.gates`), gates, the delta rule (a kernel of
:data:`KERNELS`: :mod:`~attn_np.linear.chunked` or
:mod:`~attn_np.linear.recurrent`) and output (gated RMSNorm, ``W_o``). The
cache is a :class:`~attn_np.linear.cache.StateCache`, through
``kv_cache=`` and :meth:`GatedDeltaNet.new_cache` like every layer's.
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import (
    as_float_array,
    check_finite,
    check_flag,
    check_float_dtype,
    check_positive_int,
    check_upstream,
)
from ..softmax import sigmoid
from ..training.layers import rmsnorm_backward, rmsnorm_forward
from ..training.transformer import register_layer_kind
from .cache import StateCache, check_head_groups, state_bytes
from .chunked import (
    gated_delta_chunked_backward,
    gated_delta_chunked_forward,
)
from .conv import (
    causal_conv_backward,
    causal_conv_forward,
    silu,
    silu_backward,
)
from .gates import l2norm_backward, l2norm_forward, softplus
from .recurrent import (
    gated_delta_recurrent_backward,
    gated_delta_recurrent_forward,
)

KERNELS = {
    "chunked": (gated_delta_chunked_forward, gated_delta_chunked_backward),
    "recurrent": (
        gated_delta_recurrent_forward,
        gated_delta_recurrent_backward,
    ),
}


class GatedDeltaNet:
    """The Gated DeltaNet layer as Qwen3-Next releases it
    (``Qwen3NextGatedDeltaNet`` in Hugging Face ``transformers``).

    ``n_k_heads`` key heads of ``d_k`` and ``n_v_heads`` value heads of
    ``d_v`` (a multiple: value head ``j`` reads key head ``j // G``, ``G
    = n_v_heads // n_k_heads``); one state ``[d_k, d_v]`` per value head.
    Parameters::

        W_q, W_k [d_model, n_k d_k]   W_v, W_z [d_model, n_v d_v]
        W_a, W_b [d_model, n_v]       A_log, dt_bias [n_v]
        conv_q, conv_k [K, n_k d_k]   conv_v [K, n_v d_v]
        norm [d_v]                    W_o [n_v d_v, d_model]

    Forward, ``x [B, L, d_model]``: project; short causal convolution and
    SiLU on q, k, v; L2-normalise q and k, scale q by ``1/sqrt(d_k)``;
    ``g = -exp(A_log) softplus(x W_a + dt_bias)``, ``beta = sigmoid(x
    W_b)``; the gated delta rule (``mode``: ``"chunked"`` or
    ``"recurrent"``); ``RMSNorm(o) * silu(x W_z)`` per value head;
    ``W_o``. ``kv_cache=`` (a :class:`StateCache`, from
    :meth:`new_cache`) continues from the cached state, for decoding: the
    cache protocol of every layer in the book.

    ``allow_neg_eigval=True`` doubles ``beta`` (FLA's name; OLMo Hybrid's
    ``linear_allow_neg_eigval``): in ``(0, 2)``, the update ``I - beta k
    k^T`` may turn the state's direction ``k`` around (its eigenvalue
    ``1 - beta`` down to -1), not only shrink it.
    """

    def __init__(
        self,
        d_model,
        n_v_heads,
        n_k_heads=None,
        d_k=None,
        d_v=None,
        *,
        conv_size=4,
        chunk_size=64,
        mode="chunked",
        eps=1e-6,
        allow_neg_eigval=False,
        seed=0,
        dtype=np.float64,
    ):
        self.d_model = check_positive_int(d_model, "d_model")
        self.n_v_heads = check_positive_int(n_v_heads, "n_v_heads")
        self.n_k_heads = (
            self.n_v_heads
            if n_k_heads is None
            else check_positive_int(n_k_heads, "n_k_heads")
        )
        check_head_groups(self.n_v_heads, self.n_k_heads)
        if (d_k is None or d_v is None) and d_model % self.n_v_heads:
            raise ValueError(
                "d_model must be divisible by n_v_heads when d_k or d_v is "
                f"not given, got d_model={d_model}, n_v_heads={n_v_heads}"
            )
        default = self.d_model // self.n_v_heads
        self.d_k = check_positive_int(default if d_k is None else d_k, "d_k")
        self.d_v = check_positive_int(default if d_v is None else d_v, "d_v")
        self.group_size = self.n_v_heads // self.n_k_heads
        self.conv_size = check_positive_int(conv_size, "conv_size")
        self.chunk_size = check_positive_int(chunk_size, "chunk_size")
        if mode not in KERNELS:
            raise ValueError(
                f"mode must be one of {tuple(KERNELS)}, got {mode!r}"
            )
        self.mode = mode
        self.eps = float(eps)
        self.allow_neg_eigval = check_flag(
            allow_neg_eigval, "allow_neg_eigval"
        )
        self.dtype = dtype = check_float_dtype(dtype)
        rng = np.random.default_rng(seed)
        d, n_k, n_v = self.d_model, self.n_k_heads, self.n_v_heads
        self.params = {}
        for name, shape in self._projection_shapes().items():
            self.params[name] = (
                rng.standard_normal(shape) / np.sqrt(shape[0])
            ).astype(dtype)
        K = self.conv_size
        for name, ch in (("q", n_k * self.d_k), ("k", n_k * self.d_k)):
            self.params[f"conv_{name}"] = rng.uniform(
                -1 / np.sqrt(K), 1 / np.sqrt(K), (K, ch)
            ).astype(dtype)
        self.params["conv_v"] = rng.uniform(
            -1 / np.sqrt(K), 1 / np.sqrt(K), (K, n_v * self.d_v)
        ).astype(dtype)
        self.params.update(self._gate_params(rng))
        self.params["norm"] = np.ones(self.d_v, dtype=dtype)
        self.params["W_o"] = (
            rng.standard_normal((n_v * self.d_v, d))
            / np.sqrt(n_v * self.d_v)
        ).astype(dtype)
        self.grads = {n: np.zeros_like(p) for n, p in self.params.items()}
        self._cache = None

    # the hooks a variant overrides: its projections and its two gates
    def _projection_shapes(self) -> dict:
        d, n_k, n_v = self.d_model, self.n_k_heads, self.n_v_heads
        return {
            "W_q": (d, n_k * self.d_k),
            "W_k": (d, n_k * self.d_k),
            "W_v": (d, n_v * self.d_v),
            "W_z": (d, n_v * self.d_v),
            "W_a": (d, n_v),
            "W_b": (d, n_v),
        }

    def _gate_params(self, rng) -> dict:
        """``A_log = log(A)``, ``A ~ U(1, 16)``; ``dt_bias`` the inverse
        softplus of ``dt``, log-uniform in ``[0.001, 0.1]`` (FLA's
        initialisation)."""
        n = self.n_v_heads
        A = rng.uniform(1, 16, n)
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), n))
        return {
            "A_log": np.log(A).astype(self.dtype),
            "dt_bias": (dt + np.log(-np.expm1(-dt))).astype(self.dtype),
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(d_model={self.d_model}, n_v_heads="
            f"{self.n_v_heads}, n_k_heads={self.n_k_heads}, d_k={self.d_k}, "
            f"d_v={self.d_v}, conv_size={self.conv_size}, "
            f"mode={self.mode!r}, chunk_size={self.chunk_size}, "
            + ("allow_neg_eigval=True, " if self.allow_neg_eigval else "")
            + f"dtype={self.dtype})"
        )

    @property
    def n_params(self) -> int:
        return sum(p.size for p in self.params.values())

    def state_bytes_per_sequence(self, dtype=None) -> int:
        """:func:`state_bytes` of this layer (in its dtype by default)."""
        return state_bytes(
            self.n_v_heads,
            self.n_k_heads,
            self.d_k,
            self.d_v,
            conv_size=self.conv_size,
            dtype=self.dtype if dtype is None else dtype,
        )

    def new_cache(self) -> StateCache:
        """An empty :class:`StateCache` for ``forward(x, kv_cache=...)``."""
        return StateCache()

    @property
    def _beta_scale(self) -> float:
        """What ``beta`` is multiplied by: 2 with ``allow_neg_eigval``."""
        return 2.0 if self.allow_neg_eigval else 1.0

    # ------------------------------------------------------------------
    # forward: project, convolve, heads, gates, the delta rule, output
    def forward(self, x, *, causal=True, kv_cache=None):
        """``x [L, d_model]`` or ``[B, L, d_model]`` -> ``y`` of the same
        shape. Always causal. With ``kv_cache``, ``x`` is the next
        chunk of the sequences the cache has seen (inference only)."""
        if causal is not True:
            raise ValueError(
                "a Gated DeltaNet layer is causal (its state runs forward "
                f"in time): call forward(x, causal=True), got {causal!r}"
            )
        # the last forward's cache is replaced: drop it before allocating
        # the new one (the loop's holds T + 1 states)
        self._cache = None
        x3, unbatched = self._check_input(x, kv_cache)
        B, L, _ = x3.shape
        prev, S0 = self._cache_start(kv_cache, x3)
        xf = x3.reshape(B * L, self.d_model)  # [B*L, d_model]
        # 1. project, one product for every projection of x:
        # [B*L, d_model] @ [d_model, ch_all] -> [B*L, ch_all]
        W_in, names, cuts = self._in_projection()
        h_all = xf @ W_in
        h = dict(zip(names, np.split(h_all, cuts, axis=1)))  # views
        # 2. convolve, 3. heads: q, k [B, n_k, G, L, d_k], v [.., d_v]
        qkv, cconv = self._convolve(h_all, prev, B, L)
        q, k, v, norms = self._heads(qkv, B, L)
        # 4. gates: g [B, L, n_v (, d_k)], beta [B, L, n_v]
        g, beta, cgate = self._gates_forward(h, B, L)
        beta = beta * self._beta_scale  # 2: in (0, 2) (allow_neg_eigval)
        # 5. the gated delta rule: o [B, n_k, G, L, d_v]
        o, use, ckern = self._delta_rule(q, k, v, g, beta, S0)
        # 6. output: gated RMSNorm and W_o -> [B, L, d_model]
        out, on, cnorm, z, cz, y = self._output(o, h, B, L)
        if kv_cache is not None:
            self._cache_end(kv_cache, cconv, ckern, L)
            return out[0] if unbatched else out
        self._cache = dict(
            xf=xf,
            W_in=W_in,
            shape=(B, L, unbatched),
            conv=cconv,
            norms=norms,
            gate=cgate,
            kernel=(use, ckern),
            on=on,
            norm=cnorm,
            z=z,
            out_gate=cz,
            y=y,
        )
        return out[0] if unbatched else out

    def _check_input(self, x, kv_cache):
        """``(x3 [B, L, d_model], unbatched)``, or a ``ValueError`` naming
        ``x`` (``x_chunk`` with a cache)."""
        name = "x" if kv_cache is None else "x_chunk"
        x = as_float_array(x, name)
        check_finite(x, name)
        if x.ndim not in (2, 3) or x.shape[-1] != self.d_model:
            raise ValueError(
                f"{name} must have shape [L, d_model] or [B, L, d_model] "
                f"with d_model={self.d_model}, got {x.shape}"
            )
        x3 = x[None] if x.ndim == 2 else x
        if x3.shape[0] == 0 or x3.shape[1] == 0:
            raise ValueError(
                f"{name} must hold at least one position of one "
                f"sequence, got shape {x.shape}"
            )
        return x3, x.ndim == 2

    def _cache_start(self, kv_cache, x3):
        """``(prev, S0)``: the convolution's last inputs ``(q, k, v)`` and
        the state ``[B, n_k, G, d_k, d_v]`` the cache holds (Nones
        without one), after checking the chunk fits it."""
        if kv_cache is None:
            return (None, None, None), None
        if not isinstance(kv_cache, StateCache):
            raise TypeError(
                "kv_cache must be an attn_np.StateCache (from "
                f"layer.new_cache()), got {type(kv_cache).__name__}"
            )
        B = x3.shape[0]
        n_k, n_v, d_k, d_v = (
            self.n_k_heads,
            self.n_v_heads,
            self.d_k,
            self.d_v,
        )
        K1 = self.conv_size - 1
        kv_cache.check_chunk(
            x3.shape,
            batch=B,
            n_v_heads=n_v,
            d_k=d_k,
            d_v=d_v,
            conv_shapes=[
                (B, K1, n_k * d_k),
                (B, K1, n_k * d_k),
                (B, K1, n_v * d_v),
            ],
            dtype=np.result_type(x3.dtype, self.params["W_q"].dtype),
        )
        kv_cache.check_owner(self)
        if kv_cache.state is None:
            return (None, None, None), None
        # [B, n_v, d_k, d_v] -> [B, n_k, G, d_k, d_v]
        S0 = kv_cache.state.reshape(B, n_k, self.group_size, d_k, d_v)
        return kv_cache.conv, S0

    def _convolve(self, h_all, prev, B, L):
        """One short causal convolution over the q | k | v channels, then
        SiLU: ``(qkv [B, L, n_qkv], saved)``."""
        P, n_k, n_v = self.params, self.n_k_heads, self.n_v_heads
        n_qkv = 2 * n_k * self.d_k + n_v * self.d_v
        w_conv = np.concatenate(
            [P["conv_q"], P["conv_k"], P["conv_v"]], axis=1
        )  # [K, n_qkv]
        prev = None if prev[0] is None else np.concatenate(prev, axis=2)
        return causal_conv_forward(
            h_all[:, :n_qkv].reshape(B, L, n_qkv), w_conv, prev
        )

    def _heads(self, qkv, B, L):
        """q and k on the unit sphere, q scaled by ``1/sqrt(d_k)``, laid
        out per value head: ``(q, k [B, n_k, G, L, d_k], v [B, n_k, G,
        L, d_v], saved)``; value head ``j = h G + i`` reads key head
        ``h`` (q and k broadcast over G; views: the kernel lays them
        out once)."""
        n_k, G, d_k, d_v = (
            self.n_k_heads,
            self.group_size,
            self.d_k,
            self.d_v,
        )
        n_q = n_k * d_k
        q, cqn = l2norm_forward(qkv[..., :n_q].reshape(B, L, n_k, d_k))
        k, ckn = l2norm_forward(
            qkv[..., n_q : 2 * n_q].reshape(B, L, n_k, d_k)
        )
        q = q * (1.0 / math.sqrt(d_k))  # a Python float keeps the dtype
        # [B, L, n_k, d] -> [B, n_k, G, L, d]
        v = qkv[..., 2 * n_q :].reshape(B, L, n_k, G, d_v)
        v = v.transpose(0, 2, 3, 1, 4)
        qb = np.broadcast_to(
            q.transpose(0, 2, 1, 3)[:, :, None], (B, n_k, G, L, d_k)
        )
        kb = np.broadcast_to(
            k.transpose(0, 2, 1, 3)[:, :, None], (B, n_k, G, L, d_k)
        )
        return qb, kb, v, (cqn, ckn)

    def _delta_rule(self, q, k, v, g, beta, S0):
        """The kernel of :data:`KERNELS` on the gates laid out per value
        head: ``(o [B, n_k, G, L, d_v], kernel name, its cache)``; one
        token takes the recurrent form."""
        n_k, G, L = self.n_k_heads, self.group_size, q.shape[3]
        g = _gate_heads(g, n_k, G)  # -> [B, n_k, G, L (, d_k)]
        beta = _gate_heads(beta, n_k, G)
        use = "recurrent" if L == 1 else self.mode
        # a sequence shorter than a chunk is one chunk of its own length
        C = min(self.chunk_size, L)
        kw = {"chunk_size": C} if use == "chunked" else {}
        o, ckern = KERNELS[use][0](q, k, v, g, beta, S0, **kw)
        return o, use, ckern

    def _output(self, o, h, B, L):
        """``RMSNorm(o) * silu(x W_z)`` per value head, then ``W_o``:
        ``(out [B, L, d_model], on, norm cache, z, gate cache, y)``."""
        P, n_v, d_v = self.params, self.n_v_heads, self.d_v
        # [B, n_k, G, L, d_v] -> [B, L, n_v, d_v], contiguous
        o = np.ascontiguousarray(
            o.reshape(B, n_v, L, d_v).transpose(0, 2, 1, 3)
        )
        on, cnorm = rmsnorm_forward(o, P["norm"], eps=self.eps)
        z, cz = self._output_gate_forward(h, B, L)  # [B*L, n_v*d_v]
        y = on.reshape(B * L, n_v * d_v) * z
        # [B*L, n_v*d_v] @ [n_v*d_v, d_model] -> [B, L, d_model]
        out = (y @ P["W_o"]).reshape(B, L, self.d_model)
        return out, on, cnorm, z, cz, y

    def _cache_end(self, kv_cache, cconv, ckern, L):
        """The state after the chunk and the convolution's last ``K - 1``
        inputs go to the cache."""
        B, n_q = cconv[0].shape[0], self.n_k_heads * self.d_k
        xp = cconv[0]  # [B, K-1+L, n_qkv]: [prev, x] of the conv
        tail = xp[:, xp.shape[1] - (self.conv_size - 1) :]
        kv_cache.update(
            ckern.final_state.reshape(B, self.n_v_heads, self.d_k, self.d_v),
            np.split(tail, [n_q, 2 * n_q], axis=2),
            L,
        )

    def gates(self, x):
        """``(g, beta)`` the layer computes from ``x [B, L, d_model]``:
        ``g [B, L, n_v (, d_k)]`` (the log decays) and ``beta [B, L,
        n_v]``, to look at."""
        x = as_float_array(x, "x")
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape [B, L, d_model] with d_model="
                f"{self.d_model}, got {x.shape}"
            )
        B, L, _ = x.shape
        W_in, names, cuts = self._in_projection()
        h_all = x.reshape(B * L, self.d_model) @ W_in
        h = dict(zip(names, np.split(h_all, cuts, axis=1)))
        g, beta, _ = self._gates_forward(h, B, L)
        return g, beta * self._beta_scale

    def _in_projection(self):
        """``(W_in [d_model, ch_all], names, cuts)``: the projections of
        ``x`` side by side, q, k, v first (the convolution's channels);
        ``cuts`` are the column offsets where one ends."""
        names = self._x_projections()
        Ws = [self.params[n] for n in names]
        cuts = np.cumsum([W.shape[1] for W in Ws])[:-1]
        return np.concatenate(Ws, axis=1), names, cuts

    # ------------------------------------------------------------------
    # backward
    def backward(self, dy):
        """Gradient with respect to ``x``; fills ``self.grads``."""
        c = self._cache
        if c is None:
            raise RuntimeError(
                "backward needs a preceding forward without kv_cache "
                "(decoding with a cache is inference only)"
            )
        B, L, unbatched = c["shape"]
        want = (L, self.d_model) if unbatched else (B, L, self.d_model)
        dy = check_upstream(dy, "dy", want, "the layer's output")
        n_k, n_v, G = self.n_k_heads, self.n_v_heads, self.group_size
        d_k, d_v = self.d_k, self.d_v
        n_q, n_qkv = n_k * d_k, 2 * n_k * d_k + n_v * d_v
        P, grads, xf, W_in = self.params, self.grads, c["xf"], c["W_in"]
        names = self._x_projections()
        # the gradient of every projection of x, side by side
        dh_all = np.empty((B * L, W_in.shape[1]), dtype=c["y"].dtype)
        cuts = np.cumsum([P[n].shape[1] for n in names])[:-1]
        dh = dict(zip(names, np.split(dh_all, cuts, axis=1)))
        dyf = dy.reshape(B * L, self.d_model)
        # 6. output
        grads["W_o"] = c["y"].T @ dyf  # [n_v*d_v, B*L] @ [B*L, d_model]
        dyv = dyf @ P["W_o"].T  # [B*L, n_v*d_v]
        self._output_gate_backward(
            dyv * c["on"].reshape(dyv.shape), c["out_gate"], dh
        )
        dyv *= c["z"]
        do, grads["norm"] = rmsnorm_backward(
            dyv.reshape(B, L, n_v, d_v), c["norm"]
        )
        # [B, L, n_v, d_v] -> [B, n_k, G, L, d_v] (a view)
        do = do.reshape(B, L, n_k, G, d_v).transpose(0, 2, 3, 1, 4)
        # 5. the kernel
        use, ckern = c["kernel"]
        dq, dk, dv, dg, dbeta, _ = KERNELS[use][1](do, ckern)
        # 4. gates: back to [B, L, n_v (, d_k)]; write into dh (the
        # doubled beta's gradient doubles too)
        self._gates_backward(
            _gate_heads_back(dg, B, L),
            _gate_heads_back(dbeta * self._beta_scale, B, L),
            c["gate"],
            dh,
        )
        # 3. heads: sum the broadcast over each key head's G value heads,
        # [B, n_k, L, d_k] -> [B, L, n_k, d_k]
        dq = dq.sum(axis=2).transpose(0, 2, 1, 3) * (1.0 / math.sqrt(d_k))
        dk = dk.sum(axis=2).transpose(0, 2, 1, 3)
        dqkv = np.empty((B, L, n_qkv), dtype=dh_all.dtype)
        dqkv[..., :n_q] = l2norm_backward(dq, c["norms"][0]).reshape(
            B, L, n_q
        )
        dqkv[..., n_q : 2 * n_q] = l2norm_backward(
            dk, c["norms"][1]
        ).reshape(B, L, n_q)
        # [B, n_k, G, L, d_v] -> [B, L, n_k, G, d_v]
        dvv = dqkv[..., 2 * n_q :].reshape(B, L, n_k, G, d_v)  # a view
        dvv[...] = dv.transpose(0, 3, 1, 2, 4)
        # 2. the convolution, 1. the one in-projection
        d0, dw = causal_conv_backward(dqkv, c["conv"])
        dh_all[:, :n_qkv] = d0.reshape(B * L, n_qkv)
        grads["conv_q"], grads["conv_k"], grads["conv_v"] = np.split(
            dw, [n_q, 2 * n_q], axis=1
        )
        # [d_model, B*L] @ [B*L, ch_all] -> [d_model, ch_all]
        dW_in = xf.T @ dh_all
        for n, dW in zip(names, np.split(dW_in, cuts, axis=1)):
            grads[n] = dW
        dx = (dh_all @ W_in.T).reshape(B, L, self.d_model)
        return dx[0] if unbatched else dx

    # ------------------------------------------------------------------
    # the hooks a variant overrides: which projections of x it has, and
    # its two gates (KimiDeltaAttention overrides them). ``h`` maps each
    # name of _x_projections to its product with x, [B*L, ·]; a
    # backward writes the gradient of each into ``dh`` (same names)
    def _x_projections(self) -> tuple:
        return ("W_q", "W_k", "W_v", "W_z", "W_a", "W_b")

    def _gates_forward(self, h, B, L):
        """``g = -exp(A_log) softplus(x W_a + dt_bias)``, ``beta =
        sigmoid(x W_b)``: ``[B, L, n_v]`` each."""
        P = self.params
        pre = h["W_a"] + P["dt_bias"]  # [B*L, n_v]
        g = -np.exp(P["A_log"]) * softplus(pre)
        beta = sigmoid(h["W_b"])  # [B*L, n_v]
        shape = (B, L, self.n_v_heads)
        return g.reshape(shape), beta.reshape(shape), (pre, g, beta)

    def _gates_backward(self, dg, dbeta, saved, dh):
        """Fills the gates' grads; writes ``d(x W_a)`` and ``d(x W_b)``."""
        pre, g, beta = saved
        P, grads = self.params, self.grads
        dg, dbeta = dg.reshape(g.shape), dbeta.reshape(beta.shape)
        grads["A_log"] = np.sum(dg * g, axis=0)  # d(-e^A s)/dA = g
        dpre = dg * -np.exp(P["A_log"]) * sigmoid(pre)  # softplus' = sig
        grads["dt_bias"] = dpre.sum(axis=0)
        dh["W_a"][...] = dpre
        dh["W_b"][...] = dbeta * beta * (1.0 - beta)

    def _output_gate_forward(self, h, B, L):
        """``silu(x W_z)``: ``[B*L, n_v*d_v]``."""
        zp = h["W_z"]
        return silu(zp), zp

    def _output_gate_backward(self, dz, zp, dh):
        dh["W_z"][...] = silu_backward(dz, zp)


class KimiDeltaAttention(GatedDeltaNet):
    """Kimi Delta Attention (Kimi Team 2025; FLA's ``KimiDeltaAttention``):
    the same layer with a decay per key channel and low-rank gates.

    ``g = -exp(A_log) softplus(x W_f1 W_f2 + dt_bias)``, ``[B, L, n_v,
    d_k]`` (``W_f1 [d_model, d_v]``, ``W_f2 [d_v, n_v d_k]``, ``dt_bias
    [n_v d_k]``), so the state decays as ``Diag(alpha_t) S``; the output
    gate is ``sigmoid(x W_g1 W_g2 + b_g)`` (``W_g1 [d_model, d_v]``,
    ``W_g2 [d_v, n_v d_v]``) in place of ``silu(x W_z)``. Everything else
    (convolutions, L2 norms, ``beta``, the kernels) is Gated DeltaNet's.
    ``gate_bias=False`` drops ``b_g``: Hugging Face's
    ``KimiLinearDeltaAttention`` has ``sigmoid(x W_g1 W_g2)``.
    """

    def __init__(self, *args, eps=1e-5, gate_bias=True, **kwargs):
        self.gate_bias = check_flag(gate_bias, "gate_bias")
        super().__init__(*args, eps=eps, **kwargs)

    def _projection_shapes(self) -> dict:
        d, n_k, n_v = self.d_model, self.n_k_heads, self.n_v_heads
        return {
            "W_q": (d, n_k * self.d_k),
            "W_k": (d, n_k * self.d_k),
            "W_v": (d, n_v * self.d_v),
            "W_b": (d, n_v),
            "W_f1": (d, self.d_v),
            "W_f2": (self.d_v, n_v * self.d_k),
            "W_g1": (d, self.d_v),
            "W_g2": (self.d_v, n_v * self.d_v),
        }

    def _x_projections(self) -> tuple:
        return ("W_q", "W_k", "W_v", "W_b", "W_f1", "W_g1")

    def _gate_params(self, rng) -> dict:
        n, nk = self.n_v_heads, self.n_v_heads * self.d_k
        A = rng.uniform(1, 16, n)
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), nk))
        return {
            "A_log": np.log(A).astype(self.dtype),
            "dt_bias": (dt + np.log(-np.expm1(-dt))).astype(self.dtype),
        } | (
            {"b_g": np.zeros(n * self.d_v, dtype=self.dtype)}
            if self.gate_bias
            else {}
        )

    def _gates_forward(self, h, B, L):
        P, n_v, d_k = self.params, self.n_v_heads, self.d_k
        h1 = h["W_f1"]  # [B*L, d_v]: the low rank
        pre = (h1 @ P["W_f2"] + P["dt_bias"]).reshape(-1, n_v, d_k)
        A = np.exp(P["A_log"])[:, None]  # [n_v, 1]: per head
        g = -A * softplus(pre)  # [B*L, n_v, d_k]
        beta = sigmoid(h["W_b"])
        return (
            g.reshape(B, L, n_v, d_k),
            beta.reshape(B, L, n_v),
            (h1, pre, g, beta),
        )

    def _gates_backward(self, dg, dbeta, saved, dh):
        h1, pre, g, beta = saved
        P, grads = self.params, self.grads
        dg, dbeta = dg.reshape(g.shape), dbeta.reshape(beta.shape)
        grads["A_log"] = np.sum(dg * g, axis=(0, 2))
        A = np.exp(P["A_log"])[:, None]
        dpre = (dg * -A * sigmoid(pre)).reshape(h1.shape[0], -1)
        grads["dt_bias"] = dpre.sum(axis=0)
        grads["W_f2"] = h1.T @ dpre
        dh["W_f1"][...] = dpre @ P["W_f2"].T  # [B*L, d_v]
        dh["W_b"][...] = dbeta * beta * (1.0 - beta)

    def _output_gate_forward(self, h, B, L):
        P = self.params
        h1 = h["W_g1"]  # [B*L, d_v]
        pre = h1 @ P["W_g2"]  # [B*L, d_v] @ [d_v, n_v*d_v]
        if self.gate_bias:
            pre += P["b_g"]
        s = sigmoid(pre)  # [B*L, n_v*d_v]
        return s, (h1, s)

    def _output_gate_backward(self, dz, saved, dh):
        h1, s = saved
        P, grads = self.params, self.grads
        dpre = dz * s * (1.0 - s)
        if self.gate_bias:
            grads["b_g"] = dpre.sum(axis=0)
        grads["W_g2"] = h1.T @ dpre
        dh["W_g1"][...] = dpre @ P["W_g2"].T


def transformer_layer(d_model, n_heads, n_kv_heads, **settings):
    """A ``"linear"`` layer of chapter 5's
    :class:`~attn_np.Transformer`: a :class:`GatedDeltaNet` with
    ``n_heads`` value heads and ``n_kv_heads`` key heads, and the
    model's ``linear_options``."""
    return GatedDeltaNet(
        d_model,
        n_heads,
        n_kv_heads,
        d_k=settings["d_k"],
        d_v=settings["d_v"],
        seed=settings["seed"],
        dtype=settings["dtype"],
        **(settings.get("linear_options") or {}),
    )


register_layer_kind("linear", transformer_layer)


def _gate_heads(t, n_k, G):
    """``[B, L, n_v (, d_k)] -> [B, n_k, G, L (, d_k)]``."""
    B, L = t.shape[:2]
    t = np.moveaxis(t, 2, 1)  # [B, n_v, L (, d_k)]
    return t.reshape(B, n_k, G, L, *t.shape[3:])


def _gate_heads_back(t, B, L):
    """``[B, n_k, G, L (, d_k)] -> [B, L, n_v (, d_k)]``."""
    t = t.reshape(B, -1, L, *t.shape[4:])
    return np.moveaxis(t, 1, 2)
