"""Long context: RoPE scaling, NoPE layers, chunked attention (chapter 11).

Plain RoPE (chapter 6) turns pair ``i`` by ``theta_i = base^(-2i/r)``
radians per position; past the trained context the slow pairs reach angles
never seen in training. :mod:`attn_np.rope_scaling` holds the methods that
change ``theta`` (its docstring has their table), as Hugging Face spells
``rope_scaling``.

The chapter's parts live where a layer takes them, each in one module:
the scalings and the position part :class:`ScaledRotary` in
:mod:`attn_np.rope_scaling`, the chunked rule (``chunked_mask``,
:class:`~attn_np.masks.ChunkedMask`) in :mod:`attn_np.masks`, the
parameter-free QK-norm in :mod:`attn_np.norms` and Llama 4's query
temperature (a score mod) in :mod:`attn_np.refinements`; their public
names are importable from here as well.

Llama 4's iRoPE: every ``nope_layer_interval``-th layer has no rotation
(NoPE) and attends over the whole prefix; the others rotate, normalise
``q`` and ``k`` with a parameter-free RMS norm (``qk_norm_forward``) and
attend within chunks of ``C`` positions (``chunked_mask``). At inference
the NoPE layers scale their queries by ``1 + a ln(floor((p+1)/f) + 1)``
(``query_temperature_forward``). :class:`LongContextAttention` is a
recipe: chapter 2's layer with these parts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from ._checks import (
    as_float_array,
    check_finite,
    check_flag,
    check_positive_int,
    check_positive_number,
    check_upstream,
)
from .kv_cache import ChunkedKVCache
from .masks import ChunkedMask, chunked_mask
from .multihead import GroupedQueryAttention
from .norms import qk_norm_backward as _qk_norm_backward
from .norms import qk_norm_forward as _qk_norm_forward
from .refinements import (
    QueryTemperature,
    TemperatureCache,
    query_temperature,
    query_temperature_backward,
    query_temperature_forward,
)
from .rope_scaling import (
    ROPE_TYPES,
    ScaledRotary,
    llama3_frequencies,
    read_rope_scaling,
    rope_settings_from_config,
    scaled_frequencies,
    scaled_rope_forward,
    softmax_scale,
    yarn_correction_range,
    yarn_frequencies,
    yarn_mscale,
)
from .training.tasks import RecallBatch

# the names this chapter shows, defined where a layer takes them
__all__ = [
    "ROPE_TYPES",
    "ChunkedKVCache",
    "LongContextAttention",
    "Passkey",
    "QueryTemperature",
    "ScaledRotary",
    "TemperatureCache",
    "chunked_mask",
    "frequency_bands",
    "llama3_frequencies",
    "qk_norm_backward",
    "qk_norm_forward",
    "query_temperature",
    "query_temperature_backward",
    "query_temperature_forward",
    "read_rope_scaling",
    "rope_layers",
    "rope_settings_from_config",
    "scaled_frequencies",
    "scaled_rope_forward",
    "softmax_scale",
    "with_rope_scaling",
    "yarn_correction_range",
    "yarn_frequencies",
    "yarn_mscale",
]


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
    check_finite(theta, "theta")
    check_finite(scaled, "scaled")
    factor = check_positive_number(factor, "factor")
    ratio = scaled / theta
    kept = np.isclose(ratio, 1.0, rtol=rtol, atol=0)
    divided = np.isclose(ratio, 1.0 / factor, rtol=rtol, atol=0) & ~kept
    return {
        "kept": int(kept.sum()),
        "divided": int(divided.sum()),
        "smoothed": int((~kept & ~divided).sum()),
    }


def qk_norm_forward(x, *, eps=1e-6):
    """Parameter-free RMS norm over the last axis (Llama 4's
    ``L2Norm``): ``x / sqrt(mean(x^2) + eps)``; ``(y, cache)``
    (:func:`attn_np.norms.qk_norm_forward` without a gain)."""
    x = as_float_array(x, "x", min_ndim=1)
    check_finite(x, "x")
    return _qk_norm_forward(x, eps=eps)


def qk_norm_backward(dy, cache):
    """``dx = r (dy - x r^2 mean(dy x))``, RMSNorm's with ``g = 1``."""
    dy = check_upstream(dy, "dy", cache[0].shape, "the normalised x")
    dx, _ = _qk_norm_backward(dy, cache)
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


# ------------------------------------------------------------------ layer
class LongContextAttention(GroupedQueryAttention):
    """Grouped-query attention with chapter 11's parts: a recipe.

    The arguments of :class:`~attn_np.GroupedQueryAttention` (``d_model,
    n_heads, n_kv_heads, d_k, d_v, seed, dtype`` by position, the rest by
    keyword; ``rope_base`` defaults to 10000), plus:

    ``rope_scaling``
        a Hugging Face ``rope_scaling`` dict: the position part is a
        :class:`ScaledRotary` with it.
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
        chunked attention, the mask rule :class:`~attn_np.masks.ChunkedMask`
        (:func:`chunked_mask`); decode it with a :class:`ChunkedKVCache`
        of the same chunk.

    Nothing is overridden but the position part (the ``rotary``
    property, read from the settings each time) and the cache check.
    """

    rebuilds_from_options = True

    def __init__(
        self,
        d_model,
        n_heads,
        n_kv_heads,
        d_k=None,
        d_v=None,
        seed=0,
        dtype=np.float64,
        *,
        rope_base=10000.0,
        rope_scaling=None,
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
        for name, why in (
            ("flash", "the tiled kernels take no chunked mask"),
            ("rotary", "the layer makes its own from its settings"),
        ):
            if options.pop(name, None):
                raise ValueError(
                    f"{name} is not taken by LongContextAttention: {why}"
                )
        self.rope_scaling = (
            None if rope_scaling is None else read_rope_scaling(rope_scaling)
        )
        self.use_rope = check_flag(use_rope, "use_rope")
        self.qk_norm = check_flag(qk_norm, "qk_norm")
        self.qk_norm_eps = check_positive_number(qk_norm_eps, "qk_norm_eps")
        self.temperature_tuning = check_flag(
            temperature_tuning, "temperature_tuning"
        )
        self.floor_scale = check_positive_number(floor_scale, "floor_scale")
        self.attn_scale = float(attn_scale)
        C = attention_chunk_size
        C = (
            None
            if C is None
            else check_positive_int(C, "attention_chunk_size")
        )
        self.attention_chunk_size = C
        if C and options.get("window") is not None:
            raise ValueError(
                "a layer is chunked or windowed, not both: got "
                f"attention_chunk_size={C} and window={options['window']}"
            )
        rule = options.pop("mask_rule", None)
        if C and rule is not None:
            raise ValueError(
                "pass attention_chunk_size or a mask_rule, not both"
            )
        mods = tuple(options.pop("score_mods", ()))
        temp = ()
        if self.temperature_tuning:  # Llama 4's, first: it scales s
            temp = (QueryTemperature(self.floor_scale, self.attn_scale),)
        super().__init__(
            d_model,
            n_heads,
            n_kv_heads,
            d_k,
            d_v,
            seed,
            dtype,
            rope_base=rope_base,
            mask_rule=rule if C is None else ChunkedMask(C),
            score_mods=(*temp, *mods),
            **options,
        )

    @property
    def options(self) -> dict:
        """The keywords that rebuild this layer's kind (not its weights)."""
        mine = {
            "rope_scaling": self.rope_scaling,
            "use_rope": self.use_rope,
            "qk_norm": self.qk_norm,
            "qk_norm_eps": self.qk_norm_eps,
            "temperature_tuning": self.temperature_tuning,
            "floor_scale": self.floor_scale,
            "attn_scale": self.attn_scale,
            "attention_chunk_size": self.attention_chunk_size,
        }
        mods = self.score_mods
        if self.temperature_tuning:  # the layer's own, first
            mods = mods[1:]
        made = {"rotary": None, "score_mods": mods}
        if self.attention_chunk_size is not None:
            made["mask_rule"] = None
        return {**super().options, **made, **mine}

    @property
    def rotary(self):
        """The position part: a :class:`ScaledRotary` with this layer's
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

    def new_cache(self):
        """An empty cache for this layer: a :class:`ChunkedKVCache` of its
        chunk for a chunked layer (it holds only the current chunk)."""
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
