"""Appendix A2's atlas: one row per causal-LM family of ``transformers``.

``scripts/record_atlas.py`` (the fixture environment) reads every family
from ``transformers`` itself into ``book/data/atlas.json``: its default
config, what the config object says about attention, and what a tiny model
holds (the first attention module's parameters, its cache's layers). This
module turns that record into the atlas's columns with NumPy alone, and
asks :func:`~attn_np.hf.families.layer_settings` (what
:func:`~attn_np.attention_from_hf` would build, without building it)
about each family's default config when the book is built.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from ..hf.families import layer_settings

ROOT = Path(__file__).resolve().parents[2]
ATLAS = ROOT / "book" / "data" / "atlas.json"

KINDS = (
    "decoder",
    "decoder (multimodal wrapper)",
    "encoder-decoder",
    "encoder with a causal-LM head",
    "no attention",
    "not built tiny",
)
COLUMNS = (
    "family",
    "kind",
    "heads / KV",
    "positions",
    "window / chunk",
    "norms",
    "scores",
    "gates, sinks",
    "cache",
    "attention_from_hf",
)


def load(path=ATLAS) -> dict:
    """The recorded atlas: ``{"transformers": version, "families":
    [...]}``."""
    return json.loads(Path(path).read_text())


def kind(row) -> str:
    """Which of :data:`KINDS` a family is."""
    s = row.get("summary", {})
    if "error" in row:
        return "not built tiny"
    if s.get("is_encoder_decoder"):
        return "encoder-decoder"
    if row.get("wrapper"):
        return "decoder (multimodal wrapper)"
    if "tiny_error" in row:
        return "not built tiny"
    if not row.get("attention"):
        return "no attention"
    if s.get("is_decoder") is False or _bidirectional(row):
        return "encoder with a causal-LM head"
    return "decoder"


def _bidirectional(row) -> bool:
    """BERT-style: the config carries ``is_decoder`` (default False) and a
    ``position_embedding_type`` or ``type_vocab_size``."""
    c = row.get("config", {})
    return c.get("is_decoder") is False and (
        "type_vocab_size" in c or "position_embedding_type" in c
    )


_OTHER_TOWERS = ("vision", "visual", "audio", "image", "encoder")


def _language(path) -> bool:
    """Not a vision or audio tower's module (a wrapper's first attention
    module may be its image encoder's)."""
    return not any(w in path for w in _OTHER_TOWERS)


def _params(row) -> dict:
    """The parameters of the language model's first attention module."""
    mods = row.get("attention", [])
    mods = [m for m in mods if _language(m["path"])] or mods
    return dict(mods[0]["params"]) if mods else {}


def heads(row) -> str:
    s = row.get("summary", {})
    h, kv = s.get("heads"), s.get("kv_heads")
    if s.get("multi_query"):
        kv = 1
    if isinstance(h, list) or isinstance(kv, list):
        return "per layer"
    if h is None:
        return "—"
    d = s.get("head_dim")
    if d is None and isinstance(s.get("hidden"), int) and h:
        d = s["hidden"] // h
    kv = h if kv is None else kv
    tag = "MHA" if kv == h else ("MQA" if kv == 1 else "GQA")
    dim = f", d {d}" if isinstance(d, int) else ""
    return f"{h} / {kv} ({tag}{dim})"


def positions(row) -> str:
    s = row.get("summary", {})
    rope = s.get("rope") if isinstance(s.get("rope"), dict) else {}
    parts = []
    theta = rope.get("rope_theta", s.get("rope_theta"))
    if rope or theta is not None:
        kind_ = rope.get("rope_type", "default")
        name = "RoPE" if kind_ == "default" else f"RoPE ({kind_})"
        if isinstance(theta, (int, float)):
            name += f" base {theta:g}"
        parts.append(name)
        frac = s.get("partial_rotary_factor", s.get("rotary_pct"))
        if isinstance(frac, (int, float)) and frac < 1:
            parts.append(f"partial {frac:g}")
    words = row.get("source_words", [])
    if not parts and "rotary" in words and s.get("rotary_dim"):
        parts.append(f"RoPE on {s['rotary_dim']} features")
    if s.get("no_rope_layers"):
        parts.append("NoPE layers")
    if (
        s.get("alibi")
        or s.get("position_embedding_type") == "alibi"
        or (not parts and "alibi" in words)
    ):
        parts.append("ALiBi")
    if any(_language(p) for p in row.get("position_params", [])):
        parts.append("learned absolute")
    elif not parts and "sinusoid" in words:
        parts.append("sinusoidal absolute")
    if not parts and "relative_attention_bias" in words:
        parts.append("relative bias")
    return ", ".join(parts) or "none found"


def windows(row) -> str:
    s = row.get("summary", {})
    types = s.get("layer_types") or {}
    parts = []
    if types:
        short = {
            "full_attention": "full",
            "sliding_attention": "sliding",
            "chunked_attention": "chunked",
            "linear_attention": "linear",
        }
        parts.append(
            ", ".join(
                f"{n} {short.get(t, t)}" for t, n in sorted(types.items())
            )
        )
    if isinstance(s.get("sliding_window"), int):
        parts.append(f"window {s['sliding_window']}")
    if isinstance(s.get("attention_chunk_size"), int):
        parts.append(f"chunk {s['attention_chunk_size']}")
    return "; ".join(parts) or "—"


def norms(row) -> str:
    names = [n.split(".")[0] for n in _params(row)]
    found = []
    for key, label in (
        (("q_norm", "q_layernorm", "query_layernorm", "q_a_layernorm"), "q"),
        (("k_norm", "k_layernorm", "key_layernorm", "kv_a_layernorm"), "k"),
        (("v_norm",), "v"),
    ):
        if any(n in key for n in names):
            found.append(label)
    s = row.get("summary", {})
    out = ", ".join(found)
    if "clip_qkv" in s:
        out = ", ".join(filter(None, [out, f"clip {s['clip_qkv']:g}"]))
    return out or "—"


def scores(row) -> str:
    s = row.get("summary", {})
    parts = []
    if "attn_logit_softcapping" in s:
        parts.append(f"soft-cap {s['attn_logit_softcapping']:g}")
    if "query_pre_attn_scalar" in s:
        parts.append(f"scale 1/sqrt({s['query_pre_attn_scalar']:g})")
    if "attention_multiplier" in s:
        parts.append(f"scale {s['attention_multiplier']:g}")
    if s.get("alibi") or s.get("position_embedding_type") == "alibi":
        parts.append("ALiBi bias")
    return ", ".join(parts) or "—"


def gates(row) -> str:
    """An output gate among the attention's parameters, a gate folded
    into ``q_proj`` (twice the width ``o_proj`` reads), sink logits."""
    p = _params(row)
    parts = []
    if any("gate" in n.split(".")[0] or n.startswith("g_") for n in p):
        parts.append("output gate")
    q, o = p.get("q_proj.weight"), p.get("o_proj.weight")
    if q and o and q[0] == 2 * o[1]:
        parts.append("gate in q_proj")
    if "sinks" in p:
        parts.append("sinks")
    return ", ".join(parts) or "—"


_CACHE_NAMES = {
    "DynamicLayer": "keys and values",
    "DynamicSlidingWindowLayer": "window of keys and values",
}


def cache(row) -> str:
    """The cache's layer classes, in words where HF's name is a plain
    key/value layer, else the class name less ``Layer``."""
    layers = row.get("cache_layers") or {}
    if not layers:
        return row.get("cache") or "—"
    return ", ".join(
        sorted(_CACHE_NAMES.get(n, n.removesuffix("Layer")) for n in layers)
    )


def builds(row) -> tuple[str, str]:
    """``(status, detail)``: ``("built", "")``, or ``("refused", why)``
    for the family's default config: the part its attention needs (a
    family examined and refused), "family not examined", or the first
    clause of attention_from_hf's message (a key it refuses). A hybrid
    whose layer 0 is not attention (a Mamba layer) is built when one of
    its attention layers is, and says so."""
    config = row.get("config")
    if not config:
        return "refused", "no config"
    try:
        layer_settings(config, 0)
    except (ValueError, TypeError) as err:
        first = _first_built(config)  # a hybrid whose layer 0 is not
        if first is not None:  # attention (Mamba, a state layer)
            return "built", f"its attention layers (the first: {first})"
        text = str(err)
        if "its attention needs " in text:  # a family examined: the part
            part = text.split("its attention needs ", 1)[1]
            return "refused", "needs " + part.split(", which the library")[0]
        text = text.split(";")[0]
        if text.startswith("config model_type="):
            return "refused", "family not examined"
        return "refused", text
    return "built", ""


def _first_built(config, most=64):
    """The first layer index (below ``most``) that
    :func:`~attn_np.hf.families.layer_settings` builds, or None."""
    n = config.get("num_hidden_layers")
    if not isinstance(n, int) or isinstance(n, bool):  # Nemotron-H
        types = config.get("layer_types")
        n = len(types) if isinstance(types, list) else 0
    for i in range(1, min(n, most)):
        try:
            layer_settings(config, i)
        except (ValueError, TypeError):
            continue
        return i
    return None


def table_rows(data) -> list[dict]:
    """One dict per family, :data:`COLUMNS` its keys (and ``status``,
    ``detail`` for the last column)."""
    rows = []
    for row in data["families"]:
        status, detail = builds(row)
        rows.append(
            {
                "family": row["model_type"],
                "text": row.get("text_model_type") or row["model_type"],
                "kind": kind(row),
                "heads / KV": heads(row),
                "positions": positions(row),
                "window / chunk": windows(row),
                "norms": norms(row),
                "scores": scores(row),
                "gates, sinks": gates(row),
                "cache": cache(row),
                "status": status,
                "detail": detail,
            }
        )
    return rows


def html_table(rows, exact) -> str:
    """The atlas as an HTML table with a filter: a text box (any cell)
    and a choice of kind and of what ``attention_from_hf`` does. ``exact``
    maps a family to the largest error of its fixture."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = []
    for r in rows:
        if r["status"] == "built":
            e = exact.get(r["text"])
            last = "built" if e is None else f"exact ({e:.0e})"
        else:
            last = f"refused: {r['detail']}"
        cells = [r[c] for c in COLUMNS[:-1]] + [last]
        tds = "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
        body.append(
            f'<tr data-kind="{html.escape(r["kind"])}" '
            f'data-status="{r["status"]}">{tds}</tr>'
        )
    kinds = "".join(
        f'<option value="{html.escape(k)}">{html.escape(k)}</option>'
        for k in KINDS
    )
    return (
        "<style>div.atlas table{font-size:0.8em}"
        "div.atlas td,div.atlas th{overflow-wrap:anywhere}</style>"
        '<div class="atlas">'
        '<p><label>Find <input type="search" class="atlas-find" '
        'placeholder="a family or a feature"></label> '
        '<label>Kind <select class="atlas-kind"><option value="">any'
        f"</option>{kinds}</select></label> "
        '<label>attention_from_hf <select class="atlas-status">'
        '<option value="">any</option><option value="built">builds it'
        '</option><option value="refused">refuses it</option></select>'
        '</label> <span class="atlas-count"></span></p>'
        f"<table><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
        "<script>" + _FILTER + "</script>"
    )


_FILTER = """
document.querySelectorAll('div.atlas').forEach(function (atlas) {
  var find = atlas.querySelector('.atlas-find');
  var kind = atlas.querySelector('.atlas-kind');
  var status = atlas.querySelector('.atlas-status');
  var count = atlas.querySelector('.atlas-count');
  var rows = atlas.querySelectorAll('tbody tr');
  function update() {
    var words = find.value.toLowerCase().split(/\\s+/).filter(Boolean);
    var shown = 0;
    rows.forEach(function (tr) {
      var text = tr.textContent.toLowerCase();
      var ok = words.every(function (w) { return text.indexOf(w) >= 0; })
        && (!kind.value || tr.dataset.kind === kind.value)
        && (!status.value || tr.dataset.status === status.value);
      tr.style.display = ok ? '' : 'none';
      if (ok) { shown += 1; }
    });
    count.textContent = shown + ' of ' + rows.length + ' families';
  }
  [find, kind, status].forEach(function (el) {
    el.addEventListener('input', update);
  });
  update();
});
"""
