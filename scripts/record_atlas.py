"""Record appendix A2's atlas: what every causal-LM family in
``transformers`` puts in its attention, read from ``transformers`` itself.

Runs only in the fixture environment (``scripts/requirements-fixtures.txt``),
like ``record_hf_fixtures.py``; the book reads what it writes
(``book/data/atlas.json``) with NumPy alone. Usage::

    python scripts/record_atlas.py               # every family
    python scripts/record_atlas.py llama gemma2  # these anew, the rest kept

For every model type with a causal-LM class (``MODEL_FOR_CAUSAL_LM_MAPPING``)
it keeps three things:

* the default config of the family's language model (the config class's
  own defaults, as ``to_dict()`` gives them; the text config of a
  multimodal wrapper), which ``attention_from_hf`` is asked about when the
  book is built;
* what the config says about attention, read through the config object
  (so HF's own aliases, ``n_head`` for ``num_attention_heads`` and so on,
  apply): heads, key/value heads, head size, RoPE type and base, partial
  rotary, layer types, window, chunk, soft-caps and score multipliers;
* what a tiny model of the family holds (2 layers, hidden 64, random
  weights, built on the CPU): the class and the parameter names and shapes
  of its first attention module, and the class of each layer of its cache
  after a forward with ``use_cache=True``. A family that does not build
  tiny says why.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import warnings
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "book" / "data" / "atlas.json"

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
)
ATTENTION_KEYS = (
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "query_pre_attn_scalar",
    "attention_multiplier",
    "attention_bias",
    "use_qk_norm",
    "qk_layernorm",
    "sliding_window",
    "attention_chunk_size",
    "partial_rotary_factor",
    "rotary_pct",
    "alibi",
    "position_embedding_type",
    "multi_query",
    "kv_lora_rank",
    "q_lora_rank",
    "num_kv_shared_layers",
    "use_bidirectional_attention",
    "no_rope_layers",
    "clip_qkv",
    "rotary_dim",
)
# words whose presence in a family's modeling file the atlas reports
# (a position scheme that no config key names: Bloom's ALiBi, XGLM's
# sinusoids)
SOURCE_WORDS = ("alibi", "sinusoid", "rotary", "relative_attention_bias")


def text_config(config):
    """The language model's config of a wrapper, else ``config``."""
    for name in ("text_config", "language_config", "llm_config"):
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            return sub
    return config


def plain(value):
    """JSON-safe: tuples to lists, other objects to their repr."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return repr(value)


def summary(cfg) -> dict:
    """What the config object says about attention (HF's aliases apply)."""

    def get(name):
        try:
            return plain(getattr(cfg, name))
        except Exception:  # noqa: BLE001 - an alias with no value
            return None

    heads = get("num_attention_heads")
    out = {
        "layers": get("num_hidden_layers"),
        "hidden": get("hidden_size"),
        "heads": heads,
        "kv_heads": get("num_key_value_heads"),
        "head_dim": get("head_dim"),
        "rope": get("rope_parameters") or get("rope_scaling"),
        "rope_theta": get("rope_theta"),
        "layer_types": dict(Counter(get("layer_types") or [])) or None,
        "is_encoder_decoder": bool(get("is_encoder_decoder")),
        "is_decoder": get("is_decoder"),
    }
    for key in ATTENTION_KEYS:
        value = get(key)
        if value not in (None, False):
            out[key] = value
    return out


# what a tiny model keeps of TINY, tried in turn: all of it; without the
# head sizes (latent and partial-rotary families size their heads
# themselves); only the depth and the vocabulary
TRIES = (
    tuple(TINY),
    tuple(k for k in TINY if k not in ("head_dim", "num_key_value_heads")),
    ("num_hidden_layers", "vocab_size", "max_position_embeddings"),
)


def source_words(model_type) -> list[str]:
    """Which of :data:`SOURCE_WORDS` the family's modeling file holds."""
    import importlib

    from transformers.models.auto import modeling_auto

    name = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    try:
        import transformers

        mod = importlib.import_module(getattr(transformers, name).__module__)
        text = Path(mod.__file__).read_text().lower()
    except Exception:  # noqa: BLE001 - no file to read
        return []
    return [w for w in SOURCE_WORDS if w in text]


def tiny_model(cls, model_type):
    """A tiny model of the family: ``(model, cfg)`` or raises the first
    try's error."""
    first = None
    for keys in TRIES:
        try:
            return _tiny_model(cls, model_type, keys)
        except Exception as err:  # noqa: BLE001 - the next try
            first = first or err
    raise first


def _tiny_model(cls, model_type, keys):
    import torch
    import transformers

    cfg = cls()
    target = text_config(cfg)
    wanted = {k: TINY[k] for k in keys}
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(target, key, None) is not None:
            wanted[key] = 0  # inside the tiny vocabulary
    for key, value in wanted.items():
        if hasattr(target, key) or key in getattr(
            target, "attribute_map", {}
        ):
            with contextlib.suppress(Exception):
                setattr(target, key, value)
    if getattr(target, "layer_types", None) is not None:
        with contextlib.suppress(Exception):
            target.layer_types = list(target.layer_types)[:2]
    from transformers.models.auto import modeling_auto

    name = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    model_cls = getattr(transformers, name)
    torch.manual_seed(0)
    model = model_cls(cfg).eval()
    return model, cfg


def attention_modules(model):
    """``[(path, module)]`` of the first decoder layer's attention-like
    modules (class names with "Attention", "Attn", "Mixer" or "DeltaNet")."""
    found = []
    for path, mod in model.named_modules():
        name = type(mod).__name__
        if any(
            w in name for w in ("Attention", "Attn", "Mixer", "DeltaNet")
        ) and not any(path.startswith(p + ".") for p, _ in found):
            found.append((path, mod))
    return found


@contextlib.contextmanager
def quiet():
    """No warnings and nothing printed: what a family says while it is
    built and run is not the record."""
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stderr(io.StringIO()),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        yield


def record_one(model_type, cls) -> dict:
    import torch

    row = {"model_type": model_type, "config_class": cls.__name__}
    try:
        cfg = cls()
    except Exception as err:  # noqa: BLE001
        row["error"] = f"default config: {type(err).__name__}: {err}"[:300]
        return row
    text = text_config(cfg)
    row["text_model_type"] = getattr(text, "model_type", model_type)
    row["wrapper"] = text is not cfg
    row["config"] = plain(text.to_dict())
    row["summary"] = summary(text)
    row["source_words"] = source_words(model_type)
    try:
        with quiet():
            model, _ = tiny_model(cls, model_type)
            mods = attention_modules(model)
            row["attention"] = [
                {
                    "path": path,
                    "class": type(mod).__name__,
                    "params": {
                        n: list(p.shape) for n, p in mod.named_parameters()
                    },
                }
                for path, mod in mods[:4]
            ]
            row["position_params"] = sorted(
                n
                for n, _ in model.named_parameters()
                if any(
                    w in n
                    for w in (
                        "wpe",
                        "embed_positions",
                        "position_embedding",
                        "pos_emb",
                        "positions_embed",
                    )
                )
            )
            row["attention_classes"] = sorted(
                {type(m).__name__ for _, m in mods}
            )
    except Exception as err:  # noqa: BLE001
        row["tiny_error"] = f"{type(err).__name__}: {err}"[:300]
        return row
    try:
        with quiet():
            ids = torch.randint(0, 64, (1, 5))
            with torch.no_grad():
                out = model(input_ids=ids, use_cache=True)
            cache = getattr(out, "past_key_values", None)
            layers = getattr(cache, "layers", None)
            row["cache"] = (
                type(cache).__name__ if cache is not None else None
            )
            if layers is not None:
                row["cache_layers"] = dict(
                    Counter(type(layer).__name__ for layer in layers)
                )
    except Exception as err:  # noqa: BLE001
        row["forward_error"] = f"{type(err).__name__}: {err}"[:300]
    return row


def isolated(fn, model_type, cls, seconds=120, extra=6 * 2**30) -> dict:
    """``fn(model_type, cls)`` in a forked child with at most ``extra``
    bytes more address space and ``seconds`` of time: a family whose
    defaults ask for gigabytes fails alone instead of taking the run."""
    import multiprocessing as mp
    import resource

    ctx = mp.get_context("fork")
    queue = ctx.Queue()

    def child():
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[0])
        limit = pages * resource.getpagesize() + extra
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            queue.put(fn(model_type, cls))
        except BaseException as err:  # noqa: BLE001 - MemoryError included
            queue.put(
                {
                    "model_type": model_type,
                    "config_class": cls.__name__,
                    "error": f"{type(err).__name__}: {err}"[:300],
                }
            )

    proc = ctx.Process(target=child)
    proc.start()
    try:
        row = queue.get(timeout=seconds)
    except Exception:  # noqa: BLE001 - queue.Empty: out of time
        row = {
            "model_type": model_type,
            "config_class": cls.__name__,
            "error": f"no answer within {seconds} s (killed)",
        }
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    return row


def main(argv) -> int:
    try:
        import transformers
        from transformers.models.auto.configuration_auto import (
            CONFIG_MAPPING,
        )
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        )
    except ImportError as err:
        print(
            f"record_atlas.py needs the fixture environment ({err}); see "
            "tests/fixtures/README.md",
            file=sys.stderr,
        )
        return 2
    transformers.logging.set_verbosity_error()
    only = set(argv)
    rows = []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if only and model_type not in only:
            continue
        try:
            cls = CONFIG_MAPPING[model_type]
        except KeyError:
            continue
        row = isolated(record_one, model_type, cls)
        rows.append(row)
        state = (row.get("tiny_error") or row.get("error") or "ok")[:60]
        print(f"{model_type:28s} {state}", flush=True)
    if only and OUT.exists():  # the families named, anew; the rest kept
        kept = json.loads(OUT.read_text())["families"]
        new = {row["model_type"]: row for row in rows}
        rows = [new.pop(r["model_type"], r) for r in kept] + list(
            new.values()
        )
        rows.sort(key=lambda row: row["model_type"])
    data = {
        "transformers": transformers.__version__,
        "families": rows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"{len(rows)} families -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
