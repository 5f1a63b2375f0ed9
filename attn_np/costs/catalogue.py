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
import json
import os
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


def _hf(repo: str) -> str:
    return f"config.json of {repo} on the Hugging Face Hub"


def _alternate(n_layers: int, every: int) -> tuple[str, ...]:
    """Hugging Face's rule: layer ``i`` is full iff ``(i + 1) % every ==
    0``, a window layer otherwise (``every=2``: window, full, window...)."""
    return tuple(
        FULL if (i + 1) % every == 0 else SLIDING for i in range(n_layers)
    )


# Real configurations. Each field was checked against the model's official
# config.json (num_hidden_layers, num_attention_heads, num_key_value_heads,
# hidden_size; head_dim = hidden_size / num_attention_heads) and, where the
# paper prints one, its architecture table. n_params is computed from the
# same file (embeddings, attention, MLP, norms, untied output layer where
# there is one) and matches the published counts (6.74B, 13.0B, 69.0B,
# 7.24B, 8.03B, 70.6B, 7.62B). Falcon-7B ties its output layer to the
# embedding, so it counts 6.92B distinct weights; listings that store the
# output layer separately show 7.22B.
#
# These eight are counted with a full cache, as chapters 3 and 4 do: the
# window that Mistral 7B v0.1 was trained with is left out of "mistral-7b"
# (the same model with its window is "mistral-7b-v0.1" in WINDOW_MODELS).
MODELS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in (
        ModelConfig(
            "llama-2-7b",
            n_layers=32,
            n_heads=32,
            n_kv_heads=32,
            head_dim=128,
            d_model=4096,
            n_params=6_738_415_616,
            source=_hf("meta-llama/Llama-2-7b-hf"),
            cite="touvron2023llama2",
        ),
        ModelConfig(
            "llama-2-13b",
            n_layers=40,
            n_heads=40,
            n_kv_heads=40,
            head_dim=128,
            d_model=5120,
            n_params=13_015_864_320,
            source=_hf("meta-llama/Llama-2-13b-hf"),
            cite="touvron2023llama2",
        ),
        ModelConfig(
            "llama-2-70b",
            n_layers=80,
            n_heads=64,
            n_kv_heads=8,
            head_dim=128,
            d_model=8192,
            n_params=68_976_648_192,
            source=_hf("meta-llama/Llama-2-70b-hf")
            + "; GQA for 34B and 70B: Touvron et al. 2023, Table 1",
            cite="touvron2023llama2",
        ),
        ModelConfig(
            "mistral-7b",
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            head_dim=128,
            d_model=4096,
            n_params=7_241_732_096,
            source=_hf("mistralai/Mistral-7B-v0.1")
            + "; Jiang et al. 2023, Table 1; counted without its"
            " 4096-token window (see mistral-7b-v0.1)",
            cite="jiang2023mistral",
        ),
        ModelConfig(
            "llama-3-8b",
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            head_dim=128,
            d_model=4096,
            n_params=8_030_261_248,
            source=_hf("meta-llama/Meta-Llama-3-8B")
            + "; Grattafiori et al. 2024, Table 3",
            cite="grattafiori2024llama3",
        ),
        ModelConfig(
            "llama-3-70b",
            n_layers=80,
            n_heads=64,
            n_kv_heads=8,
            head_dim=128,
            d_model=8192,
            n_params=70_553_706_496,
            source=_hf("meta-llama/Meta-Llama-3-70B")
            + "; Grattafiori et al. 2024, Table 3",
            cite="grattafiori2024llama3",
        ),
        ModelConfig(
            "qwen2.5-7b",
            n_layers=28,
            n_heads=28,
            n_kv_heads=4,
            head_dim=128,
            d_model=3584,
            n_params=7_615_616_512,
            source=_hf("Qwen/Qwen2.5-7B") + "; Qwen Team 2024, Table 1",
            cite="qwen2024qwen25",
        ),
        ModelConfig(
            "falcon-7b",
            n_layers=32,
            n_heads=71,
            n_kv_heads=1,
            head_dim=64,
            d_model=4544,
            n_params=6_921_720_704,
            source=_hf("tiiuae/falcon-7b")
            + " (num_hidden_layers 32, num_attention_heads 71, "
            "hidden_size 4544, multi_query true)",
            cite="almazrouei2023falcon",
        ),
    )
}

# Multi-head latent attention (chapter 7), from config.json: kv_lora_rank
# (d_latent_kv), qk_rope_head_dim (d_rope), qk_nope_head_dim (head_dim),
# v_head_dim (d_head_v), q_lora_rank (d_latent_q). n_params counts the main
# model (DeepSeek-V3's multi-token-prediction module, 14B more, is left
# out): 235.7B and 671.0B, the papers' 236B and 671B.
LATENT_MODELS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in (
        ModelConfig(
            "deepseek-v2",
            n_layers=60,
            n_heads=128,
            n_kv_heads=128,
            head_dim=128,
            d_model=5120,
            n_params=235_741_434_880,
            source=_hf("deepseek-ai/DeepSeek-V2")
            + "; DeepSeek-AI 2024, section 3.1.2",
            cite="deepseek2024v2",
            d_latent_kv=512,
            d_rope=64,
            d_latent_q=1536,
            d_head_v=128,
        ),
        ModelConfig(
            "deepseek-v3",
            n_layers=61,
            n_heads=128,
            n_kv_heads=128,
            head_dim=128,
            d_model=7168,
            n_params=671_026_419_200,
            source=_hf("deepseek-ai/DeepSeek-V3")
            + "; DeepSeek-AI 2024, section 4.2",
            cite="deepseek2024v3",
            d_latent_kv=512,
            d_rope=64,
            d_latent_q=1536,
            d_head_v=128,
        ),
    )
}

# Sliding windows (chapter 8), from config.json: sliding_window and
# layer_types, or the rule Hugging Face applies when layer_types is absent
# (Gemma 2: sliding_window_pattern 2, Gemma 3: 6; layer i is full iff
# (i + 1) % pattern == 0). n_params: 7.24B, 9.24B, 27.4B (Gemma 3's 27.0B
# language model and its 0.42B vision encoder), 116.8B, the published
# counts.
WINDOW_MODELS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in (
        ModelConfig(
            "mistral-7b-v0.1",
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            head_dim=128,
            d_model=4096,
            n_params=7_241_732_096,
            source=_hf("mistralai/Mistral-7B-v0.1")
            + " (sliding_window 4096, every layer); Jiang et al. 2023",
            cite="jiang2023mistral",
            sliding_window=4096,
        ),
        ModelConfig(
            "gemma-2-9b",
            n_layers=42,
            n_heads=16,
            n_kv_heads=8,
            head_dim=256,
            d_model=3584,
            n_params=9_241_705_984,
            source=_hf("google/gemma-2-9b")
            + " (sliding_window 4096, window and full layers"
            " alternating); Gemma Team 2024, Table 1",
            cite="gemmateam2024gemma2",
            sliding_window=4096,
            layer_types=_alternate(42, 2),
        ),
        ModelConfig(
            "gemma-3-27b",
            n_layers=62,
            n_heads=32,
            n_kv_heads=16,
            head_dim=128,
            d_model=5376,
            n_params=27_432_406_640,
            source=_hf("google/gemma-3-27b-it")
            + " (text_config: sliding_window 1024, five window layers"
            " per full layer); Gemma Team 2025, section 2",
            cite="gemmateam2025gemma3",
            sliding_window=1024,
            layer_types=_alternate(62, 6),
        ),
        ModelConfig(
            "gpt-oss-120b",
            n_layers=36,
            n_heads=64,
            n_kv_heads=8,
            head_dim=64,
            d_model=2880,
            n_params=116_829_156_672,
            source=_hf("openai/gpt-oss-120b")
            + " (sliding_window 128, layer_types window and full"
            " alternating); OpenAI 2025, section 2",
            cite="openai2025gptoss",
            sliding_window=128,
            layer_types=(SLIDING, FULL) * 18,
        ),
    )
}

#: Every model in the catalogue, by name.
CATALOGUE: dict[str, ModelConfig] = {
    **MODELS,
    **LATENT_MODELS,
    **WINDOW_MODELS,
}


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


# --- Reading a Hugging Face config.json --------------------------------

# Keys of configs whose cache this calculator does not model: it refuses
# them rather than return a wrong number.
_UNMODELLED = {
    "attention_chunk_size": "chunked attention (Llama 4)",
    "num_kv_shared_layers": "layers that share another layer's cache",
    "global_head_dim": "full layers with their own head dimension",
    "num_global_key_value_heads": "full layers with their own kv heads",
    "linear_attn_config": "linear-attention layers",
    "hybrid_override_pattern": "state-space (Mamba) layers",
    "attn_layer_period": "state-space (Mamba) layers",
}
# model_type -> which layers a sliding_window applies to when the config
# has neither layer_types nor sliding_window_pattern: Hugging Face's
# defaults in each model's configuration class.
_EVERY_LAYER = {"mistral", "mixtral"}
_PATTERN = {"gemma2": 2, "gpt_oss": 2, "gemma3": 6, "gemma3_text": 6}
_OFF_UNLESS_USED = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}
# Older spellings of a key (GPT-2 style names, Gemma 2's first release).
_ALIASES = {
    "num_hidden_layers": ("n_layer",),
    "num_attention_heads": ("n_head",),
    "hidden_size": ("n_embd",),
    "sliding_window": ("sliding_window_size",),
}


def _get(cfg: dict, key: str, *, required: bool = False):
    """``cfg[key]`` under any of its spellings (``None`` if absent); two
    spellings that disagree, or a required key that is absent, raise."""
    found = {k: cfg[k] for k in (key, *_ALIASES.get(key, ())) if k in cfg}
    values = {json.dumps(v) for v in found.values()}
    if len(values) > 1:
        got = ", ".join(f"{k}={v!r}" for k, v in found.items())
        raise ValueError(f"config is contradictory: {got}")
    value = next(iter(found.values()), None)
    if value is None and required:
        also = " or ".join(_ALIASES.get(key, ()))
        raise ValueError(
            f"config has no {key}" + (f" (nor {also})" if also else "")
        )
    return value


def _count(
    cfg: dict, key: str, *, required: bool = True, minimum: int = 1
) -> int | None:
    value = _get(cfg, key, required=required)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
    ):
        kind = "a non-negative" if minimum == 0 else "a positive"
        raise ValueError(
            f"config key {key} must be {kind} integer, got {value!r}"
        )
    return value


def _load(config) -> tuple[dict, str, str]:
    """The config as a dict, its default name and its source."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None
        stem = os.path.basename(path)
        name = stem[:-5] if stem.endswith(".json") else stem
        if name == "config":
            parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
            name = parent or name
        source = where = path
    elif isinstance(config, dict):
        data, where = config, "config"
        name = str(config.get("_name_or_path") or "hf-config")
        source = "a config.json given as a dict"
    else:
        raise ValueError(
            "config must be a path to a config.json or a dict, got "
            f"{type(config).__name__}"
        )
    if not isinstance(data, dict):
        raise ValueError(f"{where} must hold a JSON object")
    return data, name, source


def _language_model(data: dict) -> dict:
    """The part of the config that describes the language model: the whole
    config, or its ``text_config`` (multimodal models)."""
    text = data.get("text_config")
    if text is None:
        return data
    if not isinstance(text, dict):
        raise ValueError(
            f"config key text_config must be an object, got {text!r}"
        )
    for key in (
        "num_hidden_layers",
        "num_attention_heads",
        "head_dim",
        "num_key_value_heads",
        "sliding_window",
        "layer_types",
        "kv_lora_rank",
    ):
        if key in data and key in text and data[key] != text[key]:
            raise ValueError(
                f"config is contradictory: {key}={data[key]!r} at the top "
                f"and {text[key]!r} in text_config"
            )
    text = dict(text)
    text.setdefault("model_type", data.get("model_type"))
    return text


def _kv_heads(cfg: dict, n_heads: int) -> int:
    """``num_key_value_heads`` (absent: MHA), or Falcon's ``multi_query``,
    ``new_decoder_architecture`` and ``num_kv_heads``."""
    kv = _count(cfg, "num_key_value_heads", required=False)
    if cfg.get("new_decoder_architecture"):
        falcon = _count(cfg, "num_kv_heads", required=False) or n_heads
    elif cfg.get("multi_query"):
        falcon = 1
    else:
        falcon = _count(cfg, "num_kv_heads", required=False)
    if kv is not None and falcon is not None and kv != falcon:
        raise ValueError(
            f"config is contradictory: num_key_value_heads={kv} but "
            "multi_query, new_decoder_architecture and num_kv_heads say "
            f"{falcon}"
        )
    kv = kv or falcon or n_heads
    if n_heads % kv:
        raise ValueError(
            f"num_attention_heads={n_heads} is not a multiple of the "
            f"number of key/value heads, {kv}"
        )
    return kv


def _windows(cfg: dict, n_layers: int):
    """``(sliding_window, layer_types)`` as :class:`ModelConfig` takes
    them."""
    window = _count(cfg, "sliding_window", required=False)
    types = cfg.get("layer_types")
    pattern = _count(cfg, "sliding_window_pattern", required=False)
    use = cfg.get("use_sliding_window")
    model_type = cfg.get("model_type")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise ValueError(
                f"config key layer_types must list {n_layers} layer types "
                f"(num_hidden_layers), got {types!r}"
            )
        bad = sorted(set(map(str, types)) - {SLIDING, FULL})
        if bad:
            raise ValueError(
                f"config key layer_types has {bad}: this calculator "
                f"knows {SLIDING!r} and {FULL!r} only"
            )
        types = tuple(types)
        if pattern is not None and types != _alternate(n_layers, pattern):
            raise ValueError(
                "config is contradictory: layer_types does not follow "
                f"sliding_window_pattern={pattern}"
            )
    if use is False:  # Qwen2: a window size is written, and not used
        if types is not None and SLIDING in types:
            raise ValueError(
                "config is contradictory: use_sliding_window is false but "
                f"layer_types has {SLIDING!r} layers"
            )
        return None, None
    if window is None:
        if (types is not None and SLIDING in types) or pattern or use:
            raise ValueError(
                "config asks for window layers (layer_types, "
                "sliding_window_pattern or use_sliding_window) but has "
                "no sliding_window"
            )
        return None, None
    if types is not None:
        return window, types
    if pattern is not None:
        return window, _alternate(n_layers, pattern)
    if use is True:  # Qwen2: layers from max_window_layers on
        first = _count(cfg, "max_window_layers", minimum=0)
        return window, tuple(
            SLIDING if i >= first else FULL for i in range(n_layers)
        )
    if model_type in _PATTERN:
        return window, _alternate(n_layers, _PATTERN[model_type])
    if model_type in _EVERY_LAYER:
        return window, None
    if model_type in _OFF_UNLESS_USED:
        return None, None
    raise ValueError(
        f"config has sliding_window={window} but says neither which "
        "layers use it (layer_types, sliding_window_pattern, "
        "use_sliding_window) nor a model_type whose rule is known "
        f"({', '.join(sorted(_EVERY_LAYER | set(_PATTERN)))}); got "
        f"model_type={model_type!r}"
    )


def from_hf_config(config, name: str | None = None) -> ModelConfig:
    """A :class:`ModelConfig` read from a Hugging Face ``config.json``.

    ``config`` is a path (to the file, or to a folder holding it) or the
    parsed dict. What it reads:

    * ``num_hidden_layers``, ``num_attention_heads``, ``hidden_size``;
      ``num_key_value_heads`` (absent: MHA; Falcon's ``multi_query`` and
      ``num_kv_heads`` too); ``head_dim`` (absent: ``hidden_size //
      num_attention_heads``);
    * a multimodal config's ``text_config``, which holds the language
      model;
    * ``kv_lora_rank`` and ``qk_rope_head_dim`` (MLA): a latent cache;
    * windows: ``sliding_window`` with ``layer_types``, or
      ``sliding_window_pattern`` (every n-th layer full), or the rule of the
      ``model_type`` (Mistral: every layer; Gemma 2, gpt-oss: every other);
      Qwen2's ``use_sliding_window: false`` means no window at all.

    A missing or contradictory key raises a ``ValueError`` naming it; so
    does a feature that changes the cache in a way not modelled here. The
    result has ``n_params=None``: weights are not counted.
    """
    data, default_name, source = _load(config)
    cfg = _language_model(data)
    for key, what in _UNMODELLED.items():
        if cfg.get(key):
            raise ValueError(
                f"config key {key}={cfg[key]!r} ({what}) changes the cache "
                "in a way this calculator does not model"
            )
    n_layers = _count(cfg, "num_hidden_layers")
    n_heads = _count(cfg, "num_attention_heads")
    d_model = _count(cfg, "hidden_size")
    n_kv = _kv_heads(cfg, n_heads)
    latent = {}
    if cfg.get("kv_lora_rank") is not None:
        latent = dict(
            d_latent_kv=_count(cfg, "kv_lora_rank"),
            d_rope=_count(cfg, "qk_rope_head_dim"),
            d_latent_q=_count(cfg, "q_lora_rank", required=False),
            d_head_v=_count(cfg, "v_head_dim", required=False),
        )
        head_dim = _count(cfg, "qk_nope_head_dim")
    elif cfg.get("qk_rope_head_dim") is not None:
        raise ValueError(
            "config has qk_rope_head_dim but no kv_lora_rank: a latent "
            "cache needs both"
        )
    else:
        head_dim = _count(cfg, "head_dim", required=False)
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(
                    "config has no head_dim, and hidden_size="
                    f"{d_model} is not a multiple of "
                    f"num_attention_heads={n_heads}"
                )
            head_dim = d_model // n_heads
    window, types = _windows(cfg, n_layers)
    return ModelConfig(
        name or default_name,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        d_model=d_model,
        n_params=None,
        source=source,
        cite="",
        sliding_window=window,
        layer_types=types,
        **latent,
    )
