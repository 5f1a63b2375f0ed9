"""The tokenizer and chat template a GGUF file carries (chapter 14).

A GGUF holds no ``tokenizer.json``: its metadata lists the vocabulary
(``tokenizer.ggml.tokens``, spelled in GPT-2's byte alphabet), the merges
of byte-level BPE (``tokenizer.ggml.merges``), each token's type (3 is a
control token such as ``<|im_start|>``) and the chat template (Jinja).
:class:`GGUFTokenizer` hands them to Hugging Face's ``tokenizers``
library the way ``transformers``' own GGUF conversion does for the
``gpt2`` model with the ``gpt2`` and ``smollm`` pre-tokenizers: BPE over
bytes, GPT-2's split of the text, control tokens matched whole, and no
beginning-of-sequence token added. The tests check the ids against
``transformers``' tokenizer of the same file (a recorded fixture).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .._checks import check_token_ids

#: The pre-tokenizers (``tokenizer.ggml.pre``) built here: GPT-2's split.
PRE_TOKENIZERS = ("gpt2", "smollm", "default")
CONTROL = 3  # llama.cpp's token type of a control (special) token


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict:
    """GPT-2's byte alphabet: each byte ``0 ... 255`` as a printable
    character (the printable ones as themselves, the others from 256 on)."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


class GGUFTokenizer:
    """``encode(text) -> list[int]`` and ``decode(ids) -> str`` from a
    GGUF's vocabulary and merges; :meth:`chat_prompt` renders its chat
    template."""

    def __init__(
        self,
        tokens,
        merges,
        token_types=None,
        *,
        pre="gpt2",
        chat_template=None,
        bos_token_id=None,
        eos_token_id=None,
    ):
        from tokenizers import AddedToken, Tokenizer, decoders, models
        from tokenizers import pre_tokenizers as pre_tok

        if pre not in PRE_TOKENIZERS:
            raise ValueError(
                f"tokenizer.ggml.pre is {pre!r}; the pre-tokenizers built "
                f"here are {PRE_TOKENIZERS}"
            )
        spelling = bytes_to_unicode()
        alphabet = set(spelling.values())
        tokens = list(tokens)
        # a token outside the byte alphabet (rare) is spelled in it
        vocab = {
            (
                t
                if set(t) <= alphabet
                else "".join(spelling[b] for b in t.encode("utf-8"))
            ): i
            for i, t in enumerate(tokens)
        }
        pairs = [tuple(m.split(" ")) for m in merges]
        tok = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False))
        tok.pre_tokenizer = pre_tok.ByteLevel(
            add_prefix_space=False, use_regex=True
        )
        tok.decoder = decoders.ByteLevel()
        types = list(token_types) if token_types is not None else []
        special = [
            AddedToken(t, normalized=False, special=True)
            for t, kind in zip(tokens, types)
            if kind == CONTROL and set(t) <= alphabet
        ]
        tok.add_special_tokens(special)
        self.backend = tok
        self.vocab_size = len(tokens)
        self.tokens = tokens
        self.chat_template = chat_template
        self.bos_token_id, self.eos_token_id = bos_token_id, eos_token_id
        self.special_ids = sorted(vocab[t.content] for t in special)

    def __repr__(self) -> str:
        return (
            f"GGUFTokenizer(vocab_size={self.vocab_size}, byte-level BPE, "
            f"{len(self.special_ids)} control tokens)"
        )

    def encode(self, text) -> list[int]:
        """The token ids of ``text`` (control tokens such as
        ``<|im_start|>`` written in it are matched whole)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """The text of ``ids`` (a sequence of ints in the vocabulary),
        control tokens included."""
        a = check_token_ids(np.asarray(ids).reshape(-1), self.vocab_size)
        return self.backend.decode(a.tolist(), skip_special_tokens=False)

    def token(self, i) -> str:
        """The text of token ``i`` alone (for labels)."""
        return self.decode([i])

    def chat_prompt(self, messages, *, add_generation_prompt=True) -> str:
        """``messages`` (``[{"role": ..., "content": ...}, ...]``)
        rendered by the file's chat template, as ``transformers``'
        ``apply_chat_template(..., tokenize=False)`` does: a sandboxed
        Jinja environment with ``trim_blocks`` and ``lstrip_blocks``."""
        if self.chat_template is None:
            raise ValueError("this GGUF file carries no chat template")
        ok = isinstance(messages, (list, tuple)) and all(
            isinstance(m, dict) and {"role", "content"} <= set(m)
            for m in messages
        )
        if not ok or not messages:
            raise ValueError(
                "messages must be a non-empty list of dicts with 'role' and "
                f"'content', got {messages!r}"
            )
        return _template(self.chat_template).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self._text(self.bos_token_id),
            eos_token=self._text(self.eos_token_id),
        )

    def _text(self, i):
        return "" if i is None else self.tokens[i]


@lru_cache(maxsize=4)
def _template(source):
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols"],
    )
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def tokenizer_from_gguf(ckpt) -> GGUFTokenizer:
    """The :class:`GGUFTokenizer` of a
    :class:`~attn_np.pretrained.gguf_file.GGUFCheckpoint`."""
    model = ckpt.field("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(
            f"tokenizer.ggml.model is {model!r}; only byte-level BPE "
            "('gpt2') is built here"
        )
    return GGUFTokenizer(
        ckpt.require("tokenizer.ggml.tokens"),
        ckpt.require("tokenizer.ggml.merges"),
        ckpt.field("tokenizer.ggml.token_type"),
        pre=ckpt.field("tokenizer.ggml.pre", "default"),
        chat_template=ckpt.field("tokenizer.chat_template"),
        bos_token_id=ckpt.field("tokenizer.ggml.bos_token_id"),
        eos_token_id=ckpt.field("tokenizer.ggml.eos_token_id"),
    )
