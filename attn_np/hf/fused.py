"""Fused and Conv1D projections: Hugging Face decoders that keep q, k and
v in one weight (chapter 10).

The book's layer keeps three projections, ``W_q [d_model, H d]``, ``W_k
[d_model, n_kv d]`` and ``W_v [d_model, n_kv d]``, and ``W_o [H d,
d_model]``. Several families store the first three as one matrix whose
output axis holds every query, key and value feature; this module says
how that axis is ordered, splits it into the three and joins them back
(for the gradients), and reads the families built this way.

HF's ``nn.Linear`` weight is ``[out, in]``: its rows are the output
features. With ``H`` query heads, ``n_kv`` key/value heads of ``d``
features and ``G = H / n_kv``, the rows come in one of three orders:

* ``"blocks"``: ``[W_q^T (H d rows); W_k^T (n_kv d); W_v^T (n_kv d)]``:
  Phi-3's ``qkv_proj``, MPT's ``Wqkv`` (``n_kv = H``), GPT-BigCode's
  ``c_attn`` with ``multi_query`` (``n_kv = 1``), Falcon-7B's
  ``query_key_value`` (``n_kv = 1``);
* ``"per_head"``: ``[H, 3, d]``, each head's query, key and value rows in
  turn: BLOOM's and Falcon-RW's ``query_key_value``, GPT-BigCode's
  ``c_attn`` without ``multi_query``;
* ``"grouped"``: ``[n_kv, G + 2, d]``, each key/value group's ``G`` query
  heads, then its key, then its value: Falcon-40B's ``query_key_value``
  (``new_decoder_architecture``).
* ``"shards"``: ``[4, 3, d_model / 4]``, the four model-parallel shards
  CodeGen was trained on, each its quarter of the query rows, then of the
  value rows, then of the key rows (note the order: q, v, k): CodeGen's
  ``qkv_proj`` (``mp_num = 4``).

GPT-2's and OpenAI GPT's ``Conv1D`` is ``y = x W + b`` with ``W`` stored
``[in, out]``, the book's own layout, not transposed: ``c_attn.weight
[d_model, 3 d_model]`` is ``[W_q | W_k | W_v]`` by columns (the
``"blocks"`` order along its second axis) and ``c_proj.weight`` is
``W_o``. A fused bias ``[3 d_model]`` (or ``[(H + 2 n_kv) d]``) splits
the same way as the rows.

A layout is the dict ``{"kind": "fused", "qkv": name, "out": name,
"rows": order, "conv1d": bool}``; the biases are there when the layer has
them (``b_q`` for the fused one, ``b_o`` for the output's).
"""

from __future__ import annotations

import numpy as np

from ..long_context import read_rope_scaling
from ..refinements import ALiBi, alibi_slopes
from .config import FULL, count, flag, get_object, number, rope_parameters
from .keys import _ELSEWHERE
from .layers import HFAttention, _QKLayerNormAttention


# ------------------------------------------------------------ row orders
def _check_shape(a, entry, shape, why):
    """Refuse state_dict ``entry`` unless its shape (as HF stores it) is
    ``shape``; checked before a fused weight is split."""
    if a.shape != tuple(shape):
        raise ValueError(
            f"state_dict entry {entry} has shape {a.shape}, the config "
            f"says {tuple(shape)} ({why})"
        )


def _split_rows(layer, rows, w):
    """Fused rows ``[(H + 2 n_kv) d, ...]`` -> the q, k and v rows
    ``[H d, ...]``, ``[n_kv d, ...]``, ``[n_kv d, ...]``."""
    H, n_kv, G, d = layer.n_heads, layer.n_kv, layer.G, layer.d
    rest = w.shape[1:]
    if rows == "grouped":
        t = w.reshape(n_kv, G + 2, d, *rest)  # [n_kv, G + 2, d, ...]
        q, k, v = t[:, :G], t[:, G], t[:, G + 1]
    elif rows == "per_head":
        t = w.reshape(H, 3, d, *rest)  # [H, 3, d, ...]
        q, k, v = t[:, 0], t[:, 1], t[:, 2]
    elif rows == "shards":
        t = w.reshape(
            4, 3, H * d // 4, *rest
        )  # [4, (q, v, k), H d / 4, ...]
        q, v, k = t[:, 0], t[:, 1], t[:, 2]
    else:
        q, k, v = np.split(w, [H * d, (H + n_kv) * d])
    return [a.reshape(-1, *rest) for a in (q, k, v)]  # [heads * d, ...]


def _fuse_rows(layer, rows, q, k, v):
    """The inverse of :func:`_split_rows`."""
    H, n_kv, G, d = layer.n_heads, layer.n_kv, layer.G, layer.d
    rest = q.shape[1:]
    if rows == "grouped":
        parts = [
            q.reshape(n_kv, G, d, *rest),
            k.reshape(n_kv, 1, d, *rest),
            v.reshape(n_kv, 1, d, *rest),
        ]
        t = np.concatenate(parts, axis=1)  # [n_kv, G + 2, d, ...]
    elif rows == "per_head":
        t = np.stack([a.reshape(H, d, *rest) for a in (q, k, v)], axis=1)
    elif rows == "shards":
        t = np.stack([a.reshape(4, -1, *rest) for a in (q, v, k)], axis=1)
    else:
        t = np.concatenate([q, k, v], axis=0)
    return t.reshape(-1, *rest)  # [(H + 2 n_kv) d, ...]


def _fused_names(layout, layer):
    """HF name -> the layer's key (None: made from the fused weight)."""
    qkv, out = layout["qkv"], layout["out"]
    names = {f"{qkv}.weight": None, f"{out}.weight": "W_o"}
    if "b_q" in layer.params:
        names[f"{qkv}.bias"] = None
    if "b_o" in layer.params:
        names[f"{out}.bias"] = "b_o"
    if "q_norm_bias" in layer.params:  # Persimmon's LayerNorm per head
        for n in ("q", "k"):
            names[f"{n}_layernorm.weight"] = f"{n}_norm"
            names[f"{n}_layernorm.bias"] = f"{n}_norm_bias"
    return names


def _load_fused(layer, layout, got):
    """``(new, source)``: the layer's q/k/v/o weights and biases from HF's
    arrays ``got`` (every entry's shape checked first), and the HF entry
    each came from."""
    qkv, out, rows = layout["qkv"], layout["out"], layout["rows"]
    conv = layout.get("conv1d", False)
    H, n_kv, d, D = layer.n_heads, layer.n_kv, layer.d, layer.d_model
    width = (H + 2 * n_kv) * d
    why = f"{rows} rows: {H} query and {n_kv} key and value heads of {d}"
    w = got[f"{qkv}.weight"]
    _check_shape(w, f"{qkv}.weight", (D, width) if conv else (width, D), why)
    wo = got[f"{out}.weight"]
    shape_o = (H * d, D) if conv else (D, H * d)
    _check_shape(wo, f"{out}.weight", shape_o, "the heads -> d_model")
    q, k, v = _split_rows(layer, rows, w.T if conv else w)  # [n, D] each
    new = {"W_q": q.T, "W_k": k.T, "W_v": v.T}  # [D, n] each
    new["W_o"] = wo if conv else wo.T  # [H d, D]
    source = {key: f"{qkv}.weight" for key in ("W_q", "W_k", "W_v")}
    source["W_o"] = f"{out}.weight"
    if f"{qkv}.bias" in got:
        b = got[f"{qkv}.bias"]
        _check_shape(b, f"{qkv}.bias", (width,), why)
        for n, a in zip("qkv", _split_rows(layer, rows, b)):
            new[f"b_{n}"], source[f"b_{n}"] = a, f"{qkv}.bias"
    if f"{out}.bias" in got:
        new["b_o"], source["b_o"] = got[f"{out}.bias"], f"{out}.bias"
    for hf, key in _fused_names(layout, layer).items():
        if key is not None and key not in new:  # the norms' [d] vectors
            new[key], source[key] = got[hf], hf
    return new, source


def _fused_to_hf(layout, layer, d):
    """A dict in the layer's keys -> HF's fused names and layout."""
    qkv, out, rows = layout["qkv"], layout["out"], layout["rows"]
    conv = layout.get("conv1d", False)
    w = _fuse_rows(layer, rows, d["W_q"].T, d["W_k"].T, d["W_v"].T)
    res = {
        f"{qkv}.weight": w.T if conv else w,  # [D, width] or [width, D]
        f"{out}.weight": d["W_o"] if conv else d["W_o"].T,
    }
    if "b_q" in d:
        res[f"{qkv}.bias"] = _fuse_rows(
            layer, rows, d["b_q"], d["b_k"], d["b_v"]
        )
    if "b_o" in d:
        res[f"{out}.bias"] = d["b_o"]
    for hf, key in _fused_names(layout, layer).items():
        if key is not None and hf not in res:
            res[hf] = d[key]
    return res


# ------------------------------------------------------------ families
def _fused(
    qkv, out, rows, conv1d=False, prefix="model.layers.{i}.self_attn."
):
    """A fused layout; ``prefix``: where the attention's entries sit in
    the checkpoint of HF's base model (named when a state dict does not
    fit)."""
    return {
        "kind": "fused",
        "qkv": qkv,
        "out": out,
        "rows": rows,
        "conv1d": conv1d,
        "prefix": prefix,
    }


def _sizes(cfg):
    """``(d_model, n_heads, head_dim)``; HF's classes split ``d_model``
    evenly over the heads and refuse a remainder."""
    d_model = count(cfg, "hidden_size")
    n_heads = count(cfg, "num_attention_heads")
    if d_model % n_heads:
        raise ValueError(
            f"config key hidden_size={d_model} must be a multiple of "
            f"num_attention_heads={n_heads} (head_dim = hidden_size / "
            "num_attention_heads)"
        )
    return d_model, n_heads, d_model // n_heads


_ALL = ("q", "k", "v", "o")
_H_ATTN = "h.{i}.attn."  # GPT-2's, OpenAI GPT's, GPT-BigCode's, CodeGen's


def _scale(cfg, head_dim):
    """``1/sqrt(d)``, or 1 when ``scale_attn_weights`` is false."""
    off = flag(cfg, "scale_attn_weights") is False
    return 1.0 if off else head_dim**-0.5


_PHI3_LENGTH = 4096  # Phi3Config's max_position_embeddings, and original_


def _phi3_rope(cfg):
    """``cfg`` with Phi-3's RoPE as its configuration class reads it: the
    types ``su``, ``yarn`` and ``longrope`` are LongRoPE (chapter 11),
    whose trained length is the top-level
    ``original_max_position_embeddings`` (4096 when the file has none;
    it wins over one in the RoPE dict). The scaling, checked by
    :func:`~attn_np.long_context.read_rope_scaling`, is kept under
    ``"_longrope"`` for :func:`_phi3`, and the RoPE dict left is the
    plain one of the same base. ``default`` passes unchanged; the class
    refuses every other type, and so does this."""
    params = dict((rope_parameters(cfg) or {}).get(FULL) or {})
    kind = params.get("rope_type", "default")
    if kind == "default":
        return cfg
    if kind not in ("su", "yarn", "longrope"):
        raise ValueError(
            f"config rope_type {kind!r} is not read by "
            f"{cfg.get('model_type')}'s class: it takes 'default' and "
            "LongRoPE ('longrope', or the older 'su' and 'yarn')"
        )
    plain = {"rope_type": "default"}
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in params:
            plain[key] = params.pop(key)
    params["rope_type"] = "longrope"
    params["original_max_position_embeddings"] = cfg.get(
        "original_max_position_embeddings", _PHI3_LENGTH
    )
    scaling = read_rope_scaling(
        params,
        max_position_embeddings=cfg.get(
            "max_position_embeddings", _PHI3_LENGTH
        ),
    )
    old = ("rope_scaling", "rope_theta", "partial_rotary_factor")
    out = {k: v for k, v in cfg.items() if k not in old}
    return {**out, "rope_parameters": plain, "_longrope": scaling}


def _phi3(cfg, i, layer_type, kw, layout):
    """Phi-3 (and Phi-4-multimodal's language model, the same module and
    configuration rules): Llama's layer with one ``qkv_proj``
    (``"blocks"`` rows) and no bias anywhere (``attention_bias`` is not
    read by its class); its RoPE plain or LongRoPE (:func:`_phi3_rope`),
    one factor per rotated pair in each list."""
    scaling = cfg.get("_longrope")
    if scaling is not None:
        d = count(cfg, "hidden_size") // count(cfg, "num_attention_heads")
        pairs = (kw["rotary_dim"] or d) // 2
        for key in ("short_factor", "long_factor"):
            if len(scaling[key]) != pairs:
                raise ValueError(
                    f"config key rope_parameters.{key} must hold one "
                    f"factor per rotated pair ({pairs}), got "
                    f"{len(scaling[key])}"
                )
        kw["rope_scaling"] = scaling
    kw["biases"] = ()
    layout.update(_fused("qkv_proj", "o_proj", "blocks"))


# Keys of Llama-style files that the layers below do not read: set in one
# of their files, each is refused by name rather than ignored.
_UNREAD = (
    "head_dim",
    "num_key_value_heads",
    "attention_bias",
    "layer_types",
    "sliding_window",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "query_pre_attn_scalar",
    "attn_logit_softcapping",
)


def _unread(cfg, model_type, read=()):
    """Refuse a key of :data:`_UNREAD` that the family's class does not
    read (``read``), when set; ``head_dim`` equal to ``d_model /
    n_heads`` and ``num_key_value_heads`` equal to ``n_heads`` (what the
    class builds) are harmless. Returns :func:`_sizes`."""
    d_model, n_heads, head_dim = _sizes(cfg)
    for key in _UNREAD:
        value = cfg.get(key)
        if key in read or value in (None, False, [], {}):
            continue
        if (key, value) in (
            ("head_dim", head_dim),
            ("num_key_value_heads", n_heads),
        ):
            continue
        raise ValueError(
            f"config key {key}={value!r:.80} is not read by {model_type}'s "
            "attention in transformers 5.24.0; attention_from_hf refuses "
            "it rather than ignore it"
        )
    return d_model, n_heads, head_dim


def _persimmon(cfg, i, layer_type, kw, layout):
    """Persimmon: multi-head, ``query_key_value`` in ``"per_head"`` rows
    and ``dense``, all with biases; a LayerNorm per head on q and k when
    ``qk_layernorm`` (default true; eps ``layer_norm_eps``, default
    1e-5), then RoPE on the first ``partial_rotary_factor`` (default 0.5)
    of each head's features, rotate-half."""
    rope = ("rope_theta", "rope_scaling", "rope_parameters")
    _unread(cfg, "persimmon", (*rope, "partial_rotary_factor"))
    kw["biases"] = _ALL
    if flag(cfg, "qk_layernorm") is not False:
        kw["norm_eps"] = number(cfg, "layer_norm_eps", 1e-5)
        layout["cls"] = _QKLayerNormAttention
    layout.update(_fused("query_key_value", "dense", "per_head"))


def _gpt2(cfg, model_type, i):
    """GPT-2 (and GPT-SW3, whose files say ``gpt2``): multi-head
    attention without RoPE (its positions are learned and added to the
    embeddings, outside the layer); ``Conv1D`` ``c_attn`` and ``c_proj``
    with biases. ``scale_attn_weights`` (default true) gives the scale
    ``1/sqrt(d)``, else 1; ``scale_attn_by_inverse_layer_idx`` divides it
    by ``i + 1``. ``reorder_and_upcast_attn`` changes only the precision
    of HF's eager path (scores in float32, the scale folded into the
    product; its SDPA path never reads it): the same function here."""
    d_model, n_heads, head_dim = _unread(cfg, model_type)
    scale = _scale(cfg, head_dim)
    if flag(cfg, "scale_attn_by_inverse_layer_idx"):
        scale /= i + 1
    flag(cfg, "reorder_and_upcast_attn")  # a JSON boolean, nothing more
    kw = dict(biases=_ALL, use_rope=False, scale=scale)
    layout = _fused("c_attn", "c_proj", "blocks", True, _H_ATTN)
    return HFAttention, (d_model, n_heads, n_heads, head_dim), kw, layout


def _openai_gpt(cfg, model_type, i):
    """OpenAI GPT: GPT-2's ``Conv1D`` layer, scaled by ``1/sqrt(d)``
    always. HF masks a future key with ``-1e4`` (not ``-inf``), which
    gives it weight ``exp(-1e4)``, zero in float64 unless the allowed
    scores are thousands apart; HF's class has no cache."""
    d_model, n_heads, head_dim = _unread(cfg, model_type)
    kw = dict(biases=_ALL, use_rope=False)
    layout = _fused("c_attn", "c_proj", "blocks", True, _H_ATTN)
    return HFAttention, (d_model, n_heads, n_heads, head_dim), kw, layout


def _gpt_bigcode(cfg, model_type, i):
    """GPT-BigCode (StarCoder 1, SantaCoder): ``multi_query`` (default
    true) has one key and value head, ``c_attn`` rows ``"blocks"``;
    without it, multi-head with ``"per_head"`` rows. ``nn.Linear``
    ``c_attn`` and ``c_proj`` with biases; ``scale_attn_weights`` as
    GPT-2's. Its configuration class sets ``num_key_value_heads`` from
    ``multi_query``, so a file whose value disagrees is refused."""
    d_model, n_heads, head_dim = _unread(
        cfg, model_type, ("num_key_value_heads",)
    )
    mqa = flag(cfg, "multi_query") is not False
    n_kv = 1 if mqa else n_heads
    written = count(cfg, "num_key_value_heads", required=False)
    if written not in (None, n_kv):
        raise ValueError(
            f"config is contradictory: num_key_value_heads={written} but "
            f"multi_query={mqa} means {n_kv} (gpt_bigcode reads "
            "multi_query)"
        )
    scale = _scale(cfg, head_dim)
    kw = dict(biases=_ALL, use_rope=False, scale=scale)
    layout = _fused(
        "c_attn", "c_proj", "blocks" if mqa else "per_head", False, _H_ATTN
    )
    return HFAttention, (d_model, n_heads, n_kv, head_dim), kw, layout


def _bloom(cfg, model_type, i):
    """BLOOM: multi-head, ``query_key_value`` in ``"per_head"`` rows and
    ``dense``, all with biases; ALiBi with Press et al.'s slopes, added
    after the ``1/sqrt(d)`` scale (HF adds ``m_h j`` to the scaled
    product, the same up to a constant per row)."""
    d_model, n_heads, head_dim = _unread(cfg, model_type)
    kw = dict(
        biases=_ALL,
        use_rope=False,
        score_mods=(ALiBi(alibi_slopes(n_heads)),),
    )
    layout = _fused(
        "query_key_value",
        "dense",
        "per_head",
        False,
        "h.{i}.self_attention.",
    )
    return HFAttention, (d_model, n_heads, n_heads, head_dim), kw, layout


# MPT's attn_config: keys read, and the value HF's classes build (any
# other is refused by name: HF's MptAttention ignores these keys, so a
# file that sets one describes a layer HF does not build either).
_MPT_BUILT = {
    "clip_qkv": None,
    "qk_ln": False,
    "alibi": True,
    "alibi_bias_max": 8,
    "attn_type": "multihead_attention",
    "prefix_lm": False,
    "attn_uses_sequence_id": False,
}
# read: softmax_scale; harmless: the kernel's name, dropout
_MPT_READ = {"softmax_scale", "attn_impl", "attn_pdrop"}


def _mpt_attention(cfg):
    """MPT's ``attn_config``, every key checked."""
    attn = get_object(cfg, "attn_config") or {}
    unknown = sorted(set(attn) - _ELSEWHERE - _MPT_READ - set(_MPT_BUILT))
    if unknown:
        raise ValueError(
            f"config keys attn_config.{unknown} are not understood by "
            "attention_from_hf (mpt); refusing to guess what they change"
        )
    for key, built in _MPT_BUILT.items():
        value = attn.get(key, built)
        if key == "clip_qkv" and value in (None, False):
            continue
        if value != built or isinstance(value, bool) != isinstance(
            built, bool
        ):
            raise ValueError(
                f"config key attn_config.{key}={value!r} is not built by "
                f"attention_from_hf for mpt (it builds {built!r}; HF's "
                "MptAttention in transformers 5.24.0 does not read it)"
            )
    return attn


def _mpt(cfg, model_type, i):
    """MPT: multi-head, ``Wqkv`` in ``"blocks"`` rows and ``out_proj``,
    no biases; ALiBi added after the scale ``attn_config.softmax_scale``
    (default ``1/sqrt(d)``). HF's MPT takes ``2^(-8 h / p)`` for ``p`` the
    power of two at or above ``n_heads``, then, when ``p > n_heads``, the
    even-numbered slopes before the odd ones, the first ``n_heads``: the
    same numbers as BLOOM's rule (:func:`~attn_np.refinements.
    alibi_slopes`), in the same order."""
    d_model, n_heads, head_dim = _unread(cfg, model_type)
    attn = _mpt_attention(cfg)
    scale = number(attn, "softmax_scale", head_dim**-0.5)
    kw = dict(
        use_rope=False,
        scale=scale,
        score_mods=(ALiBi(alibi_slopes(n_heads)),),
    )
    layout = _fused("Wqkv", "out_proj", "blocks", False, "blocks.{i}.attn.")
    return HFAttention, (d_model, n_heads, n_heads, head_dim), kw, layout


def _codegen(cfg, model_type, i):
    """CodeGen: multi-head, ``qkv_proj`` in ``"shards"`` rows, no biases,
    ``out_proj``; RoPE on interleaved pairs of the first ``rotary_dim``
    features of each head (default 64, ``CodeGenConfig``'s), base 10000,
    the frequencies ``10000^(-2i / rotary_dim)``. ``rotary_dim: null``
    makes HF rotate with a table as wide as ``hidden_size``, which fits a
    head only when there is one head; refused."""
    d_model, n_heads, head_dim = _unread(cfg, model_type)
    if d_model % 4:
        raise ValueError(
            f"config key hidden_size={d_model} must be a multiple of 4 "
            "(codegen's qkv_proj is cut into 4 shards)"
        )
    rotary = 64 if "rotary_dim" not in cfg else cfg["rotary_dim"]
    if rotary is None:
        raise ValueError(
            "config key rotary_dim=None is not built by attention_from_hf "
            "for codegen (HF rotates every feature with a table as wide "
            "as hidden_size)"
        )
    rotary = count({"rotary_dim": rotary}, "rotary_dim")
    if rotary % 2 or rotary > head_dim:
        raise ValueError(
            f"config key rotary_dim={rotary} must be even and at most "
            f"head_dim={head_dim} (it turns pairs of a head's features)"
        )
    kw = dict(
        rope_base=10000.0,
        rope_layout="interleaved",
        rotary_dim=None if rotary == head_dim else rotary,
    )
    layout = _fused("qkv_proj", "out_proj", "shards", False, _H_ATTN)
    return HFAttention, (d_model, n_heads, n_heads, head_dim), kw, layout


#: model_type -> ``(cfg, model_type, layer_idx) -> (cls, args, kw,
#: layout)`` for the fused families that are not Llama's layer
_FUSED_LAYERS = {
    "gpt2": _gpt2,
    "openai-gpt": _openai_gpt,
    "gpt_bigcode": _gpt_bigcode,
    "bloom": _bloom,
    "mpt": _mpt,
    "codegen": _codegen,
}
