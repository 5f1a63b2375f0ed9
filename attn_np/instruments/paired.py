"""Paired timings, each ratio beside the run's own noise floor.

Every comparison the book times goes through :func:`compare`: the
contenders run in alternating rounds (:func:`~.measure.alternating_times`),
the baseline runs a second time under another name (the *A/A* twin, the
same code timed against itself), and every ratio is taken round by round
and reported as its median with the quartiles (:func:`~.measure.
ratio_spread`). The A/A ratio is the run's own noise floor: a ratio whose
quartiles lie outside the A/A quartiles is beyond the noise. Where the A/A
quartiles stray more than :data:`NOISY` from 1 the floor is wide, and the
lines say how wide: only differences beyond it are resolved.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from .measure import (
    alternating_times,
    busy_core,
    capped_rounds,
    ratio_spread,
)

# An A/A quartile further than this from 1 (10 %): the floor is wide.
NOISY = 0.10


def spread_text(m, digits: int = 2) -> str:
    """``0.89 [0.85-0.93]``: a median and its quartiles."""
    a, b, c = (f"{x:.{digits}f}" for x in m)
    return f"{a} [{b}-{c}]"


@dataclass(frozen=True)
class Paired:
    """The rounds of one :func:`compare` run: ``times[name]`` holds one
    time (s) per round; ``baseline`` was also timed as ``twin``."""

    times: dict
    baseline: str
    twin: str

    def ratio(self, name, over=None):
        """``(median, low, high)`` of ``t[name] / t[over]`` round by round
        (``over`` defaults to the baseline)."""
        return ratio_spread(
            self.times[name],
            self.times[self.baseline if over is None else over],
        )

    @property
    def floor(self):
        """The A/A ratio: the baseline's twin over the baseline."""
        return self.ratio(self.twin)

    @property
    def spread(self) -> float:
        """How far the A/A quartiles stray from 1 (0.05: 5 %)."""
        _, low, high = self.floor
        return max(1 - low, high - 1)

    @property
    def noisy(self) -> bool:
        """True when the A/A quartiles stray more than :data:`NOISY`
        from 1: a wide floor."""
        return self.spread > NOISY

    def verdict(self, name, over=None, *, expect=1.0, words=None) -> str:
        """Is ``t[name] / t[over]`` beyond the noise from ``expect``?

        The ratio's quartiles against ``expect`` times the A/A quartiles.
        ``words`` names the two outcomes (default ``("faster",
        "slower")``, for a ratio below or above ``expect``)."""
        below, above = words or ("faster", "slower")
        _, low, high = self.ratio(name, over)
        _, f_low, f_high = self.floor
        # a wide floor is said once, by floor_line, not on every line
        if high < expect * f_low:
            return f"{below} beyond the noise"
        if low > expect * f_high:
            return f"{above} beyond the noise"
        return "within the noise"

    def floor_line(self) -> str:
        """The line a timing cell prints before its result."""
        tail = (
            f"  wide: differences under {self.spread:.0%} are not resolved"
            if self.noisy
            else ""
        )
        return (
            f"noise floor (A/A, the same code twice): "
            f"{spread_text(self.floor)}{tail}"
        )

    def line(self, name, over=None, *, label=None, width=34, **kw) -> str:
        """``label  median [quartiles]  verdict``."""
        label = (
            label or f"{name} / {self.baseline if over is None else over}"
        )
        return (
            f"{label:{width}s} {spread_text(self.ratio(name, over))}  "
            f"{self.verdict(name, over, **kw)}"
        )


def repeated(fn: Callable[[], object], times: int) -> Callable[[], None]:
    """``fn`` called ``times`` times in a row, as one function: a step of
    a few microseconds made long enough to time against the clock's and
    the scheduler's jitter."""
    if isinstance(times, bool) or not isinstance(times, int) or times < 1:
        raise ValueError(f"times must be a positive integer, got {times!r}")

    def run():
        for _ in range(times):
            fn()

    return run


def compare(fns: dict, *, baseline: str, rounds: int = 7) -> Paired:
    """Time ``fns`` (``{name: fn()}``) in alternating rounds, with the
    ``baseline`` entry timed a second time as ``"<baseline> (A/A)"``."""
    if baseline not in fns:
        raise ValueError(
            f"baseline must be one of {list(fns)}, got {baseline!r}"
        )
    twin = f"{baseline} (A/A)"
    timed = {baseline: fns[baseline], **fns, twin: fns[baseline]}
    return Paired(alternating_times(timed, rounds=rounds), baseline, twin)


def under_load(
    fns: dict, *, rounds: int = 4, seconds: float = 60.0
) -> dict[str, dict]:
    """Each round, ``fns`` as the machine is, twice (the A/A floor), and
    once with one more core kept busy (:func:`~.measure.busy_core`).

    Returns ``{"quiet": {name: seconds per round}, "again": ...,
    "loaded": ...}``; the contenders alternate their order every round.
    """
    rounds = capped_rounds(rounds)
    names = list(fns)
    out = {
        k: {n: np.empty(rounds) for n in names}
        for k in ("quiet", "again", "loaded")
    }
    for fn in fns.values():
        fn()
    for i in range(rounds):
        order = names if i % 2 == 0 else names[::-1]
        for key, ctx in (
            ("quiet", nullcontext()),
            ("again", nullcontext()),
            ("loaded", busy_core(seconds)),
        ):
            with ctx:
                for n in order:
                    out[key][n][i] = _seconds(fns[n])
    return out


def _seconds(fn: Callable[[], object]) -> float:
    import time

    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
