"""The KV-memory calculator's command line.

``python -m attn_np.memory CONFIG --seq-len N`` prints how much key/value
cache a model needs::

    python -m attn_np.memory config.json --seq-len 131072
    python -m attn_np.memory llama-3-8b --seq-len 128k \\
        --bytes-per-element 0.5
    python -m attn_np.memory config.json --seq-len 131072 --batch 8 \\
        --bytes-per-element 1 --budget 80GiB

``CONFIG`` is a Hugging Face ``config.json`` (or the folder holding one),
read by :func:`attn_np.costs.from_hf_config`, or the name of a model in
:data:`attn_np.costs.CATALOGUE` (``deepseek-v3``). It prints the kind of
attention (MHA, GQA, MQA or MLA, with or without windows), the bytes each
token adds, the cache of ``--batch`` sequences of ``--seq-len`` tokens in
binary units, and, with ``--budget``, the longest context whose cache fits
the budget (the cache alone: leave room for the weights yourself).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from fractions import Fraction

from .costs import (
    CATALOGUE,
    ModelConfig,
    cache_bytes,
    from_hf_config,
    indexer_cache_bytes,
    kv_bytes_per_token,
    kv_cache_bytes,
    max_context,
    state_bytes,
)
from .costs.hf_config import NOPE
from .costs.model import (
    CHUNKED,
    FULL,
    LINEAR,
    NO_CACHE,
    SLIDING,
    element_bytes,
)
from .costs.units import format_bytes

# units are case-sensitive in their last letter: B is a byte, b a bit
UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9}
UNITS |= {"TB": 10**12, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
UNITS |= {"TiB": 2**40, "": 1}
#: The largest number the command line takes (a budget in bytes, a
#: length, a batch): 2**80, a yobibyte, more than any machine holds.
LIMIT = 2**80


def parse_bytes(text: str) -> int:
    """``"80GiB" -> 85899345920``, ``"80 GB" -> 80000000000``: a size in
    bytes, with an optional decimal (kB, MB, GB, TB) or binary (KiB, MiB,
    GiB, TiB) unit.

    Exact (no float rounding), refused when ambiguous (``80Gb``: a lower
    case ``b`` is a bit), when it rounds to 0 bytes, or above 2**80.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2) if match else None
    canonical = {u.lower(): u for u in UNITS if u}
    if match and unit not in UNITS and unit.lower() in canonical:
        raise ValueError(
            f"a memory budget of {text!r} is ambiguous: write the unit as "
            f"{canonical[unit.lower()]} (a lower-case b is a bit, and "
            "kB, MB, GB are decimal, KiB, MiB, GiB binary)"
        )
    if not match or unit not in UNITS:
        raise ValueError(
            f"a memory budget looks like 80GiB or 80GB, got {text!r:.60}"
        )
    if len(match.group(1).split(".")[0].lstrip("0")) > 30:
        raise ValueError(
            f"a memory budget of {text!r:.60} is more than 2**80 bytes"
        )
    value = int(Fraction(match.group(1)) * UNITS[unit])
    if value < 1:
        raise ValueError(
            f"a memory budget of {text!r} is less than one byte"
        )
    if value > LIMIT:
        raise ValueError(
            f"a memory budget of {text!r} is more than 2**80 bytes"
        )
    return value


def load(config: str) -> ModelConfig:
    """A config.json (or its folder), else a name in the catalogue."""
    if config in CATALOGUE and not os.path.exists(config):
        return CATALOGUE[config]
    if not os.path.exists(config):
        raise ValueError(
            f"{config!r} is neither a file nor a model in the catalogue"
        )
    return from_hf_config(config)


def _nope(cfg) -> bool:
    """True when the config says no attention layer rotates (NoPE)."""
    kinds = (cfg.rope or {}).values()
    return bool(kinds) and all(
        p.get("rope_type") == NOPE["rope_type"] for p in kinds
    )


def _rope_line(cfg) -> list[str]:
    if not cfg.rope:
        return []
    parts, seen = [], []
    for kind in (FULL, SLIDING, CHUNKED):
        p = cfg.rope.get(kind)
        if p is None:
            continue
        seen.append(p)
        text = f"{p['rope_type']}"
        theta = p.get("rope_theta")
        if theta is not None:
            whole = float(theta).is_integer()
            text += f", theta {int(theta):,}" if whole else f", {theta:g}"
        if p.get("factor") is not None:
            text += f", factor {p['factor']:g}"
        if p.get("partial_rotary_factor") is not None:
            text += f", on {p['partial_rotary_factor']:g} of each head"
        parts.append(f"{kind.split('_')[0]}: {text}")
    if all(p == seen[0] for p in seen):  # one RoPE for every layer
        parts = [parts[0].split(": ", 1)[1]]
    return [f"rope         {'; '.join(parts)}"]


def _latent_lines(cfg) -> list[str]:
    """What an MLA model caches, against a cache of every head's keys and
    values (what transformers kept for DeepSeek-V2/V3 before 5.15.0)."""
    v = cfg.d_head_v or cfg.head_dim
    hf4 = cfg.n_heads * (cfg.head_dim + cfg.d_rope + v)
    ratio = hf4 / cfg.kv_numbers_per_layer
    return [
        f"             caching a latent of {cfg.d_latent_kv} and "
        + ("an unrotated" if _nope(cfg) else "a rotary")
        + f" key of {cfg.d_rope}",
        "             (every head's keys and values instead, as "
        "transformers",
        "             cached DeepSeek-V2/V3 before 5.15.0: "
        f"{hf4:,} numbers, {ratio:.1f}x)",
    ]


def _state_lines(cfg, seq_len, batch, b) -> list[str]:
    """The caches that are not keys and values: a linear layer's state
    and convolution inputs, DSA's indexer keys."""
    lines, counts = [], cfg.layer_counts
    if cfg.linear is not None:
        s = cfg.linear
        recurrent, conv = state_bytes(cfg, batch, b)
        lines += [
            f"state        {format_bytes(recurrent)} = {recurrent:,} "
            f"bytes, any context",
            f"             {counts[LINEAR]} layers x {s.n_v_heads} value "
            f"heads x {s.d_k} x {s.d_v}, "
            + (s.state_dtype if s.state_bytes else f"{b} per number"),
            f"conv state   {format_bytes(conv)} = {conv:,} bytes, "
            "any context",
            f"             {counts[LINEAR]} layers x {s.conv_dim:,} "
            f"channels x {s.conv_kernel} positions, {b} per number",
        ]
    if cfg.indexer is not None:
        ix = cfg.indexer
        idx = indexer_cache_bytes(cfg, seq_len, batch)
        lines += [
            f"indexer      {format_bytes(idx)} = {idx:,} bytes",
            f"             {cfg.n_attention_layers} layers x "
            f"{ix.bytes_per_token} bytes a token (FP8 key of "
            f"{ix.head_dim},",
            f"             a float32 scale per {ix.block}); each query "
            f"reads {ix.topk:,} tokens",
        ]
    return lines


#: Context lengths are quoted in powers of two: Llama 3.1's "128K" context
#: is 131,072 positions (its max_position_embeddings).
LENGTH_UNITS = {"": 1, "k": 2**10, "K": 2**10, "m": 2**20, "M": 2**20}


def parse_length(text: str) -> int:
    """``"128k" -> 131072``, ``"1M" -> 1048576``, ``"4096" -> 4096``: a
    context length, a whole number of tokens, with an optional ``k`` (1024)
    or ``M`` (1024**2)."""
    match = re.fullmatch(r"\s*([0-9]+)\s*([kKmM]?)\s*", str(text))
    if not match:
        raise ValueError(
            f"--seq-len looks like 131072, 128k or 1M, got {text!r:.60}"
        )
    digits, unit = match.groups()
    if len(digits.lstrip("0")) > 25:
        raise ValueError(f"--seq-len {text!r:.60} is more than 2**80")
    value = int(digits) * LENGTH_UNITS[unit]
    if value > LIMIT:
        raise ValueError(f"--seq-len {text!r:.60} is more than 2**80")
    return value


def _element(text: str):
    """``--bytes-per-element``: ``2``, ``1``, ``0.5`` (4 bits)."""
    try:
        value = Fraction(str(text).strip())
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(
            f"must be a number of bytes such as 2, 1 or 0.5, got "
            f"{text!r:.60}"
        ) from None
    try:
        return element_bytes(value, "--bytes-per-element")
    except ValueError:
        raise argparse.ArgumentTypeError(
            "must be a whole number of bits, in bytes (2, 1, 0.5 for 4 "
            f"bits, 0.375 for 3), got {text!r:.60}"
        ) from None


def _per_number(b) -> str:
    """``2`` or ``0.5 (4 bits)``: bytes per number as the report says."""
    b = Fraction(b)
    if b.denominator == 1:
        return f"{b.numerator}"
    return f"{int(8 * b)} bits"


def beyond_trained(cfg, seq_len) -> list[str]:
    """A warning line when ``seq_len`` passes the config's
    ``max_position_embeddings``: the cache is sized, but the model was not
    made to attend that far."""
    n = cfg.max_position_embeddings
    if n is None or seq_len <= n:
        return []
    return [
        f"note         {seq_len:,} tokens is past the config's",
        f"             max_position_embeddings ({n:,})",
    ]


def summary(cfg, seq_len, batch=1, bytes_per_element=2, budget=None):
    """The report's numbers as a dict (what ``--json`` prints)."""
    b = bytes_per_element
    fit = None if budget is None else max_context(cfg, budget, batch, b)
    return {
        "model": cfg.name,
        "kind": cfg.kind,
        "seq_len": seq_len,
        "batch": batch,
        "bytes_per_element": float(Fraction(b)),
        "bytes_per_token": kv_bytes_per_token(cfg, b),
        "kv_cache_bytes": kv_cache_bytes(cfg, seq_len, batch, b),
        "cache_bytes": cache_bytes(cfg, seq_len, batch, b),
        "max_position_embeddings": cfg.max_position_embeddings,
        "beyond_max_position_embeddings": bool(beyond_trained(cfg, seq_len)),
        "budget_bytes": budget,
        "max_context": None if budget is None else fit,
        "any_context_fits": budget is not None and fit is None,
    }


def report(cfg, seq_len, batch=1, bytes_per_element=2, budget=None):
    """The lines the command prints (each at most 77 characters)."""
    b = bytes_per_element
    per_token = kv_bytes_per_token(cfg, b)
    kv = kv_cache_bytes(cfg, seq_len, batch, b)
    total = cache_bytes(cfg, seq_len, batch, b)
    seqs = f"{batch:,} sequence" + ("s" if batch > 1 else "")
    counts = cfg.layer_counts
    n_attn = cfg.n_attention_layers
    heads = f"{cfg.n_layers} layers, {cfg.n_heads} query heads"
    if cfg.family != "MLA":
        kv_heads = "key/value head" + ("s" if cfg.n_kv_heads > 1 else "")
        heads += f", {cfg.n_kv_heads} {kv_heads} of {cfg.head_dim}"
    lines = [
        f"model        {cfg.name}",
        f"kind         {cfg.kind}",
        f"shape        {heads}",
    ]
    if cfg.family == "MLA":
        lines += _latent_lines(cfg)
    lines += _rope_line(cfg)
    lines.append(
        f"per token    {format_bytes(per_token)} = {per_token:,} bytes "
        f"({_per_number(b)} per number)"
    )
    if counts.get(LINEAR):
        lines.append(
            f"             in the {n_attn} attention layers; the "
            f"{counts[LINEAR]} linear layers do not grow"
        )
    if counts.get(NO_CACHE):
        lines.append(
            f"             the {counts[NO_CACHE]} layers that keep no "
            "cache (MLP, shared KV) add none"
        )
    for kind, what, w in (
        (SLIDING, "window", cfg.sliding_window),
        (CHUNKED, "chunked", cfg.attention_chunk_size),
    ):
        if counts.get(kind):
            lines.append(
                f"             ({what} layers stop growing at {w:,} tokens)"
            )
    if counts.get(SLIDING) or counts.get(CHUNKED):
        lines.append(
            "             (counting the W a step holds; HF keeps W - 1 "
            "between steps)"
        )
    lines += [
        f"KV cache     {format_bytes(kv)} = {kv:,} bytes",
        f"             for {seqs} of {seq_len:,} tokens",
    ]
    lines += _state_lines(cfg, seq_len, batch, b)
    if total != kv:
        lines.append(f"total        {format_bytes(total)} = {total:,} bytes")
    if budget is not None:
        fit = max_context(cfg, budget, batch, b)
        most = "any context" if fit is None else f"{fit:,} tokens"
        lines.append(
            f"max context  {most} x {seqs} in {format_bytes(budget)}"
        )
    return lines + beyond_trained(cfg, seq_len)


class _Parser(argparse.ArgumentParser):
    """argparse, answering a bad argument in one line (no usage block)."""

    def error(self, message):
        raise ValueError(message)


def _number(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be an integer, got {text!r:.60}"
            ) from None
        if not minimum <= value <= LIMIT:
            raise argparse.ArgumentTypeError(
                f"must be an integer from {minimum} to 2**80, got "
                f"{text!r:.60}"
            )
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="python -m attn_np.memory",
        description="How much key/value cache a model needs.",
    )
    parser.add_argument(
        "config",
        help="a config.json, its folder, or a model in the catalogue "
        f"({', '.join(CATALOGUE)})",
    )
    parser.add_argument(
        "--seq-len",
        required=True,
        help="tokens per sequence: 131072, 128k (= 131,072) or 1M",
    )
    parser.add_argument(
        "--batch",
        type=_number(1),
        default=1,
        help="sequences (default 1)",
    )
    parser.add_argument(
        "--bytes-per-element",
        type=_element,
        default=2,
        help="2 for bf16/fp16 (default), 1 for an 8-bit cache, 0.5 for "
        "a 4-bit one",
    )
    parser.add_argument(
        "--budget",
        help="memory for the cache, e.g. 80GiB or 80GB: print the longest "
        "context that fits",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the numbers as one JSON object instead",
    )
    try:
        args = parser.parse_args(argv)
        seq_len = parse_length(args.seq_len)
        budget = None if args.budget is None else parse_bytes(args.budget)
        cfg = load(args.config)
        b = args.bytes_per_element
        if args.json:
            text = json.dumps(summary(cfg, seq_len, args.batch, b, budget))
        else:
            text = "\n".join(report(cfg, seq_len, args.batch, b, budget))
    except (ValueError, TypeError, OSError, OverflowError) as err:
        message = " ".join(str(err).split())
        print(f"error: {message}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
