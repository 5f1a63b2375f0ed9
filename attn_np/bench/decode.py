"""``python -m attn_np.bench decode``: is a decode step as fast as memory
allows? (chapter 4)

One attention layer in float32 decodes one token per sequence over a
key/value cache of ``--context`` positions, as multi-head (``n_kv_heads =
n_heads``), grouped-query (``n_heads / 4``) and multi-query (1) attention.
Printed, all from the same run:

* the streaming-read bandwidth of this machine (the best of a one-thread
  ``np.sum`` and an all-threads BLAS gemv over a 512 MiB array), the
  reference;
* for each family: the cache size, the bytes a step must move
  (:func:`attn_np.costs.decode.decode_step_cost`), the best step time, and
  the bytes per second as a fraction of the reference;
* the decode-step time of MHA over MQA.

Every candidate is timed in turns with the reference
(:func:`attn_np.instruments.measure.best_times`), so a busy moment on a
shared machine slows all of them alike, and the best round of each is kept.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from attn_np.costs.decode import decode_step_cost
from attn_np.instruments.measure import best_times, read_probes
from attn_np.instruments.plotting import format_bytes
from attn_np.kv_cache import KVCache
from attn_np.multihead import GroupedQueryAttention

# the decode step should move at least half the reference bandwidth
GOAL = 0.5


def cpu_cache_sizes() -> dict:
    """``{"L1d": bytes, "L2": bytes, "L3": bytes}`` of CPU 0 from Linux's
    sysfs (empty elsewhere)."""
    sizes = {}
    for index in sorted(
        Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")
    ):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1], 1)
        name = f"L{level}" + ("d" if kind == "Data" else "")
        sizes[name] = int(size.rstrip("KMG")) * scale
    return sizes


def decode_setup(d_model, n_heads, n_kv_heads, context, batch=1, seed=0):
    """A float32 layer, a cache filled with ``context`` random positions, and
    a one-token step.

    ``step()`` decodes one token and then forgets it again
    (:meth:`KVCache.truncate`), so every call sees the same context and
    nothing is reallocated (the cache is preallocated one position longer).
    """
    layer = GroupedQueryAttention(
        d_model, n_heads, n_kv_heads, seed=seed, dtype=np.float32
    )
    rng = np.random.default_rng(seed)
    cache = KVCache(initial_capacity=context + 1)
    shape = (batch, n_kv_heads, context)
    cache.append(
        rng.standard_normal(shape + (layer.d_k,), dtype=np.float32),
        rng.standard_normal(shape + (layer.d_v,), dtype=np.float32),
    )
    x = rng.standard_normal((batch, 1, d_model), dtype=np.float32)

    def step():
        # [B, 1, d_model] over context + 1 keys
        layer.forward(x, kv_cache=cache)
        cache.truncate(context)

    return layer, cache, step


def run(
    d_model=1024,
    n_heads=16,
    context=32768,
    batch=1,
    rounds=20,
    probe_bytes=512 * 2**20,
):
    """Measure; returns a dict of every figure :func:`main` prints."""
    families = {"MHA": n_heads, "GQA": max(1, n_heads // 4), "MQA": 1}
    fns, costs, caches = {}, {}, {}
    probes = read_probes(probe_bytes)
    for name, (fn, _) in probes.items():
        fns[name] = fn
    for fam, n_kv in families.items():
        layer, cache, step = decode_setup(
            d_model, n_heads, n_kv, context, batch
        )
        fns[fam] = step
        caches[fam] = cache.nbytes
        costs[fam] = decode_step_cost(batch, context, d_model, n_heads, n_kv)
    times = best_times(fns, rounds=rounds)
    bandwidths = {
        name: nbytes / times[name] for name, (_, nbytes) in probes.items()
    }
    ref_name = max(bandwidths, key=bandwidths.get)
    ref = bandwidths[ref_name]
    rows = {}
    for fam, n_kv in families.items():
        rate = costs[fam].bytes / times[fam]
        rows[fam] = {
            "n_kv_heads": n_kv,
            "cache_bytes": caches[fam],
            "step_bytes": costs[fam].bytes,
            "step_flops": costs[fam].flops,
            "time": times[fam],
            "bytes_per_s": rate,
            "fraction": rate / ref,
        }
    return {
        "config": {
            "d_model": d_model,
            "n_heads": n_heads,
            "context": context,
            "batch": batch,
            "rounds": rounds,
        },
        "bandwidths": bandwidths,
        "reference": ref,
        "reference_name": ref_name,
        "rows": rows,
        "mha_over_mqa": times["MHA"] / times["MQA"],
        "bytes_mha_over_mqa": costs["MHA"].bytes / costs["MQA"].bytes,
    }


def main(argv) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attn_np.bench decode",
        description=__doc__.split("\n")[0],
    )
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument(
        "--context",
        type=int,
        default=32768,
        help="cached positions (default 32768)",
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    busy = busy_warning()
    r = run(args.d_model, args.heads, args.context, args.batch, args.rounds)
    c = r["config"]
    d_k = c["d_model"] // c["n_heads"]
    print(
        "decode step of one attention layer, float32: "
        f"d_model={c['d_model']}, n_heads={c['n_heads']}, "
        f"d_k=d_v={d_k}, batch {c['batch']}, context {c['context']} "
        f"positions; best of {c['rounds']} rounds"
    )
    caches = cpu_cache_sizes()
    if caches:
        print(
            "CPU caches: "
            + ", ".join(f"{k} {format_bytes(v)}" for k, v in caches.items())
        )
    bw = ", ".join(
        f"{k} {v / 2**30:.1f} GiB/s" for k, v in r["bandwidths"].items()
    )
    print(f"streaming read of 512 MiB: {bw}")
    print(
        f"reference bandwidth: {r['reference'] / 2**30:.1f} GiB/s "
        f"({r['reference_name']}, the best of the two)"
    )
    print()
    print(
        f"{'':5}{'n_kv':>5}{'KV cache':>12}{'bytes/step':>12}"
        f"{'time/step':>11}{'bytes/s':>12}{'of reference':>14}"
    )
    for fam, row in r["rows"].items():
        print(
            f"{fam:5}{row['n_kv_heads']:>5}{format_bytes(row['cache_bytes']):>12}{format_bytes(row['step_bytes']):>12}"
            f"{row['time'] * 1e3:>8.2f} "
            f"ms{row['bytes_per_s'] / 2**30:>7.1f} "
            f"GiB/s{row['fraction']:>14.2f}"
        )
    print()
    mha = r["rows"]["MHA"]
    print(
        f"MHA decode step: {mha['bytes_per_s'] / 2**30:.1f} GiB/s = "
        f"{mha['fraction']:.2f} of the reference "
        f"bandwidth (goal >= {GOAL}): "
        f"{'met' if mha['fraction'] >= GOAL else 'NOT met'}"
    )
    print(
        f"decode-step time MHA / MQA: {r['mha_over_mqa']:.1f}x (bytes "
        f"moved MHA / MQA: {r['bytes_mha_over_mqa']:.1f}x)"
    )
    l3 = caches.get("L3")
    if l3 and r["rows"]["MQA"]["cache_bytes"] <= l3:
        print(
            "note: the MQA cache "
            f"({format_bytes(r['rows']['MQA']['cache_bytes'])}) is not "
            "larger than L3 "
            f"({format_bytes(l3)}); part of it may be served from cache, "
            "not memory"
        )
    busy = busy or busy_warning()
    if busy:
        print(busy)
    return 0


def busy_warning() -> str:
    """A warning when other processes compete for the cores (Unix load
    average above the CPU count).

    A decode step makes dozens of small BLAS calls, and at each one BLAS's
    threads must all get a core; on a busy machine they wait for one, and the
    step slows far more than one big read does.
    """
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return ""
    cpus = os.cpu_count() or 1
    if load <= cpus:
        return ""
    return (
        f"warning: load average {load:.1f} on {cpus} CPUs: other processes "
        "compete for the cores, and the many "
        "small BLAS calls of a decode step suffer far more than one large "
        "read; run this on an idle machine"
    )
