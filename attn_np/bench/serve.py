"""``python -m attn_np.bench serve``: serving many requests with a paged
cache and continuous batching (chapter 15), on SmolLM2-135M in float32.

Three measurements, each ratio taken in one run:

* throughput: a decode step of ``--batch`` sequences against a step of
  one, both at ``--context`` cached positions, in alternating rounds;
  tokens per second of each beside the step's roofline (the larger of
  its bytes at the streaming-read rate and its FLOPs at the matmul rate,
  both probed in the same rounds), with the A/A noise floor; and the
  same ratio for the step's products with the weights alone (every
  matrix of the blocks and the head, on random rows): where it is close
  to the step's, the weights set the step's ratio;
* memory: a random workload of ``--requests`` requests (prompts and
  outputs of 8 to 96 tokens), positions reserved over positions used,
  paged and contiguous (every running request preallocated to the
  workload's longest), summed over the steps. It is bookkeeping: the
  same on any machine;
* prefix caching: ``--requests`` requests sharing a ``--system``-token
  system prompt: prompt positions computed with prefix caching over
  without (counted), and the time of the two prefills (alternating
  rounds, A/A floor).

The batch's gain rests on its weight products: ``[B, d] @ [d, n]`` for
``B`` of 1 to 8 rows reads each matrix once, and is as fast as the BLAS
kernel for few rows. OpenBLAS holds several sets of kernels and picks one
for the CPU when NumPy loads it; the first line names the set, and the
environment variable ``OPENBLAS_CORETYPE`` (for example ``Haswell``),
set before Python starts, picks another. On a CPU where the sets differ
in their few-row products, the ratio of batch 8 to batch 1 differs with
them; ``--threads`` matters too (a product of 8 rows is not bound by
memory alone, so a second core helps it more than it helps one row).
"""

from __future__ import annotations

import argparse

import numpy as np

from attn_np.instruments.blas import (
    blas_kernels,
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
from attn_np.instruments.serving_lab import (
    decoding_engine,
    memory_trace,
    prefill_all,
    random_workload,
    shared_prompt_workload,
    step_bytes,
    step_flops,
)
from attn_np.pretrained import load_gguf

from ._help import description as _description


def kernels_text() -> str:
    """Which of OpenBLAS's kernel sets runs the products: it chooses
    one for the CPU when NumPy loads it (:func:`~attn_np.instruments.
    blas.blas_kernels`), and a batch's products of a few rows are where
    the sets differ most."""
    name = blas_kernels()
    if name is None:
        return "not OpenBLAS"
    return f"OpenBLAS's {name} kernels; OPENBLAS_CORETYPE chooses others"


def parse(argv):
    p = argparse.ArgumentParser(
        prog="python -m attn_np.bench serve",
        description=_description(__doc__),
    )
    p.add_argument(
        "--batch", type=int, default=8, help="sequences decoded together"
    )
    p.add_argument(
        "--context",
        type=int,
        default=64,
        help="cached positions of each sequence at the decode step",
    )
    p.add_argument(
        "--requests",
        type=int,
        default=8,
        help="requests of the memory and prefix-caching workloads",
    )
    p.add_argument(
        "--system",
        type=int,
        default=256,
        help="tokens of the shared system prompt",
    )
    p.add_argument(
        "--rounds", type=int, default=5, help="alternating timing rounds"
    )
    p.add_argument(
        "--blas-kernels",
        default=None,
        help="OpenBLAS's kernel set to run with (OPENBLAS_CORETYPE; the "
        "command starts again with it set). Default: the one OpenBLAS "
        "chose for this CPU",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="BLAS threads (default: as set, OPENBLAS_NUM_THREADS)",
    )
    return p.parse_args(argv)


def weight_products(model, batch, seed=0):
    """A function that makes a decode step's products with the weights
    for ``batch`` random rows: every matrix of every block (as the layers
    hold them: packed where packed) and the head, nothing else."""
    rng = np.random.default_rng(seed)
    mats = []
    for blk in model.blocks:
        for layer in (blk.attn, blk.ffn):
            packed = getattr(layer, "_packed", None)
            views = [] if packed is None else [id(v) for v in packed[1]]
            mats += [packed[0]] if packed is not None else []
            mats += [w for w in layer.params.values() if id(w) not in views]
    mats = [w for w in mats if w.ndim == 2] + [model.head_weight.T]
    rows = {
        n: rng.standard_normal((batch, n)).astype(model.dtype)
        for n in {w.shape[0] for w in mats}
    }

    def products():
        for w in mats:
            rows[w.shape[0]] @ w  # [batch, in] @ [in, out]

    return products


def throughput(model, batch, context, rounds):
    """Lines on tokens per second at ``batch`` against 1."""
    _, one = decoding_engine(model, 1, context)
    _, many = decoding_engine(model, batch, context)
    probes = read_probes()
    mm, mm_flops = matmul_probe()
    fns = {"1": one, "B": many, "1 (A/A)": one, "matmul": mm}
    fns["W 1"] = weight_products(model, 1)
    fns["W B"] = weight_products(model, batch)
    fns.update({name: fn for name, (fn, _) in probes.items()})
    t = alternating_times(fns, rounds=rounds)
    stream = np.max([b / t[n] for n, (_, b) in probes.items()], axis=0)
    matmul = mm_flops / t["matmul"]
    lines = [
        f"decode at {context} cached positions, float32, "
        f"{get_blas_threads()} BLAS thread(s) ({kernels_text()}), "
        f"{capped_rounds(rounds)} "
        "rounds",
        f"  streaming read {np.median(stream) / 1e9:.1f} GB/s, matmul "
        f"{np.median(matmul) / 1e9:.1f} GFLOP/s (medians)",
        f"  {'batch':>5} {'step ms':>8} {'tokens/s':>9} {'at roof':>9}"
        f" {'bound':>7}  (at roof: the roofline's)",
    ]
    for b, name in ((1, "1"), (batch, "B")):
        by_bytes = step_bytes(model, b, context) / stream
        by_flops = step_flops(model, b, context) / matmul
        roof = np.maximum(by_bytes, by_flops)
        bound = (
            "memory"
            if np.median(by_bytes) >= np.median(by_flops)
            else ("compute")
        )
        lines.append(
            f"  {b:5d} {np.median(t[name]) * 1e3:8.1f} "
            f"{b / np.median(t[name]):9.1f} {b / np.median(roof):9.1f} "
            f"{bound:>7}"
        )
    gain = ratio_spread(batch * np.asarray(t["1"]), t["B"])
    lines.append(
        f"  tokens/s at batch {batch} / at batch 1: {spread_text(gain)}"
    )
    lines.append(
        "  noise floor (batch 1 / itself, A/A): "
        f"{spread_text(ratio_spread(t['1 (A/A)'], t['1']))}"
    )
    wb = ratio_spread(batch * np.asarray(t["W 1"]), t["W B"])
    lines.append(
        f"  the weight products alone, {batch} rows / 1: {spread_text(wb)}"
    )
    # a step of `batch` rows does at least its weight products: batch
    # times the one-row step over those products bounds the first ratio
    cap = ratio_spread(batch * np.asarray(t["1"]), t["W B"])
    lines.append(
        f"  bound, a step of {batch} doing only its weight products: "
        f"{spread_text(cap)}"
    )
    return lines


def memory(model, n):
    """Lines on positions reserved over used, paged and contiguous."""
    work = random_workload(0, n, vocab=model.vocab_size)
    trace, eng = memory_trace(
        model, work, page_size=16, n_pages=64, max_batch_tokens=128
    )
    used = trace["used"].sum()
    longest = max(len(p) + m for p, m in work)
    return [
        f"random workload: {n} requests, prompts and outputs of 8 to 96 "
        f"tokens,",
        f"  {eng.stats['steps']} steps; pages of 16 positions; "
        f"contiguous: {longest} each",
        "  reserved / used, summed over the steps: paged "
        f"{trace['paged'].sum() / used:.3f}, contiguous "
        f"{trace['contiguous'].sum() / used:.2f}",
    ]


def prefix(model, n, system, rounds):
    """Lines on prefill work with and without prefix caching."""
    prompts = shared_prompt_workload(
        1, n, system, 16, vocab=model.vocab_size
    )
    kw = dict(max_batch_tokens=512)
    runs = {
        c: prefill_all(model, prompts, prefix_caching=c, **kw)
        for c in (False, True)
    }
    fns = {
        "without": lambda: prefill_all(
            model, prompts, prefix_caching=False, **kw
        ),
        "with": lambda: prefill_all(
            model, prompts, prefix_caching=True, **kw
        ),
    }
    fns["without (A/A)"] = fns["without"]
    t = alternating_times(fns, rounds=max(1, rounds // 2))
    p0, p1 = runs[False].stats["prefill"], runs[True].stats["prefill"]
    return [
        f"{n} requests, a shared {system}-token system prompt + 16 "
        "tokens each:",
        f"  prompt positions computed: without prefix caching {p0}, "
        f"with {p1}",
        f"  with / without: {p1 / p0:.3f} (counted); time "
        f"{spread_text(ratio_spread(t['with'], t['without']))}",
        "  noise floor (without / itself, A/A): "
        f"{spread_text(ratio_spread(t['without (A/A)'], t['without']))}",
    ]


def main(argv) -> int:
    args = parse(argv)
    if args.threads is not None:
        set_blas_threads(args.threads)
    model = load_gguf(dtype=np.float32)
    print(
        f"SmolLM2-135M-Instruct, {model.n_params:,} parameters; "
        "ratios measured in this run"
    )
    print()
    for line in throughput(model, args.batch, args.context, args.rounds):
        print(line)
    print()
    for line in memory(model, args.requests):
        print(line)
    print()
    for line in prefix(model, args.requests, args.system, args.rounds):
        print(line)
    return 0
