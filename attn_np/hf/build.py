"""Any Hugging Face model's attention layer, from its ``config.json``
(chapter 10).

:func:`attention_from_hf` reads a config (a path, a folder or a dict; a
multimodal config's ``text_config``) with :mod:`attn_np.hf.config`, picks
layer ``layer_idx``'s family and type with :mod:`attn_np.hf.families`
(sliding or full, chunked, NoPE, Qwen3-Next's linear attention) and
builds that layer (chapter 10's :class:`~attn_np.refinements.
RefinedAttention` with the layer's details, chapter 7's MLA for DeepSeek,
chapter 13's sparse MLA for DeepSeek-V3.2, chapter 12's Gated DeltaNet
for a ``linear_attention`` layer; :func:`attention_layers_from_hf` builds
them all). ``state_dict`` (HF's names without the
``model.layers.{i}.self_attn.`` prefix, ``nn.Linear`` weights ``[out,
in]``) fills its weights through :mod:`attn_np.hf.weights`. The layer's
``to_hf(d)`` maps a dict in the layer's keys (``params`` or ``grads``)
back to HF's names and layout, so gradients compare name by name.

A key it does not understand, or a RoPE scaling it does not implement, is
a ``ValueError`` naming it: never a guess. Checked against HF
``transformers`` 5.24.0 in ``tests/test_from_hf.py``
(:func:`fixture_errors`).

A checkpoint on disk loads without PyTorch: ``safetensors.numpy.load_file``
reads a shard as NumPy arrays (``safetensors`` is not a requirement of this
library); keep the keys that start with ``model.layers.{i}.self_attn.``,
strip that prefix, and pass them as ``state_dict``.
"""

from __future__ import annotations

import json

import numpy as np

from ..shared_kv import shared_kv
from .config import count, language_model, load_config
from .families import layer_settings
from .families_more import _respell
from .kimi import _kda_from_hf, _kda_to_hf
from .weights import linear_to_hf, load_linear, load_state, to_hf


def attention_from_hf(
    config, layer_idx=0, state_dict=None, dtype=np.float64
):
    """Layer ``layer_idx``'s attention of a Hugging Face model.

    Families: Llama (2, 3.0), Mistral, Qwen2/2.5, Qwen3, Gemma 2, Gemma 3,
    OLMo 2, gpt-oss, DeepSeek-V2/V3 (MLA, on chapter 7's layer), Falcon
    (MQA, ``new_decoder_architecture``, ALiBi), DeepSeek-V3.2 (MLA with
    chapter 13's lightning indexer and top-k: ``index_n_heads``,
    ``index_head_dim``, ``index_topk``), Qwen3-Next (its
    ``linear_attention`` layers are chapter 12's Gated DeltaNet, its
    weights read by ``gated_deltanet_from_hf``; ``kv_cache`` is then a
    ``StateCache``; Qwen3.5's the same, with its projections split;
    OLMo Hybrid's with each its own and ``beta`` doubled),
    Kimi Linear (chapter 12's Kimi Delta Attention and MLA without RoPE:
    ``attn_np.hf.kimi``),
    Llama 4's attention (chunked and NoPE layers) and more decoder
    families, each a small difference from Llama's layer
    (``attn_np.hf.families.FAMILIES``: Mixtral, Gemma, OLMo 3, SmolLM3,
    Granite, Cohere 2, ERNIE 4.5, GLM-4, ...; in
    ``attn_np.hf.families_more``: OPT, GPT-J, GPT-Neo, Phi, nanochat,
    Granite SWA, the attention layers of Bamba, Jamba, Granite 4,
    Nemotron-H and Falcon-H1, MLA
    under GLM-4.7-Flash, Youtu, Sarvam and MiniCPM3); the families whose
    q, k and v are one fused or ``Conv1D`` weight (``attn_np.hf.fused``):
    Phi-3, GPT-2 and GPT-SW3, OpenAI GPT, GPT-BigCode, BLOOM and MPT
    (ALiBi), CodeGen, Persimmon (a LayerNorm per head on q and k);
    Gemma 3n and Gemma 4 (``attn_np.hf.families_gemma``: a layer of the
    last ``num_kv_shared_layers`` is a reader of an earlier layer's keys
    and values, :func:`attention_layers_from_hf` attaches it);
    MiMo-V2-Flash (``attn_np.hf.families_mimo``: values narrower than
    keys and scaled, sinks and twice the KV heads on window layers),
    Laguna (a softplus output gate, query heads per layer) and Beam (a
    gate bias per head, a query scale on its NoPE layers). RoPE
    as ``rope_theta``/``rope_scaling``/``partial_rotary_factor`` at the
    top level or under ``rope_parameters`` (transformers 5; per layer type
    for Gemma 3); ``rope_type`` ``default``, ``linear``, and chapter 11's
    ``llama3`` and ``yarn`` (Llama 3.1, gpt-oss, DeepSeek-V3: the factor
    on cos/sin, and ``mscale_all_dim`` in MLA's softmax scale). The layer's
    ``forward(x, kv_cache=layer.new_cache())`` continues positions from the
    cache.
    """
    cls, args, kw, layout = layer_settings(config, layer_idx)
    layer = cls(*args, dtype=dtype, **kw)
    layer.hf_layout = layout
    if layout["kind"] == "kda":  # Kimi Linear's linear_attention
        layer.to_hf = lambda d: _kda_to_hf(layer, d)
        if state_dict is not None:
            _kda_from_hf(layer, state_dict, dtype)
        return layer
    if layout["kind"] == "linear":
        layer.to_hf = lambda d: linear_to_hf(layer, d)
        if state_dict is not None:
            load_linear(layer, layout, state_dict, dtype)
        return layer
    layer.to_hf = lambda d: to_hf(layout, layer, d)
    if state_dict is not None:
        load_state(layer, layout, state_dict, dtype)
    return layer


def attention_layers_from_hf(config, state_dicts=None, dtype=np.float64):
    """Every layer's attention of a Hugging Face model, in order: one
    :func:`attention_from_hf` per layer of ``num_hidden_layers`` (a hybrid
    model such as Qwen3-Next mixes Gated DeltaNet and attention layers).
    ``state_dicts`` is None (random weights) or a sequence with one state
    dict per layer (HF's names without the layer's module prefix).

    A layer that reads another's keys and values (Gemma 3n's and Gemma
    4's last ``num_kv_shared_layers``: a :class:`~attn_np.shared_kv.
    KVReader`) has that layer attached as its ``producer``: after the
    producer's forward, ``reader.forward(x)`` reads its keys; decoding,
    ``reader.forward(x_chunk, kv_cache=c)`` with ``c`` the producer's
    cache; its ``backward`` leaves ``dkv`` for ``producer.backward(dy,
    dkv=...)``, summed over the producer's readers."""
    data, _, _ = load_config(config)
    cfg = language_model(data)
    cfg = _respell(cfg, cfg.get("model_type"))  # XGLM's num_layers, ...
    n = count(cfg, "num_hidden_layers")
    if state_dicts is not None and len(state_dicts) != n:
        raise ValueError(
            f"state_dicts must have one entry per layer "
            f"(num_hidden_layers={n}), got {len(state_dicts)}"
        )
    layers = [
        attention_from_hf(
            cfg,
            i,
            None if state_dicts is None else state_dicts[i],
            dtype=dtype,
        )
        for i in range(n)
    ]
    for layer in layers:  # Gemma 3n's, Gemma 4's readers: their producer
        source = getattr(layer, "kv_source", None)
        if source is not None:
            layer.producer = layers[source]
    return layers


def fixture_errors(path, layer_idx=0):
    """Compare ``attention_from_hf`` with a reference fixture.

    ``path`` is one of ``tests/fixtures/*.npz`` (written by
    ``scripts/record_hf_fixtures.py``: HF's config, the layer's state
    dict, an input ``x``, HF's output, the gradients of ``sum(out * dy)``
    and a chunked decode, compared with HF's forward when HF's class has
    no cache). Returns ``{"forward": e, "grad x": e,
    "grad NAME": e, ..., "decode": e}``, each the largest absolute error
    divided by the reference's largest entry.
    """
    f = np.load(path)
    config = json.loads(str(f["config"]))
    meta = json.loads(str(f["meta"]))
    i = layer_idx
    source = meta.get("readers", {}).get(str(i))
    if source is not None:  # Gemma 3n's, Gemma 4's shared layers
        return _reader_errors(f, config, i, source)
    layer = attention_from_hf(config, i, state_dict=_state(f, i))
    x = f["x"]
    errors = {"forward": _err(layer.forward(x), f[f"layer{i}.out"])}
    errors["grad x"] = _err(layer.backward(f["dy"]), f[f"layer{i}.grad.x"])
    grads = layer.to_hf(layer.grads)
    gpre = f"layer{i}.grad."
    want = {k[len(gpre) :] for k in f.files if k.startswith(gpre)} - {"x"}
    if set(grads) != want:  # every parameter but V3.2's indexer (no_grad)
        raise ValueError(
            f"gradients {sorted(grads)} do not match the fixture's "
            f"{sorted(want)}"
        )
    for name, g in grads.items():
        errors[f"grad {name}"] = _grad_error(f, i, name, g)
    if getattr(layer, "bidirectional", False):  # an encoder: no decode
        return errors
    cache, outs, start = layer.new_cache(), [], 0
    L = x.shape[1]  # no recorded chunks: half the input, then one by one
    for c in meta["chunks"] or [L // 2] + [1] * (L - L // 2):
        outs.append(layer.forward(x[:, start : start + c], kv_cache=cache))
        start += c
    y = np.concatenate(outs, axis=1)
    # HF's class without a cache (OpenAI GPT): the decode must give the
    # forward HF recorded
    key = f"layer{i}.decode.out"
    errors["decode"] = _err(y, f[key if key in f.files else f"layer{i}.out"])
    return errors


def _state(f, i):
    """Layer ``i``'s state dict in the fixture ``f``."""
    pre = f"layer{i}.param."
    return {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}


def _err(a, b):
    """The largest absolute error over the reference's largest entry."""
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _reader_errors(f, config, r, p):
    """:func:`fixture_errors` of layer ``r``, which reads producer ``p``'s
    keys and values: the producer run on its recorded input ``xp``, the
    reader on ``x``; the reader's output and gradients, those it sends
    to the shared keys and values (``grad shared.k``, ``.v``) and, after
    the producer's backward with them, to the producer's input and
    weights (``grad producer.*``); then the chunked decode, the reader
    over the producer's cache."""
    prod = attention_from_hf(config, p, state_dict=_state(f, p))
    reader = attention_from_hf(config, r, state_dict=_state(f, r))
    x, xp, g = f["x"], f[f"layer{r}.xp"], f"layer{r}.grad."
    prod.forward(xp)
    kv = shared_kv(prod)
    errors = {"forward": _err(reader.forward(x, kv), f[f"layer{r}.out"])}
    errors["grad x"] = _err(reader.backward(f["dy"]), f[g + "x"])
    grads = reader.to_hf(reader.grads)
    dk, dv = reader.dkv
    grads.update({"shared.k": dk, "shared.v": dv})
    grads["producer.x"] = prod.backward(np.zeros_like(xp), dkv=reader.dkv)
    theirs = prod.to_hf(prod.grads)
    grads.update({f"producer.{k}": a for k, a in theirs.items()})
    want = {k[len(g) :] for k in f.files if k.startswith(g)} - {"x"}
    if not want <= set(grads):
        raise ValueError(
            f"gradients {sorted(grads)} do not cover the fixture's "
            f"{sorted(want)}"
        )
    for name in sorted(want):
        errors[f"grad {name}"] = _err(grads[name], f[g + name])
    cache, outs, start = prod.new_cache(), [], 0
    for c in json.loads(str(f["meta"]))["chunks"]:
        prod.forward(xp[:, start : start + c], kv_cache=cache)
        outs.append(reader.forward(x[:, start : start + c], kv_cache=cache))
        start += c
    y = np.concatenate(outs, axis=1)
    errors["decode"] = _err(y, f[f"layer{r}.decode.out"])
    return errors


def _grad_error(f, i, name, g):
    """Layer ``i``'s gradient ``name`` against the fixture ``f``: the
    largest absolute error over the reference's largest entry. A bias
    whose reference is rounding (below 1e-8 of its weight's gradient) is
    measured on the scale of that weight's gradient instead: in a NoPE
    layer the key bias adds a constant to each row of scores, which the
    softmax drops, so its gradient is zero."""
    ref = f[f"layer{i}.grad.{name}"]
    weight = f"layer{i}.grad.{name[: -len('bias')]}weight"
    scale = np.max(np.abs(ref))
    if name.endswith(".bias") and weight in f.files:
        w_scale = np.max(np.abs(f[weight]))
        if scale < 1e-8 * w_scale:
            scale = w_scale
    return float(np.max(np.abs(g - ref)) / scale)
