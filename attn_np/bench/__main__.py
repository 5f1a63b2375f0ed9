"""``python -m attn_np.bench NAME [args]``: run one benchmark, or ``all`` of
them.

Each benchmark is a module ``attn_np.bench.NAME`` with a ``main(argv) ->
int`` function, registered in :data:`BENCHMARKS` with the options it takes.
Its name is printed before it runs (and its time after), so that a reader
waiting for ``make bench`` knows what is running.

The arguments are checked here, before a benchmark starts: a size that is
not a positive integer (``--heads 0``, ``--L 0``, ``--repeat 0``,
``--window 0``), an unknown option or a value missing is answered with one
line, ``error: ...``, and exit status 2, never a traceback; so is an error
a benchmark raises on arguments it cannot use.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
import time
from dataclasses import dataclass, field

from attn_np.instruments.blas import blas_kernels

from ._help import description

#: The largest size any option takes (sizes beyond it only exhaust memory).
MAX_SIZE = 2**31 - 1
#: OpenBLAS kernel sets ``--blas-kernels`` may ask for (its core names;
#: ``OPENBLAS_CORETYPE``): AVX2, AVX-512 and older x86 sets.
KERNEL_SETS = ("Haswell", "SkylakeX", "Cooperlake", "Zen", "Sandybridge")
# set in the environment of a benchmark started again with other kernels
_RESTARTED = "ATTN_NP_BENCH_KERNELS"


@dataclass(frozen=True)
class Bench:
    """A registered benchmark: its module and its options.

    ``sizes`` take one positive integer, ``size_lists`` any number of them,
    ``flags`` no value, ``choices`` one of a few strings.
    """

    module: str
    sizes: tuple[str, ...] = ()
    size_lists: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    choices: dict = field(default_factory=dict)

    @property
    def options(self) -> set[str]:
        known = set(self.sizes) | set(self.size_lists) | set(self.flags)
        return known | set(self.choices) | {"--help", "-h"}


#: Every benchmark, by name. A new benchmark adds its line here.
BENCHMARKS: dict[str, Bench] = {
    "decode": Bench(
        "attn_np.bench.decode",
        sizes=("--d-model", "--heads", "--context", "--batch", "--rounds"),
        flags=("--levers", "--formulations"),
    ),
    "flash": Bench(
        "attn_np.bench.flash",
        sizes=("--rounds",),
        size_lists=("--L", "--memory-L"),
        flags=(
            "--sweep",
            "--skip-memory",
            "--why-load",
            "--skip-load",
            "--ceiling",
        ),
    ),
    "generate": Bench(
        "attn_np.bench.generate",
        sizes=("--prompt", "--new-tokens", "--rounds", "--threads"),
        flags=("--skip-hf",),
        choices={"--blas-kernels": KERNEL_SETS},
    ),
    "linear": Bench(
        "attn_np.bench.linear",
        sizes=("--rounds", "--chunk-size", "--threads"),
        size_lists=("--T", "--memory-T"),
        flags=("--return-freed",),
    ),
    "masks": Bench(
        "attn_np.bench.masks",
        sizes=("--L", "--docs", "--heads", "--rounds"),
    ),
    "mha": Bench(
        "attn_np.bench.mha",
        sizes=("--B", "--L", "--d-model", "--heads", "--repeat"),
        flags=("--no-naive",),
        choices={"--dtype": ("float32", "float64")},
    ),
    "serve": Bench(
        "attn_np.bench.serve",
        sizes=(
            "--batch",
            "--context",
            "--requests",
            "--system",
            "--rounds",
            "--threads",
        ),
        choices={"--blas-kernels": KERNEL_SETS},
    ),
    "window": Bench(
        "attn_np.bench.window",
        sizes=("--d-model", "--heads", "--kv-heads", "--window", "--rounds"),
    ),
}


def available() -> list[str]:
    return sorted(BENCHMARKS)


def _size(option: str, text: str) -> None:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 1 <= value <= MAX_SIZE:
        raise ValueError(
            f"{option} must be a positive integer (at most {MAX_SIZE:,}), "
            f"got {text!r}"
        )


def check_args(name: str, argv: list[str]) -> None:
    """Raise a ``ValueError`` naming the option for any argument that
    benchmark ``name`` cannot use."""
    bench = BENCHMARKS[name]
    i = 0
    while i < len(argv):
        token = argv[i]
        option, eq, inline = token.partition("=")
        if option not in bench.options:
            raise ValueError(
                f"benchmark {name} has no option {option!r}; it takes "
                f"{', '.join(sorted(bench.options - {'-h'}))}"
            )
        if option in bench.flags or option in ("--help", "-h"):
            if eq:
                raise ValueError(f"{option} takes no value, got {token!r}")
            i += 1
            continue
        if option in bench.size_lists:
            values = [inline] if eq else []
            i += 1
            while not eq and i < len(argv) and not argv[i].startswith("--"):
                values.append(argv[i])
                i += 1
            for v in values:
                _size(option, v)
            continue
        if eq:
            value = inline
            i += 1
        elif i + 1 < len(argv):
            value = argv[i + 1]
            i += 2
        else:
            raise ValueError(f"{option} needs a value")
        if option in bench.sizes:
            _size(option, value)
        elif value not in bench.choices[option]:
            raise ValueError(
                f"{option} must be one of {', '.join(bench.choices[option])}"
                f", got {value!r}"
            )


def _kernels_asked(argv) -> str | None:
    """The value of ``--blas-kernels`` in ``argv`` (checked), or None."""
    for i, token in enumerate(argv):
        option, eq, inline = token.partition("=")
        if option == "--blas-kernels":
            return inline if eq else argv[i + 1]
    return None


def restart_with_kernels(argv_all, asked) -> None:
    """OpenBLAS chooses its kernels once, when NumPy loads it: to run
    with the set ``asked``, start this command again with
    ``OPENBLAS_CORETYPE`` set (once; the benchmark prints the set it got,
    which is OpenBLAS's choice if the CPU cannot run the one asked)."""
    got = blas_kernels()
    if got is None:
        raise ValueError(
            "--blas-kernels needs NumPy's bundled OpenBLAS; this NumPy "
            "uses another BLAS"
        )
    if got.lower() == asked.lower() or os.environ.get(_RESTARTED):
        return
    env = dict(os.environ, OPENBLAS_CORETYPE=asked, **{_RESTARTED: "1"})
    sys.stdout.flush()
    os.execve(
        sys.executable,
        [sys.executable, "-m", "attn_np.bench", *argv_all],
        env,
    )


def run(name: str, argv: list[str]) -> int:
    """Run one benchmark, announcing it first and timing it."""
    print(f"== {name} ==", flush=True)
    start = time.perf_counter()
    module = importlib.import_module(BENCHMARKS[name].module)
    status = module.main(argv)
    took = time.perf_counter() - start
    print(f"== {name}: done in {took:.1f} s ==", flush=True)
    return status


def _help(module) -> int:
    """A benchmark's own ``--help`` (argparse's), without the banner."""
    try:
        module.main(["--help"])
    except SystemExit as done:
        return int(done.code or 0)
    return 0


def _error(message) -> int:
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def describe(name: str) -> str:
    """The first paragraph of benchmark ``name``'s module docstring, on
    one line."""
    return description(
        importlib.import_module(BENCHMARKS[name].module).__doc__
    )


def usage(names) -> str:
    """What ``--help`` prints: the usage line, then each benchmark with
    what it measures, wrapped at 77 columns."""
    lines = [
        "usage: python -m attn_np.bench NAME [args]",
        f"  NAME: {', '.join(names + ['all'])}",
        "",
        "Each benchmark prints ratios measured in the same run, with their",
        "spread and the run's own noise floor. The benchmarks:",
        "",
    ]
    for n in names:
        lines += textwrap.wrap(
            f"{n}: {describe(n)}",
            77,
            initial_indent="  ",
            subsequent_indent="    ",
        )
    lines += [
        "",
        "python -m attn_np.bench NAME --help lists NAME's options.",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(names))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name != "all" and name not in names:
        return _error(
            f"unknown benchmark {name!r}; choose from "
            f"{', '.join(names + ['all'])}"
        )
    chosen = names if name == "all" else [name]
    if name != "all" and ("--help" in rest or "-h" in rest):
        module = importlib.import_module(BENCHMARKS[name].module)
        return _help(module)
    try:
        for n in chosen:
            check_args(n, rest)
        asked = _kernels_asked(rest)
        if asked is not None:
            restart_with_kernels(argv, asked)
        status = 0
        for n in chosen:
            status |= run(n, rest)
        return status
    except (
        ValueError,
        TypeError,
        MemoryError,
        OverflowError,
        OSError,
    ) as err:
        return _error(err)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
