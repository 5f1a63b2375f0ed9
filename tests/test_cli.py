"""Both command lines, run as a user runs them (a subprocess), on bad files
and bad arguments: one line on stderr, ``error: ...``, a non-zero exit, no
traceback."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args, timeout=60):
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def assert_one_line_error(result, *words):
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


LLAMA = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
}


def nested(depth):
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"a": ' + nested(100_000) + "}", ["nested too deeply"]),
        ("{not json", ["not valid JSON"]),
        ("[1, 2]", ["JSON object"]),
        (json.dumps({**LLAMA, "multi_query": "false"}), ["multi_query"]),
        (
            json.dumps({**LLAMA, "use_sliding_window": "true"}),
            ["use_sliding_window"],
        ),
        (
            '{"num_hidden_layers": 32, "num_hidden_layers": 4}',
            ["twice", "num_hidden_layers"],
        ),
        (json.dumps({**LLAMA, "hidden_size": 4096.5}), ["hidden_size"]),
        (json.dumps({**LLAMA, "rope_theta": float("nan")}), ["NaN"]),
        (
            json.dumps(
                {
                    **LLAMA,
                    "num_hidden_layers": 10**30,
                    "sliding_window": 8,
                    "sliding_window_pattern": 2,
                }
            ),
            ["num_hidden_layers", "layers"],
        ),
        ("\xff\xfe", ["UTF-8"]),
    ],
)
def test_memory_bad_files(tmp_path, text, words):
    path = tmp_path / "config.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    if text == "\xff\xfe":
        path.write_bytes(b"\xff\xfe\x00")
    result = run("-m", "attn_np.memory", str(path), "--seq-len", "8")
    assert_one_line_error(result, *words)


def test_memory_special_files():
    result = run("-m", "attn_np.memory", "/dev/zero", "--seq-len", "8")
    assert_one_line_error(result, "not a regular file")
    result = run("-m", "attn_np.memory", "/", "--seq-len", "8")
    assert_one_line_error(result)


def test_memory_huge_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b" " * (16 * 2**20 + 1))
    result = run("-m", "attn_np.memory", str(path), "--seq-len", "8")
    assert_one_line_error(result, "larger than 16 MiB")


@pytest.mark.parametrize(
    "args, words",
    [
        (["--seq-len", "8", "--budget", "80Gb"], ["ambiguous", "GB"]),
        (["--seq-len", "8", "--budget", "0.1B"], ["less than one byte"]),
        (["--seq-len", "8", "--budget", "1" + "0" * 309], ["2**80"]),
        (["--seq-len", "8", "--budget", "1e308"], ["budget"]),
        (["--seq-len", "8", "--budget", "-5GB"], ["budget"]),
        (["--seq-len", "1" + "0" * 400], ["--seq-len"]),
        (["--seq-len", "-1"], ["--seq-len"]),
        (["--seq-len", "8", "--batch", "0"], ["--batch"]),
        (["--seq-len", "8", "--bytes-per-element", "x"], ["--bytes"]),
        (["--seq-len", "8", "--bogus"], ["--bogus"]),
        ([], ["--seq-len"]),
    ],
)
def test_memory_bad_arguments(args, words):
    result = run("-m", "attn_np.memory", "llama-3-8b", *args)
    assert_one_line_error(result, *words)


def test_memory_missing_config():
    result = run("-m", "attn_np.memory", "no-such-model", "--seq-len", "8")
    assert_one_line_error(result, "neither a file nor a model")


def test_memory_good_run_still_works():
    result = run(
        "-m",
        "attn_np.memory",
        "llama-3-8b",
        "--seq-len",
        "8",
        "--budget",
        "80GiB",
    )
    assert result.returncode == 0 and result.stderr == ""
    assert "max context" in result.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["mha", "--heads", "0"], ["--heads"]),
        (["mha", "--L", "0"], ["--L"]),
        (["mha", "--B", "-3"], ["--B"]),
        (["mha", "--repeat", "0"], ["--repeat"]),
        (["mha", "--d-model", "1" + "0" * 40], ["--d-model"]),
        (["mha", "--dtype", "float16"], ["--dtype"]),
        (["mha", "--heads", "3"], []),  # d_model 512 is not a multiple
        (["window", "--window", "0"], ["--window"]),
        (["window", "--kv-heads", "0"], ["--kv-heads"]),
        (["window", "--rounds", "x"], ["--rounds"]),
        (["decode", "--context", "0"], ["--context"]),
        (["decode", "--batch", "0"], ["--batch"]),
        (["decode", "--heads"], ["needs a value"]),
        (["flash", "--memory-L", "4096", "0"], ["--memory-L"]),
        (["flash", "--L", "0"], ["--L"]),
        (["flash", "--sweep=1"], ["no value"]),
        (["masks", "--docs", "0"], ["--docs"]),
        (["masks", "--L", "16", "--docs", "20"], ["--docs", "at most"]),
        (["mha", "--nope"], ["no option"]),
        (["nope"], ["unknown benchmark"]),
    ],
)
def test_bench_bad_arguments(args, words):
    result = run("-m", "attn_np.bench", *args)
    assert_one_line_error(result, *words)


def test_every_benchmark_is_registered_with_its_own_options():
    """The registry's options are the benchmark's own (from its --help), and
    every module of attn_np.bench is registered."""
    import pkgutil
    import re

    import attn_np.bench as pkg
    from attn_np.bench.__main__ import BENCHMARKS

    modules = {m.name for m in pkgutil.iter_modules(pkg.__path__)}
    assert modules - {"__main__", "_help"} == set(BENCHMARKS)
    for name, bench in BENCHMARKS.items():
        result = run("-m", "attn_np.bench", name, "--help")
        assert result.returncode == 0, result.stderr
        usage = result.stdout.split("options:")[-1]
        listed = set(re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", usage))
        assert listed == bench.options - {"-h"}, name


def test_bench_help_describes_every_benchmark_and_option():
    """--help lists each benchmark with what it measures, and each
    benchmark's --help gives every option a line of help, without the
    run's banner."""
    from attn_np.bench.__main__ import BENCHMARKS

    result = run("-m", "attn_np.bench", "--help")
    assert result.returncode == 0, result.stderr
    for name in BENCHMARKS:
        line = next(
            (
                l
                for l in result.stdout.splitlines()
                if l.startswith(f"  {name}:")
            ),
            "",
        )
        assert len(line) > len(name) + 12, (name, line)
    assert max(len(l) for l in result.stdout.splitlines()) <= 77
    for name in BENCHMARKS:
        out = run("-m", "attn_np.bench", name, "--help").stdout
        assert not out.startswith("=="), name
        lines = out.split("options:")[-1].splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("  --"):
                continue
            # the help follows the option, or sits indented on the next line
            words = line.split()
            metavar = len(words) > 1 and words[1].isupper()
            helped = len(words) > (2 if metavar else 1)
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            assert helped or nxt.startswith(" " * 8), (name, line)


def test_bench_blas_kernels_choice_and_restart(monkeypatch):
    """--blas-kernels takes one of OpenBLAS's core names; a run asking
    for another set than the one loaded starts the command again with
    OPENBLAS_CORETYPE set (here: the start is caught, not made)."""
    from attn_np.bench import __main__ as bench
    from attn_np.instruments.blas import blas_kernels

    with pytest.raises(ValueError, match="--blas-kernels must be one of"):
        bench.check_args("serve", ["--blas-kernels", "Nope"])
    assert bench._kernels_asked(["--rounds", "2", "--blas-kernels=Zen"]) == (
        "Zen"
    )
    if blas_kernels() is None:
        pytest.skip("NumPy's BLAS is not its bundled OpenBLAS")
    other = "Sandybridge" if blas_kernels() != "Sandybridge" else "Haswell"
    started = []
    monkeypatch.delenv(bench._RESTARTED, raising=False)
    monkeypatch.setattr(
        bench.os, "execve", lambda exe, args, env: started.append(env)
    )
    bench.restart_with_kernels(["serve", "--blas-kernels", other], other)
    assert started and started[0]["OPENBLAS_CORETYPE"] == other
    started.clear()
    bench.restart_with_kernels(["serve"], blas_kernels())  # already so
    assert not started
