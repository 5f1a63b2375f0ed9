"""Long context: RoPE scaling, NoPE layers, chunked attention (chapter 11).

Plain RoPE (chapter 6) turns pair ``i`` by ``theta_i = base^(-2i/r)``
radians per position. Past the trained context ``L`` the slow pairs reach
angles never seen in training. Every method here changes ``theta`` (and
sometimes the softmax temperature) as a function of the model's config,
spelled as Hugging Face spells ``rope_scaling``::

    linear (PI)  theta_i / s                     Chen et al. 2023
    ntk          base' = base s^(r/(r-2))        bloc97 2023
    dynamic      ntk with s' = s n/L - (s - 1)   emozilla 2023, n > L
    llama3       keep fast, divide slow by s,    Llama 3.1
                 smooth the band between
    yarn         ramp between the two by pair,   Peng et al. 2023
                 temperature 0.1 ln s + 1

``scaled_frequencies`` returns ``(theta [r/2], attention_factor)``: the
factor multiplies the cosines and sines (HF's ``attention_scaling``,
gpt-oss's ``concentration``), so the scores of the rotated features grow
by its square. DeepSeek-V3 puts its YaRN temperature into the softmax
scale instead (``softmax_scale``).

Llama 4's iRoPE: every ``nope_layer_interval``-th layer has no rotation
(NoPE) and attends over the whole prefix; the others rotate, normalise
``q`` and ``k`` with a parameter-free RMS norm (``qk_norm_forward``) and
attend within chunks of ``C`` positions (``chunked_mask``). At inference
the NoPE layers scale their queries by ``1 + a ln(floor((p+1)/f) + 1)``
(``query_temperature_forward``).

The rotation's backward is chapter 6's (``rope_backward``: the tables
carry the attention factor, and ``(m R)^T = m R^T``); the temperature and
the norm have their own backward here; the chunked mask enters the
backward as any mask does (through ``P``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import (
    as_bool_array,
    as_float_array,
    check_flag,
    check_positive_int,
    check_positive_number,
    check_upstream,
)
from .attention import position_mask
from .kv_cache import KVCache
from .multihead import GroupedQueryAttention
from .rope import (
    RopeCache,
    Rotary,
    rope_backward,
    rope_frequencies,
    rotate_pairs,
)
from .training.layers import rmsnorm_backward, rmsnorm_forward

ROPE_TYPES = ("default", "linear", "ntk", "dynamic", "yarn", "llama3")

# the keys each type needs (beyond rope_type); "ntk" is bloc97's static
# NTK-aware rule, which transformers has no rope_type for
_REQUIRED = {
    "default": (),
    "linear": ("factor",),
    "ntk": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "llama3": (
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ),
}
_OPTIONAL = {
    "dynamic": ("original_max_position_embeddings",),
    "yarn": (
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
        "attention_factor",
    ),
}
# keys a config may carry beside the scaling (transformers 5 puts the base
# inside rope_parameters)
_PASSIVE = ("rope_theta", "partial_rotary_factor")


def read_rope_scaling(rope_scaling, *, max_position_embeddings=None):
    """A ``rope_scaling`` (or ``rope_parameters``) dict, checked.

    Returns a new dict with ``"rope_type"`` and every key the type uses
    (defaults filled in as transformers fills them). ``None`` is
    ``{"rope_type": "default"}``. The type is read from ``rope_type`` or
    the older ``type``. A YaRN dict without ``factor`` takes
    ``max_position_embeddings / original_max_position_embeddings`` (HF's
    rule for DeepSeek); a dynamic one without
    ``original_max_position_embeddings`` takes ``max_position_embeddings``.
    An unknown type, a missing key or a key the type does not use is a
    ``ValueError`` that names it.
    """
    if rope_scaling is None:
        return {"rope_type": "default"}
    if not isinstance(rope_scaling, dict):
        raise TypeError(
            "rope_scaling must be a dict in Hugging Face's spelling (or "
            f"None), got {type(rope_scaling).__name__}"
        )
    s = dict(rope_scaling)
    kind = s.pop("rope_type", None)
    old = s.pop("type", None)
    if kind is None:
        kind = old
    if kind is None:
        raise ValueError(
            "rope_scaling must name its type under 'rope_type' (or "
            f"'type'), got keys {sorted(rope_scaling)}"
        )
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"rope_scaling rope_type must be one of {ROPE_TYPES}, got "
            f"{kind!r}"
        )
    for key in _PASSIVE:
        s.pop(key, None)
    mpe = max_position_embeddings
    if kind == "yarn" and s.get("factor") is None:
        orig = s.get("original_max_position_embeddings")
        if mpe is not None and orig is not None:
            s["factor"] = mpe / orig
    if kind == "dynamic" and "original_max_position_embeddings" not in s:
        if mpe is not None:
            s["original_max_position_embeddings"] = mpe
        else:
            raise ValueError(
                "rope_scaling of rope_type 'dynamic' needs "
                "'original_max_position_embeddings' (or pass "
                "max_position_embeddings=): the length it was trained at"
            )
    allowed = set(_REQUIRED[kind]) | set(_OPTIONAL.get(kind, ()))
    for key in s:
        if key not in allowed:
            raise ValueError(
                f"rope_scaling key {key!r} is not used by rope_type "
                f"{kind!r} (it uses {sorted(allowed)})"
            )
    for key in _REQUIRED[kind]:
        if s.get(key) is None:
            raise ValueError(
                f"rope_scaling of rope_type {kind!r} needs the key {key!r}"
            )
    out = {"rope_type": kind}
    for key, value in s.items():
        if key == "truncate":
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(
                    f"rope_scaling truncate must be True or False, got "
                    f"{value!r}"
                )
            out[key] = bool(value)
        elif value is None:
            continue
        else:
            out[key] = check_positive_number(value, f"rope_scaling {key}")
    if kind == "llama3" and out["high_freq_factor"] < out["low_freq_factor"]:
        raise ValueError(
            "rope_scaling high_freq_factor must be at least "
            f"low_freq_factor, got {out['high_freq_factor']} < "
            f"{out['low_freq_factor']}"
        )
    if kind == "yarn":  # HF: `get("beta_fast") or 32`
        out.setdefault("beta_fast", 32.0)
        out.setdefault("beta_slow", 1.0)
        out.setdefault("truncate", True)
    return out


def rope_settings_from_config(config: dict, *, layer_type=None):
    """``(base, rope_scaling)`` from a Hugging Face ``config.json`` dict.

    Reads transformers 4's ``rope_theta`` and ``rope_scaling`` and
    transformers 5's ``rope_parameters`` (the base inside it, and one
    dict per ``layer_type`` for models such as Gemma 3).
    """
    if not isinstance(config, dict):
        raise TypeError(
            f"config must be a dict, got {type(config).__name__}"
        )
    params = config.get("rope_parameters")
    if params is not None and all(
        isinstance(v, dict) for v in params.values()
    ):
        if layer_type not in params:
            raise ValueError(
                "config rope_parameters has one dict per layer type "
                f"{sorted(params)}: pass layer_type=, got {layer_type!r}"
            )
        params = params[layer_type]
    scaling = params if params is not None else config.get("rope_scaling")
    base = config.get("rope_theta")
    if base is None and params is not None:
        base = params.get("rope_theta")
    if base is None:
        raise ValueError(
            "config has no rope_theta (nor rope_parameters['rope_theta'])"
        )
    return float(base), read_rope_scaling(
        scaling,
        max_position_embeddings=config.get("max_position_embeddings"),
    )


def yarn_mscale(scale, mscale=1.0) -> float:
    """YaRN's temperature ``0.1 mscale ln(s) + 1`` (1 for ``s <= 1``)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_range(
    rotary_dim, base, beta_fast, beta_slow, original_max, truncate=True
):
    """The pairs ``(low, high)`` where YaRN's ramp starts and ends.

    Pair ``i`` turns ``L theta_i / (2 pi)`` times over the trained length
    ``L``; the pair that turns ``beta`` times is
    ``r ln(L / (2 pi beta)) / (2 ln base)``. Pairs below ``low`` (more than
    ``beta_fast`` turns) keep their frequency, pairs from ``high`` on (fewer
    than ``beta_slow``) are divided by the factor. ``truncate`` rounds
    ``low`` down and ``high`` up (DeepSeek, HF's default); gpt-oss keeps
    them unrounded (``truncate: false``). Clamped to ``[0, r - 1]`` as HF
    does.
    """

    def pair(turns):
        return (
            rotary_dim
            * math.log(original_max / (turns * 2 * math.pi))
            / (2 * math.log(base))
        )

    rotary_dim = check_positive_int(rotary_dim, "rotary_dim")
    base = check_positive_number(base, "base")
    original_max = check_positive_number(original_max, "original_max")
    beta_fast = check_positive_number(beta_fast, "beta_fast")
    beta_slow = check_positive_number(beta_slow, "beta_slow")
    if base == 1.0:
        raise ValueError("base must differ from 1 (ln base divides)")
    if beta_fast < beta_slow:
        raise ValueError(
            "beta_fast (turns of the last kept pair) must be at least "
            f"beta_slow (of the first divided pair), got {beta_fast} < "
            f"{beta_slow}: the ramp would run backwards"
        )
    low, high = pair(beta_fast), pair(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, rotary_dim - 1)


def scaled_frequencies(
    rotary_dim,
    *,
    base=10000.0,
    rope_scaling=None,
    seq_len=None,
    max_position_embeddings=None,
):
    """``(theta [r/2], attention_factor)`` for a ``rope_scaling`` dict.

    The frequencies and the factor on cos/sin that transformers'
    ``ROPE_INIT_FUNCTIONS`` compute for the same config, in float64.
    ``seq_len`` is the current length (only ``dynamic`` reads it: below
    the trained length it is plain RoPE).
    """
    s = read_rope_scaling(
        rope_scaling, max_position_embeddings=max_position_embeddings
    )
    theta = rope_frequencies(rotary_dim, base=base)  # [r/2]
    r = 2 * len(theta)
    kind = s["rope_type"]
    if kind == "default":
        return theta, 1.0
    factor = s["factor"]
    if kind == "linear":  # positions p -> p / s
        return theta / factor, 1.0
    if kind in ("ntk", "dynamic"):
        if kind == "dynamic":
            L = s["original_max_position_embeddings"]
            n = L  # the current length, plain RoPE up to L
            if seq_len is not None:
                n = max(check_positive_int(seq_len, "seq_len"), L)
            factor = factor * n / L - (factor - 1)
        if r == 2:
            raise ValueError(
                "rotary_dim must be at least 4 for NTK scaling (the base "
                "is raised to r / (r - 2)), got 2"
            )
        new_base = base * factor ** (r / (r - 2))
        return rope_frequencies(r, base=new_base), 1.0
    if kind == "llama3":
        return llama3_frequencies(theta, s), 1.0
    return yarn_frequencies(theta, base, s)


def llama3_frequencies(theta, s):
    """Llama 3.1's rule on the plain ``theta [r/2]``, for ``s`` a dict
    checked by :func:`read_rope_scaling` (HF's
    ``_compute_llama3_parameters``, Meta's ``apply_scaling``)."""
    factor, L = s["factor"], s["original_max_position_embeddings"]
    lo, hi = s["low_freq_factor"], s["high_freq_factor"]
    wavelen = 2 * math.pi / theta  # [r/2] positions per turn
    out = np.where(wavelen > L / lo, theta / factor, theta)  # divide slow
    medium = (wavelen >= L / hi) & (wavelen <= L / lo)
    if hi > lo and medium.any():  # hi == lo (Scout): no band
        smooth = (L / wavelen[medium] - lo) / (hi - lo)  # 0 ... 1
        t = out[medium]
        out[medium] = (1 - smooth) * t / factor + smooth * t
    return out


def yarn_frequencies(theta, base, s):
    """YaRN on the plain ``theta [r/2]``: ``(theta', attention_factor)``
    for ``s`` a dict checked by :func:`read_rope_scaling` (HF's
    ``_compute_yarn_parameters``, transformers 5)."""
    factor, L = s["factor"], s["original_max_position_embeddings"]
    r = 2 * len(theta)
    attention = s.get("attention_factor")
    if attention is None:
        if s.get("mscale") and s.get("mscale_all_dim"):
            attention = yarn_mscale(factor, s["mscale"]) / yarn_mscale(
                factor, s["mscale_all_dim"]
            )
        else:
            attention = yarn_mscale(factor)
    low, high = yarn_correction_range(
        r, base, s["beta_fast"], s["beta_slow"], L, s["truncate"]
    )
    if low == high:
        high += 0.001  # HF and DeepSeek: avoid 0 / 0
    i = np.arange(len(theta))  # [r/2]
    ramp = np.clip((i - low) / (high - low), 0.0, 1.0)  # 0 fast, 1 slow
    out = theta / factor * ramp + theta * (1 - ramp)
    return out, float(attention)


def frequency_bands(theta, scaled, factor, *, rtol=1e-12):
    """Count the pairs a scaling kept, divided by ``factor`` or smoothed.

    ``{"kept": n, "divided": n, "smoothed": n}`` from the ratio
    ``scaled / theta`` (1, ``1/factor`` or in between).
    """
    theta = as_float_array(theta, "theta", min_ndim=1)
    scaled = as_float_array(scaled, "scaled", min_ndim=1)
    if scaled.shape != theta.shape:
        raise ValueError(
            "scaled must have the shape of theta [r/2], got "
            f"{scaled.shape} and {theta.shape}"
        )
    factor = check_positive_number(factor, "factor")
    ratio = scaled / theta
    kept = np.isclose(ratio, 1.0, rtol=rtol, atol=0)
    divided = np.isclose(ratio, 1.0 / factor, rtol=rtol, atol=0) & ~kept
    return {
        "kept": int(kept.sum()),
        "divided": int(divided.sum()),
        "smoothed": int((~kept & ~divided).sum()),
    }


def softmax_scale(d_qk, rope_scaling=None) -> float:
    """The softmax scale of a model: ``1/sqrt(d_qk)``, times
    ``mscale(s, mscale_all_dim)^2`` when the YaRN dict carries
    ``mscale_all_dim`` (DeepSeek-V2/V3: HF's ``softmax_scale``, the
    reference's ``mscale * mscale``)."""
    d_qk = check_positive_int(d_qk, "d_qk")
    scale = d_qk**-0.5
    if rope_scaling is None:
        return scale
    s = read_rope_scaling(rope_scaling)
    if s["rope_type"] == "yarn" and s.get("mscale_all_dim"):
        m = yarn_mscale(s["factor"], s["mscale_all_dim"])
        scale *= m * m
    return scale


def scaled_rope_forward(
    x,
    positions,
    *,
    base=10000.0,
    rope_scaling=None,
    layout="half",
    rotary_dim=None,
    max_position_embeddings=None,
):
    """Chapter 6's rotation with scaled frequencies; ``(y, RopeCache)``.

    ``x`` is ``[..., L, d]``, ``positions`` ``[L]``. The tables carry the
    attention factor ``m``: ``y = m R(p theta) x`` on the rotated
    features, the rest pass through. ``rope_backward`` is the backward
    (``(m R)^T = m R^T``). A dynamic scaling reads the current length as
    ``max(positions) + 1``.
    """
    x = as_float_array(x, "x", min_ndim=2)
    d = x.shape[-1]
    r = d if rotary_dim is None else rotary_dim
    p = np.asarray(positions)
    if p.shape != (x.shape[-2],) or not np.issubdtype(p.dtype, np.integer):
        raise ValueError(
            f"positions must be an integer array of shape ({x.shape[-2]},) "
            f"to match x {x.shape}, got {p.dtype} {p.shape}"
        )
    theta, m = scaled_frequencies(
        r,
        base=base,
        rope_scaling=rope_scaling,
        seq_len=int(p.max()) + 1,
        max_position_embeddings=max_position_embeddings,
    )
    angles = p[:, None] * theta[None, :]  # [L, 1] * [1, r/2] -> [L, r/2]
    cos = (m * np.cos(angles)).astype(x.dtype)  # [L, r/2]
    sin = (m * np.sin(angles)).astype(x.dtype)
    y = rotate_pairs(x, cos, sin, layout=layout)  # [..., L, d]
    return y, RopeCache(cos, sin, layout, r, x.shape)


# ------------------------------------------------------------------ masks
def chunked_mask(q_positions, k_positions, chunk):
    """``[L_q, L_k]`` bool: query ``i`` sees key ``j`` iff ``j <= i`` and
    both lie in the same chunk, ``floor(i/C) == floor(j/C)``.

    Llama 4's local attention (``attention_chunk_size``). Not a sliding
    window: the first query of a chunk sees only itself, the last sees
    ``C`` keys, and no query sees across a chunk boundary.
    """
    chunk = check_positive_int(chunk, "chunk")
    qp, kp = np.asarray(q_positions), np.asarray(k_positions)
    same = (qp[:, None] // chunk) == (kp[None, :] // chunk)  # [L_q, L_k]
    return position_mask(qp, kp) & same


# ----------------------------------------------------- Llama 4's pieces
@dataclass
class TemperatureCache:
    scale: np.ndarray  # [L, 1]: the factor on each query row


def query_temperature(positions, *, floor_scale=8192.0, attn_scale=0.1):
    """Llama 4's inference-time temperature for NoPE layers, ``[L]``:
    ``1 + attn_scale ln(floor((p + 1) / floor_scale) + 1)``. It is 1 for
    the first ``floor_scale - 1`` positions."""
    floor_scale = check_positive_number(floor_scale, "floor_scale")
    attn_scale = float(attn_scale)
    p = np.asarray(positions)
    if (
        p.ndim != 1
        or p.dtype == np.bool_
        or not np.issubdtype(p.dtype, np.integer)
        or (p.size and p.min() < 0)
    ):
        raise ValueError(
            "positions must be a 1-D array of non-negative integer "
            f"positions, got {p.dtype} of shape {p.shape}"
            + (f" with minimum {p.min()}" if p.size and p.ndim else "")
        )
    p = p.astype(np.float64)
    return 1.0 + attn_scale * np.log(np.floor((p + 1.0) / floor_scale) + 1.0)


def query_temperature_forward(
    q, positions, *, floor_scale=8192.0, attn_scale=0.1
):
    """``q [..., L, d]`` times the temperature of each row's position;
    ``(q2, cache)``."""
    q = as_float_array(q, "q", min_ndim=2)
    t = query_temperature(
        positions, floor_scale=floor_scale, attn_scale=attn_scale
    )
    if t.shape != (q.shape[-2],):
        raise ValueError(
            f"positions must have shape ({q.shape[-2]},) to match q "
            f"{q.shape}, got {np.shape(positions)}"
        )
    scale = t[:, None].astype(q.dtype)  # [L, 1]
    return q * scale, TemperatureCache(scale)  # [..., L, d] * [L, 1]


def query_temperature_backward(dq2, cache: TemperatureCache):
    """``dq = dq2 * t``: a constant per row."""
    return dq2 * cache.scale


def qk_norm_forward(x, *, eps=1e-6):
    """Parameter-free RMS norm over the last axis (Llama 4's
    ``L2Norm``): ``x / sqrt(mean(x^2) + eps)``; ``(y, cache)``."""
    x = as_float_array(x, "x", min_ndim=1)
    return rmsnorm_forward(x, np.ones(x.shape[-1], x.dtype), eps=eps)


def qk_norm_backward(dy, cache):
    """``dx = r (dy - x r^2 mean(dy x))``, RMSNorm's with ``g = 1``."""
    dy = check_upstream(dy, "dy", cache.x.shape, "the normalised x")
    dx, _ = rmsnorm_backward(dy, cache)
    return dx


def rope_layers(n_layers, *, nope_layer_interval=None, no_rope_layers=None):
    """``[n_layers]`` bools, True where a layer rotates (uses RoPE).

    Meta's reference: layer ``l`` is NoPE when ``(l + 1) %
    nope_layer_interval == 0``. HF's ``no_rope_layers[l] == 1`` means
    layer ``l`` *uses* RoPE (the name says the opposite).
    """
    n_layers = check_positive_int(n_layers, "n_layers")
    if (nope_layer_interval is None) == (no_rope_layers is None):
        raise ValueError(
            "pass exactly one of nope_layer_interval (Meta's spelling) and "
            "no_rope_layers (HF's), got "
            f"{nope_layer_interval!r} and {no_rope_layers!r}"
        )
    if no_rope_layers is not None:
        flags = np.asarray(no_rope_layers)
        if flags.shape != (n_layers,) or not np.isin(flags, (0, 1)).all():
            raise ValueError(
                f"no_rope_layers must be {n_layers} zeros and ones (1: the "
                f"layer uses RoPE), got {no_rope_layers!r}"
            )
        return flags.astype(bool)
    k = check_positive_int(nope_layer_interval, "nope_layer_interval")
    return (np.arange(n_layers) + 1) % k != 0


# ------------------------------------------------------------------ cache
class ChunkedKVCache(KVCache):
    """A cache for a chunked layer: it holds only the current chunk.

    Before a chunk of new positions is appended, every position of an
    earlier chunk than the first new one is forgotten: ``floor(n/C) * C``
    on stay (``n = len(cache)``). Decoding one token at a time it holds at
    most ``C`` positions. ``len``, ``nbytes``, ``truncate`` and
    ``check_chunk`` follow the :class:`~attn_np.KVCache` protocol (its
    ``_evict`` and ``_lowest`` hooks are the chunked rule);
    :meth:`attention_mask` is the chunked rule on the held positions.
    """

    def __init__(self, chunk: int, initial_capacity: int = 16, **kw):
        self.chunk = check_positive_int(chunk, "chunk")
        super().__init__(min(initial_capacity, self.chunk), **kw)

    def __repr__(self) -> str:
        return f"ChunkedKVCache(chunk={self.chunk}, {self._describe()})"

    def step(self, q, k, v, rotary=None):
        """:meth:`KVCache.step`, and the absolute positions of the chunk's
        queries and of the keys held (they no longer start at 0)."""
        positions = len(self) + np.arange(k.shape[2])  # the chunk's: [L]
        q, k, v, where = super().step(q, k, v, rotary)
        where.update(q_positions=positions, k_positions=self.positions)
        return q, k, v, where

    def _evict(self) -> None:
        """Keep the positions of the current chunk, ``floor(n/C) * C``
        on, moved to the front of the buffer."""
        keep = self._seen - (self._seen // self.chunk) * self.chunk
        if keep < self._len:
            src = slice(self._len - keep, self._len)
            self._buf[..., :keep] = self._buf[..., src]  # [B, n_kv, d, keep]
            self._len = keep

    def _lowest(self) -> int:
        """It can go back to its oldest position held, no further."""
        return self._seen - self._len

    def attention_mask(self, n_queries: int) -> np.ndarray:
        """``[n_queries, held]``: the chunked rule for the last
        ``n_queries`` positions appended."""
        n_queries = check_positive_int(n_queries, "n_queries")
        if n_queries > self._len:
            raise ValueError(
                f"n_queries must be at most the {self._len} positions "
                f"held, got {n_queries}"
            )
        k_pos = self.positions  # [held]
        return chunked_mask(k_pos[-n_queries:], k_pos, self.chunk)


# ------------------------------------------------------------------ layer
@dataclass(frozen=True)
class ScaledRotary(Rotary):
    """Chapter 6's :class:`~attn_np.rope.Rotary` with chapter 11's
    position step: the rotation by :func:`scaled_frequencies` (and its
    attention factor), then Llama 4's parameter-free QK-norm. The same
    step turns the queries and the keys; ``use_rope=False`` with
    ``qk_norm=True`` only normalises."""

    rope_scaling: dict | None = None
    max_position_embeddings: int | None = None
    use_rope: bool = True
    qk_norm: bool = False
    qk_norm_eps: float = 1e-6

    def forward(self, x, positions):
        """``x [..., L, d]`` at ``positions [L]``: ``(y, saved)``."""
        saved = []
        if self.use_rope:
            x, c = scaled_rope_forward(
                x,
                positions,
                base=self.base,
                rope_scaling=self.rope_scaling,
                layout=self.layout,
                rotary_dim=self.rotary_dim,
                max_position_embeddings=self.max_position_embeddings,
            )
            saved.append(("rope", c))
        if self.qk_norm:
            x, c = qk_norm_forward(x, eps=self.qk_norm_eps)
            saved.append(("norm", c))
        return x, saved

    def backward(self, dy, saved):
        """Each step undone, the last first."""
        for name, c in reversed(saved):
            if name == "rope":
                dy = rope_backward(dy, c)  # m R^T dy
            else:
                dy = qk_norm_backward(dy, c)
        return dy


@dataclass(frozen=True)
class QueryTemperature:
    """Llama 4's query temperature as a score mod: the scores are linear
    in ``q``, so ``tau(p) q`` is ``tau(p)`` times row ``p`` of ``S``
    (:func:`query_temperature_forward` on the rows of ``S``)."""

    floor_scale: float = 8192.0
    attn_scale: float = 0.1

    def forward(self, s, ctx):
        # [B, n_kv, G, L_q, L_k] * [L_q, 1]
        return query_temperature_forward(
            s,
            ctx.q_positions,
            floor_scale=self.floor_scale,
            attn_scale=self.attn_scale,
        )

    def backward(self, ds2, saved):
        return query_temperature_backward(ds2, saved)


class LongContextAttention(GroupedQueryAttention):
    """Grouped-query attention with chapter 11's position step and mask.

    The arguments of :class:`~attn_np.GroupedQueryAttention` (``d_model,
    n_heads, n_kv_heads, d_k, d_v, seed, dtype`` by position, the rest,
    including its ``rope_scaling``, by keyword; ``rope_base`` defaults to
    10000), plus:

    ``use_rope=False``
        a NoPE layer: no rotation (``rope_base`` still names the base
        the model's other layers use).
    ``qk_norm=True``
        Llama 4's parameter-free RMS norm on every query and key head
        after the rotation (``qk_norm_eps``).
    ``temperature_tuning=True``
        Llama 4's query temperature (:func:`query_temperature`, with
        ``floor_scale`` and ``attn_scale``), a score mod.
    ``attention_chunk_size=C``
        chunked attention (:func:`chunked_mask`); decode it with a
        :class:`ChunkedKVCache` of the same chunk.

    Only the position step (the ``rotary`` property, a
    :class:`ScaledRotary`) and the attend step are changed.
    """

    def __init__(
        self,
        *args,
        rope_base=10000.0,
        use_rope=True,
        qk_norm=False,
        qk_norm_eps=1e-6,
        temperature_tuning=False,
        floor_scale=8192.0,
        attn_scale=0.1,
        attention_chunk_size=None,
        **options,
    ):
        if rope_base is None:
            raise ValueError(
                "rope_base must be a number (use use_rope=False for a "
                "NoPE layer), got None"
            )
        if options.get("flash"):
            raise ValueError(
                "flash=True is not supported by LongContextAttention: the "
                "tiled kernels take no chunked mask; use flash=False"
            )
        super().__init__(*args, rope_base=rope_base, **options)
        self.use_rope = check_flag(use_rope, "use_rope")
        self.qk_norm = check_flag(qk_norm, "qk_norm")
        self.qk_norm_eps = check_positive_number(qk_norm_eps, "qk_norm_eps")
        self.temperature_tuning = check_flag(
            temperature_tuning, "temperature_tuning"
        )
        self.floor_scale = check_positive_number(floor_scale, "floor_scale")
        self.attn_scale = float(attn_scale)
        self.attention_chunk_size = (
            None
            if attention_chunk_size is None
            else check_positive_int(
                attention_chunk_size, "attention_chunk_size"
            )
        )
        if self.attention_chunk_size and self.window is not None:
            raise ValueError(
                "a layer is chunked or windowed, not both: got "
                f"attention_chunk_size={attention_chunk_size} and "
                f"window={self.window}"
            )
        self.score_mods = (
            (QueryTemperature(self.floor_scale, self.attn_scale),)
            if self.temperature_tuning
            else ()
        )

    @property
    def rotary(self):
        """The position step: a :class:`ScaledRotary` with this layer's
        settings (None for a NoPE layer without QK-norm)."""
        if not (self.use_rope or self.qk_norm):
            return None
        return ScaledRotary(
            self.rope_base,
            self.rope_layout,
            self.rope_dim,
            rope_scaling=self.rope_scaling,
            use_rope=self.use_rope,
            qk_norm=self.qk_norm,
            qk_norm_eps=self.qk_norm_eps,
        )

    @classmethod
    def from_layer(cls, layer, **options):
        """A view of ``layer`` (a :class:`~attn_np.GroupedQueryAttention`
        with RoPE) with chapter 11's options: it shares ``params`` and
        ``grads`` with ``layer``."""
        if layer.rope_base is None:
            raise ValueError(
                "layer must rotate (rope_base set) to take a rope scaling"
            )
        kw = dict(layer.options, **options)
        new = cls(layer.d_model, layer.n_heads, layer.n_kv_heads, **kw)
        new.params, new.grads = layer.params, layer.grads
        return new

    def attend(self, q, k, v, *, mask=None, **where):
        """The parent's step with the chunked rule (chunked_mask) ANDed
        into the mask and the temperature as a score mod."""
        C = self.attention_chunk_size
        if C is not None:
            if not where.get("causal"):
                raise ValueError(
                    f"a chunked layer (attention_chunk_size={C}) is "
                    "causal: call forward(x, causal=True)"
                )
            L_q, L_k = q.shape[3], k.shape[2]
            kp = where.get("k_positions")
            kp = np.arange(L_k) if kp is None else kp
            qp = where.get("q_positions")
            qp = kp[-1] + 1 - L_q + np.arange(L_q) if qp is None else qp
            c = chunked_mask(qp, kp, C)  # [L_q, L_k]
            mask = c if mask is None else as_bool_array(mask, "mask") & c
        return super().attend(
            q, k, v, mask=mask, score_mods=self.score_mods, **where
        )

    def new_cache(self):
        """An empty cache: a :class:`ChunkedKVCache` of the layer's
        chunk (the parent's for an unchunked layer)."""
        C = self.attention_chunk_size
        return super().new_cache() if C is None else ChunkedKVCache(C)

    def check_cache(self, kv_cache, x3):
        """The parent's checks, and a chunked layer's cache is a
        :class:`ChunkedKVCache` of its chunk."""
        super().check_cache(kv_cache, x3)
        C = self.attention_chunk_size
        if kv_cache is None:
            return
        if getattr(kv_cache, "chunk", None) != C:
            raise ValueError(
                f"a layer with attention_chunk_size={C} decodes with "
                "ChunkedKVCache(chunk=attention_chunk_size) (a plain "
                f"KVCache when None), got {kv_cache!r}"
            )
        if kv_cache.sink_tokens:
            raise ValueError(
                "LongContextAttention does not decode with a StreamingLLM "
                "cache (sink_tokens > 0)"
            )


def with_rope_scaling(model, rope_scaling, **options):
    """A copy of a chapter-5 :class:`~attn_np.Transformer` (``positions=
    "rope"``) whose attention layers use ``rope_scaling``; it shares the
    weights. ``options`` go to :class:`LongContextAttention`. A layer
    without positions (a hybrid's linear layer) is kept as it is."""
    import copy

    if getattr(model, "position_encoding", None) != "rope":
        raise ValueError(
            "model must be a Transformer with positions='rope', got "
            f"{getattr(model, 'position_encoding', type(model).__name__)!r}"
        )
    new = copy.copy(model)
    new.blocks = []
    for blk in model.blocks:
        b = copy.copy(blk)
        if getattr(blk.attn, "rope_base", None) is None:  # no positions
            new.blocks.append(b)
            continue
        b.attn = LongContextAttention.from_layer(
            blk.attn, rope_scaling=rope_scaling, **options
        )
        new.blocks.append(b)
    return new


# ------------------------------------------------------------ experiment
@dataclass(frozen=True)
class Passkey:
    """Find the marked value: a passkey retrieval task of ``length`` tokens.

    Every position holds a random value ``0 ... n_values-1`` except one,
    which holds a *marked* value (``n_values + v``), and the last, a query
    token (``2 n_values``). The target at the query is ``v``. One attention
    layer solves it by content alone, whatever the distance; run at a
    longer ``length`` than it was trained at, a RoPE model meets distances
    and angles it never saw (after the passkey tests of Chen et al. 2023
    and Peng et al. 2023, here with tokens for digits).
    """

    length: int
    n_values: int = 16

    def __post_init__(self):
        check_positive_int(self.n_values, "n_values")
        if check_positive_int(self.length, "length") < 2:
            raise ValueError(
                f"length must be at least 2 (the passkey and the query), "
                f"got {self.length}"
            )

    @property
    def vocab_size(self) -> int:
        return 2 * self.n_values + 1  # values, marked values, the query

    def sample(self, n: int, seed):
        """``n`` sequences from ``np.random.default_rng(seed)``: a
        :class:`~attn_np.training.tasks.RecallBatch`."""
        from .training.tasks import RecallBatch

        n = check_positive_int(n, "n")
        rng = np.random.default_rng(seed)
        V, L = self.n_values, self.length
        inputs = rng.integers(V, size=(n, L))  # [n, L] distractors
        key = rng.integers(V, size=n)  # [n] the passkeys
        where = rng.integers(L - 1, size=n)  # [n] where each sits
        inputs[np.arange(n), where] = V + key
        inputs[:, -1] = 2 * V  # the query
        targets = np.zeros_like(inputs)
        targets[:, -1] = key
        mask = np.zeros(inputs.shape, dtype=bool)
        mask[:, -1] = True
        return RecallBatch(inputs=inputs, targets=targets, mask=mask)
