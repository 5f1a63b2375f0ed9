"""``python -m attn_np.bench linear``: Gated DeltaNet, chunked against the
per-token loop (chapter 12).

One Qwen3-Next-shaped layer, scaled to fit: Qwen3-Next-80B-A3B's linear
layers have 16 key heads and 32 value heads of ``d_k = d_v = 128`` on a
model width of 2048 (its ``config.json``); here every count and width
divided by 16, the head dimensions kept: 1 key head and 2 value heads of
128 on a width of 128, kernel 4, float32, one sequence. A step is one
forward and one backward of :class:`attn_np.GatedDeltaNet`.

* **speed**: at each ``T`` the layer with ``mode="recurrent"`` (the loop
  over tokens, backpropagation through time) and ``mode="chunked"``
  (chunks of 32 by default, the fastest of 16, 32, 64 and 128 on the
  machine the book was written on), in turns, plus the chunked layer a
  second time: the ratio loop / chunked is taken round by round, and
  chunked / chunked again is the run's noise floor. The two forms
  alone (the kernels on the layer's ``q, k, v, g, beta``, without the
  projections, the convolutions and the norms, which both forms share)
  take their turns in the same rounds. Goal: loop / chunked >= 10 at
  ``T = 4096``. Both forms share every part outside the kernel (the
  projections, the convolution, the norms, the gates), so the layer's
  ratio is the kernels' diluted by that shared work: :func:`breakdown`
  times each part as the layer calls it, and the report says what
  share each takes.
* **memory**: the peak bytes traced by tracemalloc during one step of
  each form at every ``T``. Goal: the chunked form's peak at ``4 T`` at
  most 4.5 times its peak at ``T`` (it keeps one state per chunk).

Both run with one BLAS thread (``--threads`` to change): on a shared
machine a threaded product of a few small matrices mostly waits for its
threads. Both run with glibc keeping freed memory for the next step
(:func:`~attn_np.instruments.allocator.keep_freed_memory`;
``--return-freed`` to measure without): otherwise every step of either
form pays the kernel for zeroing fresh pages (measured on the 2-core
machine the book was written on, at ``T = 4096``: 10,000-14,000 page
faults and 40-60 ms of system time per chunked step, 0.08 s and more per
loop step; with the freed memory kept, none). Keeping it speeds up both
forms (the chunked step the more), so it is no thumb on the scale.
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import numpy as np

from ..instruments.allocator import keep_freed_memory
from ..instruments.blas import blas_threads
from ..instruments.measure import capped_rounds, measure_memory
from ..linear import (
    GatedDeltaNet,
    gated_delta_chunked_backward,
    gated_delta_chunked_forward,
    gated_delta_recurrent_backward,
    gated_delta_recurrent_forward,
)
from ..linear import layers as la
from ._help import description as _description

SHAPE = dict(d_model=128, n_v_heads=2, n_k_heads=1, d_k=128, d_v=128)


def layer_step(T, mode, *, chunk_size=32, dtype=np.float32, seed=0):
    """One forward + backward of the scaled layer (``SHAPE``) on ``[1, T,
    128]``, as a function of nothing."""
    layer = GatedDeltaNet(
        SHAPE["d_model"],
        SHAPE["n_v_heads"],
        SHAPE["n_k_heads"],
        d_k=SHAPE["d_k"],
        d_v=SHAPE["d_v"],
        mode=mode,
        chunk_size=chunk_size,
        dtype=dtype,
        seed=seed,
    )
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, T, SHAPE["d_model"])).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)

    def step():
        layer.forward(x)
        dx = layer.backward(dy)
        # let the step keep nothing: the loop's cache holds T + 1 states
        # (0.5 GB at T = 4096), and a contender that allocates while
        # another's stay alive pays for fresh pages
        layer._cache = None
        return dx

    return step


def kernel_step(T, form, *, chunk_size=32, dtype=np.float32, seed=0):
    """One forward + backward of the gated delta rule alone, on the
    layer's shapes (``[1, n_k, G, T, d]``, unit keys), as a function."""
    rng = np.random.default_rng(seed)
    lead = (1, SHAPE["n_k_heads"], SHAPE["n_v_heads"] // SHAPE["n_k_heads"])
    d_k, d_v = SHAPE["d_k"], SHAPE["d_v"]
    q = rng.standard_normal((*lead, T, d_k)) / np.sqrt(d_k)
    k = rng.standard_normal((*lead, T, d_k))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((*lead, T, d_v))
    g = -rng.uniform(0.01, 0.5, (*lead, T))
    beta = rng.uniform(0.1, 0.9, (*lead, T))
    do = rng.standard_normal(v.shape)
    q, k, v, g, beta, do = (x.astype(dtype) for x in (q, k, v, g, beta, do))
    if form == "chunked":
        fwd, bwd = gated_delta_chunked_forward, gated_delta_chunked_backward
        kw = {"chunk_size": chunk_size}
    else:
        fwd, bwd = (
            gated_delta_recurrent_forward,
            gated_delta_recurrent_backward,
        )
        kw = {}

    def step():
        _, cache = fwd(q, k, v, g, beta, **kw)
        return bwd(do, cache)

    return step


def speed(
    Ts=(1024, 2048, 4096), *, rounds=3, chunk_size=32, keep_freed=True
):
    """``{T: {"loop / chunked": (median, q1, q3), "kernels": (...),
    "A/A": (...), "cpu": {...}, "chunked s": best, "loop s": best}}``:
    the layers' ratio, the kernels' alone and the noise floor, round by
    round, in wall-clock time; ``"cpu"`` holds the same three ratios in
    the process's CPU time (which a busy machine inflates less: it does
    not count the time spent waiting for a core). ``keep_freed``: both
    forms run with :func:`~attn_np.instruments.allocator.
    keep_freed_memory`."""
    with keep_freed_memory(keep_freed):
        return _speed(Ts, rounds, chunk_size)


def _speed(Ts, rounds, chunk_size):
    out = {}
    for T in Ts:
        fns = {
            "loop": layer_step(T, "recurrent"),
            "chunked": layer_step(T, "chunked", chunk_size=chunk_size),
            "chunked again": layer_step(T, "chunked", chunk_size=chunk_size),
            "kernel loop": kernel_step(T, "recurrent"),
            "kernel chunked": kernel_step(
                T, "chunked", chunk_size=chunk_size
            ),
        }
        t, cpu = _alternating_both(fns, rounds)
        stats = {}
        for clock, tt in (("wall", t), ("cpu", cpu)):
            stats[clock] = {
                "loop / chunked": _quartiles(tt["loop"] / tt["chunked"]),
                "kernels": _quartiles(
                    tt["kernel loop"] / tt["kernel chunked"]
                ),
                "A/A": _quartiles(tt["chunked again"] / tt["chunked"]),
            }
        out[T] = {
            **stats["wall"],
            "cpu": stats["cpu"],
            "loop s": float(t["loop"].min()),
            "chunked s": float(t["chunked"].min()),
        }
    return out


def memory(Ts=(1024, 4096), *, chunk_size=32):
    """``{T: {"chunked": peak bytes, "loop": peak bytes}}`` of one step."""
    out = {}
    for T in Ts:
        out[T] = {
            mode: measure_memory(
                layer_step(T, form, chunk_size=chunk_size)
            ).peak
            for mode, form in (("chunked", "chunked"), ("loop", "recurrent"))
        }
    return out


# the parts of one layer step, as the layer calls them (module functions
# and methods looked up at call time, so a timing wrapper sees each call)
PARTS = {
    "kernel": ("KERNELS",),
    "conv + SiLU": ("causal_conv_forward", "causal_conv_backward"),
    "L2 norm": ("l2norm_forward", "l2norm_backward"),
    "gates": (
        "GatedDeltaNet._gates_forward",
        "GatedDeltaNet._gates_backward",
        "GatedDeltaNet._output_gate_forward",
        "GatedDeltaNet._output_gate_backward",
    ),
    "gated RMSNorm": ("rmsnorm_forward", "rmsnorm_backward"),
}
#: what is left: the one in-projection, the out-projection and the
#: reshapes between the parts, inline in forward and backward
REST = "projections + layout"


@contextmanager
def timed_parts():
    """Within the block, every call of a part of :data:`PARTS` adds its
    time to ``spent[part]`` (the dict yielded)."""
    spent = dict.fromkeys(PARTS, 0.0)
    undo = []

    def wrap(fn, part):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - t0

        return timed

    for part, names in PARTS.items():
        for name in names:
            if name == "KERNELS":
                old = dict(la.KERNELS)
                for mode, fns in old.items():
                    la.KERNELS[mode] = tuple(wrap(f, part) for f in fns)
                undo.append(lambda old=old: la.KERNELS.update(old))
                continue
            owner, attr = la, name
            if "." in name:
                cls, attr = name.split(".")
                owner = getattr(la, cls)
            old = getattr(owner, attr)
            setattr(owner, attr, wrap(old, part))
            undo.append(lambda o=owner, a=attr, f=old: setattr(o, a, f))
    try:
        yield spent
    finally:
        for fn in reversed(undo):
            fn()


def breakdown(T, mode, *, rounds=3, chunk_size=32, keep_freed=True):
    """``{part: seconds}`` of one forward + backward of the scaled layer
    at ``T`` (the median over ``rounds`` steps), the parts of
    :data:`PARTS` timed as the layer calls them and :data:`REST` what
    is left of the step (allocator as in :func:`speed`)."""
    rounds = capped_rounds(rounds)
    step = layer_step(T, mode, chunk_size=chunk_size)
    rows = []
    with keep_freed_memory(keep_freed):
        step()
        for _ in range(rounds):
            with timed_parts() as spent:
                t0 = time.perf_counter()
                step()
                total = time.perf_counter() - t0
            rows.append({**spent, REST: total - sum(spent.values())})
    return {p: float(np.median([r[p] for r in rows])) for p in rows[0]}


def _alternating_both(fns, rounds):
    """:func:`~attn_np.instruments.measure.alternating_times`, reading
    the wall clock and the process's CPU clock around every call."""
    rounds = capped_rounds(rounds)
    for fn in fns.values():
        fn()
    names = list(fns)
    wall = {n: np.empty(rounds) for n in names}
    cpu = {n: np.empty(rounds) for n in names}
    for i in range(rounds):
        for n in names if i % 2 == 0 else names[::-1]:
            t0, c0 = time.perf_counter(), time.process_time()
            fns[n]()
            cpu[n][i] = time.process_time() - c0
            wall[n][i] = time.perf_counter() - t0
    return wall, cpu


def print_speed(sp):
    """The table of :func:`speed`'s ratios, and at the largest ``T``
    whether each ratio is beyond the run's noise (its first quartile above
    the A/A floor's third)."""
    print(
        f"{'T':>5} {'loop s':>7} {'chunk s':>7} {'layer ratio':>17} "
        f"{'kernel ratio':>17} {'noise (A/A)':>16}"
    )
    for T, r in sp.items():
        cols = [
            f"{m:5.1f} [{lo:4.1f}, {hi:4.1f}]"
            for m, lo, hi in (r["loop / chunked"], r["kernels"])
        ]
        a, alo, ahi = r["A/A"]
        print(
            f"{T:5d} {r['loop s']:7.2f} {r['chunked s']:7.2f} "
            f"{cols[0]:>17} {cols[1]:>17} "
            f"{a:4.2f} [{alo:4.2f}, {ahi:4.2f}]"
        )
    print("the same rounds in CPU time (process_time):")
    for T, r in sp.items():
        cols = [
            f"{m:5.1f} [{lo:4.1f}, {hi:4.1f}]"
            for m, lo, hi in (
                r["cpu"]["loop / chunked"],
                r["cpu"]["kernels"],
            )
        ]
        a, alo, ahi = r["cpu"]["A/A"]
        print(
            f"{T:5d} {'':7s} {'':7s} {cols[0]:>17} {cols[1]:>17} "
            f"{a:4.2f} [{alo:4.2f}, {ahi:4.2f}]"
        )
    T_max = max(sp)
    for what, key in (
        ("layer loop / chunked", "loop / chunked"),
        ("kernel loop / chunked", "kernels"),
    ):
        m, lo, _ = sp[T_max][key]
        noise = "beyond" if lo > sp[T_max]["A/A"][2] else "within"
        print(
            f"{what} at T={T_max}: {m:.1f}x (q1 {lo:.1f}, {noise} the noise)"
        )


def print_breakdown(T, r, rounds, chunk_size, keep_freed=True):
    """Where a step's time goes, part by part, in each form; and what the
    kernels' ratio allows the layer's (the parts outside the kernel cost
    the same in both forms), up to the Amdahl bound: with an instant
    chunked kernel the layer's ratio is the loop's step over the shared
    rest."""
    parts = {
        form: breakdown(
            T,
            mode,
            rounds=rounds,
            chunk_size=chunk_size,
            keep_freed=keep_freed,
        )
        for form, mode in (("chunked", "chunked"), ("loop", "recurrent"))
    }
    tot = {f: sum(b.values()) for f, b in parts.items()}
    print(
        f"\nwhere the time goes at T={T}: seconds (share of the step), "
        f"median of {rounds}"
    )
    print(f"{'part':>21} {'chunked':>16} {'loop':>16}")
    for p in parts["chunked"]:
        cells = [
            f"{parts[f][p]:7.3f} ({parts[f][p] / tot[f]:4.0%})"
            for f in ("chunked", "loop")
        ]
        print(f"{p:>21} {cells[0]:>16} {cells[1]:>16}")
    c = parts["chunked"]
    rest = tot["chunked"] - c["kernel"]  # the same work in both forms
    k = r["kernels"][0]
    print(
        f"outside the kernel: {rest / tot['chunked']:.0%} of the chunked "
        f"step;\nwith the kernels {k:.1f}x apart, that predicts a layer "
        f"ratio of {(k * c['kernel'] + rest) / tot['chunked']:.1f}"
    )
    # Amdahl: even a chunked kernel that took no time leaves the shared
    # rest (each form times it; the smaller is the less noisy estimate)
    shared = min(rest, tot["loop"] - parts["loop"]["kernel"])
    bound = tot["loop"] / shared
    print(
        f"Amdahl bound: with an instant chunked kernel, loop step / rest "
        f"= {bound:.1f}x:\nno chunked kernel can take the layer's ratio "
        "past it at this T, since\nboth forms do the work outside the "
        "kernel"
    )


def _quartiles(x):
    q1, med, q3 = np.percentile(np.asarray(x), [25, 50, 75])
    return float(med), float(q1), float(q3)


def main(argv=()) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attn_np.bench linear",
        description=_description(__doc__),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--T",
        type=int,
        nargs="+",
        default=[1024, 2048, 4096],
        help="sequence lengths timed, loop against chunks",
    )
    parser.add_argument(
        "--memory-T",
        type=int,
        nargs="*",
        default=None,
        help="lengths whose traced peak is measured (default: the "
        "smallest and largest --T)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="timing rounds, the contenders alternating",
    )
    parser.add_argument(
        "--chunk-size", type=int, default=32, help="the chunked form's C"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="BLAS threads while timing"
    )
    parser.add_argument(
        "--return-freed",
        action="store_true",
        help="let glibc return freed memory to the system between steps "
        "(its default: every step then pays for fresh pages)",
    )
    args = parser.parse_args(list(argv))
    for name in ("rounds", "chunk_size", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if min(args.T) < 1:
        parser.error("--T must be positive")
    mem_T = args.memory_T
    if mem_T is None:
        mem_T = [min(args.T), 4 * min(args.T)]
    print(
        "Gated DeltaNet layer, Qwen3-Next-80B-A3B's widths / 16: "
        f"d_model={SHAPE['d_model']},\n{SHAPE['n_k_heads']} key head, "
        f"{SHAPE['n_v_heads']} value heads, d_k=d_v={SHAPE['d_k']}, conv 4, "
        "float32, B=1;\n"
        f"chunks of {args.chunk_size}; {args.threads} BLAS thread(s); "
        + (
            "glibc's default allocator"
            if args.return_freed
            else "freed memory kept\nfor the next step (both forms)"
        )
    )
    keep = not args.return_freed
    with blas_threads(args.threads):
        t0 = time.perf_counter()
        sp = speed(
            args.T,
            rounds=args.rounds,
            chunk_size=args.chunk_size,
            keep_freed=keep,
        )
        print(
            f"\nspeed: forward + backward, {args.rounds} rounds in turns, "
            "the order\nreversed every other round "
            f"({time.perf_counter() - t0:.0f} s);\nratios round by round: "
            "median [quartiles]"
        )
        print_speed(sp)
        T_max = max(sp)
        print_breakdown(
            T_max, sp[T_max], args.rounds, args.chunk_size, keep_freed=keep
        )
        if mem_T:
            mem = memory(mem_T, chunk_size=args.chunk_size)
            print("\nmemory: traced peak of one forward + backward, MiB")
            print(f"{'T':>6} {'chunked':>9} {'loop':>9}")
            for T, r in mem.items():
                print(
                    f"{T:6d} {r['chunked'] / 2**20:9.1f} "
                    f"{r['loop'] / 2**20:9.1f}"
                )
            Ts = sorted(mem)
            if len(Ts) > 1:
                lo_T, hi_T = Ts[0], Ts[-1]
                g = mem[hi_T]["chunked"] / mem[lo_T]["chunked"]
                gl = mem[hi_T]["loop"] / mem[lo_T]["loop"]
                print(
                    f"chunked peak({hi_T}) / peak({lo_T}) = {g:.2f} (loop: "
                    f"{gl:.2f})\nfor {hi_T / lo_T:.0f}x the tokens: a "
                    "ratio near that factor is memory linear in T"
                )
    return 0
