"""Hugging Face, read in one place (chapter 10; appendix A1).

* :mod:`attn_np.hf.config`: the one reader of a ``config.json`` (the
  file, ``text_config``, older spellings, layer types, windows, RoPE);
  the KV calculator (:func:`attn_np.costs.from_hf_config`) and the layer
  builder both read through it;
* :mod:`attn_np.hf.families`: what each family's attention layer is,
  each written as a difference from the plain decoder (Llama), the way
  ``transformers``' ``modular_*.py`` files define a model;
* :mod:`attn_np.hf.families_gemma`: Gemma 3n and Gemma 4, whose last
  layers read the keys and values of earlier ones (``HFKVReader``);
* :mod:`attn_np.hf.fused`: the families whose q, k and v are one fused
  or ``Conv1D`` weight (GPT-2, BLOOM, MPT, Phi-3, ...), the orders of
  its rows and the spellings of their configuration classes;
* :mod:`attn_np.hf.keys`: every config key read, ignored or refused;
* :mod:`attn_np.hf.weights`: the state-dict maps, HF's names and layouts
  to the layers' ``params`` and back;
* :mod:`attn_np.hf.layers`: :func:`~attn_np.attention_from_hf` and the
  HF decoder layers it builds, and :func:`fixture_errors`, the check
  against recorded ``transformers`` fixtures.

This ``__init__`` imports only the reader (the cost models read configs
through it without importing any layer); ``attn_np`` exports the
builder.
"""

from .config import (
    LAYER_TYPES,
    language_model,
    layer_types,
    load_config,
    parse_config_text,
    rope_parameters,
    windows,
)

__all__ = [
    "LAYER_TYPES",
    "language_model",
    "layer_types",
    "load_config",
    "parse_config_text",
    "rope_parameters",
    "windows",
]
