"""RoPE's scalings (chapter 11), as a position part a layer takes.

Plain RoPE (chapter 6) turns pair ``i`` by ``theta_i = base^(-2i/r)``
radians per position. Past the trained context ``L`` the slow pairs reach
angles never seen in training. Every method here changes ``theta`` (and
sometimes the softmax temperature) as a function of the model's config,
spelled as Hugging Face spells ``rope_scaling`` (one function per
``rope_type``, as transformers' ``ROPE_INIT_FUNCTIONS`` table)::

    linear (PI)  theta_i / s                     Chen et al. 2023
    ntk          base' = base s^(r/(r-2))        bloc97 2023
    dynamic      ntk with s' = s n/L - (s - 1)   emozilla 2023, n > L
    llama3       keep fast, divide slow by s,    Llama 3.1
                 smooth the band between
    yarn         ramp between the two by pair,   Peng et al. 2023
                 temperature 0.1 ln s + 1
    longrope     theta_i / lambda_i, a searched  Ding et al. 2024
                 factor per pair (short or long
                 list by the length), temperature
                 sqrt(1 + ln s / ln L)

``scaled_frequencies`` returns ``(theta [r/2], attention_factor)``: the
factor multiplies the cosines and sines (HF's ``attention_scaling``,
gpt-oss's ``concentration``), so the scores of the rotated features grow
by its square. DeepSeek-V3 puts its YaRN temperature into the softmax
scale instead (``softmax_scale``).

:class:`ScaledRotary` is the position part: chapter 6's
:class:`~attn_np.rope.Rotary` protocol (``forward(t, positions) -> (y,
saved)``, ``backward(dy, saved)``) with the scaled rotation, or none (a
NoPE layer), then Llama 4's parameter-free QK-norm. A layer receives it
(``GroupedQueryAttention(rotary=...)``); chapter 2's layer and chapter 6's
module never import this one. It imports only chapter 6's rotation and
the norms, so chapter 10's layers take it too; chapter 11 explains it.
The rotation's backward is chapter 6's (``rope_backward``: the tables
carry the attention factor, and ``(m R)^T = m R^T``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import (
    as_float_array,
    check_finite,
    check_positive_int,
    check_positive_number,
)
from .norms import qk_norm_backward, qk_norm_forward
from .rope import (
    RopeCache,
    Rotary,
    _check_positions,
    rope_backward,
    rope_frequencies,
    rotate_pairs,
)

ROPE_TYPES = (
    "default",
    "linear",
    "ntk",
    "dynamic",
    "yarn",
    "llama3",
    "longrope",
)

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
    "longrope": (
        "short_factor",
        "long_factor",
        "original_max_position_embeddings",
    ),
}
# LongRoPE's two lists of factors, one per pair (the other keys are numbers)
_LISTS = ("short_factor", "long_factor")
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
    "longrope": ("factor", "attention_factor"),
}
# keys a config may carry beside the scaling (transformers 5 puts the base
# inside rope_parameters)
_PASSIVE = ("rope_theta", "partial_rotary_factor")


def read_rope_scaling(rope_scaling, *, max_position_embeddings=None):
    """A ``rope_scaling`` (or ``rope_parameters``) dict, checked.

    Returns a new dict with ``"rope_type"`` and every key the type uses
    (defaults filled in as transformers fills them). ``None`` is
    ``{"rope_type": "default"}``. The type is read from ``rope_type`` or
    the older ``type``. A YaRN or LongRoPE dict without ``factor`` takes
    ``max_position_embeddings / original_max_position_embeddings`` (HF's
    rule for DeepSeek and Phi-3); a dynamic one without
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
    if kind in ("yarn", "longrope") and s.get("factor") is None:
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
    if kind == "longrope" and all(
        s.get(k) is None for k in ("factor", "attention_factor")
    ):
        raise ValueError(  # nothing gives the temperature
            "rope_scaling of rope_type 'longrope' needs 'factor' or "
            "'attention_factor' (or pass max_position_embeddings=: the "
            "factor is max_position_embeddings / "
            "original_max_position_embeddings)"
        )
    return _checked_values(kind, s)


def _factor_list(value, key):
    """LongRoPE's ``short_factor`` or ``long_factor``: positive numbers,
    as a tuple of floats."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(
        value, "__len__"
    ):
        raise ValueError(
            f"rope_scaling {key} must be a list of positive numbers (one "
            f"per rotated pair), got {value!r}"
        )
    return tuple(
        float(check_positive_number(v, f"rope_scaling {key}[{i}]"))
        for i, v in enumerate(value)
    )


def _checked_values(kind, s):
    """The values of a ``rope_scaling`` dict ``s`` of type ``kind`` (its
    keys checked): numbers positive, ``truncate`` a flag, YaRN's
    defaults filled in."""
    out = {"rope_type": kind}
    for key, value in s.items():
        if key == "truncate":
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(
                    f"rope_scaling truncate must be True or False, got "
                    f"{value!r}"
                )
            out[key] = bool(value)
        elif key in _LISTS:
            out[key] = _factor_list(value, key)
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
    ``seq_len`` is the current length (``dynamic`` reads it: below the
    trained length it is plain RoPE; ``longrope`` takes its long factors
    past the trained length, its short ones up to it and without one).
    """
    s = read_rope_scaling(
        rope_scaling, max_position_embeddings=max_position_embeddings
    )
    theta = rope_frequencies(rotary_dim, base=base)  # [r/2]
    r = 2 * len(theta)
    kind = s["rope_type"]
    if kind == "default":
        return theta, 1.0
    if kind == "longrope":
        return longrope_frequencies(theta, s, seq_len)
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


def longrope_frequencies(theta, s, seq_len=None):
    """LongRoPE (Ding et al. 2024) on the plain ``theta [r/2]``:
    ``(theta / lambda, attention_factor)`` for ``s`` a dict checked by
    :func:`read_rope_scaling` (HF's ``_compute_longrope_parameters``).

    ``lambda`` is one factor per pair, found by search: ``long_factor``
    when ``seq_len`` passes the trained length ``L``
    (``original_max_position_embeddings``), else ``short_factor``. The
    temperature is ``attention_factor``, or ``sqrt(1 + ln s / ln L)``
    for ``s = factor > 1`` (1 otherwise). Hugging Face picks the list at
    every forward from that call's ``max(position) + 1``, so a decode
    that crosses ``L`` turns its new queries and keys by the long
    factors while the cached keys keep the short ones (Phi-3's
    ``generate`` re-reads the whole prompt there instead).
    """
    L = s["original_max_position_embeddings"]
    n = 0 if seq_len is None else check_positive_int(seq_len, "seq_len")
    key = "long_factor" if n > L else "short_factor"
    lam = np.asarray(s[key], dtype=np.float64)  # [r/2]
    if lam.shape != theta.shape:
        raise ValueError(
            f"rope_scaling {key} must hold one factor per rotated pair "
            f"({len(theta)}), got {len(lam)}"
        )
    attention = s.get("attention_factor")
    if attention is None:
        factor = s["factor"]
        attention = 1.0
        if factor > 1.0:
            attention = math.sqrt(1 + math.log(factor) / math.log(L))
    return theta / lam, float(attention)


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
    check_finite(x, "x")
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

    def __post_init__(self):
        if self.rope_scaling is not None:  # checked once, defaults filled
            scaling = read_rope_scaling(
                self.rope_scaling,
                max_position_embeddings=self.max_position_embeddings,
            )
            object.__setattr__(self, "rope_scaling", scaling)

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
        if self.qk_norm:  # Llama 4's, no gain
            x, c = qk_norm_forward(x, eps=self.qk_norm_eps)
            saved.append(("norm", c))
        return x, saved

    def backward(self, dy, saved):
        """Each step undone, the last first."""
        for name, c in reversed(saved):
            if name == "rope":
                dy = rope_backward(dy, c)  # m R^T dy
            else:
                dy, _ = qk_norm_backward(dy, c)
        return dy


@dataclass(frozen=True)
class ProportionalRotary:
    """Gemma 4's ``proportional`` RoPE as a position part: a head of
    ``d`` features turns as ``d/2`` rotate-half pairs ``(i, i + d/2)``;
    pair ``i`` at ``theta_i = base^(-2i/d)`` for the first ``n_turned``
    pairs, at ``theta_i = 0`` (not at all) for the rest::

        n_turned = floor(partial_rotary_factor * d / 2)

    The frequencies turned are those of full RoPE over ``d`` (not of a
    ``2 n_turned``-wide head, as chapter 6's partial RoPE), and the
    still pairs are spread over both halves of the head. Hugging Face:
    ``rope_type: "proportional"`` (a ``factor`` divides every
    frequency). The backward turns by ``-theta``, as chapter 6's."""

    base: float
    d: int
    n_turned: int
    factor: float = 1.0

    def __post_init__(self):
        check_positive_number(self.base, "base")
        check_positive_number(self.factor, "factor")
        d = check_positive_int(self.d, "d")
        if d % 2 or not 0 <= self.n_turned <= d // 2:
            raise ValueError(
                f"ProportionalRotary needs an even d and 0 <= n_turned <= "
                f"d/2, got d={self.d}, n_turned={self.n_turned}"
            )

    def frequencies(self):
        """``theta [d/2]``: ``base^(-2i/d) / factor``, 0 past
        ``n_turned``."""
        i = np.arange(self.d // 2)  # [d/2]
        theta = self.base ** (-2.0 * i / self.d) / self.factor
        return np.where(i < self.n_turned, theta, 0.0)

    def forward(self, x, positions):
        """``x [..., L, d]`` at ``positions [L]``: ``(y, saved)``."""
        x = as_float_array(x, "x", min_ndim=2)
        if x.shape[-1] != self.d:
            raise ValueError(
                f"x must be [..., L, d] with d = {self.d}, got {x.shape}"
            )
        p = _check_positions(positions, x.shape[-2], x.shape)  # [L]
        angles = p[:, None] * self.frequencies()  # [L, 1] * [d/2]
        cos = np.cos(angles).astype(x.dtype)  # [L, d/2]
        sin = np.sin(angles).astype(x.dtype)
        y = rotate_pairs(x, cos, sin, layout="half")  # [..., L, d]
        return y, RopeCache(cos, sin, "half", self.d, x.shape)

    def backward(self, dy, saved):
        return rope_backward(dy, saved)  # R(theta)^T = R(-theta)
