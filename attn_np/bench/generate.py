"""``python -m attn_np.bench generate``: a real model's prefill and decode
against what this machine allows (chapter 14).

SmolLM2-135M-Instruct (:func:`~attn_np.pretrained.load_gguf`, float32)
reads a prompt of ``--prompt`` tokens in one chunk (prefill) and then
decodes one token at a time over its cache (decode). Every contender is
timed in alternating rounds with the machine's own reference rates:

* prefill: its FLOPs (the weight products, the attention's scores and
  weighted values, the tied head) over its time, as a fraction of the
  rate of a ``[1024, 1024] @ [1024, 1024]`` float32 product timed in the
  same rounds, and so are its weight products alone (:func:`products_only`,
  the prefill without the work between them);
* decode: the step's roofline, the bytes it must read (every weight once,
  the tied embedding once as the head, and the cached keys and values) at
  the streaming-read rate of the same round (the fastest of
  :func:`~attn_np.instruments.measure.read_probes`), over the step's time.

Each ratio is taken round by round and printed as its median and
quartiles, beside the run's noise floor: the same step timed twice in the
same round (A/A). Where ``torch`` and ``transformers`` import (the fixture
environment, never the book's), ``transformers``' ``LlamaForCausalLM`` on
the same GGUF file, float32 on the CPU with as many threads as BLAS has
here, runs its prefill and its ``generate`` in the same rounds, and the
ratios of the times are printed the same way.

The BLAS thread count matters more than anything else here. A decode step
is some two hundred matrix-vector products; with two OpenBLAS threads on
a machine whose other core is busy, each product waits for the second
thread (measured here, beside other work: a step of 1.4 s with two
threads, 72 ms with one). ``--threads`` sets the count.
"""

from __future__ import annotations

import argparse
import contextlib
import io

import numpy as np

from attn_np.instruments.blas import (
    get_blas_threads,
    set_blas_threads,
)
from attn_np.instruments.measure import (
    alternating_times,
    capped_rounds,
    matmul_probe,
    ratio_spread,
    read_probes,
)
from attn_np.instruments.paired import spread_text
from attn_np.instruments.plotting import format_bytes
from attn_np.pretrained import load_gguf, smollm2_path
from attn_np.pretrained.decode import _by_rows, decode_product

from ._help import description as _description
from .serve import kernels_text


def weight_flops(config, L) -> float:
    """FLOPs of the weight products of a forward of ``L`` tokens: ``2 L``
    per weight of the blocks and of the head."""
    c = config
    d, h, n_kv, d_k, f = c.d_model, c.n_heads, c.n_kv_heads, c.d_k, c.d_ff
    per_layer = d * (h + 2 * n_kv) * d_k + h * d_k * d + 3 * d * f
    return 2.0 * L * (c.n_layers * per_layer + c.vocab_size * d)


def prefill_flops(config, L) -> float:
    """FLOPs of a prefill of ``L`` tokens: its weight products
    (:func:`weight_flops`) and the causal attention's ``q k^T`` and ``p
    v`` (``2 L (L + 1) / 2 d_k`` each per query head and layer)."""
    c = config
    attention = c.n_layers * c.n_heads * 2 * (2 * c.d_k * L * (L + 1) / 2)
    return weight_flops(config, L) + attention


def setup(model, prompt_len, seed=0):
    """``(prefill, step, cache)``: a prefill of ``prompt_len`` random
    tokens into a fresh cache, and a one-token decode step at that context
    (undone after each call, so every call sees the same cache)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, model.vocab_size, size=(1, prompt_len))
    cache = model.new_cache(prompt_len + 1)
    model.forward(ids, kv_cache=cache)
    nxt = ids[:, -1:]

    def prefill():
        model.forward(ids, kv_cache=model.new_cache(prompt_len))

    def step():
        model.forward(nxt, kv_cache=cache)
        cache.truncate(prompt_len)

    return prefill, step, cache


def products_only(model, rows=1, seed=0):
    """The weight products of a forward of ``rows`` positions alone, as
    the forward makes them: a decode step's (``rows=1``:
    :func:`~attn_np.pretrained.decode.decode_product` for every matrix of
    every block) or a prefill's (``rows`` positions as the rows of one
    matrix), one product for matrices packed side by side, and the tied
    head. The forward without its norms, RoPE, attention, SwiGLU's gate,
    cache, checks and Python, to time beside it."""
    rng = np.random.default_rng(seed)
    c = model.config
    x, h, o = (
        rng.standard_normal((rows, n)).astype(model.dtype)
        for n in (c.d_model, c.d_ff, c.n_heads * c.d_k)
    )  # [rows, d], [rows, d_ff], [rows, h d_k]
    E = model.head_weight  # [V, d], stored column by column

    def run():
        by_rows = _by_rows(x[:, None], model)  # [rows, 1, d]: as a step
        for blk in model.blocks:
            a, p = blk.attn.params, blk.ffn.params
            qkv, gate_up = blk.attn.packed_qkv, blk.ffn.packed_gate_up
            if qkv is None:
                x @ a["W_q"], x @ a["W_k"], x @ a["W_v"]
            else:  # side by side (pack_projections): one product
                decode_product(x, qkv, by_rows)
            if gate_up is None:
                x @ p["W_gate"], x @ p["W_up"]
            else:
                decode_product(x, gate_up, by_rows)
            (
                decode_product(o, a["W_o"], by_rows),
                decode_product(h, p["W_down"], by_rows),
            )
        return x @ E.T  # [rows, d] @ [d, V]

    return run


def hf_contenders(path, prompt_len, new_tokens, seed=0, threads=None):
    """``transformers``' prefill and ``generate`` on the GGUF at ``path``
    (float32, CPU), with ``threads`` torch threads (None: torch's own
    count), or None where torch or transformers do not import."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    if threads is not None:
        torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    with contextlib.redirect_stderr(io.StringIO()):  # its progress bars
        model = transformers.LlamaForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()
    rng = np.random.default_rng(seed)
    ids = torch.tensor(rng.integers(0, 49152, size=(1, prompt_len)))
    mask = torch.ones_like(ids)

    def prefill():
        with torch.no_grad():
            model(ids, use_cache=True)

    def generate():
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )

    return {
        "versions": f"transformers {transformers.__version__}, torch "
        f"{torch.__version__}, {torch.get_num_threads()} thread(s)",
        "prefill": prefill,
        "generate": generate,
    }


def main(argv) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attn_np.bench generate",
        description=_description(__doc__),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--prompt", type=int, default=128, help="prompt tokens (prefill)"
    )
    parser.add_argument(
        "--new-tokens",
        type=int,
        default=16,
        help="tokens decoded one at a time after the prompt",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=7,
        help="timing rounds, the contenders alternating",
    )
    parser.add_argument(
        "--blas-kernels",
        default=None,
        help="OpenBLAS's kernel set to run with (OPENBLAS_CORETYPE; the "
        "command starts again with it set). Default: the one OpenBLAS "
        "chose for this CPU",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="BLAS threads (default: as set, OPENBLAS_NUM_THREADS); "
        "transformers gets as many torch threads",
    )
    parser.add_argument(
        "--skip-hf",
        action="store_true",
        help="do not time transformers' generate (where torch imports)",
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        set_blas_threads(args.threads)

    model = load_gguf(dtype=np.float32)
    c = model.config
    P, n = args.prompt, args.new_tokens
    prefill, step, cache = setup(model, P)
    weight_bytes = model.nbytes
    cache_bytes = cache.nbytes
    step_bytes = weight_bytes + cache_bytes
    flops = prefill_flops(c, P)
    probes = read_probes()  # 512 MiB, as the weights: far beyond caches
    mm, mm_flops = matmul_probe()
    ids = np.random.default_rng(1).integers(0, c.vocab_size, (1, P))

    def ours_generate():
        model.generate(ids, n)

    fns = {
        "decode step": step,
        "decode step (A/A)": step,
        "products only": products_only(model),
    }
    fns.update({name: fn for name, (fn, _) in probes.items()})
    fns.update(
        {
            "prefill": prefill,
            "prefill products": products_only(model, rows=P),
            "matmul probe": mm,
        }
    )
    hf = (
        None
        if args.skip_hf
        else hf_contenders(smollm2_path(), P, n, threads=get_blas_threads())
    )
    if hf is not None:
        fns.update(
            {
                "generate (ours)": ours_generate,
                "generate (transformers)": hf["generate"],
                "prefill (transformers)": hf["prefill"],
            }
        )
    t = alternating_times(fns, rounds=args.rounds)
    rounds = capped_rounds(args.rounds)
    # per round: the fastest probe's rate (bytes/s) and the matmul rate
    stream = np.max(
        [nbytes / t[name] for name, (_, nbytes) in probes.items()], axis=0
    )
    matmul = mm_flops / t["matmul probe"]
    roof = step_bytes / stream  # s: the step's bytes at the streaming rate
    threads = get_blas_threads()

    print(
        f"SmolLM2-135M-Instruct, float32, {model.n_params:,} parameters "
        f"({format_bytes(weight_bytes)}, the tied embedding once); "
        f"{threads} BLAS thread(s) ({kernels_text()}); {rounds} "
        "alternating rounds"
    )
    print(
        f"streaming read (fastest probe, median): "
        f"{np.median(stream) / 1e9:.1f} GB/s; matmul: "
        f"{np.median(matmul) / 1e9:.1f} GFLOP/s"
    )
    print(
        f"\nprefill of {P} tokens: {flops / 1e9:.1f} GFLOP in "
        f"{np.median(t['prefill']) * 1e3:.0f} ms (median), "
        f"{P / np.median(t['prefill']):.0f} tokens/s"
    )
    r = ratio_spread(flops / t["prefill"], matmul)
    print(
        f"  its FLOP rate / the matmul probe's: {spread_text(r)} "
        "(median [quartiles] over the rounds)"
    )
    w = weight_flops(c, P) / t["prefill products"]
    print(
        "  its weight products alone (no norms, RoPE, attention, SwiGLU's "
        f"gate, checks): {np.median(t['prefill products']) * 1e3:.0f} ms, "
        f"{spread_text(ratio_spread(w, matmul))} of the matmul rate; the "
        "rest of the prefill, round by round: "
        f"{np.median(t['prefill'] - t['prefill products']) * 1e3:.0f} ms"
    )
    print(
        f"\ndecode step at {P} cached positions: reads "
        f"{format_bytes(step_bytes)} (weights {format_bytes(weight_bytes)}"
        f", cache {format_bytes(cache_bytes)}); "
        f"{np.median(t['decode step']) * 1e3:.1f} ms (median), "
        f"{1 / np.median(t['decode step']):.1f} tokens/s"
    )
    print(
        f"  roofline (those bytes at the streaming rate): "
        f"{np.median(roof) * 1e3:.1f} ms"
    )
    print(
        f"  roofline / step time: "
        f"{spread_text(ratio_spread(roof, t['decode step']))}"
    )

    print(
        "  its weight products alone (no norms, RoPE, cache, checks): "
        f"{np.median(t['products only']) * 1e3:.1f} ms; roofline / "
        f"products {spread_text(ratio_spread(roof, t['products only']))}"
    )

    def spread(a, b):  # round by round: t[a] / t[b]
        return spread_text(ratio_spread(t[a], t[b]))

    floor = spread("decode step (A/A)", "decode step")
    print(f"  noise floor (the step / itself, A/A): {floor}")
    if model.decode_by_rows is not None:  # measured at its first step
        how = "row by row" if model.decode_by_rows else "by BLAS"
        print(f"  its products made {how}, the faster here at one thread")
    if hf is not None:
        ours, theirs = (
            np.median(t[f"generate ({k})"]) * 1e3
            for k in ("ours", "transformers")
        )
        print(f"\ntransformers on the same GGUF, float32: {hf['versions']}")
        print(
            f"  generate {n} tokens after {P}: transformers / ours "
            f"{spread('generate (transformers)', 'generate (ours)')} "
            f"(ours {ours:.0f} ms, transformers {theirs:.0f} ms, "
            "prefill included)"
        )
        ours, theirs = (
            np.median(t[k]) * 1e3
            for k in ("prefill", "prefill (transformers)")
        )
        print(
            f"  prefill of {P} tokens: transformers / ours "
            f"{spread('prefill (transformers)', 'prefill')} "
            f"(ours {ours:.0f} ms, transformers {theirs:.0f} ms)"
        )
    elif not args.skip_hf:
        print(
            "\n(torch and transformers do not import here: transformers' "
            "generate is timed only in the fixture environment)"
        )
    return 0
