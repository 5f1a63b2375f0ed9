"""Issue 41: every public name of ``attn_np`` refuses NaN, inf and wrong
dtypes in every array it takes, with an error that names the argument.

The public names are found, not listed: ``attn_np`` and every module
under it (walked with ``pkgutil``), where a module's public names are its
``__all__``, or, without one, its names that do not start with ``_`` and
are defined there (pydoc's rule: a function a module imports is the
public name of the module that defines it). Re-exports are the same name
(deduplicated by identity; a number or string constant by its name too).
``attn_np.instruments`` and ``attn_np.bench`` are not walked: they are
the measuring lab and the benchmarks' command line (gradient checks,
plots, timings, ``python -m attn_np.bench``), which no mechanism imports;
the four instruments ``attn_np`` re-exports are classified below.

Every public name is in exactly one of two tables:

* ``CALLS``: how to call it validly with small arrays. For each array it
  takes (a class: its constructor's arrays, then ``forward`` and
  ``backward``), the call with a NaN or an inf placed in that array must
  raise a ``ValueError`` naming it; with the array in a wrong dtype
  (integer where float is expected, complex, object, str; for a boolean
  mask or integer positions, a float array holding NaN) it must raise a
  ``TypeError`` or ``ValueError`` naming it. The valid call runs first,
  so a call that always fails cannot pass.
* ``EXEMPT``: names that take no array of numbers, each with its reason
  (constants, record types, configs, sizes, command lines), or internal
  steps whose public caller checks their arrays once (the decode fast
  path is not checked twice).

A public name added later fails :func:`test_every_public_name_is_classified`
until it is put in one of them.
"""

import __future__

import importlib
import inspect
import json
import pkgutil
import re
import types
from pathlib import Path

import numpy as np
import pytest

import attn_np
from attn_np import ffn as ffn_mod
from attn_np import norms as norms_mod
from attn_np import refinements as ref
from attn_np import shared_kv, training
from attn_np import sparse as sp
from attn_np import windows as win
from attn_np.cross import CrossAttention
from attn_np.linear import conv, gates
from attn_np.long_context import qk_norm_backward as lc_qk_norm_backward
from attn_np.long_context import qk_norm_forward as lc_qk_norm_forward
from attn_np.pretrained import CausalLM, LlamaConfig
from attn_np.rope_scaling import (
    ProportionalRotary,
    ScaledRotary,
    scaled_rope_forward,
)
from attn_np.serving import paged_attention
from attn_np.serving.paged import paged_attention_by_page as paged_by_page

# modules by import_module: attn_np.rope is also the name of a function
rope_mod = importlib.import_module("attn_np.rope")
masks = importlib.import_module("attn_np.masks")
lc = importlib.import_module("attn_np.long_context")
spec = importlib.import_module("attn_np.speculative")
sampling = importlib.import_module("attn_np.pretrained.sampling")

FIXTURES = Path(__file__).parent / "fixtures"
LAB = ("instruments", "bench")
SCALARS = (int, float, complex, str, bytes, bool, type(None))
FUTURE = __future__.annotations  # a module without __all__ holds it


def public_names() -> dict:
    """Every public name of the package, ``{qualified name: object}``:
    a class or function by the module that defines it, a constant by the
    first module (in walk order) that makes it public."""
    mods = [attn_np]
    for info in pkgutil.walk_packages(attn_np.__path__, "attn_np."):
        parts = info.name.split(".")[1:]
        if parts[0] in LAB or any(p.startswith("_") for p in parts):
            continue
        mods.append(importlib.import_module(info.name))
    found, seen = {}, set()
    for mod in mods:
        listed = getattr(mod, "__all__", None)
        names = listed or [n for n in vars(mod) if not n.startswith("_")]
        for n in names:
            obj = getattr(mod, n)
            if isinstance(obj, types.ModuleType) or obj is FUTURE:
                continue
            origin = getattr(obj, "__module__", None)
            if listed is None and not str(origin or "attn_np").startswith(
                "attn_np"
            ):
                continue  # imported from outside (typing, dataclasses...)
            home = None
            if inspect.isclass(obj) or inspect.isfunction(obj):
                home = obj.__module__
                if listed is None and home != mod.__name__:
                    continue  # imported: the defining module's name
            key = id(obj), (n if isinstance(obj, SCALARS) else None)
            if key in seen:
                continue
            seen.add(key)
            q = (
                f"{home}.{obj.__qualname__}"
                if home
                else f"{mod.__name__}.{n}"
            )
            found[q] = obj
    return found


# ------------------------------------------------------------ the calls
def n(*shape):
    """Small normal numbers, the same for the same shape."""
    seed = int(np.prod(shape)) + len(shape)
    return np.asarray(np.random.default_rng(seed).normal(size=shape))


class Call:
    """``run(**arrays)`` is a valid call; each of ``arrays`` is spoiled in
    turn. ``what`` says which call it is (a class has several)."""

    def __init__(self, what, run, **arrays):
        self.what, self.run, self.arrays = what, run, arrays


def fn(f, *, spoil=None, **kw):
    """Call ``f(**kw)``; its ndarray arguments (or those in ``spoil``)
    are spoiled one at a time."""
    names = spoil or [k for k, v in kw.items() if isinstance(v, np.ndarray)]
    fixed = {k: v for k, v in kw.items() if k not in names}
    return Call(
        f.__name__,
        lambda **a: f(**fixed, **a),
        **{k: kw[k] for k in names},
    )


def bw(forward, fw_kw, backward, dname):
    """``backward(d, cache)`` after a valid ``forward(**fw_kw)`` (which
    returns ``(out, cache)``), with ``d`` (named ``dname``) of the shape
    of ``out``."""

    def run(**a):
        return backward(a[dname], forward(**fw_kw)[-1])

    out = forward(**fw_kw)[0]
    return Call(backward.__name__, run, **{dname: n(*np.shape(out))})


def layer(make, x, *, fw=None, **fw_kw):
    """A layer: its ``forward(x)`` and, after a valid forward, its
    ``backward(dy)``, each array under the name its method gives it.
    ``fw`` names other arrays ``forward`` takes."""
    fw = fw or {}
    m = make()
    xname = next(iter(inspect.signature(m.forward).parameters))

    def forward(**a):
        return make().forward(a.pop(xname), **fw_kw, **a)

    def backward(**a):
        m = make()
        m.forward(x, **fw_kw, **fw)
        return m.backward(*a.values())

    y = m.forward(x, **fw_kw, **fw)
    y = y[0] if isinstance(y, tuple) else y
    calls = [Call("forward", forward, **{xname: x}, **fw)]
    if hasattr(m, "backward"):
        dname = next(iter(inspect.signature(m.backward).parameters))
        calls.append(Call("backward", backward, **{dname: n(*y.shape)}))
    return calls


def _reader_calls(x, make_reader=None):
    """A KVReader's forward with the producer's k and v (a tuple: each
    spoiled in turn) and its backward (``make_reader``: a subclass's)."""

    def make():
        producer = attn_np.GroupedQueryAttention(8, 2, 1, rope_base=1e4)
        producer.forward(x, causal=True)
        reader = (make_reader or default)()
        return reader, shared_kv.shared_kv(producer)

    def default():
        return shared_kv.KVReader(8, 2, 1, rope_base=1e4, seed=1)

    reader, (k, v) = make()
    y = reader.forward(x, (k, v))

    def backward(dy):
        r, kv = make()
        r.forward(x, kv)
        return r.backward(dy)

    return [
        Call(
            "forward",
            lambda x, k, v: make()[0].forward(x, (k, v)),
            x=x,
            k=np.array(k),
            v=np.array(v),
        ),  # fmt: skip
        Call("backward", backward, dy=n(*y.shape)),
    ]


def one(*calls):
    return list(calls)


Q, K, V = n(2, 3, 4), n(2, 5, 4), n(2, 5, 3)
MASK = np.ones((3, 5), dtype=bool)
POS_Q, POS_K = np.arange(2, 5), np.arange(5)


def _attention():
    f = attn_np.attention_forward
    kw = dict(q=Q, k=K, v=V, mask=MASK)
    return {
        "attn_np.attention.attention_forward": lambda: one(fn(f, **kw)),
        "attn_np.attention.attention_backward": lambda: one(
            bw(f, kw, attn_np.attention_backward, "dout")
        ),
        "attn_np.masks.position_mask": lambda: one(
            fn(attn_np.position_mask, q_positions=POS_Q, k_positions=POS_K)
        ),
        "attn_np.attention.unbroadcast": lambda: one(
            fn(attn_np.unbroadcast, grad=n(2, 3, 4), shape=(3, 4))
        ),
        "attn_np.masks.chunked_mask": lambda: one(
            fn(
                attn_np.chunked_mask,
                q_positions=POS_Q,
                k_positions=POS_K,
                chunk=2,
            )
        ),
        "attn_np.windows.window_attention_forward": lambda: one(
            fn(win.window_attention_forward, **kw, sinks=n(2, 3, 1))
        ),
        "attn_np.windows.window_attention_backward": lambda: one(
            bw(
                win.window_attention_forward,
                kw,
                win.window_attention_backward,
                "dout",
            )
        ),
    }


def _softmax():
    kw = dict(x=n(3, 5), mask=MASK)
    return {
        "attn_np.softmax.softmax": lambda: one(fn(attn_np.softmax, **kw)),
        "attn_np.softmax.softmax_forward": lambda: one(
            fn(attn_np.softmax_forward, **kw)
        ),
        "attn_np.softmax.softmax_backward": lambda: one(
            bw(attn_np.softmax_forward, kw, attn_np.softmax_backward, "dp")
        ),
        "attn_np.softmax.sink_softmax": lambda: one(
            fn(attn_np.sink_softmax, x=n(3, 5), sink=n(3, 1), mask=MASK)
        ),
    }


def _grouped_flash():
    gq = dict(q=n(1, 1, 2, 3, 4), k=n(1, 1, 5, 4), v=n(1, 1, 5, 3))
    gf = attn_np.grouped_attention_forward
    ff = attn_np.flash_attention_forward
    fk = dict(q=Q, k=K, v=V, block_q=2, block_k=2)
    return {
        "attn_np.grouped.grouped_attention_forward": lambda: one(
            fn(gf, **gq, sinks=n(1, 1, 2, 3, 1))
        ),
        "attn_np.grouped.grouped_attention_backward": lambda: one(
            bw(gf, gq, attn_np.grouped_attention_backward, "do")
        ),
        "attn_np.flash.flash_attention_forward": lambda: one(
            fn(ff, **fk, mask=MASK)
        ),
        "attn_np.flash.flash_attention_backward": lambda: one(
            bw(ff, fk, attn_np.flash_attention_backward, "dout")
        ),
    }


def _rope():
    x, pos = n(2, 5, 4), np.arange(5)
    kw = dict(x=x, positions=pos)
    cos, sin = np.cos(n(5, 2)), np.sin(n(5, 2))
    return {
        "attn_np.rope.rope": lambda: one(fn(attn_np.rope, **kw)),
        "attn_np.rope.rope_forward": lambda: one(
            fn(attn_np.rope_forward, **kw)
        ),
        "attn_np.rope.rope_backward": lambda: one(
            bw(attn_np.rope_forward, kw, attn_np.rope_backward, "dy")
        ),
        "attn_np.rope.rotate_pairs": lambda: one(
            fn(attn_np.rotate_pairs, x=x, cos=cos, sin=sin)
        ),
        "attn_np.rope.Rotary": lambda: one(
            fn(rope_mod.Rotary(1e4).forward, **kw),
            bw(
                rope_mod.Rotary(1e4).forward,
                kw,
                rope_mod.Rotary(1e4).backward,
                "dy",
            ),
        ),
        "attn_np.rope_scaling.ScaledRotary": lambda: one(
            fn(ScaledRotary(1e4).forward, **kw),
            bw(
                ScaledRotary(1e4).forward,
                kw,
                ScaledRotary(1e4).backward,
                "dy",
            ),
        ),
        "attn_np.rope_scaling.ProportionalRotary": lambda: one(
            fn(ProportionalRotary(1e4, 4, 1).forward, **kw),
            bw(
                ProportionalRotary(1e4, 4, 1).forward,
                kw,
                ProportionalRotary(1e4, 4, 1).backward,
                "dy",
            ),
        ),
        "attn_np.rope_scaling.scaled_rope_forward": lambda: one(
            fn(scaled_rope_forward, **kw)
        ),
    }


def _norms():
    x, g = n(3, 4), n(4)
    rk = dict(x=x, g=g)
    qk = dict(t=x, w=g)
    lk = dict(x=x, g=g, b=n(4))
    return {
        "attn_np.norms.rmsnorm_forward": lambda: one(
            fn(norms_mod.rmsnorm_forward, **rk)
        ),
        "attn_np.norms.rmsnorm_backward": lambda: one(
            bw(
                norms_mod.rmsnorm_forward,
                rk,
                norms_mod.rmsnorm_backward,
                "dy",
            )
        ),
        "attn_np.norms.qk_norm_forward": lambda: one(
            fn(norms_mod.qk_norm_forward, **qk)
        ),
        "attn_np.norms.qk_norm_backward": lambda: one(
            bw(
                norms_mod.qk_norm_forward,
                qk,
                norms_mod.qk_norm_backward,
                "dy",
            )
        ),
        "attn_np.long_context.qk_norm_forward": lambda: one(
            fn(lc_qk_norm_forward, x=x)
        ),
        "attn_np.long_context.qk_norm_backward": lambda: one(
            bw(lc_qk_norm_forward, dict(x=x), lc_qk_norm_backward, "dy")
        ),
        "attn_np.sparse.layernorm_forward": lambda: one(
            fn(sp.layernorm_forward, **lk)
        ),
        "attn_np.sparse.layernorm_backward": lambda: one(
            bw(sp.layernorm_forward, lk, sp.layernorm_backward, "dy")
        ),
        "attn_np.linear.gates.l2norm_forward": lambda: one(
            fn(gates.l2norm_forward, x=x)
        ),
        "attn_np.linear.gates.l2norm_backward": lambda: one(
            bw(gates.l2norm_forward, dict(x=x), gates.l2norm_backward, "dy")
        ),
    }


def _refinements():
    lk = dict(x=n(3, 4), W=n(4, 2), b=n(2))
    sk = dict(s=n(3, 4), cap=5.0)
    gk = dict(o=n(3, 4), g=n(3, 4))
    tk = dict(q=n(3, 4), positions=np.arange(3))
    return {
        "attn_np.refinements.linear_forward": lambda: one(
            fn(ref.linear_forward, **lk)
        ),
        "attn_np.refinements.linear_backward": lambda: one(
            bw(ref.linear_forward, lk, ref.linear_backward, "dy")
        ),
        "attn_np.refinements.softcap_forward": lambda: one(
            fn(ref.softcap_forward, **sk)
        ),
        "attn_np.refinements.softcap_backward": lambda: one(
            bw(ref.softcap_forward, sk, ref.softcap_backward, "dy")
        ),
        "attn_np.refinements.gate_forward": lambda: one(
            fn(ref.gate_forward, **gk)
        ),
        "attn_np.refinements.gate_backward": lambda: one(
            bw(ref.gate_forward, gk, ref.gate_backward, "dy")
        ),
        "attn_np.refinements.query_temperature": lambda: one(
            fn(ref.query_temperature, positions=np.arange(3))
        ),
        "attn_np.refinements.query_temperature_forward": lambda: one(
            fn(ref.query_temperature_forward, **tk)
        ),
        "attn_np.refinements.query_temperature_backward": lambda: one(
            bw(
                ref.query_temperature_forward,
                tk,
                ref.query_temperature_backward,
                "dq2",
            )
        ),
        "attn_np.refinements.ALiBi": lambda: one(
            fn(ref.ALiBi, slopes=n(4) ** 2)
        ),
    }


def transformer():
    """Chapter 5's model, small."""
    return attn_np.Transformer(
        vocab_size=5,
        d_model=8,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        d_ff=8,
        max_len=8,
    )


def _ffn_training():
    sw = dict(x=n(3, 4), W_gate=n(4, 6), W_up=n(4, 6), W_down=n(6, 4))
    lk = dict(x=n(3, 4), W=n(4, 2), b=n(2))
    # the lookup checks the rows it reads: ids read the first and the last
    # row of W, where the NaN and the inf are put
    ek = dict(ids=np.array([0, 2, 4]), W=n(5, 4))
    ce = dict(logits=n(3, 5), targets=np.array([0, 1, 4]))
    return {
        "attn_np.ffn.swiglu_forward": lambda: one(
            fn(ffn_mod.swiglu_forward, **sw)
        ),
        "attn_np.ffn.swiglu_backward": lambda: one(
            bw(ffn_mod.swiglu_forward, sw, ffn_mod.swiglu_backward, "dy")
        ),
        "attn_np.ffn.SwiGLU": lambda: layer(
            lambda: ffn_mod.SwiGLU(4, 6), n(3, 4)
        ),
        "attn_np.training.layers.linear_forward": lambda: one(
            fn(training.linear_forward, **lk)
        ),
        "attn_np.training.layers.linear_backward": lambda: one(
            bw(training.linear_forward, lk, training.linear_backward, "dy")
        ),
        "attn_np.training.layers.gelu_forward": lambda: one(
            fn(training.gelu_forward, x=n(3, 4))
        ),
        "attn_np.training.layers.gelu_backward": lambda: one(
            bw(
                training.gelu_forward,
                dict(x=n(3, 4)),
                training.gelu_backward,
                "dy",
            )
        ),
        "attn_np.training.layers.embedding_forward": lambda: one(
            fn(training.embedding_forward, **ek)
        ),
        "attn_np.training.layers.embedding_backward": lambda: one(
            bw(
                training.embedding_forward,
                ek,
                training.embedding_backward,
                "dout",
            )
        ),
        "attn_np.training.layers.Embedding": lambda: layer(
            lambda: training.Embedding(5, 4), np.array([[0, 2, 1]])
        ),
        "attn_np.training.layers.Linear": lambda: layer(
            lambda: training.Linear(4, 2), n(3, 4)
        ),
        "attn_np.training.layers.FeedForward": lambda: layer(
            lambda: training.FeedForward(4, 8), n(3, 4)
        ),
        "attn_np.training.layers.RMSNorm": lambda: layer(
            lambda: training.RMSNorm(4), n(3, 4)
        ),
        "attn_np.training.losses.cross_entropy_forward": lambda: one(
            fn(training.cross_entropy_forward, **ce)
        ),
        "attn_np.training.losses.cross_entropy_backward": lambda: one(
            bw(
                training.cross_entropy_forward,
                ce,
                training.cross_entropy_backward,
                "dloss",
            )
        ),
        "attn_np.training.losses.accuracy": lambda: one(
            fn(training.accuracy, **ce)
        ),
        "attn_np.training.transformer.Transformer": lambda: layer(
            transformer, np.array([[0, 3, 1, 4]])
        ),
        "attn_np.training.optim.clip_grad_norm": lambda: one(
            Call(
                "clip_grad_norm",
                lambda g: training.clip_grad_norm({"g": g}, 1.0),
                g=n(3, 4),
            )
        ),
        "attn_np.training.optim.Adam": lambda: one(
            Call("Adam", lambda p: training.Adam({"p": p}), p=n(3, 4)),
            Call(
                "Adam.step",
                lambda g: training.Adam({"g": n(3, 4)}).step({"g": g}),
                g=n(3, 4),
            ),
        ),
    }


def _linear():
    r = -np.abs(n(2, 5)) / 4
    delta = dict(
        q=Q[:, :1].repeat(5, 1),
        k=n(2, 5, 4),
        v=V,
        g=r,
        beta=np.full((2, 5), 0.5),
    )
    la = dict(q=n(2, 5, 4), k=n(2, 5, 4), v=V)
    rec, chk = (
        attn_np.gated_delta_recurrent_forward,
        attn_np.gated_delta_chunked_forward,
    )
    ck = dict(x=n(1, 5, 3), w=n(2, 3))
    return {
        "attn_np.linear.attention.linear_attention_forward": lambda: one(
            fn(attn_np.linear_attention_forward, **la)
        ),
        "attn_np.linear.attention.linear_attention_backward": lambda: one(
            bw(
                attn_np.linear_attention_forward,
                la,
                attn_np.linear_attention_backward,
                "do",
            )
        ),
        "attn_np.linear.recurrent.gated_delta_recurrent_forward": lambda: (
            one(fn(rec, **delta, initial_state=n(2, 4, 3)))
        ),
        "attn_np.linear.recurrent.gated_delta_recurrent_backward": lambda: (
            one(bw(rec, delta, attn_np.gated_delta_recurrent_backward, "do"))
        ),
        "attn_np.linear.chunked.gated_delta_chunked_forward": lambda: one(
            fn(chk, **delta, initial_state=n(2, 4, 3), chunk_size=2)
        ),
        "attn_np.linear.chunked.gated_delta_chunked_backward": lambda: one(
            bw(chk, delta, attn_np.gated_delta_chunked_backward, "do")
        ),
        "attn_np.linear.conv.causal_conv_forward": lambda: one(
            fn(conv.causal_conv_forward, **ck, prev=n(1, 1, 3))
        ),
        "attn_np.linear.conv.causal_conv_backward": lambda: one(
            bw(conv.causal_conv_forward, ck, conv.causal_conv_backward, "dy")
        ),
        "attn_np.linear.layers.GatedDeltaNet": lambda: layer(
            lambda: attn_np.GatedDeltaNet(
                8, 2, 2, d_k=4, d_v=4, conv_size=2
            ),
            n(1, 5, 8),
        ),
        "attn_np.linear.layers.KimiDeltaAttention": lambda: layer(
            lambda: attn_np.KimiDeltaAttention(
                8, 2, d_k=4, d_v=4, conv_size=2
            ),
            n(1, 5, 8),
        ),
    }


def _sparse():
    ik = dict(q=n(1, 2, 3, 4), k=n(1, 5, 4), w=n(1, 3, 2))
    allowed = np.tril(np.ones((3, 5), dtype=bool), 2)[None]
    kl = dict(
        scores=n(1, 3, 5), weights=np.abs(n(1, 2, 3, 5)), allowed=allowed
    )
    mq = dict(
        q=n(1, 3, 2, 6),
        rows=n(1, 4, 6),
        idx=np.array([[[0, 1], [1, 2], [2, 3]]]),
        valid=np.ones((1, 3, 2), dtype=bool),
        d_v=4,
        scale=0.5,
    )
    return {
        "attn_np.sparse.index_scores_forward": lambda: one(
            fn(attn_np.index_scores_forward, **ik)
        ),
        "attn_np.sparse.index_scores_backward": lambda: one(
            bw(
                attn_np.index_scores_forward,
                ik,
                attn_np.index_scores_backward,
                "dI",
            )
        ),
        "attn_np.sparse.indexer_kl_forward": lambda: one(
            fn(attn_np.indexer_kl_forward, **kl)
        ),
        "attn_np.sparse.indexer_kl_backward": lambda: one(
            bw(
                attn_np.indexer_kl_forward,
                kl,
                attn_np.indexer_kl_backward,
                "dloss",
            )
        ),
        "attn_np.sparse.sparse_mqa_forward": lambda: one(
            fn(attn_np.sparse_mqa_forward, **mq)
        ),
        "attn_np.sparse.sparse_mqa_backward": lambda: one(
            bw(
                attn_np.sparse_mqa_forward,
                mq,
                attn_np.sparse_mqa_backward,
                "do",
            )
        ),
        "attn_np.sparse.top_k_mask": lambda: one(
            fn(attn_np.top_k_mask, scores=n(3, 5), k=2, allowed=MASK)
        ),
        "attn_np.sparse.block_top_n_mask": lambda: one(
            fn(
                attn_np.block_top_n_mask,
                q=n(1, 8, 4),
                k=n(1, 8, 4),
                block_size=2,
                n_blocks=2,
                q_positions=np.arange(8),
            )
        ),
        "attn_np.sparse.LightningIndexer": lambda: (
            layer(
                lambda: attn_np.LightningIndexer(8, 6, 2, 4, 2),
                n(1, 5, 8),
                fw=dict(c_q=n(1, 5, 6)),
            )
            + one(  # inference: the cached keys given
                Call(
                    "forward with keys",
                    lambda **a: attn_np.LightningIndexer(
                        8, 6, 2, 4, 2
                    ).forward(**a),
                    x=n(1, 2, 8),
                    c_q=n(1, 2, 6),
                    keys=n(1, 5, 4),
                )
            )
        ),
        "attn_np.sparse.SparseLatentAttention": lambda: layer(
            lambda: attn_np.SparseLatentAttention(
                8,
                2,
                4,
                4,
                2,
                d_latent_q=4,
                index_n_heads=2,
                index_head_dim=4,
                index_topk=2,
            ),
            n(1, 5, 8),
        ),
    }


def causal_lm(config):
    """Chapter 14's model with an embedding of the config's vocabulary
    (``load_gguf`` puts a checkpoint's in)."""
    m = CausalLM(config)
    m.embed.params["W"] = n(config.vocab_size, config.d_model)
    m.embed.grads["W"] = np.zeros_like(m.embed.params["W"])
    return m


LLAMA = LlamaConfig(
    vocab_size=7,
    d_model=8,
    n_layers=1,
    n_heads=2,
    n_kv_heads=1,
    d_k=4,
    d_ff=8,
    rope_base=1e4,
    rms_eps=1e-6,
    context_length=16,
    tied_embeddings=True,
)


def _layers():
    x = n(1, 5, 8)

    def gqa(**kw):
        return lambda: attn_np.GroupedQueryAttention(8, 2, 1, **kw)

    llama = LlamaConfig(
        vocab_size=7,
        d_model=8,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        d_k=4,
        d_ff=8,
        rope_base=1e4,
        rms_eps=1e-6,
        context_length=16,
        tied_embeddings=True,
    )
    return {
        "attn_np.multihead.MultiHeadAttention": lambda: layer(
            lambda: attn_np.MultiHeadAttention(8, 2),
            x,
            fw=dict(mask=np.ones((5, 5), bool)),
        ),
        "attn_np.multihead.GroupedQueryAttention": lambda: layer(
            gqa(sinks=True, rope_base=1e4), x, causal=True
        ),
        "attn_np.multihead.MultiQueryAttention": lambda: layer(
            lambda: attn_np.MultiQueryAttention(8, 2), x
        ),
        "attn_np.latent.MultiHeadLatentAttention": lambda: layer(
            lambda: attn_np.MultiHeadLatentAttention(8, 2, 4, 4, 2), x
        ),
        "attn_np.long_context.LongContextAttention": lambda: layer(
            lambda: attn_np.LongContextAttention(8, 2, 1), x
        ),
        "attn_np.refinements.RefinedAttention": lambda: layer(
            lambda: ref.RefinedAttention(
                8, 2, 1, biases=("q", "k", "v", "o"), qk_norm="head"
            ),
            x,
        ),
        "attn_np.shared_kv.KVReader": lambda: _reader_calls(x),
        "attn_np.shared_kv.SharedKVStack": lambda: layer(
            lambda: shared_kv.SharedKVStack(
                attn_np.GroupedQueryAttention(8, 2, 1, rope_base=1e4),
                [shared_kv.KVReader(8, 2, 1, rope_base=1e4, seed=1)],
            ),
            x,
        ),
        "attn_np.cross.CrossAttention": lambda: layer(
            lambda: CrossAttention(8, 2), x, fw=dict(memory=n(1, 4, 8))
        ),
        "attn_np.pretrained.model.CausalLM": lambda: layer(
            lambda: causal_lm(llama), np.array([[0, 3, 1, 6]])
        ),
        # the pools at the positions a call reads (both pages here)
        "attn_np.serving.paged.paged_attention": lambda: one(
            fn(
                paged_attention,
                q=n(1, 1, 2, 3, 4),
                k_pages=n(2, 4, 1, 4),
                v_pages=n(2, 4, 1, 4),
                tables=np.array([[0, 1]]),
                lengths=np.array([8]),
            )
        ),
        "attn_np.pretrained.sampling.sample_next": lambda: one(
            fn(
                sampling.sample_next,
                logits=n(2, 7),
                temperature=0.5,
                rng=np.random.default_rng(0),
            )
        ),
        "attn_np.serving.paged.paged_attention_by_page": lambda: one(
            fn(
                paged_by_page,
                q=n(1, 2, 3, 4),
                k_pages=n(2, 4, 1, 4),
                v_pages=n(2, 4, 1, 4),
                table=np.array([0, 1]),
                length=8,  # every position of both pages is read
            )
        ),
    }


def _caches_and_ids():
    kv = dict(k=n(1, 1, 3, 4), v=n(1, 1, 3, 4))
    lat = dict(c_kv=n(1, 3, 4), k_r=n(1, 3, 2))

    def write(k, v):
        c = attn_np.serving.PagedKVCache(4, 2, n_kv_heads=1, d_k=4)
        c.reserve("s", 3)
        return c.write(0, "s", 0, k, v)

    model = lambda: causal_lm(LLAMA)  # noqa: E731
    ids = np.array([1, 2, 1, 2, 4])
    return {
        "attn_np.kv_cache.KVCache": lambda: one(
            fn(attn_np.KVCache().append, **kv)
        ),
        "attn_np.kv_cache.ChunkedKVCache": lambda: one(
            fn(attn_np.ChunkedKVCache(2).append, **kv)
        ),
        "attn_np.latent.LatentKVCache": lambda: one(
            fn(attn_np.LatentKVCache().append, **lat)
        ),
        "attn_np.sparse.IndexedLatentCache": lambda: one(
            fn(
                attn_np.IndexedLatentCache().append,
                **lat,
                k_index=n(1, 3, 4),
            )
        ),
        "attn_np.serving.paged.PagedKVCache": lambda: one(
            fn(write, k=n(1, 3, 4), v=n(1, 3, 4))
        ),
        "attn_np.serving.paged.page_hashes": lambda: one(
            fn(attn_np.serving.page_hashes, tokens=ids, page_size=2)
        ),
        "attn_np._checks.check_token_ids": lambda: one(
            fn(attn_np.training.check_token_ids, ids=ids, vocab_size=7)
        ),
        "attn_np.streaming.stream_logits": lambda: one(
            fn(attn_np.stream_logits, model=transformer(), ids=ids[None])
        ),
        "attn_np.speculative.prompt_lookup_draft": lambda: one(
            fn(spec.prompt_lookup_draft, ids=ids, k=2)
        ),
        "attn_np.speculative.generate": lambda: one(
            fn(spec.generate, model=model(), ids=ids[None], max_new_tokens=2)
        ),
        "attn_np.serving.engine.generate_alone": lambda: one(
            fn(
                attn_np.serving.generate_alone,
                model=model(),
                prompt_ids=ids,
                max_new_tokens=2,
            )
        ),
        "attn_np.serving.engine.Engine": lambda: one(
            fn(
                attn_np.serving.Engine(
                    model(), page_size=2, n_pages=8
                ).add_request,
                prompt_ids=ids,
                max_new_tokens=2,
            )
        ),
        "attn_np.masks.document_ids": lambda: one(
            fn(masks.document_ids, cu_seqlens=np.array([0, 2, 5]))
        ),
        "attn_np.masks.document_positions": lambda: one(
            fn(masks.document_positions, cu_seqlens=np.array([0, 2, 5]))
        ),
        "attn_np.masks.document_mod": lambda: one(
            fn(masks.document_mod, cu_seqlens=np.array([0, 2, 5]))
        ),
        "attn_np.masks.image_block_ids": lambda: one(
            fn(
                masks.image_block_ids,
                token_type_ids=np.array([[0, 1, 1, 0]]),
            )
        ),
        "attn_np.masks.image_block_mod": lambda: one(
            fn(
                masks.image_block_mod,
                token_type_ids=np.array([[0, 1, 1, 0]]),
            )
        ),
        "attn_np.masks.tree_ancestors": lambda: one(
            fn(masks.tree_ancestors, parents=np.array([-1, 0, 0, 1]))
        ),
        "attn_np.masks.tree_depths": lambda: one(
            fn(masks.tree_depths, parents=np.array([-1, 0, 0, 1]))
        ),
        "attn_np.masks.tree_mod": lambda: one(
            fn(masks.tree_mod, parents=np.array([-1, 0, 0, 1]))
        ),
        "attn_np.speculative.prompt_lookup_tree": lambda: one(
            fn(spec.prompt_lookup_tree, ids=ids, k=2)
        ),
        "attn_np.masks.padding_mod": lambda: one(
            fn(masks.padding_mod, lengths=np.array([3, 5]))
        ),
    }


def _more_layers():
    x = n(1, 5, 8)
    hf = importlib.import_module("attn_np.hf.layers")
    gemma = importlib.import_module("attn_np.hf.families_gemma")
    return {
        "attn_np.hf.layers.HFAttention": lambda: layer(
            lambda: hf.HFAttention(8, 2, 1), x
        ),
        "attn_np.hf.families_gemma.GemmaAttention": lambda: layer(
            lambda: gemma.GemmaAttention(8, 2, 1, qk_norm="head", k_eq_v=1),
            x,
        ),
        "attn_np.hf.families_gemma.HFKVReader": lambda: _reader_calls(
            x, lambda: gemma.HFKVReader(8, 2, 1, 4, kv_source=0)
        ),
        "attn_np.hf.layers.HFLatentAttention": lambda: layer(
            lambda: hf.HFLatentAttention(8, 2, 4, 4, 2), x
        ),
        "attn_np.hf.layers.HFSparseLatentAttention": lambda: layer(
            lambda: hf.HFSparseLatentAttention(
                8,
                2,
                4,
                4,
                2,
                d_latent_q=4,
                index_n_heads=2,
                index_head_dim=4,
                index_topk=2,
            ),
            x,
        ),
        "attn_np.pretrained.model.DecoderBlock": lambda: layer(
            lambda: causal_lm(LLAMA).blocks[0], x
        ),
        "attn_np.training.transformer.Block": lambda: layer(
            lambda: training.Block(attn_np.MultiHeadAttention(8, 2), 8), x
        ),
    }


def hf_fixture(name, i=0):
    """A recorded layer's ``config.json`` and state dict (tests/fixtures)."""
    f = np.load(FIXTURES / f"{name}.npz")
    pre = f"layer{i}.param."
    state = {k[len(pre) :]: f[k] for k in f.files if k.startswith(pre)}
    return json.loads(str(f["config"])), state


def _hf():
    """The builders' state-dict entries are the arrays, each named by its
    HF key."""

    def build(f, name):
        cfg, state = hf_fixture(name)
        return Call(f.__name__, lambda **a: f(cfg, state_dict=a), **state)

    def frequencies():
        theta = attn_np.rope_frequencies(8)
        scaled = attn_np.scaled_frequencies(
            8, rope_scaling={"rope_type": "linear", "factor": 2.0}
        )[0]
        return fn(lc.frequency_bands, theta=theta, scaled=scaled, factor=2.0)

    return {
        "attn_np.hf.build.attention_from_hf": lambda: one(
            build(attn_np.attention_from_hf, "llama")
        ),
        "attn_np.hf.weights.gated_deltanet_from_hf": lambda: one(
            build(attn_np.gated_deltanet_from_hf, "qwen3_next")
        ),
        "attn_np.long_context.frequency_bands": lambda: one(frequencies()),
        "attn_np.refinements.MaxLogit": lambda: one(
            fn(ref.MaxLogit, allowed=MASK)
        ),
    }


CALLS = {
    **_hf(),
    **_caches_and_ids(),
    **_more_layers(),
    **_attention(),
    **_softmax(),
    **_grouped_flash(),
    **_rope(),
    **_norms(),
    **_refinements(),
    **_ffn_training(),
    **_linear(),
    **_sparse(),
    **_layers(),
}


# ------------------------------------------------------------ exemptions
EXEMPT = {}


def exempt(reason, *names):
    for name in names:
        assert name not in EXEMPT, name
        EXEMPT[name] = reason


exempt(
    "a constant: nothing to call",
    *(
        f"attn_np.{n}"
        for n in (
            "MODELS TOLERANCE convert.METHODS costs.CATALOGUE costs.GB "
            "costs.GiB costs.LATENT_MODELS costs.WINDOW_MODELS "
            "costs.catalogue.FULL costs.catalogue.SLIDING "
            "costs.hf_config.CHUNKED costs.hf_config.LINEAR "
            "costs.hf_config.MAX_CONFIG_BYTES costs.hf_config.MAX_LAYERS "
            "costs.hf_config.NOPE costs.hf_config.NO_CACHE "
            "costs.model.COST_LAYER_TYPES costs.model.LAYER_TYPES "
            "costs.model.MAX_LISTED_LAYERS costs.units.BINARY_UNITS "
            "flash.BIG flash.BLOCK_K flash.BLOCK_Q flash.FULL flash.LN2 "
            "flash.LOG2E flash.MASKED flash.PARALLEL_MIN_FLOPS "
            "flash.PARTS_PER_WORKER flash.SKIP flash.SUB "
            "grouped.DECODE_MAX_ROWS grouped.DECODE_PARALLEL_MIN_FLOPS "
            "grouped.MIN_STACKED_ROWS hf.config.MODEL_TYPE_ALIASES "
            "hf.families.FAMILIES hf.families.NAMES "
            "hf.weights.HF_LINEAR_KEYS hf.weights.HF_LINEAR_SPLIT_KEYS "
            "hf.weights.SPLIT_LINEAR_TYPES linear.KEEP_PARTS linear.KERNELS "
            "linear.chunked.GROUP_TOKENS linear.chunked.KEEP_SQUARES "
            "long_context.ROPE_TYPES memory.LENGTH_UNITS memory.LIMIT "
            "memory.UNITS pretrained.BUILT_TYPES "
            "pretrained.gguf_file.ARCHITECTURES "
            "pretrained.gguf_file.GGUF_MAGIC pretrained.gguf_file.SMOLLM2_FILE "
            "pretrained.tokenizer.CONTROL pretrained.tokenizer.PRE_TOKENIZERS "
            "rope.KEPT_POSITIONS rope.LAYOUTS softmax.SHORT_ROWS training.transformer.LAYER_KINDS "
            "training.transformer.POSITIONS"
        ).split()
    ),
)
exempt(
    "what a forward returns for its backward: made by the forward from "
    "the arrays it checked; a backward refuses a cache of another kind "
    "(check_backward_cache, test_bad_input_10_14)",
    *(
        f"attn_np.{n}"
        for n in (
            "attention.AttentionCache cross.CrossCache ffn.SwiGLUCache "
            "flash.FlashCache grouped.GroupedCache "
            "linear.attention.LinearAttentionCache linear.chunked.ChunkParts "
            "linear.chunked.ChunkedCache linear.recurrent.RecurrentCache "
            "norms.RMSNormCache refinements.TemperatureCache rope.RopeCache "
            "softmax.SoftmaxCache sparse.IndexScoreCache "
            "sparse.IndexerLossCache sparse.LayerNormCache "
            "sparse.SparseMQACache training.layers.EmbeddingCache "
            "training.layers.GeluCache training.layers.LinearCache "
            "training.losses.CrossEntropyCache windows.WindowCache"
        ).split()
    ),
)
exempt(
    "a cost formula: takes sizes and configs, no arrays; its bad sizes are "
    "refused by check_count and friends (test_memory, test_bad_input)",
    *(
        f"attn_np.costs.{n}"
        for n in (
            "decode.ChunkCost decode.attainable_flops decode.chunk_cost "
            "decode.decode_step_cost decode.kv_read_tokens_per_second "
            "decode.prefill_cost decode.ridge_point decode.roofline_time "
            "decode.shazeer_ratio latent.latent_cache_elements "
            "latent.latent_chunk_cost latent.latent_decode_step_cost "
            "latent.latent_param_count layer.activation_bytes "
            "layer.attention_weights_bytes layer.backward_flops "
            "layer.backward_flops_breakdown layer.forward_flops "
            "layer.forward_flops_breakdown layer.forward_retained_bytes "
            "layer.head_dims layer.matmul_flops layer.param_count "
            "layer.training_flops layer.weights_crossover_length "
            "model.Indexer model.LinearState model.ModelConfig "
            "model.cache_bytes model.cached_positions model.element_bytes "
            "model.get_model model.indexer_cache_bytes "
            "model.kv_bytes_per_token model.kv_cache_bytes "
            "model.max_concurrent_sequences model.max_context "
            "model.state_bytes model.weight_bytes "
            "sparse.dsa_cache_bytes_per_token sparse.indexer_key_bytes "
            "sparse.sparse_decode_step_flops units.format_bytes"
        ).split()
    ),
    "attn_np.flash.flash_attention_flops",
    "attn_np.linear.cache.state_bytes",
)
exempt(
    "reads a config (dict, JSON text or file), no arrays; malformed "
    "configs are test_hf_config's and test_bad_input_10_14's",
    "attn_np.costs.hf_config.from_hf_config",
    *(
        f"attn_np.hf.config.{n}"
        for n in (
            "alternate check_listed count flag get get_object kv_heads "
            "language_model layer_types load_config number "
            "parse_config_text read_file rope_flags rope_parameters windows"
        ).split()
    ),
    "attn_np.hf.families.layer_rope",
    "attn_np.hf.families.layer_settings",
    "attn_np.hf.families.plain_decoder",
    "attn_np.rope_scaling.read_rope_scaling",
    "attn_np.rope_scaling.rope_settings_from_config",
    "attn_np.long_context.with_rope_scaling",
    "attn_np.long_context.rope_layers",
)
exempt(
    "a step of attention_from_hf or gated_deltanet_from_hf (covered: "
    "their state-dict entries), or the way back, a layer's own grads "
    "to HF's names",
    "attn_np.hf.build.attention_layers_from_hf",
    *(
        f"attn_np.hf.weights.{n}"
        for n in (
            "gated_deltanet_grads_to_hf indexer_to_hf linear_to_hf "
            "load_linear load_state to_hf"
        ).split()
    ),
)
exempt(
    "reads a file (a recorded fixture, a GGUF checkpoint) or a "
    "tokenizer's strings: its bad files are test_pretrained's and "
    "test_bad_input_10_14's; ids given to decode go through "
    "check_token_ids (covered)",
    "attn_np.hf.build.fixture_errors",
    "attn_np.pretrained.gguf_file.GGUFCheckpoint",
    "attn_np.pretrained.gguf_file.LlamaConfig",
    "attn_np.pretrained.gguf_file.smollm2_path",
    "attn_np.pretrained.load_gguf",
    "attn_np.pretrained.tokenizer.GGUFTokenizer",
    "attn_np.pretrained.tokenizer.bytes_to_unicode",
    "attn_np.pretrained.tokenizer.tokenizer_from_gguf",
)
exempt(
    "appendix A1's command line and its parsers: text in, exit status "
    "out (test_memory_cli)",
    *(
        f"attn_np.memory.{n}"
        for n in "beyond_trained load main parse_bytes parse_length "
        "report summary".split()
    ),
)
exempt(
    "a checker: it is the check (exercised through every function that "
    "calls it, and in test_checks)",
    "attn_np._checks.check_window",
    "attn_np.costs.decode.check_amount",
    "attn_np.costs.decode.check_flag",
    "attn_np.costs.decode.check_rate",
    "attn_np.grouped.check_tiled",
    "attn_np.linear.attention.check_qkv",
    "attn_np.linear.cache.check_head_groups",
    "attn_np.linear.recurrent.check_delta_inputs",
    "attn_np.multihead.check_parts",
    "attn_np.multihead.check_positions",
    "attn_np.multihead.check_step_parts",
    "attn_np.rope.check_rope_settings",
    "attn_np.rope.check_rotary",
    "attn_np.training.layers.check_cache",
    "attn_np.training.layers.check_forward_done",
    "attn_np.training.loop.check_schedule",
)
exempt(
    "takes sizes, counts, flags or a seed, no arrays: its bad numbers "
    "are refused by check_count and friends (test_bad_input*)",
    "attn_np._workers.decode_workers",
    "attn_np.flash.block_plan",
    "attn_np.grouped.per_head_rows",
    "attn_np.long_context.Passkey",
    "attn_np.masks.ChunkedMask",
    "attn_np.masks.symmetric_window_mod",
    "attn_np.masks.causal_mask",
    "attn_np.masks.chunk_mod",
    "attn_np.masks.create_mask",
    "attn_np.masks.mask_for",
    "attn_np.masks.prefix_mod",
    "attn_np.masks.sink_mod",
    "attn_np.masks.window_mod",
    "attn_np.refinements.QueryTemperature",
    "attn_np.refinements.SoftCap",
    "attn_np.refinements.alibi_slopes",
    "attn_np.rope.rope_frequencies",
    "attn_np.rope.rope_permutation",
    "attn_np.rope.position_tables",
    "attn_np.rope.positions_tables",
    "attn_np.rope_scaling.scaled_frequencies",
    "attn_np.rope_scaling.softmax_scale",
    "attn_np.rope_scaling.yarn_correction_range",
    "attn_np.rope_scaling.yarn_mscale",
    "attn_np.streaming.MarkedCopy",
    "attn_np.training.layers.sinusoidal_positions",
    "attn_np.training.loop.lr_at",
    "attn_np.training.tasks.AssociativeRecall",
    "attn_np.training.transformer.full_attention_layer",
    "attn_np.linear.layers.transformer_layer",
)
exempt(
    "takes functions, layers, models or records, not arrays of numbers: "
    "the arrays inside reach the covered forwards, which check them",
    "attn_np.convert.mha_to_gqa",
    "attn_np.shared_kv.shared_kv",
    "attn_np.masks.and_masks",
    "attn_np.masks.evaluate_mask",
    "attn_np.speculative.verify_tree",
    "attn_np.masks.or_masks",
    "attn_np.pretrained.model.ModelCache",
    "attn_np.serving.engine.ModelParts",
    "attn_np.serving.engine.Request",
    "attn_np.speculative.SpeculativeStats",
    "attn_np.training.layers.Composite",
    "attn_np.training.loop.TrainLog",
    "attn_np.training.loop.evaluate",
    "attn_np.training.loop.train",
    "attn_np.training.loop.train_many",
    "attn_np.training.tasks.RecallBatch",
    "attn_np.training.transformer.register_layer_kind",
    "attn_np.grouped.ScoreContext",
)
exempt(
    "the serving engine's parts: a step's layout, the layer's attend for "
    "paged_attention, the gather of pages, the tables' padding, and the "
    "sampler's settings and its maker (the ids and logits they see come "
    "from the engine's checked prompts and the model's forwards)",
    "attn_np.serving.engine.Layout",
    "attn_np.serving.engine.layer_step",
    "attn_np.serving.paged.gather_batch",
    "attn_np.serving.paged.masked_attention",
    "attn_np.serving.paged.padded_tables",
    "attn_np.pretrained.sampling.check_sampling",
    "attn_np.pretrained.sampling.sampler",
)
exempt(
    "a cache's machinery, written by the covered caches' append (KVCache, "
    "LatentKVCache: append_parts checks each part) or by the delta-rule "
    "layers' forward, which checked its input (StateCache.update)",
    "attn_np.kv_cache.CacheBuffer",
    "attn_np.linear.cache.StateCache",
)
exempt(
    "an inner step of a covered kernel, called with arrays its caller "
    "checked: flash's tiles, grouped's tiled and decode paths, the "
    "softmax's and the delta rule's cores, the layer's parts and score "
    "mods (a second check would re-read the arrays every call)",
    "attn_np.flash.backward_into",
    "attn_np.flash.backward_tiles",
    "attn_np.flash.forward_tiles",
    "attn_np.flash.in_parallel",
    "attn_np.flash.Tiles",
    "attn_np.flash.tile_mask_of",
    "attn_np.grouped.decode_step_parts",
    "attn_np.grouped.group_mask",
    "attn_np.grouped.grouped_tiled_backward",
    "attn_np.grouped.grouped_tiled_forward",
    "attn_np.grouped.merge_partial_softmax",
    "attn_np.grouped.shared_mask",
    "attn_np.linear.chunked.chunk_group_backward",
    "attn_np.linear.chunked.unit_lower_inverse",
    "attn_np.linear.recurrent.sum_to",
    "attn_np.multihead.key_positions",
    "attn_np.refinements.GatedOutput",
    "attn_np.refinements.Projection",
    "attn_np.rope_scaling.llama3_frequencies",
    "attn_np.rope_scaling.yarn_frequencies",
    "attn_np.rope_scaling.longrope_frequencies",
    "attn_np.softmax.masked_softmax",
    "attn_np.softmax.row_max",
    "attn_np.sparse.selected_indices",
    "attn_np.masks.causal_mod",
)
exempt(
    "the decode fast path: one token's step, called by a layer's forward "
    "that checked its input (GUIDE: a check at the public entry point)",
    "attn_np.grouped.grouped_decode_step",
    "attn_np.pretrained.decode.decode_product",
    "attn_np.ffn.swiglu_step",
    "attn_np.norms.rmsnorm_step",
    "attn_np.rope.rope_step",
)
exempt(
    "an elementwise helper inside the layers (sigmoid, softplus, SiLU, "
    "ELU + 1), called on arrays they checked, on every step; a NaN in "
    "gives NaN at the same place out",
    "attn_np.linear.attention.elu_feature_map",
    "attn_np.linear.conv.silu",
    "attn_np.linear.conv.silu_backward",
    "attn_np.linear.gates.softplus",
    "attn_np.softmax.sigmoid",
)
exempt(
    "a reshape or transpose of a layer's checked arrays: moves numbers, "
    "computes none",
    *(
        f"attn_np.heads.{n}"
        for n in "flat merge_groups merge_heads side_by_side split_groups "
        "split_heads still_side_by_side".split()
    ),
)
exempt(
    "the lab's gradient check (attn_np.instruments, re-exported): it "
    "measures other functions; a NaN error compares false against "
    "TOLERANCE, so the check fails loudly",
    "attn_np.instruments.gradcheck.check_gradients",
    "attn_np.instruments.gradcheck.check_layer_gradients",
    "attn_np.instruments.gradcheck.numerical_gradient",
    "attn_np.instruments.gradcheck.rel_error",
)


# ------------------------------------------------------------ the spoilers
def spoiled(a):
    """``(label, bad array, errors allowed)`` for an array ``a``."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        nan, inf = a.copy(), a.copy()
        nan.flat[0], inf.flat[-1] = np.nan, np.inf
        return [
            ("NaN", nan, (ValueError,)),
            ("inf", inf, (ValueError,)),
            ("int64", np.round(a).astype(np.int64), (TypeError, ValueError)),
            ("complex", a.astype(complex), (TypeError, ValueError)),
            ("object", a.astype(object), (TypeError, ValueError)),
            ("str", a.astype(str), (TypeError, ValueError)),
        ]
    floats = a.astype(np.float64)
    nan = floats.copy()
    nan.flat[0] = np.nan
    inf = floats.copy()
    inf.flat[-1] = np.inf
    return [
        ("float with NaN", nan, (TypeError, ValueError)),
        ("float with inf", inf, (TypeError, ValueError)),
        ("complex", a.astype(complex), (TypeError, ValueError)),
        ("str", a.astype(str), (TypeError, ValueError)),
    ]


def failures_of(call: Call) -> list[str]:
    call.run(**call.arrays)  # valid: runs
    bad = []
    for name, a in call.arrays.items():
        for label, wrong, errors in spoiled(a):
            args = {**call.arrays, name: wrong}
            where = f"{call.what}({name}={label})"
            try:
                call.run(**args)
            except errors as e:
                if not re.search(
                    rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])",
                    str(e),
                ):
                    bad.append(f"{where}: message does not name it: {e}")
            except Exception as e:  # noqa: BLE001 - the failure is the point
                bad.append(f"{where}: {type(e).__name__}: {e}")
            else:
                bad.append(f"{where}: accepted")
    return bad


# ------------------------------------------------------------ the tests
def test_every_public_name_is_classified():
    names = set(public_names())
    calls, exempted = set(CALLS), set(EXEMPT)
    assert not calls & exempted, sorted(calls & exempted)
    unclassified = sorted(names - calls - exempted)
    assert not unclassified, (
        "public names in neither CALLS nor EXEMPT (add a call with small "
        f"arrays, or an exemption with its reason): {unclassified}"
    )
    stale = sorted((calls | exempted) - names)
    assert not stale, f"CALLS or EXEMPT name what is not public: {stale}"


@pytest.mark.parametrize("name", sorted(CALLS))
def test_public_name_refuses_nan_inf_and_wrong_dtypes(name):
    bad = [f for call in CALLS[name]() for f in failures_of(call)]
    assert not bad, "\n".join(bad)
