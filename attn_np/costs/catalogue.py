"""What the key/value cache of real models costs (chapters 3 and 4).

During decoding every layer keeps the keys and the values of every position
it has seen. Per token that is ``n_kv_heads * head_dim`` numbers for the keys
and as many for the values, in each of ``n_layers`` layers::

    kv_bytes_per_token = 2 * n_layers * n_kv_heads * head_dim * bytes
    kv_cache_bytes     = kv_bytes_per_token * seq_len * batch

(``bytes`` per element: 2 for float16 and bfloat16.)

``n_heads`` does not appear: the cache shrinks with the number of key/value
heads, which is what multi-query (Shazeer 2019) and grouped-query attention
(Ainslie et al. 2023) change.

Units. Memory sizes of accelerators are sold in decimal gigabytes, ``GB =
10**9`` bytes; the book prints sizes in binary units, ``GiB = 2**30`` bytes
(7.4 % more). Both constants are here so that no calculation has to guess
which one was meant.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from .._checks import check_count

# : a decimal gigabyte, the unit of accelerator data sheets ("80 GB")
GB = 10**9
GiB = 2**30  #: a binary gibibyte, the unit the book prints with


@dataclass(frozen=True)
class ModelConfig:
    """The attention shapes of one released model, and where they come from.

    ``n_kv_heads`` is the document's number of groups ``n_g``: ``n_kv_heads
    == n_heads`` is MHA, ``1`` is MQA, anything in between GQA. ``n_params``
    counts every distinct weight once (an embedding tied to the output layer
    counts once); it is computed from the same configuration file and is what
    "the weights" means when we ask how much memory is left for the cache.
    """

    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    n_params: int
    # the official configuration file (repository and file) and the paper's
    # table
    source: str
    cite: str  # key in book/references.bib
    # attention window, if the model was trained with one
    sliding_window: int | None = None

    def __post_init__(self):
        for field in (
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "d_model",
            "n_params",
        ):
            value = getattr(self, field)
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

    @property
    def family(self) -> str:
        """``"MHA"``, ``"GQA"`` or ``"MQA"`` (the keys of
        :data:`attn_np.instruments.plotting.FAMILY_COLOURS`)."""
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    @property
    def group_size(self) -> int:
        """Query heads per key/value head, ``n_heads // n_kv_heads``."""
        return self.n_heads // self.n_kv_heads


def _hf(repo: str) -> str:
    return f"config.json of {repo} on the Hugging Face Hub"


# : Real configurations. Each field was checked against the model's official
# ``config.json`` : (``num_hidden_layers``, ``num_attention_heads``,
# ``num_key_value_heads``, ``hidden_size``; head_dim : = hidden_size /
# num_attention_heads) and, where the paper prints one, its architecture
# table. : ``n_params`` is computed from the same file (embeddings,
# attention, MLP, norms, untied output : layer where there is one) and
# matches the published counts (6.74B, 13.0B, 69.0B, 7.24B, 8.03B, : 70.6B,
# 7.62B). Falcon-7B ties its output layer to the embedding, so it counts
# 6.92B distinct : weights; listings that store the output layer separately
# show 7.22B.
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
            + "; Jiang et al. 2023, Table 1",
            cite="jiang2023mistral",
            sliding_window=4096,
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
            + (
                " (n_layer 32, n_head 71, hidden_size 4544, multi_query "
                "true)"
            ),
            cite="almazrouei2023falcon",
        ),
    )
}


def get_model(config) -> ModelConfig:
    """``config`` itself, or the entry of :data:`MODELS` it names."""
    if isinstance(config, ModelConfig):
        return config
    if isinstance(config, str):
        if config not in MODELS:
            raise ValueError(
                f"config {config!r} is not in MODELS; known models: "
                f"{', '.join(MODELS)}"
            )
        return MODELS[config]
    raise ValueError(
        "config must be a ModelConfig or the name of one in MODELS, got "
        f"{type(config).__name__}"
    )


def kv_bytes_per_token(config, bytes_per_element: int = 2) -> int:
    """Bytes the cache grows by for each token: ``2 * n_layers * n_kv_heads *
    head_dim * bytes``.

    The 2 is one key and one value. ``bytes_per_element`` is 2 for fp16/bf16,
    1 for an 8-bit cache.
    """
    cfg = get_model(config)
    b = check_count(bytes_per_element, "bytes_per_element", minimum=1)
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * b


def kv_cache_bytes(
    config, seq_len: int, batch: int = 1, bytes_per_element: int = 2
) -> int:
    """Bytes of the keys and values of ``batch`` sequences of ``seq_len``
    tokens, all layers."""
    per_token = kv_bytes_per_token(config, bytes_per_element)
    seq_len = check_count(seq_len, "seq_len", minimum=0)
    batch = check_count(batch, "batch", minimum=1)
    return per_token * seq_len * batch


def weight_bytes(config, bytes_per_element: int = 2) -> int:
    """Bytes of the model's weights stored with ``bytes_per_element`` bytes
    each (2: fp16/bf16)."""
    cfg = get_model(config)
    return cfg.n_params * check_count(
        bytes_per_element, "bytes_per_element", minimum=1
    )


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
    if (
        isinstance(memory_bytes, bool)
        or not isinstance(memory_bytes, numbers.Real)
        or not memory_bytes > 0
    ):
        raise ValueError(
            "memory_bytes must be a positive number of bytes, got "
            f"{memory_bytes!r}"
        )
    free = memory_bytes - weight_bytes(config, bytes_per_element)
    if free <= 0:
        return 0
    return int(free // kv_cache_bytes(config, seq_len, 1, bytes_per_element))
