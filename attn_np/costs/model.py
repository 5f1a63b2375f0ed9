"""What the key/value cache of real models costs (chapters 3, 4, 7, 8).

During decoding every layer keeps the keys and the values of every position
it has seen. Per token that is ``n_kv_heads * head_dim`` numbers for the keys
and as many for the values, in each of ``n_layers`` layers::

    kv_bytes_per_token = n_layers * n_kv_heads * (d_k + d_v) * bytes
                       = 2 * n_layers * n_kv_heads * head_dim * bytes
                         (when d_k = d_v = head_dim)
    kv_cache_bytes     = kv_bytes_per_token * seq_len * batch

(``bytes`` per element: 2 for float16 and bfloat16.)

``n_heads`` does not appear: the cache shrinks with the number of key/value
heads, which is what multi-query (Shazeer 2019) and grouped-query attention
(Ainslie et al. 2023) change. Two more designs change the formula itself:

* multi-head latent attention (MLA, DeepSeek-V2, chapter 7) caches, per
  token and layer, one latent of ``d_latent_kv`` numbers and one rotary key
  of ``d_rope`` numbers shared by every head, for keys and values together:
  ``kv_bytes_per_token = n_layers * (d_latent_kv + d_rope) * bytes``;
* a sliding-window layer (chapter 8) keeps only its last ``W`` positions, so
  ``kv_cache_bytes`` counts ``min(seq_len, W)`` positions for it.

:func:`from_hf_config` reads the same shapes from a Hugging Face
``config.json``; ``python -m attn_np.memory`` is its command line.

Units. Memory sizes of accelerators are sold in decimal gigabytes, ``GB =
10**9`` bytes; the book prints sizes in binary units, ``GiB = 2**30`` bytes
(7.4 % more). Both constants are here so that no calculation has to guess
which one was meant.

Hybrid models add two more kinds of layer:

* a chunked layer (Llama 4) attends only within its chunk of ``C``
  positions, so it holds at most ``min(seq_len, C)`` positions;
* a linear-attention layer (Gated DeltaNet in Qwen3-Next and Qwen3.5, Kimi
  Delta Attention in Kimi Linear) holds no positions at all: a recurrent
  state of ``d_k x d_v`` numbers per value head and the last positions of
  its short convolution, the same size at any context
  (:func:`state_bytes`).

DeepSeek-V3.2's lightning indexer keeps one more key per token and layer
beside the latent (:func:`indexer_cache_bytes`). :func:`cache_bytes` adds
all of them; :func:`kv_cache_bytes` is the keys and values (or latent)
alone.

Positions held, and why ``W`` and not ``W - 1``. The counts here are what
a layer holds *while it computes a decode step*: the ``W - 1`` positions
kept from before and the new token's own key and value, ``W`` in all
(``C`` for a chunk, ``K`` columns for a convolution of kernel ``K``).
Between steps Hugging Face's sliding-window cache keeps ``W - 1``; its
Qwen3-Next convolution state keeps ``K``. The difference is one position
per layer; the calculator reports the larger, the memory a step needs.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from .._checks import check_count, check_positive_number

# Hugging Face's layer types, and its rule for alternating window layers
from ..hf.config import (  # noqa: F401 (importable here too)
    CHUNKED,
    FULL,
    LAYER_TYPES,
    LINEAR,
    SLIDING,
)
from ..hf.config import alternate as _alternate  # noqa: F401
from .sparse import indexer_key_bytes

GB = 10**9  # a decimal gigabyte, the unit of data sheets ("80 GB")
GiB = 2**30  # a binary gibibyte, the unit the book prints with


#: The most layers for which :attr:`ModelConfig.layer_windows` builds a
#: tuple (one entry per layer); the formulas count layers in closed form.
MAX_LISTED_LAYERS = 1_000_000

#: A layer that keeps no cache: a hybrid's MLP or MoE block (Nemotron-H's
#: ``-`` and ``E``), or a layer that reads another layer's keys and values
#: (Gemma 3n's and Gemma 4's ``num_kv_shared_layers``). Hugging Face's
#: cache gives it a ``DummyLayer``.
NO_CACHE = "no_cache"
#: The layer types a :class:`ModelConfig` takes.
COST_LAYER_TYPES = (*LAYER_TYPES, NO_CACHE)


@dataclass(frozen=True)
class LinearState:
    """What one linear-attention layer keeps per sequence, at any context.

    ``n_v_heads`` value heads each keep a state of ``d_k x d_v`` numbers,
    in ``state_bytes`` bytes each (4: float32, the dtype the released
    configs and Hugging Face's code keep it in). The short causal
    convolution (kernel ``conv_kernel``) over ``conv_dim`` channels keeps
    its last ``conv_kernel`` inputs, in the cache's own dtype.
    ``state_bytes=None`` keeps the state in the cache's dtype too
    (MiniMax's lightning attention); ``conv_kernel=0`` is a layer with no
    convolution. A state-space layer fits the same shape: Mamba-2 keeps
    ``n_v_heads`` (its heads) states of ``d_k`` (head dimension) x ``d_v``
    (state size); Mamba keeps ``d_k=1`` by ``d_v`` per channel.
    """

    kind: str  # "Gated DeltaNet", "Kimi Delta Attention", "Mamba-2", ...
    n_k_heads: int
    n_v_heads: int
    d_k: int
    d_v: int
    conv_kernel: int
    conv_dim: int
    state_bytes: int | None = 4
    state_dtype: str = "float32"

    def __post_init__(self):
        for name in ("n_k_heads", "n_v_heads", "d_k", "d_v"):
            check_count(getattr(self, name), name)
        for name in ("conv_kernel", "conv_dim"):
            check_count(getattr(self, name), name, minimum=0)
        if self.state_bytes is not None:
            check_count(self.state_bytes, "state_bytes")

    @property
    def state_numbers(self) -> int:
        """Numbers of the recurrent state: ``n_v_heads * d_k * d_v``."""
        return self.n_v_heads * self.d_k * self.d_v

    @property
    def conv_numbers(self) -> int:
        """Numbers of the convolution state: ``conv_dim * conv_kernel``."""
        return self.conv_dim * self.conv_kernel


@dataclass(frozen=True)
class Indexer:
    """DeepSeek-V3.2's lightning indexer: ``n_heads`` heads of ``head_dim``
    scoring every cached token, the best ``topk`` of which the attention
    reads.

    Per token and layer it caches one key of ``head_dim`` numbers in FP8
    (``key_bytes=1``) and one float32 scale per block of ``block`` numbers
    (``scale_bytes=4``), as the release's inference code does.
    """

    n_heads: int
    head_dim: int
    topk: int
    key_bytes: int = 1
    scale_bytes: int = 4
    block: int = 128

    def __post_init__(self):
        for name in ("n_heads", "head_dim", "topk", "key_bytes"):
            check_count(getattr(self, name), name)
        for name in ("scale_bytes", "block"):
            check_count(getattr(self, name), name)
        if self.head_dim % self.block:
            raise ValueError(
                f"head_dim must be a multiple of block={self.block} (one "
                f"scale per block), got head_dim={self.head_dim}"
            )

    @property
    def bytes_per_token(self) -> int:
        """``head_dim * key_bytes + head_dim // block * scale_bytes``
        (:func:`~attn_np.costs.sparse.indexer_key_bytes`)."""
        return indexer_key_bytes(
            self.head_dim,
            key_bytes=self.key_bytes,
            scale_bytes=self.scale_bytes,
            scale_block=self.block,
        )


@dataclass(frozen=True)
class ModelConfig:
    """The attention shapes of one released model, and where they come from.

    ``n_kv_heads`` is the document's number of groups ``n_g``: ``n_kv_heads
    == n_heads`` is MHA, ``1`` is MQA, anything in between GQA. ``n_params``
    counts every distinct weight once (an embedding tied to the output layer
    counts once); it is computed from the same configuration file and is what
    "the weights" means when we ask how much memory is left for the cache
    (``None`` when unknown, as for :func:`from_hf_config`).

    Layers: ``layer_types`` says what each layer is, in Hugging Face's
    words: ``"full_attention"``, ``"sliding_attention"`` (a window of
    ``sliding_window`` positions), ``"chunked_attention"`` (chunks of
    ``attention_chunk_size``) or ``"linear_attention"`` (``linear``, a
    :class:`LinearState`). Without ``layer_types`` every layer is full, or
    has the window when ``sliding_window`` is given.

    ``d_head_v`` is the per-head dimension of the values (``None``:
    ``head_dim``, as in most models; MiMo-V2-Flash's values are narrower
    than its keys, 128 against 192).

    Latent cache (MLA): ``d_latent_kv`` and ``d_rope`` are what a token
    leaves in each layer's cache; ``head_dim`` is then the per-head
    dimension of the keys rebuilt from the latent, ``d_head_v`` that of the
    values, and ``d_latent_q`` the query latent
    (``None``: queries are not compressed). ``indexer`` is DeepSeek-V3.2's
    (an :class:`Indexer`, in every attention layer).

    ``rope`` is what the config says of the rotary embedding, per layer
    type: ``{layer_type: {"rope_type": ..., "rope_theta": ..., ...}}``
    (both of Hugging Face's spellings read into one; it does not change the
    cache).

    ``layer_kv`` gives the layer types whose key/value heads differ from
    the model's, as ``((layer_type, n_kv_heads, d_k, d_v), ...)``: Gemma
    4's full layers (``global_head_dim``, ``num_global_key_value_heads``),
    MiMo-V2-Flash's window layers (twice ``num_key_value_heads``).
    """

    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    n_params: int | None
    # the official configuration file (repository and file) and the
    # paper's table
    source: str
    cite: str  # key in book/references.bib ("" for none)
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    d_latent_kv: int | None = None
    d_rope: int | None = None
    d_latent_q: int | None = None
    d_head_v: int | None = None
    attention_chunk_size: int | None = None
    linear: LinearState | None = None
    indexer: Indexer | None = None
    rope: dict | None = field(default=None, hash=False, compare=False)
    # the longest context the config states (HF's max_position_embeddings)
    max_position_embeddings: int | None = None
    layer_kv: tuple[tuple[str, int, int, int], ...] | None = None

    def __post_init__(self):
        counts = ["n_layers", "n_heads", "n_kv_heads", "head_dim"]
        counts += ["d_model"]
        optional = ["n_params", "sliding_window", "d_latent_kv", "d_rope"]
        optional += ["d_latent_q", "d_head_v", "attention_chunk_size"]
        optional += ["max_position_embeddings"]
        for name in counts + optional:
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            try:
                check_count(value, name)
            except ValueError as err:
                raise ValueError(f"{err} (model {self.name!r})") from None
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                "n_heads must be a multiple of n_kv_heads, got "
                f"n_heads={self.n_heads} and "
                f"n_kv_heads={self.n_kv_heads} (model {self.name!r})"
            )
        if (self.d_latent_kv is None) != (self.d_rope is None):
            raise ValueError(
                "a latent cache needs both d_latent_kv and d_rope, got "
                f"d_latent_kv={self.d_latent_kv} and d_rope={self.d_rope}"
                f" (model {self.name!r})"
            )
        if self.d_latent_kv is None and self.d_latent_q is not None:
            raise ValueError(
                f"d_latent_q={self.d_latent_q} needs a latent cache "
                f"(d_latent_kv and d_rope) (model {self.name!r})"
            )
        for name, kind in (("linear", LinearState), ("indexer", Indexer)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise TypeError(
                    f"{name} must be a {kind.__name__} or None, got "
                    f"{type(value).__name__} (model {self.name!r})"
                )
        if self.indexer is not None and self.d_latent_kv is None:
            raise ValueError(
                "an indexer needs a latent cache (d_latent_kv and d_rope) "
                f"(model {self.name!r})"
            )
        self._check_layers()

    def _check_layers(self):
        """``layer_types`` (made a tuple), what each kind of layer needs,
        and ``layer_kv``'s rows: part of ``__post_init__``."""
        if self.layer_types is not None:
            types = tuple(self.layer_types)
            object.__setattr__(self, "layer_types", types)
            bad = set(types) - set(COST_LAYER_TYPES)
            if len(types) != self.n_layers or bad:
                raise ValueError(
                    f"layer_types must list {self.n_layers} entries (one "
                    f"per layer), each one of {COST_LAYER_TYPES}, got "
                    f"{len(types)}: {sorted(set(map(str, types)))} "
                    f"(model {self.name!r})"
                )
        counts = self.layer_counts
        needs = (
            (SLIDING, "sliding_window", self.sliding_window),
            (CHUNKED, "attention_chunk_size", self.attention_chunk_size),
            (LINEAR, "linear", self.linear),
        )
        for kind, name, value in needs:
            if counts.get(kind) and value is None:
                raise ValueError(
                    f"layer_types has {kind!r} layers but {name} is None "
                    f"(model {self.name!r})"
                )
        if self.linear is not None and not counts.get(LINEAR):
            raise ValueError(
                "linear is given but no layer is 'linear_attention' "
                f"(model {self.name!r})"
            )
        if self.layer_kv is not None:
            rows = tuple(tuple(row) for row in self.layer_kv)
            object.__setattr__(self, "layer_kv", rows)
            for row in rows:
                ok = len(row) == 4 and row[0] in (FULL, SLIDING, CHUNKED)
                if ok:
                    for x in row[1:]:
                        check_count(x, "layer_kv entry")
                if not ok or self.d_latent_kv is not None:
                    raise ValueError(
                        "layer_kv must hold (attention layer type, "
                        "n_kv_heads, d_k, d_v) rows, without a latent "
                        f"cache, got {row!r} (model {self.name!r})"
                    )

    @property
    def layer_counts(self) -> dict[str, int]:
        """How many layers of each type, ``{layer_type: count}`` (computed
        without a per-layer list when ``layer_types`` is None)."""
        if self.layer_types is None:
            kind = FULL if self.sliding_window is None else SLIDING
            return {kind: self.n_layers}
        return dict(Counter(self.layer_types))

    @property
    def n_attention_layers(self) -> int:
        """Layers that cache keys and values (every type but linear and
        no-cache)."""
        counts = self.layer_counts
        return (
            self.n_layers - counts.get(LINEAR, 0) - counts.get(NO_CACHE, 0)
        )

    @property
    def family(self) -> str:
        """``"MHA"``, ``"GQA"``, ``"MQA"`` (the keys of
        :data:`attn_np.instruments.plotting.FAMILY_COLOURS`) or ``"MLA"``:
        the attention layers' family."""
        if self.d_latent_kv is not None:
            return "MLA"
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    @property
    def group_size(self) -> int:
        """Query heads per key/value head, ``n_heads // n_kv_heads``."""
        return self.n_heads // self.n_kv_heads

    @property
    def kv_numbers_per_layer(self) -> int:
        """Numbers one token adds to one attention layer's cache:
        ``n_kv_heads * (head_dim + d_head_v)`` (a key and a value; ``2 *
        n_kv_heads * head_dim`` when the values are as wide as the keys),
        or ``d_latent_kv + d_rope``."""
        if self.d_latent_kv is not None:
            return self.d_latent_kv + self.d_rope
        d_v = self.head_dim if self.d_head_v is None else self.d_head_v
        return self.n_kv_heads * (self.head_dim + d_v)

    def kv_numbers_of(self, layer_type: str) -> int:
        """Numbers one token adds to one layer of ``layer_type``: 0 for a
        linear or no-cache layer, the ``layer_kv`` row's ``n_kv_heads * (d_k
        + d_v)`` where there is one, else :attr:`kv_numbers_per_layer`."""
        if layer_type in (LINEAR, NO_CACHE):
            return 0
        for kind, n_kv, d_k, d_v in self.layer_kv or ():
            if kind == layer_type:
                return n_kv * (d_k + d_v)
        return self.kv_numbers_per_layer

    def window_of(self, layer_type: str) -> int | None:
        """The most positions a layer of ``layer_type`` holds (``None``:
        all of them; 0 for a linear layer, which holds none)."""
        return {
            FULL: None,
            SLIDING: self.sliding_window,
            CHUNKED: self.attention_chunk_size,
            LINEAR: 0,
            NO_CACHE: 0,
        }[layer_type]

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's window ``W`` (or chunk ``C``; 0 for a linear
        layer), or ``None`` for full attention. One entry per layer, so it
        refuses more than :data:`MAX_LISTED_LAYERS` layers; the formulas use
        :attr:`layer_counts`."""
        if self.n_layers > MAX_LISTED_LAYERS:
            raise ValueError(
                f"layer_windows lists one entry per layer, and n_layers="
                f"{self.n_layers} is more than {MAX_LISTED_LAYERS:,}; use "
                "layer_counts"
            )
        if self.layer_types is None:
            return (self.sliding_window,) * self.n_layers
        return tuple(self.window_of(t) for t in self.layer_types)

    @property
    def n_window_layers(self) -> int:
        """How many layers have a sliding window."""
        return self.layer_counts.get(SLIDING, 0)

    @property
    def kind(self) -> str:
        """The family, and the window, chunked and linear layers if there
        are any."""
        parts = [self.family if self.n_attention_layers else "no attention"]
        n = self.n_layers
        counts = self.layer_counts

        def where(k: int) -> str:
            return "every layer" if k == n else f"{k} of {n} layers"

        if counts.get(SLIDING):
            w = self.sliding_window
            parts.append(f"window {w} in {where(counts[SLIDING])}")
        if counts.get(CHUNKED):
            c = self.attention_chunk_size
            parts.append(f"chunks of {c} in {where(counts[CHUNKED])}")
        if counts.get(LINEAR):
            parts.append(f"{self.linear.kind} in {where(counts[LINEAR])}")
        if counts.get(NO_CACHE):
            parts.append(f"no cache in {where(counts[NO_CACHE])}")
        if self.indexer is not None:
            parts.append(f"top-{self.indexer.topk} indexer")
        return ", ".join(parts)

    def without_windows(self) -> ModelConfig:
        """The same model with full attention in every sliding-window
        layer (other layer types are kept)."""
        types = self.layer_types
        if types is not None:
            types = tuple(FULL if t == SLIDING else t for t in types)
            if set(types) == {FULL}:
                types = None
        return dataclasses.replace(
            self,
            name=f"{self.name} (full attention)",
            sliding_window=None,
            layer_types=types,
        )


#: Every released model by name. The data live in
#: :mod:`attn_np.costs.released`, which fills this dict when
#: :mod:`attn_np.costs` is imported (this module imports no data, so the
#: type and its formulas never depend on the list of models).
CATALOGUE: dict[str, ModelConfig] = {}


def get_model(config) -> ModelConfig:
    """``config`` itself, or the entry of :data:`CATALOGUE` it names."""
    if isinstance(config, ModelConfig):
        return config
    if isinstance(config, str):
        if config not in CATALOGUE:
            raise ValueError(
                f"config {config!r} is not in MODELS, LATENT_MODELS or "
                f"WINDOW_MODELS; known models: {', '.join(CATALOGUE)}"
            )
        return CATALOGUE[config]
    raise ValueError(
        "config must be a ModelConfig or the name of one in CATALOGUE, "
        f"got {type(config).__name__}"
    )


def element_bytes(value, name: str = "bytes_per_element") -> Fraction:
    """Bytes per cached number, exactly: a positive integer (2 for
    bf16/fp16, 1 for an 8-bit cache) or a whole number of bits (0.5 for a
    4-bit cache, 0.375 for 3 bits). A cache of a fractional size is
    rounded up to whole bytes."""
    if isinstance(value, bool) or not isinstance(
        value, (int, float, Fraction, np.integer, np.floating)
    ):
        raise ValueError(
            f"{name} must be a number of bytes (2, 1, 0.5 for 4 bits), got "
            f"{value!r:.60}"
        )
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    b = Fraction(value).limit_denominator(64)
    if b != Fraction(value) or b <= 0 or (8 * b).denominator != 1:
        raise ValueError(
            f"{name} must be a positive whole number of bits, in bytes "
            f"(2, 1, 0.5 for 4 bits, 0.375 for 3), got {value!r}"
        )
    if b > 64:
        raise ValueError(f"{name} must be at most 64 bytes, got {value!r}")
    return b


def _whole(n) -> int:
    """Bytes rounded up to a whole byte (exact for a Fraction)."""
    return int(math.ceil(n))


def kv_bytes_per_token(config, bytes_per_element: int = 2) -> int:
    """Bytes the cache grows by for each token, in every attention layer:
    ``n_attention_layers * kv_numbers_per_layer * bytes``.

    That is ``n_layers * n_kv_heads * (d_k + d_v) * bytes`` (``d_k =
    head_dim``, ``d_v = d_head_v``), which is ``2 * n_layers * n_kv_heads *
    head_dim * bytes`` when keys and values share ``head_dim``, or
    ``n_layers * (d_latent_kv + d_rope) * bytes`` for a latent cache. A
    window or chunked layer stops growing once its window is full: this is
    the rate before then. Linear-attention layers do not grow at all.
    ``bytes_per_element`` is 2 for fp16/bf16, 1 for an 8-bit cache, 0.5 for
    a 4-bit one (:func:`element_bytes`; rounded up to a whole byte).
    """
    cfg = get_model(config)
    b = element_bytes(bytes_per_element)
    numbers = sum(
        count * cfg.kv_numbers_of(kind)
        for kind, count in cfg.layer_counts.items()
    )
    return _whole(numbers * b)


def cached_positions(config, seq_len: int) -> int:
    """Positions held after ``seq_len`` tokens, summed over the layers.

    ``seq_len`` for a full-attention layer, ``min(seq_len, W)`` for a layer
    with a window of ``W`` (``min(seq_len, C)`` for chunks of ``C``), none
    for a linear-attention layer. Counted per layer type, in closed form.
    """
    cfg = get_model(config)
    n = check_count(seq_len, "seq_len", minimum=0)
    total = 0
    for kind, count in cfg.layer_counts.items():
        w = cfg.window_of(kind)
        total += count * (n if w is None else min(n, w))
    return total


def kv_cache_bytes(
    config, seq_len: int, batch: int = 1, bytes_per_element: int = 2
) -> int:
    """Bytes of the keys and values (or latents) of ``batch`` sequences of
    ``seq_len`` tokens, all layers: ``batch * cached_positions *
    kv_numbers_per_layer * bytes``.

    Without windows that is ``kv_bytes_per_token * seq_len * batch``.
    Linear layers' states and the indexer's keys are not in it:
    :func:`cache_bytes` adds them.
    """
    cfg = get_model(config)
    b = element_bytes(bytes_per_element)
    n = check_count(seq_len, "seq_len", minimum=0)
    batch = check_count(batch, "batch", minimum=1)
    numbers = 0
    for kind, count in cfg.layer_counts.items():
        w = cfg.window_of(kind)
        held = n if w is None else min(n, w)
        numbers += count * held * cfg.kv_numbers_of(kind)
    return _whole(batch * numbers * b)


def state_bytes(
    config, batch: int = 1, bytes_per_element: int = 2
) -> tuple[int, int]:
    """``(recurrent, conv)``: bytes of the linear-attention layers' states
    for ``batch`` sequences, at any context.

    ``recurrent = batch * n_linear * n_v_heads * d_k * d_v * state_bytes``
    (the state's own dtype, float32 in the released models) and ``conv =
    batch * n_linear * conv_dim * conv_kernel * bytes_per_element`` (the
    convolution's last inputs, in the cache's dtype). ``(0, 0)`` for a
    model without linear layers.
    """
    cfg = get_model(config)
    b = element_bytes(bytes_per_element)
    batch = check_count(batch, "batch", minimum=1)
    n = cfg.layer_counts.get(LINEAR, 0)
    if not n:
        return 0, 0
    s = cfg.linear
    per = b if s.state_bytes is None else s.state_bytes
    return (
        _whole(batch * n * s.state_numbers * per),
        _whole(batch * n * s.conv_numbers * b),
    )


def indexer_cache_bytes(config, seq_len: int, batch: int = 1) -> int:
    """Bytes of the lightning indexer's keys (DeepSeek-V3.2): ``batch *
    seq_len * n_attention_layers * indexer.bytes_per_token``, 0 without an
    indexer. The FP8 keys and their scales have their own widths, whatever
    the latent cache's ``bytes_per_element``."""
    cfg = get_model(config)
    n = check_count(seq_len, "seq_len", minimum=0)
    batch = check_count(batch, "batch", minimum=1)
    if cfg.indexer is None:
        return 0
    per_token = cfg.n_attention_layers * cfg.indexer.bytes_per_token
    return batch * n * per_token


def cache_bytes(
    config, seq_len: int, batch: int = 1, bytes_per_element: int = 2
) -> int:
    """Everything decoding keeps: :func:`kv_cache_bytes`, the linear
    layers' :func:`state_bytes` and the :func:`indexer_cache_bytes`."""
    kv = kv_cache_bytes(config, seq_len, batch, bytes_per_element)
    recurrent, conv = state_bytes(config, batch, bytes_per_element)
    return (
        kv + recurrent + conv + indexer_cache_bytes(config, seq_len, batch)
    )


def _budget(value):
    """A positive int (exact, any size) or a positive finite float, or a
    ``ValueError`` naming ``memory_bytes``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if not isinstance(value, (np.integer, np.floating)):
            raise ValueError(
                f"memory_bytes must be a positive number, got {value!r}"
            )
        value = value.item()
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(
                f"memory_bytes must be a positive number, got {value}"
            )
        return value
    return check_positive_number(value, "memory_bytes")


def _grows(cfg: ModelConfig) -> bool:
    """Whether the cache grows without bound with the context."""
    return bool(cfg.layer_counts.get(FULL)) or cfg.indexer is not None


def max_context(
    config, memory_bytes, batch: int = 1, bytes_per_element: int = 2
) -> int | None:
    """The longest context whose cache (:func:`cache_bytes`), for
    ``batch`` sequences, fits in ``memory_bytes`` (the cache alone:
    subtract the weights first).

    ``None`` when no layer grows without bound (every layer has a window,
    chunks or a fixed state) and the cache of full windows fits: the cache
    stops growing, so any context fits. 0 when not even the fixed states
    fit. ``memory_bytes`` may be any positive int (exact) or finite float.
    """
    cfg = get_model(config)
    budget = _budget(memory_bytes)
    check_count(batch, "batch", minimum=1)
    element_bytes(bytes_per_element)

    def fits(n: int) -> bool:
        return cache_bytes(cfg, n, batch, bytes_per_element) <= budget

    if not _grows(cfg):
        longest = max(
            cfg.window_of(kind) for kind in cfg.layer_counts
        )  # every window is an int here
        if fits(longest):
            return None
    if not fits(0):
        return 0
    lo, hi = 0, 1  # fits(lo), and (after the loop) not fits(hi)
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def weight_bytes(config, bytes_per_element: int = 2) -> int:
    """Bytes of the model's weights stored with ``bytes_per_element`` bytes
    each (2: fp16/bf16)."""
    cfg = get_model(config)
    b = check_count(bytes_per_element, "bytes_per_element")
    if cfg.n_params is None:
        raise ValueError(
            f"model {cfg.name!r} has no parameter count (n_params is "
            "None); from_hf_config reads attention shapes only"
        )
    return cfg.n_params * b


def max_concurrent_sequences(
    config,
    seq_len: int,
    memory_bytes: float = 80 * GB,
    bytes_per_element: int = 2,
) -> int:
    """How many sequences of ``seq_len`` tokens fit in the cache beside the
    weights.

    ``floor((memory_bytes - weight_bytes) / cache_bytes(seq_len))``, 0
    when the weights alone do not fit. Weights and cache use the same
    ``bytes_per_element``. An upper bound: activations, the framework's own
    buffers and fragmentation are left out (paged caches, Kwon et al. 2023,
    exist to bring the real number close to it).
    """
    seq_len = check_count(seq_len, "seq_len", minimum=1)
    memory_bytes = _budget(memory_bytes)
    free = memory_bytes - weight_bytes(config, bytes_per_element)
    if free <= 0:
        return 0
    return int(free // cache_bytes(config, seq_len, 1, bytes_per_element))
