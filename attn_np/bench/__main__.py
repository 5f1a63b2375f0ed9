"""``python -m attn_np.bench NAME [args]``: run one benchmark, or ``all`` of
them.

Each benchmark is a module ``attn_np.bench.NAME`` with a ``main(argv) ->
int`` function. Its name is printed before it runs (and its time after), so
that a reader waiting for ``make bench`` knows what is running.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import attn_np.bench as _pkg

SKIP = {"common", "__main__"}


def available() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.iter_modules(_pkg.__path__)
        if m.name not in SKIP
    )


def run(name: str, argv: list[str]) -> int:
    """Run one benchmark, announcing it first and timing it."""
    print(f"== {name} ==", flush=True)
    start = time.perf_counter()
    status = importlib.import_module(f"attn_np.bench.{name}").main(argv)
    took = time.perf_counter() - start
    print(f"== {name}: done in {took:.1f} s ==", flush=True)
    return status


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: python -m attn_np.bench "
            f"{{{','.join(names + ['all'])}}} [args]"
        )
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "all":
        status = 0
        for n in names:
            status |= run(n, rest)
        return status
    if name not in names:
        print(
            (
                f"unknown benchmark {name!r}; choose from "
                f"{', '.join(names + ['all'])}"
            ),
            file=sys.stderr,
        )
        return 2
    return run(name, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
