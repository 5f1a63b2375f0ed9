"""The KV-memory calculator's command line.

``python -m attn_np.memory CONFIG --seq-len N`` prints how much key/value
cache a model needs::

    python -m attn_np.memory config.json --seq-len 131072
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
import os
import re
import sys

from .costs import (
    CATALOGUE,
    ModelConfig,
    from_hf_config,
    kv_bytes_per_token,
    kv_cache_bytes,
    max_context,
)
from .instruments.plotting import format_bytes

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9}
UNITS |= {"tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30}
UNITS |= {"tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"80GiB" -> 85899345920``, ``"80 GB" -> 80000000000``: a size in
    bytes, with an optional decimal (kB, MB, GB, TB) or binary (KiB, MiB,
    GiB, TiB) unit."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match and match.group(2).lower()
    if not match or unit not in UNITS or float(match.group(1)) <= 0:
        raise ValueError(
            f"a memory budget looks like 80GiB or 80GB, got {text!r}"
        )
    return int(float(match.group(1)) * UNITS[unit])


def load(config: str) -> ModelConfig:
    """A config.json (or its folder), else a name in the catalogue."""
    if config in CATALOGUE and not os.path.exists(config):
        return CATALOGUE[config]
    if not os.path.exists(config):
        raise ValueError(
            f"{config!r} is neither a file nor a model in the catalogue"
        )
    return from_hf_config(config)


def report(cfg, seq_len, batch=1, bytes_per_element=2, budget=None):
    """The lines the command prints (each at most 77 characters)."""
    b = bytes_per_element
    per_token = kv_bytes_per_token(cfg, b)
    total = kv_cache_bytes(cfg, seq_len, batch, b)
    seqs = f"{batch:,} sequence" + ("s" if batch > 1 else "")
    heads = f"{cfg.n_layers} layers, {cfg.n_heads} query heads"
    if cfg.family != "MLA":
        kv = "key/value head" + ("s" if cfg.n_kv_heads > 1 else "")
        heads += f", {cfg.n_kv_heads} {kv} of {cfg.head_dim}"
    lines = [
        f"model        {cfg.name}",
        f"kind         {cfg.kind}",
        f"shape        {heads}",
    ]
    if cfg.family == "MLA":
        lines.append(
            f"             caching a latent of {cfg.d_latent_kv} and a "
            f"rotary key of {cfg.d_rope}"
        )
    lines.append(
        f"per token    {format_bytes(per_token)} = {per_token:,} bytes "
        f"({b} per number)"
    )
    if cfg.n_window_layers:
        lines.append(
            "             (window layers stop growing at "
            f"{cfg.sliding_window:,} tokens)"
        )
    lines += [
        f"cache        {format_bytes(total)} = {total:,} bytes",
        f"             for {seqs} of {seq_len:,} tokens",
    ]
    if budget is not None:
        fit = max_context(cfg, budget, batch, b)
        most = "any context" if fit is None else f"{fit:,} tokens"
        lines.append(
            f"max context  {most} x {seqs} in {format_bytes(budget)}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attn_np.memory",
        description="How much key/value cache a model needs.",
    )
    parser.add_argument(
        "config",
        help="a config.json, its folder, or a model in the catalogue "
        f"({', '.join(CATALOGUE)})",
    )
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument(
        "--bytes-per-element",
        type=int,
        default=2,
        help="2 for bf16/fp16 (default), 1 for an 8-bit cache",
    )
    parser.add_argument(
        "--budget",
        help="memory for the cache, e.g. 80GiB or 80GB: print the longest "
        "context that fits",
    )
    args = parser.parse_args(argv)
    try:
        budget = None if args.budget is None else parse_bytes(args.budget)
        cfg = load(args.config)
        lines = report(
            cfg, args.seq_len, args.batch, args.bytes_per_element, budget
        )
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
