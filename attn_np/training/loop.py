"""Training and evaluation loops for the chapter-5 comparison.

Each step draws a fresh batch of the task from its own seed (the data never
repeats, so there is no overfitting to measure), runs forward, loss,
backward, clips the gradient norm and takes an Adam step with a linear
warm-up then cosine decay of the learning rate.
"""

from __future__ import annotations

import contextlib
import io
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from .._checks import check_count
from .losses import accuracy, cross_entropy_backward, cross_entropy_forward
from .optim import Adam, _positive, clip_grad_norm


@dataclass
class TrainLog:
    losses: list = field(default_factory=list)  # training loss at every step


def check_schedule(step, steps, lr, warmup):
    """``(step, steps, lr, warmup)`` checked for :func:`lr_at`: integers
    with ``0 <= step < steps`` and ``0 <= warmup <= steps``, and a positive
    finite ``lr``; a ``ValueError`` names the one that is not."""
    steps = check_count(steps, "steps", minimum=1)
    step = check_count(step, "step", minimum=0)
    warmup = check_count(warmup, "warmup", minimum=0)
    lr = _positive(lr, "lr")
    if step >= steps or warmup > steps:
        raise ValueError(
            f"need 0 <= step < steps and warmup <= steps, got step={step}, "
            f"steps={steps} and warmup={warmup}"
        )
    return step, steps, lr, warmup


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at
    ``steps`` (``0 <= step < steps``, ``0 <= warmup <= steps``)."""
    step, steps, lr, warmup = check_schedule(step, steps, lr, warmup)
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(
    model,
    task,
    *,
    steps,
    batch_size,
    lr,
    seed,
    warmup=None,
    max_norm=1.0,
    log_at=(),
    label="",
    log=None,
):
    """Train ``model`` on ``task`` for ``steps`` Adam steps; return the
    :class:`TrainLog`.

    Batch ``s`` is ``task.sample(batch_size, seed=(seed, s))``. Prints the
    loss (3 decimals) at the steps in ``log_at``. Pass an existing ``log`` to
    append to it.
    """
    log = TrainLog() if log is None else log
    opt = Adam(model.params, lr=lr)
    warmup = max(1, steps // 10) if warmup is None else warmup
    for s in range(steps):
        batch = task.sample(batch_size, seed=(seed, s))
        logits = model.forward(batch.inputs)  # [B, L, V]
        loss, cache = cross_entropy_forward(
            logits, batch.targets, mask=batch.mask
        )
        model.backward(cross_entropy_backward(1.0, cache))
        grads = model.grads
        clip_grad_norm(grads, max_norm)
        opt.step(grads, lr=lr_at(s, steps, lr, warmup))
        log.losses.append(loss)
        if s + 1 in log_at:
            print(f"{label}step {s + 1:4d}  loss {loss:.3f}")
    return log


def train_many(runs, *, workers=None):
    """Train independent runs side by side, one process per core: ``runs``
    is a list of ``(model, task, kwargs)``, ``kwargs`` the keywords of
    :func:`train`. Returns ``[(model, log, printed)]`` in the order of
    ``runs``: the trained model (a copy, sent back from its process), its
    :class:`TrainLog` and what :func:`train` printed.

    A run depends only on its model and its own seeds, never on another
    run, so the numbers are those of calling :func:`train` on each run in
    turn, bit for bit (the tests check it). ``workers`` is the number of
    processes (default: the cores, at most one per run); ``workers=1``
    trains the runs here, one after the other. The longest runs start
    first, so that the processes end together.
    """
    if not isinstance(runs, (list, tuple)) or not all(
        isinstance(r, tuple) and len(r) == 3 and isinstance(r[2], dict)
        for r in runs
    ):
        raise TypeError(
            "runs must be a list of (model, task, kwargs) tuples with "
            f"kwargs a dict, got {type(runs).__name__} {runs!r:.80}"
        )
    cores = os.cpu_count() or 1
    if workers is None:
        workers = cores
    workers = min(check_count(workers, "workers", minimum=1), len(runs) or 1)
    if workers == 1:
        return [_train_one(r) for r in runs]
    # longest first: a run's cost is its steps times its batch size
    order = sorted(
        range(len(runs)),
        key=lambda i: (
            -runs[i][2].get("steps", 0) * runs[i][2].get("batch_size", 0)
        ),
    )
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context(
        "fork" if "fork" in methods else "spawn"
    )
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {i: pool.submit(_train_one, runs[i]) for i in order}
        return [futures[i].result() for i in range(len(runs))]


def _train_one(run):
    """One run of :func:`train_many`: ``(model, log, printed)``."""
    model, task, kwargs = run
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        log = train(model, task, **kwargs)
    return model, log, out.getvalue()


def evaluate(model, batch, *, chunk: int = 256) -> float:
    """Accuracy at the masked positions of ``batch``, in chunks of ``chunk``
    sequences."""
    hits, total = 0, 0
    for i in range(0, len(batch.inputs), chunk):
        logits = model.forward(batch.inputs[i : i + chunk])
        m = batch.mask[i : i + chunk]
        hits += (
            accuracy(logits, batch.targets[i : i + chunk], mask=m) * m.sum()
        )
        total += m.sum()
    return float(hits / total)
