"""What the key/value cache of real models costs (chapters 3, 4, 7, 8).

During decoding every layer keeps the keys and the values of every position
it has seen. Per token that is ``n_kv_heads * head_dim`` numbers for the keys
and as many for the values, in each of ``n_layers`` layers::

    kv_bytes_per_token = n_layers * n_kv_heads * (d_k + d_v) * bytes
                       = 2 * n_layers * n_kv_heads * head_dim * bytes
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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .._checks import check_count, check_positive_number

GB = 10**9  # a decimal gigabyte, the unit of data sheets ("80 GB")
GiB = 2**30  # a binary gibibyte, the unit the book prints with

SLIDING, FULL = "sliding_attention", "full_attention"  # HF's layer types


@dataclass(frozen=True)
class ModelConfig:
    """The attention shapes of one released model, and where they come from.

    ``n_kv_heads`` is the document's number of groups ``n_g``: ``n_kv_heads
    == n_heads`` is MHA, ``1`` is MQA, anything in between GQA. ``n_params``
    counts every distinct weight once (an embedding tied to the output layer
    counts once); it is computed from the same configuration file and is what
    "the weights" means when we ask how much memory is left for the cache
    (``None`` when unknown, as for :func:`from_hf_config`).

    Windows: ``sliding_window`` is the window ``W`` of the window layers and
    ``layer_types`` says which layers have it, in Hugging Face's words
    (``"sliding_attention"`` or ``"full_attention"``, one per layer); with a
    window and no ``layer_types`` every layer has the window.

    Latent cache (MLA): ``d_latent_kv`` and ``d_rope`` are what a token
    leaves in each layer's cache; ``head_dim`` is then the per-head
    dimension of the keys rebuilt from the latent, ``d_head_v`` that of the
    values (``None``: ``head_dim``) and ``d_latent_q`` the query latent
    (``None``: queries are not compressed).
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

    def __post_init__(self):
        counts = ["n_layers", "n_heads", "n_kv_heads", "head_dim"]
        counts += ["d_model"]
        optional = ["n_params", "sliding_window", "d_latent_kv", "d_rope"]
        optional += ["d_latent_q", "d_head_v"]
        for field in counts + optional:
            value = getattr(self, field)
            if value is None and field in optional:
                continue
            try:
                check_count(value, field)
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
        if self.layer_types is not None:
            types = tuple(self.layer_types)
            object.__setattr__(self, "layer_types", types)
            if len(types) != self.n_layers or set(types) - {SLIDING, FULL}:
                raise ValueError(
                    f"layer_types must list {self.n_layers} entries (one "
                    f"per layer), each {SLIDING!r} or {FULL!r}, got "
                    f"{len(types)}: {sorted(set(types))} "
                    f"(model {self.name!r})"
                )
            if SLIDING in types and self.sliding_window is None:
                raise ValueError(
                    f"layer_types has {SLIDING!r} layers but "
                    f"sliding_window is None (model {self.name!r})"
                )

    @property
    def family(self) -> str:
        """``"MHA"``, ``"GQA"``, ``"MQA"`` (the keys of
        :data:`attn_np.instruments.plotting.FAMILY_COLOURS`) or ``"MLA"``."""
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
        """Numbers one token adds to one layer's cache: ``2 * n_kv_heads *
        head_dim`` (a key and a value), or ``d_latent_kv + d_rope``."""
        if self.d_latent_kv is not None:
            return self.d_latent_kv + self.d_rope
        return 2 * self.n_kv_heads * self.head_dim

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's window ``W``, or ``None`` for full attention."""
        if self.sliding_window is None:
            return (None,) * self.n_layers
        if self.layer_types is None:
            return (self.sliding_window,) * self.n_layers
        w = self.sliding_window
        return tuple(w if t == SLIDING else None for t in self.layer_types)

    @property
    def n_window_layers(self) -> int:
        """How many layers have a window."""
        return sum(w is not None for w in self.layer_windows)

    @property
    def kind(self) -> str:
        """The family, and the window layers if there are any."""
        k = self.n_window_layers
        if k == 0:
            return self.family
        where = (
            "every layer"
            if k == self.n_layers
            else (f"{k} of {self.n_layers} layers")
        )
        return f"{self.family}, window {self.sliding_window} in {where}"

    def without_windows(self) -> ModelConfig:
        """The same model with full attention in every layer."""
        return dataclasses.replace(
            self,
            name=f"{self.name} (full attention)",
            sliding_window=None,
            layer_types=None,
        )


def _alternate(n_layers: int, every: int) -> tuple[str, ...]:
    """Hugging Face's rule: layer ``i`` is full iff ``(i + 1) % every ==
    0``, a window layer otherwise (``every=2``: window, full, window...)."""
    return tuple(
        FULL if (i + 1) % every == 0 else SLIDING for i in range(n_layers)
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


def kv_bytes_per_token(config, bytes_per_element: int = 2) -> int:
    """Bytes the cache grows by for each token, in every layer:
    ``n_layers * kv_numbers_per_layer * bytes``.

    That is ``n_layers * n_kv_heads * (d_k + d_v) * bytes``, which is
    ``2 * n_layers * n_kv_heads * head_dim * bytes`` when keys and values
    share ``head_dim = d_k = d_v``, or
    ``n_layers * (d_latent_kv + d_rope) * bytes`` for a latent cache. A
    window layer stops growing once its window is full: this is the rate
    before then. ``bytes_per_element`` is 2 for fp16/bf16, 1 for an 8-bit
    cache.
    """
    cfg = get_model(config)
    b = check_count(bytes_per_element, "bytes_per_element", minimum=1)
    return cfg.n_layers * cfg.kv_numbers_per_layer * b


def cached_positions(config, seq_len: int) -> int:
    """Positions held after ``seq_len`` tokens, summed over the layers.

    ``seq_len`` for a full-attention layer, ``min(seq_len, W)`` for a layer
    with a window of ``W``.
    """
    cfg = get_model(config)
    n = check_count(seq_len, "seq_len", minimum=0)
    return sum(n if w is None else min(n, w) for w in cfg.layer_windows)


def kv_cache_bytes(
    config, seq_len: int, batch: int = 1, bytes_per_element: int = 2
) -> int:
    """Bytes of the cache of ``batch`` sequences of ``seq_len`` tokens, all
    layers: ``batch * cached_positions * kv_numbers_per_layer * bytes``.

    Without windows that is ``kv_bytes_per_token * seq_len * batch``.
    """
    cfg = get_model(config)
    b = check_count(bytes_per_element, "bytes_per_element", minimum=1)
    positions = cached_positions(cfg, seq_len)
    batch = check_count(batch, "batch", minimum=1)
    return batch * positions * cfg.kv_numbers_per_layer * b


def max_context(
    config, memory_bytes, batch: int = 1, bytes_per_element: int = 2
) -> int | None:
    """The longest context whose cache, for ``batch`` sequences, fits in
    ``memory_bytes`` (the cache alone: subtract the weights first).

    ``None`` when every layer has a window and the cache of full windows
    fits: the cache stops growing, so any context fits.
    """
    cfg = get_model(config)
    budget = check_positive_number(memory_bytes, "memory_bytes")

    def fits(n: int) -> bool:
        return kv_cache_bytes(cfg, n, batch, bytes_per_element) <= budget

    windows = cfg.layer_windows
    if all(w is not None for w in windows) and fits(max(windows)):
        return None
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
    b = check_count(bytes_per_element, "bytes_per_element", minimum=1)
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

    ``floor((memory_bytes - weight_bytes) / kv_cache_bytes(seq_len))``, 0
    when the weights alone do not fit. Weights and cache use the same
    ``bytes_per_element``. An upper bound: activations, the framework's own
    buffers and fragmentation are left out (paged caches, Kwon et al. 2023,
    exist to bring the real number close to it).
    """
    seq_len = check_count(seq_len, "seq_len", minimum=1)
    memory_bytes = check_positive_number(memory_bytes, "memory_bytes")
    free = memory_bytes - weight_bytes(config, bytes_per_element)
    if free <= 0:
        return 0
    return int(free // kv_cache_bytes(config, seq_len, 1, bytes_per_element))
