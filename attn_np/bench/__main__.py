"""``python -m attn_np.bench NAME [args]``: run one benchmark, or ``all`` of
them.

Each benchmark is a module ``attn_np.bench.NAME`` with a ``main(argv) ->
int`` function.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import attn_np.bench as _pkg

SKIP = {"common", "__main__"}


def available() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.iter_modules(_pkg.__path__)
        if m.name not in SKIP
    )


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
            print(f"== {n} ==", flush=True)
            status |= importlib.import_module(f"attn_np.bench.{n}").main(
                rest
            )
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
    return importlib.import_module(f"attn_np.bench.{name}").main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
